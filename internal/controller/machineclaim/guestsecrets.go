// The guest-secrets service places a claim's secrets in its running VM, through
// the hypervisor's guest channel (provider.Provider.PlaceGuestFile), and
// nowhere else: never on the VM's seed (the NoCloud ISO on the hypervisor's
// storage) or its disk, where whoever reads the storage could use them
// first (docs/security.md, "Nothing replayable at rest"). One document,
// agentconfig.GuestSecrets at agentconfig.SecretsFile, carries what the
// VM's mode needs:
//
//   - a template that does not attest: the single-use runner credential,
//     issued only now, when the VM runs and its guest agent answers;
//   - a template that attests with SPIRE join tokens: the join token and
//     the broker proof (issued before the VM was built, derived again
//     here; the runner credential then comes from the broker).
//
// Each step is recorded in the claim's status, which the caller persists
// before the next: status.bootstrap.credentialRequestedAt before a runner
// credential is issued, credentialDeliveredAt (or, for the join token,
// status.identity.joinTokenDeliveredAt) after the write.

package machineclaim

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	idpkg "github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// guestRetry is how soon the secrets are offered again to a guest that
// cannot take them yet (its guest agent not up, or the directory they go
// in not made yet): the guest is booting, and its agent waits for them. Its
// ready hint wakes the claim sooner; the agent's secretsDeadline and the
// attestation deadline bound the retries.
const guestRetry = 2 * time.Second

// Minter issues a claim's single-use runner credential and records what
// it issued (runner name and id, never the secret) in its
// status.bootstrap (workloads.Platforms.RunnerCredential).
type Minter interface {
	RunnerCredential(ctx context.Context, claim *hfv1.MachineClaim) (workload.Credential, error)
}

// Identity derives a claim's join token and broker proof
// (identity.Issuer.GuestSecrets).
type Identity interface {
	GuestSecrets(claim *hfv1.MachineClaim) (agentconfig.GuestSecrets, error)
}

// secretsService places claims' secrets in their running VMs. Backoff is the
// claim's next retry delay after a transient failure (the reconciler's).
type secretsService struct {
	// Minter issues runner credentials; nil: claims that need one wait
	// (their Bootstrapped condition says why).
	Minter Minter
	// Identity derives join tokens and broker proofs; nil: no claim has
	// an identity to deliver.
	Identity Identity
	// Memory keeps the credentials issued and not yet placed (the
	// reconciler's claimMemory).
	Memory   *claimMemory
	Recorder record.EventRecorder
	Clock    clock.PassiveClock
	Backoff  func(*hfv1.MachineClaim) time.Duration
	// NoRunner is true for a claim whose VM runs no runner (generic): it
	// receives no runner credential, only its identity's secrets.
	NoRunner bool
	// WaitsForJob is true for a warm claim of a platform that binds every
	// VM to one job (jobbinding.go): no runner credential is asked for,
	// issued or placed until its pool binds it one.
	WaitsForJob bool
	// AgentConfig, when set, builds the agent's configuration file, which
	// Deliver places (cloudinit.GuestAgentConfigPath) before the secrets:
	// a VM whose seed cannot carry it (delivery proxmox) receives it
	// through the guest channel too.
	AgentConfig func(ctx context.Context) ([]byte, error)
	// SecretsFile is where the VM's agent waits for the secrets: the
	// agent config's secretsFile (agentconfig.SecretsFile, or
	// WindowsSecretsFile in a Windows VM). Empty means SecretsFile.
	SecretsFile string
}

// NeedsCredential reports whether the claim's running VM is to receive its
// runner credential through the guest channel and has not yet: its
// template does not attest (no status.identity) and no credential was
// issued for its seed by an operator from before the guest channel (a
// credentialIssuedAt without credentialRequestedAt, which such a VM
// already holds).
func NeedsCredential(claim *hfv1.MachineClaim) bool {
	if claim.Status.Identity != nil {
		return false
	}
	b := claim.Status.Bootstrap
	return b == nil || b.CredentialDeliveredAt == nil && (b.CredentialRequestedAt != nil || b.CredentialIssuedAt == nil)
}

// needsJoinToken reports whether the claim's running VM is to receive its
// join token (or TPM enrollment proof) and broker proof and has not yet.
func needsJoinToken(claim *hfv1.MachineClaim) bool {
	st := claim.Status.Identity
	return st.Issued() && !st.SecretsDelivered() && st.AttestedAt == nil && st.Misuse == nil
}

// Prepare records, in memory for the caller to persist, that a runner
// credential is about to be issued for the claim's VM
// (status.bootstrap.credentialRequestedAt), when it needs one and nothing
// says so yet. Deliver calls it before it issues the credential; the
// record is persisted with the delivery's, in the pass's one status write
// (see Deliver's "Restart safety"). It reports whether it recorded
// anything.
func (s *secretsService) Prepare(claim *hfv1.MachineClaim) bool {
	if s.NoRunner || s.WaitsForJob || !NeedsCredential(claim) {
		return false
	}
	if claim.Status.Bootstrap == nil {
		claim.Status.Bootstrap = &hfv1.BootstrapStatus{}
	}
	if claim.Status.Bootstrap.CredentialRequestedAt != nil {
		return false
	}
	claim.Status.Bootstrap.CredentialRequestedAt = &metav1.Time{Time: s.Clock.Now()}
	return true
}

// Deliver places the secrets the claim's running VM needs, once (see the
// package documentation).
//
// Restart safety. The request (credentialRequestedAt), what was issued
// (the runner's name and id) and the delivery (credentialDeliveredAt) are
// persisted together, in the status write of the pass that placed the
// credential. A restart that loses a credential issued and not placed (its
// secret lived in this process only) finds no delivery recorded: the
// credential is issued again under the runner name derived from the
// claim, which removes the earlier, never started registration of that
// name (workloads.Platforms) and with it the worth of the lost secret.
// Recording the request in a write of its own before the issue (as this
// operator once did) changed nothing of that, and cost a status write per
// job. A restart between the placement and its record places the document
// again: a join token works once anyway, and a runner credential issued
// again replaces the first (an agent that already took the first then
// holds a worthless one, does not come online, and the claim is replaced
// as any VM that fails to register). Within this process a credential that could
// not be placed yet (the guest not ready) is kept in Memory and offered
// again, so that a slow guest costs no further registrations.
//
// It returns how soon to look again (zero: nothing to do now), or the
// message the claim fails with when the secrets can never be placed (a VM
// without a guest agent). An error is the provider's ErrNotOwned: the VM
// recorded for the claim does not carry its ownership marker, and nothing
// was written into it.
func (s *secretsService) Deliver(ctx context.Context, claim *hfv1.MachineClaim, facts *claimFacts, p provider.Provider) (retry time.Duration, failure string, err error) {
	ref := claim.Status.VMRef
	runner, identity := !s.NoRunner && !s.WaitsForJob && NeedsCredential(claim), needsJoinToken(claim)
	if !runner && !identity || ref == nil || claim.Status.End != nil || claim.EndRequested() ||
		!facts.isTrue(claim, hfv1.MachineClaimProvisionedCondition) {
		return 0, "", nil
	}
	if runner {
		// Recorded now, persisted with the delivery (or the reason it
		// waits) in this pass's status write.
		s.Prepare(claim)
	}
	if p == nil {
		// The cluster is not connected; its controller wakes the claim.
		return guestRetry, "", nil
	}
	if s.AgentConfig != nil {
		if retry, failure, done, err := s.placeAgentConfig(ctx, claim, facts, p, runner); !done {
			return retry, failure, err
		}
	}
	doc, what, err := s.document(ctx, claim, runner, identity)
	if err != nil {
		msg := "Could not issue the VM's " + what + " yet: " + err.Error()
		if c := facts.condition(claim, hfv1.MachineClaimBootstrappedCondition); c == nil || c.Message != conditions.Truncate(msg, 32768) {
			s.Recorder.Event(claim, corev1.EventTypeWarning, "FailedDeliverCredential", conditions.Truncate(msg, 1024))
		}
		s.pending(claim, facts, runner, msg)
		return s.Backoff(claim), "", nil
	}
	if doc.Fresh, err = s.freshness(); err != nil {
		return 0, "", err
	}
	doc.Fresh.Resumed = claim.Status.Standby != nil && claim.Status.Standby.ResumedAt != nil
	content, err := json.Marshal(doc)
	clear(doc.Fresh.Entropy)
	if err != nil {
		return 0, "", fmt.Errorf("encode the VM's secrets: %w", err)
	}
	file := provider.GuestFile{Path: cmp.Or(s.SecretsFile, agentconfig.SecretsFile), Content: content}
	err = p.PlaceGuestFile(ctx, vmspec.Owner(claim), vmRefOf(ref), file)
	clear(content)
	switch c := provider.Classify(err); {
	case err == nil:
		s.delivered(ctx, claim, facts, runner, identity)
		return 0, "", nil
	case errors.Is(err, provider.ErrNotOwned):
		s.Memory.dropMinted(claim.UID)
		return 0, "", err
	case errors.Is(err, provider.ErrGuestNotReady):
		s.pending(claim, facts, runner, "Waiting for the VM's guest to take its "+what+": "+err.Error())
		return guestRetry, "", nil
	case c == provider.ClassConfiguration || c == provider.ClassPermanent:
		s.Memory.dropMinted(claim.UID)
		return 0, fmt.Sprintf("the %s cannot be placed in VM %s, so the VM can never run its job: %v", what, ref.ID(), err), nil
	default:
		ctrl.LoggerFrom(ctx).Info("Placing the VM's secrets failed; retrying", "err", err.Error())
		s.pending(claim, facts, runner, "Could not place the "+what+" in the VM yet: "+err.Error())
		return s.Backoff(claim), "", nil
	}
}

// freshness is what the guest makes fresh before it uses the secrets
// (agentconfig.Freshness): this operator's time, the clock the
// credential's expiry is written in, and entropy drawn for this delivery
// alone. Every delivery carries it: a VM resumed from a suspend to disk
// needs it, and a cold one loses nothing by it.
func (s *secretsService) freshness() (*agentconfig.Freshness, error) {
	seed := make([]byte, agentconfig.FreshEntropyBytes)
	if _, err := rand.Read(seed); err != nil {
		return nil, fmt.Errorf("draw the VM's entropy: %w", err)
	}
	return &agentconfig.Freshness{Time: s.Clock.Now(), Entropy: seed}, nil
}

// placeAgentConfig places the agent's configuration in the claim's running
// VM. done is false when Deliver must return what it returns: the guest
// cannot take the file yet, or never will. Placing it again after a
// restart is harmless: the agent's path unit starts a unit that already
// runs, which is nothing.
func (s *secretsService) placeAgentConfig(ctx context.Context, claim *hfv1.MachineClaim, facts *claimFacts, p provider.Provider, runner bool) (retry time.Duration, failure string, done bool, err error) {
	const what = "agent configuration"
	content, err := s.AgentConfig(ctx)
	if err != nil {
		msg := "Could not build the VM's " + what + ": " + err.Error()
		s.pending(claim, facts, runner, msg)
		if c := provider.Classify(err); c == provider.ClassConfiguration || c == provider.ClassPermanent {
			return 0, msg, false, nil
		}
		return s.Backoff(claim), "", false, nil
	}
	file := provider.GuestFile{Path: cloudinit.GuestAgentConfigPath, Content: content}
	err = p.PlaceGuestFile(ctx, vmspec.Owner(claim), vmRefOf(claim.Status.VMRef), file)
	clear(content)
	switch c := provider.Classify(err); {
	case err == nil:
		return 0, "", true, nil
	case errors.Is(err, provider.ErrNotOwned):
		return 0, "", false, err
	case errors.Is(err, provider.ErrGuestNotReady):
		s.pending(claim, facts, runner, "Waiting for the VM's guest to take its "+what+": "+err.Error())
		return guestRetry, "", false, nil
	case c == provider.ClassConfiguration || c == provider.ClassPermanent:
		return 0, fmt.Sprintf("the %s cannot be placed in VM %s, so the VM can never run its job: %v", what, claim.Status.VMRef.ID(), err), false, nil
	default:
		ctrl.LoggerFrom(ctx).Info("Placing the VM's agent configuration failed; retrying", "err", err.Error())
		s.pending(claim, facts, runner, "Could not place the "+what+" in the VM yet: "+err.Error())
		return s.Backoff(claim), "", false, nil
	}
}

// document is what the claim's VM receives, and what it is called in
// conditions and events.
func (s *secretsService) document(ctx context.Context, claim *hfv1.MachineClaim, runner, identity bool) (agentconfig.GuestSecrets, string, error) {
	var doc agentconfig.GuestSecrets
	what := "join token"
	if idpkg.UsesTPM(claim) {
		what = "TPM enrollment proof"
	}
	if identity {
		if s.Identity == nil {
			return doc, what, errors.New("this operator issues no SPIFFE identities")
		}
		var err error
		if doc, err = s.Identity.GuestSecrets(claim); err != nil {
			return doc, what, err
		}
	}
	if !runner {
		return doc, what, nil
	}
	what = "runner credential"
	cred, err := s.credential(ctx, claim)
	if err != nil {
		return doc, what, err
	}
	// How the credential travels is its method's, which its platform
	// registered (agentconfig.MethodSpec): a JIT configuration, a token
	// with the URL it registers to, or a token for the endpoint the VM's
	// config names (with the job it is for, when it is one job's).
	spec, ok := agentconfig.LookupMethod(agentconfig.BootstrapMethod(cred.Method))
	switch {
	case !ok:
		return doc, what, fmt.Errorf("the CI platform issued a credential of method %q, which the agent does not take", cred.Method)
	case spec.JITConfig:
		doc.JITConfig = cred.Secret.Reveal()
	case spec.CarriesURL:
		doc.RegistrationToken, doc.RegistrationURL = cred.Secret.Reveal(), cred.RegistrationURL
	default:
		doc.RegistrationToken, doc.Job = cred.Secret.Reveal(), cred.Job
	}
	doc.ExpiresAt = cred.ExpiresAt
	return doc, what, nil
}

// credential is the claim's runner credential: the one issued earlier in
// this process and not placed yet, or a new one.
func (s *secretsService) credential(ctx context.Context, claim *hfv1.MachineClaim) (workload.Credential, error) {
	if cred, ok := s.Memory.mintedFor(claim); ok {
		return cred, nil
	}
	if s.Minter == nil {
		return workload.Credential{}, errors.New("this operator runs no CI platform back-end that issues credentials")
	}
	cred, err := s.Minter.RunnerCredential(ctx, claim)
	if err != nil {
		return workload.Credential{}, err
	}
	s.Memory.putMinted(claim.UID, cred)
	return cred, nil
}

// delivered records the write.
func (s *secretsService) delivered(ctx context.Context, claim *hfv1.MachineClaim, facts *claimFacts, runner, identity bool) {
	now := &metav1.Time{Time: s.Clock.Now()}
	ref := claim.Status.VMRef
	switch {
	case identity && idpkg.UsesTPM(claim):
		claim.Status.Identity.TPM.SecretsDeliveredAt = now
		facts.record(hfv1.MachineClaimAttestedCondition, metav1.ConditionFalse, hfv1.AttestationPendingReason,
			"The TPM enrollment proof is in the running VM ("+agentconfig.SecretsFile+"); waiting for its TPM to enroll and its spire-agent to attest")
		logRoutine(ctx, "EnrollmentProofDelivered", "Placed the TPM enrollment proof and the broker proof in VM %s through its guest agent", ref.ID())
		metrics.GuestSecretsDelivered.WithLabelValues("tpm").Inc()
	case identity:
		claim.Status.Identity.JoinTokenDeliveredAt = now
		facts.record(hfv1.MachineClaimAttestedCondition, metav1.ConditionFalse, hfv1.AttestationPendingReason,
			"The join token is in the running VM ("+agentconfig.SecretsFile+"); waiting for its spire-agent to attest")
		logRoutine(ctx, "JoinTokenDelivered", "Placed the join token and the broker proof in VM %s through its guest agent", ref.ID())
		metrics.GuestSecretsDelivered.WithLabelValues("join-token").Inc()
	}
	if runner {
		s.Memory.dropMinted(claim.UID)
		b := claim.Status.Bootstrap
		b.CredentialDeliveredAt = now
		facts.record(hfv1.MachineClaimBootstrappedCondition, metav1.ConditionFalse, hfv1.CredentialDeliveredReason,
			fmt.Sprintf("The runner credential of runner %s is in the running VM (%s); waiting for the runner to come online", b.RunnerName, agentconfig.SecretsFile))
		logRoutine(ctx, hfv1.CredentialDeliveredReason, "Placed the single-use runner credential of runner %s in VM %s through its guest agent", b.RunnerName, ref.ID())
		metrics.GuestSecretsDelivered.WithLabelValues("runner-credential").Inc()
	}
}

// pending says on the claim why its secrets are not in the VM yet.
func (s *secretsService) pending(claim *hfv1.MachineClaim, facts *claimFacts, runner bool, msg string) {
	if runner {
		facts.record(hfv1.MachineClaimBootstrappedCondition, metav1.ConditionFalse, hfv1.CredentialNotDeliveredReason, msg)
		return
	}
	facts.record(hfv1.MachineClaimAttestedCondition, metav1.ConditionFalse, hfv1.AttestationPendingReason, msg)
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
	if vmspec.UsesNativeDelivery(s.tmpl, s.cluster) {
		// The hypervisor's own cloud-init cannot carry the agent's
		// configuration: it goes the secrets' way, just before them.
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
