package machineclaim

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
)

// DNS registration of a claim's VM (docs/networking.md, "DNS
// registration"): a running claim on a cluster with spec.dns.registerVMs
// registers its FQDN and addresses (ensureDNS); an ending or deleted claim
// removes them (releaseDNS), and a deleted one holds its finalizer for a
// few attempts at most (holdForDNS). DNS never holds a VM back: a claim
// whose records cannot be written runs all the same, a claim whose records
// cannot be removed goes all the same, and the sweep removes what it left.
const (
	// dnsUpdateTimeout bounds one Register or Remove: a few queries and
	// one update per zone, each bounded by the back-end's own timeout.
	dnsUpdateTimeout = 5 * time.Second
	// dnsRegisterRetry is when a failed registration is tried again.
	dnsRegisterRetry = 30 * time.Second
	// dnsRemoveRetry and maxDNSRemoveAttempts bound the removal of an
	// ending claim's records; after them the claim gives up (a warning
	// event, DNSRegistered reason DNSRemoveAbandoned) and leaves the
	// records to the sweep.
	dnsRemoveRetry       = 2 * time.Second
	maxDNSRemoveAttempts = 3
)

// DNSRecord is what a claim registers: its status.network.fqdn and the
// addresses of status.network.ipAllocations, else of
// status.network.addresses, without their prefix lengths,
// link-local, loopback and unspecified ones left out (they mean nothing
// outside the VM), owned by the claim's UID in install. why is set, and
// the record empty, when the claim has no name or no address to register.
func DNSRecord(claim *hfv1.MachineClaim, install string) (rec dnsreg.Record, why string) {
	n := claim.Status.Network
	if n == nil || n.FQDN == "" {
		return rec, "The VM has no FQDN yet (status.network.fqdn)"
	}
	// A claim's static addresses (ipAllocations) are what HyperFleet
	// configured on the VM: they are registered rather than whatever else
	// its guest agent reports (container bridges, a DHCP lease on a second
	// NIC). Without them, the guest's addresses are.
	reported := n.Addresses
	if len(n.IPAllocations) > 0 {
		reported = nil
		for _, a := range n.IPAllocations {
			reported = append(reported, a.Address)
		}
	}
	var addrs []netip.Addr
	for _, s := range reported {
		a, err := netip.ParseAddr(s)
		if p, perr := netip.ParsePrefix(s); perr == nil {
			a, err = p.Addr(), nil
		}
		if err != nil || a.IsLinkLocalUnicast() || a.IsLoopback() || a.IsUnspecified() || a.IsMulticast() {
			continue
		}
		a = a.Unmap().WithZone("")
		if !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return rec, fmt.Sprintf("The VM has no address to register under %s yet (status.network.addresses)", n.FQDN)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	return dnsreg.Record{Name: n.FQDN, Addrs: addrs, Owner: dnsreg.Owner{Claim: string(claim.UID), Install: install}}, ""
}

// dnsCluster is the cluster a claim's records are on: its VM's, else the
// one its label names (the VM reference is cleared once the VM is gone).
func dnsCluster(claim *hfv1.MachineClaim) string {
	if ref := claim.Status.VMRef; ref != nil {
		return ref.HypervisorCluster
	}
	return claim.Labels[hfv1.HypervisorClusterLabel]
}

// install is this operator's id, the records' owner install.
func (r *Reconciler) install() string {
	if r.Signer == nil {
		return ""
	}
	return r.Signer.OperatorID()
}

// ensureDNS registers a running claim's VM in its cluster's DNS service,
// once per name and set of addresses (again when they change, or after a
// restart: Register is idempotent). It never stops the pass.
func (r *Reconciler) ensureDNS(ctx context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	cluster := dnsCluster(claim)
	reg, ok := r.DNS.Registering(cluster)
	if !ok || claim.Status.VMRef == nil {
		return phase.Next(), nil
	}
	rec, why := DNSRecord(claim, r.install())
	if why != "" {
		s.facts.record(hfv1.MachineClaimDNSRegisteredCondition, metav1.ConditionFalse, hfv1.DNSNotRegisteredReason, why)
		return phase.Next(), nil
	}
	dc, _ := r.DNS.Get(cluster)
	if dc.CheckErr != nil {
		// The cluster's check failed: no use waiting for the same timeout
		// in every claim. The cluster's next good check wakes nothing, so
		// look again later.
		s.facts.record(hfv1.MachineClaimDNSRegisteredCondition, metav1.ConditionFalse, dnsFailureReason(dc.CheckErr),
			conditions.Truncate(fmt.Sprintf("Not registered in DNS yet: the DNS service of HypervisorCluster %s does not work (see its DNSReady condition): %v", cluster, dc.CheckErr), 1024))
		return phase.Recheck(dnsRegisterRetry), nil
	}
	done := dc.Key + " " + dnsreg.Fqdn(rec.Name) + " " + dnsreg.AddrsTXT(rec.Addrs)
	if v, ok := r.dnsRegistered.Load(claim.UID); ok && v == done && s.facts.isTrue(claim, hfv1.MachineClaimDNSRegisteredCondition) {
		return phase.Next(), nil
	}
	ctx, cancel := context.WithTimeout(ctx, dnsUpdateTimeout)
	defer cancel()
	if err := reg.Register(ctx, rec); err != nil {
		reason := dnsFailureReason(err)
		metrics.DNSUpdates.WithLabelValues(cluster, "register", string(reason)).Inc()
		msg := conditions.Truncate(fmt.Sprintf("Registering %s in DNS failed (will retry; the VM runs all the same): %v", rec.Name, err), 1024)
		if c := s.facts.condition(claim, hfv1.MachineClaimDNSRegisteredCondition); c == nil || c.Reason != string(reason) {
			r.Recorder.Event(claim, corev1.EventTypeWarning, string(reason), msg)
		}
		s.facts.record(hfv1.MachineClaimDNSRegisteredCondition, metav1.ConditionFalse, reason, msg)
		return phase.Recheck(dnsRegisterRetry), nil
	}
	metrics.DNSUpdates.WithLabelValues(cluster, "register", "ok").Inc()
	r.dnsRegistered.Store(claim.UID, done)
	msg := fmt.Sprintf("%s is registered with addresses %s", dnsreg.Fqdn(rec.Name), addrList(rec.Addrs))
	if d, ok := reg.(dnsreg.Describer); ok {
		msg = d.Registered(rec)
	}
	if !s.facts.isTrue(claim, hfv1.MachineClaimDNSRegisteredCondition) {
		r.Recorder.Event(claim, corev1.EventTypeNormal, "DNSRegistered", msg)
		ctrl.LoggerFrom(ctx).V(1).Info("Registered the VM in DNS", "name", rec.Name, "addresses", addrList(rec.Addrs))
	}
	s.facts.record(hfv1.MachineClaimDNSRegisteredCondition, metav1.ConditionTrue, hfv1.ReadyReason, msg)
	return phase.Next(), nil
}

func addrList(addrs []netip.Addr) string {
	parts := make([]string, len(addrs))
	for i, a := range addrs {
		parts[i] = a.String()
	}
	return strings.Join(parts, ", ")
}

// dnsFailureReason is the condition reason of a DNS error: the library's
// class reason, or DNSServerUnreachable for an error without one (no
// answer, a refused connection).
func dnsFailureReason(err error) hfv1.ConditionReason {
	if reason := errclass.ReasonOf(err); reason != "" {
		return hfv1.ConditionReason(reason)
	}
	return hfv1.DNSServerUnreachableReason
}

// dnsRemovalPending reports whether the claim may still have records to
// remove: it registered, or tried to, and neither removed them nor gave
// up.
func (r *Reconciler) dnsRemovalPending(s *claimScope) bool {
	c := s.facts.condition(s.claim, hfv1.MachineClaimDNSRegisteredCondition)
	if c == nil {
		return false
	}
	switch hfv1.ConditionReason(c.Reason) {
	case hfv1.DNSRecordsRemovedReason, hfv1.DNSRemoveAbandonedReason, hfv1.DNSNotRegisteredReason:
		return false
	}
	return true
}

// releaseDNS removes an ending or deleted claim's records, one attempt per
// pass (the VM's deletion goes on meanwhile). It never stops the pass.
func (r *Reconciler) releaseDNS(ctx context.Context, s *claimScope) (phase.Result, error) {
	if !r.dnsRemovalPending(s) || s.dnsTried {
		return phase.Next(), nil
	}
	return phase.Recheck(r.removeDNS(ctx, s)), nil
}

// holdForDNS keeps a deleted claim's finalizer while its records'
// removal has attempts left (at most maxDNSRemoveAttempts, each bounded by
// dnsUpdateTimeout): the claim's VM is gone by now, and the claim is the
// only thing that names the records without a zone transfer.
func (r *Reconciler) holdForDNS(ctx context.Context, s *claimScope) (phase.Result, error) {
	if !r.dnsRemovalPending(s) {
		return phase.Next(), nil
	}
	if !s.dnsTried {
		if retry := r.removeDNS(ctx, s); retry == 0 {
			return phase.Next(), nil
		}
	}
	if !r.dnsRemovalPending(s) {
		return phase.Next(), nil
	}
	return phase.StopAndRequeue(dnsRemoveRetry), nil
}

// removeDNS makes one attempt at removing the claim's records and records
// the outcome in DNSRegistered; retry is non-zero while the removal is
// still pending. After maxDNSRemoveAttempts failures, or at once when the
// cluster's DNS service is known not to work or is gone, it gives up with
// a warning event: the sweep removes the records once it can.
func (r *Reconciler) removeDNS(ctx context.Context, s *claimScope) (retry time.Duration) {
	claim := s.claim
	s.dnsTried = true
	cluster := dnsCluster(claim)
	dc, ok := r.DNS.Get(cluster)
	name := ""
	if n := claim.Status.Network; n != nil {
		name = n.FQDN
	}
	switch {
	case name == "":
		s.facts.record(hfv1.MachineClaimDNSRegisteredCondition, metav1.ConditionFalse, hfv1.DNSRecordsRemovedReason, "The VM had no name to remove from DNS")
		return 0
	case !ok || dc.Registrar == nil:
		r.abandonDNS(ctx, s, name, fmt.Errorf("HypervisorCluster %s has no working DNS provider any more", cluster))
		return 0
	case dc.CheckErr != nil:
		r.abandonDNS(ctx, s, name, fmt.Errorf("the DNS service of HypervisorCluster %s does not work: %w", cluster, dc.CheckErr))
		return 0
	}
	rctx, cancel := context.WithTimeout(ctx, dnsUpdateTimeout)
	defer cancel()
	err := dc.Registrar.Remove(rctx, dnsreg.Record{Name: name, Owner: dnsreg.Owner{Claim: string(claim.UID), Install: r.install()}})
	if err == nil {
		metrics.DNSUpdates.WithLabelValues(cluster, "remove", "ok").Inc()
		r.dnsRegistered.Delete(claim.UID)
		r.dnsRemoveAttempts.Delete(claim.UID)
		s.facts.record(hfv1.MachineClaimDNSRegisteredCondition, metav1.ConditionFalse, hfv1.DNSRecordsRemovedReason,
			fmt.Sprintf("The records of %s were removed from DNS", dnsreg.Fqdn(name)))
		return 0
	}
	reason := dnsFailureReason(err)
	metrics.DNSUpdates.WithLabelValues(cluster, "remove", string(reason)).Inc()
	n := 1
	if v, ok := r.dnsRemoveAttempts.Load(claim.UID); ok {
		n = v.(int) + 1
	}
	if n >= maxDNSRemoveAttempts {
		r.abandonDNS(ctx, s, name, err)
		return 0
	}
	r.dnsRemoveAttempts.Store(claim.UID, n)
	s.facts.record(hfv1.MachineClaimDNSRegisteredCondition, metav1.ConditionFalse, reason, conditions.Truncate(
		fmt.Sprintf("Removing %s from DNS failed (attempt %d of %d; the VM's deletion goes on meanwhile): %v", name, n, maxDNSRemoveAttempts, err), 1024))
	return dnsRemoveRetry
}

// abandonDNS gives up removing the claim's records.
func (r *Reconciler) abandonDNS(ctx context.Context, s *claimScope, name string, err error) {
	claim := s.claim
	r.dnsRegistered.Delete(claim.UID)
	r.dnsRemoveAttempts.Delete(claim.UID)
	msg := conditions.Truncate(fmt.Sprintf("Could not remove %s from DNS (%v); the claim goes on without it, and the DNS sweep removes its records once the DNS server takes updates again", name, err), 1024)
	r.Recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.DNSRemoveAbandonedReason), msg)
	ctrl.LoggerFrom(ctx).Info("Gave up removing the VM's DNS records; leaving them to the sweep", "name", name, "err", err.Error())
	s.facts.record(hfv1.MachineClaimDNSRegisteredCondition, metav1.ConditionFalse, hfv1.DNSRemoveAbandonedReason, msg)
}
