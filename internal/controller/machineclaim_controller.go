package controller

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/ipam"
	"github.com/hyperfleet/hyperfleet/internal/ownership"
)

const (
	// runningResync rechecks a running claim without any event, a safety
	// net behind the cluster poller's shutdown notifications. It is
	// jittered (see resyncRunning) so that claims that came up together
	// do not all wake together and delay new claims in the queue.
	runningResync = 2 * time.Minute
	// waitForDependency is how long a claim waits for a missing template or
	// cluster before looking again (watches usually wake it sooner).
	waitForDependency = time.Minute
)

// resyncRunning is runningResync plus up to half of it again, at random.
func resyncRunning() time.Duration {
	return runningResync + time.Duration(rand.Int64N(int64(runningResync/2)))
}

// BootstrapSource is the seam to the workload side (GitHub Actions first):
// it fills in the workload part of a VM's cloud-init variables (runner name,
// labels, and the single-use credential) right before the cloud-init is
// rendered. The workload side reports the runner online by setting the
// claim's Bootstrapped condition to True, which makes the claim Ready.
//
// BootstrapVars runs once per cloud-init delivery, right before the ISO is
// built; it may record what it issued (never a secret) in
// claim.Status.Bootstrap, which the claim controller persists.
// Release undoes the registration when the claim goes; it returns an error
// matching workload.ErrRunnerBusy while the runner runs a job.
type BootstrapSource interface {
	BootstrapVars(ctx context.Context, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate, vars *cloudinit.Vars) error
	Release(ctx context.Context, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate) error
}

// MachineClaimReconciler turns each MachineClaim into one owned VM and
// removes the VM when the claim goes away or the VM powers off.
type MachineClaimReconciler struct {
	Client   client.Client
	Registry *hypervisors.Registry
	// IPAM allocates static addresses (network mode static).
	IPAM     *ipam.Manager
	Recorder record.EventRecorder
	Clock    clock.PassiveClock
	// Signer signs and verifies the VM reservations the claim controller
	// writes into claims (the install's ownership key); without it no
	// reservation is ever trusted.
	Signer *ownership.Signer
	// Bootstrap supplies workload credentials; nil renders VMs without any.
	Bootstrap BootstrapSource
	// Agent finds the agent binaries the operator serves (templates with
	// agentSource Operator); nil when it serves none.
	Agent AgentLocator
	// ClaimEvents carries wake-ups from the HypervisorCluster poller and
	// the RunnerPool resync.
	ClaimEvents <-chan event.GenericEvent
	// Runners are the latest runner observations of the RunnerPool resync;
	// nil when nothing observes runners.
	Runners *RunnerObservations
	// MaxConcurrentReconciles bounds parallel reconciles (default 16):
	// reconciles never wait for the hypervisor, so they are short.
	MaxConcurrentReconciles int
	// MaxRetryDelay caps the exponential backoff (2s, 4s, 8s ...) after
	// transient hypervisor errors; zero means 5 minutes.
	MaxRetryDelay time.Duration
	// StuckBounds are how long a claim may stay in each phase before it is
	// reported Stuck (machineclaim_stuck.go); zero fields check nothing.
	StuckBounds StuckBounds

	// stuck counts stuck claims by phase for the gauge.
	stuck stuckClaims
	// attempts counts consecutive transient failures per claim UID for
	// backoff. Losing it on restart only restarts the backoff.
	attempts sync.Map
	// written is the resourceVersion of each claim's last write by this
	// controller, by UID: a reconcile that reads an older version from the
	// cache waits for the cache instead of repeating a step (a second
	// cloud-init delivery would issue a second runner credential).
	written sync.Map
	// staleWaits counts, by UID, the consecutive reconciles that found the
	// cache older than written: the requeue backs off with it.
	staleWaits sync.Map
	// uids is the UID last seen under each claim name: a reconcile that
	// finds the name gone (or taken by a new claim) drops the per-claim
	// state of that UID, whatever became of the claim while this
	// controller was not looking.
	uids sync.Map
}

// Requeue delays while the cache is older than this controller's last
// write of a claim: the watch event usually arrives within milliseconds,
// but an API server or informer under load may take seconds, and a fixed
// short requeue would then spin.
const (
	staleCacheFirstWait = 50 * time.Millisecond
	staleCacheMaxWait   = 5 * time.Second
	// staleCacheReport is the wait count at which the lag is logged.
	staleCacheReport = 8
)

// staleCacheWait is the requeue after the n-th consecutive stale read
// (n from 0): 50 ms doubling to 5 s.
func staleCacheWait(n int) time.Duration {
	if n >= 8 {
		return staleCacheMaxWait
	}
	return min(staleCacheFirstWait<<n, staleCacheMaxWait)
}

// waitForCache reports whether the cache still shows the claim older than
// this controller's last write, with the requeue to wait for it.
func (r *MachineClaimReconciler) waitForCache(ctx context.Context, claim *hfv1.MachineClaim) (ctrl.Result, bool) {
	if !r.staleCache(claim) {
		r.staleWaits.Delete(claim.UID)
		return ctrl.Result{}, false
	}
	n := 0
	if v, ok := r.staleWaits.Load(claim.UID); ok {
		n = v.(int)
	}
	r.staleWaits.Store(claim.UID, n+1)
	if n == staleCacheReport {
		ctrl.LoggerFrom(ctx).Info("The cache still shows an older version of the claim than this controller wrote; waiting for it",
			"resourceVersion", claim.ResourceVersion, "waits", n)
	}
	return ctrl.Result{RequeueAfter: staleCacheWait(n)}, true
}

// trackName records that name holds the claim uid now; the state of a
// claim that held the name before is dropped.
func (r *MachineClaimReconciler) trackName(name types.NamespacedName, uid types.UID) {
	if old, loaded := r.uids.Swap(name, uid); loaded && old.(types.UID) != uid {
		r.forget(old.(types.UID))
	}
}

// forgetName drops the state of the claim last seen under name, which is
// gone.
func (r *MachineClaimReconciler) forgetName(name types.NamespacedName) {
	if old, loaded := r.uids.LoadAndDelete(name); loaded {
		r.forget(old.(types.UID))
	}
}

// forget drops every in-memory entry of a claim.
func (r *MachineClaimReconciler) forget(uid types.UID) {
	r.attempts.Delete(uid)
	r.written.Delete(uid)
	r.staleWaits.Delete(uid)
	r.Runners.Forget(uid)
}

// staleCache reports whether the cache still shows a claim older than
// this controller's last write of it. resourceVersions are etcd revisions;
// one that does not parse is never called stale.
func (r *MachineClaimReconciler) staleCache(claim *hfv1.MachineClaim) bool {
	v, ok := r.written.Load(claim.UID)
	if !ok {
		return false
	}
	cur, err := strconv.ParseUint(claim.ResourceVersion, 10, 64)
	return err == nil && cur < v.(uint64)
}

// rememberWrite records the claim's resourceVersion after a write.
func (r *MachineClaimReconciler) rememberWrite(claim *hfv1.MachineClaim) {
	if rv, err := strconv.ParseUint(claim.ResourceVersion, 10, 64); err == nil {
		r.written.Store(claim.UID, rv)
	}
}

// SetupWithManager registers the controller.
func (r *MachineClaimReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.MaxConcurrentReconciles == 0 {
		r.MaxConcurrentReconciles = 16
	}
	r.stuck.reset(r.StuckBounds)
	b := ctrl.NewControllerManagedBy(mgr).
		For(&hfv1.MachineClaim{}).
		Watches(&hfv1.HypervisorMachineTemplate{}, handler.EnqueueRequestsFromMapFunc(r.claimsForTemplate),
			builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.ResourceVersionChangedPredicate{}))).
		Watches(&hfv1.CIJob{}, handler.EnqueueRequestsFromMapFunc(r.claimsForJob)).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.MaxConcurrentReconciles}).
		Named("machineclaim")
	if r.ClaimEvents != nil {
		b = b.WatchesRawSource(source.Channel(r.ClaimEvents, &handler.EnqueueRequestForObject{}))
	}
	return b.Complete(r)
}

// claimsForTemplate wakes the claims of a template that still wait for it.
func (r *MachineClaimReconciler) claimsForTemplate(ctx context.Context, o client.Object) []reconcile.Request {
	var list hfv1.MachineClaimList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{claimTemplateIndex: o.GetName()}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "List claims of template", "HypervisorMachineTemplate", klog.KObj(o))
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		c := &list.Items[i]
		if c.Status.VMRef == nil {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(c)})
		}
	}
	return out
}

// Reconcile implements reconcile.Reconciler: it opens the claim's scope,
// runs the deletion or the normal phases, and closes the scope, which
// derives the status and writes the claim once.
func (r *MachineClaimReconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	claim := &hfv1.MachineClaim{}
	if err := r.Client.Get(ctx, req.NamespacedName, claim); err != nil {
		if apierrors.IsNotFound(err) {
			r.forgetName(req.NamespacedName)
			r.stuck.set(req.NamespacedName, "", false)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	r.trackName(req.NamespacedName, claim.UID)
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues("MachineClaim", klog.KObj(claim)))
	if res, stale := r.waitForCache(ctx, claim); stale {
		// The watch event of our own last write is on its way.
		return res, nil
	}
	s := r.newClaimScope(claim)
	defer func() { res, retErr = r.closeScope(ctx, s, res, retErr) }()

	if !claim.DeletionTimestamp.IsZero() {
		return runPhases(ctx, s, r.restoreReservation, r.holdFinalizer, r.beginDeletion, r.deleteVMPhase, r.releaseRunnerPhase, r.removeFinalizerPhase)
	}
	return runPhases(ctx, s, r.restoreReservation, r.ensureMetadata, r.handleEnd, r.refuseUnsupported,
		r.loadDependencies, r.connectProvider, r.watchRunning, r.ensureAddress, r.ensureVM)
}

// ensureMetadata adds the finalizer and the standard labels (in memory;
// the scope writes them, or ensureVM before its clone request).
func (r *MachineClaimReconciler) ensureMetadata(ctx context.Context, s *claimScope) (ctrl.Result, bool, error) {
	if s.claim.IsFinished() {
		return ctrl.Result{}, false, nil
	}
	setStandardMetadata(s.claim, r.clusterOf(ctx, s.claim))
	return ctrl.Result{}, true, nil
}

// refuseUnsupported stops a claim that sets a field this operator does
// not act on, before anything is built; a spec change wakes it.
func (r *MachineClaimReconciler) refuseUnsupported(_ context.Context, s *claimScope) (ctrl.Result, bool, error) {
	claim := s.claim
	if ref := claimRefusal(claim); ref != nil && claim.Status.VMRef == nil {
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, ref.reason, ref.message)
		return ctrl.Result{}, false, nil
	}
	return ctrl.Result{}, true, nil
}

// clusterOf names the claim's HypervisorCluster: where its VM is, else
// where its template points (empty when the template is missing).
func (r *MachineClaimReconciler) clusterOf(ctx context.Context, claim *hfv1.MachineClaim) string {
	if ref := claim.Status.VMRef; ref != nil {
		return ref.HypervisorCluster
	}
	tmpl := &hfv1.HypervisorMachineTemplate{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: claim.Spec.TemplateRef.Name}, tmpl); err != nil {
		return ""
	}
	return tmpl.Spec.HypervisorClusterRef.Name
}

// removeFinalizer drops the claim's finalizer and writes it at once,
// under the scope's optimistic lock: a copy from a stale cache must fail
// with a conflict rather than drop a finalizer someone added since.
func (r *MachineClaimReconciler) removeFinalizer(ctx context.Context, s *claimScope) error {
	claim := s.claim
	if !controllerutil.ContainsFinalizer(claim, hfv1.MachineClaimFinalizer) {
		return nil
	}
	controllerutil.RemoveFinalizer(claim, hfv1.MachineClaimFinalizer)
	if err := s.patch.PatchMetadata(ctx, claim); err != nil {
		controllerutil.AddFinalizer(claim, hfv1.MachineClaimFinalizer)
		return fmt.Errorf("remove finalizer %s from MachineClaim %s/%s: %w", hfv1.MachineClaimFinalizer, claim.Namespace, claim.Name, err)
	}
	return nil
}
