package machineclaim

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// TestPlanValidation: what a round checks comes from the cluster's two
// settings with the operator's defaults for fields left out, the DNS
// servers are the cluster's, the addresses those the operator vouches for
// (the guest's inside the cluster's vmSubnets), and a cluster that
// validates nothing plans nothing.
func TestPlanValidation(t *testing.T) {
	claim := &hfv1.MachineClaim{Status: hfv1.MachineClaimStatus{Network: &hfv1.MachineNetworkStatus{
		FQDN: "vm-1.ci.example.com", Addresses: []string{"192.0.2.10/24", "fe80::1", "10.96.0.1"}}}}
	cluster := func(dns *hfv1.DNSValidation, network *hfv1.NetworkValidation) *hfv1.HypervisorCluster {
		c := &hfv1.HypervisorCluster{}
		c.Name = "pve"
		c.Spec.DNS = &hfv1.ClusterDNSSettings{DNSSettings: hfv1.DNSSettings{Servers: []string{"192.0.2.53"}}, Validation: dns}
		c.Spec.Network = &hfv1.ClusterNetworkSettings{VMSubnets: []string{"192.0.2.0/24"}, Validation: network}
		return c
	}
	server := []netip.AddrPort{netip.MustParseAddrPort("192.0.2.53:53")}
	for _, tc := range []struct {
		name    string
		cluster *hfv1.HypervisorCluster
		on      bool
		want    validationPlan
	}{
		{"nothing configured", cluster(nil, nil), false, validationPlan{}},
		{"both disabled", cluster(&hfv1.DNSValidation{Enabled: ptr.To(false)}, &hfv1.NetworkValidation{Enabled: ptr.To(false)}), false, validationPlan{}},
		{"dns with defaults", cluster(&hfv1.DNSValidation{}, nil), true, validationPlan{
			dns: true, servers: server, dnsTimeout: 10 * time.Second,
			onReady: true, interval: 5 * time.Minute}},
		{"reverse, fail, once, later", cluster(&hfv1.DNSValidation{ValidateReverse: true, OnFailure: hfv1.ValidationFailClaim,
			ValidateOnReady: ptr.To(false), ValidateInterval: &metav1.Duration{}, TimeoutSeconds: 2}, nil), true, validationPlan{
			dns: true, reverse: true, failDNS: true, servers: server, dnsTimeout: 2 * time.Second}},
		{"network with defaults", cluster(nil, &hfv1.NetworkValidation{}), true, validationPlan{
			ping: true, sshPort: 22, netTimeout: 30 * time.Second, onReady: true, interval: 5 * time.Minute, servers: server}},
		{"ssh only, failing the claim", cluster(nil, &hfv1.NetworkValidation{PingTest: ptr.To(false), SSHTest: true, SSHPort: 2222, OnFailure: hfv1.ValidationFailClaim}), true, validationPlan{
			ssh: true, sshPort: 2222, failNetwork: true, netTimeout: 30 * time.Second, onReady: true, interval: 5 * time.Minute, servers: server}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, on := planValidation(claim, tc.cluster)
			if on != tc.on {
				t.Fatalf("on = %v, want %v", on, tc.on)
			}
			if !on {
				return
			}
			tc.want.cluster, tc.want.name, tc.want.addrs = "pve", "vm-1.ci.example.com", []netip.Addr{netip.MustParseAddr("192.0.2.10")}
			tc.want.outside = []netip.Addr{netip.MustParseAddr("10.96.0.1")}
			if got.cluster != tc.want.cluster || got.name != tc.want.name || !slices.Equal(got.addrs, tc.want.addrs) || !slices.Equal(got.outside, tc.want.outside) ||
				!slices.Equal(got.servers, tc.want.servers) ||
				got.dns != tc.want.dns || got.reverse != tc.want.reverse || got.dnsTimeout != tc.want.dnsTimeout ||
				got.ping != tc.want.ping || got.ssh != tc.want.ssh || got.sshPort != tc.want.sshPort || got.netTimeout != tc.want.netTimeout ||
				got.onReady != tc.want.onReady || got.interval != tc.want.interval || got.failDNS != tc.want.failDNS || got.failNetwork != tc.want.failNetwork {
				t.Errorf("plan\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// TestNextValidation: the first round is due at once with
// validateOnReady, else validateInterval after the VM came up; later ones
// validateInterval after the last; with an interval of 0s none after the
// first.
func TestNextValidation(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	up := now.Add(-time.Minute)
	last := now.Add(-2 * time.Minute)
	r := &Reconciler{Clock: clocktesting.NewFakePassiveClock(now)}
	claim := func(validated bool) *hfv1.MachineClaim {
		c := &hfv1.MachineClaim{}
		c.Status.Conditions = []metav1.Condition{{Type: string(hfv1.MachineClaimProvisionedCondition), Status: metav1.ConditionTrue, LastTransitionTime: metav1.NewTime(up)}}
		if validated {
			c.Status.NetworkValidation = &hfv1.NetworkValidationStatus{LastValidated: &metav1.Time{Time: last}}
		}
		return c
	}
	for _, tc := range []struct {
		name      string
		validated bool
		onReady   bool
		interval  time.Duration
		due       time.Time
		again     bool
	}{
		{"on ready", false, true, 5 * time.Minute, time.Time{}, true},
		{"an interval after ready", false, false, 5 * time.Minute, up.Add(5 * time.Minute), true},
		{"an interval after the last", true, true, 5 * time.Minute, last.Add(5 * time.Minute), true},
		{"once", true, true, 0, time.Time{}, false},
		{"never, without validateOnReady and an interval", false, false, 0, time.Time{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			due, again := r.validation.next(&claimScope{claim: claim(tc.validated), claimEnv: r.env()}, validationPlan{onReady: tc.onReady, interval: tc.interval})
			if again != tc.again || (again && !due.Equal(tc.due)) {
				t.Errorf("next = %s, %v; want %s, %v", due, again, tc.due, tc.again)
			}
		})
	}
}

// TestValidationTurnedOff: a running claim of a cluster that no longer
// validates loses its NetworkValidated condition and its results, which
// nothing would refresh any more; a claim of a cluster that validates
// keeps them.
func TestValidationTurnedOff(t *testing.T) {
	last := metav1.NewTime(time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC))
	claimOf := func() *hfv1.MachineClaim {
		return &hfv1.MachineClaim{
			Status: hfv1.MachineClaimStatus{
				Network:           &hfv1.MachineNetworkStatus{FQDN: "vm-1.ci.example.com", Addresses: []string{"192.0.2.10"}},
				NetworkValidation: &hfv1.NetworkValidationStatus{LastValidated: &last},
				Conditions: []metav1.Condition{
					{Type: string(hfv1.MachineClaimProvisionedCondition), Status: metav1.ConditionTrue, Reason: string(hfv1.ReadyReason)},
					{Type: string(hfv1.MachineClaimNetworkValidatedCondition), Status: metav1.ConditionTrue, Reason: string(hfv1.NetworkValidatedReason)},
				},
			},
		}
	}
	off := &hfv1.HypervisorCluster{}
	off.Spec.DNS = &hfv1.ClusterDNSSettings{DNSSettings: hfv1.DNSSettings{Servers: []string{"192.0.2.53"}}}
	off.Spec.Network = &hfv1.ClusterNetworkSettings{VMSubnets: []string{"192.0.2.0/24"}}
	r := &Reconciler{Clock: clocktesting.NewFakeClock(last.Add(time.Minute))}
	claim := claimOf()
	s := &claimScope{claim: claim, cluster: off, claimEnv: r.env()}
	if _, err := r.validation.checkNetwork(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	setConditions(claim, &s.facts)
	if c := hfv1.FindCondition(claim.Status.Conditions, hfv1.MachineClaimNetworkValidatedCondition); c != nil || claim.Status.NetworkValidation != nil {
		t.Fatalf("validation off: condition %+v, results %+v; want neither", c, claim.Status.NetworkValidation)
	}

	on := off.DeepCopy()
	on.Spec.DNS.Validation = &hfv1.DNSValidation{ValidateInterval: &metav1.Duration{Duration: time.Hour}}
	claim = claimOf()
	s = &claimScope{claim: claim, cluster: on, claimEnv: r.env()}
	if _, err := r.validation.checkNetwork(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	setConditions(claim, &s.facts)
	if c := hfv1.FindCondition(claim.Status.Conditions, hfv1.MachineClaimNetworkValidatedCondition); c == nil || claim.Status.NetworkValidation == nil {
		t.Fatalf("validation on: condition %+v, results %+v; want both kept", c, claim.Status.NetworkValidation)
	}
}
