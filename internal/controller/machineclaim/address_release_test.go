package machineclaim

import (
	"context"
	"testing"

	"k8s.io/client-go/tools/record"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/ipam"
)

// TestReleaseAddressesByOwner: an address allocated in memory for a claim
// whose status write then failed (so its status lists nothing) is freed
// when the claim's VM is gone, as are the addresses its status lists;
// other claims keep theirs.
func TestReleaseAddressesByOwner(t *testing.T) {
	m := ipam.NewManager()
	pool, err := ipam.ParsePool(ipam.Spec{Addresses: []string{"10.9.0.0/29"}, Prefix: 29})
	if err != nil {
		t.Fatal(err)
	}
	m.SetPool("p", pool)
	if _, err := m.Rebuild("p", nil); err != nil {
		t.Fatal(err)
	}
	unrecorded, err := m.Allocate("p", "uid-lost-write")
	if err != nil {
		t.Fatal(err)
	}
	recorded, err := m.Allocate("p", "uid-recorded")
	if err != nil {
		t.Fatal(err)
	}
	other, err := m.Allocate("p", "uid-other")
	if err != nil {
		t.Fatal(err)
	}
	r := &Reconciler{IPAM: m, Recorder: record.NewFakeRecorder(16)}

	lost := &hfv1.MachineClaim{}
	lost.UID = "uid-lost-write"
	r.addresses().release(context.Background(), lost)
	if o, held := m.Owner("p", unrecorded); held {
		t.Errorf("the unrecorded address %s is still held by %s", unrecorded, o)
	}

	kept := &hfv1.MachineClaim{}
	kept.UID = "uid-recorded"
	kept.Status.Network = &hfv1.MachineNetworkStatus{IPAllocations: []hfv1.IPAllocation{{PoolRef: "p", Address: pool.WithPrefix(recorded).String()}}}
	r.addresses().release(context.Background(), kept)
	if o, held := m.Owner("p", recorded); held {
		t.Errorf("the recorded address %s is still held by %s", recorded, o)
	}
	if len(kept.Status.Network.IPAllocations) != 0 {
		t.Errorf("status still records %v", kept.Status.Network.IPAllocations)
	}
	if o, _ := m.Owner("p", other); o != "uid-other" {
		t.Errorf("another claim's address %s is now held by %q", other, o)
	}
}
