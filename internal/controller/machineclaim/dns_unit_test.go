package machineclaim

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// TestDNSRecord: a claim registers its FQDN with the addresses the
// operator vouches for, prefix lengths dropped and addresses that mean
// nothing outside the VM left out: its static addresses whatever the guest
// reports, else what the guest reports inside the cluster's vmSubnets.
// Without a name or such an address it registers nothing and says why,
// naming spec.network.vmSubnets when the guest's addresses were refused.
func TestDNSRecord(t *testing.T) {
	claim := func(fqdn string, addrs ...string) *hfv1.MachineClaim {
		return &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{UID: "uid-1"},
			Status: hfv1.MachineClaimStatus{Network: &hfv1.MachineNetworkStatus{FQDN: fqdn, Addresses: addrs}}}
	}
	cluster := func(subnets ...string) *hfv1.HypervisorCluster {
		c := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: "pve"}}
		if subnets != nil {
			c.Spec.Network = &hfv1.ClusterNetworkSettings{VMSubnets: subnets}
		}
		return c
	}
	vms := cluster("192.0.2.0/24", "2001:db8::/64", "198.51.100.0/24")
	static := func(c *hfv1.MachineClaim) *hfv1.MachineClaim {
		c.Status.Network.IPAllocations = []hfv1.IPAllocation{{PoolRef: "p", Address: "192.0.2.2/29"}}
		return c
	}
	for _, tc := range []struct {
		name    string
		claim   *hfv1.MachineClaim
		cluster *hfv1.HypervisorCluster
		want    []string
		reason  hfv1.ConditionReason
		why     []string
	}{
		{"guest addresses in the subnets", claim("vm-1.ci.example.com", "192.0.2.10/24", "2001:db8::10", "fe80::1", "127.0.0.1", "192.0.2.10"), vms,
			[]string{"192.0.2.10", "2001:db8::10"}, "", nil},
		{"a reported address outside the subnets is left out", claim("vm-1.ci.example.com", "192.0.2.10", "10.96.0.1"), vms,
			[]string{"192.0.2.10"}, "", nil},
		{"static allocations win over the guest's report", static(claim("vm-1.ci.example.com", "10.99.0.10", "172.17.0.1")), vms,
			[]string{"192.0.2.2"}, "", nil},
		{"static allocations need no subnet", static(claim("vm-1.ci.example.com", "10.99.0.10")), cluster(),
			[]string{"192.0.2.2"}, "", nil},
		{"static allocations without a readable cluster", static(claim("vm-1.ci.example.com")), nil,
			[]string{"192.0.2.2"}, "", nil},
		{"every reported address outside the subnets", claim("vm-1.ci.example.com", "10.96.0.1", "2001:db8:ffff::1"), vms,
			nil, hfv1.AddressOutsideVMSubnetsReason, []string{"10.96.0.1, 2001:db8:ffff::1", "spec.network.vmSubnets of HypervisorCluster pve (192.0.2.0/24, 2001:db8::/64, 198.51.100.0/24)"}},
		{"no subnets: nothing reported is trusted", claim("vm-1.ci.example.com", "192.0.2.10"), cluster(),
			nil, hfv1.AddressOutsideVMSubnetsReason, []string{"HypervisorCluster pve sets no spec.network.vmSubnets", "(192.0.2.10)"}},
		{"no fqdn", claim("", "192.0.2.10"), vms, nil, hfv1.DNSNotRegisteredReason, []string{"status.network.fqdn"}},
		{"no network status", &hfv1.MachineClaim{}, vms, nil, hfv1.DNSNotRegisteredReason, []string{"status.network.fqdn"}},
		{"only link-local", claim("vm-1.ci.example.com", "fe80::1/64", "169.254.1.1"), vms, nil, hfv1.DNSNotRegisteredReason, []string{"no address to register"}},
		{"garbage skipped", claim("vm-1.ci.example.com", "not-an-ip", "198.51.100.7"), vms, []string{"198.51.100.7"}, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, reason, why := DNSRecord(tc.claim, "op-1", tc.cluster)
			if reason != tc.reason || (why != "") != (tc.reason != "") {
				t.Fatalf("reason %q (%q), want %q", reason, why, tc.reason)
			}
			for _, w := range tc.why {
				if !strings.Contains(why, w) {
					t.Errorf("why %q does not say %q", why, w)
				}
			}
			if tc.reason != "" {
				return
			}
			var got []string
			for _, a := range rec.Addrs {
				got = append(got, a.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("addresses %v, want %v", got, tc.want)
			}
			if rec.Name != tc.claim.Status.Network.FQDN || rec.Owner.Claim != "uid-1" || rec.Owner.Install != "op-1" {
				t.Errorf("record %+v", rec)
			}
			if !slices.IsSortedFunc(rec.Addrs, netip.Addr.Compare) {
				t.Errorf("addresses not sorted: %v", rec.Addrs)
			}
		})
	}
}
