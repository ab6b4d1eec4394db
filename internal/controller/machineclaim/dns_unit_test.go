package machineclaim

import (
	"net/netip"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// TestDNSRecord: a claim registers its FQDN with its addresses, prefix
// lengths dropped and addresses that mean nothing outside the VM left out;
// without a name or an address it registers nothing and says why.
func TestDNSRecord(t *testing.T) {
	claim := func(fqdn string, addrs ...string) *hfv1.MachineClaim {
		return &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{UID: "uid-1"},
			Status: hfv1.MachineClaimStatus{Network: &hfv1.MachineNetworkStatus{FQDN: fqdn, Addresses: addrs}}}
	}
	for _, tc := range []struct {
		name  string
		claim *hfv1.MachineClaim
		want  []string
		why   bool
	}{
		{"static and guest addresses", claim("vm-1.ci.example.com", "192.0.2.10/24", "2001:db8::10", "fe80::1", "127.0.0.1", "192.0.2.10"),
			[]string{"192.0.2.10", "2001:db8::10"}, false},
		{"static allocations win over the guest's report", func() *hfv1.MachineClaim {
			c := claim("vm-1.ci.example.com", "10.99.0.10", "172.17.0.1")
			c.Status.Network.IPAllocations = []hfv1.IPAllocation{{PoolRef: "p", Address: "192.0.2.2/29"}}
			return c
		}(), []string{"192.0.2.2"}, false},
		{"no fqdn", claim("", "192.0.2.10"), nil, true},
		{"no network status", &hfv1.MachineClaim{}, nil, true},
		{"only link-local", claim("vm-1.ci.example.com", "fe80::1/64", "169.254.1.1"), nil, true},
		{"garbage skipped", claim("vm-1.ci.example.com", "not-an-ip", "198.51.100.7"), []string{"198.51.100.7"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, why := DNSRecord(tc.claim, "op-1")
			if (why != "") != tc.why {
				t.Fatalf("why %q, want a reason: %v", why, tc.why)
			}
			if tc.why {
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
