package controller

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

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
