package proxmox

import (
	"slices"
	"sync"
	"testing"

	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestFreedCloneSlotWakesQueuedVM: with one clone slot, a second VM waits in
// PhaseQueued; when the first clone is seen done and its slot freed, Wake
// names the waiting VM's owner, once, and that VM then gets the slot.
func TestFreedCloneSlotWakesQueuedVM(t *testing.T) {
	e := newEnv(t, func(_ *proxmoxsim.Config, c *provider.ClusterConfig) { c.ClonesPerNode, c.ClonesPerStorage = 1, 1 })
	var mu sync.Mutex
	var woken []string
	p, err := New(e.cfg, provider.Deps{Signer: e.signer, Observer: e.obs, Clock: e.clock, Log: e.logs.logger(),
		Wake: func(o provider.Owner) {
			mu.Lock()
			defer mu.Unlock()
			woken = append(woken, o.Namespace+"/"+o.Name)
		}})
	if err != nil {
		t.Fatal(err)
	}
	wakes := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(woken)
	}
	first, second := testSpec("runner-a", "uid-aaaa"), testSpec("runner-b", "uid-bbbb")
	a := e.ensure(p, first, provider.Progress{}, provider.PhaseCloning, 5)
	b := e.ensure(p, second, provider.Progress{}, provider.PhaseQueued, 5)
	if got := wakes(); len(got) != 0 {
		t.Fatalf("woken before any slot was freed: %v", got)
	}
	// Drive the first VM past its clone: its task poll frees the slot.
	e.ensure(p, first, a.prog, provider.PhaseConfiguring, 50)
	if got := wakes(); !slices.Equal(got, []string{"ci/runner-b"}) {
		t.Fatalf("woken %v, want [ci/runner-b] once", got)
	}
	res, err := p.EnsureVM(t.Context(), second, b.prog)
	if err != nil {
		t.Fatal(err)
	}
	if res.Phase != provider.PhaseCloning {
		t.Fatalf("the woken VM is %s (%s), want Cloning", res.Phase, res.Message)
	}
	if got := wakes(); len(got) != 1 {
		t.Fatalf("woken again without a freed slot: %v", got)
	}
}
