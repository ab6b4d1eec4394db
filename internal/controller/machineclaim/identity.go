package machineclaim

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/secretref"
)

// The claim's SPIFFE identity steps are the identity service's
// (identity_service.go, identity_store.go); these
// phases run them and carry their failures into the claim's end.

// checkMisuse evicts a stolen identity and fails its claim
// (IdentityService.containStolen); it runs on every pass of a claim that is not
// being deleted, ended or not, until the eviction is done.
func (id *IdentityService) checkMisuse(ctx context.Context, s *claimScope) (phase.Result, error) {
	failure, retry := id.containStolen(ctx, s)
	if failure != "" {
		s.fail(claimEnd{reason: hfv1.EndFailed, condition: hfv1.IdentityStolenReason, message: failure})
	}
	return phase.Recheck(retry), nil
}

// ensureIdentity issues the claim's identity before its VM is built.
func (r *Reconciler) ensureIdentity(ctx context.Context, s *claimScope) (phase.Result, error) {
	done, requeue, err := r.Identity.issue(ctx, s, s.tmpl, s.cluster)
	switch {
	case err != nil:
		return r.provisionError(ctx, s, err)
	case !done:
		return phase.StopAndRequeue(requeue), nil
	}
	return phase.Next(), nil
}

// checkAttestation fails a claim whose VM's agent did not attest in time.
func (id *IdentityService) checkAttestation(ctx context.Context, s *claimScope) (phase.Result, error) {
	recheck, failure := id.awaitAttestation(ctx, s, s.cluster)
	if failure != "" {
		s.fail(claimEnd{reason: hfv1.EndFailed, condition: hfv1.AttestationFailedReason, message: failure})
		return phase.Stop(), nil
	}
	return phase.Recheck(recheck), nil
}

// ensureStoredCredential hands an attested VM its runner credential through its
// cluster's secrets store.
func (r *Reconciler) ensureStoredCredential(ctx context.Context, s *claimScope) (phase.Result, error) {
	if s.runsNoRunner() {
		// A generic VM fetches no runner credential: its script uses the
		// identity itself.
		return phase.Next(), nil
	}
	switch result, requeue := r.Identity.storeCredential(ctx, s, s.cluster); result {
	case StoreWait:
		return phase.StopAndRequeue(requeue), nil
	case StoreDelivered:
		r.memory.succeeded(s.claim.UID)
	}
	return phase.Next(), nil
}

// releaseIdentity releases a deleted claim's identity once its VM is
// gone.
func (id *IdentityService) release(ctx context.Context, s *claimScope) (phase.Result, error) {
	if done, wait := id.releaseOfGoneVM(ctx, s); !done {
		return phase.StopAndRequeue(wait), nil
	}
	return phase.Next(), nil
}

// clusterSecrets reads the Secret keys a cluster references through c.
func clusterSecrets(c client.Client) func(ctx context.Context, field string, ref hfv1.SecretKeySelector) ([]byte, error) {
	return func(ctx context.Context, field string, ref hfv1.SecretKeySelector) ([]byte, error) {
		return secretref.Value(ctx, c, field, ref.Namespace, ref.Name, ref.Key)
	}
}

// BrokerEndpoint is where VMs that attest with SPIRE fetch their runner
// credential (internal/broker, served by the agent server).
type BrokerEndpoint interface {
	// URL is the broker's https:// URL as VMs reach it.
	URL() string
	// CA is the PEM CA bundle VMs trust for it, empty for their system
	// roots.
	CA() string
}
