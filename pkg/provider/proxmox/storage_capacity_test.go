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
