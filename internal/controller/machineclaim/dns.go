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
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
)

// DNS registration of a claim's VM (docs/networking.md, "DNS
// registration"): a running claim on a cluster with spec.dns.registerVMs
// registers its FQDN and addresses (DNSRegistration.ensure); an ending or deleted claim
// removes them (DNSRegistration.release), and a deleted one holds its finalizer for a
// few attempts at most (DNSRegistration.hold). DNS never holds a VM back: a claim
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
// addresses the operator vouches for (vmAddrsOf), owned by the claim's UID
// in install. cluster is the claim's VM's HypervisorCluster (nil when it
// cannot be read: only static addresses are then registered). reason and
// why are set, and the record empty, when the claim has no name or no
// address to register: reason is the DNSRegistered condition's.
func DNSRecord(claim *hfv1.MachineClaim, install string, cluster *hfv1.HypervisorCluster) (rec dnsreg.Record, reason hfv1.ConditionReason, why string) {
	n := claim.Status.Network
	if n == nil || n.FQDN == "" {
		return rec, hfv1.DNSNotRegisteredReason, "The VM has no FQDN yet (status.network.fqdn)"
	}
	v := vmAddrsOf(claim, cluster)
	if len(v.addrs) == 0 {
		if len(v.outside) > 0 {
			return rec, hfv1.AddressOutsideVMSubnetsReason, "Not registered in DNS: " + v.refusal(cluster)
		}
		return rec, hfv1.DNSNotRegisteredReason, fmt.Sprintf("The VM has no address to register under %s yet (status.network.addresses)", n.FQDN)
	}
	return dnsreg.Record{Name: n.FQDN, Addrs: v.addrs, Owner: dnsreg.Owner{Claim: string(claim.UID), Install: install}}, "", ""
}

// vmAddrs are the addresses of a claim's VM as the operator sees them.
type vmAddrs struct {
	// addrs are those it registers in DNS and probes, sorted.
	addrs []netip.Addr
	// outside are those its guest agent reports outside the cluster's
	// spec.network.vmSubnets, left out, sorted.
	outside []netip.Addr
}

// vmAddrsOf are the addresses of a claim's VM that the operator registers
// in DNS under the VM's name and sends its validation's probes to
// (docs/networking.md, "Which addresses are registered and probed"): the
// VM's static addresses
// (status.network.ipAllocations), which the operator assigned from the
// IPPools itself, else the addresses its guest agent reports
// (status.network.addresses) that lie in the cluster's
// spec.network.vmSubnets. A guest reports whatever it likes: another VM's
// address, or an internal service's, which the operator would otherwise
// publish under the VM's name and probe. Prefix lengths are dropped, and
// link-local, loopback, unspecified and multicast addresses left out
// (they mean nothing outside the VM); with static addresses, whatever else
// the guest reports (container bridges, a lease on a second NIC) is
// ignored.
func vmAddrsOf(claim *hfv1.MachineClaim, cluster *hfv1.HypervisorCluster) vmAddrs {
	n := claim.Status.Network
	if n == nil {
		return vmAddrs{}
	}
	if len(n.IPAllocations) > 0 {
		static := make([]string, len(n.IPAllocations))
		for i, a := range n.IPAllocations {
			static[i] = a.Address
		}
		return vmAddrs{addrs: usableAddrs(static)}
	}
	subnets := vmSubnets(cluster)
	var out vmAddrs
	for _, a := range usableAddrs(n.Addresses) {
		if slices.ContainsFunc(subnets, func(p netip.Prefix) bool { return p.Contains(a) }) {
			out.addrs = append(out.addrs, a)
		} else {
			out.outside = append(out.outside, a)
		}
	}
	return out
}

// usableAddrs parses addresses (with or without a prefix length), leaves
// out those that mean nothing outside the VM and duplicates, and sorts
// them.
func usableAddrs(reported []string) []netip.Addr {
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
	slices.SortFunc(addrs, netip.Addr.Compare)
	return addrs
}

// vmSubnets are the cluster's spec.network.vmSubnets, masked; none for a
// nil cluster. The API server checks their form; one that does not parse
// anyway is left out.
func vmSubnets(cluster *hfv1.HypervisorCluster) []netip.Prefix {
	if cluster == nil || cluster.Spec.Network == nil {
		return nil
	}
	var out []netip.Prefix
	for _, s := range cluster.Spec.Network.VMSubnets {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

// refusal says why the addresses the VM's guest reports are left out, and
// which field lets them in.
func (v vmAddrs) refusal(cluster *hfv1.HypervisorCluster) string {
	name, subnets := "of the claim's VM", []string(nil)
	if cluster != nil {
		name = cluster.Name
		if cluster.Spec.Network != nil {
			subnets = cluster.Spec.Network.VMSubnets
		}
	}
	if len(subnets) == 0 {
		return fmt.Sprintf("the VM has no static address, and HypervisorCluster %s sets no spec.network.vmSubnets, so no address its guest agent reports (%s) is trusted: a guest can report any address, another VM's or an internal service's. "+
			"Set spec.network.vmSubnets of HypervisorCluster %s to the subnets its VMs get their addresses in", name, addrList(v.outside), name)
	}
	return fmt.Sprintf("none of the addresses the VM's guest agent reports (%s) is in spec.network.vmSubnets of HypervisorCluster %s (%s): a guest can report any address, another VM's or an internal service's. "+
		"If the VMs get their addresses in another subnet, add it to spec.network.vmSubnets", addrList(v.outside), name, strings.Join(subnets, ", "))
}

// dnsCluster is the cluster a claim's records are on: its VM's, else the
// one its label names (the VM reference is cleared once the VM is gone).
func dnsCluster(claim *hfv1.MachineClaim) string {
	if ref := claim.Status.VMRef; ref != nil {
		return ref.HypervisorCluster
	}
	return claim.Labels[hfv1.HypervisorClusterLabel]
}

// DNSRegistration registers running claims' VMs in their clusters' DNS
// services (spec.dns.registerVMs) and removes their records when the
// claims end; what it last wrote is in the claims' memory.
type DNSRegistration struct {
	// Clusters holds the clusters' DNS registrars, built by the
	// HypervisorCluster controller; nil registers no VM.
	Clusters *dnsreg.Clusters
}

// ensure registers a running claim's VM in its cluster's DNS service,
// once per name and set of addresses (again when they change, or after a
// restart: Register is idempotent). It never stops the pass.
func (d *DNSRegistration) ensure(ctx context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	cluster := dnsCluster(claim)
	reg, ok := d.Clusters.Registering(cluster)
	if !ok || claim.Status.VMRef == nil {
		return phase.Next(), nil
	}
	hc := d.vmCluster(ctx, s, cluster)
	rec, reason, why := DNSRecord(claim, s.install, hc)
	if why != "" {
		if reason == hfv1.AddressOutsideVMSubnetsReason && s.dnsRemovalPending() && !s.dnsTried {
			// The VM registered addresses before that it no longer
			// holds: its records go first, or its name would keep
			// pointing at an address that may be another VM's by now.
			if retry := d.remove(ctx, s); retry > 0 {
				return phase.Recheck(retry), nil
			}
		}
		s.refuseAddresses(hfv1.MachineClaimDNSRegisteredCondition, reason, why)
		return phase.Next(), nil
	}
	dc, _ := d.Clusters.Get(cluster)
	if dc.CheckErr != nil {
		// The cluster's check failed: no use waiting for the same timeout
		// in every claim. The cluster's next good check wakes nothing, so
		// look again later.
		s.facts.record(hfv1.MachineClaimDNSRegisteredCondition, metav1.ConditionFalse, dnsFailureReason(dc.CheckErr),
			conditions.Truncate(fmt.Sprintf("Not registered in DNS yet: the DNS service of HypervisorCluster %s does not work (see its DNSReady condition): %v", cluster, dc.CheckErr), 1024))
		return phase.Recheck(dnsRegisterRetry), nil
	}
	done := dc.Key + " " + dnsreg.Fqdn(rec.Name) + " " + dnsreg.AddrsTXT(rec.Addrs)
	if s.memory.recall(claim.UID).dnsRegistered == done && s.facts.isTrue(claim, hfv1.MachineClaimDNSRegisteredCondition) {
		return phase.Next(), nil
	}
	ctx, cancel := context.WithTimeout(ctx, dnsUpdateTimeout)
	defer cancel()
	if err := reg.Register(ctx, rec); err != nil {
		reason := dnsFailureReason(err)
		metrics.DNSUpdates.WithLabelValues(cluster, "register", string(reason)).Inc()
		msg := conditions.Truncate(fmt.Sprintf("Registering %s in DNS failed (will retry; the VM runs all the same): %v", rec.Name, err), 1024)
		if c := s.facts.condition(claim, hfv1.MachineClaimDNSRegisteredCondition); c == nil || c.Reason != string(reason) {
			s.recorder.Event(claim, corev1.EventTypeWarning, string(reason), msg)
		}
		s.facts.record(hfv1.MachineClaimDNSRegisteredCondition, metav1.ConditionFalse, reason, msg)
		return phase.Recheck(dnsRegisterRetry), nil
	}
	metrics.DNSUpdates.WithLabelValues(cluster, "register", "ok").Inc()
	s.memory.registeredDNS(claim.UID, done)
	msg := fmt.Sprintf("%s is registered with addresses %s", dnsreg.Fqdn(rec.Name), addrList(rec.Addrs))
	if d, ok := reg.(dnsreg.Describer); ok {
		msg = d.Registered(rec)
	}
	if out := vmAddrsOf(claim, hc).outside; len(out) > 0 {
		msg += fmt.Sprintf("; left out, as outside spec.network.vmSubnets of HypervisorCluster %s: %s", cluster, addrList(out))
	}
	if !s.facts.isTrue(claim, hfv1.MachineClaimDNSRegisteredCondition) {
		s.recorder.Event(claim, corev1.EventTypeNormal, "DNSRegistered", msg)
		ctrl.LoggerFrom(ctx).V(1).Info("Registered the VM in DNS", "name", rec.Name, "addresses", addrList(rec.Addrs))
	}
	s.facts.record(hfv1.MachineClaimDNSRegisteredCondition, metav1.ConditionTrue, hfv1.ReadyReason, msg)
	return phase.Next(), nil
}

// vmCluster is the claim's VM's HypervisorCluster: the scope's when it is
// loaded, else read (DNSRegistration.ensure runs before the scope loads it); nil when it
// cannot be read, which leaves only static addresses to register.
func (d *DNSRegistration) vmCluster(ctx context.Context, s *claimScope, name string) *hfv1.HypervisorCluster {
	if s.cluster != nil && s.cluster.Name == name {
		return s.cluster
	}
	var c hfv1.HypervisorCluster
	if err := s.client.Get(ctx, client.ObjectKey{Name: name}, &c); err != nil {
		ctrl.LoggerFrom(ctx).V(1).Info("Could not read the VM's HypervisorCluster; registering static addresses only", "cluster", name, "err", err.Error())
		return nil
	}
	return &c
}

// refuseAddresses records on the claim's condition typ (DNSRegistered or
// NetworkValidated) why nothing of its VM is registered or probed, with a
// warning event when the reason is new.
func (s *claimScope) refuseAddresses(typ hfv1.ConditionType, reason hfv1.ConditionReason, msg string) {
	msg = conditions.Truncate(msg, 1024)
	if c := s.facts.condition(s.claim, typ); reason == hfv1.AddressOutsideVMSubnetsReason && (c == nil || c.Reason != string(reason)) {
		s.recorder.Event(s.claim, corev1.EventTypeWarning, string(reason), msg)
	}
	s.facts.record(typ, metav1.ConditionFalse, reason, msg)
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
func (s *claimScope) dnsRemovalPending() bool {
	c := s.facts.condition(s.claim, hfv1.MachineClaimDNSRegisteredCondition)
	if c == nil {
		return false
	}
	switch hfv1.ConditionReason(c.Reason) {
	case hfv1.DNSRecordsRemovedReason, hfv1.DNSRemoveAbandonedReason, hfv1.DNSNotRegisteredReason, hfv1.AddressOutsideVMSubnetsReason:
		// AddressOutsideVMSubnets is recorded only once earlier records
		// are gone (DNSRegistration.ensure).
		return false
	}
	return true
}

// release removes an ending or deleted claim's records, one attempt per
// pass (the VM's deletion goes on meanwhile). It never stops the pass.
func (d *DNSRegistration) release(ctx context.Context, s *claimScope) (phase.Result, error) {
	if !s.dnsRemovalPending() || s.dnsTried {
		return phase.Next(), nil
	}
	return phase.Recheck(d.remove(ctx, s)), nil
}

// hold keeps a deleted claim's finalizer while its records'
// removal has attempts left (at most maxDNSRemoveAttempts, each bounded by
// dnsUpdateTimeout): the claim's VM is gone by now, and the claim is the
// only thing that names the records without a zone transfer.
func (d *DNSRegistration) hold(ctx context.Context, s *claimScope) (phase.Result, error) {
	if !s.dnsRemovalPending() {
		return phase.Next(), nil
	}
	if !s.dnsTried {
		if retry := d.remove(ctx, s); retry == 0 {
			return phase.Next(), nil
		}
	}
	if !s.dnsRemovalPending() {
		return phase.Next(), nil
	}
	return phase.StopAndRequeue(dnsRemoveRetry), nil
}

// remove makes one attempt at removing the claim's records and records
// the outcome in DNSRegistered; retry is non-zero while the removal is
// still pending. After maxDNSRemoveAttempts failures, or at once when the
// cluster's DNS service is known not to work or is gone, it gives up with
// a warning event: the sweep removes the records once it can.
func (d *DNSRegistration) remove(ctx context.Context, s *claimScope) (retry time.Duration) {
	claim := s.claim
	s.dnsTried = true
	cluster := dnsCluster(claim)
	dc, ok := d.Clusters.Get(cluster)
	name := ""
	if n := claim.Status.Network; n != nil {
		name = n.FQDN
	}
	switch {
	case name == "":
		s.facts.record(hfv1.MachineClaimDNSRegisteredCondition, metav1.ConditionFalse, hfv1.DNSRecordsRemovedReason, "The VM had no name to remove from DNS")
		return 0
	case !ok || dc.Registrar == nil:
		d.abandon(ctx, s, name, fmt.Errorf("HypervisorCluster %s has no working DNS provider any more", cluster))
		return 0
	case dc.CheckErr != nil:
		d.abandon(ctx, s, name, fmt.Errorf("the DNS service of HypervisorCluster %s does not work: %w", cluster, dc.CheckErr))
		return 0
	}
	rctx, cancel := context.WithTimeout(ctx, dnsUpdateTimeout)
	defer cancel()
	err := dc.Registrar.Remove(rctx, dnsreg.Record{Name: name, Owner: dnsreg.Owner{Claim: string(claim.UID), Install: s.install}})
	if err == nil {
		metrics.DNSUpdates.WithLabelValues(cluster, "remove", "ok").Inc()
		s.memory.dnsDone(claim.UID)
		s.facts.record(hfv1.MachineClaimDNSRegisteredCondition, metav1.ConditionFalse, hfv1.DNSRecordsRemovedReason,
			fmt.Sprintf("The records of %s were removed from DNS", dnsreg.Fqdn(name)))
		return 0
	}
	reason := dnsFailureReason(err)
	metrics.DNSUpdates.WithLabelValues(cluster, "remove", string(reason)).Inc()
	n := s.memory.dnsRemoveFailed(claim.UID)
	if n >= maxDNSRemoveAttempts {
		d.abandon(ctx, s, name, err)
		return 0
	}
	s.facts.record(hfv1.MachineClaimDNSRegisteredCondition, metav1.ConditionFalse, reason, conditions.Truncate(
		fmt.Sprintf("Removing %s from DNS failed (attempt %d of %d; the VM's deletion goes on meanwhile): %v", name, n, maxDNSRemoveAttempts, err), 1024))
	return dnsRemoveRetry
}

// abandon gives up removing the claim's records.
func (d *DNSRegistration) abandon(ctx context.Context, s *claimScope, name string, err error) {
	claim := s.claim
	s.memory.dnsDone(claim.UID)
	msg := conditions.Truncate(fmt.Sprintf("Could not remove %s from DNS (%v); the claim goes on without it, and the DNS sweep removes its records once the DNS server takes updates again", name, err), 1024)
	s.recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.DNSRemoveAbandonedReason), msg)
	ctrl.LoggerFrom(ctx).Info("Gave up removing the VM's DNS records; leaving them to the sweep", "name", name, "err", err.Error())
	s.facts.record(hfv1.MachineClaimDNSRegisteredCondition, metav1.ConditionFalse, hfv1.DNSRemoveAbandonedReason, msg)
}
