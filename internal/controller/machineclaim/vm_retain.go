package machineclaim

import (
	"cmp"
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// retainFailedVM keeps a failed claim's VM, stopped, for debugging, when
// its pool retains failed VMs (spec.lifecycle.failedRetention; the pool
// deletes the claim after the TTL or when it keeps too many). It reports
// false when the VM is to be destroyed instead (no such pool, or the VM is
// gone or unreadable); while retained is true the claim waits requeue.
func (r *Reconciler) retainFailedVM(ctx context.Context, s *claimScope) (retained bool, res ctrl.Result) {
	claim := s.claim
	pool := s.poolOf(ctx)
	if pool == nil || !RetainsFailed(pool) {
		return false, ctrl.Result{}
	}
	requeue := func(d time.Duration) ctrl.Result { return ctrl.Result{RequeueAfter: d} }
	ref := claim.Status.VMRef
	if ref == nil {
		return false, ctrl.Result{}
	}
	p, _, connected := r.Registry.Provider(ref.HypervisorCluster)
	if !connected {
		return true, requeue(waitForDependency)
	}
	vmRef := vmRefOf(ref)
	vm, err := p.GetVM(ctx, vmRef)
	if err != nil {
		// Gone, or unreadable: let the normal path clean up.
		return false, ctrl.Result{}
	}
	if vm.Power != provider.PowerStopped {
		if _, err := p.SetPower(ctx, vmspec.Owner(claim), vmRef, provider.PowerOff); err != nil {
			ctrl.LoggerFrom(ctx).Info("Could not stop the failed VM kept for debugging; retrying", "err", err.Error())
			return true, requeue(s.backoff())
		}
		r.Recorder.Eventf(claim, corev1.EventTypeNormal, string(hfv1.RetainedReason), "VM %s stopped and kept for debugging (RunnerPool %s spec.lifecycle.failedRetention)", ref.ID(), pool.Name)
	}
	// A kept VM keeps nothing that still works as a credential: its
	// cloud-init ISO (the single-use credential) leaves the storage and its
	// runner leaves the CI platform before it is reported retained
	// (docs/security.md, "Credentials after the VM").
	if done, wait := r.removeMedia(ctx, s, p); !done {
		return true, requeue(wait)
	}
	if done, wait := r.runner().deregister(ctx, s); !done {
		return true, requeue(wait)
	}
	until := claim.Status.End.StartedAt.Add(FailedRetentionTTL(pool))
	s.facts.ending(hfv1.RetainedReason,
		fmt.Sprintf("VM %s on %s is kept stopped for debugging until %s: %s", ref.ID(), ref.HypervisorCluster, until.UTC().Format(time.RFC3339), claim.Status.TerminationReason))
	return true, requeue(5 * time.Minute)
}

// removeMedia advances the removal of a retained VM's cloud-init media by
// one step; done once none is left.
func (r *Reconciler) removeMedia(ctx context.Context, s *claimScope, p provider.Provider) (bool, time.Duration) {
	claim := s.claim
	ref := claim.Status.VMRef
	prev := r.memory.progressOf(claim)
	res, err := p.RemoveCloudInitMedia(ctx, vmspec.Owner(claim), prev)
	if err != nil {
		s.facts.ending(hfv1.RetainingReason, fmt.Sprintf("VM %s is kept for debugging once its cloud-init ISO (it holds the runner credential) is removed: %v", ref.ID(), err))
		ctrl.LoggerFrom(ctx).Info("Could not remove the cloud-init ISO of the failed VM kept for debugging; retrying", "err", err.Error())
		return false, s.backoff()
	}
	s.recordProgress(ctx, ref.HypervisorCluster, prev, res.Progress)
	if !res.Done {
		s.facts.ending(hfv1.RetainingReason, cmp.Or(res.Message, fmt.Sprintf("Removing the cloud-init ISO of VM %s before keeping it", ref.ID())))
		return false, max(res.RetryAfter, CallAgainNow)
	}
	return true, 0
}
