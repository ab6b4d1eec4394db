package identity

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/secretstore"
	"github.com/hyperfleet/hyperfleet/internal/secretstore/vault"
)

// SecretReader reads one key of a Secret a cluster references; field
// names the reference for error messages.
type SecretReader func(ctx context.Context, field string, ref hfv1.SecretKeySelector) ([]byte, error)

// OpenStore builds the secrets store of a cluster's spec.spire.secretStore.
// The CA bundle is read now; the operator's token before every call, so a
// rotated token Secret is picked up without a restart. Nothing is sent to
// the store.
func OpenStore(ctx context.Context, cfg *hfv1.SecretStoreConfig, read SecretReader) (secretstore.Store, error) {
	vc, err := storeConfig(ctx, cfg, read)
	if err != nil {
		return nil, err
	}
	tokenRef := cfg.TokenRef
	vc.TokenFunc = func(ctx context.Context) (string, error) {
		b, err := read(ctx, "spec.spire.secretStore.tokenRef", tokenRef)
		return string(b), err
	}
	return vault.New(vc)
}

// storeConfig is the back-end's configuration of cfg, without the token.
func storeConfig(ctx context.Context, cfg *hfv1.SecretStoreConfig, read SecretReader) (vault.Config, error) {
	vc := vault.Config{
		Address: cfg.Address, KVMount: cmp.Or(cfg.KVMount, "secret"), PathPrefix: cmp.Or(cfg.PathPrefix, "hyperfleet"),
		AuthMount: cmp.Or(cfg.AuthMount, "jwt"), Audience: cmp.Or(cfg.Audience, "hyperfleet-secret-store"),
		VMPolicy: cmp.Or(cfg.VMPolicy, "hyperfleet-vm"),
	}
	if ref := cfg.CABundleRef; ref != nil {
		ca, err := read(ctx, "spec.spire.secretStore.caBundleRef", *ref)
		if err != nil {
			return vc, err
		}
		vc.CABundle = ca
	}
	return vc, nil
}

// StoreAgentConfig is the spiffe.secretStore block of the agent
// configuration of the VM whose SPIFFE ID is id: where it logs in, with
// which role and audience, and the path it reads. Nothing in it is secret.
func StoreAgentConfig(ctx context.Context, cfg *hfv1.SecretStoreConfig, id string, read SecretReader) (*agentconfig.SecretStore, error) {
	vc, err := storeConfig(ctx, cfg, read)
	if err != nil {
		return nil, err
	}
	sid, err := spiffeid.FromString(id)
	if err != nil {
		return nil, fmt.Errorf("the claim's SPIFFE ID %q: %w", id, err)
	}
	p, err := secretstore.Path(vc.PathPrefix, sid)
	if err != nil {
		return nil, err
	}
	role, err := vault.RoleName(sid)
	if err != nil {
		return nil, err
	}
	out := StoreSettings(cfg)
	out.CABundle, out.Role, out.Path = string(vc.CABundle), role, p
	return &out, nil
}

// StoreSettings is what the agent configuration of every VM of a cluster
// says of its secrets store, defaults applied: all but the per-VM role
// and path and the CA bundle (read from a Secret).
func StoreSettings(cfg *hfv1.SecretStoreConfig) agentconfig.SecretStore {
	return agentconfig.SecretStore{
		Address: cfg.Address, AuthMount: cmp.Or(cfg.AuthMount, "jwt"), Audience: cmp.Or(cfg.Audience, "hyperfleet-secret-store"),
		KVMount: cmp.Or(cfg.KVMount, "secret"),
	}
}

// Minter issues the claim's single-use runner credential and records what
// it issued (never the secret) in the claim's status.bootstrap: the
// broker's issuance (workloads.Platforms.RunnerCredential).
type Minter func(ctx context.Context, claim *hfv1.MachineClaim) (secretstore.Credential, error)

// StoreStep is what one Deliver call did; the caller persists the claim's
// status after every step but StoreDone.
type StoreStep int

const (
	// StoreDone: the credential was stored by an earlier pass.
	StoreDone StoreStep = iota
	// StoreRecorded: the intent was recorded (credentialRequestedAt);
	// nothing was minted or written. Persist, then call again.
	StoreRecorded
	// StoreWritten: the credential was minted and written to the store, and
	// credentialStoredAt and status.bootstrap are set. Persist.
	StoreWritten
)

// Deliver takes the claim's credential one step towards the store: first it
// records that a delivery begins, then, in a later call, it mints the
// credential and writes it under the VM's path. The claim's VM must have
// attested.
//
// Restart safety. The caller persists the status after each step, and a
// restart may come between any two actions, so every call works from what
// the status says:
//
//   - credentialRequestedAt is persisted before anything is minted or
//     written. A claim without it has nothing in the store, and its end
//     needs no Store.Delete; one with it gets the Delete (idempotent), so a
//     write whose recording was lost is never left behind.
//   - With credentialRequestedAt set and credentialStoredAt unset, an
//     earlier attempt may have been cut off anywhere: before minting, after
//     minting (a registered runner, its secret lost with the process), or
//     after the write (the secret in the store, perhaps read by the VM
//     already). Nothing tells these apart, so the attempt is repeated so that
//     it replaces rather than adds: Store.Delete first removes an earlier
//     write, then minting registers the runner under the name derived from
//     the claim, which removes an earlier, never started registration of
//     that name (workloads.Platforms.issue) and with it the worth of any earlier
//     secret. Put is create-only (check-and-set 0): it never overwrites, so
//     a write it did not expect fails with secretstore.ErrExists instead of
//     replacing a credential unseen.
//   - status.bootstrap (runner name and id) is set by minting, whether or
//     not the write then succeeds, and credentialStoredAt after Put
//     succeeded; the caller persists both in one status write, and the
//     claim's runner is cleaned up by id like any other. A registration
//     whose recording a restart lost is replaced by the next attempt, or,
//     if the claim ends first, removed by the orphan sweep (its name is
//     marked as this install's).
//
// At most one credential is thus ever usable for a claim, and nothing of
// it outlives the claim. The one loss: a VM that read an earlier write
// in the moment before a restart holds a credential the repeat makes
// worthless (or, its runner already online, the repeat is refused as a
// taken runner name); its runner does not start and the claim is replaced
// by the pool's bootstrap timeout, as for any VM that fails to register.
func Deliver(ctx context.Context, store secretstore.Store, claim *hfv1.MachineClaim, now time.Time, mint Minter) (StoreStep, error) {
	st := claim.Status.Identity
	switch {
	case st == nil || st.AttestedAt == nil:
		return StoreDone, errors.New("the claim's VM has not attested yet")
	case st.CredentialStoredAt != nil:
		return StoreDone, nil
	case st.CredentialRequestedAt == nil:
		st.CredentialRequestedAt = &metav1.Time{Time: now}
		return StoreRecorded, nil
	}
	id, err := spiffeid.FromString(st.SPIFFEID)
	if err != nil {
		return StoreDone, fmt.Errorf("status.identity.spiffeID %q: %w", st.SPIFFEID, err)
	}
	if err := store.Delete(ctx, id); err != nil {
		return StoreDone, fmt.Errorf("clear an earlier attempt's credential for %s from the secrets store: %w", id, err)
	}
	cred, err := mint(ctx, claim)
	if err != nil {
		return StoreDone, fmt.Errorf("issue the runner credential: %w", err)
	}
	if err := store.Put(ctx, id, cred); err != nil {
		// status.bootstrap keeps the runner just registered, so that the
		// claim's end removes it if no later attempt replaces it first.
		return StoreDone, fmt.Errorf("write the runner credential to the secrets store: %w", err)
	}
	st.CredentialStoredAt = &metav1.Time{Time: now}
	return StoreWritten, nil
}

// Forget removes whatever a delivery may have written for the claim's VM:
// its credential and its login role. Idempotent; a claim that never began
// a delivery needs no call.
func Forget(ctx context.Context, store secretstore.Store, claim *hfv1.MachineClaim) error {
	st := claim.Status.Identity
	if st == nil || st.CredentialRequestedAt == nil {
		return nil
	}
	id, err := spiffeid.FromString(st.SPIFFEID)
	if err != nil {
		return nil //nolint:nilerr // not an id this operator wrote: nothing was stored under it
	}
	if err := store.Delete(ctx, id); err != nil {
		return fmt.Errorf("delete the credential of %s from the secrets store: %w", id, err)
	}
	return nil
}
