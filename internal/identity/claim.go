package identity

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/spire"
)

// Issuer issues, checks and releases the SPIFFE identity of claims' VMs.
//
// The join token is never stored, not even in the claim's status: it is
// derived from the claim's UID with a key only the operator holds (derived
// from the ownership key ring, pkg/ownership Signer.DerivedKeyByID, with
// the key id the claim's status records: keys.go), so the operator can
// place the same token in the VM after a restart or a key rotation, and
// asking the SPIRE server for a token that exists already changes nothing.
// A claim gets exactly one token: a VM that fails to attest fails the
// claim, and its replacement is another claim with another UID.
//
// The broker proof is derived the same way, from the claim's UID with a key
// of its own, and placed in the running VM with the token. The SPIRE server
// never sees it, so whoever attests with a join token that leaked from
// anywhere else (the server's datastore, an old seed, a log) holds the VM's
// SVID but not its proof, and the broker tells them apart.
type Issuer struct {
	// Keys is the ownership key ring the join tokens, broker proofs, TPM
	// enrollment proofs and TPM activation secrets are derived from, each
	// with a key of its own (keys.go): a proof says nothing about a token
	// and the other way round.
	Keys KeyRing
	// Install is the install's operator id (ownership.Signer.OperatorID):
	// the entries carry it as their hint (spire.InstallHint), which is how
	// the sweep knows its own.
	Install string
	// AgentUID is the uid the HyperFleet agent runs as inside the VM, the
	// selector of the VM's registration entry: 0, since its systemd unit
	// runs it as root while the runner and its jobs run as another user,
	// so a job cannot take the VM's SVID from the Workload API. The local
	// test world, whose simulated VMs are processes of the developer's
	// user, sets its own uid. A generic VM's entry selects its script's
	// user instead (Issue's scriptUser).
	AgentUID int
}

// ErrWrongProof: a proof a VM presented is not the one its claim's key
// derives.
var ErrWrongProof = errors.New("the proof is not the claim's")

// Plan is the identity of claim's VM on s: its SPIFFE ID, its agent's
// alias and its entry id. Recording it in the claim's status comes before
// anything is created on the SPIRE server.
func Plan(s *Server, claim *hfv1.MachineClaim) (*hfv1.IdentityStatus, error) {
	uid := string(claim.UID)
	vm, err := spire.VMID(s.TrustDomain, claim.Namespace, claim.Name, uid)
	if err != nil {
		return nil, fmt.Errorf("SPIFFE ID of claim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	node, err := spire.NodeID(s.TrustDomain, claim.Namespace, claim.Name, uid)
	if err != nil {
		return nil, fmt.Errorf("agent alias of claim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	return &hfv1.IdentityStatus{SPIFFEID: vm.String(), NodeID: node.String(), EntryID: spire.EntryIDFor(uid)}, nil
}

// Plan is the package's Plan with the id of the ownership key the
// identity's secrets are derived from (the ring's signing key now),
// recorded with it so that a later key rotation leaves them as they are.
func (i *Issuer) Plan(s *Server, claim *hfv1.MachineClaim) (*hfv1.IdentityStatus, error) {
	if i.Keys == nil {
		return nil, errNoKeyRing
	}
	plan, err := Plan(s, claim)
	if err != nil {
		return nil, err
	}
	id := int32(i.Keys.SigningKeyID()) //nolint:gosec // key ids are small (ownership Secret keys hmac-key-<n>)
	plan.KeyID = &id
	return plan, nil
}

// Token is the claim's join token.
func (i *Issuer) Token(claim *hfv1.MachineClaim) (string, error) {
	key, _, err := i.key(claim, purposeJoinToken)
	if err != nil {
		return "", err
	}
	return spire.DeriveJoinToken(key, string(claim.UID), 1), nil
}

// BrokerProof is the claim's broker proof: HMAC-SHA256, with the broker
// key of the claim's ownership key, over "hyperfleet broker proof", a NUL
// and the claim's UID, base64url without padding (43 characters).
func (i *Issuer) BrokerProof(claim *hfv1.MachineClaim) (string, error) {
	key, _, err := i.key(claim, purposeBroker)
	if err != nil {
		return "", err
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("hyperfleet broker proof\x00" + string(claim.UID)))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil)), nil
}

// VerifyBrokerProof checks that proof is the claim's broker proof,
// compared in constant time: nil when it is, ErrWrongProof when it is not,
// and an error wrapping ErrKeyUnavailable when the claim's key is gone
// from the ring (nothing can be checked then; it is not the VM's fault).
func (i *Issuer) VerifyBrokerProof(claim *hfv1.MachineClaim, proof string) error {
	want, err := i.BrokerProof(claim)
	if err != nil {
		return err
	}
	if subtle.ConstantTimeCompare([]byte(want), []byte(proof)) != 1 {
		return ErrWrongProof
	}
	return nil
}

// GuestSecrets is what the operator places in the claim's running VM
// (agentconfig.GuestSecrets): its broker proof, and its join token or,
// for a VM that attests with its TPM, its enrollment proof.
func (i *Issuer) GuestSecrets(claim *hfv1.MachineClaim) (agentconfig.GuestSecrets, error) {
	proof, err := i.BrokerProof(claim)
	if err != nil {
		return agentconfig.GuestSecrets{}, err
	}
	if UsesTPM(claim) {
		enroll, err := i.EnrollmentProof(claim)
		if err != nil {
			return agentconfig.GuestSecrets{}, err
		}
		return agentconfig.GuestSecrets{EnrollmentProof: enroll, BrokerProof: proof}, nil
	}
	token, err := i.Token(claim)
	if err != nil {
		return agentconfig.GuestSecrets{}, err
	}
	return agentconfig.GuestSecrets{JoinToken: token, BrokerProof: proof}, nil
}

// Issue creates the claim's join token, with the agent alias of its
// recorded identity, and the VM's registration entry, on s. Both steps
// are idempotent, so a pass interrupted between them is simply repeated.
// It returns when the token expires. scriptUser is whom the entry is for
// (vmEntry): empty for a CI platform's VM, a generic VM's script user.
func (i *Issuer) Issue(ctx context.Context, s *Server, claim *hfv1.MachineClaim, ttl time.Duration, scriptUser string) (time.Time, error) {
	st, vm, node, err := recorded(s, claim)
	if err != nil {
		return time.Time{}, err
	}
	token, err := i.Token(claim)
	if err != nil {
		return time.Time{}, err
	}
	expires, err := s.API.CreateJoinToken(ctx, token, ttl, node)
	if err != nil {
		return time.Time{}, fmt.Errorf("create the join token of %s: %w", vm, err)
	}
	entry := i.vmEntry(st, vm, node, scriptUser)
	if d := s.Config.SVIDTTL; d != nil {
		entry.X509SVIDTTL = d.Duration
	}
	if err := s.API.EnsureEntry(ctx, entry); err != nil {
		return time.Time{}, fmt.Errorf("create the registration entry of %s: %w", vm, err)
	}
	return expires, nil
}

// vmEntry is the VM's registration entry on the agent with alias node:
// its SPIFFE ID for the HyperFleet agent (unix:uid:AgentUID), which
// fetches the runner credential with it while the runner and its jobs,
// another user, cannot; or, with a scriptUser, for that user by name
// (unix:user:<name>): a generic VM's script fetches its own SVIDs. The
// name is the one the agent config tells the VM's agent to run the script
// as (cloudinit.Vars.ScriptUser), from the same value in the claim
// controller, so the two cannot diverge.
func (i *Issuer) vmEntry(st *hfv1.IdentityStatus, vm, node spiffeid.ID, scriptUser string) spire.Entry {
	sel := spire.Selector{Type: "unix", Value: "uid:" + strconv.Itoa(i.AgentUID)}
	if scriptUser != "" {
		sel.Value = "user:" + scriptUser
	}
	return spire.Entry{
		ID:        st.EntryID,
		SPIFFEID:  vm,
		ParentID:  node,
		Selectors: []spire.Selector{sel},
		Hint:      i.hint(),
	}
}

// hint is the install's entry hint; none without an Install.
func (i *Issuer) hint() string {
	if i.Install == "" {
		return ""
	}
	return spire.InstallHint(i.Install)
}

// Attested reports whether the claim's VM agent has attested: the server
// lists an agent under the id its join token, or its DevID certificate,
// gives it.
func (i *Issuer) Attested(ctx context.Context, s *Server, claim *hfv1.MachineClaim) (bool, error) {
	id, ok, err := i.agentOf(s, claim)
	if err != nil || !ok {
		return false, err
	}
	_, found, err := s.API.Agent(ctx, id)
	if err != nil {
		return false, fmt.Errorf("look up the SPIRE agent of claim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	return found, nil
}

// Evict shuts out whoever holds the claim's identity after it was found
// misused: the agent that attested with the claim's join token is banned
// (the server renews none of its SVIDs and never lets it attest again; it
// stays listed as banned, for the record, until Release deletes it) and
// the VM's registration entry and the agent's alias entry are deleted, so
// that no SVID of the VM's SPIFFE ID is issued or renewed any more. Each
// step is idempotent. An X509-SVID already issued stays valid until it
// expires (spec.spire.svidTTL): X.509 SVIDs cannot be revoked.
func (i *Issuer) Evict(ctx context.Context, s *Server, claim *hfv1.MachineClaim) error {
	st, node, agent, err := i.claimAgent(s, claim)
	if err != nil {
		return err
	}
	if !agent.IsZero() {
		if err := s.API.BanAgent(ctx, agent); err != nil {
			return fmt.Errorf("ban the SPIRE agent %s of claim %s/%s: %w", agent, claim.Namespace, claim.Name, err)
		}
	}
	return deleteEntries(ctx, s, st, node)
}

// Release deletes the VM's registration entry, its agent's alias entry
// and the agent itself from s; each is idempotent. A deleted join-token
// agent cannot attest again: spire-agent stops on its next sync. An agent
// that attested with a DevID certificate could attest again with it until
// it expires, so it is banned instead, which revokes the certificate for
// SPIRE; the sweep deletes it once the certificate has expired.
func (i *Issuer) Release(ctx context.Context, s *Server, claim *hfv1.MachineClaim) error {
	st, node, agent, err := i.claimAgent(s, claim)
	if err != nil {
		return err
	}
	if err := deleteEntries(ctx, s, st, node); err != nil {
		return err
	}
	if agent.IsZero() {
		return nil
	}
	if UsesTPM(claim) {
		if err := s.API.BanAgent(ctx, agent); err != nil {
			return fmt.Errorf("ban the SPIRE agent %s of claim %s/%s: %w", agent, claim.Namespace, claim.Name, err)
		}
		return nil
	}
	if err := s.API.DeleteAgent(ctx, agent); err != nil {
		return fmt.Errorf("delete the SPIRE agent of claim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	return nil
}

// claimAgent is what Evict and Release act on: the claim's recorded
// identity, its agent's alias and the agent that attested with its join
// token or DevID certificate (zero when no DevID certificate was issued).
func (i *Issuer) claimAgent(s *Server, claim *hfv1.MachineClaim) (*hfv1.IdentityStatus, spiffeid.ID, spiffeid.ID, error) {
	st, _, node, err := recorded(s, claim)
	if err != nil {
		return nil, spiffeid.ID{}, spiffeid.ID{}, err
	}
	agent, _, err := i.agentOf(s, claim)
	if err != nil {
		return nil, spiffeid.ID{}, spiffeid.ID{}, err
	}
	return st, node, agent, nil
}

// agentOf is the id of the agent that attests for claim: the one its join
// token names, or the one its last DevID certificate names (ok false
// before one was issued).
func (i *Issuer) agentOf(s *Server, claim *hfv1.MachineClaim) (spiffeid.ID, bool, error) {
	if UsesTPM(claim) {
		id, ok := tpmAgent(s.TrustDomain, claim.Status.Identity)
		return id, ok, nil
	}
	token, err := i.Token(claim)
	if errors.Is(err, ErrKeyUnavailable) {
		// The claim's key was removed from the ring: its agent cannot be
		// named, but its entries (named by the status) are still deleted,
		// and a join-token agent without them gets no SVID.
		return spiffeid.ID{}, false, nil
	}
	if err != nil {
		return spiffeid.ID{}, false, err
	}
	return spire.JoinTokenAgentID(s.TrustDomain, token), true, nil
}

// deleteEntries deletes the VM's registration entry and its agent's
// alias entry (the join token's, or the TPM claim's node entry: both have
// the alias as SPIFFE ID); both are idempotent.
func deleteEntries(ctx context.Context, s *Server, st *hfv1.IdentityStatus, node spiffeid.ID) error {
	if err := s.API.DeleteEntries(ctx, st.EntryID); err != nil {
		return fmt.Errorf("delete registration entry %s: %w", st.EntryID, err)
	}
	if _, err := s.API.DeleteEntriesBySPIFFEID(ctx, node); err != nil {
		return fmt.Errorf("delete the alias entry %s: %w", node, err)
	}
	return nil
}

// recorded parses the identity recorded in the claim's status and checks
// it is the one Plan gives on s: a status edited by hand never names
// another claim's entry.
func recorded(s *Server, claim *hfv1.MachineClaim) (*hfv1.IdentityStatus, spiffeid.ID, spiffeid.ID, error) {
	st := claim.Status.Identity
	if st == nil {
		return nil, spiffeid.ID{}, spiffeid.ID{}, errors.New("the claim has no identity recorded")
	}
	want, err := Plan(s, claim)
	if err != nil {
		return nil, spiffeid.ID{}, spiffeid.ID{}, err
	}
	if *want != (hfv1.IdentityStatus{SPIFFEID: st.SPIFFEID, NodeID: st.NodeID, EntryID: st.EntryID}) {
		return nil, spiffeid.ID{}, spiffeid.ID{}, fmt.Errorf("status.identity (%s, %s) is not this claim's identity on trust domain %s (%s)", st.SPIFFEID, st.EntryID, s.TrustDomain, want.SPIFFEID)
	}
	vm, _ := spiffeid.FromString(st.SPIFFEID)
	node, _ := spiffeid.FromString(st.NodeID)
	return st, vm, node, nil
}
