package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/clusterconfig"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/secretref"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
)

const (
	// dnsCheckInterval is how often a cluster's DNS service is checked
	// again while nothing about it changed; a failing one is retried
	// after dnsRetryInterval. Both ride on the cluster's polls.
	dnsCheckInterval = time.Minute
	dnsRetryInterval = 15 * time.Second
	// dnsCheckTimeout bounds one check: the cluster's poll waits for it,
	// and a DNS server that swallows packets must not hold up the polls
	// of the hypervisor for longer.
	dnsCheckTimeout = 3 * time.Second
)

// checkDNS builds the DNS registrar of the cluster's spec.dns.dnsProvider,
// checks it (rfc2136: a signed SOA query per zone; the external-dns types:
// the DNSEndpoint CRD and the operator's permissions) and reports the result in
// DNSReady; the claims register their VMs with it (Registry DNS). It never
// stops the pass: DNS is not part of Ready, and VMs are created and
// deleted whatever it finds (docs/networking.md, "DNS registration").
// The registrar is rebuilt when the cluster or its TSIG Secret changed,
// and checked again every dnsCheckInterval (dnsRetryInterval while it
// fails), at the cluster's polls.
func (r *HypervisorClusterReconciler) checkDNS(ctx context.Context, s *clusterScope) (phase.Result, error) {
	cluster := s.cluster
	if r.DNS == nil {
		return phase.Next(), nil
	}
	d := cluster.Spec.DNS
	if d == nil || d.DNSProvider == nil {
		r.forgetDNS(cluster)
		return phase.Next(), nil
	}
	key := r.dnsKey(ctx, cluster)
	now := r.Clock.Now()
	prev, had := r.DNS.Get(cluster.Name)
	if had && prev.Key == key && now.Sub(prev.CheckedAt) < dnsRecheck(prev.CheckErr) {
		return phase.Next(), nil
	}
	reg := prev.Registrar
	var err error
	if !had || prev.Key != key || reg == nil {
		reg, err = r.buildRegistrar(ctx, cluster)
	}
	if err == nil {
		err = checkRegistrar(ctx, reg)
	}
	r.DNS.Set(cluster.Name, dnsreg.Cluster{Registrar: reg, Key: key, RegisterVMs: d.RegisterVMs, CheckedAt: now, CheckErr: err})
	r.setDNSCondition(ctx, cluster, reg, err)
	return phase.Next(), nil
}

// dnsRecheck is how long a check's result stands.
func dnsRecheck(err error) time.Duration {
	if err != nil {
		return dnsRetryInterval
	}
	return dnsCheckInterval
}

// buildRegistrar reads the dnsProvider's Secrets and builds its Registrar
// from the back-ends registered by type.
func (r *HypervisorClusterReconciler) buildRegistrar(ctx context.Context, cluster *hfv1.HypervisorCluster) (dnsreg.Registrar, error) {
	cfg, err := clusterconfig.DNS(ctx, r.Client, cluster)
	if err != nil {
		return nil, err
	}
	cfg.Kubernetes = r.DNSKubernetes
	reg, err := dnsreg.New(r.DNSFactories, cluster.Spec.DNS.DNSProvider.Type, cfg)
	if err != nil {
		return nil, fmt.Errorf("spec.dns.dnsProvider: %w", err)
	}
	return reg, nil
}

// checkRegistrar checks reg within dnsCheckTimeout, when it can be checked.
func checkRegistrar(ctx context.Context, reg dnsreg.Registrar) error {
	c, ok := reg.(dnsreg.Checker)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, dnsCheckTimeout)
	defer cancel()
	return c.Check(ctx)
}

// dnsKey names what the cluster's registrar is built from: the cluster
// (UID, generation) and the resource version of each Secret its
// dnsProvider reads, from the Secret watch's metadata; a Secret not in
// that cache (missing) is named as such, so that its arrival changes the
// key.
func (r *HypervisorClusterReconciler) dnsKey(ctx context.Context, c *hfv1.HypervisorCluster) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s/%d", c.UID, c.Generation)
	for _, ref := range clusterconfig.DNSSecretRefs(c) {
		m := &metav1.PartialObjectMetadata{}
		m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
		if r.SecretVersions == nil || r.SecretVersions.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, m) != nil {
			fmt.Fprintf(&b, "|%s/%s@?", ref.Namespace, ref.Name)
			continue
		}
		fmt.Fprintf(&b, "|%s/%s/%s@%s", ref.Namespace, ref.Name, m.UID, m.ResourceVersion)
	}
	return b.String()
}

// DNSReason is the condition reason of a DNS error: the library's class
// reason (DNSUpdateRefused, DNSInvalid ...), SecretNotFound for a missing
// TSIG Secret, and DNSServerUnreachable for a server that did not answer
// (a timeout, a refused connection), which carries no class.
func DNSReason(err error) hfv1.ConditionReason {
	if errors.Is(err, secretref.ErrMissing) {
		return hfv1.SecretNotFoundReason
	}
	if reason := errclass.ReasonOf(err); reason != "" {
		return hfv1.ConditionReason(reason)
	}
	return hfv1.DNSServerUnreachableReason
}

// setDNSCondition reports reg's check in DNSReady, the dns_ready gauge
// and, on a change to failing, a warning event.
func (r *HypervisorClusterReconciler) setDNSCondition(ctx context.Context, cluster *hfv1.HypervisorCluster, reg dnsreg.Registrar, err error) {
	p := cluster.Spec.DNS.DNSProvider
	zones := strings.Join(append([]string{clusterconfig.DNSZone(cluster)}, p.ReverseZones...), ", ")
	if err == nil {
		msg := fmt.Sprintf("The DNS server answers for zones %s with the configured key", zones)
		if d, ok := reg.(dnsreg.Describer); ok {
			msg = d.Checked(zones)
		}
		if !cluster.Spec.DNS.RegisterVMs {
			msg += "; dns.registerVMs is false, so no VM is registered"
		}
		conditions.Set(&cluster.Status.Conditions, cluster.Generation, hfv1.HypervisorClusterDNSReadyCondition, metav1.ConditionTrue, hfv1.ReadyReason, msg)
		metrics.DNSReady.WithLabelValues(cluster.Name).Set(1)
		return
	}
	reason := DNSReason(err)
	msg := conditions.Truncate(fmt.Sprintf("DNS registration of this cluster's VMs does not work (%v); VMs are still created and deleted, without DNS records", err), 1024)
	// A copy: Set changes the condition FindCondition points at.
	var was metav1.Condition
	if c := hfv1.FindCondition(cluster.Status.Conditions, hfv1.HypervisorClusterDNSReadyCondition); c != nil {
		was = *c
	}
	conditions.Set(&cluster.Status.Conditions, cluster.Generation, hfv1.HypervisorClusterDNSReadyCondition, metav1.ConditionFalse, reason, msg)
	metrics.DNSReady.WithLabelValues(cluster.Name).Set(0)
	if was.Status != metav1.ConditionFalse || was.Reason != string(reason) {
		r.Recorder.Event(cluster, corev1.EventTypeWarning, string(reason), msg)
		ctrl.LoggerFrom(ctx).Info("DNS service of the cluster does not work", "reason", reason, "err", err.Error())
	}
}

// forgetDNS drops a cluster's DNS registrar and its DNSReady condition:
// it has no dnsProvider (any more).
func (r *HypervisorClusterReconciler) forgetDNS(cluster *hfv1.HypervisorCluster) {
	r.DNS.Remove(cluster.Name)
	meta.RemoveStatusCondition(&cluster.Status.Conditions, string(hfv1.HypervisorClusterDNSReadyCondition))
	metrics.DNSReady.DeleteLabelValues(cluster.Name)
}
