package machineclaim

import (
	"cmp"
	"context"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/patch"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// claimScope is one reconcile of one claim: the claim, what it depends on
// (loaded once, by the phase that needs it) and the patch helper that
// writes the pass's changes once, when the scope closes.
type claimScope struct {
	claim *hfv1.MachineClaim
	patch *patch.Helper
	// claimEnv is what the pass's concerns share (services take the
	// scope): the API client, the clock, the recorder, the claims'
	// memory and the backoff.
	claimEnv
	// tmpl, cluster and provider are set by loadDependencies and
	// loadProvider; provider stays nil while the cluster is not
	// connected.
	tmpl     *hfv1.HypervisorMachineTemplate
	cluster  *hfv1.HypervisorCluster
	provider provider.Provider
	// facts are what the pass found out about the claim's conditions;
	// closeScope derives the conditions from them (status.go).
	facts claimFacts
	// startRV is the claim's resourceVersion as read.
	startRV string
	// dnsTried is set once the pass tried to remove the claim's DNS
	// records: one attempt per pass (dns.go).
	dnsTried bool
	// deleted is set once the pass deleted the claim without its
	// finalizer (finish): it is gone, and nothing is written.
	deleted bool
	// persistedEnd is whether the claim as read had its end stored; an
	// end this process holds (end_held.go) is not. storedConditions are
	// its conditions as read.
	persistedEnd     bool
	storedConditions []metav1.Condition
}

// newClaimScope opens the scope of one reconcile. The metadata patch
// carries an optimistic lock: a claim read from a stale cache must not
// overwrite a newer VM reservation or finalizer list.
//
// A claim written before provider IDs names its VM by vmID alone (stored
// as vmId by earlier versions; then always a Proxmox VM): the scope
// records its providerID, which the
// status write that closes the pass stores, so that every claim carries
// one after its next reconcile.
func (r *Reconciler) newClaimScope(claim *hfv1.MachineClaim) *claimScope {
	s := &claimScope{
		claim:    claim,
		patch:    patch.NewHelper(r.Client, claim, patch.WithOptimisticLock()),
		claimEnv: r.env(),
		startRV:  claim.ResourceVersion,

		persistedEnd:     claim.Status.End != nil,
		storedConditions: slices.Clone(claim.Status.Conditions),
	}
	if ref := claim.Status.VMRef; ref.Legacy() {
		claim.Status.VMRef = hfv1.NewVMReference(ref.HypervisorCluster, ref.ID(), ref.Node)
	}
	return s
}

// closeScope computes the claim's status from the facts the pass
// recorded (deriveStatus: the conditions, Ready, the phase, then Stuck),
// reports a phase change and a stuck claim (the stuck detector: its
// event, the gauge, a wake-up when the claim would become stuck), and
// writes metadata and status: metadata first,
// since the finalizer must be stored before a status that names a VM.
// observedGeneration moves only after a pass that succeeded.
func (r *Reconciler) closeScope(ctx context.Context, s *claimScope, res ctrl.Result, err error) (ctrl.Result, error) {
	claim := s.claim
	held := false
	if controllerutil.ContainsFinalizer(claim, hfv1.MachineClaimFinalizer) || claim.IsFinished() || claim.DeletionTimestamp.IsZero() {
		now := r.Clock.Now()
		s.facts.task = r.memory.taskInFlight(claim)
		d := deriveStatus(claim, &s.facts, now, r.Stuck.Bounds)
		if d.changed {
			RecordPhase(ctx, r.Recorder, claim, d.left, metav1.NewTime(now))
		}
		res = r.Stuck.Report(ctx, claim, d.phase, d.stuck, d.nowStuck, res)
		held = s.holdsEnd(d)
		if err == nil {
			claim.Status.ObservedGeneration = claim.Generation
		}
	} else {
		// Released: the pass's last facts are written with it; nothing
		// is derived for a claim about to go.
		setConditions(claim, &s.facts)
	}
	if s.deleted {
		// Nothing is written to a claim that is gone, and the copies the
		// cache still holds are not reconciled (deletedGone).
		r.memory.markDeletedGone(claim.UID)
		return res, err
	}
	write := s.patch.Patch
	if held {
		// A routine end: its metadata only (end_held.go).
		// Kept for the claim's next passes.
		r.memory.holdEnd(claim.UID, claim.Status.DeepCopy())
		write = s.patch.PatchMetadata
	} else {
		r.memory.dropHeldEnd(claim.UID)
	}
	if perr := write(ctx, claim); perr != nil {
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

// claimEnv is the part of the reconciler every concern of a pass uses,
// which the scope carries to them.
type claimEnv struct {
	client   client.Client
	clock    clock.PassiveClock
	recorder record.EventRecorder
	memory   *claimMemory
	retry    RetryDelays
	// ci is the claims' CI platforms (nil: none).
	ci CIPlatforms
	// registry holds the clusters' providers and listings.
	registry *hypervisors.Registry
	// install is this operator's id, the owner install of what it
	// registers (DNS records).
	install string
}

// env is the reconciler's claimEnv.
func (r *Reconciler) env() claimEnv {
	env := claimEnv{client: r.Client, clock: r.Clock, recorder: r.Recorder, memory: &r.memory, retry: r.Retry, ci: r.CI, registry: r.Registry}
	if r.Signer != nil {
		env.install = r.Signer.OperatorID()
	}
	return env
}

// RetryDelays are the claims' backoff after transient failures: First,
// doubled on each failure in a row up to Max. Zero First means 2 seconds
// (tests shorten it, so that a property can watch the doubling itself in
// milliseconds); zero Max means 5 minutes.
type RetryDelays struct {
	First, Max time.Duration
}

// defaultMaxRetryDelay caps a claim's transient-failure backoff unless
// RetryDelays.Max says otherwise.
const defaultMaxRetryDelay = 5 * time.Minute

// backoff counts one more transient failure of the claim and returns the
// wait before its next attempt: 2s, 4s, 8s ... (from First when set)
// capped at Max (5 minutes by default).
func (s *claimScope) backoff() time.Duration {
	return s.retry.next(s.memory.failed(s.claim.UID))
}

// next is the wait after the failure that follows n others.
func (d RetryDelays) next(n int) time.Duration {
	limit := cmp.Or(d.Max, defaultMaxRetryDelay)
	if limit < 0 {
		limit = defaultMaxRetryDelay
	}
	w := d.First
	if w <= 0 {
		w = 2 * time.Second
	}
	for i := 0; i < n && w < limit; i++ {
		w *= 2
	}
	return min(w, limit)
}

// workloads are the CI platforms' back-ends; none without CI.
func (e claimEnv) workloads() *workload.Backends {
	if e.ci == nil {
		return nil
	}
	return e.ci.Workloads()
}
