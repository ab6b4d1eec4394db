package controller

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// TestPoolCountsWaitForTheNextWrite: a pass whose only change is in the
// pool's counts (and the messages quoting them, the Scaling condition)
// waits for CountsInterval after the pool's last status write; any other
// change is written at once.
//
// Mutation: countsOnly also carrying lowDemandSince over from the stored
// status fails this test (a scale-down clock that a restart needs would
// wait with the counts); no test covered the batching before.
// Mutation: sameBackoff holding every change of the backoff fails this test (a
// failure, which a restart must not forget, would wait with the counts).
func TestPoolCountsWaitForTheNextWrite(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	stored := &hfv1.RunnerPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "runners", Generation: 1}}
	stored.Status.ObservedGeneration = 1
	stored.Status.Replicas, stored.Status.IdleReplicas = 2, 2
	stored.Status.LastScaleTime = &metav1.Time{Time: t0}
	stored.Status.Conditions = []metav1.Condition{
		{Type: string(hfv1.ReadyCondition), Status: metav1.ConditionTrue, Reason: string(hfv1.ReadyReason), Message: "Serving", ObservedGeneration: 1},
		{Type: string(hfv1.RunnerPoolScalingCondition), Status: metav1.ConditionFalse, Reason: string(hfv1.StableReason), Message: "2 VMs", ObservedGeneration: 1},
	}
	cases := map[string]struct {
		change func(*hfv1.RunnerPool)
		held   bool
	}{
		"counts": {change: func(p *hfv1.RunnerPool) { p.Status.Replicas, p.Status.BusyReplicas, p.Status.IdleReplicas = 3, 1, 1 }, held: true},
		"scaling and a scale time": {change: func(p *hfv1.RunnerPool) {
			p.Status.Conditions[1] = metav1.Condition{Type: string(hfv1.RunnerPoolScalingCondition), Status: metav1.ConditionTrue, Reason: string(hfv1.DemandIncreasedReason), Message: "Creating 1 VM"}
			p.Status.LastScaleTime = &metav1.Time{Time: t0.Add(time.Second)}
		}, held: true},
		"a message quoting counts": {change: func(p *hfv1.RunnerPool) { p.Status.Conditions[0].Message = "Serving, 3 VMs" }, held: true},
		"lowDemandSince":           {change: func(p *hfv1.RunnerPool) { p.Status.LowDemandSince = &metav1.Time{Time: t0} }},
		"the claims the backoff counted": {change: func(p *hfv1.RunnerPool) {
			p.Status.ReplacementBackoff = &hfv1.ReplacementBackoff{ObservedThrough: &metav1.Time{Time: t0}, CountedClaims: []string{"uid-1"}}
		}, held: true},
		"a failure counted": {change: func(p *hfv1.RunnerPool) {
			p.Status.ReplacementBackoff = &hfv1.ReplacementBackoff{ConsecutiveFailures: 1, LastFailure: "MachineClaim a: failed", LastFailureTime: &metav1.Time{Time: t0},
				ObservedThrough: &metav1.Time{Time: t0}, CountedClaims: []string{"uid-1"}}
		}},
		"Ready's reason": {change: func(p *hfv1.RunnerPool) {
			p.Status.Conditions[0].Status, p.Status.Conditions[0].Reason = metav1.ConditionFalse, string(hfv1.TemplateInvalidReason)
		}},
		"the template hash": {change: func(p *hfv1.RunnerPool) { p.Status.TemplateHash = "abc" }},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := &RunnerPoolReconciler{CountsInterval: 10 * time.Second}
			r.noteStatusWritten(types.NamespacedName{Namespace: "ci", Name: "runners"}, t0)
			pool := stored.DeepCopy()
			tc.change(pool)
			s := &poolScope{pool: pool, read: stored.DeepCopy(), now: t0.Add(3 * time.Second)}
			wait, held := r.holdCounts(s)
			if held != tc.held {
				t.Fatalf("held %v, want %v", held, tc.held)
			}
			if held && wait != 7*time.Second {
				t.Errorf("held for %s, want until 10s after the last write (7s)", wait)
			}
			// Once the interval has passed since the last write, it is written.
			s.now = t0.Add(11 * time.Second)
			if _, held := r.holdCounts(s); held {
				t.Errorf("held 11s after the last write")
			}
			// Without an interval every change is written at once.
			if _, held := (&RunnerPoolReconciler{}).holdCounts(s); held {
				t.Errorf("held without CountsInterval")
			}
		})
	}
}

// TestPoolStatusWritesPerBurst counts the pool's status writes while five
// jobs go through it, as the end-to-end TestKubernetesRequestsPerJob runs
// them, in the pool world (fake client, fake clock): the pool scales up
// (written at once), then each claim's runner comes online, its job's
// record moves to in_progress naming the runner, and the claim records the
// job, in both orders the operator sees (the record first, or the runner
// list showing the runner busy first); then each job completes and its
// claim goes. All of it within CountsInterval of the scale-up, so the pool
// writes once more, when the interval has passed, and that write carries
// the counts of that moment.
//
// Mutation: the pool not knowing the runners its job records name (no
// takenToBusy, demandPending subtracting every busy claim without a job,
// as before) fails this test (6 writes during the burst: the desired size
// dips by one whenever a record moves before its claim catches up,
// Scaling DemandDecreased and lowDemandSince set, then cleared); the old
// tests passed it.
// Mutation: takenToBusy alone, demandPending still subtracting busy claims
// a record names, fails this test (9 writes: that job counted twice).
// Mutation: sameBackoff reporting every change of the replacement backoff
// (each runner online moving observedThrough) fails this test (6 writes).
func TestPoolStatusWritesPerBurst(t *testing.T) {
	const jobs = 5
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var objs []client.Object
	for i := range jobs {
		j := poolWorldJob(int64(100+i), hfv1.CIJobQueued, t0)
		j.Status.QueuedAt = &metav1.Time{Time: t0}
		objs = append(objs, j)
	}
	w := newPoolWorld(t, t0, poolWorldPool(0, jobs), objs...)
	w.r.CountsInterval = 10 * time.Second
	writes, last := 0, w.pool().ResourceVersion
	var seen []string
	var res ctrl.Result
	step := func() {
		t.Helper()
		w.clk.Step(200 * time.Millisecond)
		res = w.pass()
		if p := w.pool(); p.ResourceVersion != last {
			writes, last = writes+1, p.ResourceVersion
			st := &p.Status
			scaling := hfv1.FindCondition(st.Conditions, hfv1.RunnerPoolScalingCondition)
			seen = append(seen, fmt.Sprintf("write %d at %s: Scaling %s/%s, desired %d, pending %d, busy %d, lowDemandSince %v, backoff %v",
				writes, w.clk.Since(t0), scaling.Status, scaling.Reason, st.DesiredReplicas, st.PendingJobs, st.BusyReplicas, st.LowDemandSince != nil, st.ReplacementBackoff != nil))
		}
	}
	step()
	claims := w.sortedClaims()
	if len(claims) != jobs || writes != 1 {
		t.Fatalf("the first pass made %d claims and %d writes, want %d claims and its status written once", len(claims), writes, jobs)
	}
	record := func(i int, state hfv1.CIJobState) {
		t.Helper()
		j := &hfv1.CIJob{}
		if err := w.c.Get(w.ctx(), client.ObjectKey{Namespace: poolWorldNamespace, Name: fmt.Sprintf("github-actions-%d", 100+i)}, j); err != nil {
			t.Fatal(err)
		}
		j.Status.State, j.Status.RunnerName = state, claims[i].Name
		j.Status.StartedAt = &metav1.Time{Time: w.clk.Now()}
		// The pool world's fake client serves CIJob's status as a
		// subresource (the API server does not: there it is one write).
		if err := w.c.Status().Update(w.ctx(), j); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(i int, change func(*hfv1.MachineClaim)) {
		t.Helper()
		c := w.claims()[claims[i].Name]
		change(c)
		w.updateClaimStatus(c)
	}
	for i := range claims {
		claim(i, func(c *hfv1.MachineClaim) { setOnline(c, metav1.NewTime(w.clk.Now())) })
		step()
		if i%2 == 1 {
			// The runner list shows the runner busy before the job's record moves.
			claim(i, func(c *hfv1.MachineClaim) { c.Status.Bootstrap.RunnerState = hfv1.RunnerStateBusy })
			step()
		}
		record(i, hfv1.CIJobInProgress)
		step()
		claim(i, func(c *hfv1.MachineClaim) { setBusy(c, int64(100+i), metav1.NewTime(w.clk.Now())) })
		step()
	}
	for i := range claims {
		record(i, hfv1.CIJobCompleted)
		step()
		if err := w.c.Delete(w.ctx(), w.claims()[claims[i].Name]); err != nil {
			t.Fatal(err)
		}
		step()
	}
	if elapsed := w.clk.Since(t0); elapsed >= w.r.CountsInterval {
		t.Fatalf("the burst took %s of fake time, more than CountsInterval: the test counts one interval", elapsed)
	}
	if writes != 1 {
		t.Errorf("%d status writes during the burst, want 1 (the scale-up; the rest waits with the counts):\n%s", writes, strings.Join(seen, "\n"))
	}
	// The pass asked to come back when the counts are due, and that pass
	// writes the pool as it is now.
	if res.RequeueAfter <= 0 || w.clk.Now().Add(res.RequeueAfter).After(t0.Add(200*time.Millisecond).Add(w.r.CountsInterval)) {
		t.Fatalf("the last pass comes back after %s, want by CountsInterval after the scale-up's write", res.RequeueAfter)
	}
	w.clk.Step(res.RequeueAfter - 200*time.Millisecond)
	step()
	if writes != 2 {
		t.Errorf("%d status writes after the interval, want 2", writes)
	}
	st := w.pool().Status
	if st.Replicas != 0 || st.BusyReplicas != 0 || st.PendingJobs != 0 || st.DesiredReplicas != 0 || st.LowDemandSince != nil {
		t.Errorf("the pool's status after the burst: replicas %d, busy %d, pending %d, desired %d, lowDemandSince %v; want all zero",
			st.Replicas, st.BusyReplicas, st.PendingJobs, st.DesiredReplicas, st.LowDemandSince)
	}
	if c := hfv1.FindCondition(st.Conditions, hfv1.RunnerPoolScalingCondition); c == nil || c.Reason != string(hfv1.StableReason) {
		t.Errorf("Scaling %+v, want Stable", c)
	}
}
