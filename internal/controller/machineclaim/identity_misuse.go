package machineclaim

import (
	"context"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/identity"
)

// A VM's identity is stolen when someone other than the VM attests with
// its join token (one leaked from the SPIRE server's datastore, an old
// seed, a log; the token never rests on the VM's storage) or otherwise
// holds its SVID. Two things give it away: a valid SVID of the claim
// presented to the broker without the proof the operator placed in the VM
// alone (the broker records it, BrokerProofInvalid), and the VM's own
// report that the SPIRE server refused its token as used while the server
// lists an agent that attested with it (joinTokenGaveUp, joinTokenReused). Either
// way the claim's status.identity.misuse is set first; Contain then evicts
// the identity and fails the claim.

// TokenRefusals says whether a claim's VM reported in its power-off notice
// that the SPIRE server refused its join token (poweroff.TokenRefusals).
type TokenRefusals interface {
	Refused(uid types.UID, now time.Time) bool
}

// AttestationErrors says what a claim's VM reported, in its power-off
// notice, about why it got no identity (poweroff.AttestationErrors).
type AttestationErrors interface {
	Error(uid types.UID, now time.Time) string
}

// containStolenIdentity acts on a misuse recorded in the claim's status: it says so on
// the Attested condition (False, IdentityStolen), evicts the identity from
// the SPIRE server (Issuer.Evict: the agent that attested with the claim's
// token banned, the VM's entries deleted; recorded in misuse.evictedAt)
// and returns the message the claim fails with, empty when it has ended
// already or no misuse is recorded. retry is how soon to try the eviction
// again when the server could not be reached.
func (id *IdentityService) containStolen(ctx context.Context, s *claimScope) (failure string, retry time.Duration) {
	claim := s.claim
	st := claim.Status.Identity
	if st == nil || st.Misuse == nil {
		return "", 0
	}
	m := st.Misuse
	msg := stolenMessage(st)
	if m.EvictedAt == nil && id.Issuer != nil {
		if err := id.evict(ctx, claim); err != nil {
			ctrl.LoggerFrom(ctx).Info("Could not evict the stolen identity from the SPIRE server yet", "err", err.Error())
			msg += "; evicting it from the SPIRE server is retried: " + err.Error()
			retry = s.backoff()
		} else {
			m.EvictedAt = &metav1.Time{Time: s.clock.Now()}
			s.recorder.Eventf(claim, corev1.EventTypeNormal, "IdentityEvicted", "Banned the SPIRE agent that attested with the join token of %s and deleted its registration entries %s and %s",
				st.SPIFFEID, st.EntryID, st.NodeID)
		}
	}
	s.facts.record(hfv1.MachineClaimAttestedCondition, metav1.ConditionFalse, hfv1.IdentityStolenReason, conditions.Truncate(msg, 1024))
	if claim.Status.End != nil {
		return "", retry
	}
	return msg, retry
}

// stolenMessage says what a recorded misuse means for the claim.
func stolenMessage(st *hfv1.IdentityStatus) string {
	return fmt.Sprintf("The VM's identity %s was used by someone other than the VM (%s): %s. No runner credential is handed out for it; the claim fails and its VM is stopped",
		st.SPIFFEID, st.Misuse.Reason, st.Misuse.Message)
}

// evictIdentity bans the agent of the claim's join token and deletes its entries
// on the server of the identity's trust domain.
func (id *IdentityService) evict(ctx context.Context, claim *hfv1.MachineClaim) error {
	sid, err := spiffeid.FromString(claim.Status.Identity.SPIFFEID)
	if err != nil {
		return fmt.Errorf("status.identity.spiffeID: %w", err)
	}
	srv, ok := id.Servers.ByTrustDomain(sid.TrustDomain())
	if !ok {
		return fmt.Errorf("the SPIRE server of trust domain %s is not connected", sid.TrustDomain())
	}
	return id.Issuer.Evict(ctx, srv, claim)
}

// joinTokenReused reports whether the claim's VM gave up on a join token that
// someone else used: the VM said, in its power-off notice, that the SPIRE
// spireServer refused its token, it never asked the broker for its credential,
// and the server lists an agent that attested with the token. It then
// records the misuse and reports it with an event. A server that cannot
// be asked confirms nothing.
func (id *IdentityService) joinTokenReused(ctx context.Context, s *claimScope, cluster *hfv1.HypervisorCluster) bool {
	claim := s.claim
	st := claim.Status.Identity
	now := s.clock.Now()
	if st.CredentialRequestedAt != nil || id.TokenRefusals == nil || !id.TokenRefusals.Refused(claim.UID, now) {
		return false
	}
	srv, err := id.spireServer(ctx, cluster)
	attested := false
	if err == nil {
		attested, err = id.Issuer.Attested(ctx, srv, claim)
	}
	if err != nil {
		ctrl.LoggerFrom(ctx).Info("The VM reports its join token refused; the SPIRE server could not be asked whether someone else attested with it", "err", err.Error())
		return false
	}
	if !attested {
		return false
	}
	msg := fmt.Sprintf("the VM's spire-agent found its join token already used, and the SPIRE server lists the agent %s that attested with it", st.NodeID)
	identity.CountMisuse(hfv1.MisuseJoinTokenReused)
	if identity.RecordMisuse(claim, hfv1.MisuseJoinTokenReused, msg, now) {
		s.recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.IdentityStolenReason), "The VM's identity was stolen: "+msg)
	}
	return true
}
