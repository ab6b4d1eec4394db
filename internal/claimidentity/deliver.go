package claimidentity

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/claimvm"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// guestRetry is how soon the join token is offered again to a guest that
// cannot take it yet (its guest agent not up, or the directory it goes in
// not made yet): the guest is booting, and its agent waits for the token.
// The attestation deadline bounds the retries.
const guestRetry = 2 * time.Second

// Deliver places the join token and the broker proof (the GuestSecrets
// document) in the claim's running VM through the hypervisor's guest
// channel, once: neither is ever on the VM's cloud-init medium or disk, so
// whoever reads the hypervisor's storage finds nothing to attest with
// (docs/security.md, "Nothing replayable at rest"). joinTokenDeliveredAt
// records it; a restart between the write and that record writes the
// same document again, which is harmless (the token works once anyway).
//
// It returns how soon to try again (zero: nothing to do now), or the
// message the claim fails with when the document can never be delivered (a
// VM without a guest agent). An error is the provider's ErrNotOwned: the
// VM recorded for the claim does not carry its ownership marker, and
// nothing was written into it.
func (s *Service) Deliver(ctx context.Context, claim *hfv1.MachineClaim, p provider.Provider) (retry time.Duration, failure string, err error) {
	st, ref := claim.Status.Identity, claim.Status.VMRef
	if st == nil || st.JoinTokenCreatedAt == nil || st.JoinTokenDeliveredAt != nil || st.AttestedAt != nil || st.Misuse != nil ||
		ref == nil || claim.Status.End != nil || !hfv1.IsConditionTrue(claim.Status.Conditions, hfv1.MachineClaimProvisionedCondition) {
		return 0, "", nil
	}
	if p == nil {
		// The cluster is not connected; its controller wakes the claim.
		return guestRetry, "", nil
	}
	doc, err := s.Issuer.GuestSecrets(claim)
	if err != nil {
		return 0, "", err
	}
	file := provider.GuestFile{Path: agentconfig.JoinTokenFile, Content: doc}
	err = p.PlaceGuestFile(ctx, claimvm.Owner(claim), provider.VMRef{VMID: int(ref.VMID), Node: ref.Node}, file)
	pending := func(msg string) {
		conditions.Set(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimAttestedCondition, metav1.ConditionFalse, hfv1.AttestationPendingReason, msg)
	}
	switch c := provider.Classify(err); {
	case err == nil:
		st.JoinTokenDeliveredAt = &metav1.Time{Time: s.Clock.Now()}
		pending("The join token is in the running VM (" + agentconfig.JoinTokenFile + "); waiting for its spire-agent to attest")
		s.Recorder.Eventf(claim, corev1.EventTypeNormal, "JoinTokenDelivered", "Placed the join token and the broker proof in VM %d through its guest agent", ref.VMID)
		return 0, "", nil
	case errors.Is(err, provider.ErrNotOwned):
		return 0, "", err
	case errors.Is(err, provider.ErrGuestNotReady):
		pending("Waiting for the VM's guest to take its join token: " + err.Error())
		return guestRetry, "", nil
	case c == provider.ClassConfiguration || c == provider.ClassPermanent:
		return 0, fmt.Sprintf("the join token cannot be placed in VM %d, so its spire-agent can never attest: %v", ref.VMID, err), nil
	default:
		ctrl.LoggerFrom(ctx).Info("Placing the join token in the VM failed; retrying", "err", err.Error())
		pending("Could not place the join token in the VM yet: " + err.Error())
		return s.Backoff(claim), "", nil
	}
}
