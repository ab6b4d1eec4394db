package machineclaim

import (
	"context"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
)

// A claim whose VM a power-off hint marked in transition (internal/poweroff)
// reads that VM directly until the mark expires or the VM is destroyed.

// pollInTransition reads the claim's VM directly while a hint has it in
// transition (handled: the claim ended). requeue is when to read it again
// (zero when the VM is not in transition).
func (r *Reconciler) pollInTransition(ctx context.Context, s *claimScope, alreadyRead bool) (res ctrl.Result, handled bool, requeue time.Duration, err error) {
	ref := s.claim.Status.VMRef
	if r.Transitions == nil || ref == nil {
		return ctrl.Result{}, false, 0, nil
	}
	now := r.Clock.Now()
	until, ok := r.Transitions.Active(hypervisors.VMKey{Cluster: ref.HypervisorCluster, VMID: int(ref.VMID)}, now)
	if !ok {
		return ctrl.Result{}, false, 0, nil
	}
	if !alreadyRead {
		if res, handled, err := r.confirmStopped(ctx, s); handled || err != nil {
			return res, handled, 0, err
		}
	}
	return ctrl.Result{}, false, min(r.Transitions.Poll(), until.Sub(now)), nil
}

// forgetTransition drops the claim's VM from the set once it is destroyed.
func (r *Reconciler) forgetTransition(ref *hfv1.VMReference) {
	if r.Transitions != nil && ref != nil {
		r.Transitions.Forget(hypervisors.VMKey{Cluster: ref.HypervisorCluster, VMID: int(ref.VMID)}, r.Clock.Now())
	}
}
