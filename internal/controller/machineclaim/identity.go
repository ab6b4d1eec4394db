package machineclaim

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/secretref"
)

// The claim's SPIFFE identity steps are the identity service's
// (identity_service.go, identity_store.go, identity_misuse.go); these
// phases run them and carry their failures into the claim's end.

// containMisuse evicts a stolen identity and fails its claim
// (containStolenIdentity); it runs on every pass of a claim that is not
// being deleted, ended or not, until the eviction is done.
func (r *Reconciler) containMisuse(ctx context.Context, s *claimScope) (ctrl.Result, bool, error) {
	failure, retry := r.containStolenIdentity(ctx, s.claim)
	if failure != "" {
		r.fail(s.claim, claimEnd{reason: hfv1.EndFailed, condition: hfv1.IdentityStolenReason, message: failure})
	}
	s.recheck(retry)
	return ctrl.Result{}, true, nil
}

// secretSteps is the guest-secrets service with this reconciler's
// dependencies and backoff.
func (r *Reconciler) secretSteps() *secretsService {
	s := &secretsService{Minter: r.Credentials, Minted: &r.minted, Recorder: r.Recorder, Clock: r.Clock, Backoff: r.backoff}
	if r.Issuer != nil {
		s.Identity = r.Issuer
	}
	return s
}

// deliverSecrets places the claim's secrets in its running VM
// (Deliver): its runner credential, or its join token and
// broker proof.
func (r *Reconciler) deliverSecrets(ctx context.Context, s *claimScope) (ctrl.Result, bool, error) {
	retry, failure, err := r.secretSteps().Deliver(ctx, s.claim, s.provider)
	switch {
	case err != nil:
		res, err := r.provisionError(ctx, s, err)
		return res, false, err
	case failure != "":
		reason := hfv1.GuestAgentRequiredReason
		if s.claim.Status.Identity != nil {
			reason = hfv1.AttestationFailedReason
		}
		r.fail(s.claim, claimEnd{reason: hfv1.EndFailed, condition: reason, message: failure})
		res, _, err := r.reconcileFailed(ctx, s)
		return res, false, err
	}
	s.recheck(retry)
	return ctrl.Result{}, true, nil
}

// ensureIdentity issues the claim's identity before its VM is built.
func (r *Reconciler) ensureIdentity(ctx context.Context, s *claimScope) (ctrl.Result, bool, error) {
	done, requeue, err := r.issueIdentity(ctx, s.claim, s.tmpl, s.cluster)
	if err != nil {
		res, err := r.provisionError(ctx, s, err)
		return res, false, err
	}
	return ctrl.Result{RequeueAfter: requeue}, done, nil
}

// watchAttestation fails a claim whose VM's agent did not attest in time.
func (r *Reconciler) watchAttestation(ctx context.Context, s *claimScope) (ctrl.Result, bool, error) {
	recheck, failure := r.checkAttestation(ctx, s.claim, s.cluster)
	if failure != "" {
		r.fail(s.claim, claimEnd{reason: hfv1.EndFailed, condition: hfv1.AttestationFailedReason, message: failure})
		res, _, err := r.reconcileFailed(ctx, s)
		return res, false, err
	}
	s.recheck(recheck)
	return ctrl.Result{}, true, nil
}

// storeCredential hands an attested VM its runner credential through its
// cluster's secrets store.
func (r *Reconciler) storeCredential(ctx context.Context, s *claimScope) (ctrl.Result, bool, error) {
	switch result, requeue := r.storeCredentialInStore(ctx, s.claim, s.cluster); result {
	case StoreWait:
		return ctrl.Result{RequeueAfter: requeue}, false, nil
	case StoreDelivered:
		r.attempts.Delete(s.claim.UID)
	}
	return ctrl.Result{}, true, nil
}

// releaseIdentityPhase releases a deleted claim's identity once its VM is
// gone.
func (r *Reconciler) releaseIdentityPhase(ctx context.Context, s *claimScope) (ctrl.Result, bool, error) {
	done, wait := r.releaseIdentity(ctx, s.claim)
	return ctrl.Result{RequeueAfter: wait}, done, nil
}

// endPoweredOff ends a claim whose VM powered off: one that gave up on its
// join token before attesting says so, and one that found it used by
// someone else fails (its identity was stolen).
func (r *Reconciler) endPoweredOff(ctx context.Context, s *claimScope, msg string) (ctrl.Result, error) {
	msg, reason := r.joinTokenGaveUp(ctx, s.claim, s.cluster, msg)
	switch reason {
	case hfv1.IdentityStolenReason:
		r.fail(s.claim, claimEnd{reason: hfv1.EndFailed, condition: reason, message: msg})
		res, _, err := r.reconcileFailed(ctx, s)
		return res, err
	case "":
		reason = hfv1.VMPoweredOffReason
	}
	return r.endAndTerminate(ctx, s, claimEnd{reason: hfv1.EndPoweredOff, condition: reason, message: msg})
}

// readClusterSecret reads a Secret key a cluster references.
func (r *Reconciler) readClusterSecret(ctx context.Context, field string, ref hfv1.SecretKeySelector) ([]byte, error) {
	return secretref.Value(ctx, r.Client, field, ref.Namespace, ref.Name, ref.Key)
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
