package cloneslots

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
)

// placement is where a VM of the properties clones: its node and storage
// keys, fixed for the VM as a provider's placement fixes them.
type placement struct {
	node     string
	storages []string
}

// placements draws where VMs 1 to n clone, on two nodes with a storage
// shared by both and a local one each.
func placements(t *rapid.T, n int) map[int]placement {
	out := map[int]placement{}
	for vmid := 1; vmid <= n; vmid++ {
		node := rapid.SampledFrom([]string{"n1", "n2"}).Draw(t, fmt.Sprintf("node of %d", vmid))
		var storages []string
		if rapid.Bool().Draw(t, fmt.Sprintf("%d on shared storage", vmid)) {
			storages = append(storages, "shared")
		}
		if len(storages) == 0 || rapid.Bool().Draw(t, fmt.Sprintf("%d on local storage", vmid)) {
			storages = append(storages, node+"/local")
		}
		out[vmid] = placement{node: node, storages: storages}
	}
	return out
}

// overLimits says which limit the slots counted now exceed, "" if none.
func (s *Slots) overLimits() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tallyLocked(s.cfg.Now())
	for node, n := range t.node {
		if s.cfg.PerNode > 0 && n > s.cfg.PerNode {
			return fmt.Sprintf("%d clones on node %s, limit %d", n, node, s.cfg.PerNode)
		}
	}
	for st, n := range t.storage {
		if s.cfg.PerStorage > 0 && n > s.cfg.PerStorage {
			return fmt.Sprintf("%d clones onto storage %s, limit %d", n, st, s.cfg.PerStorage)
		}
	}
	return ""
}

// TestNeverMoreThanTheLimits: whatever placements hold, clones take,
// release, forget or leave, and however time passes (holds and waiting
// VMs lapsing, clones going stale), the slots counted never exceed a
// node's or a storage's limit.
func TestNeverMoreThanTheLimits(t *testing.T) {
	proptest.Check(t, 500, func(t *rapid.T) {
		cfg := Config{PerNode: rapid.IntRange(0, 3).Draw(t, "perNode"), PerStorage: rapid.IntRange(0, 3).Draw(t, "perStorage")}
		if rapid.Bool().Draw(t, "stale clones") {
			// Longer than Lapse, as Config.StaleAfter asks.
			cfg.StaleAfter = lapse + time.Duration(rapid.IntRange(1, 600).Draw(t, "staleAfter s"))*time.Second
		}
		w := newWorld(cfg)
		at := placements(t, 8)
		for range rapid.IntRange(1, 80).Draw(t, "steps") {
			vmid := rapid.IntRange(1, 8).Draw(t, "vmid")
			pl := at[vmid]
			switch op := rapid.SampledFrom([]string{"hold", "take", "take", "release", "releaseHold", "forget", "leave", "wait"}).Draw(t, "op"); op {
			case "hold":
				w.slots.Hold(vmid, pl.node, pl.storages)
			case "take":
				w.slots.Take(vmid, owner(vmid), pl.node, pl.storages)
			case "wait":
				w.clock.Step(time.Duration(rapid.IntRange(0, int(3*lapse/time.Second)).Draw(t, "wait s")) * time.Second)
			case "release":
				w.slots.Release(vmid)
			case "releaseHold":
				w.slots.ReleaseHold(vmid)
			case "forget":
				w.slots.Forget(vmid)
			case "leave":
				w.slots.Leave(owner(vmid).UID)
			}
			if over := w.slots.overLimits(); over != "" {
				t.Fatal(over)
			}
		}
	})
}

// TestFirstComeFirstServed: with one slot per node, the VMs of a node get
// it in the order they first asked for it, however their asks and the
// clones' ends interleave.
func TestFirstComeFirstServed(t *testing.T) {
	proptest.Check(t, 500, func(t *rapid.T) {
		w := newWorld(Config{PerNode: 1})
		at := placements(t, 8)
		asked, admitted := map[string][]int{}, map[string][]int{}
		var inFlight []int
		done := map[int]bool{}
		for range rapid.IntRange(1, 80).Draw(t, "steps") {
			if len(inFlight) > 0 && rapid.Bool().Draw(t, "a clone ends") {
				i := rapid.IntRange(0, len(inFlight)-1).Draw(t, "which")
				vmid := inFlight[i]
				inFlight = slices.Delete(inFlight, i, i+1)
				done[vmid] = true
				w.slots.Release(vmid)
				continue
			}
			vmid := rapid.IntRange(1, 8).Draw(t, "asking")
			if done[vmid] || slices.Contains(inFlight, vmid) {
				continue
			}
			node := at[vmid].node
			if !slices.Contains(asked[node], vmid) {
				asked[node] = append(asked[node], vmid)
			}
			if w.slots.Take(vmid, owner(vmid), node, at[vmid].storages) {
				admitted[node] = append(admitted[node], vmid)
				inFlight = append(inFlight, vmid)
			}
		}
		for node, got := range admitted {
			if want := asked[node][:len(got)]; !slices.Equal(got, want) {
				t.Fatalf("node %s: admitted %v, asked first %v", node, got, asked[node])
			}
		}
	})
}

// TestReleaseWakesWhoGetsASlot: the owners a release wakes are exactly
// those that get a slot when every waiting VM then asks, in the order
// they queued.
func TestReleaseWakesWhoGetsASlot(t *testing.T) {
	proptest.Check(t, 500, func(t *rapid.T) {
		w := newWorld(Config{PerNode: rapid.IntRange(1, 3).Draw(t, "perNode"), PerStorage: rapid.IntRange(0, 3).Draw(t, "perStorage")})
		at := placements(t, 10)
		took := map[int]bool{}
		for range rapid.IntRange(1, 60).Draw(t, "steps") {
			vmid := rapid.IntRange(1, 10).Draw(t, "vmid")
			pl := at[vmid]
			switch rapid.SampledFrom([]string{"hold", "take", "take", "release", "forget"}).Draw(t, "op") {
			case "hold":
				// A placement comes before its VM's clone asks.
				if !took[vmid] {
					w.slots.Hold(vmid, pl.node, pl.storages)
				}
			case "take":
				took[vmid] = true
				w.slots.Take(vmid, owner(vmid), pl.node, pl.storages)
			case "release":
				w.slots.Release(vmid)
			case "forget":
				w.slots.Forget(vmid)
			}
		}
		var inUse []int
		for vmid := 1; vmid <= 10; vmid++ {
			if w.slots.InUse(vmid) {
				inUse = append(inUse, vmid)
			}
		}
		if len(inUse) == 0 {
			return
		}
		w.woken = nil
		w.slots.Release(rapid.SampledFrom(inUse).Draw(t, "released"))
		woken := w.woken
		w.slots.mu.Lock()
		var waiting []int
		for _, q := range w.slots.queue {
			waiting = append(waiting, q.vmid)
		}
		w.slots.mu.Unlock()
		var got []string
		for _, vmid := range waiting {
			if w.slots.Take(vmid, owner(vmid), at[vmid].node, at[vmid].storages) {
				got = append(got, owner(vmid).UID)
			}
		}
		if !slices.Equal(woken, got) {
			t.Fatalf("woken %v, but %v got a slot asking in queue order %v", woken, got, waiting)
		}
	})
}
