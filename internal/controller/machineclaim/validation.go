package machineclaim

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/event"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// DNS and network validation of a running claim's VM (docs/networking.md,
// "DNS and network validation"): on a cluster with spec.dns.validation or
// spec.network.validation, a claim whose VM runs and reports an address is
// validated (checkNetwork), at once or after validateInterval, and
// again every validateInterval. A round of checks talks to DNS servers and
// to the VM, which may take the checks' whole timeouts, so it never runs
// in a reconcile: checkNetwork starts it in a goroutine of its own
// (validations), and the claim's next reconcile, which the round's end
// wakes, records the outcome in the claim's NetworkValidated condition and
// status.networkValidation, and fails the claim where onFailure says so.

// dnsPort is the port of the DNS servers checked: spec.dns.servers are
// resolvers' addresses, which VMs reach on the standard port.
const dnsPort = 53

// validationPlan is what one round checks, resolved from the claim, its
// cluster and its template when the round starts.
type validationPlan struct {
	cluster string
	// name and addrs are the VM's FQDN and the addresses the operator
	// vouches for (vmAddrsOf, as DNS registration); outside are those its
	// guest reports outside the cluster's vmSubnets, never probed.
	name    string
	addrs   []netip.Addr
	outside []netip.Addr
	// dns: the lookups are on; servers are the resolvers, reverse adds
	// the PTR checks; dnsTimeout bounds each query.
	dns        bool
	servers    []netip.AddrPort
	reverse    bool
	dnsTimeout time.Duration
	// ping and ssh are the network checks; netTimeout bounds each
	// address's.
	ping, ssh  bool
	sshPort    uint16
	netTimeout time.Duration
	// onReady and interval schedule the rounds (dns.validation's).
	onReady  bool
	interval time.Duration
	// failDNS and failNetwork: a failed check of that kind fails the
	// claim (onFailure FailClaim).
	failDNS, failNetwork bool
}

// validationRound is the outcome of one round.
type validationRound struct {
	finished time.Time
	results  []hfv1.NetworkCheckResult
	// reason is the first failed check's condition reason, "" when every
	// check passed; fail says whether that failure fails the claim.
	reason hfv1.ConditionReason
	fail   bool
}

// validations start the claims' rounds, which the claims' memory tracks
// (claimMemory.startRound, takeRound). Losing them on restart costs one
// round.
type validations struct {
	// wake enqueues a claim whose round finished (a channel source of the
	// controller); nil in tests without a manager, where the claim's
	// recheck collects the round instead.
	wake chan event.GenericEvent
}

// start runs plan in a goroutine unless a round of the claim is already
// running; false when one is.
func (v *validations) start(m *claimMemory, claim *hfv1.MachineClaim, plan validationPlan, now func() time.Time) bool {
	if !m.startRound(claim.UID) {
		return false
	}
	key := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID}}
	go func() {
		round := runRound(plan)
		round.finished = now()
		m.finishRound(key.UID, round)
		if v.wake != nil {
			select {
			case v.wake <- event.GenericEvent{Object: key}:
			default:
				// The queue is full; the claim's recheck collects it.
			}
		}
	}()
	return true
}

// planValidation resolves what the claim's rounds check; false when its
// cluster validates nothing. The DNS servers asked are the cluster's
// spec.dns.servers only: a template's network.dns.servers are its VMs'
// resolvers, and a server a tenant names would have the operator query it
// and believe its answers (and reach whatever it points the operator at).
func planValidation(claim *hfv1.MachineClaim, cluster *hfv1.HypervisorCluster) (validationPlan, bool) {
	p := validationPlan{cluster: cluster.Name, onReady: true, interval: hfv1.DefaultValidationInterval * time.Second}
	if d := cluster.Spec.DNS; d != nil && d.Validation != nil && enabled(d.Validation.Enabled) {
		v := d.Validation
		p.dns, p.reverse, p.failDNS = true, v.ValidateReverse, v.OnFailure == hfv1.ValidationFailClaim
		p.dnsTimeout = seconds(v.TimeoutSeconds, hfv1.DefaultDNSValidationTimeoutSeconds)
		p.onReady = enabled(v.ValidateOnReady)
		if v.ValidateInterval != nil {
			p.interval = v.ValidateInterval.Duration
		}
	}
	if n := cluster.Spec.Network; n != nil && n.Validation != nil && enabled(n.Validation.Enabled) {
		v := n.Validation
		p.ping, p.ssh, p.failNetwork = enabled(v.PingTest), v.SSHTest, v.OnFailure == hfv1.ValidationFailClaim
		p.sshPort = uint16(hfv1.DefaultSSHPort)
		if v.SSHPort > 0 {
			p.sshPort = uint16(v.SSHPort)
		}
		p.netTimeout = seconds(v.TimeoutSeconds, hfv1.DefaultNetworkValidationTimeoutSeconds)
	}
	if !p.dns && !p.ping && !p.ssh {
		return p, false
	}
	v := vmAddrsOf(claim, cluster)
	p.addrs, p.outside = v.addrs, v.outside
	if n := claim.Status.Network; n != nil && len(p.addrs) > 0 {
		p.name = n.FQDN
	}
	if d := cluster.Spec.DNS; d != nil {
		for _, s := range d.Servers {
			if a, err := netip.ParseAddr(s); err == nil {
				p.servers = append(p.servers, netip.AddrPortFrom(a, dnsPort))
			}
		}
	}
	return p, true
}

func enabled(b *bool) bool { return b == nil || *b }

func seconds(n, def int32) time.Duration {
	if n <= 0 {
		n = def
	}
	return time.Duration(n) * time.Second
}

// bound is the longest a round may take: its checks of one kind run in
// parallel, the kinds one after the other.
func (p validationPlan) bound() time.Duration {
	return 2*p.dnsTimeout + 2*p.netTimeout + 5*time.Second
}

// checkNetwork validates a running claim's VM on its cluster's
// schedule: it records a finished round, starts the next one when it is
// due, and asks to be woken when that is. It stops the pass only when a
// failed round fails the claim (the end list then runs).
func (v *validations) checkNetwork(ctx context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	if s.cluster == nil || !s.facts.isTrue(claim, hfv1.MachineClaimProvisionedCondition) {
		return phase.Next(), nil
	}
	plan, on := planValidation(claim, s.cluster)
	if !on {
		v.drop(s)
		return phase.Next(), nil
	}
	if len(plan.addrs) == 0 {
		if len(plan.outside) > 0 {
			// A round still running (started before the addresses
			// changed) is dropped when it ends.
			s.memory.dropRounds(claim.UID)
			s.refuseAddresses(hfv1.MachineClaimNetworkValidatedCondition, hfv1.AddressOutsideVMSubnetsReason,
				"Not validated: "+vmAddrs{outside: plan.outside}.refusal(s.cluster))
		}
		return phase.Next(), nil
	}
	round, finished, running := s.memory.takeRound(claim.UID)
	if finished && !v.vmStillRuns(s) {
		// The VM stopped while it was checked (its job done, or shut
		// down): the round says nothing about its network, and
		// checkRunning ends the claim.
		finished = false
	}
	if finished && v.record(ctx, s, plan, round) {
		return phase.Stop(), nil
	}
	if running {
		return phase.Recheck(plan.bound()), nil
	}
	now := s.clock.Now()
	due, again := v.next(s, plan)
	if !again {
		return phase.Next(), nil
	}
	if now.Before(due) {
		return phase.Recheck(due.Sub(now)), nil
	}
	if v.start(s.memory, claim, plan, s.clock.Now) && s.facts.condition(claim, hfv1.MachineClaimNetworkValidatedCondition) == nil {
		s.facts.record(hfv1.MachineClaimNetworkValidatedCondition, metav1.ConditionUnknown, hfv1.ValidatingReason,
			"The first validation of the VM's DNS name and network is running")
	}
	return phase.Recheck(plan.bound()), nil
}

// drop clears what earlier rounds reported of a claim whose
// cluster no longer validates (validation turned off): a NetworkValidated
// condition and results nobody refreshes would go on vouching for, or
// against, a network nobody checks. A round still running is discarded
// when it ends.
func (v *validations) drop(s *claimScope) {
	s.memory.takeRound(s.claim.UID)
	s.claim.Status.NetworkValidation = nil
	s.facts.withdraw(hfv1.MachineClaimNetworkValidatedCondition)
}

// vmStillRuns reports whether the latest listing of the claim's cluster
// still shows its VM running (true without a listing).
func (v *validations) vmStillRuns(s *claimScope) bool {
	ref := s.claim.Status.VMRef
	if ref == nil {
		return false
	}
	l := s.registry.Listing(ref.HypervisorCluster)
	if l == nil {
		return true
	}
	vm, found := l.VM(provider.ID(ref.ID()))
	return found && vm.Power != provider.PowerStopped
}

// next is when the claim's next round is due; again is false
// when none is (validateInterval 0s, after the first).
func (v *validations) next(s *claimScope, plan validationPlan) (due time.Time, again bool) {
	claim := s.claim
	if st := claim.Status.NetworkValidation; st != nil && st.LastValidated != nil {
		if plan.interval <= 0 {
			return time.Time{}, false
		}
		return st.LastValidated.Add(plan.interval), true
	}
	if plan.onReady {
		return time.Time{}, true
	}
	since := s.clock.Now()
	if c := s.facts.condition(claim, hfv1.MachineClaimProvisionedCondition); c != nil && !c.LastTransitionTime.IsZero() {
		since = c.LastTransitionTime.Time
	}
	return since.Add(plan.interval), plan.interval > 0
}

// record records a finished round in the claim's status and its
// NetworkValidated condition, with an event when the outcome changed;
// true when the round failed the claim.
func (v *validations) record(ctx context.Context, s *claimScope, plan validationPlan, round validationRound) bool {
	claim := s.claim
	at := metav1.NewTime(round.finished)
	claim.Status.NetworkValidation = &hfv1.NetworkValidationStatus{LastValidated: &at, Checks: round.results}
	prev := s.facts.condition(claim, hfv1.MachineClaimNetworkValidatedCondition)
	if round.reason == "" {
		msg := "Every check passed: " + summary(round.results)
		if prev == nil || prev.Status != metav1.ConditionTrue {
			s.recorder.Event(claim, corev1.EventTypeNormal, string(hfv1.NetworkValidatedReason), conditions.Truncate(msg, 1024))
		}
		s.facts.record(hfv1.MachineClaimNetworkValidatedCondition, metav1.ConditionTrue, hfv1.NetworkValidatedReason, msg)
		return false
	}
	msg := conditions.Truncate("Validation failed: "+failures(round.results), 1024)
	if prev == nil || prev.Reason != string(round.reason) {
		s.recorder.Event(claim, corev1.EventTypeWarning, string(round.reason), msg)
		ctrl.LoggerFrom(ctx).Info("The VM's validation failed", "reason", round.reason, "message", msg)
	}
	s.facts.record(hfv1.MachineClaimNetworkValidatedCondition, metav1.ConditionFalse, round.reason, msg)
	if !round.fail {
		return false
	}
	end := fmt.Sprintf("The VM failed its validation and HypervisorCluster %s says onFailure: FailClaim (%s: %s)", plan.cluster, round.reason, failures(round.results))
	s.recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.NetworkValidationFailedReason), conditions.Truncate(end, 1024))
	s.beginEnd(claimEnd{reason: hfv1.EndFailed, condition: hfv1.NetworkValidationFailedReason, message: end, failed: true})
	return true
}

// summary and failures render a round's results for a message.
func summary(results []hfv1.NetworkCheckResult) string {
	parts := make([]string, len(results))
	for i, c := range results {
		parts[i] = c.Message
	}
	return strings.Join(parts, "; ")
}

func failures(results []hfv1.NetworkCheckResult) string {
	var parts []string
	for _, c := range results {
		if !c.Passed {
			parts = append(parts, c.Message)
		}
	}
	return strings.Join(parts, "; ")
}
