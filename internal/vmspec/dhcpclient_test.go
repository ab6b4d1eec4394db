package vmspec

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
)

// TestDHCPClientProblem: what spec.network.dhcp asks of the image's DHCP
// client is refused for a client the operator cannot configure, and only
// then.
func TestDHCPClientProblem(t *testing.T) {
	lease := &metav1.Duration{Duration: 30 * time.Minute}
	for _, tc := range []struct {
		name string
		mode hfv1.NetworkMode
		dhcp *hfv1.DHCPOptions
		want []string // substrings of the refusal; none: accepted
	}{
		{name: "no dhcp options", mode: hfv1.NetworkModeDHCP},
		{name: "static mode", mode: hfv1.NetworkModeStatic},
		{name: "isc with everything", mode: hfv1.NetworkModeDHCP, dhcp: &hfv1.DHCPOptions{Client: hfv1.DHCPClientISC,
			ClientIdentifier: hfv1.DHCPClientIdentifierHostname, RequestStaticLease: true, LeaseTime: lease}},
		{name: "networkd asking nothing of it", mode: hfv1.NetworkModeDHCP, dhcp: &hfv1.DHCPOptions{Client: hfv1.DHCPClientNetworkd, ClientIdentifier: hfv1.DHCPClientIdentifierMAC}},
		{name: "client unset keeps hostname identifier", mode: hfv1.NetworkModeDHCP, dhcp: &hfv1.DHCPOptions{ClientIdentifier: hfv1.DHCPClientIdentifierHostname}},
		{name: "networkd lease time", mode: "", dhcp: &hfv1.DHCPOptions{Client: hfv1.DHCPClientNetworkd, LeaseTime: lease},
			want: []string{"spec.network.dhcp.client: systemd-networkd", "spec.network.dhcp leaseTime", "remove leaseTime", "client: isc-dhcp-client"}},
		{name: "networkd static lease", mode: hfv1.NetworkModeDHCP, dhcp: &hfv1.DHCPOptions{Client: hfv1.DHCPClientNetworkd,
			ClientIdentifier: hfv1.DHCPClientIdentifierHostname, RequestStaticLease: true},
			want: []string{"requestStaticLease, clientIdentifier hostname", "Debian 12"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := &hfv1.HypervisorMachineTemplate{}
			tmpl.Spec.Network = hfv1.MachineNetwork{Mode: tc.mode, DHCP: tc.dhcp}
			got := DHCPClientProblem(tmpl)
			if (got == "") != (len(tc.want) == 0) {
				t.Fatalf("DHCPClientProblem = %q, want a refusal: %v", got, len(tc.want) > 0)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("DHCPClientProblem = %q, want it to say %q", got, w)
				}
			}
		})
	}
}

// TestTemplateVarsDHCPLease: requestStaticLease and leaseTime reach the
// cloud-init variables, the lease time in whole seconds.
func TestTemplateVarsDHCPLease(t *testing.T) {
	tmpl := &hfv1.HypervisorMachineTemplate{}
	tmpl.Spec.Network = hfv1.MachineNetwork{Mode: hfv1.NetworkModeDHCP, DHCP: &hfv1.DHCPOptions{
		Client: hfv1.DHCPClientISC, ClientIdentifier: hfv1.DHCPClientIdentifierHostname, RequestStaticLease: true,
		LeaseTime: &metav1.Duration{Duration: 10*time.Minute + 500*time.Millisecond}}}
	v := TemplateVars(githubsimtest.Backends(t, nil), tmpl, proxmoxCluster(), nil)
	if !v.RequestStaticLease || v.DHCPLeaseSeconds != 600 || v.DHCPClientIdentifier != cloudinit.DHCPIdentifierHostname || !v.SendHostname {
		t.Errorf("vars: RequestStaticLease %v, DHCPLeaseSeconds %d, identifier %q, SendHostname %v; want true, 600, hostname, true",
			v.RequestStaticLease, v.DHCPLeaseSeconds, v.DHCPClientIdentifier, v.SendHostname)
	}
}
