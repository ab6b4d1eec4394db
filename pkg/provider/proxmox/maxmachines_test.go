package proxmox

import (
	"slices"
	"strings"
	"sync"
	"testing"

	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestMaxMachines: with limits.maxMachines 2, a third VM is refused with
// a Resource error that names the limit while two VMs are being created
// (reservations) and, after a restart, while two exist (the install's
// tagged VMs); deleting one wakes the waiting owner, whose VM then goes on.
func TestMaxMachines(t *testing.T) {
	e := newEnv(t, func(_ *proxmoxsim.Config, c *provider.ClusterConfig) { c.MaxMachines = 2 })
	var mu sync.Mutex
	var woken []string
	deps := provider.Deps{Signer: e.signer, Observer: e.obs, Clock: e.clock, Log: e.logs.logger(),
		Wake: func(o provider.Owner) {
			mu.Lock()
			defer mu.Unlock()
			woken = append(woken, o.Name)
		}}
	p, err := New(e.cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	refused := func(p *Provider, spec *provider.VMSpec) {
		t.Helper()
		res, err := p.EnsureVM(t.Context(), spec, provider.Progress{})
		if err == nil {
			t.Fatalf("a VM over maxMachines was accepted: %+v", res)
		}
		if provider.Classify(err) != provider.ClassResource || provider.ReasonOf(err) != "MaxMachinesReached" ||
			!strings.Contains(err.Error(), "spec.limits.maxMachines (2)") {
			t.Fatalf("error %s/%s %q, want Resource/MaxMachinesReached naming spec.limits.maxMachines (2)", provider.Classify(err), provider.ReasonOf(err), err)
		}
	}
	a, b, c := testSpec("runner-a", "uid-aaaa"), testSpec("runner-b", "uid-bbbb"), testSpec("runner-c", "uid-cccc")
	ap := e.ensure(p, a, provider.Progress{}, provider.PhaseCloning, 5).prog
	bp := e.ensure(p, b, provider.Progress{}, provider.PhaseCloning, 5).prog
	// Both are only reservations and clone tasks so far.
	refused(p, c)

	// Finished VMs count through the listing, also for a restarted
	// operator that has no reservations.
	ap = e.ensure(p, a, ap, provider.PhaseRunning, 100).prog
	e.ensure(p, b, bp, provider.PhaseRunning, 100)
	e.advance(viewTTL)
	restarted, err := New(e.cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	refused(restarted, c)
	if e.nonTemplateVMs() != 2 {
		t.Fatalf("%d VMs, want 2", e.nonTemplateVMs())
	}

	e.remove(restarted, a.Owner, ap, 50)
	mu.Lock()
	got := slices.Clone(woken)
	mu.Unlock()
	if !slices.Equal(got, []string{"runner-c"}) {
		t.Fatalf("woken %v after a delete, want [runner-c]", got)
	}
	e.ensure(restarted, c, provider.Progress{}, provider.PhaseCloning, 5)
}
