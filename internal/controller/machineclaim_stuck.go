package controller

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
)

// StuckBounds are how long a claim may stay in each phase before it is
// reported Stuck (condition, event, hyperfleet_claims_stuck). Zero turns
// the check off for that phase. Ready, Failed and Finished have none:
// waiting there is what those phases are for, and the RunnerPool's
// lifecycle limits bound them.
type StuckBounds struct {
	Pending, Provisioning, Bootstrapping, Draining, Terminating time.Duration
}

// DefaultStuckBounds are the manager's defaults (docs/operations.md). They
// sit above what each phase takes when it works: Pending covers a wait for
// a clone slot behind a burst; Provisioning a full clone of a large disk;
// Bootstrapping the pool's default bootstrapTimeout (10m) plus margin;
// Draining the default jobTimeout (3h) plus margin; Terminating a stop and
// a destroy.
func DefaultStuckBounds() StuckBounds {
	return StuckBounds{
		Pending:       15 * time.Minute,
		Provisioning:  30 * time.Minute,
		Bootstrapping: 15 * time.Minute,
		Draining:      4 * time.Hour,
		Terminating:   15 * time.Minute,
	}
}

// bound is the limit of phase; zero when it has none.
func (b StuckBounds) bound(phase hfv1.MachineClaimPhase) time.Duration {
	switch phase {
	case hfv1.MachineClaimPending:
		return b.Pending
	case hfv1.MachineClaimProvisioning:
		return b.Provisioning
	case hfv1.MachineClaimBootstrapping:
		return b.Bootstrapping
	case hfv1.MachineClaimDraining:
		return b.Draining
	case hfv1.MachineClaimTerminating:
		return b.Terminating
	}
	return 0
}

// stuckCheck is one claim's verdict.
type stuckCheck struct {
	stuck bool
	// since is when the claim entered its phase; wake is how long until
	// it would become stuck (zero when stuck or without a bound).
	since time.Time
	wake  time.Duration
}

// checkStuck decides from status.phaseTimes whether claim overstayed its
// phase at now.
func checkStuck(claim *hfv1.MachineClaim, phase hfv1.MachineClaimPhase, bounds StuckBounds, now time.Time) stuckCheck {
	limit := bounds.bound(phase)
	pt := claim.Status.PhaseTimes
	if limit <= 0 || pt == nil {
		return stuckCheck{}
	}
	entered := phaseTime(pt, phase)
	if entered == nil || *entered == nil {
		return stuckCheck{}
	}
	since := (*entered).Time
	if left := since.Add(limit).Sub(now); left > 0 {
		return stuckCheck{since: since, wake: left}
	}
	return stuckCheck{stuck: true, since: since}
}

// waitingOn says what a claim waits for: its hypervisor task and the
// condition that explains its phase.
func waitingOn(claim *hfv1.MachineClaim, phase hfv1.MachineClaimPhase) string {
	var out string
	if t := claim.Status.Task; t != nil {
		out = fmt.Sprintf("hypervisor task %s (%s)", t.Operation, t.ID)
	}
	cond := hfv1.MachineClaimProvisionedCondition
	if phase != hfv1.MachineClaimPending && phase != hfv1.MachineClaimProvisioning {
		cond = hfv1.ReadyCondition
	}
	if c := meta.FindStatusCondition(claim.Status.Conditions, string(cond)); c != nil && c.Status != metav1.ConditionTrue {
		if out != "" {
			out += "; "
		}
		out += fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, truncate(c.Message, 500))
	}
	if out == "" {
		return "nothing the operator recorded"
	}
	return out
}

// stuckClaims counts stuck claims by phase for hyperfleet_claims_stuck
// (bounded: one series per phase, never per claim).
type stuckClaims struct {
	mu sync.Mutex
	m  map[types.NamespacedName]hfv1.MachineClaimPhase
}

// set records the claim's phase when stuck (or forgets it) and refreshes
// the gauge of the phases involved.
func (s *stuckClaims) set(key types.NamespacedName, phase hfv1.MachineClaimPhase, stuck bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[types.NamespacedName]hfv1.MachineClaimPhase{}
	}
	old, had := s.m[key]
	switch {
	case stuck && had && old == phase, !stuck && !had:
		return
	case stuck:
		s.m[key] = phase
	default:
		delete(s.m, key)
	}
	counts := map[hfv1.MachineClaimPhase]int{}
	for _, p := range s.m {
		counts[p]++
	}
	for _, p := range []hfv1.MachineClaimPhase{old, phase} {
		if p != "" {
			metrics.ClaimsStuck.WithLabelValues(string(p)).Set(float64(counts[p]))
		}
	}
}

// reset forgets every stuck claim and sets the gauge of each phase with a
// bound to zero: the series exist (a dashboard shows none stuck, an alert
// has something to compare) before the first claim gets stuck.
func (s *stuckClaims) reset(bounds StuckBounds) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m = nil
	for _, p := range []hfv1.MachineClaimPhase{hfv1.MachineClaimPending, hfv1.MachineClaimProvisioning, hfv1.MachineClaimBootstrapping,
		hfv1.MachineClaimDraining, hfv1.MachineClaimTerminating} {
		if bounds.bound(p) > 0 {
			metrics.ClaimsStuck.WithLabelValues(string(p)).Set(0)
		}
	}
}

// markStuck sets the claim's Stuck condition after a reconcile, records a
// warning event when it becomes stuck, and asks for a reconcile when the
// claim would become stuck, so that a claim nothing else wakes is still
// reported. It changes only status; the scope writes it.
func (r *MachineClaimReconciler) markStuck(ctx context.Context, claim *hfv1.MachineClaim, phase hfv1.MachineClaimPhase, res ctrl.Result) ctrl.Result {
	key := types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}
	if phase == hfv1.MachineClaimFinished {
		r.stuck.set(key, "", false)
		return res
	}
	check := checkStuck(claim, phase, r.StuckBounds, r.Clock.Now())
	r.stuck.set(key, phase, check.stuck)
	conds := &claim.Status.Conditions
	old := hfv1.FindCondition(*conds, hfv1.MachineClaimStuckCondition)
	switch {
	case check.stuck && old != nil && old.Status == metav1.ConditionTrue && !old.LastTransitionTime.Time.Before(check.since):
		// Already reported for this stay in the phase: one event only.
	case check.stuck:
		// A Stuck condition from an earlier phase is replaced, so that
		// its transition time (and the event) are this stay's.
		meta.RemoveStatusCondition(conds, string(hfv1.MachineClaimStuckCondition))
		msg := fmt.Sprintf("In phase %s since %s, longer than the manager's bound for it (%s); waiting on %s",
			phase, check.since.UTC().Format(time.RFC3339), r.StuckBounds.bound(phase), waitingOn(claim, phase))
		setCondition(conds, claim.Generation, hfv1.MachineClaimStuckCondition, metav1.ConditionTrue, hfv1.NoProgressReason, msg)
		r.Recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.MachineClaimStuckCondition), msg)
		ctrl.LoggerFrom(ctx).Info("MachineClaim is stuck", "phase", phase, "since", check.since, "waitingOn", waitingOn(claim, phase))
	case old != nil && old.Status == metav1.ConditionTrue:
		setCondition(conds, claim.Generation, hfv1.MachineClaimStuckCondition, metav1.ConditionFalse, hfv1.ProgressingReason,
			fmt.Sprintf("Now in phase %s", phase))
	}
	if check.wake > 0 && (res.RequeueAfter == 0 || check.wake < res.RequeueAfter) {
		res.RequeueAfter = check.wake
	}
	return res
}
