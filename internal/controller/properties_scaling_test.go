package controller

import (
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"pgregory.net/rapid"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/poolclaims"
	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
)

// poolCounts are a pool's claims and jobs as the test sees them.
type poolCounts struct {
	exist, live, starting, idle, busy, ending, queued int
}

func (w *poolWorld) counts() poolCounts {
	w.t.Helper()
	var n poolCounts
	for _, c := range w.claims() {
		n.exist++
		switch stateOf(c) {
		case poolclaims.Starting:
			n.starting++
		case poolclaims.Idle:
			n.idle++
		case poolclaims.Busy:
			n.busy++
		default:
			n.ending++
		}
	}
	n.live = n.starting + n.idle + n.busy
	for _, j := range w.jobList() {
		if j.Status.State == hfv1.CIJobQueued {
			n.queued++
		}
	}
	return n
}

// desiredModel is the design's replica count (the rule in package
// scaling's documentation, internal/scaling/scaling.go): every busy runner
// is kept, every queued job gets a VM and
// minIdle more stand by, at least minReplicas and at most maxReplicas
// (never fewer than the busy ones).
func desiredModel(minReplicas, maxReplicas, minIdle int, n poolCounts) int {
	want := max(minReplicas, n.busy+n.queued+minIdle)
	return max(n.busy, min(want, maxReplicas))
}

// Feature: hyperfleet-operator, Property 9: RunnerPool Scaling Behavior
//
// TestPoolScalingProperty drives the RunnerPool reconciler (its whole
// pass, on the pool world of cheapworld_pool_test.go: the fake client and
// a fake clock) through generated histories of a GitHub Actions pool with
// bounds minReplicas, maxReplicas and minIdle and a scaleDownDelay: jobs
// queued, idle runners taking them, busy runners finishing theirs (their
// VM gone), starting claims' runners coming online, time passing, and the
// bounds edited up and down. The test plays the claim controller. At
// every pass:
//   - a pass that creates claims leaves no more claims than maxReplicas,
//     and a pass never grows the claims past maxReplicas;
//   - a pass never asks a busy claim to end;
//   - a scale-down never takes the live claims below the design's replica
//     count (desiredModel) when they were at or above it;
//
// and once the history is over and the runners came online and the
// scale-down delay passed, the pool settles at exactly desiredModel live
// claims, none of them asked to end.
//
// Mutation: scalingInput (runnerpool_scaling.go) not counting the busy
// claims (Busy: 0) fails this test (a busy runner and a new claim for a
// queued job went past maxReplicas 1); the old test, over scaling.Plan
// alone, passed it.
// Mutation: scale (runnerpool_scaling.go) ending the surplus from the
// busy claims instead of the idle ones fails this test; the old test passed
// it.
func TestPoolScalingProperty(t *testing.T) {
	var scaledUp, scaledDown, capped int
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		now := unitEpoch
		minR := rapid.IntRange(0, 4).Draw(rt, "minReplicas")
		maxR := rapid.IntRange(max(minR, 1), minR+4).Draw(rt, "maxReplicas")
		minIdle := rapid.IntRange(0, 2).Draw(rt, "minIdle")
		delay := time.Duration(rapid.SampledFrom([]int{0, 2, 5}).Draw(rt, "scaleDownDelay minutes")) * time.Minute
		pool := poolWorldPool(int32(minR), int32(maxR))
		mi := int32(minIdle)
		pool.Spec.Scaling.MinIdle = &mi
		pool.Spec.Scaling.ScaleDownDelay = &metav1.Duration{Duration: delay}
		// Lifecycle limits off: this property is about the replica count
		// (property 10 is about the limits).
		off := &metav1.Duration{}
		pool.Spec.Lifecycle = hfv1.Lifecycle{BootstrapTimeout: off, IdleTimeout: off, JobTimeout: off, MaxLifetime: off}
		w := newPoolWorld(rt, now, pool)
		nextJob := int64(1)

		check := func(label string) {
			before := w.counts()
			w.pass()
			after := w.counts()
			for name, c := range w.claims() {
				if c.Spec.End != nil && c.Status.Bootstrap != nil && c.Status.Bootstrap.Job() != "" {
					rt.Fatalf("%s: busy claim %s (job %s) was asked to end: %s", label, name, c.Status.Bootstrap.Job(), c.Spec.End.Message)
				}
			}
			if after.exist > before.exist {
				scaledUp++
				if after.exist > maxR {
					rt.Fatalf("%s: the pass grew the claims from %d to %d, past maxReplicas %d (%+v)", label, before.exist, after.exist, maxR, after)
				}
			}
			want := desiredModel(minR, maxR, minIdle, before)
			if after.live < before.live {
				scaledDown++
				if before.live >= want && after.live < want {
					rt.Fatalf("%s: the pass took the live claims from %d to %d, below the replica count %d (min %d, max %d, minIdle %d, %+v)",
						label, before.live, after.live, want, minR, maxR, minIdle, before)
				}
			}
			if before.busy+before.queued+minIdle > maxR {
				capped++
			}
			w.endClaims()
		}

		steps := rapid.IntRange(1, 10).Draw(rt, "steps")
		for i := range steps {
			label := fmt.Sprintf("step %d", i)
			switch rapid.SampledFrom([]string{"queue", "take", "finish", "online", "wait", "bounds"}).Draw(rt, label) {
			case "queue":
				for range rapid.IntRange(1, 4).Draw(rt, label+" jobs") {
					if err := w.c.Create(w.ctx(), poolWorldJob(nextJob, hfv1.CIJobQueued, w.clk.Now())); err != nil {
						rt.Fatalf("queue job: %v", err)
					}
					nextJob++
				}
			case "take":
				w.takeJobs(rapid.IntRange(1, 4).Draw(rt, label+" taken"))
			case "finish":
				w.finishJobs(rapid.IntRange(1, 4).Draw(rt, label+" finished"))
			case "online":
				w.allOnline()
			case "wait":
				w.clk.Step(time.Duration(rapid.IntRange(0, 10).Draw(rt, label+" minutes")) * time.Minute)
			case "bounds":
				minR = rapid.IntRange(0, 4).Draw(rt, label+" minReplicas")
				maxR = rapid.IntRange(max(minR, 1), minR+4).Draw(rt, label+" maxReplicas")
				w.editPool(func(p *hfv1.RunnerPool) {
					p.Spec.Scaling.MinReplicas, p.Spec.Scaling.MaxReplicas = int32(minR), int32(maxR)
				})
			}
			check(label)
		}
		// Settle: runners come online, the delay passes, ended claims go.
		for i := range 12 {
			w.allOnline()
			w.clk.Step(delay + time.Second)
			before := w.counts()
			check(fmt.Sprintf("settling pass %d", i))
			if after := w.counts(); after == before && after.starting == 0 {
				break
			}
		}
		n := w.counts()
		if want := desiredModel(minR, maxR, minIdle, n); n.live != want || n.ending != 0 {
			rt.Fatalf("the pool settled at %d live claims (%+v), want %d (min %d, max %d, minIdle %d)", n.live, n, want, minR, maxR, minIdle)
		}
	})
	// The histories must have scaled up, down, and hit maxReplicas (not
	// under -short, where rapid runs a fifth of the cases).
	if testing.Short() {
		return
	}
	if scaledUp == 0 || scaledDown == 0 || capped == 0 {
		t.Errorf("passes that scaled up %d, down %d, with demand over maxReplicas %d; want each", scaledUp, scaledDown, capped)
	}
}

// allOnline brings every starting claim's runner online.
func (w *poolWorld) allOnline() {
	w.t.Helper()
	for _, c := range w.claims() {
		if stateOf(c) == poolclaims.Starting {
			w.comeOnline(c)
		}
	}
}

// takeJobs has up to n idle runners take the oldest queued jobs.
func (w *poolWorld) takeJobs(n int) {
	w.t.Helper()
	jobs := w.jobList()
	slices.SortFunc(jobs, func(a, b hfv1.CIJob) int { return int(a.Spec.JobID - b.Spec.JobID) })
	now := metav1.NewTime(w.clk.Now())
	for _, c := range w.sortedClaims() {
		if n == 0 {
			return
		}
		if stateOf(c) != poolclaims.Idle {
			continue
		}
		i := slices.IndexFunc(jobs, func(j hfv1.CIJob) bool { return j.Status.State == hfv1.CIJobQueued })
		if i < 0 {
			return
		}
		j := &jobs[i]
		j.Status.State = hfv1.CIJobInProgress
		if err := w.c.Status().Update(w.ctx(), j); err != nil {
			w.t.Fatalf("job %d in progress: %v", j.Spec.JobID, err)
		}
		setBusy(c, j.Spec.JobID, now)
		w.updateClaimStatus(c)
		n--
	}
}

// finishJobs has up to n busy runners finish their job: the job completes
// and the single-use VM is gone with its claim.
func (w *poolWorld) finishJobs(n int) {
	w.t.Helper()
	jobs := map[int64]*hfv1.CIJob{}
	list := w.jobList()
	for i := range list {
		jobs[list[i].Spec.JobID] = &list[i]
	}
	for _, c := range w.sortedClaims() {
		if n == 0 {
			return
		}
		if stateOf(c) != poolclaims.Busy {
			continue
		}
		if j := jobs[c.Status.Bootstrap.JobID]; j != nil {
			j.Status.State = hfv1.CIJobCompleted
			if err := w.c.Status().Update(w.ctx(), j); err != nil {
				w.t.Fatalf("job %d completed: %v", j.Spec.JobID, err)
			}
		}
		w.destroy(c)
		n--
	}
}
