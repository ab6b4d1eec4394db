package controller

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/patch"
)

// What the scopes of the HypervisorCluster, HypervisorMachineTemplate,
// IPPool and RunnerPool reconcilers share (docs/architecture.md, "One
// skeleton for every reconciler"): a reconcile opens a scope, runs its
// phases (internal/phase) and closes the scope, which derives Ready from
// what the phases recorded and writes the object once.

// waitForDependency is how long a template waits for a missing cluster,
// pool or Secret before looking again (watches usually wake it sooner).
const waitForDependency = time.Minute

// transientRecheck is how long a template whose check failed on the way to
// a Ready cluster waits before checking again.
const transientRecheck = 5 * time.Second

// readiness is what a pass found an object's Ready condition to be. Phases
// record it on their scope; the scope's close sets the condition, so that
// each kind sets Ready in one place.
type readiness struct {
	status  metav1.ConditionStatus
	reason  hfv1.ConditionReason
	message string
}

// isReady is a Ready condition that is True.
func isReady(msg string) *readiness {
	return &readiness{status: metav1.ConditionTrue, reason: hfv1.ReadyReason, message: msg}
}

// notReady is a Ready condition that is False for reason.
func notReady(reason hfv1.ConditionReason, msg string) *readiness {
	return &readiness{status: metav1.ConditionFalse, reason: reason, message: msg}
}

// setOn sets r as the Ready condition of generation gen in conds; a nil r
// (the pass found nothing to say) leaves Ready as it was.
func (r *readiness) setOn(conds *[]metav1.Condition, gen int64) {
	if r != nil {
		conditions.Set(conds, gen, hfv1.ReadyCondition, r.status, r.reason, r.message)
	}
}

// released reports whether obj is being deleted and no longer carries
// finalizer: the pass let it go, and its close writes nothing more.
func released(obj client.Object, finalizer string) bool {
	return !obj.GetDeletionTimestamp().IsZero() && !controllerutil.ContainsFinalizer(obj, finalizer)
}

// writeScope ends every scope's close: observedGeneration moves to the
// object's generation only when the pass succeeded (passErr is nil), then
// one patch writes the pass's metadata and status changes. The caller
// returns a failed patch as an error of the pass, never only logs it: the
// object is then reconciled again with the controller's backoff instead of
// waiting for its next event with a status that says what it no longer is.
func writeScope(ctx context.Context, h *patch.Helper, obj client.Object, observedGeneration *int64, passErr error) error {
	if passErr == nil {
		*observedGeneration = obj.GetGeneration()
	}
	return h.Patch(ctx, obj)
}
