package machineclaim

import (
	"context"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/secretref"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
)

// The claim's SPIFFE identity steps are the identity service's
// (identity_service.go, identity_store.go); these
// phases run them and carry their failures into the claim's end.

// checkMisuse evicts a stolen identity and fails its claim
// (containStolenIdentity); it runs on every pass of a claim that is not
// being deleted, ended or not, until the eviction is done.
func (id *IdentityService) checkMisuse(ctx context.Context, s *claimScope) (phase.Result, error) {
	failure, retry := id.containStolen(ctx, s)
	if failure != "" {
		s.fail(claimEnd{reason: hfv1.EndFailed, condition: hfv1.IdentityStolenReason, message: failure})
	}
	return phase.Recheck(retry), nil
}

// secretSteps is the guest-secrets service of the claim of sc with this
// reconciler's dependencies and backoff.
func (r *Reconciler) secretSteps(sc *claimScope) *secretsService {
	s := &secretsService{Minter: r.Identity.Credentials, Memory: &r.memory, Recorder: r.Recorder, Clock: r.Clock, Backoff: func(*hfv1.MachineClaim) time.Duration { return sc.backoff() },
		NoRunner: sc.runsNoRunner(), WaitsForJob: sc.waitsForJob(), SecretsFile: agentconfig.SecretsFile}
	if sc.tmpl != nil && sc.tmpl.Spec.Guest != nil && sc.tmpl.Spec.Guest.OS == hfv1.GuestWindows {
		// The QEMU guest agent of a Windows VM takes a Windows path.
		s.SecretsFile = agentconfig.WindowsSecretsFile
	}
	if r.Identity.Issuer != nil {
		s.Identity = r.Identity.Issuer
	}
	return s
}

// ensureSecrets places the claim's secrets in its running VM
// (Deliver): its runner credential, or its join token and
// broker proof.
func (r *Reconciler) ensureSecrets(ctx context.Context, s *claimScope) (phase.Result, error) {
	steps := r.secretSteps(s)
	if s.tmpl != nil && s.tmpl.Spec.CloudInit != nil && s.tmpl.Spec.CloudInit.Delivery == hfv1.CloudInitDeliveryProxmox {
		// Proxmox's drive cannot carry the agent's configuration: it goes
		// the secrets' way, just before them.
		steps.AgentConfig = func(ctx context.Context) ([]byte, error) {
			var addrs []vmspec.StaticAddr
			if s.tmpl.Spec.Network.Mode == hfv1.NetworkModeStatic {
				var err error
				if addrs, _, err = r.addresses().forClaim(ctx, s, s.tmpl); err != nil {
					return nil, err
				}
			}
			c := &claimCloudInit{r: r, claim: s.claim, tmpl: s.tmpl, cluster: s.cluster, addrs: addrs}
			return c.AgentConfig(ctx)
		}
	}
	retry, failure, err := steps.Deliver(ctx, s.claim, &s.facts, s.provider)
	switch {
	case err != nil:
		return r.provisionError(ctx, s, err)
	case failure != "":
		reason := hfv1.GuestAgentRequiredReason
		if s.claim.Status.Identity != nil {
			reason = hfv1.AttestationFailedReason
		}
		s.fail(claimEnd{reason: hfv1.EndFailed, condition: reason, message: failure})
		return phase.Stop(), nil
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

// endPoweredOff records the end of a claim whose VM powered off: one whose
// agent refused to run the job fails with its reason (refusedByGuest), one
// that gave up on its join token before attesting says so, and one that
// found it used by someone else fails (its identity was stolen). The end
// list runs in the same pass.
func (r *Reconciler) endPoweredOff(ctx context.Context, s *claimScope, msg string) {
	if r.PowerOff.refusedByGuest(s, msg) {
		return
	}
	msg, reason := r.Identity.joinTokenGaveUp(ctx, s, s.cluster, msg)
	switch reason {
	case hfv1.IdentityStolenReason:
		s.fail(claimEnd{reason: hfv1.EndFailed, condition: reason, message: msg})
		return
	case "":
		reason = hfv1.VMPoweredOffReason
	}
	s.beginEnd(claimEnd{reason: hfv1.EndPoweredOff, condition: reason, message: msg})
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
