package sweeper

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// handOver is what the claim controller gives the sweeper for a vanished
// claim: the VM its reservation names, without the clone task.
func handOver(p provider.Progress) provider.Progress {
	return provider.Progress{ID: p.ID, Node: p.Node}
}

// TestVanishedClaimVMDestroyedWithoutGrace: the VM of a claim the API
// server removed while it carried the finalizer, handed over right after
// its clone request, is destroyed while its clone finishes, long before
// the grace period, and reported found and removed once; a claim reported
// vanished that is still on the API server keeps its VM; in dry-run mode
// the VM is only reported.
func TestVanishedClaimVMDestroyedWithoutGrace(t *testing.T) {
	for _, dryRun := range []bool{false, true} {
		w := newWorld(t, dryRun)
		victim, alive := w.claim("victim"), w.claim("alive")
		victimVM, _ := w.ensure(victim, 2) // the clone requested, not finished
		aliveVM, _ := w.ensure(alive, 50)
		w.deleteClaim(victim)
		ctx := context.Background()
		w.sweeper.Vanished(ctx, w.cluster, victim, handOver(victimVM))
		w.sweeper.Vanished(ctx, w.cluster, alive, handOver(aliveVM))
		var reasons []string
		elapsed := time.Duration(0)
		for ; elapsed < grace/2; elapsed += vanishedRetry {
			unfinished := w.sweeper.removeVanished(ctx)
			for len(w.events.Events) > 0 {
				e := <-w.events.Events
				w.checkEvent(e)
				reasons = append(reasons, strings.Fields(e)[1])
			}
			if !unfinished {
				break
			}
			w.clock.Step(vanishedRetry)
		}
		_, victimLeft := w.hv.VM(fakeVMID(victimVM.ID))
		if _, ok := w.hv.VM(fakeVMID(aliveVM.ID)); !ok {
			t.Errorf("dry-run %v: the VM of a claim still on the API server was destroyed", dryRun)
		}
		want := "ClaimVanished ClaimVanished OrphanRemoved"
		if dryRun {
			want = "ClaimVanished ClaimVanished"
			if !victimLeft {
				t.Error("dry-run destroyed the vanished claim's VM")
			}
		} else if victimLeft {
			t.Errorf("the vanished claim's VM %s is still there after %s", victimVM.ID, elapsed)
		}
		if got := strings.Join(reasons, " "); got != want {
			t.Errorf("dry-run %v: events %q, want %q", dryRun, got, want)
		}
	}
}
