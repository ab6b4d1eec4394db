package machineclaim

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
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
func (r *Reconciler) newClaimScope(claim *hfv1.MachineClaim) *claimScope {
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
func (r *Reconciler) closeScope(ctx context.Context, s *claimScope, res ctrl.Result, err error) (ctrl.Result, error) {
	claim := s.claim
	if controllerutil.ContainsFinalizer(claim, hfv1.MachineClaimFinalizer) || claim.IsFinished() || claim.DeletionTimestamp.IsZero() {
		SummariseReady(claim)
		phase := PhaseOf(claim)
		RecordPhase(ctx, r.Recorder, claim, phase, metav1.NewTime(r.Clock.Now()))
		res = r.stuckClaims.Mark(ctx, claim, phase, r.Clock.Now(), res)
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
