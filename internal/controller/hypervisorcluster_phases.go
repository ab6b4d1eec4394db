package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/clusterconfig"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/isolation"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/secretref"
	"github.com/hyperfleet/hyperfleet/internal/tenancy"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// The phases of a HypervisorCluster's reconcile, in the order Reconcile
// runs them: the deprecated fields' event, the tenancy, SPIRE and DNS
// conditions (checkDNS, hypervisorcluster_dns.go), then the connection
// (connection()): refused fields, the provider, its probe, its VM list and
// what the listing changed.

// reportDeprecated tells a cluster that sets deprecated fields where each
// moved, in one Normal DeprecatedField event per generation (per operator
// start: the polls in between stay quiet). The fields still work (their
// readers, the cluster's kind among them, fall back to them), so nothing
// else changes.
func (r *HypervisorClusterReconciler) reportDeprecated(_ context.Context, s *clusterScope) (phase.Result, error) {
	cluster := s.cluster
	moved := clusterconfig.Deprecated(cluster)
	if len(moved) == 0 {
		r.deprecationsReported.Delete(cluster.Name)
		return phase.Next(), nil
	}
	generation := fmt.Sprintf("%s/%d", cluster.UID, cluster.Generation)
	if was, ok := r.deprecationsReported.Swap(cluster.Name, generation); ok && was == generation {
		return phase.Next(), nil
	}
	fields := make([]string, len(moved))
	for i, m := range moved {
		fields[i] = fmt.Sprintf("%s is deprecated: move it to %s", m.Field, m.Replacement)
	}
	r.Recorder.Event(cluster, corev1.EventTypeNormal, "DeprecatedField",
		strings.Join(fields, "; ")+" (the deprecated fields still work; a field may not be set in both places)")
	return phase.Next(), nil
}

// reportTenancy sets the TenancyRestricted condition.
func (r *HypervisorClusterReconciler) reportTenancy(_ context.Context, s *clusterScope) (phase.Result, error) {
	tenancy.SetCondition(s.cluster)
	return phase.Next(), nil
}

// connectSPIRE connects to the SPIRE server of the cluster's spec.spire
// and reports it in SPIREConnected (not part of Ready: only templates that
// attest need it, and they report it themselves).
func (r *HypervisorClusterReconciler) connectSPIRE(ctx context.Context, s *clusterScope) (phase.Result, error) {
	cluster := s.cluster
	if r.Identity == nil {
		return phase.Next(), nil
	}
	cfg := cluster.Spec.SPIRE
	if cfg == nil {
		r.Identity.Remove(cluster.Name)
		meta.RemoveStatusCondition(&cluster.Status.Conditions, string(hfv1.HypervisorClusterSPIREConnectedCondition))
		return phase.Next(), nil
	}
	srv, err := r.Identity.Connect(ctx, cluster.Name, *cfg)
	if err != nil {
		msg := conditions.Truncate(err.Error(), 1024)
		// The client's reason when it has one (SPIRENotAdmin says what to
		// fix), else SPIREUnavailable.
		reason := hfv1.ConditionReason(errclass.ReasonOf(err))
		if reason == "" || errclass.Classify(err) == errclass.ClassTransient {
			reason = hfv1.SPIREUnavailableReason
		}
		// Compared before the condition is set: FindCondition points into
		// the slice that conditions.Set updates in place.
		if was := hfv1.FindCondition(cluster.Status.Conditions, hfv1.HypervisorClusterSPIREConnectedCondition); was == nil || was.Status != metav1.ConditionFalse || was.Reason != string(reason) {
			r.Recorder.Event(cluster, corev1.EventTypeWarning, string(reason), msg)
		}
		conditions.Set(&cluster.Status.Conditions, cluster.Generation, hfv1.HypervisorClusterSPIREConnectedCondition, metav1.ConditionFalse, reason, msg)
		return phase.Next(), nil
	}
	b, _ := srv.Bundle()
	conditions.Set(&cluster.Status.Conditions, cluster.Generation, hfv1.HypervisorClusterSPIREConnectedCondition, metav1.ConditionTrue, hfv1.ReadyReason,
		fmt.Sprintf("Connected to the SPIRE server of trust domain %s; its bundle has %d X.509 authorities", srv.TrustDomain, len(b.X509Authorities())))
	return phase.Next(), nil
}

// forgetSPIRE drops a gone cluster's SPIRE connection.
func (r *HypervisorClusterReconciler) forgetSPIRE(name string) {
	if r.Identity != nil {
		r.Identity.Remove(name)
	}
}

// connectProvider sets the scope's provider (connect); without one the
// status says why and the pass ends.
func (r *HypervisorClusterReconciler) connectProvider(ctx context.Context, s *clusterScope) (phase.Result, error) {
	p, err := r.connect(ctx, s)
	switch {
	case err != nil:
		return phase.Stop(), err
	case p == nil:
		return phase.StopAndRequeue(maxProbeBackoff), nil
	}
	s.provider = p
	return phase.Next(), nil
}

// probe asks the cluster for its version and nodes.
func (r *HypervisorClusterReconciler) probe(ctx context.Context, s *clusterScope) (phase.Result, error) {
	pctx, cancel := context.WithTimeout(ctx, probeTimeout(s.cluster))
	info, err := s.provider.Probe(pctx)
	timedOut := errors.Is(pctx.Err(), context.DeadlineExceeded)
	cancel()
	if err == nil {
		s.info = info
		return phase.Next(), nil
	}
	msg := err.Error()
	if timedOut && ctx.Err() == nil {
		msg = fmt.Sprintf("no answer within spec.probeTimeout (%s; raise it for a slow API): %v", probeTimeout(s.cluster), err)
	}
	return r.callFailed(ctx, s, "probe", err, probeFailureReason(err), msg), nil
}

// listVMs reads the cluster's VM list.
func (r *HypervisorClusterReconciler) listVMs(ctx context.Context, s *clusterScope) (phase.Result, error) {
	vms, err := s.provider.ListVMs(ctx)
	if err == nil {
		s.vms = vms
		return phase.Next(), nil
	}
	return r.callFailed(ctx, s, "list VMs", err, hfv1.UnreachableReason, fmt.Sprintf("list VMs: %v", err)), nil
}

// callFailed ends a pass whose call to the cluster failed with err: a
// tolerated failure is retried within a second; any other marks the
// cluster down (reason, msg) and retries after its backoff.
func (r *HypervisorClusterReconciler) callFailed(ctx context.Context, s *clusterScope, call string, err error, reason hfv1.ConditionReason, msg string) phase.Result {
	log := ctrl.LoggerFrom(ctx)
	if n, ok := r.tolerated(s, err); ok {
		log.V(1).Info("Call to the cluster failed, retrying before marking the cluster down", "call", call, "failures", n, "err", err.Error())
		return phase.StopAndRequeue(time.Second)
	}
	backoff := probeBackoff(r.markDown(s, reason, msg))
	log.Info("HypervisorCluster unreachable, retrying", "call", call, "reason", reason, "retryAfter", backoff, "err", err.Error())
	return phase.StopAndRequeue(backoff)
}

// tolerated reports whether a failed call is absorbed, with the failures
// in a row so far: one dropped request or 5xx must not pause every claim
// on a Ready cluster, so a transient failure is retried within a second
// and only a run of toleratedProbeFailures marks the cluster down.
func (r *HypervisorClusterReconciler) tolerated(s *clusterScope, err error) (int, bool) {
	if !s.wasReady || provider.Classify(err) != provider.ClassTransient {
		return 0, false
	}
	n := r.Registry.RecordFailure(s.cluster.Name)
	return n, n < toleratedProbeFailures
}

// recordListing shares the listing and the cluster's health with every
// controller and the sweeper (the registry), reports the cluster
// connected, and wakes the claims the listing concerns: those waiting for
// the cluster when it became Ready, and those whose VM stopped or went.
func (r *HypervisorClusterReconciler) recordListing(ctx context.Context, s *clusterScope) (phase.Result, error) {
	cluster := s.cluster
	name := cluster.Name
	now := r.Clock.Now()
	prev := r.Registry.SetListing(name, s.vms, now)
	r.Registry.SetHealth(name, hypervisors.Health{Ready: true}, now)
	metrics.ClusterConnected.WithLabelValues(name).Set(1)
	r.setConnectedStatus(s, now)
	r.setUnverifiedCondition(cluster)
	if !s.wasReady {
		r.Recorder.Eventf(cluster, corev1.EventTypeNormal, "Connected", "Connected to %s (version %s, %d nodes)", cluster.Spec.Endpoint, s.info.Version, len(s.info.Nodes))
		r.wakeWaitingClaims(ctx, name)
	}
	r.notifyChangedVMs(ctx, name, prev, s.vms)
	return phase.Recheck(pollInterval(cluster)), nil
}

// connect returns the cluster's provider: the connected one while neither
// the cluster nor its Secrets changed since it was connected (the manager
// caches no Secret contents, internal/manager/secrets.go, so reading the
// credentials is a GET to the API server, which polling every few seconds
// must not repeat), else one connected with the configuration read now. A
// nil provider has been reported in the status (markDown); err is then a
// terminal error or nil.
func (r *HypervisorClusterReconciler) connect(ctx context.Context, s *clusterScope) (provider.Provider, error) {
	log := ctrl.LoggerFrom(ctx)
	cluster := s.cluster
	name := cluster.Name
	key, keyed := r.credentialsKey(ctx, cluster)
	if v, ok := r.connectedAt.Load(name); keyed && ok && v.(string) == key {
		if p, _, connected := r.Registry.Provider(name); connected {
			return p, nil
		}
	}
	r.connectedAt.Delete(name)
	factory := r.Factories[cluster.Spec.Provider]
	if factory == nil {
		r.markDown(s, hfv1.UnreachableReason, clusterconfig.UnknownKind(cluster.Spec.Provider).Error())
		return nil, reconcile.TerminalError(fmt.Errorf("no provider for %q", cluster.Spec.Provider))
	}
	cfg, err := clusterconfig.Resolve(ctx, r.Client, cluster)
	if err != nil {
		reason := hfv1.SecretNotFoundReason
		if !errors.Is(err, secretref.ErrMissing) {
			reason = hfv1.UnreachableReason
		}
		r.markDown(s, hfv1.ConditionReason(string(reason)), err.Error())
		// A Secret watch wakes the cluster once the Secret appears.
		return nil, nil
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
		if provider.ReasonOf(err) == string(hfv1.InvalidClientCertificateReason) {
			// The message names spec.credentials.clientCert and the fix.
			r.markDown(s, hfv1.InvalidClientCertificateReason, err.Error())
			return nil, nil
		}
		r.markDown(s, hfv1.InvalidTLSReason, fmt.Sprintf("spec.tls: %v", err))
		return nil, nil
	}
	if keyed {
		r.connectedAt.Store(name, key)
	}
	return p, nil
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

// markDown records a failed connection in the registry, the status
// (Connected, and Ready through the scope), metrics and (on the transition
// only) events. It returns the failure count.
func (r *HypervisorClusterReconciler) markDown(s *clusterScope, reason hfv1.ConditionReason, msg string) int {
	cluster := s.cluster
	failures := r.Registry.SetHealth(cluster.Name, hypervisors.Health{Ready: false, Reason: string(reason), Message: msg}, r.Clock.Now())
	metrics.ClusterConnected.WithLabelValues(cluster.Name).Set(0)
	conditions.Set(&cluster.Status.Conditions, cluster.Generation, hfv1.HypervisorClusterConnectedCondition, metav1.ConditionFalse, reason, msg)
	s.ready = notReady(reason, "New VMs on this cluster are paused until it is reachable: "+msg)
	if s.wasReady || failures == 1 {
		r.Recorder.Event(cluster, corev1.EventTypeWarning, string(reason), conditions.Truncate(msg, 1024))
	}
	return failures
}

// setConnectedStatus records a connected cluster: its version, nodes and
// capacity, Connected and TLSVerified, and Ready through the scope.
func (r *HypervisorClusterReconciler) setConnectedStatus(s *clusterScope, now time.Time) {
	cluster, info := s.cluster, s.info
	st := &cluster.Status
	was := st.DeepCopy()
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
	} else if sameNodes(was.Nodes, st.Nodes) {
		// Every VM's clone, start and destroy moves the nodes' allocated
		// memory and storage and the cluster's available resources: a
		// status write per step of every job, of figures only people
		// read. Between poll-time refreshes they keep the values written
		// last, and the refresh writes the figures of its moment.
		for i := range st.Nodes {
			st.Nodes[i].Allocated = was.Nodes[i].Allocated
		}
		st.AvailableResources = was.AvailableResources
	}

	msg := fmt.Sprintf("Connected: version %s, %d of %d nodes online", info.Version, online, len(info.Nodes))
	conditions.Set(&st.Conditions, cluster.Generation, hfv1.HypervisorClusterConnectedCondition, metav1.ConditionTrue, hfv1.ReadyReason, msg)
	if info.InsecureTLS {
		conditions.Set(&st.Conditions, cluster.Generation, hfv1.HypervisorClusterTLSVerifiedCondition, metav1.ConditionFalse, hfv1.InsecureTLSReason,
			"spec.tls.insecureSkipVerify is true: the API's certificate is not checked; set tls.caBundleRef or tls.fingerprintSHA256")
	} else {
		conditions.Set(&st.Conditions, cluster.Generation, hfv1.HypervisorClusterTLSVerifiedCondition, metav1.ConditionTrue, hfv1.ReadyReason, "The API's certificate is verified")
	}
	setIsolationCondition(cluster, info)
	s.ready = isReady(msg)
}

// setIsolationCondition reports whether the cluster's VMs are held to
// spec.network.isolation: not configured, configured but ignored by the
// hypervisor (the probe says why), or enforced.
func setIsolationCondition(cluster *hfv1.HypervisorCluster, info *provider.ClusterInfo) {
	st := &cluster.Status
	switch {
	case cluster.Spec.Network == nil || cluster.Spec.Network.Isolation == nil:
		conditions.Set(&st.Conditions, cluster.Generation, hfv1.HypervisorClusterIsolationEnforcedCondition, metav1.ConditionFalse, hfv1.IsolationNotConfiguredReason,
			"spec.network.isolation is unset, so the cluster's VMs share their bridge unfiltered: a job can reach other jobs' VMs and the management networks (docs/networking.md, \"Isolation\")")
	case info.IsolationProblem != "":
		conditions.Set(&st.Conditions, cluster.Generation, hfv1.HypervisorClusterIsolationEnforcedCondition, metav1.ConditionFalse, hfv1.IsolationNotEnforcedReason, info.IsolationProblem)
	default:
		conditions.Set(&st.Conditions, cluster.Generation, hfv1.HypervisorClusterIsolationEnforcedCondition, metav1.ConditionTrue, hfv1.IsolationActiveReason,
			fmt.Sprintf("VMs are held to their network isolation policy (default %s) by the hypervisor", isolation.DefaultPolicyName(cluster)))
	}
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
	ids := slices.SortedFunc(maps.Keys(vms), provider.ID.Compare)
	var named []string
	for _, id := range ids[:min(len(ids), maxUnverifiedListed)] {
		named = append(named, fmt.Sprintf("VM %s: %s", id, vms[id]))
	}
	if len(ids) > maxUnverifiedListed {
		named = append(named, fmt.Sprintf("and %d more", len(ids)-maxUnverifiedListed))
	}
	msg := fmt.Sprintf("%d VMs carry this install's tag but their ownership block does not verify, so HyperFleet never touches them (%s); "+
		"if they are this install's, put the key that signed them back into the ownership Secret, otherwise remove them by hand (docs/security.md)",
		len(ids), strings.Join(named, "; "))
	conditions.Set(&st.Conditions, cluster.Generation, hfv1.HypervisorClusterUnverifiedVMsCondition, metav1.ConditionTrue, hfv1.OwnershipNotVerifiedReason, msg)
}

// sameNodes reports whether two node lists name the same nodes, in the
// same states, with the same capacity: what differs is only what their
// VMs use.
func sameNodes(a, b []hfv1.NodeStatus) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || a[i].State != b[i].State || !equality.Semantic.DeepEqual(a[i].Capacity, b[i].Capacity) {
			return false
		}
	}
	return true
}
