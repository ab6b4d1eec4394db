// The status derives a MachineClaim's summary status from the facts
// its reconcile recorded: Ready from the other conditions, then the display
// phase and when each phase began (docs/architecture.md, "The claim's
// reconcile: a scope, phases, a status derived last"). Nothing here reads
// the API server or the hypervisor.

package machineclaim

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim/stuck"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
)

// SummariseReady sets Ready from the other conditions: an ending claim is
// not Ready, for the reason its Ending condition gives; a running one is
// Ready once its workload reports it; before that Ready repeats why the
// claim is not provisioned yet.
func SummariseReady(claim *hfv1.MachineClaim) {
	conds := claim.Status.Conditions
	ready := func(status metav1.ConditionStatus, reason hfv1.ConditionReason, msg string) {
		conditions.Set(&claim.Status.Conditions, claim.Generation, hfv1.ReadyCondition, status, reason, msg)
	}
	repeat := func(c *metav1.Condition) { ready(metav1.ConditionFalse, hfv1.ConditionReason(c.Reason), c.Message) }
	provisioned := hfv1.FindCondition(conds, hfv1.MachineClaimProvisionedCondition)
	switch ending := hfv1.FindCondition(conds, hfv1.MachineClaimEndingCondition); {
	case ending != nil && ending.Status == metav1.ConditionTrue:
		repeat(ending)
	case provisioned != nil && provisioned.Status == metav1.ConditionTrue:
		attested := hfv1.FindCondition(conds, hfv1.MachineClaimAttestedCondition)
		bootstrapped := hfv1.FindCondition(conds, hfv1.MachineClaimBootstrappedCondition)
		switch {
		case bootstrapped != nil && bootstrapped.Status == metav1.ConditionTrue:
			ready(metav1.ConditionTrue, hfv1.ReadyReason, "The VM is up and the workload reports it ready")
		case attested != nil && attested.Status != metav1.ConditionTrue:
			repeat(attested)
		case bootstrapped != nil:
			// The credential's way to the VM (the secrets store) says why.
			repeat(bootstrapped)
		default:
			ready(metav1.ConditionFalse, hfv1.WaitingForRunnerReason, "The VM is up; waiting for the workload to report it ready")
		}
	case provisioned != nil:
		repeat(provisioned)
	default:
		ready(metav1.ConditionFalse, hfv1.ReconcilingReason, "Waiting to be provisioned")
	}
}

// PhaseOf derives the claim's display phase from its facts.
func PhaseOf(claim *hfv1.MachineClaim) hfv1.MachineClaimPhase {
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

// RecordPhase writes the derived phase for display. When it changed, it
// stamps the phase time, measures the phase left, and records an event
// with Ready's reason and message (which say why).
func RecordPhase(ctx context.Context, rec record.EventRecorder, claim *hfv1.MachineClaim, phase hfv1.MachineClaimPhase, now metav1.Time) {
	old := claim.Status.Phase
	if old == phase {
		return
	}
	if claim.Status.PhaseTimes == nil {
		claim.Status.PhaseTimes = &hfv1.PhaseTimes{}
	}
	if p := stuck.PhaseTime(claim.Status.PhaseTimes, old); p != nil && *p != nil {
		metrics.ClaimPhaseSeconds.WithLabelValues(string(old)).Observe(now.Sub((*p).Time).Seconds())
	}
	if p := stuck.PhaseTime(claim.Status.PhaseTimes, phase); p != nil {
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
	rec.Eventf(claim, eventType, string(phase), "%s: %s", reason, conditions.Truncate(msg, 1000))
	ctrl.LoggerFrom(ctx).Info("MachineClaim phase changed", "from", old, "to", phase, "reason", reason)
}

// SetEnding records where an ending claim is (Ending True), which Ready
// repeats when the scope closes.
func SetEnding(claim *hfv1.MachineClaim, reason hfv1.ConditionReason, msg string) {
	conditions.Set(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimEndingCondition, metav1.ConditionTrue, reason, msg)
}

// EndingReason is the Ending condition's current reason ("" without one).
func EndingReason(claim *hfv1.MachineClaim) string {
	if c := hfv1.FindCondition(claim.Status.Conditions, hfv1.MachineClaimEndingCondition); c != nil {
		return c.Reason
	}
	return ""
}

// Outcome is a claim's runner outcome, from how it ended
// (hyperfleet_runner_outcomes_total, and what the pool's replacement
// backoff counts as a failure).
func Outcome(claim *hfv1.MachineClaim) scaling.Reason {
	reason := claim.EndReason()
	switch reason {
	case scaling.JobCompleted, scaling.IdleTimeout, scaling.MaxLifetime, scaling.JobTimeout,
		scaling.BootstrapTimeout, scaling.DriftReplaced, scaling.ScaledDown, scaling.Orphaned:
		return reason
	}
	switch {
	case claim.HasFailed():
		return scaling.Failed
	case claim.Status.Bootstrap != nil && claim.Status.Bootstrap.JobID != 0:
		// Powered off or deleted after its job: the job is what it did.
		return scaling.JobCompleted
	case reason == scaling.PoweredOff:
		return scaling.PoweredOff
	}
	return scaling.Deleted
}
