package machineclaim

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
)

// A claim's routine life (its phases, its VM up, its runner online, its
// teardown after the job it ran) is told by its status, the manager's log
// and the metrics, not by events: every event is a POST to the API server,
// and ten of them per job were about a third of the operator's writes
// (docs/performance.md, "Calls per job"). Events stay for what a person
// acts on: every warning, a failed claim, an admin's action, the teardown
// of a claim that did not end with its job. The trail of which VM got a
// credential or an identity proof and which job ran where is the
// manager's log (reasons CredentialDelivered, JoinTokenDelivered,
// EnrollmentProofDelivered, JobStarted: an audit outlives an event's hour)
// and the job's CIJob (status.runnerName).

// routineEnd reports whether claim ends as most claims do, with nobody to
// act on its teardown: not failed, and ended by its job, by its pool's
// own decisions (idle, scaled down, replaced for drift, maxLifetime, which
// says so in its own event) or by its VM powering off by itself (a job
// shorter than its webhook's delivery, whose job recordLateJob may still
// find; a runner that quit). Those ends show in the outcome metric and
// the log. A person's deletion, a timeout a person tunes (bootstrap, job),
// an orphan, a VM that vanished and a failure keep their teardown's
// events.
func routineEnd(claim *hfv1.MachineClaim) bool {
	if claim.HasFailed() || claim.Disowned() || vanished(claim) {
		return false
	}
	switch Outcome(claim) {
	case scaling.JobCompleted, scaling.IdleTimeout, scaling.ScaledDown, scaling.DriftReplaced, scaling.MaxLifetime, scaling.PoweredOff:
		return true
	}
	return false
}

// vanished reports whether the claim ended because its VM went without
// powering off (deleted outside HyperFleet, or its reference lost): a
// person looks for who did it. The end's code leads TerminationReason
// (beginEnd).
func vanished(claim *hfv1.MachineClaim) bool {
	return strings.HasPrefix(claim.Status.TerminationReason, string(hfv1.VMGoneReason)+":")
}

// teardownEvent records a Normal event of claim's teardown, or only logs
// it when the claim ends routinely (routineEnd).
func (s *claimScope) teardownEvent(ctx context.Context, reason hfv1.ConditionReason, format string, args ...any) {
	claim := s.claim
	if routineEnd(claim) {
		logRoutine(ctx, reason, format, args...)
		return
	}
	s.recorder.Eventf(claim, corev1.EventTypeNormal, string(reason), format, args...)
}

// logRoutine is the log line of a routine step that once was an event.
func logRoutine(ctx context.Context, reason hfv1.ConditionReason, format string, args ...any) {
	ctrl.LoggerFrom(ctx).Info(fmt.Sprintf(format, args...), "reason", reason)
}
