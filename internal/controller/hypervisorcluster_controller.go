package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/patch"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

const (
	defaultPollInterval = 5 * time.Second
	// defaultProbeTimeout bounds a probe when spec.probeTimeout is unset
	// (its CRD default): a partition is seen about three of them in.
	defaultProbeTimeout = 10 * time.Second
	// clusterWorkers reconcile different clusters at once: one cluster
	// whose probe hangs until its timeout must not delay the polls of the
	// others (one cluster is never reconciled twice at once).
	clusterWorkers = 4
	// maxProbeBackoff caps the retry interval of an unreachable cluster.
	maxProbeBackoff = 5 * time.Minute
	// lastPollRefresh bounds how often status.lastPollTime alone is
	// written: polling every few seconds must not write the API server
	// every few seconds.
	lastPollRefresh = time.Minute
	// toleratedProbeFailures is how many transient probe failures in a row
	// a Ready cluster absorbs (retrying every second) before it is marked
	// down.
	toleratedProbeFailures = 3
)

// HypervisorClusterReconciler connects to each HypervisorCluster, reports
// its health, nodes and capacity, and polls its VM list once per interval
// for shutdown detection and the orphan sweep (docs/architecture.md,
// "Polling O(clusters)").
type HypervisorClusterReconciler struct {
	Client   client.Client
	Registry *hypervisors.Registry
	// Factories build a Provider per hypervisor kind: the registered
	// kinds' own in the operator (manager.Options.Factories), substitutes
	// in tests. The kinds' sections of the API are read by the registered
	// kinds (provider.KindOf) either way.
	Factories map[hfv1.HypervisorProvider]provider.Factory
	Signer    *ownership.Signer
	Recorder  record.EventRecorder
	Clock     clock.PassiveClock
	// ClaimEvents wakes the MachineClaim controller for claims whose VM
	// changed state in a listing, or whose cluster became Ready.
	ClaimEvents chan<- event.GenericEvent
	// Identity holds the clusters' SPIRE servers (spec.spire); nil leaves
	// spec.spire unchecked (SPIREConnected unset).
	Identity *identity.Registry
	// Unverified reports the VMs carrying this install's tag whose
	// ownership block does not verify (the orphan sweeper reads them);
	// nil leaves the UnverifiedVMs condition unset.
	Unverified UnverifiedVMReporter
	// SecretVersions reads the Secrets' metadata from the manager's
	// metadata-only Secret watch (SetupWithManager sets the manager's
	// cache); nil re-reads the credentials from the API server every poll.
	SecretVersions client.Reader
	// DNS holds each cluster's DNS registrar (spec.dns.dnsProvider), built
	// and checked by this controller, for the claim controller and the
	// sweep; nil leaves spec.dns.dnsProvider unchecked (DNSReady unset)
	// and no VM registered. DNSFactories are the DNS back-ends by type.
	DNS          *dnsreg.Clusters
	DNSFactories map[hfv1.DNSProviderType]dnsreg.Factory
	// DNSKubernetes is the API access the DNS back-ends that write
	// Kubernetes objects are built with (the external-dns types'
	// DNSEndpoints): an uncached client and the operator's namespace.
	DNSKubernetes *dnsreg.Kubernetes

	// connectedAt keeps the key (credentialsKey) each cluster's provider
	// was connected at: while it holds, the poll uses the connected
	// provider, which holds the credentials anyway, and reads no Secret.
	connectedAt sync.Map // cluster name -> string
	// deprecationsReported keeps the generation ("UID/generation") whose
	// deprecated fields each cluster was told about (reportDeprecated).
	deprecationsReported sync.Map // cluster name -> string
}

// UnverifiedVMReporter knows, per cluster, the VMs carrying this install's
// tag whose ownership block does not verify (internal/sweeper.Sweeper).
type UnverifiedVMReporter interface {
	// Unverified returns those VMs with the reason, by VM id; swept is
	// false while the cluster has not been looked at yet.
	Unverified(cluster string) (vms map[provider.ID]string, swept bool)
	// Forget drops a deleted cluster.
	Forget(cluster string)
}

// maxUnverifiedListed bounds the VMs the UnverifiedVMs message names.
const maxUnverifiedListed = 5

// notStatusOnly drops the updates of a cluster that changed only its
// status (the poll's own writes): each would start one more poll, with its
// Proxmox calls, before the interval's.
func notStatusOnly() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld, e.ObjectNew
		return o.GetGeneration() != n.GetGeneration() || o.GetUID() != n.GetUID() ||
			!o.GetDeletionTimestamp().Equal(n.GetDeletionTimestamp()) ||
			!slices.Equal(o.GetFinalizers(), n.GetFinalizers()) ||
			!maps.Equal(o.GetLabels(), n.GetLabels()) || !maps.Equal(o.GetAnnotations(), n.GetAnnotations())
	}}
}

// SetupWithManager registers the controller.
func (r *HypervisorClusterReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.SecretVersions == nil {
		r.SecretVersions = mgr.GetCache()
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&hfv1.HypervisorCluster{}, builder.WithPredicates(notStatusOnly())).
		WatchesMetadata(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.clustersForSecret)).
		Named("hypervisorcluster").
		WithOptions(controller.Options{MaxConcurrentReconciles: clusterWorkers}).
		Complete(r)
}

func (r *HypervisorClusterReconciler) clustersForSecret(ctx context.Context, o client.Object) []reconcile.Request {
	var list hfv1.HypervisorClusterList
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues("Secret", klog.KObj(o)))
	return listRequests(ctx, r.Client, &list, func() []hfv1.HypervisorCluster { return list.Items }, "clusters for Secret",
		client.MatchingFields{fieldindex.ClusterSecret: o.GetNamespace() + "/" + o.GetName()})
}

// clusterScope is one reconcile of one HypervisorCluster: the cluster,
// what its phases found, and the patch helper its close writes with.
type clusterScope struct {
	cluster *hfv1.HypervisorCluster
	patch   *patch.Helper
	// wasReady is the cluster's health in the registry as the pass began:
	// events and claim wake-ups fire when it changes.
	wasReady bool
	// provider (connectProvider), info (probe) and vms (listVMs) are what
	// the connection found so far.
	provider provider.Provider
	info     *provider.ClusterInfo
	vms      []provider.VMSummary
	// ready is what the connection found Ready to be; hold is the in-use
	// hold of a deleted cluster, which Ready says instead.
	ready, hold *readiness
}

// Reconcile implements reconcile.Reconciler: it opens the cluster's scope,
// runs the deletion or the normal phases, and closes the scope, which sets
// Ready and writes the cluster once.
func (r *HypervisorClusterReconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, err error) {
	cluster := &hfv1.HypervisorCluster{}
	ctx, done, err := clusterInUse(cluster).open(ctx, r.Client, req, "HypervisorCluster", func() { r.forget(req.Name) })
	if done {
		return ctrl.Result{}, err
	}
	s := r.newClusterScope(cluster)
	defer func() { res, err = r.closeClusterScope(ctx, s, res, err) }()

	if !cluster.DeletionTimestamp.IsZero() {
		return phase.Run(ctx, s, r.holdWhileUsed, r.keepConnection)
	}
	return phase.Run(ctx, s, slices.Concat([]phase.Func[*clusterScope]{r.reportDeprecated, r.reportTenancy, r.connectSPIRE, r.checkDNS}, r.connection())...)
}

// connection are the phases that connect to the cluster, report its
// health and poll its VM list (hypervisorcluster_phases.go).
func (r *HypervisorClusterReconciler) connection() []phase.Func[*clusterScope] {
	return []phase.Func[*clusterScope]{r.connectProvider, r.probe, r.listVMs, r.recordListing}
}

// newClusterScope opens the scope of one reconcile. Its patch carries an
// optimistic lock: a copy from a stale cache must not drop a finalizer
// added since (a merge patch replaces the whole list).
func (r *HypervisorClusterReconciler) newClusterScope(cluster *hfv1.HypervisorCluster) *clusterScope {
	return &clusterScope{
		cluster:  cluster,
		patch:    patch.NewHelper(r.Client, cluster, patch.WithOptimisticLock()),
		wasReady: r.Registry.Health(cluster.Name).Ready,
	}
}

// closeClusterScope sets Ready from what the pass found (the in-use hold
// of a deleted cluster first, then the connection) and writes the cluster
// once (writeScope). A cluster the pass let go is not written again.
func (r *HypervisorClusterReconciler) closeClusterScope(ctx context.Context, s *clusterScope, res ctrl.Result, err error) (ctrl.Result, error) {
	cluster := s.cluster
	if released(cluster, hfv1.HypervisorClusterFinalizer) {
		return res, err
	}
	cmp.Or(s.hold, s.ready).setOn(&cluster.Status.Conditions, cluster.Generation)
	if perr := writeScope(ctx, s.patch, cluster, &cluster.Status.ObservedGeneration, err); perr != nil {
		return ctrl.Result{}, errors.Join(err, perr)
	}
	return res, err
}

// forget drops what memory holds about a cluster that is gone.
func (r *HypervisorClusterReconciler) forget(name string) {
	r.Registry.Remove(name)
	r.connectedAt.Delete(name)
	r.deprecationsReported.Delete(name)
	r.forgetSPIRE(name)
	if r.DNS != nil {
		r.DNS.Remove(name)
	}
	metrics.ForgetCluster(name)
	if r.Unverified != nil {
		r.Unverified.Forget(name)
	}
}

// clusterInUse is the cluster as claims' VMs use it.
func clusterInUse(cluster *hfv1.HypervisorCluster) inUse {
	return inUse{obj: cluster, conditions: &cluster.Status.Conditions, finalizer: hfv1.HypervisorClusterFinalizer, usage: "MachineClaims with VMs on this cluster"}
}

// holdWhileUsed holds a deleted cluster while claims have VMs on it, and
// forgets it once it let it go.
func (r *HypervisorClusterReconciler) holdWhileUsed(ctx context.Context, s *clusterScope) (phase.Result, error) {
	cluster := s.cluster
	var claims hfv1.MachineClaimList
	if err := r.Client.List(ctx, &claims, client.MatchingFields{fieldindex.ClaimCluster: cluster.Name}); err != nil {
		return phase.Stop(), fmt.Errorf("list the claims with VMs on HypervisorCluster %s: %w", cluster.Name, err)
	}
	hold, err := clusterInUse(cluster).releaseWhenUnused(ctx, s.patch, r.Recorder, claimNames(claims.Items, func(*hfv1.MachineClaim) bool { return true }))
	switch {
	case err != nil:
		return phase.Stop(), err
	case hold != nil:
		s.hold = hold
		return phase.Next(), nil
	}
	r.forget(cluster.Name)
	return phase.Stop(), nil
}

// keepConnection keeps a held cluster's connection, polled at its
// interval: the claims' finalizers need it to destroy their VMs.
func (r *HypervisorClusterReconciler) keepConnection(ctx context.Context, s *clusterScope) (phase.Result, error) {
	if _, err := phase.Run(ctx, s, r.connection()...); err != nil {
		return phase.Stop(), err
	}
	return phase.StopAndRequeue(pollInterval(s.cluster)), nil
}

// wakeWaitingClaims enqueues the claims that wait for this cluster.
func (r *HypervisorClusterReconciler) wakeWaitingClaims(ctx context.Context, cluster string) {
	var claims hfv1.MachineClaimList
	if err := r.Client.List(ctx, &claims, client.MatchingLabels{hfv1.HypervisorClusterLabel: cluster}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "List claims waiting for cluster")
		return
	}
	for i := range claims.Items {
		r.sendClaimEvent(ctx, &claims.Items[i])
	}
}

// notifyChangedVMs wakes the claims whose VM stopped or vanished since the
// previous listing (shutdown detection), and claims whose stopped VM was
// already stopped but whose claim still believes it runs (a restarted
// operator, a missed event, or a VM that started and powered off between
// two listings, so that both showed it stopped).
func (r *HypervisorClusterReconciler) notifyChangedVMs(ctx context.Context, cluster string, prev *hypervisors.Listing, vms []provider.VMSummary) {
	if r.ClaimEvents == nil {
		return
	}
	seen := make(map[provider.ID]bool, len(vms))
	for _, vm := range vms {
		seen[vm.ID] = true
		if vm.Template || vm.Power != provider.PowerStopped {
			continue
		}
		if old, ok := prev.VM(vm.ID); ok && old.Power == provider.PowerStopped {
			// Already stopped last time: its claim was woken then, unless
			// it was then still being built (a clone is stopped until it
			// starts). A claim that is provisioned now and still sees its
			// VM stopped ran for less than a poll interval: wake it, or it
			// would wait for its own resync (minutes). A claim still
			// being built is not woken again: its build goes on by itself.
			r.wakeClaimOfVM(ctx, cluster, vm.ID, provisionedOnly)
			continue
		}
		r.wakeClaimOfVM(ctx, cluster, vm.ID, anyClaim)
	}
	if prev == nil {
		return
	}
	for _, old := range prev.VMs {
		if !seen[old.ID] {
			r.wakeClaimOfVM(ctx, cluster, old.ID, anyClaim)
		}
	}
}

// Which claims of a VM wakeClaimOfVM wakes.
const (
	anyClaim        = false
	provisionedOnly = true
)

// wakeClaimOfVM sends the claim whose VM vm is (from the cache's index) to
// the claim controller; with provisionedOnly, only a claim that believes
// its VM runs (Provisioned=True, not ended, not being deleted).
func (r *HypervisorClusterReconciler) wakeClaimOfVM(ctx context.Context, cluster string, vm provider.ID, onlyProvisioned bool) {
	var claims hfv1.MachineClaimList
	if err := r.Client.List(ctx, &claims, client.MatchingFields{fieldindex.ClaimVM: fieldindex.VMKey(cluster, string(vm))}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "List claim of VM", "vm", vm)
		return
	}
	for i := range claims.Items {
		c := &claims.Items[i]
		if onlyProvisioned && (!c.DeletionTimestamp.IsZero() || c.Ended() ||
			!meta.IsStatusConditionTrue(c.Status.Conditions, string(hfv1.MachineClaimProvisionedCondition))) {
			continue
		}
		r.sendClaimEvent(ctx, c)
	}
}

// wakeQueuedClaim asks the claim controller to go on with a claim whose
// VM waited for a clone slot that is free now. It never blocks (the
// provider calls it from a reconcile): if the channel is full, the claim's
// own retry (a second) covers it.
func (r *HypervisorClusterReconciler) wakeQueuedClaim(o provider.Owner) {
	if r.ClaimEvents == nil {
		return
	}
	c := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: o.Name}}
	select {
	case r.ClaimEvents <- event.GenericEvent{Object: c}:
	default:
	}
}

func (r *HypervisorClusterReconciler) sendClaimEvent(ctx context.Context, c *hfv1.MachineClaim) {
	if r.ClaimEvents == nil {
		return
	}
	select {
	case r.ClaimEvents <- event.GenericEvent{Object: c}:
	case <-ctx.Done():
	}
}

func pollInterval(c *hfv1.HypervisorCluster) time.Duration {
	if c.Spec.PollInterval != nil && c.Spec.PollInterval.Duration > 0 {
		return c.Spec.PollInterval.Duration
	}
	return defaultPollInterval
}

func probeTimeout(c *hfv1.HypervisorCluster) time.Duration {
	if c.Spec.ProbeTimeout != nil && c.Spec.ProbeTimeout.Duration > 0 {
		return c.Spec.ProbeTimeout.Duration
	}
	return defaultProbeTimeout
}

// probeBackoff is 5s, 10s, 20s ... capped at maxProbeBackoff.
func probeBackoff(failures int) time.Duration {
	d := defaultPollInterval
	for i := 1; i < failures && d < maxProbeBackoff; i++ {
		d *= 2
	}
	return min(d, maxProbeBackoff)
}
