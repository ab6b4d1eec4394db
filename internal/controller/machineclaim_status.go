package controller

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
)

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

// enterPhase moves a claim to phase: it stamps the phase time, measures the
// phase it leaves, and records an event. The phase is a display summary of
// the conditions; nothing outside this controller branches on it.
func (r *MachineClaimReconciler) enterPhase(ctx context.Context, claim *hfv1.MachineClaim, phase hfv1.MachineClaimPhase, reason, msg string) {
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
	r.Recorder.Eventf(claim, eventType, string(phase), "%s: %s", reason, truncate(msg, 1000))
	ctrl.LoggerFrom(ctx).Info("MachineClaim phase changed", "from", old, "to", phase, "reason", reason)
	r.syncReady(claim)
}

// syncReady derives the Ready condition from the phase and the condition
// that explains it.
func (r *MachineClaimReconciler) syncReady(claim *hfv1.MachineClaim) {
	conds := &claim.Status.Conditions
	gen := claim.Generation
	switch claim.Status.Phase {
	case hfv1.MachineClaimReady:
		setCondition(conds, gen, hfv1.ReadyCondition, metav1.ConditionTrue, hfv1.ReadyReason, "The VM is up and the workload reports it ready")
	case hfv1.MachineClaimBootstrapping:
		setCondition(conds, gen, hfv1.ReadyCondition, metav1.ConditionFalse, hfv1.WaitingForRunnerReason, "The VM is up; waiting for the workload to report it ready")
	case hfv1.MachineClaimTerminating:
		if c := meta.FindStatusCondition(*conds, hfv1.ReadyCondition); c == nil || c.Status == metav1.ConditionTrue || c.Reason == hfv1.WaitingForRunnerReason {
			setCondition(conds, gen, hfv1.ReadyCondition, metav1.ConditionFalse, deletingVMReason, orDefault(claim.Status.TerminationReason, "The claim is terminating"))
		}
	default:
		if c := meta.FindStatusCondition(*conds, hfv1.MachineClaimProvisionedCondition); c != nil {
			setCondition(conds, gen, hfv1.ReadyCondition, metav1.ConditionFalse, c.Reason, c.Message)
		} else {
			setCondition(conds, gen, hfv1.ReadyCondition, metav1.ConditionFalse, hfv1.ReconcilingReason, "Waiting to be provisioned")
		}
	}
	claim.Status.ObservedGeneration = gen
}
