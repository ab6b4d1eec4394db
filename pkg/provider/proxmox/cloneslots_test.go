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
