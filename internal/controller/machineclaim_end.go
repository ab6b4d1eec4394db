package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/claimstatus"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
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
func (r *MachineClaimReconciler) beginEnd(claim *hfv1.MachineClaim, e claimEnd) {
	if e.condition == "" {
		e.condition = hfv1.ConditionReason(string(e.reason.ConditionReason()))
	}
	if e.code == "" {
		e.code = string(e.condition)
	}
	claim.Status.End = &hfv1.MachineClaimEnd{
		Reason:    e.reason,
		Message:   truncate(e.message, 1024),
		Failed:    e.failed,
		StartedAt: metav1.NewTime(r.Clock.Now()),
	}
	claim.Status.TerminationReason = truncate(e.code+": "+e.message, 1024)
	claimstatus.SetEnding(claim, e.condition, e.message)
}

// fail ends a claim as Failed; its VM is then kept stopped when its pool
// retains failed VMs.
func (r *MachineClaimReconciler) fail(claim *hfv1.MachineClaim, e claimEnd) {
	e.failed = true
	if e.condition == "" {
		e.condition = hfv1.ConditionReason(string(e.reason.ConditionReason()))
	}
	setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, e.condition, truncate(e.message, 1024))
	r.beginEnd(claim, e)
}

// endAndTerminate ends a claim and starts deleting its VM at once, without
// waiting for another pass.
func (r *MachineClaimReconciler) endAndTerminate(ctx context.Context, s *claimScope, e claimEnd) (ctrl.Result, error) {
	r.beginEnd(s.claim, e)
	res, _, err := r.reconcileTerminate(ctx, s)
	return res, err
}

// handleEnd carries out the pool's request (spec.end) and runs an ended
// claim's teardown; a claim that has not ended and was not asked to goes
// on to provisioning.
func (r *MachineClaimReconciler) handleEnd(ctx context.Context, s *claimScope) (ctrl.Result, bool, error) {
	claim := s.claim
	if req := claim.Spec.End; req != nil && !claim.Ended() {
		if req.Fail {
			r.fail(claim, poolEnd(req))
		} else {
			if !req.Reason.Hard() {
				// The runner goes first, which the CI platform refuses
				// while it runs a job: the VM then stays (Draining). A
				// hard limit does not wait: its pool cancelled the job.
				if drained, res := r.drainRunner(ctx, claim); !drained {
					return res, false, nil
				}
			}
			r.beginEnd(claim, poolEnd(req))
		}
	}
	if claim.Ended() {
		r.replaceCause(claim)
	}
	switch {
	case claim.IsFinished():
		return ctrl.Result{}, false, nil
	case claim.HasFailed():
		return r.reconcileFailed(ctx, s)
	case claim.Ended():
		return r.reconcileTerminate(ctx, s)
	}
	return ctrl.Result{}, true, nil
}

// replaceCause makes the pool's hard limit the recorded cause of a claim
// that ended before the pool's request reached it. A hard limit cancels
// the job before its pool asks the claim to end; the runner's exit powers
// the VM off, and the cancelled job's completion arrives too, so shutdown
// detection or the job's end can be seen first. The pool's reason is the
// cause, so it replaces either.
func (r *MachineClaimReconciler) replaceCause(claim *hfv1.MachineClaim) {
	req, end := claim.Spec.End, claim.Status.End
	if req == nil || claim.HasFailed() || end.Reason == req.Reason || !endedByPoolCancellation(claim) {
		return
	}
	end.Reason, end.Message = req.Reason, truncate(req.Message, 1024)
	claim.Status.TerminationReason = truncate(string(req.Reason)+": "+req.Message, 1024)
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
func (r *MachineClaimReconciler) reconcileTerminate(ctx context.Context, s *claimScope) (ctrl.Result, bool, error) {
	claim := s.claim
	done, result, err := r.deleteVM(ctx, claim)
	if err != nil || !done {
		return result, false, err
	}
	if done, result := r.releaseRunner(ctx, claim); !done {
		return result, false, nil
	}
	if done, result := r.releaseIdentity(ctx, claim); !done {
		return result, false, nil
	}
	if end := claim.Status.End; end != nil {
		metrics.PowerOffToDestroyed.Observe(r.Clock.Since(end.StartedAt.Time).Seconds())
	}
	if err := r.finish(ctx, s); err != nil {
		return ctrl.Result{}, false, fmt.Errorf("end MachineClaim after its VM was destroyed: %w", err)
	}
	return ctrl.Result{}, false, nil
}

// reconcileFailed removes the VM of a failed claim (unless its ownership
// does not verify) and keeps the claim for inspection.
func (r *MachineClaimReconciler) reconcileFailed(ctx context.Context, s *claimScope) (ctrl.Result, bool, error) {
	claim := s.claim
	if claim.Status.VMRef == nil || hfv1.IsConditionFalse(claim.Status.Conditions, hfv1.MachineClaimOwnershipVerifiedCondition) {
		return ctrl.Result{}, false, nil
	}
	if retained, result := r.retainFailedVM(ctx, claim); retained {
		// A VM kept for debugging is stopped: its identity goes now.
		if done, res := r.releaseIdentity(ctx, claim); !done {
			return res, false, nil
		}
		return result, false, nil
	}
	done, result, err := r.deleteVM(ctx, claim)
	if err != nil || !done {
		return result, false, err
	}
	_, result = r.releaseIdentity(ctx, claim)
	return result, false, nil
}

// holdFinalizer ends the deletion pass of a claim without the finalizer:
// nothing is left to clean up.
func (r *MachineClaimReconciler) holdFinalizer(_ context.Context, s *claimScope) (ctrl.Result, bool, error) {
	return ctrl.Result{}, controllerutil.ContainsFinalizer(s.claim, hfv1.MachineClaimFinalizer), nil
}

// beginDeletion ends a deleted claim that had not ended yet. A runner in
// the middle of a job keeps its VM (docs/architecture.md, "Teardown never
// kills a busy runner"): the runner is removed first, which the CI
// platform refuses while it is busy. A hard limit does not wait: its pool
// cancelled the job first.
func (r *MachineClaimReconciler) beginDeletion(ctx context.Context, s *claimScope) (ctrl.Result, bool, error) {
	claim := s.claim
	if claim.Ended() {
		return ctrl.Result{}, true, nil
	}
	if !claim.HardEnd() {
		if drained, result := r.drainRunner(ctx, claim); !drained {
			return result, false, nil
		}
	}
	e := claimEnd{reason: hfv1.EndDeleted, code: string(hfv1.EndDeleted), message: "the MachineClaim was deleted"}
	if req := claim.Spec.End; req != nil {
		e = poolEnd(req)
		e.failed = false
	}
	r.beginEnd(claim, e)
	return ctrl.Result{}, true, nil
}

// deleteVMPhase destroys a deleted claim's VM.
func (r *MachineClaimReconciler) deleteVMPhase(ctx context.Context, s *claimScope) (ctrl.Result, bool, error) {
	done, result, err := r.deleteVM(ctx, s.claim)
	return result, done && err == nil, err
}

// releaseRunnerPhase removes a deleted claim's runner once its VM is gone.
func (r *MachineClaimReconciler) releaseRunnerPhase(ctx context.Context, s *claimScope) (ctrl.Result, bool, error) {
	done, result := r.releaseRunner(ctx, s.claim)
	return result, done, nil
}

// removeFinalizerPhase lets a deleted claim go, its VM and runner gone.
func (r *MachineClaimReconciler) removeFinalizerPhase(ctx context.Context, s *claimScope) (ctrl.Result, bool, error) {
	if err := r.removeFinalizer(ctx, s); err != nil {
		return ctrl.Result{}, false, err
	}
	r.countOutcome(s.claim)
	r.attempts.Delete(s.claim.UID)
	return ctrl.Result{}, false, nil
}

// deleteVM advances the deletion of the claim's VM by one step. It reports
// done once no VM is left to delete.
func (r *MachineClaimReconciler) deleteVM(ctx context.Context, claim *hfv1.MachineClaim) (bool, ctrl.Result, error) {
	ref := claim.Status.VMRef
	if ref == nil || ref.VMID == 0 {
		r.releaseAddresses(ctx, claim)
		return true, ctrl.Result{}, nil
	}
	p, health, connected := r.Registry.Provider(ref.HypervisorCluster)
	if !connected {
		claimstatus.SetEnding(claim, hfv1.ClusterUnavailableReason,
			fmt.Sprintf("Cannot delete VM %d yet: HypervisorCluster %s is not connected: %s", ref.VMID, ref.HypervisorCluster, health.Message))
		return false, ctrl.Result{RequeueAfter: r.backoff(claim)}, nil
	}
	prev := progressOf(claim)
	res, err := p.DeleteVM(ctx, ownerOf(claim), prev)
	switch {
	case errors.Is(err, provider.ErrNotOwned):
		return false, r.keepForAdmin(ctx, claim, err), nil
	case err != nil:
		class, reason := provider.Classify(err), provider.ReasonOf(err)
		metrics.ClaimErrors.WithLabelValues(string(class), reason).Inc()
		msg := fmt.Sprintf("Deleting VM %d failed (%s, will retry): %v", ref.VMID, class, err)
		if claimstatus.EndingReason(claim) != reason {
			r.Recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.FailedDeleteReason), truncate(msg, 1024))
		}
		claimstatus.SetEnding(claim, hfv1.ConditionReason(reason), msg)
		return false, ctrl.Result{RequeueAfter: r.backoff(claim)}, nil
	}
	r.attempts.Delete(claim.UID)
	if !res.Done {
		r.recordProgress(ctx, claim, ref.HypervisorCluster, prev, res.Progress)
		claimstatus.SetEnding(claim, hfv1.DeletingVMReason, orDefault(res.Message, fmt.Sprintf("Deleting VM %d", ref.VMID)))
		retry := res.RetryAfter
		if retry <= 0 {
			retry = callAgainNow
		}
		return false, ctrl.Result{RequeueAfter: retry}, nil
	}
	r.Recorder.Eventf(claim, corev1.EventTypeNormal, string(hfv1.VMDeletedReason), "VM %d on %s destroyed and its cloud-init ISO removed", ref.VMID, ref.HypervisorCluster)
	r.forgetTransition(ref)
	claim.Status.VMRef, claim.Status.Task = nil, nil
	r.releaseAddresses(ctx, claim)
	setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.VMDeletedReason, fmt.Sprintf("VM %d was destroyed", ref.VMID))
	claimstatus.SetEnding(claim, hfv1.VMDeletedReason, fmt.Sprintf("VM %d was destroyed", ref.VMID))
	return true, ctrl.Result{}, nil
}

// ownershipRecheck is how often a claim held by keepForAdmin reads its VM
// again. The cluster poller wakes it sooner when the VM leaves the listing.
const ownershipRecheck = 10 * time.Minute

// keepForAdmin handles a VM whose ownership marker does not verify at
// deletion. The VM is never touched, and since it may be the claim's own VM
// with a damaged marker (still running with the claim's address), nothing
// is released either: the claim keeps its VM reference, its addresses and
// its finalizer until the VM is gone or an admin removes the finalizer
// (docs/operations.md, docs/security.md "Absence and release").
func (r *MachineClaimReconciler) keepForAdmin(ctx context.Context, claim *hfv1.MachineClaim, err error) ctrl.Result {
	ref := claim.Status.VMRef
	msg := fmt.Sprintf("VM %d on HypervisorCluster %s does not carry this claim's verified ownership marker (%v). HyperFleet neither touches it nor releases this claim's addresses while it may exist. "+
		"An admin must check VM %d by hand: once it is deleted the claim finishes on its own; if it is someone else's VM, delete this MachineClaim and remove its finalizer %s",
		ref.VMID, ref.HypervisorCluster, err, ref.VMID, hfv1.MachineClaimFinalizer)
	if claimstatus.EndingReason(claim) != string(hfv1.OwnershipMismatchReason) {
		r.Recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.OwnershipMismatchReason), truncate(msg, 1024))
		ctrl.LoggerFrom(ctx).Info("VM ownership does not verify; keeping the claim's finalizer and addresses for an admin", "vmid", ref.VMID, "cluster", ref.HypervisorCluster, "err", err.Error())
	}
	setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimOwnershipVerifiedCondition, metav1.ConditionFalse, hfv1.OwnershipMismatchReason, truncate(msg, 32768))
	claimstatus.SetEnding(claim, hfv1.OwnershipMismatchReason, msg)
	return ctrl.Result{RequeueAfter: ownershipRecheck}
}

// retainFailedVM keeps a failed claim's VM, stopped, when its pool retains
// failed VMs for debugging (the pool deletes the claim after the TTL or
// when more than maxRetained are kept). It reports false when the VM is
// to be destroyed instead.
func (r *MachineClaimReconciler) retainFailedVM(ctx context.Context, claim *hfv1.MachineClaim) (bool, ctrl.Result) {
	pool := r.poolOf(ctx, claim)
	if pool == nil || !retainsFailed(pool) || claim.Status.VMRef == nil {
		return false, ctrl.Result{}
	}
	ref := claim.Status.VMRef
	p, _, connected := r.Registry.Provider(ref.HypervisorCluster)
	if !connected {
		return true, ctrl.Result{RequeueAfter: waitForDependency}
	}
	vm, err := p.GetVM(ctx, provider.VMRef{VMID: int(ref.VMID), Node: ref.Node})
	if err != nil {
		// Gone, or unreadable: let the normal path clean up.
		return false, ctrl.Result{}
	}
	if vm.Power != provider.PowerStopped {
		if _, err := p.SetPower(ctx, ownerOf(claim), provider.VMRef{VMID: int(ref.VMID), Node: ref.Node}, provider.PowerOff); err != nil {
			ctrl.LoggerFrom(ctx).Info("Could not stop the failed VM kept for debugging; retrying", "err", err.Error())
			return true, ctrl.Result{RequeueAfter: r.backoff(claim)}
		}
		r.Recorder.Eventf(claim, corev1.EventTypeNormal, string(hfv1.RetainedReason), "VM %d stopped and kept for debugging (RunnerPool %s spec.lifecycle.failedRetention)", ref.VMID, pool.Name)
	}
	// A kept VM keeps nothing that still works as a credential: its
	// cloud-init ISO (the single-use credential) leaves the storage and its
	// runner leaves the CI platform before it is reported retained
	// (docs/security.md, "Credentials after the VM").
	if done, result := r.removeRetainedMedia(ctx, claim, p); !done {
		return true, result
	}
	if done, requeue := r.runnerSteps().Deregister(ctx, claim); !done {
		return true, ctrl.Result{RequeueAfter: requeue}
	}
	until := claim.Status.End.StartedAt.Add(failedRetentionTTL(pool))
	claimstatus.SetEnding(claim, hfv1.RetainedReason,
		fmt.Sprintf("VM %d on %s is kept stopped for debugging until %s: %s", ref.VMID, ref.HypervisorCluster, until.UTC().Format(time.RFC3339), claim.Status.TerminationReason))
	return true, ctrl.Result{RequeueAfter: 5 * time.Minute}
}

// removeRetainedMedia advances the removal of a retained VM's cloud-init
// media by one step; done once none is left.
func (r *MachineClaimReconciler) removeRetainedMedia(ctx context.Context, claim *hfv1.MachineClaim, p provider.Provider) (bool, ctrl.Result) {
	ref := claim.Status.VMRef
	prev := progressOf(claim)
	res, err := p.RemoveCloudInitMedia(ctx, ownerOf(claim), prev)
	if err != nil {
		claimstatus.SetEnding(claim, hfv1.RetainingReason, fmt.Sprintf("VM %d is kept for debugging once its cloud-init ISO (it holds the runner credential) is removed: %v", ref.VMID, err))
		ctrl.LoggerFrom(ctx).Info("Could not remove the cloud-init ISO of the failed VM kept for debugging; retrying", "err", err.Error())
		return false, ctrl.Result{RequeueAfter: r.backoff(claim)}
	}
	r.recordProgress(ctx, claim, ref.HypervisorCluster, prev, res.Progress)
	if !res.Done {
		claimstatus.SetEnding(claim, hfv1.RetainingReason, orDefault(res.Message, fmt.Sprintf("Removing the cloud-init ISO of VM %d before keeping it", ref.VMID)))
		return false, ctrl.Result{RequeueAfter: max(res.RetryAfter, callAgainNow)}
	}
	return true, ctrl.Result{}
}

// keepsHistory reports whether a finished claim of pool stays as history.
func keepsHistory(pool *hfv1.RunnerPool) bool {
	h := pool.Spec.Lifecycle.History
	return h != nil && h.Limit > 0
}

// retainsFailed reports whether pool keeps failed VMs.
func retainsFailed(pool *hfv1.RunnerPool) bool {
	f := pool.Spec.Lifecycle.FailedRetention
	return f != nil && f.MaxRetained > 0
}

// failedRetentionTTL is how long pool keeps a failed VM.
func failedRetentionTTL(pool *hfv1.RunnerPool) time.Duration {
	if f := pool.Spec.Lifecycle.FailedRetention; f != nil && f.TTL != nil {
		return f.TTL.Duration
	}
	return 24 * time.Hour
}

// finish ends a claim whose VM is gone: it stays as history (Finished, no
// finalizer) when its pool keeps history, else it is deleted. Either way
// its runner outcome is counted here, once.
func (r *MachineClaimReconciler) finish(ctx context.Context, s *claimScope) error {
	claim := s.claim
	if pool := r.poolOf(ctx, claim); pool != nil && keepsHistory(pool) && claim.DeletionTimestamp.IsZero() {
		// The finalizer goes first: a Finished claim is never reconciled
		// again, so a removal that fails (a conflict with a newer version)
		// must leave the claim in a state that retries it.
		if err := r.removeFinalizer(ctx, s); err != nil {
			return err
		}
		now := metav1.NewTime(r.Clock.Now())
		claim.Status.End.FinishedAt = &now
		claimstatus.SetEnding(claim, hfv1.FinishedReason, "The VM is gone; the claim is kept as history")
		r.countOutcome(claim)
		return nil
	}
	return client.IgnoreNotFound(r.Client.Delete(ctx, claim))
}

// countOutcome counts the claim's runner outcome.
func (r *MachineClaimReconciler) countOutcome(claim *hfv1.MachineClaim) {
	pool := ""
	if ref := claim.Spec.RunnerPoolRef; ref != nil {
		pool = ref.Name
	}
	metrics.RunnerOutcomes.WithLabelValues(claim.Namespace, pool, string(outcomeOf(claim))).Inc()
	r.Runners.Forget(claim.UID)
}

// outcomeOf is a claim's runner outcome, from how it ended.
func outcomeOf(claim *hfv1.MachineClaim) scaling.Reason {
	reason := claim.EndReason()
	switch reason {
	case scaling.JobCompleted, scaling.IdleTimeout, scaling.MaxLifetime, scaling.JobTimeout,
		scaling.BootstrapTimeout, scaling.DriftReplaced, scaling.ScaledDown, scaling.Orphaned:
		return reason
	}
	switch {
	case claim.HasFailed():
		return scaling.Failed
	case claim.Status.Bootstrap != nil && claim.Status.Bootstrap.JobID != 0:
		// Powered off or deleted after its job: the job is what it did.
		return scaling.JobCompleted
	case reason == scaling.PoweredOff:
		return scaling.PoweredOff
	}
	return scaling.Deleted
}
