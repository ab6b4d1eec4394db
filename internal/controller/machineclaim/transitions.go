package machineclaim

import (
	"context"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/poweroff"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// A claim whose VM a power-off hint marked in transition (internal/poweroff)
// reads that VM directly until the mark expires or the VM is destroyed.

// PowerOff is what is known of claims' VMs powering off.
type PowerOff struct {
	// Transitions are the VMs a hint says are about to stop: a running
	// claim whose VM is in it reads the VM's status directly, every
	// Transitions.Poll(), until it stops or the hint expires
	// (docs/architecture.md, "Power-off hints"). Nil: the listing only.
	Transitions *hypervisors.Transitions
	// Notices gives VMs the URL and token of their power-off notice; nil
	// gives none.
	Notices *poweroff.Notices
	// GuestRefusals are the VMs' power-off notices that their agent
	// refused to run the job (guest_refusal.go); nil: none are taken.
	GuestRefusals GuestRefusals
}

// pollInTransition reads the claim's VM directly while a hint has it in
// transition; the result stops the pass when the read found the claim's
// end (or must be retried). requeue is when to read it again (zero when
// the VM is not in transition).
func (r *Reconciler) pollInTransition(ctx context.Context, s *claimScope, alreadyRead bool) (res phase.Result, requeue time.Duration, err error) {
	ref := s.claim.Status.VMRef
	hints := r.PowerOff.Transitions
	if hints == nil || ref == nil {
		return phase.Next(), 0, nil
	}
	now := r.Clock.Now()
	until, ok := hints.Active(hypervisors.VMKey{Cluster: ref.HypervisorCluster, VM: provider.ID(ref.ID())}, now)
	if !ok {
		return phase.Next(), 0, nil
	}
	if !alreadyRead {
		ctrl.LoggerFrom(ctx).V(1).Info("The VM is in transition (a power-off hint); reading it directly", "vm", ref.ID(), "until", until)
		if res, err := r.confirmStopped(ctx, s); res.Stopped() || err != nil {
			return res, 0, err
		}
	}
	return phase.Next(), min(hints.Poll(), until.Sub(now)), nil
}

// forgetTransition drops the claim's VM from the set once it is destroyed.
func (p *PowerOff) forgetTransition(ref *hfv1.VMReference, now time.Time) {
	if p.Transitions != nil && ref != nil {
		p.Transitions.Forget(hypervisors.VMKey{Cluster: ref.HypervisorCluster, VM: provider.ID(ref.ID())}, now)
	}
}
