// The identity service carries out the SPIFFE identity of a MachineClaim
// whose template attests with SPIRE (spec.attestation.method join-token;
// docs/identity.md): each step is recorded in status.identity before the
// next is taken. IdentityService.issue plans the ids, then creates the join token
// and the registration entry before the VM is built; awaitAttestation waits
// for the VM's spire-agent to attest, failing the claim at the cluster's
// deadline; IdentityService.storeCredential hands the runner credential to the VM
// through the cluster's secrets store (identity_store.go); IdentityService.releaseOfGoneVM
// deletes the entries, the agent and the stored credential when the VM is
// gone. The SPIRE and secrets-store clients are
// internal/identity's; this service decides when to call them and what the
// claim says about it.

package machineclaim

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/clusterconfig"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/spire"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

const (
	// attestationRecheck is how often a VM whose agent has not attested
	// yet is looked up on the SPIRE server.
	attestationRecheck = 3 * time.Second
	// defaultJoinTokenTTL and defaultAttestationDeadline are the API's
	// defaults, for objects written before the defaults existed.
	defaultJoinTokenTTL        = 15 * time.Minute
	defaultAttestationDeadline = 10 * time.Minute
)

// IdentityService is the claims' SPIFFE identities and runner
// credentials: the clusters' SPIRE servers, the issuer of the VMs'
// identities on them, the credential broker, the runner credentials'
// issuer and the secrets stores they are written to, and what the VMs'
// power-off notices say about their identity.
type IdentityService struct {
	// Servers holds the clusters' SPIRE servers and Issuer issues VMs'
	// identities on them (templates with attestation join-token); nil
	// Issuer: such templates are refused.
	Servers *identity.Registry
	Issuer  *identity.Issuer
	// ScriptUser is the user generic VMs' agents run their script as;
	// empty: agentconfig.DefaultRunnerUser. One value for both places that
	// need it (scriptUser): the agent config and the SPIRE entry.
	ScriptUser string
	// Broker is the credential broker VMs that attest fetch their runner
	// credential from; nil when the operator runs none.
	Broker BrokerEndpoint
	// Credentials mints the runner credentials placed in running VMs
	// (templates that do not attest) and written to the secrets store of
	// clusters with spec.spire.secretStore; StoreOpener opens those stores
	// (nil: identity.OpenStore on Vault or OpenBao).
	Credentials CredentialIssuer
	StoreOpener StoreOpener
	// TokenRefusals are the VMs' power-off notices that their join token
	// was refused (a sign of a stolen identity); nil: none are taken.
	TokenRefusals TokenRefusals
	// AttestationErrors are what the VMs' power-off notices say about why
	// they got no identity (such as TPMNotFound); nil: none are taken.
	AttestationErrors AttestationErrors
}

// scriptUser is the user a VM of tmpl runs its generic script as, and
// the one its SPIRE registration entry selects by name (docs/generic.md,
// "Identity"): both the agent config (claimCloudInit.vars) and the entry
// (IdentityService.issue) take it from here, so the script is the one user of
// the VM that gets the VM's SVIDs. Empty for a template of a CI platform
// (the same test as vmspec.TemplateVars's): its entry selects the agent's
// uid, so that the runner's jobs get no SVID.
func (id *IdentityService) scriptUser(ws *workload.Backends, tmpl *hfv1.HypervisorMachineTemplate) string {
	be, _, ok := ws.Template(tmpl)
	if !ok || workload.HasRunner(be) {
		return ""
	}
	return cmp.Or(id.ScriptUser, agentconfig.DefaultRunnerUser)
}

// Attests reports whether the template's VMs attest with SPIRE, with a
// join token or with their TPM.
func Attests(tmpl *hfv1.HypervisorMachineTemplate) bool {
	m := tmpl.Spec.Attestation.Method
	return m == hfv1.AttestationJoinToken || m == hfv1.AttestationTPM
}

// issue issues the claim's identity before its VM is built. done is true
// when the claim needs nothing (more) issued; otherwise the claim waits
// requeue, having recorded a step or why it waits. An error is a
// classified failure for the caller to report (a refused request, an entry
// of ours taken by another identity).
func (id *IdentityService) issue(ctx context.Context, s *claimScope, tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster) (done bool, requeue time.Duration, err error) {
	claim := s.claim
	st := claim.Status.Identity
	if !Attests(tmpl) || claim.Status.VMRef != nil || st.Issued() {
		return true, 0, nil
	}
	srv, err := id.spireServer(ctx, cluster)
	if err != nil {
		id.waits(s, hfv1.SPIREUnavailableReason, "New VMs wait for the SPIRE server: "+err.Error())
		// A wait, reported in the condition, not a failed reconcile.
		return false, s.backoff(), nil //nolint:nilerr // the condition carries the error; the backoff paces the retries
	}
	if st == nil {
		plan, err := id.Issuer.Plan(srv, claim)
		if err != nil {
			return false, 0, err
		}
		// Recorded first: whatever is created on the SPIRE server from
		// here on is found again, and removed, through these ids, and
		// the VM's secrets are derived with the ownership key recorded
		// with them (keyID), whatever key rotation comes later.
		claim.Status.Identity = plan
		what := "its join token is not issued yet"
		if tmpl.Spec.Attestation.Method == hfv1.AttestationTPM {
			plan.TPM = &hfv1.TPMIdentityStatus{}
			what = "its SPIRE entries are not created yet"
		}
		s.facts.record(hfv1.MachineClaimAttestedCondition, metav1.ConditionFalse, hfv1.AttestationPendingReason,
			"The VM's SPIFFE ID is "+plan.SPIFFEID+"; "+what)
		return false, time.Millisecond, nil
	}
	if st.TPM != nil {
		return id.issueTPM(ctx, s, srv, id.scriptUser(s.workloads(), tmpl))
	}
	ttl := defaultJoinTokenTTL
	if jt := tmpl.Spec.Attestation.JoinToken; jt != nil && jt.TTL != nil {
		ttl = jt.TTL.Duration
	}
	expires, err := id.Issuer.Issue(ctx, srv, claim, ttl, id.scriptUser(s.workloads(), tmpl))
	if err != nil {
		requeue, err := id.issueFailed(ctx, s, err)
		return false, requeue, err
	}
	now := metav1.NewTime(s.clock.Now())
	st.JoinTokenCreatedAt, st.JoinTokenExpiresAt = &now, &metav1.Time{Time: expires}
	s.recorder.Eventf(claim, corev1.EventTypeNormal, "IdentityIssued", "Join token (valid until %s) and registration entry %s issued for %s",
		expires.UTC().Format(time.RFC3339), st.EntryID, st.SPIFFEID)
	// Stored before the VM's cloud-init is rendered with the token.
	return false, time.Millisecond, nil
}

// issueFailed sorts a failed request for the claim's identity: a
// permanent or configuration error is the caller's to report; any other
// waits (the Attested condition says why) and backs off.
func (id *IdentityService) issueFailed(ctx context.Context, s *claimScope, err error) (time.Duration, error) {
	if c := errclass.Classify(err); c == errclass.ClassPermanent || c == errclass.ClassConfiguration {
		return 0, fmt.Errorf("issue the VM's identity: %w", err)
	}
	id.waits(s, hfv1.SPIREUnavailableReason, "Could not issue the VM's identity: "+err.Error())
	ctrl.LoggerFrom(ctx).Info("Issuing the VM's identity failed", "err", err.Error())
	return s.backoff(), nil
}

// issueTPM creates the entries of a claim whose VM attests with
// its TPM: its agent's alias, selecting the DevID certificate's common
// name, and its registration entry. The DevID certificate itself is signed
// once the running VM's TPM enrolled (internal/tpmenroll).
func (id *IdentityService) issueTPM(ctx context.Context, s *claimScope, srv *identity.Server, scriptUser string) (done bool, requeue time.Duration, err error) {
	claim := s.claim
	st := claim.Status.Identity
	if err := id.Issuer.IssueTPM(ctx, srv, claim, scriptUser); err != nil {
		requeue, err := id.issueFailed(ctx, s, err)
		return false, requeue, err
	}
	st.TPM.EntriesCreatedAt = &metav1.Time{Time: s.clock.Now()}
	s.recorder.Eventf(claim, corev1.EventTypeNormal, "IdentityIssued", "Registration entry %s and the agent alias %s (selecting tpm_devid:subject:cn:%s) issued for %s",
		st.EntryID, st.NodeID, spire.DevIDCommonName(string(claim.UID)), st.SPIFFEID)
	return false, time.Millisecond, nil
}

// waits says on the Provisioned condition why a new VM waits.
func (id *IdentityService) waits(s *claimScope, reason hfv1.ConditionReason, msg string) {
	s.facts.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, reason, msg)
}

// awaitAttestation checks whether a running VM's agent attested. It returns
// how soon to look again (zero: no need), or, for a VM that has not
// attested by the cluster's deadline or whose token expired unused (a used
// or expired token makes spire-agent retry forever), the message the claim
// fails with.
func (id *IdentityService) awaitAttestation(ctx context.Context, s *claimScope, cluster *hfv1.HypervisorCluster) (recheck time.Duration, failure string) {
	claim := s.claim
	st := claim.Status.Identity
	provisioned := s.facts.condition(claim, hfv1.MachineClaimProvisionedCondition)
	if st == nil || st.AttestedAt != nil || !st.Issued() || st.Misuse != nil || provisioned == nil || provisioned.Status != metav1.ConditionTrue {
		return 0, ""
	}
	attested := func(msg string) {
		s.facts.record(hfv1.MachineClaimAttestedCondition, metav1.ConditionFalse, hfv1.AttestationPendingReason, msg)
	}
	srv, err := id.spireServer(ctx, cluster)
	if err == nil {
		var ok bool
		if ok, err = id.Issuer.Attested(ctx, srv, claim); err == nil && ok {
			st.AttestedAt = &metav1.Time{Time: s.clock.Now()}
			s.facts.record(hfv1.MachineClaimAttestedCondition, metav1.ConditionTrue, hfv1.AttestedReason,
				"The VM's spire-agent attested as "+st.NodeID)
			s.recorder.Eventf(claim, corev1.EventTypeNormal, string(hfv1.AttestedReason), "The VM's spire-agent attested; its SPIFFE ID is %s", st.SPIFFEID)
			return 0, ""
		}
	}
	now := s.clock.Now()
	since := provisioned.LastTransitionTime.Time
	if since.IsZero() {
		// Provisioned in this pass (a fact not yet stamped: the scope
		// stamps its transition when it closes): the VM came up now.
		since = now
	}
	deadline := since.Add(attestationDeadline(cluster))
	why := fmt.Sprintf("the VM's spire-agent did not attest within spec.spire.attestationDeadline (%s) of HypervisorCluster %s", attestationDeadline(cluster), cluster.Name)
	if exp := st.JoinTokenExpiresAt; exp != nil && exp.Before(&metav1.Time{Time: deadline}) {
		deadline = exp.Time
		why = fmt.Sprintf("the VM's join token expired at %s before its spire-agent attested (spec.attestation.joinToken.ttl is shorter than cloning and booting take)", exp.UTC().Format(time.RFC3339))
	}
	if !now.Before(deadline) {
		s.facts.record(hfv1.MachineClaimAttestedCondition, metav1.ConditionFalse, hfv1.AttestationFailedReason, why)
		s.recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.AttestationFailedReason), why)
		countAttestationFailure(claim, hfv1.AttestationFailedReason)
		return 0, why + "; the claim fails and its VM is destroyed. The agent's log in the VM's console says why (a reused or expired join token, or no route to the SPIRE server at spec.spire.serverAddress)"
	}
	msg := fmt.Sprintf("Waiting for the VM's spire-agent to attest (deadline %s)", deadline.UTC().Format(time.RFC3339))
	if err != nil {
		msg += "; the SPIRE server could not be asked: " + err.Error()
	}
	attested(msg)
	return min(attestationRecheck, deadline.Sub(now)+time.Millisecond), ""
}

// releaseOfGoneVM deletes the VM's entries and agent from the SPIRE server, and
// its credential from the secrets store, once its VM is gone; done is
// false while either cannot be reached (the claim keeps its finalizer
// until then, and its Ending condition says why).
func (id *IdentityService) releaseOfGoneVM(ctx context.Context, s *claimScope) (done bool, requeue time.Duration) {
	claim := s.claim
	st := claim.Status.Identity
	if st == nil || st.ReleasedAt != nil || id.Issuer == nil {
		return true, 0
	}
	sid, err := spiffeid.FromString(st.SPIFFEID)
	if err != nil {
		// Not an id this operator wrote; nothing of it can be on a server.
		return true, 0
	}
	srv, ok := id.Servers.ByTrustDomain(sid.TrustDomain())
	if !ok {
		s.facts.ending(hfv1.SPIREUnavailableReason, fmt.Sprintf("Waiting for the SPIRE server of trust domain %s to delete the VM's entry %s", sid.TrustDomain(), st.EntryID))
		return false, s.backoff()
	}
	if done, requeue := id.forgetStoredCredential(ctx, s, srv.Cluster); !done {
		return false, requeue
	}
	if err := id.Issuer.Release(ctx, srv, claim); err != nil {
		s.facts.ending(hfv1.SPIREUnavailableReason, "Could not delete the VM's SPIRE entries yet: "+err.Error())
		return false, s.backoff()
	}
	st.ReleasedAt = &metav1.Time{Time: s.clock.Now()}
	s.recorder.Eventf(claim, corev1.EventTypeNormal, "IdentityReleased", "Deleted SPIRE entry %s, the agent alias %s and the agent", st.EntryID, st.NodeID)
	return true, 0
}

// spireServer is the cluster's SPIRE server, connected on demand (the
// HypervisorCluster controller keeps it current and reports it).
func (id *IdentityService) spireServer(ctx context.Context, cluster *hfv1.HypervisorCluster) (*identity.Server, error) {
	cfg := cluster.Spec.SPIRE
	if cfg == nil {
		return nil, fmt.Errorf("HypervisorCluster %s has no spec.spire", cluster.Name)
	}
	if id.Servers == nil || id.Issuer == nil {
		return nil, fmt.Errorf("this operator was started without SPIRE support")
	}
	return id.Servers.Connect(ctx, cluster.Name, *cfg)
}

// vars fills in what the VM's agent needs to attest and fetch its
// credential: the trust bundle, the SPIRE server, and the broker or the
// secrets store. Not the join token: that reaches the running VM only
// (Deliver).
func (id *IdentityService) vars(ctx context.Context, c client.Client, claim *hfv1.MachineClaim, cluster *hfv1.HypervisorCluster, v *cloudinit.Vars) error {
	st := claim.Status.Identity
	if !st.Issued() {
		return fmt.Errorf("the claim's identity is not issued yet")
	}
	srv, err := id.spireServer(ctx, cluster)
	if err != nil {
		return err
	}
	_, pem := srv.Bundle()
	v.SPIFFEID, v.TrustDomain, v.TrustBundle = st.SPIFFEID, srv.TrustDomain.Name(), pem
	v.SPIREServerAddress = cluster.Spec.SPIRE.ServerAddress
	if cfg := clusterconfig.SecretStoreOf(cluster); cfg != nil {
		// The VM reads its credential from the store: no broker address.
		store, err := identity.StoreAgentConfig(ctx, cfg, st.SPIFFEID, clusterSecrets(c))
		if err != nil {
			return err
		}
		v.SecretStore, v.BrokerURL, v.BrokerCA = store, "", ""
		v.SecretStoreRole, v.SecretStorePath, v.SecretStoreCA = store.Role, store.Path, store.CABundle
	} else {
		if id.Broker == nil {
			return fmt.Errorf("this operator runs no credential broker: start the manager with the agent server (--agent-server-addr, --agent-server-url, --agent-server-cert, --agent-server-key)")
		}
		v.BrokerURL, v.BrokerCA = id.Broker.URL(), id.Broker.CA()
	}
	if exp := st.JoinTokenExpiresAt; exp != nil {
		v.ExpiresAt = cloudinit.Time{Time: exp.Time}
	}
	return nil
}

// joinTokenGaveUp says why a VM that powered off before its agent fetched its
// credential ended, when its identity is the reason; reason is empty
// otherwise. A VM whose agent gave up on its join token (it exits with code
// 9 when SPIRE refuses it: used, expired, or the server unreachable until
// its deadline) before it attested ends with AttestationFailed. One that
// reported its token refused while the SPIRE server lists an agent that
// attested with it had its identity stolen: the misuse is recorded (the
// claim's next pass evicts it) and the claim ends with IdentityStolen. The
// Attested condition and an event say which; msg is extended with why.
func (id *IdentityService) joinTokenGaveUp(ctx context.Context, s *claimScope, cluster *hfv1.HypervisorCluster, msg string) (string, hfv1.ConditionReason) {
	claim := s.claim
	st := claim.Status.Identity
	if !st.Issued() {
		return msg, ""
	}
	if st.Misuse != nil || st.TPM == nil && id.joinTokenReused(ctx, s, cluster) {
		return msg + ": " + stolenMessage(st), hfv1.IdentityStolenReason
	}
	if st.AttestedAt != nil {
		return msg, ""
	}
	reason := hfv1.AttestationFailedReason
	switch {
	case st.TPM != nil:
		var why string
		reason, why = id.tpmGaveUp(claim, s.clock.Now())
		msg += " before its spire-agent attested: " + why
	default:
		msg += " before its spire-agent attested: the VM's agent gave up on its join token (exit code 9: refused as used or expired, or the SPIRE server at spec.spire.serverAddress unreachable); its console says which"
	}
	s.facts.record(hfv1.MachineClaimAttestedCondition, metav1.ConditionFalse, reason, msg)
	s.recorder.Event(claim, corev1.EventTypeWarning, string(reason), msg)
	countAttestationFailure(claim, reason)
	return msg, reason
}

// tpmGaveUp says why the agent of a TPM claim's VM gave up, from what its
// power-off notice said.
func (id *IdentityService) tpmGaveUp(claim *hfv1.MachineClaim, now time.Time) (hfv1.ConditionReason, string) {
	var said string
	if id.AttestationErrors != nil {
		said = id.AttestationErrors.Error(claim.UID, now)
	}
	switch said {
	case agentconfig.AttestationTPMNotFound:
		return hfv1.TPMNotFoundReason, "the VM has no TPM 2.0 (its agent found none at spec.attestation.tpm.devicePath): set spec.attestation.tpm.addVirtualTPM, or give the hypervisor template a TPM 2.0 of its own (spec.attestation.tpm without addVirtualTPM makes the HypervisorMachineTemplate check it: its Ready condition says what its hypervisor needs) and the image its driver"
	case agentconfig.AttestationTPMEnrollmentRefused:
		return hfv1.TPMEnrollmentRefusedReason, "the operator refused the enrollment of the VM's TPM (the claim's TPMEnrollmentRefused events say why)"
	case agentconfig.AttestationTPMActivationFailed:
		return hfv1.AttestationFailedReason, "the VM's TPM could not open the operator's credential activation challenge (its EK certificate is not its own, or the TPM failed); the VM's console says more"
	}
	return hfv1.AttestationFailedReason, "the VM's agent gave up on TPM attestation (exit code 9: no TPM, its enrollment refused (the claim's TPMEnrollmentRefused events say why), or the SPIRE server at spec.spire.serverAddress unreachable); its console says which"
}

// countAttestationFailure counts a claim that failed to attest.
func countAttestationFailure(claim *hfv1.MachineClaim, reason hfv1.ConditionReason) {
	method := "join-token"
	if identity.UsesTPM(claim) {
		method = "tpm"
	}
	metrics.AttestationFailures.WithLabelValues(method, string(reason)).Inc()
}

// attestationDeadline is the cluster's spec.spire.attestationDeadline.
func attestationDeadline(cluster *hfv1.HypervisorCluster) time.Duration {
	if c := cluster.Spec.SPIRE; c != nil && c.AttestationDeadline != nil {
		return c.AttestationDeadline.Duration
	}
	return defaultAttestationDeadline
}

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

// containStolen acts on a misuse recorded in the claim's status: it says so on
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

// evict bans the agent of the claim's join token and deletes its entries
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
