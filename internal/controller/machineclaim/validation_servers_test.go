package machineclaim

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/event"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
)

// TestValidationAsksOnlyTheClusterDNSServers performs, with a template, the
// attack of a tenant that has the operator ask its own DNS server: its
// network.dns.servers name a server of the tenant's (127.0.0.3), the
// cluster's spec.dns.servers another (127.0.0.2). A validation round, run
// as the claim controller runs it, must query the cluster's server only:
// the tenant's would otherwise have the operator believe whatever it
// answers. Neither address serves DNS here, so each query fails at once and
// the round's results name the server each went to. The version before
// asked the template's server alone.
func TestValidationAsksOnlyTheClusterDNSServers(t *testing.T) {
	const clusterServer, tenantServer = "127.0.0.2", "127.0.0.3"
	claim := unitClaim("runner-1", 0)
	claim.Status.VMRef = hfv1.NewVMReference(unitCluster, "proxmox://1001", "node-1")
	claim.Status.Network = &hfv1.MachineNetworkStatus{FQDN: "runner-1.ci.example.com",
		IPAllocations: []hfv1.IPAllocation{{PoolRef: "pool", Address: "192.0.2.10/24"}}}
	claim.Status.Conditions = []metav1.Condition{{Type: string(hfv1.MachineClaimProvisionedCondition), Status: metav1.ConditionTrue, Reason: string(hfv1.ReadyReason)}}
	cluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: unitCluster}}
	cluster.Spec.DNS = &hfv1.ClusterDNSSettings{DNSSettings: hfv1.DNSSettings{Domain: "ci.example.com", Servers: []string{clusterServer}},
		Validation: &hfv1.DNSValidation{TimeoutSeconds: 2}}
	tmpl := readyTemplate()
	tmpl.Spec.Network.DNS = &hfv1.DNSSettings{Servers: []string{tenantServer}}

	r := &Reconciler{Registry: hypervisors.NewRegistry(), Recorder: record.NewFakeRecorder(16), Clock: clocktesting.NewFakeClock(unitEpoch)}
	r.validation.wake = make(chan event.GenericEvent, 1)
	inScope(r, &claim, func(s *claimScope) {
		s.cluster, s.tmpl = cluster, tmpl
		if _, err := r.validation.checkNetwork(t.Context(), s); err != nil {
			t.Fatal(err)
		}
	})
	select {
	case <-r.validation.wake:
	case <-time.After(time.Minute):
		t.Fatal("the validation round did not end within its bound")
	}
	inScope(r, &claim, func(s *claimScope) {
		s.cluster, s.tmpl = cluster, tmpl
		if _, err := r.validation.checkNetwork(t.Context(), s); err != nil {
			t.Fatal(err)
		}
	})
	st := claim.Status.NetworkValidation
	if st == nil || len(st.Checks) == 0 {
		t.Fatalf("no round was recorded: %+v", st)
	}
	for _, c := range st.Checks {
		if strings.Contains(c.Message, tenantServer) {
			t.Errorf("check %s asked the template's DNS server %s: %q", c.Check, tenantServer, c.Message)
		}
		if !strings.Contains(c.Message, clusterServer) {
			t.Errorf("check %s did not ask the cluster's DNS server %s: %q", c.Check, clusterServer, c.Message)
		}
	}
}
