package controller

import (
	"context"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/claimrunner"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/poweroff"
)

// The claim's runner on its CI platform is internal/claimrunner's: what
// the platform says about it, and removing it when the claim ends.

// runnerSteps is the runner service with this reconciler's dependencies and
// backoff.
func (r *MachineClaimReconciler) runnerSteps() *claimrunner.Service {
	return &claimrunner.Service{Client: r.Client, Releaser: r.Bootstrap, Runners: r.Runners, Recorder: r.Recorder, Clock: r.Clock, Backoff: r.backoff,
		Hint: func(claim *hfv1.MachineClaim, source hypervisors.HintSource, now time.Time) hypervisors.MarkOutcome {
			return poweroff.Mark(r.Transitions, claim, source, now)
		}}
}

// observeWorkload folds what the CI platform says about the claim's runner
// into its status; a runner whose job completed ends the claim (handled).
func (r *MachineClaimReconciler) observeWorkload(ctx context.Context, s *claimScope) (ctrl.Result, bool, error) {
	jobDone, err := r.runnerSteps().Observe(ctx, s.claim)
	if err != nil || jobDone == "" {
		return ctrl.Result{}, false, err
	}
	res, err := r.endAndTerminate(ctx, s, claimEnd{reason: hfv1.EndJobCompleted, code: string(hfv1.EndJobCompleted), message: jobDone})
	return res, true, err
}

// drainRunner removes an ending claim's runner while its VM still runs; it
// reports false while the runner is busy.
func (r *MachineClaimReconciler) drainRunner(ctx context.Context, claim *hfv1.MachineClaim) (bool, ctrl.Result) {
	done, requeue := r.runnerSteps().Drain(ctx, claim)
	return done, ctrl.Result{RequeueAfter: requeue}
}

// releaseRunner removes the claim's runner once its VM is gone.
func (r *MachineClaimReconciler) releaseRunner(ctx context.Context, claim *hfv1.MachineClaim) (bool, ctrl.Result) {
	done, requeue := r.runnerSteps().Release(ctx, claim)
	return done, ctrl.Result{RequeueAfter: requeue}
}

// claimsForJob wakes the claim whose runner a CIJob names.
func (r *MachineClaimReconciler) claimsForJob(ctx context.Context, o client.Object) []reconcile.Request {
	job := o.(*hfv1.CIJob)
	if job.Status.RunnerName == "" {
		return nil
	}
	var list hfv1.MachineClaimList
	if err := r.Client.List(ctx, &list, client.InNamespace(job.Namespace), client.MatchingFields{claimRunnerIndex: job.Status.RunnerName}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "List claims of runner", "runner", job.Status.RunnerName)
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return out
}

// poolOf is the claim's RunnerPool from the cache; nil for a claim made by
// hand or whose pool is gone.
func (r *MachineClaimReconciler) poolOf(ctx context.Context, claim *hfv1.MachineClaim) *hfv1.RunnerPool {
	ref := claim.Spec.RunnerPoolRef
	if ref == nil {
		return nil
	}
	var pool hfv1.RunnerPool
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: ref.Name}, &pool); err != nil {
		return nil
	}
	return &pool
}
