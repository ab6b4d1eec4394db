// Package claimvm is a MachineClaim's VM as its reconciler drives it
// through pkg/provider, one provider step per call (docs/architecture.md,
// "Never block in Reconcile"): the provider's progress kept in the claim's
// status (progress.go), deleting the VM, never one whose ownership marker
// does not verify (this file), and keeping a failed VM stopped for
// debugging (retain.go). Which step comes when is the reconciler's.
package claimvm

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/claimstatus"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

const (
	// CallAgainNow is the requeue for a provider that asks to be called
	// again at once.
	CallAgainNow = 10 * time.Millisecond
	// ownershipRecheck is how often a claim whose VM's ownership does not
	// verify reads its VM again. The cluster poller wakes it sooner when
	// the VM leaves the listing.
	ownershipRecheck = 10 * time.Minute
)

// Providers finds the provider of a HypervisorCluster and whether it is
// connected (internal/hypervisors.Registry).
type Providers interface {
	Provider(cluster string) (provider.Provider, hypervisors.Health, bool)
}

// Service runs the VM steps of claims. Backoff is the claim's next retry
// delay after a transient failure and Reset starts it over after a
// success (the reconciler's, shared by every step of a claim).
type Service struct {
	Providers Providers
	Recorder  record.EventRecorder
	Clock     clock.PassiveClock
	Backoff   func(*hfv1.MachineClaim) time.Duration
	Reset     func(*hfv1.MachineClaim)
}

// Owner is the claim as the provider's ownership marker names it.
func Owner(claim *hfv1.MachineClaim) provider.Owner {
	o := provider.Owner{
		Namespace: claim.Namespace,
		Name:      claim.Name,
		UID:       string(claim.UID),
		CreatedAt: claim.CreationTimestamp.UTC(),
	}
	if claim.Spec.RunnerPoolRef != nil {
		o.Pool = claim.Spec.RunnerPoolRef.Name
	}
	return o
}

// Delete advances the deletion of the claim's VM by one step, and reports
// done once no VM is left to delete (the claim's VM reference is then
// cleared). Where it is, or why it waits, is in the claim's Ending
// condition.
func (s *Service) Delete(ctx context.Context, claim *hfv1.MachineClaim) (bool, time.Duration) {
	ref := claim.Status.VMRef
	if ref == nil || ref.VMID == 0 {
		return true, 0
	}
	p, health, connected := s.Providers.Provider(ref.HypervisorCluster)
	if !connected {
		claimstatus.SetEnding(claim, hfv1.ClusterUnavailableReason,
			fmt.Sprintf("Cannot delete VM %d yet: HypervisorCluster %s is not connected: %s", ref.VMID, ref.HypervisorCluster, health.Message))
		return false, s.Backoff(claim)
	}
	prev := Progress(claim)
	res, err := p.DeleteVM(ctx, Owner(claim), prev)
	switch {
	case errors.Is(err, provider.ErrNotOwned):
		return false, s.keepForAdmin(ctx, claim, err)
	case err != nil:
		class, reason := provider.Classify(err), provider.ReasonOf(err)
		metrics.ClaimErrors.WithLabelValues(string(class), reason).Inc()
		msg := fmt.Sprintf("Deleting VM %d failed (%s, will retry): %v", ref.VMID, class, err)
		if claimstatus.EndingReason(claim) != reason {
			s.Recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.FailedDeleteReason), conditions.Truncate(msg, 1024))
		}
		claimstatus.SetEnding(claim, hfv1.ConditionReason(reason), msg)
		return false, s.Backoff(claim)
	}
	s.Reset(claim)
	if !res.Done {
		s.RecordProgress(ctx, claim, ref.HypervisorCluster, prev, res.Progress)
		claimstatus.SetEnding(claim, hfv1.DeletingVMReason, orDefault(res.Message, fmt.Sprintf("Deleting VM %d", ref.VMID)))
		return false, CallAgain(res.RetryAfter)
	}
	s.Recorder.Eventf(claim, corev1.EventTypeNormal, string(hfv1.VMDeletedReason), "VM %d on %s destroyed and its cloud-init ISO removed", ref.VMID, ref.HypervisorCluster)
	claim.Status.VMRef, claim.Status.Task = nil, nil
	conditions.Set(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.VMDeletedReason, fmt.Sprintf("VM %d was destroyed", ref.VMID))
	claimstatus.SetEnding(claim, hfv1.VMDeletedReason, fmt.Sprintf("VM %d was destroyed", ref.VMID))
	return true, 0
}

// keepForAdmin handles a VM whose ownership marker does not verify at
// deletion. The VM is never touched, and since it may be the claim's own VM
// with a damaged marker (still running with the claim's address), nothing
// is released either: the claim keeps its VM reference, its addresses and
// its finalizer until the VM is gone or an admin removes the finalizer
// (docs/operations.md, docs/security.md "Absence and release").
func (s *Service) keepForAdmin(ctx context.Context, claim *hfv1.MachineClaim, err error) time.Duration {
	ref := claim.Status.VMRef
	msg := fmt.Sprintf("VM %d on HypervisorCluster %s does not carry this claim's verified ownership marker (%v). HyperFleet neither touches it nor releases this claim's addresses while it may exist. "+
		"An admin must check VM %d by hand: once it is deleted the claim finishes on its own; if it is someone else's VM, delete this MachineClaim and remove its finalizer %s",
		ref.VMID, ref.HypervisorCluster, err, ref.VMID, hfv1.MachineClaimFinalizer)
	if claimstatus.EndingReason(claim) != string(hfv1.OwnershipMismatchReason) {
		s.Recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.OwnershipMismatchReason), conditions.Truncate(msg, 1024))
		ctrl.LoggerFrom(ctx).Info("VM ownership does not verify; keeping the claim's finalizer and addresses for an admin", "vmid", ref.VMID, "cluster", ref.HypervisorCluster, "err", err.Error())
	}
	conditions.Set(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimOwnershipVerifiedCondition, metav1.ConditionFalse, hfv1.OwnershipMismatchReason, msg)
	claimstatus.SetEnding(claim, hfv1.OwnershipMismatchReason, msg)
	return ownershipRecheck
}

// CallAgain is the requeue a provider asked for, CallAgainNow when it asked
// for none ("call again now").
func CallAgain(retryAfter time.Duration) time.Duration {
	if retryAfter <= 0 {
		return CallAgainNow
	}
	return retryAfter
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
