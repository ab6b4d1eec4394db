package controller

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
)

// attemptOf is what a claim tells the replacement backoff: its runner came
// online (success), or it failed or ended before that (failure). False
// while it is still on its way, and for claims ended for reasons that say
// nothing about whether VMs work (scale-down, drift replacement, deletion
// by hand, orphaned).
func attemptOf(c *hfv1.MachineClaim) (scaling.Attempt, bool) {
	a := scaling.Attempt{ID: string(c.UID)}
	pt := c.Status.PhaseTimes
	switch {
	case pt != nil && pt.Ready != nil:
		a.At = pt.Ready.Time
		return a, true
	case c.Status.Bootstrap != nil && c.Status.Bootstrap.RegisteredAt != nil:
		a.At = c.Status.Bootstrap.RegisteredAt.Time
		return a, true
	case c.HasFailed():
		a.At = c.Status.End.StartedAt.Time
	case c.Ended():
		switch machineclaim.Outcome(c) {
		case scaling.PoweredOff, scaling.BootstrapTimeout, scaling.Failed:
		default:
			return a, false
		}
		a.At = c.Status.End.StartedAt.Time
	default:
		return a, false
	}
	a.Failed, a.Reason = true, conditions.Truncate(fmt.Sprintf("MachineClaim %s: %s", c.Name, failureOf(c)), 1000)
	return a, true
}

// runnersWithJobs are the runners the pool's job records say took a job.
func runnersWithJobs(jobs map[string]*hfv1.CIJob) map[string]bool {
	out := make(map[string]bool, len(jobs))
	for _, j := range jobs {
		if j.Status.RunnerName != "" {
			out[j.Status.RunnerName] = true
		}
	}
	return out
}

// failureOf says why a claim failed, from what it recorded.
func failureOf(c *hfv1.MachineClaim) string {
	if r := c.Status.TerminationReason; r != "" {
		return r
	}
	if e := c.Spec.End; e != nil && e.Fail {
		return string(e.Reason) + ": " + e.Message
	}
	for _, t := range []string{string(hfv1.ReadyCondition), string(hfv1.MachineClaimProvisionedCondition)} {
		if cond := meta.FindStatusCondition(c.Status.Conditions, t); cond != nil && cond.Status == metav1.ConditionFalse {
			return cond.Reason + ": " + cond.Message
		}
	}
	return "failed before its runner came online"
}

// backoffState reads the pool's status into the rule's state.
func backoffState(st *hfv1.ReplacementBackoff) scaling.BackoffState {
	var s scaling.BackoffState
	if st == nil {
		return s
	}
	s.Failures, s.LastFailure, s.Counted = int(st.ConsecutiveFailures), st.LastFailure, st.CountedClaims
	if st.LastFailureTime != nil {
		s.LastFailureTime = st.LastFailureTime.Time
	}
	if st.NextAttemptTime != nil {
		s.NextAttempt = st.NextAttemptTime.Time
	}
	if st.ObservedThrough != nil {
		s.ObservedThrough = st.ObservedThrough.Time
	}
	return s
}

// backoffStatus writes the rule's state back; nil before any outcome.
func backoffStatus(s scaling.BackoffState) *hfv1.ReplacementBackoff {
	if s.ObservedThrough.IsZero() {
		return nil
	}
	t := func(v time.Time) *metav1.Time {
		if v.IsZero() {
			return nil
		}
		return &metav1.Time{Time: v}
	}
	return &hfv1.ReplacementBackoff{
		ConsecutiveFailures: int32(min(s.Failures, 1<<30)), LastFailure: s.LastFailure,
		LastFailureTime: t(s.LastFailureTime), NextAttemptTime: t(s.NextAttempt),
		ObservedThrough: t(s.ObservedThrough), CountedClaims: s.Counted[max(0, len(s.Counted)-64):],
	}
}

// jobRecordGrace is how long the pool waits, after a claim's VM powered
// off before the operator saw its runner online, for a job record naming
// that runner. A VM whose job is short can register, run it and power off
// between two resyncs and before the job's webhooks are recorded: without
// the wait, a pool of such VMs counted every one as a failure and backed
// off for minutes with jobs queued (docs/performance.md, churn).
const jobRecordGrace = 15 * time.Second

// observeAttempts counts the outcomes of the pool's claims into
// status.replacementBackoff (it lives in status so that a restarted
// operator keeps waiting) and sets the ReplacementBackoff condition.
func (r *RunnerPoolReconciler) observeAttempts(_ context.Context, s *poolScope) (phase.Result, error) {
	pc := s.claims
	res := phase.Next()
	var attempts []scaling.Attempt
	var ran map[string]bool
	for _, list := range [][]*hfv1.MachineClaim{pc.Starting, pc.Idle, pc.Busy, pc.Terminating, pc.Retained, pc.Finished} {
		for _, c := range list {
			a, ok := attemptOf(c)
			if !ok {
				continue
			}
			if a.Failed && !c.HasFailed() && machineclaim.Outcome(c) == scaling.PoweredOff && s.tmpl != nil {
				// Powered off with no job on record: a failure only if no
				// job record names its runner within the grace.
				if ran == nil {
					ran = runnersWithJobs(s.jobs)
				}
				switch decided := a.At.Add(jobRecordGrace); {
				case ran[vmspec.RunnerName(r.Workloads, c, s.tmpl)]:
					a.Failed, a.Reason = false, ""
				case s.now.Before(decided):
					s.undecided[c.UID] = true
					if r.JobReports != nil && r.JobReports.JobStarted(c.UID, s.now) {
						s.vouched[c.UID] = true
					}
					res = res.Sooner(decided.Sub(s.now))
					continue
				}
			}
			attempts = append(attempts, a)
		}
	}
	st := &s.pool.Status
	state, _ := r.Backoff.Observe(backoffState(st.ReplacementBackoff), attempts)
	s.backoff = state
	st.ReplacementBackoff = backoffStatus(state)

	conds := &st.Conditions
	if state.Failures < r.Backoff.Threshold || r.Backoff.Threshold <= 0 {
		msg := "Replacements are created at once"
		if state.Failures > 0 {
			msg = fmt.Sprintf("%d claims in a row failed before their runner came online (backoff from %d); last: %s", state.Failures, r.Backoff.Threshold, state.LastFailure)
		}
		conditions.Set(conds, s.pool.Generation, hfv1.RunnerPoolReplacementBackoffCondition, metav1.ConditionFalse, hfv1.NoRecentFailuresReason, msg)
		return res, nil
	}
	msg := fmt.Sprintf("%d claims in a row failed before their runner came online; the last at %s: %s. Next replacement at %s, one at a time (the wait starts at %s and doubles per failure up to %s); a claim whose runner comes online resets this",
		state.Failures, state.LastFailureTime.UTC().Format(time.RFC3339), state.LastFailure, state.NextAttempt.UTC().Format(time.RFC3339), r.Backoff.Base, r.Backoff.Cap)
	if old := hfv1.FindCondition(*conds, hfv1.RunnerPoolReplacementBackoffCondition); old == nil || old.Status != metav1.ConditionTrue {
		r.Recorder.Event(s.pool, corev1.EventTypeWarning, string(hfv1.RunnerPoolReplacementBackoffCondition), msg)
	}
	conditions.Set(conds, s.pool.Generation, hfv1.RunnerPoolReplacementBackoffCondition, metav1.ConditionTrue, hfv1.ConsecutiveFailuresReason, msg)
	return res, nil
}

// allowedCreations bounds the claims this pass may create: all of want
// outside backoff; in backoff none before the next attempt time (returned
// as when to look again), then one at a time (a probe), and none while an
// earlier one is still starting.
func (r *RunnerPoolReconciler) allowedCreations(s *poolScope, want int) (int, time.Duration) {
	if r.Backoff.Threshold <= 0 {
		return want, 0
	}
	if s.backoff.Failures < r.Backoff.Threshold {
		if s.backoff.Failures+len(s.undecided)-len(s.vouched) < r.Backoff.Threshold {
			return want, 0
		}
		// Claims still waiting for a job record (jobRecordGrace) could
		// complete a backoff: hold replacements until they are decided
		// (observeAttempts asked to look again then), so that a broken
		// image is not cloned again and again during the grace. A claim
		// whose VM said its runner started a job (its power-off notice)
		// does not hold: a VM of a broken image does not get that far,
		// and its word is checked all the same, by the job record or the
		// grace's end.
		s.backoffHeld = want
		return 0, 0
	}
	if next, waiting := s.backoff.Waiting(s.now); waiting {
		s.backoffHeld = want
		return 0, next.Sub(s.now)
	}
	if s.remaining(s.claims.Starting) > 0 {
		s.backoffHeld = want
		return 0, 0
	}
	s.backoffHeld = want - min(want, 1)
	return min(want, 1), 0
}
