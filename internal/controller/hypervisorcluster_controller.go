package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/clusterconfig"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/patch"
	"github.com/hyperfleet/hyperfleet/internal/secretref"
	"github.com/hyperfleet/hyperfleet/internal/tenancy"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

const (
	defaultPollInterval = 5 * time.Second
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
	// Factories builds a Provider per hypervisor kind.
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

	// connectedAt keeps the key (credentialsKey) each cluster's provider
	// was connected at: while it holds, the poll uses the connected
	// provider, which holds the credentials anyway, and reads no Secret.
	connectedAt sync.Map // cluster name -> string
}

// UnverifiedVMReporter knows, per cluster, the VMs carrying this install's
// tag whose ownership block does not verify (internal/sweeper.Sweeper).
type UnverifiedVMReporter interface {
	// Unverified returns those VMs with the reason, by VM id; swept is
	// false while the cluster has not been looked at yet.
	Unverified(cluster string) (vms map[int]string, swept bool)
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
		Complete(r)
}

func (r *HypervisorClusterReconciler) clustersForSecret(ctx context.Context, o client.Object) []reconcile.Request {
	var list hfv1.HypervisorClusterList
	if err := r.Client.List(ctx, &list, client.MatchingFields{clusterSecretIndex: o.GetNamespace() + "/" + o.GetName()}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "List clusters for Secret", "Secret", klog.KObj(o))
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return out
}

// Reconcile implements reconcile.Reconciler.
func (r *HypervisorClusterReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	cluster := &hfv1.HypervisorCluster{}
	if err := r.Client.Get(ctx, req.NamespacedName, cluster); err != nil {
		if apierrors.IsNotFound(err) {
			r.Registry.Remove(req.Name)
			r.connectedAt.Delete(req.Name)
			r.forgetSPIRE(req.Name)
			metrics.ForgetCluster(req.Name)
			if r.Unverified != nil {
				r.Unverified.Forget(req.Name)
			}
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	// Optimistic lock: a stale copy must not drop a finalizer added since
	// (a merge patch replaces the whole list).
	h := patch.NewHelper(r.Client, cluster, patch.WithOptimisticLock())
	if !cluster.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, h, cluster)
	}
	if wrote, err := clusterInUse(cluster).ensureFinalizer(ctx, h); wrote || err != nil {
		return ctrl.Result{}, err
	}

	tenancy.SetCondition(cluster)
	r.reconcileSPIRE(ctx, cluster)
	result, err := r.reconcileConnection(ctx, cluster)
	if perr := h.PatchStatus(ctx, cluster); perr != nil {
		log.Error(perr, "Patch HypervisorCluster status")
		return ctrl.Result{}, perr
	}
	return result, err
}

func (r *HypervisorClusterReconciler) reconcileConnection(ctx context.Context, cluster *hfv1.HypervisorCluster) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	name := cluster.Name
	wasReady := r.Registry.Health(name).Ready

	if ref := clusterRefusal(cluster); ref != nil {
		// Not Ready in the registry too, so that claims wait for the
		// cluster (ClusterUnavailable, with this message) instead of
		// getting VMs that would lack what the field promises.
		r.markRefused(cluster, ref, wasReady)
		return ctrl.Result{}, nil
	}
	p, err := r.connect(ctx, cluster, wasReady)
	switch {
	case err != nil:
		return ctrl.Result{}, err
	case p == nil:
		return ctrl.Result{RequeueAfter: maxProbeBackoff}, nil
	}

	info, err := p.Probe(ctx)
	if err != nil && wasReady && provider.Classify(err) == provider.ClassTransient {
		// One dropped request or 5xx must not pause every claim on the
		// cluster: retry soon, and only a run of failures marks it down.
		if n := r.Registry.RecordFailure(name); n < toleratedProbeFailures {
			log.V(1).Info("Probe failed, retrying before marking the cluster down", "failures", n, "err", err.Error())
			return ctrl.Result{RequeueAfter: time.Second}, nil
		}
	}
	if err != nil {
		reason := probeFailureReason(err)
		failures := r.markDown(cluster, reason, err.Error(), wasReady)
		backoff := probeBackoff(failures)
		log.Info("HypervisorCluster unreachable, retrying", "reason", reason, "retryAfter", backoff, "err", err.Error())
		return ctrl.Result{RequeueAfter: backoff}, nil
	}

	vms, err := p.ListVMs(ctx)
	if err != nil && wasReady && provider.Classify(err) == provider.ClassTransient {
		if n := r.Registry.RecordFailure(name); n < toleratedProbeFailures {
			return ctrl.Result{RequeueAfter: time.Second}, nil
		}
	}
	if err != nil {
		failures := r.markDown(cluster, hfv1.UnreachableReason, fmt.Sprintf("list VMs: %v", err), wasReady)
		return ctrl.Result{RequeueAfter: probeBackoff(failures)}, nil
	}
	now := r.Clock.Now()
	prev := r.Registry.SetListing(name, vms, now)
	r.Registry.SetHealth(name, hypervisors.Health{Ready: true}, now)
	metrics.ClusterConnected.WithLabelValues(name).Set(1)
	r.setConnectedStatus(cluster, info, now)
	r.setUnverifiedCondition(cluster)
	if !wasReady {
		r.Recorder.Eventf(cluster, corev1.EventTypeNormal, "Connected", "Connected to %s (version %s, %d nodes)", cluster.Spec.Endpoint, info.Version, len(info.Nodes))
		r.wakeWaitingClaims(ctx, name)
	}
	r.notifyChangedVMs(ctx, name, prev, vms)
	return ctrl.Result{RequeueAfter: pollInterval(cluster)}, nil
}

// connect returns the cluster's provider: the connected one while neither
// the cluster nor its Secrets changed since it was connected (the manager
// caches no Secret contents, internal/manager/secrets.go, so reading the
// credentials is a GET to the API server, which polling every few seconds
// must not repeat), else one connected with the configuration read now. A
// nil provider has been reported in the status (markDown); err is then a
// terminal error or nil.
func (r *HypervisorClusterReconciler) connect(ctx context.Context, cluster *hfv1.HypervisorCluster, wasReady bool) (provider.Provider, error) {
	log := ctrl.LoggerFrom(ctx)
	name := cluster.Name
	key, keyed := r.credentialsKey(ctx, cluster)
	if v, ok := r.connectedAt.Load(name); keyed && ok && v.(string) == key {
		if p, _, connected := r.Registry.Provider(name); connected {
			return p, nil
		}
	}
	r.connectedAt.Delete(name)
	cfg, err := clusterconfig.Resolve(ctx, r.Client, cluster)
	if err != nil {
		reason := hfv1.SecretNotFoundReason
		if !errors.Is(err, secretref.ErrMissing) {
			reason = hfv1.UnreachableReason
		}
		r.markDown(cluster, hfv1.ConditionReason(string(reason)), err.Error(), wasReady)
		// A Secret watch wakes the cluster once the Secret appears.
		return nil, nil
	}
	factory := r.Factories[cluster.Spec.Provider]
	if factory == nil {
		r.markDown(cluster, hfv1.UnreachableReason, fmt.Sprintf("spec.provider: no implementation for %q in this operator build", cluster.Spec.Provider), wasReady)
		return nil, reconcile.TerminalError(fmt.Errorf("no provider for %q", cluster.Spec.Provider))
	}
	p, err := r.Registry.Connect(name, cfg, func() (provider.Provider, error) {
		return factory.New(cfg, provider.Deps{
			Signer:   r.Signer,
			Observer: metrics.NewProviderObserver(name),
			Clock:    r.Clock,
			Log:      log.WithName("provider"),
			Wake:     r.wakeQueuedClaim,
		})
	})
	if err != nil {
		r.markDown(cluster, hfv1.InvalidTLSReason, fmt.Sprintf("spec.tls: %v", err), wasReady)
		return nil, nil
	}
	if keyed {
		r.connectedAt.Store(name, key)
	}
	return p, nil
}

// probeFailureReason names what the user has to look at.
func probeFailureReason(err error) hfv1.ConditionReason {
	switch {
	case errors.Is(err, provider.ErrUnauthorized):
		return hfv1.AuthenticationFailedReason
	case provider.ReasonOf(err) == "TLSVerificationFailed":
		return hfv1.InvalidTLSReason
	case provider.Classify(err) == provider.ClassConfiguration:
		return hfv1.ConditionReason(provider.ReasonOf(err))
	default:
		return hfv1.UnreachableReason
	}
}

// markDown records a failed connection in the registry, status, metrics
// and (on the transition only) events. It returns the failure count.
func (r *HypervisorClusterReconciler) markDown(cluster *hfv1.HypervisorCluster, reason hfv1.ConditionReason, msg string, wasReady bool) int {
	failures := r.Registry.SetHealth(cluster.Name, hypervisors.Health{Ready: false, Reason: string(reason), Message: msg}, r.Clock.Now())
	metrics.ClusterConnected.WithLabelValues(cluster.Name).Set(0)
	conditions.Set(&cluster.Status.Conditions, cluster.Generation, hfv1.HypervisorClusterConnectedCondition, metav1.ConditionFalse, reason, msg)
	conditions.Set(&cluster.Status.Conditions, cluster.Generation, hfv1.ReadyCondition, metav1.ConditionFalse, reason,
		"New VMs on this cluster are paused until it is reachable: "+msg)
	if wasReady || failures == 1 {
		r.Recorder.Event(cluster, corev1.EventTypeWarning, string(reason), conditions.Truncate(msg, 1024))
	}
	return failures
}

// markRefused records a cluster that sets a field the operator does not act
// on: Ready=False with the refusal's reason and message, and new VMs on
// the cluster paused. Connected is left as it was: nothing was tried.
func (r *HypervisorClusterReconciler) markRefused(cluster *hfv1.HypervisorCluster, ref *refusal, wasReady bool) {
	r.Registry.SetHealth(cluster.Name, hypervisors.Health{Ready: false, Reason: string(ref.reason), Message: ref.message}, r.Clock.Now())
	metrics.ClusterConnected.WithLabelValues(cluster.Name).Set(0)
	ready := hfv1.FindCondition(cluster.Status.Conditions, hfv1.ReadyCondition)
	conditions.Set(&cluster.Status.Conditions, cluster.Generation, hfv1.ReadyCondition, metav1.ConditionFalse, ref.reason,
		"New VMs on this cluster are paused: "+ref.message)
	cluster.Status.ObservedGeneration = cluster.Generation
	if wasReady || ready == nil || ready.Reason != string(ref.reason) {
		r.Recorder.Event(cluster, corev1.EventTypeWarning, string(ref.reason), ref.message)
	}
}

func (r *HypervisorClusterReconciler) setConnectedStatus(cluster *hfv1.HypervisorCluster, info *provider.ClusterInfo, now time.Time) {
	st := &cluster.Status
	st.Version = info.Version
	st.Nodes = st.Nodes[:0]
	var online int32
	var availCPU int64
	var availMem int64
	for _, n := range info.Nodes {
		state := hfv1.NodeState("offline")
		if n.Online {
			state = "online"
			online++
		}
		ns := hfv1.NodeStatus{
			Name:  n.Name,
			State: state,
			Capacity: hfv1.ResourceAmounts{
				CPU:     n.CPUs,
				Memory:  resource.NewQuantity(n.MemoryBytes, resource.BinarySI),
				Storage: resource.NewQuantity(n.StorageBytes, resource.BinarySI),
			},
			Allocated: hfv1.ResourceAmounts{
				Memory:  resource.NewQuantity(n.MemoryUsedBytes+n.ReservedMemoryBytes, resource.BinarySI),
				Storage: resource.NewQuantity(n.StorageUsedBytes, resource.BinarySI),
			},
		}
		st.Nodes = append(st.Nodes, ns)
		if n.Online && n.Allowed {
			availCPU += n.CPUs
			if free := n.FreeMemoryBytes(); free > 0 {
				availMem += free
			}
		}
	}
	sort.Slice(st.Nodes, func(i, j int) bool { return st.Nodes[i].Name < st.Nodes[j].Name })
	st.ConnectedNodes = online
	st.AvailableResources = &hfv1.ResourceAmounts{CPU: availCPU, Memory: resource.NewQuantity(availMem, resource.BinarySI),
		Storage: resource.NewQuantity(info.AvailableStorageBytes, resource.BinarySI)}
	if st.LastPollTime == nil || now.Sub(st.LastPollTime.Time) >= lastPollRefresh {
		st.LastPollTime = &metav1.Time{Time: now}
	}

	msg := fmt.Sprintf("Connected: version %s, %d of %d nodes online", info.Version, online, len(info.Nodes))
	conditions.Set(&st.Conditions, cluster.Generation, hfv1.HypervisorClusterConnectedCondition, metav1.ConditionTrue, hfv1.ReadyReason, msg)
	if info.InsecureTLS {
		conditions.Set(&st.Conditions, cluster.Generation, hfv1.HypervisorClusterTLSVerifiedCondition, metav1.ConditionFalse, hfv1.InsecureTLSReason,
			"spec.tls.insecureSkipVerify is true: the API's certificate is not checked; set tls.caBundleRef or tls.fingerprintSHA256")
	} else {
		conditions.Set(&st.Conditions, cluster.Generation, hfv1.HypervisorClusterTLSVerifiedCondition, metav1.ConditionTrue, hfv1.ReadyReason, "The API's certificate is verified")
	}
	conditions.Set(&st.Conditions, cluster.Generation, hfv1.ReadyCondition, metav1.ConditionTrue, hfv1.ReadyReason, msg)
	st.ObservedGeneration = cluster.Generation
}

// setUnverifiedCondition reports the VMs that carry this install's tag, are
// recorded by no claim, and whose ownership block does not verify: after a
// lost or rotated-out key that is every such VM of the install, and nothing
// else would say so. (A claim whose own VM does not verify says so in its
// OwnershipVerified condition, and the VM is counted here once the claim
// lets go of it.)
func (r *HypervisorClusterReconciler) setUnverifiedCondition(cluster *hfv1.HypervisorCluster) {
	if r.Unverified == nil {
		return
	}
	vms, swept := r.Unverified.Unverified(cluster.Name)
	if !swept {
		return
	}
	st := &cluster.Status
	if len(vms) == 0 {
		conditions.Set(&st.Conditions, cluster.Generation, hfv1.HypervisorClusterUnverifiedVMsCondition, metav1.ConditionFalse, hfv1.AllVerifiedReason,
			"Every VM with this install's tag that no claim records has a verifying ownership block")
		return
	}
	ids := make([]int, 0, len(vms))
	for id := range vms {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	var named []string
	for _, id := range ids[:min(len(ids), maxUnverifiedListed)] {
		named = append(named, fmt.Sprintf("VM %d: %s", id, vms[id]))
	}
	if len(ids) > maxUnverifiedListed {
		named = append(named, fmt.Sprintf("and %d more", len(ids)-maxUnverifiedListed))
	}
	msg := fmt.Sprintf("%d VMs carry this install's tag but their ownership block does not verify, so HyperFleet never touches them (%s); "+
		"if they are this install's, put the key that signed them back into the ownership Secret, otherwise remove them by hand (docs/security.md)",
		len(ids), strings.Join(named, "; "))
	conditions.Set(&st.Conditions, cluster.Generation, hfv1.HypervisorClusterUnverifiedVMsCondition, metav1.ConditionTrue, hfv1.OwnershipNotVerifiedReason, msg)
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
// operator, or a missed event).
func (r *HypervisorClusterReconciler) notifyChangedVMs(ctx context.Context, cluster string, prev *hypervisors.Listing, vms []provider.VMSummary) {
	if r.ClaimEvents == nil {
		return
	}
	seen := make(map[int]bool, len(vms))
	for _, vm := range vms {
		seen[vm.VMID] = true
		if vm.Template || vm.Power != provider.PowerStopped {
			continue
		}
		if old, ok := prev.VM(vm.VMID); ok && old.Power == provider.PowerStopped {
			// Already stopped last time: the claim was woken then. Claims
			// that are still Running requeue themselves.
			continue
		}
		r.wakeClaimOfVM(ctx, cluster, vm.VMID)
	}
	if prev == nil {
		return
	}
	for _, old := range prev.VMs {
		if !seen[old.VMID] {
			r.wakeClaimOfVM(ctx, cluster, old.VMID)
		}
	}
}

func (r *HypervisorClusterReconciler) wakeClaimOfVM(ctx context.Context, cluster string, vmid int) {
	var claims hfv1.MachineClaimList
	if err := r.Client.List(ctx, &claims, client.MatchingFields{claimVMIndex: vmKey(cluster, vmid)}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "List claim of VM", "vmid", vmid)
		return
	}
	for i := range claims.Items {
		r.sendClaimEvent(ctx, &claims.Items[i])
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

// clusterInUse is the cluster as claims' VMs use it.
func clusterInUse(cluster *hfv1.HypervisorCluster) inUse {
	return inUse{obj: cluster, conditions: &cluster.Status.Conditions, finalizer: hfv1.HypervisorClusterFinalizer, usage: "MachineClaims with VMs on this cluster"}
}

func (r *HypervisorClusterReconciler) reconcileDelete(ctx context.Context, h *patch.Helper, cluster *hfv1.HypervisorCluster) (ctrl.Result, error) {
	var claims hfv1.MachineClaimList
	if err := r.Client.List(ctx, &claims, client.MatchingFields{claimClusterIndex: cluster.Name}); err != nil {
		return ctrl.Result{}, err
	}
	held, err := clusterInUse(cluster).releaseWhenUnused(ctx, h, r.Recorder, claimNames(claims.Items, func(*hfv1.MachineClaim) bool { return true }))
	if err != nil {
		return ctrl.Result{}, err
	}
	if held {
		// Keep the connection: the claims' finalizers need it to destroy
		// their VMs.
		if _, err := r.reconcileConnection(ctx, cluster); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{RequeueAfter: pollInterval(cluster)}, nil
	}
	r.Registry.Remove(cluster.Name)
	r.forgetSPIRE(cluster.Name)
	metrics.ForgetCluster(cluster.Name)
	return ctrl.Result{}, nil
}

// credentialsKey names what c's configuration was resolved from: the
// cluster (UID, generation) and the resource version of each Secret it
// references (clusterconfig.SecretRefs), from the Secret watch's metadata. ok is
// false when a Secret is not in that cache (missing, or outside the
// watched namespaces): the configuration is then read every time.
func (r *HypervisorClusterReconciler) credentialsKey(ctx context.Context, c *hfv1.HypervisorCluster) (string, bool) {
	if r.SecretVersions == nil {
		return "", false
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s/%d", c.UID, c.Generation)
	for _, ref := range clusterconfig.SecretRefs(c) {
		m := &metav1.PartialObjectMetadata{}
		m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
		if err := r.SecretVersions.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, m); err != nil {
			return "", false
		}
		fmt.Fprintf(&b, "|%s/%s/%s@%s", ref.Namespace, ref.Name, m.UID, m.ResourceVersion)
	}
	return b.String(), true
}

func pollInterval(c *hfv1.HypervisorCluster) time.Duration {
	if c.Spec.PollInterval != nil && c.Spec.PollInterval.Duration > 0 {
		return c.Spec.PollInterval.Duration
	}
	return defaultPollInterval
}

// probeBackoff is 5s, 10s, 20s ... capped at maxProbeBackoff.
func probeBackoff(failures int) time.Duration {
	d := defaultPollInterval
	for i := 1; i < failures && d < maxProbeBackoff; i++ {
		d *= 2
	}
	return min(d, maxProbeBackoff)
}

// reconcileSPIRE connects to the SPIRE server of the cluster's spec.spire
// and reports it in SPIREConnected (not part of Ready: only templates that
// attest need it, and they report it themselves).
func (r *HypervisorClusterReconciler) reconcileSPIRE(ctx context.Context, cluster *hfv1.HypervisorCluster) {
	if r.Identity == nil {
		return
	}
	cfg := cluster.Spec.SPIRE
	if cfg == nil {
		r.Identity.Remove(cluster.Name)
		meta.RemoveStatusCondition(&cluster.Status.Conditions, string(hfv1.HypervisorClusterSPIREConnectedCondition))
		return
	}
	srv, err := r.Identity.Connect(ctx, cluster.Name, *cfg)
	if err != nil {
		was := hfv1.FindCondition(cluster.Status.Conditions, hfv1.HypervisorClusterSPIREConnectedCondition)
		msg := conditions.Truncate(err.Error(), 1024)
		// The client's reason when it has one (SPIRENotAdmin says what to
		// fix), else SPIREUnavailable.
		reason := hfv1.ConditionReason(errclass.ReasonOf(err))
		if reason == "" || errclass.Classify(err) == errclass.ClassTransient {
			reason = hfv1.SPIREUnavailableReason
		}
		conditions.Set(&cluster.Status.Conditions, cluster.Generation, hfv1.HypervisorClusterSPIREConnectedCondition, metav1.ConditionFalse, reason, msg)
		if was == nil || was.Status != metav1.ConditionFalse || was.Reason != string(reason) {
			r.Recorder.Event(cluster, corev1.EventTypeWarning, string(reason), msg)
		}
		return
	}
	b, _ := srv.Bundle()
	conditions.Set(&cluster.Status.Conditions, cluster.Generation, hfv1.HypervisorClusterSPIREConnectedCondition, metav1.ConditionTrue, hfv1.ReadyReason,
		fmt.Sprintf("Connected to the SPIRE server of trust domain %s; its bundle has %d X.509 authorities", srv.TrustDomain, len(b.X509Authorities())))
}

// forgetSPIRE drops a gone cluster's SPIRE connection.
func (r *HypervisorClusterReconciler) forgetSPIRE(name string) {
	if r.Identity != nil {
		r.Identity.Remove(name)
	}
}
