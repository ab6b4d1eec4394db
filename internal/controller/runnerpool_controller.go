package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
	"github.com/hyperfleet/hyperfleet/internal/controller/refusal"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/patch"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/poolclaims"
	"github.com/hyperfleet/hyperfleet/internal/poolplacement"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
	"github.com/hyperfleet/hyperfleet/internal/schedule"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// JobCanceller cancels a job on its CI platform. Hard limits (jobTimeout,
// maxLifetime) cancel a busy runner's job before its VM is destroyed
// (docs/architecture.md, "Teardown never kills a busy runner").
type JobCanceller interface {
	CancelJob(ctx context.Context, pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate, job *hfv1.CIJob) error
}

const (
	// poolResync rechecks a pool without any event, behind the watches
	// and the resync's wake-ups.
	poolResync = 30 * time.Second
	// completedJobRetention is how long a completed CIJob is kept after
	// it finished, for `kubectl get cijobs` and late webhooks.
	completedJobRetention = 15 * time.Minute
)

// RunnerPoolReconciler keeps each pool's MachineClaims at the size its
// demand needs (package scaling), enforces its lifecycle limits, replaces
// VMs built from an older template, prunes retained failures and history,
// and reports all of it in the pool's status.
type RunnerPoolReconciler struct {
	Client   client.Client
	Recorder record.EventRecorder
	Clock    clock.PassiveClock
	// Jobs cancels jobs for hard limits; nil destroys without cancelling
	// (no CI platform is configured).
	Jobs JobCanceller
	// PoolEvents carries wake-ups from the resync.
	PoolEvents <-chan event.GenericEvent
	// Backoff is the replacement backoff of pools whose claims keep
	// failing (runnerpool_backoff.go); zero means scaling.DefaultBackoff.
	Backoff scaling.Backoff
	// Scopes verifies pools' scopes against their credentials; without it
	// no pool of a CI platform is verified, receives jobs or creates VMs.
	Scopes ScopeVerifier
	// Workloads are the CI platform back-ends that read the pools'
	// spec.workload.
	Workloads *workload.Backends
	// JobReports, when set, says which claims' VMs reported a job started
	// in their power-off notice: such a claim awaiting its job record
	// does not hold replacements back (runnerpool_backoff.go).
	JobReports JobReportSource
	// WebhookSecrets, when set, says which webhook secret verifies the
	// deliveries about each pool's owner (condition WebhookSecretShared,
	// runnerpool_webhooksecret.go).
	WebhookSecrets WebhookSecrets
	// Feeds runs the job feed listeners of pools that name one (a runner
	// scale set, runnerpool_listener.go), with the accounts Providers
	// builds; without them such pools are told so and build no VMs.
	Feeds     FeedListeners
	Providers PoolProviders
	// CountsInterval, when set, is how long a pool's replica and job
	// counts may wait after its last status write when they are all a
	// pass changed (runnerpool_statusbatch.go); zero writes every change
	// at once.
	CountsInterval time.Duration

	expect poolclaims.Expectations
	// binds are the jobs bound to warm claims whose binds the cache does
	// not show yet (runnerpool_bind.go).
	binds bindExpectations
	// countsWritten is when each pool's status was last written
	// (holdCounts); losing it on restart writes the next change at once.
	countsWritten sync.Map
	// pendingScale is the lastScaleTime of a pass whose write was held,
	// by pool, until the next write carries it (carryScaleTime).
	pendingScale sync.Map
	// spillNoted is, by pool, the last spill its Spilled event announced
	// (setPlacementStatus): the event is sent once per change.
	spillNoted sync.Map
}

// JobReportSource is what the in-VM agents' power-off notices said of
// their runner's job (poweroff.JobReports).
type JobReportSource interface {
	JobStarted(uid types.UID, now time.Time) bool
}

// SetupWithManager registers the controller.
func (r *RunnerPoolReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.Backoff == (scaling.Backoff{}) {
		r.Backoff = scaling.DefaultBackoff()
	}
	b := ctrl.NewControllerManagedBy(mgr).
		For(&hfv1.RunnerPool{}).
		Watches(&hfv1.MachineClaim{}, r.claimEvents()).
		Watches(&hfv1.CIJob{}, handler.EnqueueRequestsFromMapFunc(poolOfObject)).
		Watches(&hfv1.HypervisorMachineTemplate{}, handler.EnqueueRequestsFromMapFunc(r.poolsForTemplate)).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Named("runnerpool")
	if r.PoolEvents != nil {
		b = b.WatchesRawSource(source.Channel(r.PoolEvents, &handler.EnqueueRequestForObject{}))
	}
	return b.Complete(r)
}

// claimEvents wakes a claim's pool, telling the pool's expectations first
// that the cache has seen the claim (poolclaims.Expectations.Observed).
func (r *RunnerPoolReconciler) claimEvents() handler.EventHandler {
	wake := handler.EnqueueRequestsFromMapFunc(poolOfObject)
	observed := func(o client.Object) {
		for _, req := range poolOfObject(context.Background(), o) {
			r.expect.Observed(req.NamespacedName, o.GetName(), r.Clock.Now())
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			observed(e.Object)
			wake.Create(ctx, e, q)
		},
		UpdateFunc: wake.Update,
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			observed(e.Object)
			wake.Delete(ctx, e, q)
		},
		GenericFunc: wake.Generic,
	}
}

// poolOfObject maps a claim or CIJob to its pool.
func poolOfObject(_ context.Context, o client.Object) []reconcile.Request {
	var name string
	switch v := o.(type) {
	case *hfv1.MachineClaim:
		if v.Spec.RunnerPoolRef != nil {
			name = v.Spec.RunnerPoolRef.Name
		}
	case *hfv1.CIJob:
		name = v.Spec.RunnerPoolRef.Name
	}
	if name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
}

// poolsForTemplate wakes the pools of a template.
func (r *RunnerPoolReconciler) poolsForTemplate(ctx context.Context, o client.Object) []reconcile.Request {
	var list hfv1.RunnerPoolList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{fieldindex.PoolTemplate: o.GetName()}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "List pools of template", "HypervisorMachineTemplate", klog.KObj(o))
		return nil
	}
	return requestsFor(list.Items)
}

// poolScope is one reconcile of one RunnerPool: the pool, what its phases
// loaded and decided, and the patch helper its close writes with.
type poolScope struct {
	pool *hfv1.RunnerPool
	// read is the pool as the pass read it (holdCounts compares with it).
	read  *hfv1.RunnerPool
	patch *patch.Helper
	now   time.Time
	// listed are the pool's claims as the cache check saw them; load
	// classifies them into claims.
	listed []hfv1.MachineClaim
	// refused is a field of the pool the operator does not act on: a
	// refused pool creates no claims, and the claims it already has (made
	// before the field was set) live out their lifecycle.
	refused *refusal.Refusal
	// mismatch, when set, says that the template has no section for the
	// pool's workload type (platformMismatch): the pool builds nothing.
	mismatch string

	// What load read: the template (nil when missing) and its hash, the
	// claims by state, the CIJobs by job id and the pending ones, and the
	// claim Provisioned reasons that hold capacity back.
	tmpl *hfv1.HypervisorMachineTemplate
	hash string
	// With spec.placement (runnerpool_placement.go): every template of the
	// pool in priority order (templateRef first; nil when missing), their
	// hashes by name, and their states and machines.
	tmpls     []*hfv1.HypervisorMachineTemplate
	hashes    map[string]string
	placement []poolplacement.Template
	claims    *poolclaims.Claims
	jobs      map[string]*hfv1.CIJob // by job id (CIJobSpec.ID)
	pending   []*hfv1.CIJob
	// taken are the runners the pool's job records name (in_progress or
	// completed): their claims are busy whether or not they recorded the
	// job yet (takenToBusy).
	taken    map[string]bool
	blockers map[string]int
	// scopeVerified: the pool may create VMs (ScopeVerified, or a pool
	// without a CI platform scope).
	scopeVerified bool
	// feedBlocked, when set, says why the pool's job feed cannot work, so
	// that it builds no VMs (runnerpool_listener.go), and
	// feedBlockedReason is the reason of that.
	feedBlocked       string
	feedBlockedReason hfv1.ConditionReason
	// backoff is the pool's replacement backoff after this pass's outcomes;
	// backoffHeld counts the creations it held back in this pass.
	backoff     scaling.BackoffState
	backoffHeld int
	// undecided are ended claims whose attempt waits for a job record
	// (jobRecordGrace): kept from pruning until it is decided. vouched are
	// the undecided claims whose VM reported a job started: they do not
	// hold replacements back.
	undecided, vouched map[types.UID]bool

	// What the pass did: the scaling decision, the claims it created, the
	// claims it ended (by reason, and by UID), and the retained failed
	// claims it deleted (the status reports what is left, not what the
	// pass started with).
	decision scaling.Decision
	// sched is what spec.scaling.schedules make of the pool's minimums
	// now (runnerpool_schedule.go).
	sched schedule.Answer
	// schedWake wakes the pool when a window opens or closes.
	schedWake phase.Result
	created   int
	// createdOn counts the claims created by template index (placement).
	createdOn map[int]int
	// The standby tier (runnerpool_standby.go): its size now, its claims
	// as the decision saw them, the ones this pass took for the demand and
	// the ones it created to refill it.
	standbySize    int32
	standbyRefused string
	tier           standbyTier
	activated      int
	createdStandby int
	removed        map[scaling.Reason]int
	ended          map[types.UID]bool
	released       int
}

// Reconcile implements reconcile.Reconciler: it opens the pool's scope,
// runs the pool's phases, and closes the scope, which derives the status
// and writes the pool once.
func (r *RunnerPoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, err error) {
	pool := &hfv1.RunnerPool{}
	if err := r.Client.Get(ctx, req.NamespacedName, pool); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, r.forgetPool(ctx, req.NamespacedName)
		}
		return ctrl.Result{}, err
	}
	if !pool.DeletionTimestamp.IsZero() {
		// A pool has no finalizer: its claims are owned by it and go with
		// it (garbage collection), and nothing is left to write.
		return ctrl.Result{}, nil
	}
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues("RunnerPool", klog.KObj(pool)))
	now := r.Clock.Now()
	// The mark comes before the list: a claim event the cache gets after
	// it may be missing from the list (poolclaims.Expectations).
	mark := r.expect.Mark()
	var claims hfv1.MachineClaimList
	if err := r.Client.List(ctx, &claims, client.InNamespace(pool.Namespace), client.MatchingFields{fieldindex.ClaimPool: pool.Name}); err != nil {
		return ctrl.Result{}, fmt.Errorf("list claims of pool: %w", err)
	}
	if !r.expect.Satisfied(req.NamespacedName, mark, claims.Items, now) {
		// The cache has not caught up with this pool's own writes yet:
		// deciding now could create or remove twice. Nothing is written.
		return ctrl.Result{RequeueAfter: 250 * time.Millisecond}, nil
	}
	s := r.newPoolScope(pool, claims.Items, now)
	defer func() { res, err = r.closePoolScope(ctx, s, res, err) }()

	return phase.Run(ctx, s, r.load, r.verifyScope, r.ensureListener, r.reportWebhookSecret, r.observeAttempts, r.enforceLifecycle,
		r.spill, r.scale, r.prune, r.collectJobs)
}

// newPoolScope opens the scope of one reconcile at now.
func (r *RunnerPoolReconciler) newPoolScope(pool *hfv1.RunnerPool, claims []hfv1.MachineClaim, now time.Time) *poolScope {
	s := &poolScope{
		pool: pool, read: pool.DeepCopy(), patch: patch.NewHelper(r.Client, pool), now: now, listed: claims,
		refused:   refusal.Pool(r.Workloads, pool),
		blockers:  map[string]int{},
		undecided: map[types.UID]bool{}, vouched: map[types.UID]bool{},
		removed: map[scaling.Reason]int{}, ended: map[types.UID]bool{}, createdOn: map[int]int{},
	}
	s.schedWake = r.evaluateSchedules(s)
	return s
}

// closePoolScope derives the pool's status from a pass that ran every
// phase (updateStatus: its counts need every phase's facts) and writes it
// once (writeScope). After a failed pass only the conditions the phases
// that ran recorded are written; the retry derives the rest.
func (r *RunnerPoolReconciler) closePoolScope(ctx context.Context, s *poolScope, res ctrl.Result, err error) (ctrl.Result, error) {
	if err == nil {
		r.updateStatus(ctx, s)
		if wait, held := r.holdCounts(s); held {
			if res.RequeueAfter <= 0 || wait < res.RequeueAfter {
				res.RequeueAfter = wait
			}
			return res, nil
		}
	}
	changed := !equality.Semantic.DeepEqual(s.read.Status, s.pool.Status)
	if perr := writeScope(ctx, s.patch, s.pool, &s.pool.Status.ObservedGeneration, err); perr != nil {
		return ctrl.Result{}, errors.Join(err, perr)
	}
	if changed {
		r.noteStatusWritten(client.ObjectKeyFromObject(s.pool), s.now)
	}
	return res, err
}

// forgetPool cleans up after a deleted pool: its demand records and its
// metrics (its claims are garbage-collected through their owner reference).
func (r *RunnerPoolReconciler) forgetPool(ctx context.Context, key types.NamespacedName) error {
	r.expect.Forget(key)
	r.spillNoted.Delete(key)
	if r.Feeds != nil {
		r.Feeds.Stop(key)
	}
	metrics.ForgetPool(key.Namespace, key.Name)
	err := r.Client.DeleteAllOf(ctx, &hfv1.CIJob{}, client.InNamespace(key.Namespace),
		client.MatchingLabelsSelector{Selector: labels.SelectorFromSet(labels.Set{hfv1.RunnerPoolLabel: key.Name})})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete CIJobs of deleted RunnerPool %s: %w", key, err)
	}
	return nil
}
