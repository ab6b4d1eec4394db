package controller

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/patch"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// claimScope is one reconcile of one claim: the claim, what it depends on
// (loaded once, by the phase that needs it) and the patch helper that
// writes the pass's changes once, when the scope closes.
type claimScope struct {
	claim *hfv1.MachineClaim
	patch *patch.Helper
	// tmpl, cluster and provider are set by loadDependencies and
	// connectProvider; provider stays nil while the cluster is not
	// connected.
	tmpl     *hfv1.HypervisorMachineTemplate
	cluster  *hfv1.HypervisorCluster
	provider provider.Provider
	// startRV is the claim's resourceVersion as read.
	startRV string
	// recheckIn is the latest a phase that let the pass go on wants to
	// look again (zero: no wish); closeScope shortens the pass's requeue
	// to it.
	recheckIn time.Duration
}

// recheck asks for the claim to be reconciled again within d.
func (s *claimScope) recheck(d time.Duration) {
	if d > 0 && (s.recheckIn == 0 || d < s.recheckIn) {
		s.recheckIn = d
	}
}

// newClaimScope opens the scope of one reconcile. The metadata patch
// carries an optimistic lock: a claim read from a stale cache must not
// overwrite a newer VM reservation or finalizer list.
func (r *MachineClaimReconciler) newClaimScope(claim *hfv1.MachineClaim) *claimScope {
	return &claimScope{
		claim:   claim,
		patch:   patch.NewHelper(r.Client, claim, patch.WithOptimisticLock()),
		startRV: claim.ResourceVersion,
	}
}

// claimPhase is one step of a reconcile. next is true when the following
// step may run in the same pass; otherwise the pass ends with res.
type claimPhase func(ctx context.Context, s *claimScope) (res ctrl.Result, next bool, err error)

// runPhases runs phases in order until one ends the pass.
func runPhases(ctx context.Context, s *claimScope, phases ...claimPhase) (ctrl.Result, error) {
	for _, phase := range phases {
		res, next, err := phase(ctx, s)
		if err != nil || !next {
			return res, err
		}
	}
	return ctrl.Result{}, nil
}

// closeScope computes the claim's status from the facts the pass
// recorded (Ready from the conditions, then the phase), reports a stuck
// claim, and writes metadata and status: metadata first, since the
// finalizer must be stored before a status that names a VM.
// observedGeneration moves only after a pass that succeeded.
func (r *MachineClaimReconciler) closeScope(ctx context.Context, s *claimScope, res ctrl.Result, err error) (ctrl.Result, error) {
	claim := s.claim
	if controllerutil.ContainsFinalizer(claim, hfv1.MachineClaimFinalizer) || claim.IsFinished() || claim.DeletionTimestamp.IsZero() {
		summariseReady(claim)
		phase := claimPhaseOf(claim)
		r.recordPhase(ctx, claim, phase)
		res = r.markStuck(ctx, claim, phase, res)
		if err == nil {
			claim.Status.ObservedGeneration = claim.Generation
			if d := s.recheckIn; d > 0 && (res.RequeueAfter == 0 || res.RequeueAfter > d) {
				res.RequeueAfter = d
			}
		}
	}
	if perr := s.patch.Patch(ctx, claim); perr != nil {
		ctrl.LoggerFrom(ctx).Error(perr, "Write MachineClaim")
		if err == nil {
			err = perr
		}
	}
	switch {
	case !controllerutil.ContainsFinalizer(claim, hfv1.MachineClaimFinalizer):
		// Gone, or Finished: nothing more is done to it.
		r.lag.Done(claim.UID)
	case claim.ResourceVersion != s.startRV:
		r.lag.Wrote(claim)
	}
	return res, err
}

// summariseReady sets Ready from the other conditions: an ending claim is
// not Ready, for the reason its Ending condition gives; a running one is
// Ready once its workload reports it; before that Ready repeats why the
// claim is not provisioned yet.
func summariseReady(claim *hfv1.MachineClaim) {
	conds := &claim.Status.Conditions
	gen := claim.Generation
	provisioned := hfv1.FindCondition(*conds, hfv1.MachineClaimProvisionedCondition)
	switch ending := hfv1.FindCondition(*conds, hfv1.MachineClaimEndingCondition); {
	case ending != nil && ending.Status == metav1.ConditionTrue:
		setCondition(conds, gen, hfv1.ReadyCondition, metav1.ConditionFalse, hfv1.ConditionReason(ending.Reason), ending.Message)
	case provisioned != nil && provisioned.Status == metav1.ConditionTrue:
		attested := hfv1.FindCondition(*conds, hfv1.MachineClaimAttestedCondition)
		bootstrapped := hfv1.FindCondition(*conds, hfv1.MachineClaimBootstrappedCondition)
		switch {
		case bootstrapped != nil && bootstrapped.Status == metav1.ConditionTrue:
			setCondition(conds, gen, hfv1.ReadyCondition, metav1.ConditionTrue, hfv1.ReadyReason, "The VM is up and the workload reports it ready")
		case attested != nil && attested.Status != metav1.ConditionTrue:
			setCondition(conds, gen, hfv1.ReadyCondition, metav1.ConditionFalse, hfv1.ConditionReason(attested.Reason), attested.Message)
		case bootstrapped != nil:
			// The credential's way to the VM (the secrets store) says why.
			setCondition(conds, gen, hfv1.ReadyCondition, metav1.ConditionFalse, hfv1.ConditionReason(bootstrapped.Reason), bootstrapped.Message)
		default:
			setCondition(conds, gen, hfv1.ReadyCondition, metav1.ConditionFalse, hfv1.WaitingForRunnerReason, "The VM is up; waiting for the workload to report it ready")
		}
	case provisioned != nil:
		setCondition(conds, gen, hfv1.ReadyCondition, metav1.ConditionFalse, hfv1.ConditionReason(provisioned.Reason), provisioned.Message)
	default:
		setCondition(conds, gen, hfv1.ReadyCondition, metav1.ConditionFalse, hfv1.ReconcilingReason, "Waiting to be provisioned")
	}
}

// claimPhaseOf derives the claim's display phase from its facts.
func claimPhaseOf(claim *hfv1.MachineClaim) hfv1.MachineClaimPhase {
	conds := claim.Status.Conditions
	switch end := claim.Status.End; {
	case claim.IsFinished():
		return hfv1.MachineClaimFinished
	case end != nil && end.Failed:
		return hfv1.MachineClaimFailed
	case end != nil:
		return hfv1.MachineClaimTerminating
	case hfv1.IsConditionTrue(conds, hfv1.MachineClaimEndingCondition):
		// Asked to end; its runner's job keeps the VM.
		return hfv1.MachineClaimDraining
	case hfv1.IsConditionTrue(conds, hfv1.MachineClaimProvisionedCondition) &&
		hfv1.IsConditionTrue(conds, hfv1.MachineClaimBootstrappedCondition):
		return hfv1.MachineClaimReady
	case hfv1.IsConditionTrue(conds, hfv1.MachineClaimProvisionedCondition):
		return hfv1.MachineClaimBootstrapping
	case claim.Status.VMRef != nil || claim.Status.Task != nil:
		return hfv1.MachineClaimProvisioning
	}
	return hfv1.MachineClaimPending
}

// recordPhase writes the derived phase for display. When it changed, it
// stamps the phase time, measures the phase left, and records an event
// with Ready's reason and message (which say why).
func (r *MachineClaimReconciler) recordPhase(ctx context.Context, claim *hfv1.MachineClaim, phase hfv1.MachineClaimPhase) {
	old := claim.Status.Phase
	if old == phase {
		return
	}
	now := metav1.NewTime(r.Clock.Now())
	if claim.Status.PhaseTimes == nil {
		claim.Status.PhaseTimes = &hfv1.PhaseTimes{}
	}
	if p := phaseTime(claim.Status.PhaseTimes, old); p != nil && *p != nil {
		metrics.ClaimPhaseSeconds.WithLabelValues(string(old)).Observe(now.Sub((*p).Time).Seconds())
	}
	if p := phaseTime(claim.Status.PhaseTimes, phase); p != nil {
		*p = &now
	}
	claim.Status.Phase = phase
	metrics.ClaimTransitions.WithLabelValues(string(phase)).Inc()
	eventType := corev1.EventTypeNormal
	if phase == hfv1.MachineClaimFailed {
		eventType = corev1.EventTypeWarning
	}
	reason, msg := hfv1.CreatedReason, "Waiting to be provisioned"
	if c := hfv1.FindCondition(claim.Status.Conditions, hfv1.ReadyCondition); c != nil {
		reason, msg = hfv1.ConditionReason(c.Reason), c.Message
	}
	r.Recorder.Eventf(claim, eventType, string(phase), "%s: %s", reason, truncate(msg, 1000))
	ctrl.LoggerFrom(ctx).Info("MachineClaim phase changed", "from", old, "to", phase, "reason", reason)
}

// phaseTime returns the pointer in t that records when phase began.
func phaseTime(t *hfv1.PhaseTimes, phase hfv1.MachineClaimPhase) **metav1.Time {
	switch phase {
	case hfv1.MachineClaimPending:
		return &t.Pending
	case hfv1.MachineClaimProvisioning:
		return &t.Provisioning
	case hfv1.MachineClaimBootstrapping:
		return &t.Bootstrapping
	case hfv1.MachineClaimReady:
		return &t.Ready
	case hfv1.MachineClaimDraining:
		return &t.Draining
	case hfv1.MachineClaimTerminating:
		return &t.Terminating
	case hfv1.MachineClaimFailed:
		return &t.Failed
	case hfv1.MachineClaimFinished:
		return &t.Finished
	}
	return nil
}

// setEnding records where an ending claim is (Ending True), which Ready
// repeats when the scope closes.
func setEnding(claim *hfv1.MachineClaim, reason hfv1.ConditionReason, msg string) {
	setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimEndingCondition, metav1.ConditionTrue, reason, truncate(msg, 32768))
}

// endingReason is the Ending condition's current reason ("" without one).
func endingReason(claim *hfv1.MachineClaim) string {
	if c := hfv1.FindCondition(claim.Status.Conditions, hfv1.MachineClaimEndingCondition); c != nil {
		return c.Reason
	}
	return ""
}
