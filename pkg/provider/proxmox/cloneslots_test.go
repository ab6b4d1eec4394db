package proxmox

import (
	"slices"
	"testing"
	"time"

	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestCloneSlotsPerNodeLocks: with ClonesPerNode 1, Proxmox itself never
// runs more than one clone on the node, whatever the VMs report: the
// listing never shows two VMs locked "clone" there. (The contract suite
// checks what the VMs report; the lock is Proxmox's.)
func TestCloneSlotsPerNodeLocks(t *testing.T) {
	e := newEnv(t, func(_ *proxmoxsim.Config, c *provider.ClusterConfig) { c.ClonesPerNode, c.ClonesPerStorage = 1, 0 })
	specs := []*provider.VMSpec{testSpec("runner-a", "uid-aaaa"), testSpec("runner-b", "uid-bbbb"), testSpec("runner-c", "uid-cccc")}
	progs := make([]provider.Progress, len(specs))
	running := make([]bool, len(specs))
	sawClone := false
	for round := 0; slices.Contains(running, false); round++ {
		if round > 400 {
			t.Fatalf("not all VMs Running after %d rounds", round)
		}
		wait := time.Duration(0)
		for i, s := range specs {
			if running[i] {
				continue
			}
			res, err := e.p.EnsureVM(t.Context(), s, progs[i])
			if err != nil {
				if provider.Classify(err) != provider.ClassTransient {
					t.Fatalf("EnsureVM(%s): %v", s.Name, err)
				}
				wait = max(wait, time.Second)
				continue
			}
			progs[i], running[i], wait = res.Progress, res.Phase == provider.PhaseRunning, max(wait, res.RetryAfter)
		}
		list, err := e.p.ListVMs(t.Context())
		if err != nil {
			t.Fatalf("ListVMs: %v", err)
		}
		locked := 0
		for _, v := range list {
			if v.Node == "pve1" && v.Lock == "clone" {
				locked++
			}
		}
		if locked > 1 {
			t.Fatalf("round %d: %d clones run on node pve1 with ClonesPerNode 1", round, locked)
		}
		sawClone = sawClone || locked == 1
		e.advance(wait)
	}
	if !sawClone {
		t.Error("the listing never showed a VM locked \"clone\", so it cannot show two")
	}
}

// TestPlacementHoldsTheCloneSlot: a placement told its clone would start
// now holds the slot until its clone request comes, so that a second VM
// placed meanwhile is told it waits (not the first, whose clone request
// may come second); the hold lapses after queueTTL when no clone request
// comes, and a deletion between placement and clone gives it back.
func TestPlacementHoldsTheCloneSlot(t *testing.T) {
	oneSlot := func() *env {
		return newEnv(t, func(_ *proxmoxsim.Config, c *provider.ClusterConfig) { c.ClonesPerNode, c.ClonesPerStorage = 1, 0 })
	}
	ctx := t.Context()
	place := func(e *env, s *provider.VMSpec) *provider.EnsureResult {
		t.Helper()
		res, err := e.p.EnsureVM(ctx, s, provider.Progress{})
		if err != nil || res.Phase != provider.PhasePlaced {
			t.Fatalf("placing %s: %+v %v", s.Name, res, err)
		}
		return res
	}
	a, b := testSpec("runner-a", "uid-aaaa"), testSpec("runner-b", "uid-bbbb")
	e := oneSlot()
	pa := place(e, a)
	if pa.Waits != "" {
		t.Fatalf("the first VM placed is told it waits: %q", pa.Waits)
	}
	pb := place(e, b)
	if pb.Waits == "" {
		t.Fatal("the second VM placed on the node, its one slot held, is told its clone starts now")
	}
	// The second clone request comes first: it waits, the first does not.
	if res, err := e.p.EnsureVM(ctx, b, pb.Progress); err != nil || res.Phase != provider.PhaseQueued {
		t.Fatalf("the second VM's clone request before the first's: %+v %v", res, err)
	}
	if res, err := e.p.EnsureVM(ctx, a, pa.Progress); err != nil || res.Phase != provider.PhaseCloning {
		t.Fatalf("the first VM's clone request, its slot held: %+v %v", res, err)
	}

	// A hold no clone request claims lapses.
	e = oneSlot()
	place(e, a)
	e.advance(queueTTL + time.Second)
	if r := place(e, b); r.Waits != "" {
		t.Fatalf("after queueTTL the unclaimed hold still holds the slot: %q", r.Waits)
	}

	// A deletion before the clone gives the slot back at once.
	e = oneSlot()
	if _, err := e.p.DeleteVM(ctx, a.Owner, place(e, a).Progress); err != nil {
		t.Fatal(err)
	}
	if r := place(e, b); r.Waits != "" {
		t.Fatalf("after the first VM's deletion before its clone, the next placement is told it waits: %q", r.Waits)
	}
}
