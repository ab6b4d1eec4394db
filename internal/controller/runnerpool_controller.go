package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	"github.com/hyperfleet/hyperfleet/internal/claimrunner"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/patch"
	"github.com/hyperfleet/hyperfleet/internal/poolclaims"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
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

	expect poolclaims.Expectations
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
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{poolTemplateIndex: o.GetName()}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "List pools of template", "HypervisorMachineTemplate", klog.KObj(o))
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return out
}

// poolView is what one reconcile knows about a pool.
type poolView struct {
	// released counts retained failed claims deleted in this pass: the
	// status reports what is left, not what the pass started with.
	released int
	pool     *hfv1.RunnerPool
	tmpl     *hfv1.HypervisorMachineTemplate // nil when missing
	hash     string
	claims   *poolclaims.Claims
	pending  []*hfv1.CIJob
	jobs     map[int64]*hfv1.CIJob // by job id
	now      time.Time
	requeue  time.Duration
	created  int
	removed  map[scaling.Reason]int
	ended    map[types.UID]bool // claims this pass ended
	// undecided are ended claims whose attempt waits for a job record
	// (jobRecordGrace): kept from pruning until it is decided.
	undecided map[types.UID]bool
	// vouched are the undecided claims whose VM reported a job started:
	// they do not hold replacements back.
	vouched  map[types.UID]bool
	blockers map[string]int // claim Provisioned reasons that hold capacity back
	refused  *refusal       // a field of the pool the operator does not act on
	// scopeVerified: the pool may create VMs (ScopeVerified, or a pool
	// without a CI platform scope).
	scopeVerified bool
	// backoff is the pool's replacement backoff after this pass's outcomes;
	// backoffHeld counts the creations it held back in this pass.
	backoff     scaling.BackoffState
	backoffHeld int
}

// wake asks for another reconcile within d.
func (v *poolView) wake(d time.Duration) {
	if d > 0 && (v.requeue == 0 || d < v.requeue) {
		v.requeue = d
	}
}

// Reconcile implements reconcile.Reconciler.
func (r *RunnerPoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	pool := &hfv1.RunnerPool{}
	if err := r.Client.Get(ctx, req.NamespacedName, pool); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, r.forgetPool(ctx, req.NamespacedName)
		}
		return ctrl.Result{}, err
	}
	if !pool.DeletionTimestamp.IsZero() {
		// Its claims are owned by it and go with it (garbage collection).
		return ctrl.Result{}, nil
	}
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues("RunnerPool", klog.KObj(pool)))
	now := r.Clock.Now()

	var claimList hfv1.MachineClaimList
	if err := r.Client.List(ctx, &claimList, client.InNamespace(pool.Namespace), client.MatchingFields{claimPoolIndex: pool.Name}); err != nil {
		return ctrl.Result{}, fmt.Errorf("list claims of pool: %w", err)
	}
	if !r.expect.Satisfied(req.NamespacedName, claimList.Items, now) {
		// The cache has not caught up with this pool's own writes yet:
		// deciding now could create or remove twice.
		return ctrl.Result{RequeueAfter: 250 * time.Millisecond}, nil
	}

	h := patch.NewHelper(r.Client, pool)
	defer func() {
		if err := h.PatchStatus(ctx, pool); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Patch RunnerPool status")
			if retErr == nil {
				retErr = err
			}
		}
	}()

	v := &poolView{pool: pool, now: now, removed: map[scaling.Reason]int{}, ended: map[types.UID]bool{}, undecided: map[types.UID]bool{}, vouched: map[types.UID]bool{}, blockers: map[string]int{}}
	// A refused pool creates no claims; the claims it already has (made
	// before the field was set) live out their lifecycle.
	v.refused = poolRefusal(r.Workloads, pool)
	v.wake(poolResync)
	if err := r.load(ctx, v, claimList.Items); err != nil {
		return ctrl.Result{}, err
	}
	r.verifyScope(ctx, v)
	r.reportWebhookSecret(v)
	r.observeAttempts(v)
	if err := r.enforceLifecycle(ctx, v); err != nil {
		return ctrl.Result{}, err
	}
	decision, err := r.scale(ctx, v)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.prune(ctx, v); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.collectJobs(ctx, v); err != nil {
		return ctrl.Result{}, err
	}
	r.updateStatus(v, decision)
	return ctrl.Result{RequeueAfter: v.requeue}, nil
}

// load reads the pool's template, claims and pending jobs into v.
func (r *RunnerPoolReconciler) load(ctx context.Context, v *poolView, claims []hfv1.MachineClaim) error {
	pool := v.pool
	tmpl := &hfv1.HypervisorMachineTemplate{}
	switch err := r.Client.Get(ctx, client.ObjectKey{Namespace: pool.Namespace, Name: pool.Spec.TemplateRef.Name}, tmpl); {
	case err == nil:
		v.tmpl = tmpl
		v.hash = tmpl.Status.TemplateHash
	case apierrors.IsNotFound(err):
	default:
		return fmt.Errorf("read HypervisorMachineTemplate %s: %w", pool.Spec.TemplateRef.Name, err)
	}
	owned := claims[:0:0]
	for i := range claims {
		if c := &claims[i]; metav1.IsControlledBy(c, pool) || len(c.OwnerReferences) == 0 {
			owned = append(owned, *c)
		}
	}
	v.claims = poolclaims.Classify(owned, v.hash, retainsFailed(pool))

	var jobs hfv1.CIJobList
	if err := r.Client.List(ctx, &jobs, client.InNamespace(pool.Namespace), client.MatchingFields{jobPoolIndex: pool.Name}); err != nil {
		return fmt.Errorf("list CIJobs of pool: %w", err)
	}
	v.jobs = make(map[int64]*hfv1.CIJob, len(jobs.Items))
	for i := range jobs.Items {
		j := &jobs.Items[i]
		v.jobs[j.Spec.JobID] = j
		if j.Status.State == hfv1.CIJobQueued || j.Status.State == "" {
			v.pending = append(v.pending, j)
		}
	}
	for _, c := range v.claims.Starting {
		if cond := hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimProvisionedCondition); cond != nil && cond.Status == metav1.ConditionFalse {
			switch cond.Reason {
			case string(hfv1.IPPoolExhaustedReason), string(hfv1.RateLimitedReason), string(hfv1.ClusterUnavailableReason), string(hfv1.NamespaceNotAllowedReason), string(hfv1.TemplateNotReadyReason),
				string(hfv1.MaxMachinesReachedReason), string(hfv1.InsufficientCapacityReason):
				v.blockers[cond.Reason]++
			}
		}
	}
	return nil
}

// canBuild reports whether the pool may create claims: it sets no refused
// field and its template is ready. Otherwise it gives the reason and the
// message for the pool's Ready condition.
func (v *poolView) canBuild() (bool, string, string) {
	if v.refused != nil {
		return false, string(v.refused.reason), v.refused.message
	}
	if ok, msg := v.templateReady(); !ok {
		return false, string(hfv1.TemplateNotReadyReason), msg
	}
	return true, "", ""
}

// templateReady reports whether new VMs can be built from the template.
func (v *poolView) templateReady() (bool, string) {
	if v.tmpl == nil {
		return false, fmt.Sprintf("spec.templateRef: HypervisorMachineTemplate %s/%s does not exist; create it or fix the name", v.pool.Namespace, v.pool.Spec.TemplateRef.Name)
	}
	ready := hfv1.FindCondition(v.tmpl.Status.Conditions, hfv1.ReadyCondition)
	switch {
	case !v.tmpl.DeletionTimestamp.IsZero():
		return false, fmt.Sprintf("HypervisorMachineTemplate %s is being deleted; no new VM is built from it", v.tmpl.Name)
	case ready == nil || v.tmpl.Status.ObservedGeneration != v.tmpl.Generation:
		return false, fmt.Sprintf("HypervisorMachineTemplate %s has not been validated yet", v.tmpl.Name)
	case ready.Status != metav1.ConditionTrue:
		return false, fmt.Sprintf("HypervisorMachineTemplate %s is not ready: %s: %s", v.tmpl.Name, ready.Reason, ready.Message)
	}
	return true, ""
}

// enforceLifecycle ends the claims that reached a lifecycle limit.
func (r *RunnerPoolReconciler) enforceLifecycle(ctx context.Context, v *poolView) error {
	limits := poolclaims.Limits(v.pool)
	check := func(list []*hfv1.MachineClaim) ([]*hfv1.MachineClaim, error) {
		keep := list[:0:0]
		for _, c := range list {
			reached, next := scaling.Expired(poolclaims.Times(c), limits, v.now)
			if reached.Reason == "" {
				keep = append(keep, c)
				if !next.At.IsZero() {
					v.wake(next.At.Sub(v.now))
				}
				continue
			}
			ended, err := r.endForLimit(ctx, v, c, reached)
			if err != nil {
				return nil, err
			}
			if !ended {
				keep = append(keep, c)
			}
		}
		return keep, nil
	}
	var err error
	pc := v.claims
	if pc.Starting, err = check(pc.Starting); err != nil {
		return err
	}
	if pc.Idle, err = check(pc.Idle); err != nil {
		return err
	}
	pc.Busy, err = check(pc.Busy)
	return err
}

// endForLimit ends one claim that reached a limit; false when it must
// wait (a hard limit whose job could not be cancelled yet).
func (r *RunnerPoolReconciler) endForLimit(ctx context.Context, v *poolView, c *hfv1.MachineClaim, e scaling.Expiry) (bool, error) {
	limits := poolclaims.Limits(v.pool)
	var msg string
	switch e.Reason {
	case scaling.BootstrapTimeout:
		msg = fmt.Sprintf("the runner did not come online within spec.lifecycle.bootstrapTimeout (%s)", limits.BootstrapTimeout)
		return true, r.failClaim(ctx, v, c, e.Reason, msg)
	case scaling.IdleTimeout:
		msg = fmt.Sprintf("the runner took no job within spec.lifecycle.idleTimeout (%s)", limits.IdleTimeout)
	case scaling.JobTimeout:
		msg = fmt.Sprintf("job %d ran longer than spec.lifecycle.jobTimeout (%s)", c.Status.Bootstrap.JobID, limits.JobTimeout)
	case scaling.MaxLifetime:
		msg = fmt.Sprintf("the VM reached spec.lifecycle.maxLifetime (%s)", limits.MaxLifetime)
	}
	if e.Reason.Hard() {
		cancelled, err := r.cancelJob(ctx, v, c)
		if err != nil || !cancelled {
			return false, err
		}
		if st := c.Status.Bootstrap; st != nil && st.JobID != 0 {
			msg += fmt.Sprintf("; job %d was cancelled first", st.JobID)
		}
	}
	return true, r.endClaim(ctx, v, c, e.Reason, msg)
}

// cancelJob cancels a busy claim's job before a hard limit ends it. It
// reports false, with a wake-up, while the job cannot be cancelled yet.
func (r *RunnerPoolReconciler) cancelJob(ctx context.Context, v *poolView, c *hfv1.MachineClaim) (bool, error) {
	st := c.Status.Bootstrap
	if st == nil || st.JobID == 0 || r.Jobs == nil || v.tmpl == nil {
		return true, nil
	}
	job := v.jobs[st.JobID]
	if job == nil || job.Status.State == hfv1.CIJobCompleted {
		return true, nil
	}
	err := r.Jobs.CancelJob(ctx, v.pool, v.tmpl, job)
	switch {
	case err == nil, errors.Is(err, workload.ErrNotFound):
		r.Recorder.Eventf(v.pool, corev1.EventTypeWarning, "JobCancelled", "Cancelled workflow run %d of %s (job %d on runner %s, claim %s) before enforcing a hard limit",
			job.Spec.RunID, job.Spec.Repository, job.Spec.JobID, st.RunnerName, c.Name)
		return true, nil
	}
	if wait, limited := claimrunner.RetryAfter(err, v.now); limited {
		v.wake(wait)
		return false, nil
	}
	r.Recorder.Eventf(v.pool, corev1.EventTypeWarning, "JobCancelFailed", "Could not cancel job %d of claim %s (retrying before destroying its VM): %v", job.Spec.JobID, c.Name, err)
	v.wake(15 * time.Second)
	return false, nil
}

// endClaim asks a claim to end, recording why; the claim controller
// deregisters its runner (waiting while it is busy, unless a hard limit
// ends it), destroys its VM and then keeps the claim as history or
// deletes it.
func (r *RunnerPoolReconciler) endClaim(ctx context.Context, v *poolView, c *hfv1.MachineClaim, reason scaling.Reason, msg string) error {
	if err := r.requestEnd(ctx, c, reason, msg, false); err != nil {
		return fmt.Errorf("end MachineClaim %s (%s): %w", c.Name, reason, err)
	}
	r.expect.Ended(client.ObjectKeyFromObject(v.pool), c.UID, r.Clock.Now())
	v.removed[reason]++
	v.ended[c.UID] = true
	metrics.PoolScalingActions.WithLabelValues(v.pool.Namespace, v.pool.Name, "remove", string(reason)).Inc()
	ctrl.LoggerFrom(ctx).Info("Ending MachineClaim", "MachineClaim", c.Name, "reason", reason, "message", msg)
	return nil
}

// failClaim asks the claim controller to fail a claim (its VM is then
// kept for debugging when the pool retains failed VMs).
func (r *RunnerPoolReconciler) failClaim(ctx context.Context, v *poolView, c *hfv1.MachineClaim, reason scaling.Reason, msg string) error {
	if err := r.requestEnd(ctx, c, reason, msg, true); err != nil {
		return err
	}
	r.expect.Ended(client.ObjectKeyFromObject(v.pool), c.UID, r.Clock.Now())
	v.removed[reason]++
	v.ended[c.UID] = true
	metrics.PoolScalingActions.WithLabelValues(v.pool.Namespace, v.pool.Name, "remove", string(reason)).Inc()
	r.Recorder.Eventf(v.pool, corev1.EventTypeWarning, string(reason.ConditionReason()), "MachineClaim %s failed: %s", c.Name, msg)
	return nil
}

// requestEnd asks a claim to end through its spec.end (reason, message,
// whether it fails, and when). A request already there for the same reason
// is kept; a different one (a hard limit overtaking a soft reason)
// replaces it.
func (r *RunnerPoolReconciler) requestEnd(ctx context.Context, c *hfv1.MachineClaim, reason scaling.Reason, msg string, fail bool) error {
	if e := c.Spec.End; e != nil && e.Reason == reason && e.Fail == fail {
		return nil
	}
	h := patch.NewHelper(r.Client, c)
	c.Spec.End = &hfv1.MachineClaimEndRequest{Reason: reason, Message: conditions.Truncate(msg, 1024), Fail: fail, RequestedAt: metav1.NewTime(r.Clock.Now())}
	return h.PatchMetadata(ctx, c)
}

// scale applies the scaling decision: drift replacement, scale-down of
// surplus idle claims, and new claims.
func (r *RunnerPoolReconciler) scale(ctx context.Context, v *poolView) (scaling.Decision, error) {
	pool, pc := v.pool, v.claims
	var staleStarting, freshStarting, staleIdle, freshIdle []*hfv1.MachineClaim
	for _, c := range pc.Starting {
		if pc.Stale[c.UID] {
			staleStarting = append(staleStarting, c)
		} else {
			freshStarting = append(freshStarting, c)
		}
	}
	for _, c := range pc.Idle {
		if pc.Stale[c.UID] {
			staleIdle = append(staleIdle, c)
		} else {
			freshIdle = append(freshIdle, c)
		}
	}
	in := scaling.Input{
		MinReplicas: int(pool.Spec.Scaling.MinReplicas), MaxReplicas: int(pool.Spec.Scaling.MaxReplicas),
		Pending: len(v.pending), Starting: len(freshStarting), StaleStarting: len(staleStarting),
		Idle: len(freshIdle), StaleIdle: len(staleIdle), Busy: len(pc.Busy),
		Terminating: len(pc.Terminating) + v.removedCount(), Retained: len(pc.Retained),
		Now: v.now,
	}
	if pool.Spec.Scaling.MinIdle != nil {
		in.MinIdle = int(*pool.Spec.Scaling.MinIdle)
	}
	if d := pool.Spec.Scaling.ScaleDownDelay; d != nil {
		in.ScaleDownDelay = d.Duration
	} else {
		in.ScaleDownDelay = 5 * time.Minute
	}
	if t := pool.Status.LowDemandSince; t != nil {
		at := t.Time
		in.LowDemandSince = &at
	}
	d := scaling.Plan(in)
	if !d.ScaleDownAt.IsZero() {
		v.wake(d.ScaleDownAt.Sub(v.now))
	}
	for _, c := range staleStarting[:d.RemoveStaleStarting] {
		if err := r.endClaim(ctx, v, c, scaling.DriftReplaced, fmt.Sprintf("built from template hash %s; the template is now %s", shortHash(c.Status.TemplateHash), shortHash(v.hash))); err != nil {
			return d, err
		}
	}
	for _, c := range staleIdle[:d.RemoveStaleIdle] {
		if err := r.endClaim(ctx, v, c, scaling.DriftReplaced, fmt.Sprintf("built from template hash %s; the template is now %s", shortHash(c.Status.TemplateHash), shortHash(v.hash))); err != nil {
			return d, err
		}
	}
	for _, c := range freshIdle[:d.RemoveIdle] {
		if err := r.endClaim(ctx, v, c, scaling.ScaledDown, fmt.Sprintf("demand stayed below the pool's size for spec.scaling.scaleDownDelay (%s)", in.ScaleDownDelay)); err != nil {
			return d, err
		}
	}
	if d.Create > 0 {
		if ok, _, _ := v.canBuild(); !ok || !v.scopeVerified {
			return d, nil
		}
		if err := r.createClaims(ctx, v, r.allowedCreations(v, d.Create)); err != nil {
			return d, err
		}
	}
	return d, nil
}

// maxParallelCreates bounds the claim creations one pass sends at once.
// One after the other, a pass that replaces several claims spends one API
// round trip on each while the pool's other decisions wait for it (the
// pool is one work item); in parallel the pass costs about one round trip.
const maxParallelCreates = 8

// createClaims creates n claims for the pool, up to maxParallelCreates at
// a time. Every creation is tried; the errors are joined.
func (r *RunnerPoolReconciler) createClaims(ctx context.Context, v *poolView, n int) error {
	if n <= 0 {
		return nil
	}
	claims := make([]*hfv1.MachineClaim, n)
	for i := range claims {
		claims[i] = r.newClaim(v)
	}
	errs := make([]error, n)
	sem := make(chan struct{}, maxParallelCreates)
	var wg sync.WaitGroup
	for i, claim := range claims {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := r.Client.Create(ctx, claim); err != nil {
				errs[i] = fmt.Errorf("create MachineClaim for RunnerPool %s: %w", v.pool.Name, err)
				return
			}
			r.expect.Created(client.ObjectKeyFromObject(v.pool), claim.Name, r.Clock.Now())
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err == nil {
			v.created++
			metrics.PoolScalingActions.WithLabelValues(v.pool.Namespace, v.pool.Name, "create", "").Inc()
		}
	}
	return errors.Join(errs...)
}

// removedCount is the number of claims this pass ended.
func (v *poolView) removedCount() int { return len(v.ended) }

// remaining counts the claims of list this pass did not end.
func (v *poolView) remaining(list []*hfv1.MachineClaim) int {
	n := 0
	for _, c := range list {
		if !v.ended[c.UID] {
			n++
		}
	}
	return n
}

// newClaim is a new claim for the pool, named <pool>-<suffix>.
func (r *RunnerPoolReconciler) newClaim(v *poolView) *hfv1.MachineClaim {
	pool := v.pool
	labels, annotations := templateClaimMetadata(v.tmpl)
	labels[hfv1.ManagedByLabel] = hfv1.ManagedByValue
	labels[hfv1.RunnerPoolLabel] = pool.Name
	labels[hfv1.MachineTemplateLabel] = pool.Spec.TemplateRef.Name
	claim := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       pool.Namespace,
			GenerateName:    pool.Name + "-",
			Labels:          labels,
			Annotations:     annotations,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(pool, hfv1.GroupVersion.WithKind("RunnerPool"))},
		},
		Spec: hfv1.MachineClaimSpec{
			TemplateRef:   pool.Spec.TemplateRef,
			RunnerPoolRef: &hfv1.ObjectName{Name: pool.Name},
		},
	}
	if v.hash != "" {
		claim.Labels[hfv1.TemplateHashLabel] = v.hash[:min(63, len(v.hash))]
	}
	if _, ps, ok := r.Workloads.Pool(pool, v.tmpl); ok {
		claim.Spec.WorkloadConfig = ps.Claim
	}
	return claim
}

// templateClaimMetadata returns copies of the template's spec.metadata
// labels and annotations (empty maps without a template), which a new
// claim starts from; the caller sets HyperFleet's own labels over them.
func templateClaimMetadata(tmpl *hfv1.HypervisorMachineTemplate) (labels, annotations map[string]string) {
	labels, annotations = map[string]string{}, map[string]string{}
	if tmpl == nil || tmpl.Spec.Metadata == nil {
		return labels, annotations
	}
	maps.Copy(labels, tmpl.Spec.Metadata.Labels)
	maps.Copy(annotations, tmpl.Spec.Metadata.Annotations)
	return labels, annotations
}

// prune deletes retained failed claims beyond failedRetention and finished
// claims beyond history.
func (r *RunnerPoolReconciler) prune(ctx context.Context, v *poolView) error {
	pool, pc := v.pool, v.claims
	if f := pool.Spec.Lifecycle.FailedRetention; len(pc.Retained) > 0 {
		maxKept, ttl := 0, failedRetentionTTL(pool)
		if f != nil {
			maxKept = int(f.MaxRetained)
		}
		excess := len(pc.Retained) - maxKept
		for i, c := range pc.Retained { // oldest first
			until := failedAt(c).Add(ttl)
			if i < excess || !v.now.Before(until) {
				msg := fmt.Sprintf("failed VM kept for debugging past spec.lifecycle.failedRetention (ttl %s, at most %d)", ttl, maxKept)
				if err := r.deleteWithReason(ctx, v, c, msg); err != nil {
					return err
				}
				continue
			}
			v.wake(until.Sub(v.now))
		}
	}
	if len(pc.Finished) > 0 {
		limit, ttl := 0, 24*time.Hour
		if h := pool.Spec.Lifecycle.History; h != nil {
			limit = int(h.Limit)
			if h.TTL != nil {
				ttl = h.TTL.Duration
			}
		}
		excess := len(pc.Finished) - limit
		for i, c := range pc.Finished {
			if v.undecided[c.UID] {
				// observeAttempts woke the pool for when it is decided.
				continue
			}
			until := finishedAt(c).Add(ttl)
			if i < excess || !v.now.Before(until) {
				if err := r.Client.Delete(ctx, c); err != nil && !apierrors.IsNotFound(err) {
					return fmt.Errorf("delete finished MachineClaim %s: %w", c.Name, err)
				}
				r.expect.Ended(client.ObjectKeyFromObject(pool), c.UID, r.Clock.Now())
				continue
			}
			v.wake(until.Sub(v.now))
		}
	}
	return nil
}

// deleteWithReason deletes a retained failed claim (its VM goes with it).
func (r *RunnerPoolReconciler) deleteWithReason(ctx context.Context, v *poolView, c *hfv1.MachineClaim, msg string) error {
	r.expect.Ended(client.ObjectKeyFromObject(v.pool), c.UID, r.Clock.Now())
	if err := r.Client.Delete(ctx, c); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete retained MachineClaim %s: %w", c.Name, err)
	}
	v.released++
	r.Recorder.Eventf(v.pool, corev1.EventTypeNormal, "RetainedVMReleased", "MachineClaim %s: %s", c.Name, msg)
	return nil
}

// failedAt is when a failed claim failed (its creation when unknown).
func failedAt(c *hfv1.MachineClaim) time.Time {
	if e := c.Status.End; e != nil && !e.StartedAt.IsZero() {
		return e.StartedAt.Time
	}
	return c.CreationTimestamp.Time
}

// finishedAt is when a finished claim's VM was gone, or when it failed.
func finishedAt(c *hfv1.MachineClaim) time.Time {
	if e := c.Status.End; e != nil && e.FinishedAt != nil {
		return e.FinishedAt.Time
	}
	return failedAt(c)
}

// collectJobs deletes the pool's CIJobs that completed a while ago.
func (r *RunnerPoolReconciler) collectJobs(ctx context.Context, v *poolView) error {
	for _, j := range v.jobs {
		if j.Status.State != hfv1.CIJobCompleted {
			continue
		}
		done := j.CreationTimestamp.Time
		if j.Status.CompletedAt != nil && j.Status.CompletedAt.After(done) {
			done = j.Status.CompletedAt.Time
		}
		if until := done.Add(completedJobRetention); v.now.Before(until) {
			v.wake(until.Sub(v.now))
			continue
		}
		if err := r.Client.Delete(ctx, j); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete completed CIJob %s: %w", j.Name, err)
		}
	}
	return nil
}

// forgetPool cleans up after a deleted pool: its demand records and its
// metrics (its claims are garbage-collected through their owner reference).
func (r *RunnerPoolReconciler) forgetPool(ctx context.Context, key types.NamespacedName) error {
	r.expect.Forget(key)
	metrics.ForgetPool(key.Namespace, key.Name)
	err := r.Client.DeleteAllOf(ctx, &hfv1.CIJob{}, client.InNamespace(key.Namespace),
		client.MatchingLabelsSelector{Selector: labels.SelectorFromSet(labels.Set{hfv1.RunnerPoolLabel: key.Name})})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete CIJobs of deleted RunnerPool %s: %w", key, err)
	}
	return nil
}

// updateStatus writes counts, conditions, events and metrics.
func (r *RunnerPoolReconciler) updateStatus(v *poolView, d scaling.Decision) {
	pool, pc := v.pool, v.claims
	st := &pool.Status
	gen := pool.Generation
	stale := 0
	for uid := range pc.Stale {
		if !v.ended[uid] {
			stale++
		}
	}
	starting, idle, busy := v.remaining(pc.Starting)+v.created, v.remaining(pc.Idle), v.remaining(pc.Busy)
	st.Replicas = int32(starting + idle + busy)
	st.DesiredReplicas = int32(d.Desired)
	st.StartingReplicas = int32(starting)
	st.IdleReplicas = int32(idle)
	st.BusyReplicas = int32(busy)
	st.ReadyReplicas = int32(idle + busy)
	st.TerminatingReplicas = int32(len(pc.Terminating) + v.removedCount() + v.released)
	st.RetainedReplicas = int32(len(pc.Retained) - v.released)
	st.StaleReplicas = int32(stale)
	st.PendingJobs = int32(len(v.pending))
	st.TemplateHash = v.hash
	st.Selector = labels.SelectorFromSet(labels.Set{hfv1.RunnerPoolLabel: pool.Name}).String()
	st.ObservedGeneration = gen
	st.LowDemandSince = nil
	if d.LowDemandSince != nil {
		st.LowDemandSince = &metav1.Time{Time: *d.LowDemandSince}
	}
	if v.created > 0 || v.removedCount() > 0 {
		st.LastScaleTime = &metav1.Time{Time: v.now}
	}

	// Ready: the pool can make VMs.
	if ok, reason, msg := v.canBuild(); !ok {
		conditions.Set(&st.Conditions, gen, hfv1.ReadyCondition, metav1.ConditionFalse, hfv1.ConditionReason(reason), msg)
	} else {
		conditions.Set(&st.Conditions, gen, hfv1.ReadyCondition, metav1.ConditionTrue, hfv1.ReadyReason,
			fmt.Sprintf("Serving %s jobs with template %s", pool.Spec.Workload.Type, v.tmpl.Name))
	}

	// Scaling: what changed, and why.
	if n := v.removed[scaling.DriftReplaced]; n > 0 {
		r.Recorder.Eventf(pool, corev1.EventTypeNormal, string(hfv1.ReplacingStaleReason), "Replacing %d VMs built from an older template (now %s); busy ones are replaced after their job", n, shortHash(v.hash))
	}
	if n := v.removed[scaling.ScaledDown]; n > 0 {
		r.Recorder.Eventf(pool, corev1.EventTypeNormal, "ScaledDown", "Removing %d idle VMs: desired %d (%d pending jobs, %d busy)", n, d.Desired, len(v.pending), len(pc.Busy))
	}
	switch {
	case v.created > 0:
		msg := fmt.Sprintf("Creating %d VMs: %d pending jobs, %d busy, %d idle, %d starting; desired %d (min %d, max %d, minIdle %d)",
			v.created, len(v.pending), len(pc.Busy), len(pc.Idle), len(pc.Starting), d.Desired, pool.Spec.Scaling.MinReplicas, pool.Spec.Scaling.MaxReplicas, ptrOr(pool.Spec.Scaling.MinIdle, 0))
		conditions.Set(&st.Conditions, gen, hfv1.RunnerPoolScalingCondition, metav1.ConditionTrue, hfv1.DemandIncreasedReason, msg)
		r.Recorder.Event(pool, corev1.EventTypeNormal, "ScaledUp", msg)
	case v.removed[scaling.DriftReplaced] > 0:
		msg := fmt.Sprintf("Replacing %d VMs built from an older template (now %s); busy ones are replaced after their job", v.removed[scaling.DriftReplaced], shortHash(v.hash))
		conditions.Set(&st.Conditions, gen, hfv1.RunnerPoolScalingCondition, metav1.ConditionTrue, hfv1.ReplacingStaleReason, msg)
	case v.removed[scaling.ScaledDown] > 0:
		msg := fmt.Sprintf("Removing %d idle VMs: desired %d (%d pending jobs, %d busy)", v.removed[scaling.ScaledDown], d.Desired, len(v.pending), len(pc.Busy))
		conditions.Set(&st.Conditions, gen, hfv1.RunnerPoolScalingCondition, metav1.ConditionTrue, hfv1.DemandDecreasedReason, msg)
	case int(st.Replicas) != d.Desired:
		reason, msg := hfv1.DemandIncreasedReason, fmt.Sprintf("Moving from %d to %d VMs", st.Replicas, d.Desired)
		if int(st.Replicas) > d.Desired {
			reason = hfv1.DemandDecreasedReason
			if !d.ScaleDownAt.IsZero() {
				msg += fmt.Sprintf("; idle VMs are removed at %s (spec.scaling.scaleDownDelay)", d.ScaleDownAt.UTC().Format(time.RFC3339))
			}
		}
		conditions.Set(&st.Conditions, gen, hfv1.RunnerPoolScalingCondition, metav1.ConditionTrue, reason, msg)
	default:
		conditions.Set(&st.Conditions, gen, hfv1.RunnerPoolScalingCondition, metav1.ConditionFalse, hfv1.StableReason,
			fmt.Sprintf("%d VMs for %d pending jobs and %d busy runners", st.Replicas, len(v.pending), len(pc.Busy)))
	}
	for _, reason := range []scaling.Reason{scaling.IdleTimeout, scaling.JobTimeout, scaling.MaxLifetime} {
		if n := v.removed[reason]; n > 0 {
			r.Recorder.Eventf(pool, corev1.EventTypeNormal, string(reason.ConditionReason()), "Ending %d VMs: %s", n, reason)
		}
	}

	r.setCapacity(v, d)

	ns, name := pool.Namespace, pool.Name
	metrics.PoolDesiredReplicas.WithLabelValues(ns, name).Set(float64(d.Desired))
	metrics.PoolPendingJobs.WithLabelValues(ns, name).Set(float64(len(v.pending)))
	for state, n := range map[string]int32{"starting": st.StartingReplicas, "idle": st.IdleReplicas, "busy": st.BusyReplicas,
		"terminating": st.TerminatingReplicas, "retained": st.RetainedReplicas} {
		metrics.PoolReplicas.WithLabelValues(ns, name, state).Set(float64(n))
	}
}

// setCapacity sets CapacityAvailable: False with the first reason demand
// cannot be served.
func (r *RunnerPoolReconciler) setCapacity(v *poolView, d scaling.Decision) {
	pool := v.pool
	st := &pool.Status
	gen := pool.Generation
	set := func(reason, msg string) {
		old := hfv1.FindCondition(st.Conditions, hfv1.RunnerPoolCapacityCondition)
		if old == nil || old.Status != metav1.ConditionFalse || old.Reason != reason {
			r.Recorder.Event(pool, corev1.EventTypeWarning, reason, msg)
		}
		conditions.Set(&st.Conditions, gen, hfv1.RunnerPoolCapacityCondition, metav1.ConditionFalse, hfv1.ConditionReason(reason), msg)
	}
	if v.refused != nil {
		set(string(v.refused.reason), "No new VMs: "+v.refused.message)
		return
	}
	if ok, msg := v.templateReady(); !ok {
		set(string(hfv1.TemplateInvalidReason), "No new VMs: "+msg)
		return
	}
	if !v.scopeVerified {
		set(string(hfv1.ScopeNotVerifiedReason), "No new VMs until the pool's scope is verified against its template's credentials; see the ScopeVerified condition")
		return
	}
	if v.backoffHeld > 0 && v.backoff.Failures < r.Backoff.Threshold {
		set(string(hfv1.ConsecutiveFailuresReason), fmt.Sprintf("%d new VMs held back: %d claims powered off before their runner was seen online and wait up to %s for a job record naming it (a job record makes them a success; without one they count as failures, %d in a row so far)",
			v.backoffHeld, len(v.undecided)-len(v.vouched), jobRecordGrace, v.backoff.Failures))
		return
	}
	if v.backoffHeld > 0 {
		next := "one at a time, each after the previous one's outcome"
		if at, waiting := v.backoff.Waiting(v.now); waiting {
			next = "the next one at " + at.UTC().Format(time.RFC3339)
		}
		set(string(hfv1.ConsecutiveFailuresReason), fmt.Sprintf("%d new VMs held back: %d claims in a row failed before their runner came online; %s (see the ReplacementBackoff condition)",
			v.backoffHeld, v.backoff.Failures, next))
		return
	}
	for _, reason := range []string{string(hfv1.ClusterUnavailableReason), string(hfv1.IPPoolExhaustedReason), string(hfv1.RateLimitedReason), string(hfv1.NamespaceNotAllowedReason),
		string(hfv1.MaxMachinesReachedReason), string(hfv1.InsufficientCapacityReason)} {
		if n := v.blockers[reason]; n > 0 {
			set(reason, fmt.Sprintf("%d starting VMs wait: %s (see their Provisioned condition)", n, reason))
			return
		}
	}
	switch d.Limit {
	case scaling.AtMaxReplicas:
		set(string(hfv1.AtMaxReplicasReason), fmt.Sprintf("Demand needs more than spec.scaling.maxReplicas (%d) allows: %d pending jobs, %d busy, %d failed VMs retained; raise maxReplicas or wait",
			pool.Spec.Scaling.MaxReplicas, len(v.pending), len(v.claims.Busy), len(v.claims.Retained)))
		return
	case scaling.WaitingForTermination:
		set(string(hfv1.WaitingForTerminationReason), fmt.Sprintf("%d VMs are still being destroyed and hold room under maxReplicas (%d)", len(v.claims.Terminating)+v.removedCount(), pool.Spec.Scaling.MaxReplicas))
		return
	}
	conditions.Set(&st.Conditions, gen, hfv1.RunnerPoolCapacityCondition, metav1.ConditionTrue, hfv1.ReadyReason, "The pool can serve its demand")
}

func ptrOr(p *int32, def int32) int32 {
	if p == nil {
		return def
	}
	return *p
}
