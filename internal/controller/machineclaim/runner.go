package machineclaim

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
	"github.com/hyperfleet/hyperfleet/internal/phase"
)

// The claim's runner on its CI platform is the runner service's (runner_service.go): what
// the platform says about it, and removing it when the claim ends.

// observeWorkload folds what the CI platform says about the claim's runner
// into its status; a runner whose job completed ends the claim (the pass
// stops, and the end list runs).
func (r *Reconciler) observeWorkload(ctx context.Context, s *claimScope) (phase.Result, error) {
	jobDone, err := r.observeRunner(ctx, s)
	switch {
	case err != nil:
		return phase.Stop(), err
	case jobDone == "":
		return phase.Next(), nil
	}
	r.beginEnd(s, claimEnd{reason: hfv1.EndJobCompleted, code: string(hfv1.EndJobCompleted), message: jobDone})
	return phase.Stop(), nil
}

// claimsForJob wakes the claim whose runner a CIJob names.
func (r *Reconciler) claimsForJob(ctx context.Context, o client.Object) []reconcile.Request {
	job := o.(*hfv1.CIJob)
	if job.Status.RunnerName == "" {
		return nil
	}
	var list hfv1.MachineClaimList
	if err := r.Client.List(ctx, &list, client.InNamespace(job.Namespace), client.MatchingFields{fieldindex.ClaimRunner: job.Status.RunnerName}); err != nil {
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
func (r *Reconciler) poolOf(ctx context.Context, claim *hfv1.MachineClaim) *hfv1.RunnerPool {
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
