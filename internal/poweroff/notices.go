// Package poweroff takes power-off hints: the in-VM agents' notices that
// their VM is about to power off (tokens checked, leader only), and the
// marks any hint puts on a claim's VM in hypervisors.Transitions, so that
// the claim reads that VM's status directly for a while
// (docs/architecture.md, "Power-off hints").
package poweroff

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/agentserver"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Notices takes the in-VM agents' power-off notices
// (agentserver.PowerOffReceiver) and gives VMs the means to send one
// (docs/architecture.md, "Power-off hints"). A notice is a hint: it marks
// the claim's VM in transition, so that the claim reads that VM's status
// directly for a while; what ends the claim is still that read.
//
// The token a VM presents is the claim's ownership.Signer.PowerOffToken: an
// HMAC under the install's key ring over the claim's namespace, name and
// UID. Nothing is stored: every replica verifies it, before and after a
// restart, and it authorizes one thing only. A forged token is refused
// before anything is read; a genuine one costs at most one mark of one VM.
type Notices struct {
	// Reader reads claims (the manager's cache).
	Reader client.Reader
	// Signer computes and verifies the tokens.
	Signer *ownership.Signer
	// Transitions is the set of VMs in transition the claim controller
	// polls.
	Transitions *hypervisors.Transitions
	// ClaimEvents wakes the claim of a marked VM.
	ClaimEvents chan<- event.GenericEvent
	// Jobs, when set, keeps what notices say of their runner's job;
	// TokenRefusals, those that say the VM's join token was refused;
	// AttestationErrors, every attestation error a VM reports;
	// GuestRefusals, the VMs whose agent refused to run the job.
	Jobs              *JobReports
	TokenRefusals     *TokenRefusals
	AttestationErrors *AttestationErrors
	GuestRefusals     *GuestRefusals
	// ReadyHints, when set, keeps the ready hints the claims' agents send.
	ReadyHints *ReadyHints
	Clock      clock.PassiveClock
	// Log logs accepted notices at debug level (requests carry no logger).
	Log logr.Logger
	// Elected is closed once this replica leads (mgr.Elected()): only the
	// leader's claim controller polls, so other replicas answer "retry".
	// Nil: always.
	Elected <-chan struct{}
	// URL is where VMs POST their notice (the agent server's
	// PowerOffURL), ReadyURL their ready hint (its ReadyURL); empty URL:
	// VMs are given none.
	URL, ReadyURL string
	// CA is the PEM bundle VMs trust for both, as it is now (the agent
	// server's CA may be read after the start); nil: their system roots.
	CA func() string
}

var _ agentserver.PowerOffReceiver = (*Notices)(nil)

// AuthorizePowerOff implements agentserver.PowerOffReceiver: an HMAC
// check, nothing else.
func (n *Notices) AuthorizePowerOff(c agentconfig.ClaimRef, token string) error {
	if n.Signer == nil || !n.Signer.VerifyPowerOffToken(c.Namespace, c.Name, c.UID, token) {
		metrics.PowerOffHints.WithLabelValues(string(hypervisors.HintAgent), "refused").Inc()
		return agentserver.ErrBadToken
	}
	return nil
}

// AuthorizeReady implements agentserver.PowerOffReceiver: the same HMAC
// check for a ready hint.
func (n *Notices) AuthorizeReady(c agentconfig.ClaimRef, token string) error {
	if n.Signer == nil || !n.Signer.VerifyPowerOffToken(c.Namespace, c.Name, c.UID, token) {
		metrics.ReadyHints.WithLabelValues("refused").Inc()
		return agentserver.ErrBadToken
	}
	return nil
}

// ReadyHint implements agentserver.PowerOffReceiver: the claim's agent
// runs and waits for the secrets the operator places in its VM, so the
// claim is woken to look at its VM now (its guest is read at once, and
// the secrets placed when it runs) instead of at its next boot poll. A
// hint decides nothing: the claim reads the VM through the hypervisor as
// always, and places the secrets only through the hypervisor's guest
// channel, into the VM its ownership marker names.
func (n *Notices) ReadyHint(ctx context.Context, c agentconfig.ClaimRef) error {
	claim, err := n.claimOf(ctx, c, "ready hint")
	if err != nil {
		return err
	}
	if claim == nil || claim.Status.VMRef == nil || claim.Ended() {
		metrics.ReadyHints.WithLabelValues("unknown").Inc()
		return nil
	}
	n.Log.V(1).Info("Ready hint", "MachineClaim", klog.KObj(claim), "vm", claim.Status.VMRef.ID())
	metrics.ReadyHints.WithLabelValues("accepted").Inc()
	if n.ReadyHints != nil {
		n.ReadyHints.Add(claim.UID, n.now())
	}
	n.wake(c)
	return nil
}

// claimOf reads the claim a hint names, on the leader only (ErrRetry on
// other replicas: only the leader's claim controller acts on it); nil when
// it is gone or a new claim has its name (nothing to read).
func (n *Notices) claimOf(ctx context.Context, c agentconfig.ClaimRef, what string) (*hfv1.MachineClaim, error) {
	if n.Elected != nil {
		select {
		case <-n.Elected:
		default:
			return nil, agentserver.ErrRetry
		}
	}
	claim := &hfv1.MachineClaim{}
	err := n.Reader.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.Name}, claim)
	switch {
	case apierrors.IsNotFound(err) || err == nil && string(claim.UID) != c.UID:
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read MachineClaim %s/%s for its %s: %w", c.Namespace, c.Name, what, err)
	}
	return claim, nil
}

// wake enqueues the claim; it never blocks the VM's request on the
// queue: a full channel leaves it to the claim's next pass.
func (n *Notices) wake(c agentconfig.ClaimRef) {
	if n.ClaimEvents == nil {
		return
	}
	select {
	case n.ClaimEvents <- event.GenericEvent{Object: &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name}}}:
	default:
	}
}

// PowerOffNotice implements agentserver.PowerOffReceiver, for notices
// AuthorizePowerOff admitted.
func (n *Notices) PowerOffNotice(ctx context.Context, notice agentconfig.PowerOffNotice) error {
	c := notice.ClaimRef
	claim, err := n.claimOf(ctx, c, "power-off notice")
	if err != nil {
		return err
	}
	if claim == nil {
		metrics.PowerOffHints.WithLabelValues(string(hypervisors.HintAgent), "unknown").Inc()
		return nil
	}
	n.Log.V(1).Info("Power-off notice", "MachineClaim", klog.KObj(claim), "vm", claim.Status.VMRef.ID(), "runnerOnline", notice.RunnerOnline, "jobStarted", notice.JobStarted)
	if st := notice.ScriptExitStatus; st != nil {
		// A generic VM's script: the VM's word, logged for whoever looks
		// into why the VM ended; the claim ends on the power-off alone.
		n.Log.Info("A generic VM's script exited; the VM powers off", "MachineClaim", klog.KObj(claim), "vm", claim.Status.VMRef.ID(), "scriptExitStatus", *st)
	}
	if notice.JobStarted && n.Jobs != nil {
		n.Jobs.Add(claim.UID, n.now())
	}
	if notice.AttestationError == agentconfig.AttestationJoinTokenRefused && n.TokenRefusals != nil {
		n.TokenRefusals.Add(claim.UID, n.now())
	}
	if notice.AttestationError != "" && n.AttestationErrors != nil {
		n.AttestationErrors.Add(claim.UID, notice.AttestationError, n.now())
	}
	if notice.GuestRefusal != "" && n.GuestRefusals != nil {
		n.GuestRefusals.Add(claim.UID, notice.GuestRefusal, n.now())
	}
	if Mark(n.Transitions, claim, hypervisors.HintAgent, n.now()) == hypervisors.Marked {
		// Wake the claim to read its VM now.
		n.wake(c)
	}
	return nil
}

func (n *Notices) now() time.Time {
	if n.Clock == nil {
		return time.Now()
	}
	return n.Clock.Now()
}

// SendsReadyHints reports whether the claims' VMs are given a ready hint
// URL and the hints they send are kept (ReadyHints): only then is waiting
// for one worth it.
func (n *Notices) SendsReadyHints() bool {
	return n != nil && n.URL != "" && n.ReadyURL != "" && n.Signer != nil && n.ReadyHints != nil
}

// ReadyHeard reports whether the agent of claim uid said it is ready
// (a ready hint kept in ReadyHints), as of now.
func (n *Notices) ReadyHeard(uid types.UID) bool {
	return n != nil && n.ReadyHints.Heard(uid, n.now())
}

// NotifyFor is what a claim's VM is given to send its notice; nil when the
// operator takes none.
func (n *Notices) NotifyFor(claim *hfv1.MachineClaim) *agentconfig.PowerOffNotify {
	if n == nil || n.URL == "" || n.Signer == nil {
		return nil
	}
	return &agentconfig.PowerOffNotify{
		URL:      n.URL,
		ReadyURL: n.ReadyURL,
		Token:    n.Signer.PowerOffToken(claim.Namespace, claim.Name, string(claim.UID)),
		Claim:    agentconfig.ClaimRef{Namespace: claim.Namespace, Name: claim.Name, UID: string(claim.UID)},
		CA:       n.ca(),
	}
}

func (n *Notices) ca() string {
	if n.CA == nil {
		return ""
	}
	return n.CA()
}

// Mark marks the VM of a running claim in transition and counts
// the hint. A claim without a VM, or already ending (its deletion reads the
// VM itself), is "unknown"; the job-completed hint marks the VM right
// before its claim ends, so that the VM counts as in transition until it
// is destroyed.
func Mark(t *hypervisors.Transitions, claim *hfv1.MachineClaim, source hypervisors.HintSource, now time.Time) hypervisors.MarkOutcome {
	ref := claim.Status.VMRef
	if t == nil || ref.ID() == "" || claim.Ended() {
		metrics.PowerOffHints.WithLabelValues(string(source), "unknown").Inc()
		return ""
	}
	out := t.Mark(hypervisors.VMKey{Cluster: ref.HypervisorCluster, VM: provider.ID(ref.ID())}, source, now)
	metrics.PowerOffHints.WithLabelValues(string(source), string(out)).Inc()
	return out
}
