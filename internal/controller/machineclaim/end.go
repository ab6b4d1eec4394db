package machineclaim

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/phase"
)

// claimEnd is how a claim ends, before it is recorded in status.end.
type claimEnd struct {
	// reason is the typed cause (and the runner outcome).
	reason hfv1.EndReason
	// condition is the Ending condition's reason; code is the code
	// status.terminationReason shows. Both default to the reason's own.
	condition hfv1.ConditionReason
	code      string
	message   string
	failed    bool
}

// poolEnd is the end a claim's RunnerPool asked for in spec.end.
func poolEnd(req *hfv1.MachineClaimEndRequest) claimEnd {
	return claimEnd{reason: req.Reason, code: string(req.Reason), message: req.Message, failed: req.Fail}
}

// beginEnd records that the claim began to end: status.end, the display
// reason and the Ending condition. A claim ends once; a later call only
// replaces the recorded cause (see replaceCause).
func (s *claimScope) beginEnd(e claimEnd) {
	claim := s.claim
	if e.condition == "" {
		e.condition = hfv1.ConditionReason(string(e.reason.ConditionReason()))
	}
	if e.code == "" {
		e.code = string(e.condition)
	}
	claim.Status.End = &hfv1.MachineClaimEnd{
		Reason:    e.reason,
		Message:   conditions.Truncate(e.message, 1024),
		Failed:    e.failed,
		StartedAt: metav1.NewTime(s.clock.Now()),
	}
	claim.Status.TerminationReason = conditions.Truncate(e.code+": "+e.message, 1024)
	s.facts.ending(e.condition, e.message)
}

// fail ends a claim as Failed; its VM is then kept stopped when its pool
// retains failed VMs.
func (s *claimScope) fail(e claimEnd) {
	e.failed = true
	if e.condition == "" {
		e.condition = hfv1.ConditionReason(string(e.reason.ConditionReason()))
	}
	s.facts.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, e.condition, conditions.Truncate(e.message, 1024))
	s.beginEnd(e)
}

// checkEndRequest carries out the pool's request (spec.end) on a claim
// that has not ended: it fails the claim, or ends it once its runner is
// removed (a claim whose runner runs a job waits, Draining); a hard limit
// does not wait, its pool cancelled the job.
func (r *Reconciler) checkEndRequest(ctx context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	req := claim.Spec.End
	switch {
	case req == nil || claim.Ended():
		return phase.Next(), nil
	case req.Fail:
		s.fail(poolEnd(req))
		return phase.Next(), nil
	}
	if !req.Reason.Hard() {
		// The runner goes first, which the CI platform refuses while it
		// runs a job: the VM then stays (Draining).
		if drained, wait := r.runner().drain(ctx, s); !drained {
			return phase.StopAndRequeue(wait), nil
		}
	}
	s.beginEnd(poolEnd(req))
	return phase.Next(), nil
}

// releaseEnded is the end list's one phase: it settles the recorded cause,
// then tears down what an ended claim holds. A finished claim holds
// nothing; a failed one keeps or loses its VM and stays for inspection
// (reconcileFailed); any other loses its VM, runner and identity and is
// finished (reconcileTerminate).
func (r *Reconciler) releaseEnded(ctx context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	r.replaceCause(claim)
	switch {
	case claim.IsFinished():
		return phase.Stop(), nil
	case claim.HasFailed():
		return r.reconcileFailed(ctx, s)
	}
	return r.reconcileTerminate(ctx, s)
}

// replaceCause makes the pool's hard limit the recorded cause of a claim
// that ended before the pool's request reached it. A hard limit cancels
// the job before its pool asks the claim to end; the runner's exit powers
// the VM off, and the cancelled job's completion arrives too, so shutdown
// detection or the job's end can be seen first. The pool's reason is the
// cause, so it replaces either.
func (r *Reconciler) replaceCause(claim *hfv1.MachineClaim) {
	req, end := claim.Spec.End, claim.Status.End
	if req == nil || claim.HasFailed() || end.Reason == req.Reason || !endedByPoolCancellation(claim) {
		return
	}
	end.Reason, end.Message = req.Reason, conditions.Truncate(req.Message, 1024)
	claim.Status.TerminationReason = conditions.Truncate(string(req.Reason)+": "+req.Message, 1024)
}

// endedByPoolCancellation reports whether a claim's recorded end is what
// its pool's hard limit caused: its VM powered off, or, when the pool asked
// for a hard limit, its job finished as cancelled.
func endedByPoolCancellation(claim *hfv1.MachineClaim) bool {
	switch claim.EndReason() {
	case hfv1.EndPoweredOff:
		return true
	case hfv1.EndJobCompleted:
		st := claim.Status.Bootstrap
		return claim.HardEnd() && st != nil && st.JobConclusion == "cancelled"
	}
	return false
}

// reconcileTerminate destroys the VM of an ended claim, then ends the
// claim: kept as history or deleted.
func (r *Reconciler) reconcileTerminate(ctx context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	if done, result := r.deleteVM(ctx, s); !done {
		return phase.StopAndRequeue(result.RequeueAfter), nil
	}
	if done, wait := r.runner().releaseOfGoneVM(ctx, s); !done {
		return phase.StopAndRequeue(wait), nil
	}
	if done, wait := r.Identity.releaseOfGoneVM(ctx, s); !done {
		return phase.StopAndRequeue(wait), nil
	}
	if end := claim.Status.End; end != nil {
		metrics.PowerOffToDestroyed.Observe(r.Clock.Since(end.StartedAt.Time).Seconds())
	}
	if err := r.finish(ctx, s); err != nil {
		return phase.Stop(), fmt.Errorf("end MachineClaim after its VM was destroyed: %w", err)
	}
	return phase.Stop(), nil
}

// reconcileFailed removes the VM of a failed claim (unless its ownership
// does not verify) and keeps the claim for inspection.
func (r *Reconciler) reconcileFailed(ctx context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	if claim.Status.VMRef == nil || s.facts.isFalse(claim, hfv1.MachineClaimOwnershipVerifiedCondition) {
		return phase.Stop(), nil
	}
	if retained, result := r.retainFailedVM(ctx, s); retained {
		// A VM kept for debugging is stopped: its identity goes now.
		if done, wait := r.Identity.releaseOfGoneVM(ctx, s); !done {
			return phase.StopAndRequeue(wait), nil
		}
		return phase.StopAndRequeue(result.RequeueAfter), nil
	}
	if done, result := r.deleteVM(ctx, s); !done {
		return phase.StopAndRequeue(result.RequeueAfter), nil
	}
	_, wait := r.Identity.releaseOfGoneVM(ctx, s)
	return phase.StopAndRequeue(wait), nil
}

// checkFinalizer ends the deletion pass of a claim without the finalizer:
// nothing is left to clean up.
func (r *Reconciler) checkFinalizer(_ context.Context, s *claimScope) (phase.Result, error) {
	if !controllerutil.ContainsFinalizer(s.claim, hfv1.MachineClaimFinalizer) {
		return phase.Stop(), nil
	}
	return phase.Next(), nil
}

// checkDeletion ends a deleted claim that had not ended yet. A runner in
// the middle of a job keeps its VM (docs/architecture.md, "Teardown never
// kills a busy runner"): the runner is removed first, which the CI
// platform refuses while it is busy. A hard limit does not wait: its pool
// cancelled the job first.
func (r *Reconciler) checkDeletion(ctx context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	if claim.Ended() {
		return phase.Next(), nil
	}
	if !claim.HardEnd() {
		if drained, wait := r.runner().drain(ctx, s); !drained {
			return phase.StopAndRequeue(wait), nil
		}
	}
	e := claimEnd{reason: hfv1.EndDeleted, code: string(hfv1.EndDeleted), message: "the MachineClaim was deleted"}
	if req := claim.Spec.End; req != nil {
		e = poolEnd(req)
		e.failed = false
	}
	s.beginEnd(e)
	return phase.Next(), nil
}

// releaseVM destroys a deleted claim's VM.
func (r *Reconciler) releaseVM(ctx context.Context, s *claimScope) (phase.Result, error) {
	if done, result := r.deleteVM(ctx, s); !done {
		return phase.StopAndRequeue(result.RequeueAfter), nil
	}
	return phase.Next(), nil
}

// releaseRunner removes a deleted claim's runner once its VM is gone.
func (r *Reconciler) releaseRunner(ctx context.Context, s *claimScope) (phase.Result, error) {
	if done, wait := r.runner().releaseOfGoneVM(ctx, s); !done {
		return phase.StopAndRequeue(wait), nil
	}
	return phase.Next(), nil
}

// releaseFinalizer lets a deleted claim go, its VM and runner gone.
func (r *Reconciler) releaseFinalizer(ctx context.Context, s *claimScope) (phase.Result, error) {
	if err := r.removeFinalizer(ctx, s); err != nil {
		return phase.Stop(), err
	}
	r.countOutcome(s.claim)
	r.memory.succeeded(s.claim.UID)
	return phase.Stop(), nil
}

// keepsHistory reports whether a finished claim of pool stays as history.
func keepsHistory(pool *hfv1.RunnerPool) bool {
	h := pool.Spec.Lifecycle.History
	return h != nil && h.Limit > 0
}

// RetainsFailed reports whether pool keeps failed VMs.
func RetainsFailed(pool *hfv1.RunnerPool) bool {
	f := pool.Spec.Lifecycle.FailedRetention
	return f != nil && f.MaxRetained > 0
}

// FailedRetentionTTL is how long pool keeps a failed VM.
func FailedRetentionTTL(pool *hfv1.RunnerPool) time.Duration {
	if f := pool.Spec.Lifecycle.FailedRetention; f != nil && f.TTL != nil {
		return f.TTL.Duration
	}
	return 24 * time.Hour
}

// finish ends a claim whose VM is gone: it stays as history (Finished, no
// finalizer) when its pool keeps history, else it is deleted. Either way
// its runner outcome is counted here, once.
func (r *Reconciler) finish(ctx context.Context, s *claimScope) error {
	claim := s.claim
	if pool := s.poolOf(ctx); pool != nil && keepsHistory(pool) && claim.DeletionTimestamp.IsZero() {
		// The finalizer goes first: a Finished claim is never reconciled
		// again, so a removal that fails (a conflict with a newer version)
		// must leave the claim in a state that retries it.
		if err := r.removeFinalizer(ctx, s); err != nil {
			return err
		}
		now := metav1.NewTime(r.Clock.Now())
		claim.Status.End.FinishedAt = &now
		msg := "The VM is gone; the claim is kept as history"
		if claim.Disowned() || s.facts.isTrue(claim, hfv1.MachineClaimFinalizedCondition) {
			msg = "The VM was disowned and is no longer HyperFleet's; the claim is kept as history"
		}
		s.facts.ending(hfv1.FinishedReason, msg)
		r.countOutcome(claim)
		return nil
	}
	if claim.DeletionTimestamp.IsZero() && !s.dnsRemovalPending() {
		// Everything the deletion pass would release is released (the VM,
		// the runner, the identity, the DNS records): the finalizer goes
		// now and the claim with its deletion, at once. A status write
		// recording the VM gone, for an object about to go, and a
		// deletion pass to drop the finalizer would be two writes per job
		// that nobody reads. The finalizer goes first, as for history, and
		// its removal labels the claim finished; one collection deletion
		// then takes it with the namespace's other finished claims
		// (finished.go). If that deletion fails, the claim (whose VM is
		// gone) is written as usual and its next pass deletes it again
		// (finishedPending).
		markFinished(claim)
		if err := r.removeFinalizer(ctx, s); err != nil {
			delete(claim.Labels, hfv1.FinishedLabel)
			return err
		}
		if err := r.deleteFinished(ctx, claim.Namespace); err != nil {
			return err
		}
		s.deleted = true
		r.countOutcome(claim)
		r.memory.succeeded(claim.UID)
		return nil
	}
	return client.IgnoreNotFound(r.Client.Delete(ctx, claim))
}

// countOutcome counts the claim's runner outcome and its VM's life for
// chargeback. Its callers run once per claim, after the finalizer is gone:
// a restart in between loses the count rather than doubling it.
func (r *Reconciler) countOutcome(claim *hfv1.MachineClaim) {
	pool := ""
	if ref := claim.Spec.RunnerPoolRef; ref != nil {
		pool = ref.Name
	}
	metrics.RunnerOutcomes.WithLabelValues(claim.Namespace, pool, string(Outcome(claim))).Inc()
	r.countVMSeconds(claim, pool)
	r.Runners.Forget(claim.UID)
}

// countVMSeconds adds the claim's VM life, from the clone request (the
// claim entering Provisioning) to now (the VM destroyed, abandoned or
// disowned), to the repository of the job its runner took
// (status.bootstrap.jobRepository): IdleLabel when it took none,
// UnknownLabel when the claim recorded a job without a repository (a
// claim from before the field). A claim that never asked for a VM adds
// nothing.
func (r *Reconciler) countVMSeconds(claim *hfv1.MachineClaim, pool string) {
	times := claim.Status.PhaseTimes
	if times == nil || times.Provisioning == nil {
		return
	}
	repository := ""
	if st := claim.Status.Bootstrap; st != nil && st.Job() != "" {
		repository = st.JobRepository
		if repository == "" {
			repository = metrics.UnknownLabel
		}
	}
	metrics.AddVMSeconds(claim.Namespace, pool, repository, r.Clock.Now().Sub(times.Provisioning.Time))
}

// removeFinalizer drops the claim's finalizer and writes it at once,
// under the scope's optimistic lock: a copy from a stale cache must fail
// with a conflict rather than drop a finalizer someone added since.
func (r *Reconciler) removeFinalizer(ctx context.Context, s *claimScope) error {
	claim := s.claim
	if !controllerutil.ContainsFinalizer(claim, hfv1.MachineClaimFinalizer) {
		return nil
	}
	controllerutil.RemoveFinalizer(claim, hfv1.MachineClaimFinalizer)
	if err := s.patch.PatchMetadata(ctx, claim); err != nil {
		controllerutil.AddFinalizer(claim, hfv1.MachineClaimFinalizer)
		return fmt.Errorf("remove finalizer %s from MachineClaim %s/%s: %w", hfv1.MachineClaimFinalizer, claim.Namespace, claim.Name, err)
	}
	return nil
}

// endPoweredOff records the end of a claim whose VM powered off: one whose
// agent refused to run the job fails with its reason (refusedByGuest), one
// that gave up on its join token before attesting says so, and one that
// found it used by someone else fails (its identity was stolen). The end
// list runs in the same pass.
func (r *Reconciler) endPoweredOff(ctx context.Context, s *claimScope, msg string) {
	if r.PowerOff.refusedByGuest(s, msg) {
		return
	}
	msg, reason := r.Identity.joinTokenGaveUp(ctx, s, s.cluster, msg)
	switch reason {
	case hfv1.IdentityStolenReason:
		s.fail(claimEnd{reason: hfv1.EndFailed, condition: reason, message: msg})
		return
	case "":
		reason = hfv1.VMPoweredOffReason
	}
	s.beginEnd(claimEnd{reason: hfv1.EndPoweredOff, condition: reason, message: msg})
}
