package proxmox

import (
	"strings"
	"testing"

	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestStorageCapacity: placement refuses a VM whose boot disk does not fit
// in the free space of the storage it goes to (a Resource error naming the
// storage), counts full clones in flight against that space, and Probe
// reports the same free space (status.availableResources.storage).
func TestStorageCapacity(t *testing.T) {
	// local-lvm holds the 32 GiB template and its cloud-init drive: a
	// little under 68 GiB free.
	e := newEnv(t, func(c *proxmoxsim.Config, cfg *provider.ClusterConfig) {
		cfg.ClonesPerNode, cfg.ClonesPerStorage = 8, 8
		for i := range c.Storages {
			if c.Storages[i].ID == "local-lvm" {
				c.Storages[i].Capacity = 100 << 30
			}
		}
	})
	available := func() int64 {
		t.Helper()
		info, err := e.p.Probe(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return info.AvailableStorageBytes
	}
	free := available()
	if free <= 67<<30 || free > 68<<30 {
		t.Fatalf("AvailableStorageBytes = %d bytes, want 100 GiB of local-lvm minus the template's disks (local holds no VM disks)", free)
	}
	refused := func(spec *provider.VMSpec, want string) {
		t.Helper()
		res, err := e.p.EnsureVM(t.Context(), spec, provider.Progress{})
		if err == nil {
			t.Fatalf("a VM whose disk does not fit was placed: %+v", res)
		}
		if provider.Classify(err) != provider.ClassResource || !strings.Contains(err.Error(), want) {
			t.Fatalf("error %s %q, want a Resource error containing %q", provider.Classify(err), err, want)
		}
	}

	// A linked clone grown to 80 GiB cannot fit.
	big := testSpec("runner-big", "uid-big")
	big.DiskBytes = 80 << 30
	refused(big, "storage local-lvm has 67 GiB free for a 80 GiB disk")

	// Two linked clones grown to 40 GiB both fit: thin clones are bounded
	// by their own disk, not by the sum of every VM's.
	e.ensure(e.p, testSpec("runner-c", "uid-cccc"), provider.Progress{}, provider.PhaseCloning, 5)
	e.ensure(e.p, testSpec("runner-d", "uid-dddd"), provider.Progress{}, provider.PhaseCloning, 5)

	// Full clones of 40 GiB: the first fits, and is promised its space
	// until it runs, so the second does not.
	first, second := testSpec("runner-a", "uid-aaaa"), testSpec("runner-b", "uid-bbbb")
	for _, s := range []*provider.VMSpec{first, second} {
		s.Source.Linked = false
		s.DiskBytes = 40 << 30
	}
	e.ensure(e.p, first, provider.Progress{}, provider.PhaseCloning, 5)
	refused(second, "storage local-lvm has 27 GiB free for a 40 GiB disk")
	if got := available(); got != free-40<<30 {
		t.Fatalf("AvailableStorageBytes = %d with a 40 GiB full clone in flight, want %d", got, free-40<<30)
	}
}

// TestStandbyVMNeedsRoomForItsSavedMemory: a VM that will be suspended to
// disk (a standby VM) is placed only where Proxmox can write its saved
// memory (twice its memory plus 500 MiB, on the storage
// find_vmstate_storage picks: here local-lvm, its disks' only storage),
// and the refusal says so; the same VM not suspended fits.
func TestStandbyVMNeedsRoomForItsSavedMemory(t *testing.T) {
	e := newEnv(t, func(c *proxmoxsim.Config, cfg *provider.ClusterConfig) {
		for i := range c.Storages {
			if c.Storages[i].ID == "local-lvm" {
				c.Storages[i].Capacity = 100 << 30 // a little under 68 GiB free
			}
		}
	})
	standby := testSpec("runner-standby", "uid-standby")
	standby.SuspendsToDisk = true
	standby.MemoryBytes, standby.MemoryHint = 24<<30, 24<<30
	standby.DiskBytes = 20 << 30 // the template's 32 GiB + 2x24 + 0.5 GiB > 67 GiB
	_, err := e.p.EnsureVM(t.Context(), standby, provider.Progress{})
	want := "storage local-lvm has 67 GiB free for a 32 GiB disk and the VM's saved memory (48 GiB, it is a standby VM)"
	if provider.Classify(err) != provider.ClassResource || !strings.Contains(err.Error(), want) {
		t.Fatalf("standby VM without room for its saved memory: %v (class %s), want a Resource error containing %q", err, provider.Classify(err), want)
	}
	cold := testSpec("runner-cold", "uid-cold")
	cold.MemoryBytes, cold.MemoryHint, cold.DiskBytes = standby.MemoryBytes, standby.MemoryHint, standby.DiskBytes
	e.ensure(e.p, cold, provider.Progress{}, provider.PhaseCloning, 5)
}
