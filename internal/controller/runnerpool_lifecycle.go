package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/patch"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/poolclaims"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// The lifecycle of a pool's claims: the limits that end them
// (spec.lifecycle), the cancellation of a busy runner's job before a hard
// limit, and the pruning of retained failures, finished claims and
// completed CIJobs.

// enforceLifecycle ends the claims that reached a lifecycle limit, and
// looks again when the next one will.
func (r *RunnerPoolReconciler) enforceLifecycle(ctx context.Context, s *poolScope) (phase.Result, error) {
	limits := poolclaims.Limits(s.pool)
	res := phase.Next()
	check := func(list []*hfv1.MachineClaim) ([]*hfv1.MachineClaim, error) {
		keep := list[:0:0]
		for _, c := range list {
			reached, next := scaling.Expired(poolclaims.Times(c), limits, s.now)
			if reached.Reason == "" {
				keep = append(keep, c)
				if !next.At.IsZero() {
					res = res.Sooner(next.At.Sub(s.now))
				}
				continue
			}
			ended, retryIn, err := r.endForLimit(ctx, s, c, reached)
			if err != nil {
				return nil, err
			}
			res = res.Sooner(retryIn)
			if !ended {
				keep = append(keep, c)
			}
		}
		return keep, nil
	}
	var err error
	pc := s.claims
	if pc.Starting, err = check(pc.Starting); err != nil {
		return phase.Stop(), err
	}
	if pc.Idle, err = check(pc.Idle); err != nil {
		return phase.Stop(), err
	}
	if pc.Busy, err = check(pc.Busy); err != nil {
		return phase.Stop(), err
	}
	// A standby VM that never gets suspended (its boot fails, its
	// hypervisor refuses the suspend) reaches bootstrapTimeout like any
	// VM; a suspended one is bounded by the tier's maxAge instead
	// (runnerpool_standby.go).
	if pc.StandbyBuilding, err = check(pc.StandbyBuilding); err != nil {
		return phase.Stop(), err
	}
	return res, nil
}

// endForLimit ends one claim that reached a limit; false, with when to
// try again, when it must wait (a hard limit whose job could not be
// cancelled yet).
func (r *RunnerPoolReconciler) endForLimit(ctx context.Context, s *poolScope, c *hfv1.MachineClaim, e scaling.Expiry) (bool, time.Duration, error) {
	limits := poolclaims.Limits(s.pool)
	var msg string
	switch e.Reason {
	case scaling.BootstrapTimeout:
		msg = fmt.Sprintf("the runner did not come online within spec.lifecycle.bootstrapTimeout (%s)", limits.BootstrapTimeout)
		return true, 0, r.endClaim(ctx, s, c, e.Reason, msg, true)
	case scaling.IdleTimeout:
		msg = fmt.Sprintf("the runner took no job within spec.lifecycle.idleTimeout (%s)", limits.IdleTimeout)
	case scaling.JobTimeout:
		msg = fmt.Sprintf("job %s ran longer than spec.lifecycle.jobTimeout (%s)", c.Status.Bootstrap.Job(), limits.JobTimeout)
	case scaling.MaxLifetime:
		msg = fmt.Sprintf("the VM reached spec.lifecycle.maxLifetime (%s)", limits.MaxLifetime)
	}
	if e.Reason.Hard() {
		if cancelled, retryIn := r.cancelJob(ctx, s, c); !cancelled {
			return false, retryIn, nil
		}
		if job := c.Status.Bootstrap.Job(); job != "" {
			msg += fmt.Sprintf("; job %s was cancelled first", job)
		}
	}
	return true, 0, r.endClaim(ctx, s, c, e.Reason, msg, false)
}

// cancelJob cancels a busy claim's job before a hard limit ends it. It
// reports false, with when to try again, while the job cannot be
// cancelled yet.
func (r *RunnerPoolReconciler) cancelJob(ctx context.Context, s *poolScope, c *hfv1.MachineClaim) (bool, time.Duration) {
	st := c.Status.Bootstrap
	if st.Job() == "" || r.Jobs == nil || s.tmpl == nil {
		return true, 0
	}
	job := s.jobs[st.Job()]
	if job == nil || job.Status.State == hfv1.CIJobCompleted {
		return true, 0
	}
	err := r.Jobs.CancelJob(ctx, s.pool, s.tmpl, job)
	switch {
	case err == nil, errors.Is(err, workload.ErrNotFound):
		r.Recorder.Eventf(s.pool, corev1.EventTypeWarning, "JobCancelled", "Cancelled workflow run %d of %s (job %s on runner %s, claim %s) before enforcing a hard limit",
			job.Spec.RunID, job.Spec.Repository, job.Spec.ID(), st.RunnerName, c.Name)
		return true, 0
	}
	if wait, limited := machineclaim.RetryAfter(err, s.now); limited {
		return false, wait
	}
	r.Recorder.Eventf(s.pool, corev1.EventTypeWarning, "JobCancelFailed", "Could not cancel job %s of claim %s (retrying before destroying its VM): %v", job.Spec.ID(), c.Name, err)
	return false, 15 * time.Second
}

// endClaim asks a claim to end, recording why; the claim controller
// deregisters its runner (waiting while it is busy, unless a hard limit
// ends it), destroys its VM and then keeps the claim as history or
// deletes it. A claim asked to fail keeps its VM for debugging when the
// pool retains failed VMs, and the pool says so in a warning event.
func (r *RunnerPoolReconciler) endClaim(ctx context.Context, s *poolScope, c *hfv1.MachineClaim, reason scaling.Reason, msg string, fail bool) error {
	if err := r.requestEnd(ctx, c, reason, msg, fail); err != nil {
		return fmt.Errorf("end MachineClaim %s (%s): %w", c.Name, reason, err)
	}
	r.expect.Ended(client.ObjectKeyFromObject(s.pool), c.UID, r.Clock.Now())
	s.removed[reason]++
	s.ended[c.UID] = true
	metrics.PoolScalingActions.WithLabelValues(s.pool.Namespace, s.pool.Name, "remove", string(reason)).Inc()
	if fail {
		r.Recorder.Eventf(s.pool, corev1.EventTypeWarning, string(reason.ConditionReason()), "MachineClaim %s failed: %s", c.Name, msg)
		return nil
	}
	ctrl.LoggerFrom(ctx).Info("Ending MachineClaim", "MachineClaim", c.Name, "reason", reason, "message", msg)
	return nil
}

// requestEnd asks a claim to end through its spec.end (reason, message,
// whether it fails, and when). A request already there for the same reason
// is kept; a different one (a hard limit overtaking a soft reason)
// replaces it.
func (r *RunnerPoolReconciler) requestEnd(ctx context.Context, c *hfv1.MachineClaim, reason scaling.Reason, msg string, fail bool) error {
	if e := c.Spec.End; e != nil && e.Reason == reason && e.Fail == fail {
		return nil
	}
	h := patch.NewHelper(r.Client, c)
	c.Spec.End = &hfv1.MachineClaimEndRequest{Reason: reason, Message: conditions.Truncate(msg, 1024), Fail: fail, RequestedAt: metav1.NewTime(r.Clock.Now())}
	return h.PatchMetadata(ctx, c)
}

// prune deletes retained failed claims beyond failedRetention and finished
// claims beyond history, and looks again when the next ones will be.
func (r *RunnerPoolReconciler) prune(ctx context.Context, s *poolScope) (phase.Result, error) {
	pool, pc := s.pool, s.claims
	res := phase.Next()
	if f := pool.Spec.Lifecycle.FailedRetention; len(pc.Retained) > 0 {
		maxKept, ttl := 0, machineclaim.FailedRetentionTTL(pool)
		if f != nil {
			maxKept = int(f.MaxRetained)
		}
		excess := len(pc.Retained) - maxKept
		for i, c := range pc.Retained { // oldest first
			until := failedAt(c).Add(ttl)
			if i < excess || !s.now.Before(until) {
				msg := fmt.Sprintf("failed VM kept for debugging past spec.lifecycle.failedRetention (ttl %s, at most %d)", ttl, maxKept)
				if err := r.deleteWithReason(ctx, s, c, msg); err != nil {
					return phase.Stop(), err
				}
				continue
			}
			res = res.Sooner(until.Sub(s.now))
		}
	}
	if len(pc.Finished) > 0 {
		limit, ttl := 0, 24*time.Hour
		if h := pool.Spec.Lifecycle.History; h != nil {
			limit = int(h.Limit)
			if h.TTL != nil {
				ttl = h.TTL.Duration
			}
		}
		excess := len(pc.Finished) - limit
		for i, c := range pc.Finished {
			if s.undecided[c.UID] {
				// observeAttempts asked to look again when it is decided.
				continue
			}
			until := finishedAt(c).Add(ttl)
			if i < excess || !s.now.Before(until) {
				if err := r.Client.Delete(ctx, c); err != nil && !apierrors.IsNotFound(err) {
					return phase.Stop(), fmt.Errorf("delete finished MachineClaim %s: %w", c.Name, err)
				}
				r.expect.Ended(client.ObjectKeyFromObject(pool), c.UID, r.Clock.Now())
				continue
			}
			res = res.Sooner(until.Sub(s.now))
		}
	}
	return res, nil
}

// deleteWithReason deletes a retained failed claim (its VM goes with it).
func (r *RunnerPoolReconciler) deleteWithReason(ctx context.Context, s *poolScope, c *hfv1.MachineClaim, msg string) error {
	r.expect.Ended(client.ObjectKeyFromObject(s.pool), c.UID, r.Clock.Now())
	if err := r.Client.Delete(ctx, c); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete retained MachineClaim %s: %w", c.Name, err)
	}
	s.released++
	r.Recorder.Eventf(s.pool, corev1.EventTypeNormal, "RetainedVMReleased", "MachineClaim %s: %s", c.Name, msg)
	return nil
}

// failedAt is when a failed claim failed (its creation when unknown).
func failedAt(c *hfv1.MachineClaim) time.Time {
	if e := c.Status.End; e != nil && !e.StartedAt.IsZero() {
		return e.StartedAt.Time
	}
	return c.CreationTimestamp.Time
}

// finishedAt is when a finished claim's VM was gone, or when it failed.
func finishedAt(c *hfv1.MachineClaim) time.Time {
	if e := c.Status.End; e != nil && e.FinishedAt != nil {
		return e.FinishedAt.Time
	}
	return failedAt(c)
}

// collectJobs deletes the pool's CIJobs that completed a while ago, and
// looks again when the next ones did.
func (r *RunnerPoolReconciler) collectJobs(ctx context.Context, s *poolScope) (phase.Result, error) {
	res := phase.Next()
	for _, j := range s.jobs {
		if j.Status.State != hfv1.CIJobCompleted {
			continue
		}
		done := j.CreationTimestamp.Time
		if j.Status.CompletedAt != nil && j.Status.CompletedAt.After(done) {
			done = j.Status.CompletedAt.Time
		}
		if until := done.Add(completedJobRetention); s.now.Before(until) {
			res = res.Sooner(until.Sub(s.now))
			continue
		}
		if err := r.Client.Delete(ctx, j); err != nil && !apierrors.IsNotFound(err) {
			return phase.Stop(), fmt.Errorf("delete completed CIJob %s: %w", j.Name, err)
		}
	}
	return res, nil
}
