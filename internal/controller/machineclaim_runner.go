package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/claimstatus"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

const (
	// runnerBusyRecheck is how often a deleted claim whose runner runs a
	// job asks again.
	runnerBusyRecheck = 15 * time.Second
	// runnerReleaseDeadline bounds retries to remove a runner once its VM
	// is gone: the CI platform drops offline ephemeral runners by itself
	// (GitHub after a day), so a claim never hangs on it forever.
	runnerReleaseDeadline = 10 * time.Minute
)

// drainRunner removes a deleted claim's runner while its VM still runs. It
// reports false (with the requeue) while the runner is busy: the claim's
// Ending condition says why it waits (phase Draining) and the VM keeps
// running the job.
func (r *MachineClaimReconciler) drainRunner(ctx context.Context, claim *hfv1.MachineClaim) (bool, ctrl.Result) {
	if r.Bootstrap == nil || claim.Status.Bootstrap == nil || claim.Status.VMRef == nil {
		return true, ctrl.Result{}
	}
	err := r.release(ctx, claim)
	switch {
	case err == nil:
		return true, ctrl.Result{}
	case errors.Is(err, workload.ErrRunnerBusy):
		msg := fmt.Sprintf("Runner %s is running a job; the VM is deleted when the job ends", claim.Status.Bootstrap.RunnerName)
		claimstatus.SetEnding(claim, hfv1.RunnerBusyReason, msg)
		return false, ctrl.Result{RequeueAfter: runnerBusyRecheck}
	}
	if wait, limited := retryAfterWorkload(err, r.Clock.Now()); limited {
		return false, ctrl.Result{RequeueAfter: wait}
	}
	// Anything else (the template or its credentials are gone, GitHub is
	// down): the platform cannot say whether the runner is busy. A runner
	// known to have taken a job not yet recorded as finished keeps its VM
	// (docs/architecture.md: teardown never kills a busy runner) until the
	// platform answers or the job's CIJob completes (its watch wakes the
	// claim); an idle VM is not kept alive: it is destroyed, and removing
	// the runner is tried again once the VM is gone.
	if job, busy := r.runnerMayBeBusy(ctx, claim); busy {
		msg := fmt.Sprintf("Cannot ask the CI platform whether runner %s still runs job %d (%v); the VM stays until it answers or the job is recorded as finished",
			claim.Status.Bootstrap.RunnerName, job, err)
		claimstatus.SetEnding(claim, hfv1.RunnerStateUnknownReason, truncate(msg, 1024))
		return false, ctrl.Result{RequeueAfter: r.backoff(claim)}
	}
	ctrl.LoggerFrom(ctx).Info("Could not remove the runner before destroying its VM; retrying after", "err", err.Error())
	return true, ctrl.Result{}
}

// runnerMayBeBusy reports whether the claim's runner took a job that is not
// recorded as finished (a CIJob that cannot be read counts as unfinished;
// one that is gone was a finished one collected after its retention, since
// only finished CIJobs are collected), and which job.
func (r *MachineClaimReconciler) runnerMayBeBusy(ctx context.Context, claim *hfv1.MachineClaim) (int64, bool) {
	st := claim.Status.Bootstrap
	if st == nil || st.JobID == 0 {
		return 0, false
	}
	job, err := r.jobOf(ctx, claim)
	if err != nil {
		return st.JobID, true
	}
	return st.JobID, job != nil && job.Status.State != hfv1.CIJobCompleted
}

// releaseRunner removes the claim's runner once its VM is gone. It reports
// false (with the requeue) to retry; after runnerReleaseDeadline it gives
// up with a warning event rather than hold the claim.
func (r *MachineClaimReconciler) releaseRunner(ctx context.Context, claim *hfv1.MachineClaim) (bool, ctrl.Result) {
	st := claim.Status.Bootstrap
	if r.Bootstrap == nil || st == nil || st.RunnerName == "" && st.RunnerID == 0 {
		return true, ctrl.Result{}
	}
	err := r.release(ctx, claim)
	if err == nil {
		r.Recorder.Eventf(claim, corev1.EventTypeNormal, string(hfv1.RunnerRemovedReason), "Runner %s is no longer registered", st.RunnerName)
		claim.Status.Bootstrap.RunnerID = 0
		claim.Status.Bootstrap.RunnerName = ""
		return true, ctrl.Result{}
	}
	since := claim.CreationTimestamp.Time
	if end := claim.Status.End; end != nil {
		since = end.StartedAt.Time
	}
	if r.Clock.Since(since) > runnerReleaseDeadline {
		r.Recorder.Eventf(claim, corev1.EventTypeWarning, string(hfv1.RunnerNotRemovedReason),
			"Gave up removing runner %s after %s: %v; the CI platform removes offline ephemeral runners by itself", st.RunnerName, runnerReleaseDeadline, err)
		return true, ctrl.Result{}
	}
	claimstatus.SetEnding(claim, hfv1.RunnerNotRemovedReason, truncate(fmt.Sprintf("Removing runner %s: %v", st.RunnerName, err), 1024))
	if wait, limited := retryAfterWorkload(err, r.Clock.Now()); limited {
		return false, ctrl.Result{RequeueAfter: wait}
	}
	return false, ctrl.Result{RequeueAfter: r.backoff(claim)}
}

// release calls the BootstrapSource with the claim's template.
func (r *MachineClaimReconciler) release(ctx context.Context, claim *hfv1.MachineClaim) error {
	var tmpl hfv1.HypervisorMachineTemplate
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: claim.Spec.TemplateRef.Name}, &tmpl); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("HypervisorMachineTemplate %s is gone with the credentials needed to remove the runner: %w", claim.Spec.TemplateRef.Name, err)
		}
		return err
	}
	return r.Bootstrap.Release(ctx, claim, &tmpl)
}
