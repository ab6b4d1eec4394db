package claimvm

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/claimstatus"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Retention is how a failed claim's pool keeps its VM: the pool's name
// and how long (spec.lifecycle.failedRetention), and the step that removes
// the VM's runner from the CI platform (done false while it must be
// retried, with the requeue).
type Retention struct {
	Pool              string
	TTL               time.Duration
	DeregisterRunner  func(ctx context.Context, claim *hfv1.MachineClaim) (bool, time.Duration)
	WaitForConnection time.Duration
}

// Retain keeps a failed claim's VM, stopped, for debugging (the pool
// deletes the claim after the TTL or when it keeps too many). It reports
// false when the VM is to be destroyed instead (gone, or unreadable); while
// retained is true the claim waits requeue.
func (s *Service) Retain(ctx context.Context, claim *hfv1.MachineClaim, keep Retention) (retained bool, requeue time.Duration) {
	ref := claim.Status.VMRef
	if ref == nil {
		return false, 0
	}
	p, _, connected := s.Providers.Provider(ref.HypervisorCluster)
	if !connected {
		return true, keep.WaitForConnection
	}
	vmRef := provider.VMRef{VMID: int(ref.VMID), Node: ref.Node}
	vm, err := p.GetVM(ctx, vmRef)
	if err != nil {
		// Gone, or unreadable: let the normal path clean up.
		return false, 0
	}
	if vm.Power != provider.PowerStopped {
		if _, err := p.SetPower(ctx, Owner(claim), vmRef, provider.PowerOff); err != nil {
			ctrl.LoggerFrom(ctx).Info("Could not stop the failed VM kept for debugging; retrying", "err", err.Error())
			return true, s.Backoff(claim)
		}
		s.Recorder.Eventf(claim, corev1.EventTypeNormal, string(hfv1.RetainedReason), "VM %d stopped and kept for debugging (RunnerPool %s spec.lifecycle.failedRetention)", ref.VMID, keep.Pool)
	}
	// A kept VM keeps nothing that still works as a credential: its
	// cloud-init ISO (the single-use credential) leaves the storage and its
	// runner leaves the CI platform before it is reported retained
	// (docs/security.md, "Credentials after the VM").
	if done, requeue := s.removeMedia(ctx, claim, p); !done {
		return true, requeue
	}
	if done, requeue := keep.DeregisterRunner(ctx, claim); !done {
		return true, requeue
	}
	until := claim.Status.End.StartedAt.Add(keep.TTL)
	claimstatus.SetEnding(claim, hfv1.RetainedReason,
		fmt.Sprintf("VM %d on %s is kept stopped for debugging until %s: %s", ref.VMID, ref.HypervisorCluster, until.UTC().Format(time.RFC3339), claim.Status.TerminationReason))
	return true, 5 * time.Minute
}

// removeMedia advances the removal of a retained VM's cloud-init media by
// one step; done once none is left.
func (s *Service) removeMedia(ctx context.Context, claim *hfv1.MachineClaim, p provider.Provider) (bool, time.Duration) {
	ref := claim.Status.VMRef
	prev := Progress(claim)
	res, err := p.RemoveCloudInitMedia(ctx, Owner(claim), prev)
	if err != nil {
		claimstatus.SetEnding(claim, hfv1.RetainingReason, fmt.Sprintf("VM %d is kept for debugging once its cloud-init ISO (it holds the runner credential) is removed: %v", ref.VMID, err))
		ctrl.LoggerFrom(ctx).Info("Could not remove the cloud-init ISO of the failed VM kept for debugging; retrying", "err", err.Error())
		return false, s.Backoff(claim)
	}
	s.RecordProgress(ctx, claim, ref.HypervisorCluster, prev, res.Progress)
	if !res.Done {
		claimstatus.SetEnding(claim, hfv1.RetainingReason, orDefault(res.Message, fmt.Sprintf("Removing the cloud-init ISO of VM %d before keeping it", ref.VMID)))
		return false, max(res.RetryAfter, CallAgainNow)
	}
	return true, 0
}
