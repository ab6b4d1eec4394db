package controller

import (
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// A pool's replica and job counts move with every step of every claim
// (starting, idle, busy, terminating, gone): written as they move they
// were five status writes per job, each a PATCH to the API server
// (docs/performance.md, "Calls per job"). Nothing reads them back but
// people, dashboards and the scale subresource, so a pass whose only
// change is in the counts (in condition messages that quote them, and in
// the Scaling condition, which tells the counts' direction, and in the
// replacement backoff's record of which claims it counted, sameBackoff)
// waits until CountsInterval has passed since the pool's last status
// write and then writes the counts of that moment: the claims of a
// burst share their pool's writes. Every other change (a condition's
// status or reason, lowDemandSince, the template hash, the observed
// generation) is written in its own pass, as before. lastScaleTime, which
// only people read, waits with the counts once the pool has one: the
// pass that scaled leaves it in pendingScale, and the next pass that
// writes carries it.

// holdCounts reports whether s's pass changed only the pool's counts
// while the pool's last status write is younger than CountsInterval, with
// when to write them.
func (r *RunnerPoolReconciler) holdCounts(s *poolScope) (time.Duration, bool) {
	if r.CountsInterval <= 0 || s.read == nil {
		return 0, false
	}
	key := client.ObjectKeyFromObject(s.pool)
	if equality.Semantic.DeepEqual(s.read.Status, s.pool.Status) || !countsOnly(s.read, s.pool) {
		return 0, false
	}
	last, ok := r.countsWritten.Load(key)
	if !ok {
		return 0, false
	}
	wait := last.(time.Time).Add(r.CountsInterval).Sub(s.now)
	if wait <= 0 {
		return 0, false
	}
	if at := s.pool.Status.LastScaleTime; at != nil && !equality.Semantic.DeepEqual(at, s.read.Status.LastScaleTime) {
		r.pendingScale.Store(key, *at)
	}
	return wait, true
}

// carryScaleTime puts the lastScaleTime a held pass left (holdCounts)
// into the pool's status, unless the status has a later one.
func (r *RunnerPoolReconciler) carryScaleTime(s *poolScope) {
	v, ok := r.pendingScale.Load(client.ObjectKeyFromObject(s.pool))
	if !ok {
		return
	}
	at := v.(metav1.Time)
	if st := &s.pool.Status; st.LastScaleTime == nil || st.LastScaleTime.Before(&at) {
		st.LastScaleTime = &at
	}
}

// noteStatusWritten remembers when the pool's status was last written.
func (r *RunnerPoolReconciler) noteStatusWritten(key types.NamespacedName, at time.Time) {
	if r.CountsInterval > 0 {
		r.countsWritten.Store(key, at)
		r.pendingScale.Delete(key)
	}
}

// countsOnly reports whether after differs from before in the counts (and
// the messages of conditions whose status and reason stayed) alone.
func countsOnly(before, after *hfv1.RunnerPool) bool {
	b, a := before.DeepCopy(), after.DeepCopy()
	a.Status.ObservedGeneration = a.Generation
	b.Status.ObservedGeneration = b.Generation
	for _, p := range []struct{ a, b *int32 }{
		{&a.Status.Replicas, &b.Status.Replicas}, {&a.Status.DesiredReplicas, &b.Status.DesiredReplicas},
		{&a.Status.StartingReplicas, &b.Status.StartingReplicas}, {&a.Status.IdleReplicas, &b.Status.IdleReplicas},
		{&a.Status.BusyReplicas, &b.Status.BusyReplicas}, {&a.Status.ReadyReplicas, &b.Status.ReadyReplicas},
		{&a.Status.TerminatingReplicas, &b.Status.TerminatingReplicas}, {&a.Status.RetainedReplicas, &b.Status.RetainedReplicas},
		{&a.Status.StaleReplicas, &b.Status.StaleReplicas}, {&a.Status.PendingJobs, &b.Status.PendingJobs},
	} {
		*p.a = *p.b
	}
	if b.Status.LastScaleTime != nil {
		a.Status.LastScaleTime = b.Status.LastScaleTime
	}
	// The machines of status.placement are counts too; a template's
	// state or message is not.
	if len(a.Status.Placement) == len(b.Status.Placement) {
		for i := range a.Status.Placement {
			a.Status.Placement[i].Machines = b.Status.Placement[i].Machines
		}
	}
	if sameBackoff(b.Status.ReplacementBackoff, a.Status.ReplacementBackoff) {
		a.Status.ReplacementBackoff = b.Status.ReplacementBackoff
	}
	for i := range a.Status.Conditions {
		c := &a.Status.Conditions[i]
		old := hfv1.FindCondition(b.Status.Conditions, hfv1.ConditionType(c.Type))
		switch {
		case old == nil:
		case c.Type == string(hfv1.RunnerPoolScalingCondition):
			// Scaling says what the counts say (moving from 3 to 5 VMs,
			// stable at 5): a pass that creates or removes VMs writes at
			// once anyway (lastScaleTime), the rest waits with the counts.
			*c = *old
		case old.Status == c.Status && old.Reason == c.Reason:
			c.Message, c.LastTransitionTime, c.ObservedGeneration = old.Message, old.LastTransitionTime, old.ObservedGeneration
		}
	}
	return equality.Semantic.DeepEqual(a, b)
}

// sameBackoff reports whether two replacement backoffs say the same: the
// same failures in a row, the same last failure and the same wait. What
// else moves is which claims were counted (observedThrough, countedClaims):
// each runner coming online advances it, a write per claim whose only
// change is a bookkeeping time. It waits with the counts: a restart before
// it is written counts those claims again (scaling.Backoff.Observe), and a
// success counted again changes nothing; a failure is never held (it moves
// consecutiveFailures), nor a success that resets failures.
func sameBackoff(before, after *hfv1.ReplacementBackoff) bool {
	var b, a hfv1.ReplacementBackoff
	if before != nil {
		b = *before
	}
	if after != nil {
		a = *after
	}
	return b.ConsecutiveFailures == a.ConsecutiveFailures && b.LastFailure == a.LastFailure &&
		equality.Semantic.DeepEqual(b.LastFailureTime, a.LastFailureTime) && equality.Semantic.DeepEqual(b.NextAttemptTime, a.NextAttemptTime)
}
