// The status derives a MachineClaim's status from the facts its
// reconcile recorded: its conditions (this file is the only place in the
// package that sets them; phases and services record claimFacts), Ready
// from the other conditions, then the display phase and when each phase
// began (docs/architecture.md, "The claim's reconcile: a scope, phases, a
// status derived last"). Nothing here reads the API server or the
// hypervisor.

package machineclaim

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim/stuck"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
)

// conditionFact is what a phase found out this pass about one of the
// claim's conditions: the status, reason and message setConditions
// writes when the scope closes.
type conditionFact struct {
	status  metav1.ConditionStatus
	reason  hfv1.ConditionReason
	message string
}

// claimFacts are the facts one reconcile recorded, by condition, in the
// order first recorded (the order new conditions are listed in). Phases
// and services record them; only setConditions turns them into the
// claim's conditions, when the scope closes.
type claimFacts struct {
	order  []hfv1.ConditionType
	byType map[hfv1.ConditionType]conditionFact
	// withdrawn are conditions that no longer apply (withdraw): the
	// scope's close removes them.
	withdrawn []hfv1.ConditionType
	// task is the hypervisor task the claim waits on ("" without one),
	// which the status does not record (vm_progress.go) but the Stuck
	// condition names.
	task string
}

// withdraw notes that a condition no longer applies to the claim (what it
// reported is no longer checked): the scope's close removes it. A fact
// recorded for it this pass is dropped.
func (f *claimFacts) withdraw(typ hfv1.ConditionType) {
	if _, ok := f.byType[typ]; ok {
		delete(f.byType, typ)
		f.order = slices.DeleteFunc(f.order, func(t hfv1.ConditionType) bool { return t == typ })
	}
	if !slices.Contains(f.withdrawn, typ) {
		f.withdrawn = append(f.withdrawn, typ)
	}
}

// record notes where one condition stands; a later fact about the same
// condition in the same pass replaces it.
func (f *claimFacts) record(typ hfv1.ConditionType, status metav1.ConditionStatus, reason hfv1.ConditionReason, msg string) {
	if f.byType == nil {
		f.byType = map[hfv1.ConditionType]conditionFact{}
	}
	if _, ok := f.byType[typ]; !ok {
		f.order = append(f.order, typ)
	}
	f.byType[typ] = conditionFact{status: status, reason: reason, message: conditions.Truncate(msg, conditions.MaxMessage)}
}

// ending records where an ending claim is (Ending True), which Ready
// repeats when the scope closes.
func (f *claimFacts) ending(reason hfv1.ConditionReason, msg string) {
	f.record(hfv1.MachineClaimEndingCondition, metav1.ConditionTrue, reason, msg)
}

// condition is a condition as this pass sees it: the fact recorded this
// pass, else the claim's stored condition (nil without either).
func (f *claimFacts) condition(claim *hfv1.MachineClaim, typ hfv1.ConditionType) *metav1.Condition {
	if fact, ok := f.byType[typ]; ok {
		return &metav1.Condition{Type: string(typ), Status: fact.status, Reason: string(fact.reason), Message: fact.message, ObservedGeneration: claim.Generation}
	}
	return hfv1.FindCondition(claim.Status.Conditions, typ)
}

// isTrue reports whether a condition is True as this pass sees it.
func (f *claimFacts) isTrue(claim *hfv1.MachineClaim, typ hfv1.ConditionType) bool {
	c := f.condition(claim, typ)
	return c != nil && c.Status == metav1.ConditionTrue
}

// isFalse reports whether a condition is False as this pass sees it.
func (f *claimFacts) isFalse(claim *hfv1.MachineClaim, typ hfv1.ConditionType) bool {
	c := f.condition(claim, typ)
	return c != nil && c.Status == metav1.ConditionFalse
}

// endingReason is the Ending condition's reason as this pass sees it
// ("" without one).
func (f *claimFacts) endingReason(claim *hfv1.MachineClaim) string {
	if c := f.condition(claim, hfv1.MachineClaimEndingCondition); c != nil {
		return c.Reason
	}
	return ""
}

// derivedStatus is what deriveStatus derived for closeScope to report
// rather than write: the display phase, whether it changed this pass and
// from which, and the stuck detector's verdict on the phase with, when
// the claim became stuck this pass, the Stuck condition's message (the
// warning event's).
type derivedStatus struct {
	phase, left hfv1.MachineClaimPhase
	changed     bool
	stuck       stuck.Verdict
	nowStuck    string
}

// deriveStatus is the one place a claim's conditions are set: every fact
// the pass recorded (setConditions), then Ready from the conditions
// (SummariseReady), then the display phase (PhaseOf) with when it began
// (enterPhase), then Stuck from how long the claim has been in that phase
// at now (setStuck, bounds). closeScope calls it once per pass.
func deriveStatus(claim *hfv1.MachineClaim, facts *claimFacts, now time.Time, bounds stuck.Bounds) derivedStatus {
	setConditions(claim, facts)
	SummariseReady(claim)
	d := derivedStatus{phase: PhaseOf(claim)}
	d.left, d.changed = enterPhase(claim, d.phase, metav1.NewTime(now))
	if d.phase != hfv1.MachineClaimFinished {
		// A finished claim is history: its Stuck condition stays as it
		// was when the claim finished.
		d.stuck = stuck.Check(claim, d.phase, bounds, now)
		d.nowStuck = setStuck(claim, d.phase, d.stuck, bounds.Bound(d.phase), facts.task)
	}
	return d
}

// enterPhase writes the derived phase for display and, when it changed,
// stamps when it began (status.phaseTimes). It returns the phase left,
// and whether the phase changed.
func enterPhase(claim *hfv1.MachineClaim, phase hfv1.MachineClaimPhase, now metav1.Time) (hfv1.MachineClaimPhase, bool) {
	old := claim.Status.Phase
	if old == phase {
		return old, false
	}
	if claim.Status.PhaseTimes == nil {
		claim.Status.PhaseTimes = &hfv1.PhaseTimes{}
	}
	if p := stuck.PhaseTime(claim.Status.PhaseTimes, phase); p != nil {
		*p = &now
	}
	if old == "" && phase != hfv1.MachineClaimPending && claim.Status.PhaseTimes.Pending == nil {
		// Every claim is Pending from its creation. One whose first pass
		// already records its clone (its template validated before the
		// claim was first seen) was Pending until now: without this its
		// phase times would start at Provisioning, or not, by a race.
		pending := claim.CreationTimestamp
		if pending.IsZero() || pending.After(now.Time) {
			pending = now
		}
		claim.Status.PhaseTimes.Pending = &pending
	}
	claim.Status.Phase = phase
	return old, true
}

// setStuck sets the Stuck condition from the stuck detector's verdict on
// the claim's phase (bound is the phase's): True with NoProgress once the
// claim overstayed the bound, naming the phase, since when, the bound and
// what the claim waits on; False with Progressing once a stuck claim
// moved on. A Stuck condition from an earlier stay is replaced, so that
// its transition time is this stay's. It returns the message when the
// claim became stuck this pass (one warning event per stay), "" else.
func setStuck(claim *hfv1.MachineClaim, phase hfv1.MachineClaimPhase, v stuck.Verdict, bound time.Duration, task string) string {
	conds := &claim.Status.Conditions
	old := hfv1.FindCondition(*conds, hfv1.MachineClaimStuckCondition)
	switch {
	case v.Stuck && old != nil && old.Status == metav1.ConditionTrue && !old.LastTransitionTime.Time.Before(v.Since):
		// Already reported for this stay in the phase.
	case v.Stuck:
		meta.RemoveStatusCondition(conds, string(hfv1.MachineClaimStuckCondition))
		msg := fmt.Sprintf("In phase %s since %s, longer than the manager's bound for it (%s); waiting on %s",
			phase, v.Since.UTC().Format(time.RFC3339), bound, stuck.WaitingOn(claim, phase, task))
		conditions.Set(conds, claim.Generation, hfv1.MachineClaimStuckCondition, metav1.ConditionTrue, hfv1.NoProgressReason, msg)
		return msg
	case old != nil && old.Status == metav1.ConditionTrue:
		conditions.Set(conds, claim.Generation, hfv1.MachineClaimStuckCondition, metav1.ConditionFalse, hfv1.ProgressingReason,
			fmt.Sprintf("Now in phase %s", phase))
	}
	return ""
}

// setConditions writes the facts the pass recorded into the claim's
// conditions, in the order first recorded. A condition's transition time
// moves only when its status differs from the stored one.
func setConditions(claim *hfv1.MachineClaim, facts *claimFacts) {
	for _, typ := range facts.withdrawn {
		meta.RemoveStatusCondition(&claim.Status.Conditions, string(typ))
	}
	for _, typ := range facts.order {
		fact := facts.byType[typ]
		conditions.Set(&claim.Status.Conditions, claim.Generation, typ, fact.status, fact.reason, fact.message)
	}
}

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
	case claim.Spec.Standby && hfv1.IsConditionTrue(conds, hfv1.MachineClaimProvisionedCondition):
		// Up, being suspended, or suspended: in its pool's standby tier.
		return hfv1.MachineClaimStandby
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

// RecordPhase reports a phase change deriveStatus made (left is the
// phase the claim left, "" for a new claim): it measures the phase left,
// counts the transition and logs it with Ready's reason and message (which
// say why). Only a claim that failed gets an event (a warning): the other
// phases are a claim's routine life, which its status shows (events.go).
func RecordPhase(ctx context.Context, rec record.EventRecorder, claim *hfv1.MachineClaim, left hfv1.MachineClaimPhase, now metav1.Time) {
	phase := claim.Status.Phase
	if p := stuck.PhaseTime(claim.Status.PhaseTimes, left); p != nil && *p != nil {
		metrics.ClaimPhaseSeconds.WithLabelValues(string(left)).Observe(now.Sub((*p).Time).Seconds())
	}
	metrics.ClaimTransitions.WithLabelValues(string(phase)).Inc()
	reason, msg := hfv1.CreatedReason, "Waiting to be provisioned"
	if c := hfv1.FindCondition(claim.Status.Conditions, hfv1.ReadyCondition); c != nil {
		reason, msg = hfv1.ConditionReason(c.Reason), c.Message
	}
	if phase == hfv1.MachineClaimFailed {
		rec.Eventf(claim, corev1.EventTypeWarning, string(phase), "%s: %s", reason, conditions.Truncate(msg, 1000))
	}
	kv := []any{"from", left, "to", phase, "reason", reason, "message", conditions.Truncate(msg, 1000)}
	if end := claim.Status.End; end != nil && left != hfv1.MachineClaimTerminating && left != hfv1.MachineClaimFailed {
		// Why the claim ends: Ready's reason says where its teardown is.
		kv = append(kv, "endReason", end.Reason, "endMessage", end.Message)
	}
	ctrl.LoggerFrom(ctx).Info("MachineClaim phase changed", kv...)
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
	case claim.Status.Bootstrap.Job() != "":
		// Powered off or deleted after its job: the job is what it did.
		return scaling.JobCompleted
	case reason == scaling.PoweredOff:
		return scaling.PoweredOff
	}
	return scaling.Deleted
}
