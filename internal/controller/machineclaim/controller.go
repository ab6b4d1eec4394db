package machineclaim

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/cachelag"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim/stuck"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/ipam"
	"github.com/hyperfleet/hyperfleet/internal/isolation"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/quota"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider/pace"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
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
	// specCatchUp is how long a claim waits before looking again at a
	// cluster whose controller has not applied its spec yet: one pass of
	// that controller, usually milliseconds (nothing wakes the claim).
	specCatchUp = time.Second
)

// resyncRunning is runningResync plus up to half of it again, at random.
func resyncRunning() time.Duration {
	return runningResync + time.Duration(rand.Int64N(int64(runningResync/2)))
}

// CIPlatforms is the claim's way to its CI platform (GitHub Actions first;
// internal/workloads.Platforms): the platforms' back-ends, and the
// registration of the claim's runner.
//
// Workloads are the back-ends by workload type (pkg/workload), which read
// the claims' and templates' runner settings; a nil *workload.Backends
// has none.
//
// BootstrapVars fills in the workload part of a VM's cloud-init variables
// (runner name, labels) right before the cloud-init is rendered, once per
// delivery; it may record what it issued (never a secret) in
// claim.Status.Bootstrap, which the claim controller persists. The
// workload side reports the runner online by setting the claim's
// Bootstrapped condition to True, which makes the claim Ready.
//
// Release undoes the registration when the claim goes; it returns an error
// matching workload.ErrRunnerBusy while the runner runs a job.
type CIPlatforms interface {
	Workloads() *workload.Backends
	BootstrapVars(ctx context.Context, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate, vars *cloudinit.Vars) error
	Release(ctx context.Context, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate) error
}

// Reconciler turns each MachineClaim into one owned VM and
// removes the VM when the claim goes away or the VM powers off.
type Reconciler struct {
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
	// CI is the claims' CI platforms: their back-ends and their runners'
	// registrations. Nil (unit tests) serves none: nothing registers or
	// releases a runner, and no back-end reads the objects' runner
	// settings (a claim naming a workload type is refused).
	CI CIPlatforms
	// Agent finds the agent binaries the operator serves (templates with
	// agentSource Operator); nil when it serves none.
	Agent vmspec.AgentLocator
	// IsolationOperator is what every isolation policy lets VMs reach of
	// the operator (its agent server's port), and Resolver resolves the
	// host names of templates' proxies for their policies (nil: the
	// system's resolver).
	IsolationOperator isolation.Operator
	Resolver          isolation.Resolver
	// Identity issues the VMs' SPIFFE identities and hands them their
	// runner credentials (identity_service.go, identity_store.go,
	// guestsecrets.go).
	Identity IdentityService
	// ClaimEvents carries wake-ups from the HypervisorCluster poller and
	// the RunnerPool resync.
	ClaimEvents <-chan event.GenericEvent
	// Runners are the latest runner observations of the RunnerPool resync;
	// nil when nothing observes runners.
	Runners *RunnerObservations
	// MaxConcurrentReconciles bounds parallel reconciles (default 16):
	// reconciles never wait for the hypervisor, so they are short.
	MaxConcurrentReconciles int
	// Retry is the backoff (2s, 4s, 8s ... up to 5 minutes) after
	// transient failures.
	Retry RetryDelays
	// Stuck reports stuck claims and counts them by phase; its Bounds are
	// how long a claim may stay in each phase before it is reported Stuck
	// (zero fields check nothing). SetupWithManager gives it the
	// reconciler's Recorder.
	Stuck stuck.Detector
	// PowerOff is what is known of VMs powering off: the hints that they
	// are about to, the notices they send, and what the notices say
	// (transitions.go, guest_refusal.go).
	PowerOff PowerOff
	// Vanished hands the VM of a claim the API server removed while it
	// still carried the finalizer to the orphan sweeper (vanished.go).
	Vanished VanishedClaims
	// DNS registers the claims' VMs in their clusters' DNS services
	// (dns.go).
	DNS DNSRegistration
	// Quota admits claims within their namespace's quota on their cluster
	// (quota.go); nil: a ledger over the cache, made on first use.
	Quota *quota.Ledger

	// memory is what this process remembers about each claim beyond its
	// stored status (memory.go), dropped as a whole by forget.
	memory claimMemory
	// resumes learns how long each cluster takes to resume a standby
	// VM, by cluster name (paceResume).
	resumes pace.Tasks
	// lag keeps a reconcile from repeating a step against a cache older
	// than this controller's last write of the claim (a second cloud-init
	// delivery would issue a second runner credential), and drops a gone
	// claim's memory.
	lag cachelag.Tracker
	// finished sends the collection deletions of finished claims
	// (finished.go).
	finished finishedDeletes
	// validation runs the claims' validation rounds off the reconcile
	// path (validation.go).
	validation validations
	// quotaOnce makes the ledger; quotaWake wakes claims that waited for
	// quota when a charge is released (quota.go).
	quotaOnce sync.Once
	quotaWake chan event.GenericEvent
}

// waitForCache reports whether the cache still shows the claim older than
// this controller's last write, with the requeue to wait for it.
func (r *Reconciler) waitForCache(ctx context.Context, claim *hfv1.MachineClaim) (ctrl.Result, bool) {
	wait, stale, reads := r.lag.Stale(claim)
	if reads == cachelag.ReportAfter {
		ctrl.LoggerFrom(ctx).Info("The cache still shows an older version of the claim than this controller wrote; waiting for it",
			"resourceVersion", claim.ResourceVersion, "waits", reads)
	}
	return ctrl.Result{RequeueAfter: wait}, stale
}

// forget drops the rest of a gone claim's memory (the lag tracker dropped
// its own): a reconcile found its name gone, or taken by a new claim.
func (r *Reconciler) forget(uid types.UID) {
	r.memory.Forget(uid)
	r.ledger().Forget(uid)
	// The runner observations are the RunnerPool resync's, which writes
	// them; the claim's is dropped with the rest.
	r.Runners.Forget(uid)
}

// workloads are the CI platforms' back-ends; none without CI.
func (r *Reconciler) workloads() *workload.Backends {
	if r.CI == nil {
		return nil
	}
	return r.CI.Workloads()
}

// SetupWithManager registers the controller.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.MaxConcurrentReconciles == 0 {
		r.MaxConcurrentReconciles = 16
	}
	r.Stuck.Recorder = r.Recorder
	r.Stuck.Reset()
	b := ctrl.NewControllerManagedBy(mgr).
		For(&hfv1.MachineClaim{}).
		Watches(&hfv1.HypervisorMachineTemplate{}, handler.EnqueueRequestsFromMapFunc(r.claimsForTemplate),
			builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.ResourceVersionChangedPredicate{}))).
		Watches(&hfv1.CIJob{}, handler.EnqueueRequestsFromMapFunc(r.claimsForJob)).
		Watches(&hfv1.MachineClaim{}, r.Vanished.handler()).
		Watches(&hfv1.MachineClaim{}, r.quotaHandler()).
		Watches(&hfv1.IPPool{}, handler.EnqueueRequestsFromMapFunc(r.disownedClaimsOfPool),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.MaxConcurrentReconciles}).
		Named("machineclaim")
	if r.ClaimEvents != nil {
		b = b.WatchesRawSource(source.Channel(r.ClaimEvents, &handler.EnqueueRequestForObject{}))
	}
	// A finished validation round wakes its claim to be recorded.
	r.validation.wake = make(chan event.GenericEvent, 256)
	b = b.WatchesRawSource(source.Channel(r.validation.wake, &handler.EnqueueRequestForObject{}))
	// A released quota charge wakes the claims it held back.
	r.quotaWake = make(chan event.GenericEvent, 256)
	b = b.WatchesRawSource(source.Channel(r.quotaWake, &handler.EnqueueRequestForObject{}))
	return b.Complete(r)
}

// claimsForTemplate wakes the claims of a template that still wait for it.
func (r *Reconciler) claimsForTemplate(ctx context.Context, o client.Object) []reconcile.Request {
	var list hfv1.MachineClaimList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{fieldindex.ClaimTemplate: o.GetName()}); err != nil {
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
// runs the phase list of the claim's state (claimPhases), and closes the
// scope, which derives the status and writes the claim once.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	r.Vanished.handOver(ctx, req.NamespacedName, r.Signer, &r.memory)
	claim := &hfv1.MachineClaim{}
	if err := r.Client.Get(ctx, req.NamespacedName, claim); err != nil {
		if apierrors.IsNotFound(err) {
			if uid, ok := r.lag.Gone(req.NamespacedName); ok {
				r.forget(uid)
			}
			r.Stuck.Forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if uid, ok := r.lag.Observe(req.NamespacedName, claim.UID); ok {
		r.forget(uid)
	}
	if r.memory.recall(claim.UID).deletedGone {
		// Deleted by this controller; the cache has not seen it go yet.
		return ctrl.Result{}, nil
	}
	if finishedPending(claim) {
		// Finished, its deletion lost (a restart, a failed collection
		// deletion): nothing is left to release (finished.go).
		return ctrl.Result{}, r.deleteFinished(ctx, claim.Namespace)
	}
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues("MachineClaim", klog.KObj(claim)))
	if res, stale := r.waitForCache(ctx, claim); stale {
		// The watch event of our own last write is on its way.
		return res, nil
	}
	s := r.newClaimScope(claim)
	s.restoreHeldEnd()
	defer func() { res, retErr = r.closeScope(ctx, s, res, retErr) }()

	return phase.Run(ctx, s, r.claimPhases(claim)...)
}

// claimPhases is the phase list of a pass (docs/architecture.md, "The
// claim's reconcile"): a claim a platform admin force-deleted or disowned
// runs the list of that action (adminPhases, admin.go); a deleted claim
// runs the deletion list; any other runs the shared prefix, then the list
// of its state (runStateList).
func (r *Reconciler) claimPhases(claim *hfv1.MachineClaim) []phase.Func[*claimScope] {
	if list := r.adminPhases(claim); list != nil {
		return list
	}
	if !claim.DeletionTimestamp.IsZero() {
		return []phase.Func[*claimScope]{r.checkAdminAnnotations, r.checkReservation, r.checkFinalizer, r.checkDeletion, r.runner().recordLateJob, r.DNS.release, r.releaseVM,
			r.releaseRunner, r.Identity.release, r.DNS.hold, r.releaseFinalizer}
	}
	return []phase.Func[*claimScope]{r.checkAdminAnnotations, r.checkReservation, r.ensureMetadata, r.Identity.checkMisuse, r.checkEndRequest, r.runStateList}
}

// buildPhases build a claim's VM: the claim is neither ended nor
// provisioned.
func (r *Reconciler) buildPhases() []phase.Func[*claimScope] {
	return []phase.Func[*claimScope]{r.checkSupported, r.loadDependencies, r.checkPlatformSection, r.loadProvider, r.checkTemplate,
		r.ensureAddress, r.ensureIdentity, r.ensureVM}
}

// runningPhases watch a provisioned claim: its DNS records, its
// validation (right after the cluster is loaded, so that a finished round
// is recorded even while a later phase waits), its secrets placed, its
// attestation, its VM and its runner; checkRunning ends every
// such pass. A standby claim's VM is suspended, or resumed, once its
// template and cluster are loaded (holdStandby, standby.go): one that
// stands by runs nothing after that.
// checkSupported acts only on a claim without a VM reference.
func (r *Reconciler) runningPhases() []phase.Func[*claimScope] {
	return []phase.Func[*claimScope]{r.checkSupported, r.DNS.ensure, r.loadDependencies, r.loadProvider, r.holdStandby, r.validation.checkNetwork,
		r.ensureSecrets, r.Identity.checkAttestation, r.ensureStoredCredential, r.rereadResumedAddresses, r.checkRunning}
}

// endPhases tear an ended claim down, its DNS records first (dns.go),
// after recording a job whose CIJob came after the VM ended.
func (r *Reconciler) endPhases() []phase.Func[*claimScope] {
	return []phase.Func[*claimScope]{r.runner().recordLateJob, r.DNS.release, r.releaseEnded}
}

// runStateList runs the list of the claim's state after the shared prefix:
// ended -> endPhases, provisioned -> runningPhases, else buildPhases. A
// phase of those two that finds the claim's end records it and stops; the
// end list then runs in this same pass, with no requeue in between, and
// the wishes of the phases that ran are kept.
func (r *Reconciler) runStateList(ctx context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	if claim.Ended() {
		return phase.Sequence(r.endPhases()...)(ctx, s)
	}
	list := r.buildPhases()
	provisioned := s.facts.isTrue(claim, hfv1.MachineClaimProvisionedCondition)
	if provisioned {
		list = r.runningPhases()
	}
	res, err := phase.Sequence(list...)(ctx, s)
	if err == nil && !provisioned && !claim.Ended() && s.facts.isTrue(claim, hfv1.MachineClaimProvisionedCondition) {
		// The VM came up in this pass: its running phases (its DNS
		// records, the network check, its secrets placed) run now, so
		// that the VM's being up and its credential's delivery are one
		// status write rather than two.
		if st := claim.Status.Standby; st != nil && st.ResumedAt != nil && !claim.Spec.Standby {
			metrics.StandbyResumeSeconds.Observe(s.clock.Now().Sub(st.ResumedAt.Time).Seconds())
		}
		res, err = phase.Sequence(r.runningPhases()...)(ctx, s)
	}
	if err != nil || !claim.Ended() {
		return res, err
	}
	end, err := phase.Sequence(r.endPhases()...)(ctx, s)
	return end.Sooner(res.After()), err
}
