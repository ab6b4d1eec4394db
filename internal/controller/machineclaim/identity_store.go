package machineclaim

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/clusterconfig"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/secretref"
	"github.com/hyperfleet/hyperfleet/internal/secretstore"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// The VMs of a cluster with spec.spire.secretStore read their runner
// credential from a Vault or OpenBao server instead of the broker
// (docs/secrets-store.md): once a VM attested, Store mints its credential
// and writes it under the VM's path (identity.Deliver, whose doc comment
// has the restart-safety reasoning), and IdentityService.releaseOfGoneVM deletes it with the SPIRE
// entries at the claim's end.

// CredentialIssuer mints a claim's single-use runner credential and
// records what it issued in the claim's status.bootstrap (the broker's own
// issuance).
type CredentialIssuer interface {
	RunnerCredential(ctx context.Context, claim *hfv1.MachineClaim) (workload.Credential, error)
}

// StoreOpener opens the secrets store a cluster's spec.spire.secretStore
// names.
type StoreOpener func(ctx context.Context, cluster string, cfg *hfv1.SecretStoreConfig) (secretstore.Store, error)

// StoreResult is where a delivery through the secrets store stands.
type StoreResult int

const (
	// StoreNotNeeded: nothing to deliver (yet), or delivered; go on.
	StoreNotNeeded StoreResult = iota
	// StoreWait: the claim waits (a step to persist, or a failure
	// reported on its Bootstrapped condition).
	StoreWait
	// StoreDelivered: the credential was written; go on.
	StoreDelivered
)

// storeCredential writes the runner credential of a claim whose VM attested into its
// cluster's secrets store.
func (id *IdentityService) storeCredential(ctx context.Context, s *claimScope, cluster *hfv1.HypervisorCluster) (StoreResult, time.Duration) {
	claim := s.claim
	st, cfg := claim.Status.Identity, clusterconfig.SecretStoreOf(cluster)
	if cfg == nil || st == nil || st.AttestedAt == nil || st.CredentialStoredAt != nil || claim.Status.End != nil || claim.EndRequested() ||
		s.waitsForJob() {
		// A warm VM's credential is minted once its pool binds it a job
		// (jobbinding.go).
		return StoreNotNeeded, 0
	}
	if id.Credentials == nil {
		return id.storeFailed(s, hfv1.CredentialIssueFailedReason, errors.New("this operator runs no CI platform back-end that issues credentials"))
	}
	store, err := id.openSecretStore(ctx, s.client, cluster.Name, cfg)
	if err != nil {
		return id.storeFailed(s, storeReason(err), err)
	}
	mint := func(ctx context.Context, claim *hfv1.MachineClaim) (secretstore.Credential, error) {
		cred, err := id.Credentials.RunnerCredential(ctx, claim)
		if err != nil {
			return secretstore.Credential{}, errclass.Errorf(errclass.Classify(err), string(hfv1.CredentialIssueFailedReason), "%w", err)
		}
		return storedCredential(cred), nil
	}
	step, err := identity.Deliver(ctx, store, claim, s.clock.Now(), mint)
	switch {
	case err != nil:
		return id.storeFailed(s, storeReason(err), err)
	case step == identity.StoreRecorded:
		// Persisted before anything is minted or written.
		return StoreWait, time.Millisecond
	case step == identity.StoreWritten:
		s.facts.record(hfv1.MachineClaimBootstrappedCondition, metav1.ConditionFalse, hfv1.CredentialStoredReason,
			"The runner credential is in the secrets store for the VM ("+st.SPIFFEID+") to read once; waiting for its runner to come online")
		s.recorder.Eventf(claim, corev1.EventTypeNormal, string(hfv1.CredentialStoredReason), "Wrote the single-use runner credential of runner %s to the secrets store at %s for %s",
			runnerNameOf(claim), cfg.Address, st.SPIFFEID)
		return StoreDelivered, 0
	}
	return StoreNotNeeded, 0
}

// storeFailed reports a failed delivery on the claim's Bootstrapped
// condition and with an event, and retries with backoff.
func (id *IdentityService) storeFailed(s *claimScope, reason hfv1.ConditionReason, err error) (StoreResult, time.Duration) {
	claim := s.claim
	msg := "Could not hand the runner credential to the VM through the secrets store: " + err.Error()
	s.facts.record(hfv1.MachineClaimBootstrappedCondition, metav1.ConditionFalse, reason, msg)
	s.recorder.Event(claim, corev1.EventTypeWarning, "FailedStoreCredential", msg)
	return StoreWait, s.backoff()
}

// storeReason is the condition reason of a failed delivery.
func storeReason(err error) hfv1.ConditionReason {
	var classified *errclass.Error
	switch {
	case errors.As(err, &classified) && classified.Reason == string(hfv1.CredentialIssueFailedReason):
		return hfv1.CredentialIssueFailedReason
	case errclass.Classify(err) == errclass.ClassTransient:
		return hfv1.SecretStoreUnavailableReason
	case errors.Is(err, secretstore.ErrDenied), errors.Is(err, secretref.ErrMissing):
		return hfv1.SecretStoreDeniedReason
	case errclass.Classify(err) == errclass.ClassConfiguration || errclass.Classify(err) == errclass.ClassPermanent:
		return hfv1.SecretStoreDeniedReason
	}
	return hfv1.SecretStoreUnavailableReason
}

// forgetStoredCredential deletes from the cluster's secrets store whatever a
// delivery may have written for the claim's VM; done is false while the
// store cannot be reached.
func (id *IdentityService) forgetStoredCredential(ctx context.Context, s *claimScope, clusterName string) (bool, time.Duration) {
	claim := s.claim
	st := claim.Status.Identity
	if st == nil || st.CredentialRequestedAt == nil {
		return true, 0
	}
	if ref := claim.Status.VMRef; ref != nil {
		clusterName = ref.HypervisorCluster
	}
	cluster := &hfv1.HypervisorCluster{}
	if err := s.client.Get(ctx, client.ObjectKey{Name: clusterName}, cluster); err != nil {
		s.facts.ending(hfv1.SecretStoreUnavailableReason, fmt.Sprintf("Waiting for HypervisorCluster %s to delete the VM's credential from its secrets store: %v", clusterName, err))
		return false, s.backoff()
	}
	cfg := clusterconfig.SecretStoreOf(cluster)
	if cfg == nil {
		// The broker delivered it, or the store was removed from the
		// cluster since: there is no store to delete from.
		return true, 0
	}
	store, err := id.openSecretStore(ctx, s.client, cluster.Name, cfg)
	if err == nil {
		err = identity.Forget(ctx, store, claim)
	}
	if err != nil {
		s.facts.ending(storeReason(err), "Could not delete the VM's credential from the secrets store yet: "+err.Error())
		return false, s.backoff()
	}
	return true, 0
}

// openSecretStore opens a cluster's secrets store with StoreOpener, or, when
// unset, on Vault or OpenBao with the Secrets read through ReadSecret.
func (id *IdentityService) openSecretStore(ctx context.Context, c client.Client, cluster string, cfg *hfv1.SecretStoreConfig) (secretstore.Store, error) {
	if id.StoreOpener != nil {
		return id.StoreOpener(ctx, cluster, cfg)
	}
	return identity.OpenStore(ctx, cfg, clusterSecrets(c))
}

// storedCredential is cred as the store keeps it (agentconfig's document).
func storedCredential(cred workload.Credential) secretstore.Credential {
	out := secretstore.Credential{Method: agentconfig.BootstrapMethod(cred.Method), RegistrationURL: cred.RegistrationURL, Job: cred.Job}
	if spec, ok := agentconfig.LookupMethod(out.Method); ok && spec.JITConfig {
		out.JITConfig = cred.Secret.Reveal()
	} else if ok {
		out.RegistrationToken = cred.Secret.Reveal()
	}
	return out
}

func runnerNameOf(claim *hfv1.MachineClaim) string {
	if b := claim.Status.Bootstrap; b != nil {
		return b.RunnerName
	}
	return ""
}
