package machineclaim

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/ipam"
)

// TestDualStackAllocation: a claim of a template with an IPv6 and an IPv4
// IPPool gets one address from each, both recorded in its status in one
// pass; while the IPv4 pool is exhausted the next claim waits and holds
// no IPv6 address (the one its pass took first is given back); once both
// have room it gets both, and a claim's end releases both.
func TestDualStackAllocation(t *testing.T) {
	pools := map[string]hfv1.IPPoolSpec{
		// One address: the first claim takes it.
		"v4": {Addresses: []string{"192.0.2.10/32"}, Prefix: 24, Gateways: []string{"192.0.2.1"}},
		"v6": {Addresses: []string{"2001:db8::10-2001:db8::11"}, Prefix: 64, Gateways: []string{"2001:db8::1"}},
	}
	m := ipam.NewManager()
	var objs []*hfv1.IPPool
	for name, spec := range pools {
		obj := &hfv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
		p, err := ipam.ParsePool(PoolSpec(obj))
		if err != nil {
			t.Fatal(err)
		}
		m.SetPool(name, p)
		if _, err := m.Rebuild(name, nil); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, obj)
	}
	tmpl := readyTemplate()
	// The IPv6 pool first: the spec's order, whatever the family.
	tmpl.Spec.Network = hfv1.MachineNetwork{Mode: hfv1.NetworkModeStatic, IPPoolRefs: []hfv1.ObjectName{{Name: "v6"}, {Name: "v4"}}}
	r := &Reconciler{IPAM: m, Recorder: record.NewFakeRecorder(32), Client: claimWorld(t, objs[0], objs[1])}
	ctx := context.Background()

	first := unitClaim("dual-1", 0)
	s := &claimScope{claim: &first, claimEnv: r.env()}
	addrs, fresh, err := r.addresses().forClaim(ctx, s, tmpl)
	if err != nil || !fresh || len(addrs) != 2 {
		t.Fatalf("first claim: %v, fresh %t, %d addresses", err, fresh, len(addrs))
	}
	if addrs[0].IP != netip.MustParseAddr("2001:db8::10") || addrs[1].IP != netip.MustParseAddr("192.0.2.10") {
		t.Errorf("first claim got %s and %s, want 2001:db8::10 and 192.0.2.10", addrs[0].IP, addrs[1].IP)
	}
	want := []hfv1.IPAllocation{{PoolRef: "v6", Address: "2001:db8::10/64", Gateway: "2001:db8::1"}, {PoolRef: "v4", Address: "192.0.2.10/24", Gateway: "192.0.2.1"}}
	if got := first.Status.Network.IPAllocations; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("first claim records %+v, want %+v", got, want)
	}
	// Recorded: the next pass allocates nothing and returns the same.
	again, fresh, err := r.addresses().forClaim(ctx, s, tmpl)
	if err != nil || fresh || len(again) != 2 || again[0].IP != addrs[0].IP || again[1].IP != addrs[1].IP {
		t.Errorf("second pass: %v, fresh %t, %+v", err, fresh, again)
	}

	// The IPv4 pool is exhausted: the second claim waits, with the
	// reason, and the IPv6 address its pass took first is free again.
	second := unitClaim("dual-2", 0)
	s2 := &claimScope{claim: &second, claimEnv: r.env()}
	if _, _, err := r.addresses().forClaim(ctx, s2, tmpl); !errors.Is(err, errAddressWait) {
		t.Fatalf("second claim with the IPv4 pool exhausted: %v, want a wait", err)
	}
	if c := s2.facts.condition(&second, hfv1.MachineClaimProvisionedCondition); c == nil || c.Reason != string(hfv1.IPPoolExhaustedReason) {
		t.Errorf("second claim's Provisioned is %+v, want IPPoolExhausted", c)
	}
	if second.Status.Network != nil && len(second.Status.Network.IPAllocations) > 0 {
		t.Errorf("second claim records %+v while it waits", second.Status.Network.IPAllocations)
	}
	if c, _ := m.Counts("v6"); c.Allocated != 1 {
		t.Errorf("the IPv6 pool holds %d addresses, want the first claim's only: the waiting claim's leaked", c.Allocated)
	}

	// The first claim ends: both its addresses go back, and the second
	// claim gets them.
	r.addresses().release(ctx, &first)
	for _, name := range []string{"v4", "v6"} {
		if c, _ := m.Counts(name); c.Allocated != 0 {
			t.Errorf("IPPool %s holds %d addresses after the claim's end", name, c.Allocated)
		}
	}
	got, fresh, err := r.addresses().forClaim(ctx, s2, tmpl)
	if err != nil || !fresh || len(got) != 2 || len(second.Status.Network.IPAllocations) != 2 {
		t.Fatalf("second claim once both pools have room: %v, fresh %t, %+v", err, fresh, second.Status.Network)
	}
}
