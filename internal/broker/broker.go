// Package broker is the credential broker: the HTTPS endpoint a VM that
// attested with SPIRE calls, with its X509-SVID as client certificate, to
// receive its single-use runner credential at the last moment
// (docs/identity.md). Nothing that can run a job is ever in such a VM's
// cloud-init: its join token only proves who it is.
//
// A request is answered with a credential only if every check holds: a
// client certificate that go-spiffe verifies as an X509-SVID against the
// trust bundle of a SPIRE server some HypervisorCluster names; a SPIFFE ID
// of the VM shape (spiffe://<td>/vm/<namespace>/<claim>/<uid>) naming a
// live claim with that UID, whose status records exactly that identity and
// a VM, and that has not asked before; and the claim's broker proof in the
// request (agentconfig.BrokerProofHeader), which the operator placed in
// the VM alone. A valid SVID without that proof was obtained with a join
// token stolen from somewhere: the broker records the misuse in the
// claim, which fails without a credential (internal/controller/machineclaim, identity_store.go).
//
// Nothing an unauthenticated caller sends makes the broker call SPIRE at
// will or wait on what issuance needs: trust bundles are read from the
// identity registry, which reads a server's bundle again for a
// certificate that does not verify at most once per
// --spire-forced-refresh-interval (identity.Registry.Refresh). The request is recorded in the
// claim (status.identity.credentialRequestedAt, written under the claim's
// resourceVersion, so of two racing requests on any replicas one wins)
// before the credential is minted, and what was minted is recorded before
// it is returned. Those records, and a misuse, are the only things the
// broker writes in a claim (recordFacts): facts, never a condition or
// the phase, which the claim reconciler derives from them. Every refusal has its own HTTP status and reason, an
// event on the claim when one is identified, and a count in
// hyperfleet_broker_requests_total.
//
// Every replica serves it (it is part of the agent server, which needs no
// leader election): it reads claims from the API server, not a cache.
package broker

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/httpsserver"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/spire"
	"github.com/hyperfleet/hyperfleet/internal/vmanswer"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// Path is where the agent server mounts the broker.
const Path = "/broker/v1/credential"

// Issuer mints a claim's single-use runner credential and records what it
// issued (never the secret) in claim.Status.Bootstrap
// (workloads.Platforms.RunnerCredential).
type Issuer interface {
	RunnerCredential(ctx context.Context, claim *hfv1.MachineClaim) (workload.Credential, error)
}

// JobWaiter is implemented by an Issuer that knows which claims' VMs wait,
// with no credential, for their RunnerPool to bind them a job (a warm VM
// of a platform that gives a VM a credential for its one job only:
// internal/workloads, binding.go). The broker answers such a VM to ask
// again before it writes anything: a credential request it records, and
// undoes, on every poll of every warm VM would be two API writes per VM
// every few seconds.
type JobWaiter interface {
	WaitingForJob(ctx context.Context, claim *hfv1.MachineClaim) bool
}

// Broker serves Path.
type Broker struct {
	// Client writes claims' status; Reader reads claims from the API
	// server (fresh, not a cache); Clusters lists HypervisorClusters (a
	// cache is fine) to find the SPIRE server of a trust domain.
	Client   client.Client
	Reader   client.Reader
	Clusters client.Reader
	// Identity holds the SPIRE servers whose bundles verify SVIDs.
	Identity *identity.Registry
	Issuer   Issuer
	// Proofs verifies the broker proofs VMs present (the operator's
	// identity.Issuer); without it every proof is refused.
	Proofs   ProofVerifier
	Recorder record.EventRecorder
	Clock    clock.PassiveClock
	// Limiter bounds the credentials minted per second across all VMs
	// (each one costs CI platform API calls); nil: 10/s, bursts of 20.
	Limiter *rate.Limiter

	// setup fills in the defaults once (Limiter, refusals' message).
	setup    sync.Once
	refusals httpsserver.RefusalLog
}

// ProofVerifier checks a claim's broker proof (identity.Issuer): nil when
// it is the claim's, identity.ErrWrongProof when it is not, an error
// wrapping identity.ErrKeyUnavailable when the ownership key it is
// derived from is gone from the ring.
type ProofVerifier interface {
	VerifyBrokerProof(claim *hfv1.MachineClaim, proof string) error
}

// Response is the body of a 200 answer: the credential, in the shape the
// agent reads (internal/agent).
type Response struct {
	Method            string    `json:"method"`
	JITConfig         string    `json:"jitConfig,omitempty"`
	RegistrationToken string    `json:"registrationToken,omitempty"`
	RegistrationURL   string    `json:"registrationURL,omitempty"`
	Job               string    `json:"job,omitempty"` // the job of a Buildkite job acquisition token
	ExpiresAt         time.Time `json:"expiresAt,omitzero"`
}

// Refusal is the body of every other answer.
type Refusal = vmanswer.Body

// Reasons of refusals, as the agent and the metrics see them.
const (
	ReasonDelivered           = "Delivered"
	ReasonMethodNotAllowed    = "MethodNotAllowed"
	ReasonRateLimited         = "RateLimited"
	ReasonNoClientCertificate = "NoClientCertificate"
	ReasonUnknownTrustDomain  = "UnknownTrustDomain"
	ReasonInvalidSVID         = "InvalidSVID"
	ReasonNotAVMIdentity      = "NotAVMIdentity"
	ReasonNoLiveClaim         = "NoLiveClaim"
	ReasonNotBootstrapping    = "NotBootstrapping"
	ReasonBrokerProofInvalid  = "BrokerProofInvalid"
	ReasonKeyUnavailable      = "OwnershipKeyUnavailable"
	ReasonIdentityCompromised = "IdentityCompromised"
	ReasonAlreadyIssued       = "CredentialAlreadyIssued"
	ReasonBusy                = "Busy"
	ReasonIssueFailed         = "IssueFailed"
	// ReasonWaitingForJob: the claim's VM stands by until its pool binds
	// it a job; it asks again (503, Retry-After).
	ReasonWaitingForJob = "WaitingForJob"
)

// ServeHTTP implements http.Handler.
func (b *Broker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.setup.Do(func() {
		b.Limiter = httpsserver.LimiterOr(b.Limiter)
		b.refusals.Message = "Credential broker refused requests (see hyperfleet_broker_requests_total)"
	})
	ctx := r.Context()
	claim, resp, ref := b.handle(ctx, r)
	if ref == nil {
		metrics.BrokerRequests.WithLabelValues(ReasonDelivered).Inc()
		vmanswer.WriteOK(w, resp)
		return
	}
	metrics.BrokerRequests.WithLabelValues(ref.Reason).Inc()
	kv := []any{"remote", r.RemoteAddr, "message", ref.Message}
	if claim != nil {
		kv = append(kv, "MachineClaim", client.ObjectKeyFromObject(claim).String())
		if !ref.Transient() {
			b.Recorder.Eventf(claim, corev1.EventTypeWarning, "CredentialRefused", "The credential broker refused the VM's request (%s): %s", ref.Reason, ref.Message)
		}
	}
	// Each refusal at debug level, a summary at most every 10 s (a flood
	// of refusals used to be a flood of Info lines); a claim's own
	// refusals are events on it besides.
	b.refusals.Refused(ctrl.LoggerFrom(ctx), ref.Reason, "Credential broker refused a request", kv...)
	httpsserver.DropConnection(w)
	vmanswer.Write(w, ref)
}

// handle runs the checks in order; claim is set once one is identified.
func (b *Broker) handle(ctx context.Context, r *http.Request) (*hfv1.MachineClaim, *Response, *vmanswer.Refusal) {
	if r.Method != http.MethodPost {
		return nil, nil, vmanswer.Refuse(http.StatusMethodNotAllowed, ReasonMethodNotAllowed, "use POST")
	}
	id, ref := b.authenticate(ctx, r)
	if ref != nil {
		return nil, nil, ref
	}
	claim, ref := b.liveClaim(ctx, id, r.Header.Get(agentconfig.BrokerProofHeader), r.RemoteAddr)
	if ref != nil {
		return claim, nil, ref
	}
	// Limited after the identity checks, so that strangers cannot use up
	// the VMs' budget.
	if !b.Limiter.Allow() {
		return claim, nil, vmanswer.Refuse(http.StatusTooManyRequests, ReasonRateLimited, "too many credentials requested at once; retry shortly").After(time.Second)
	}
	resp, ref := b.deliver(ctx, claim)
	return claim, resp, ref
}

// authenticate verifies the client certificate as an X509-SVID of a
// trust domain some HypervisorCluster's spec.spire names.
func (b *Broker) authenticate(ctx context.Context, r *http.Request) (spiffeid.ID, *vmanswer.Refusal) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return spiffeid.ID{}, vmanswer.Refuse(http.StatusUnauthorized, ReasonNoClientCertificate, "present the VM's X509-SVID as the TLS client certificate")
	}
	certs := r.TLS.PeerCertificates
	claimed, err := x509svid.IDFromCert(certs[0])
	if err != nil {
		return spiffeid.ID{}, vmanswer.Refuse(http.StatusUnauthorized, ReasonInvalidSVID, "the client certificate is not an X509-SVID: %v", err)
	}
	srv, ref := b.serverOf(ctx, claimed.TrustDomain())
	if ref != nil {
		return spiffeid.ID{}, ref
	}
	bundle, _ := srv.Bundle()
	id, _, err := x509svid.Verify(certs, bundle)
	if err != nil {
		// A bundle read before a CA rotation may miss the new authority:
		// read it once more before refusing, unless it was read moments
		// ago (anyone can make a certificate that does not verify).
		if rerr := b.Identity.Refresh(ctx, srv); rerr == nil {
			bundle, _ = srv.Bundle()
			id, _, err = x509svid.Verify(certs, bundle)
		}
	}
	if err != nil {
		return spiffeid.ID{}, vmanswer.Refuse(http.StatusForbidden, ReasonInvalidSVID, "the X509-SVID does not verify against the trust bundle of %s: %v", claimed.TrustDomain(), err)
	}
	return id, nil
}

// serverOf is the connected SPIRE server of td, connecting through a
// HypervisorCluster that names it (the broker may run on a replica whose
// controllers are idle); its bundle is read only as Registry.Lookup allows.
func (b *Broker) serverOf(ctx context.Context, td spiffeid.TrustDomain) (*identity.Server, *vmanswer.Refusal) {
	if s, ok := b.Identity.ByTrustDomain(td); ok {
		return s, nil
	}
	var clusters hfv1.HypervisorClusterList
	if err := b.Clusters.List(ctx, &clusters); err != nil {
		return nil, vmanswer.Refuse(http.StatusServiceUnavailable, ReasonBusy, "list HypervisorClusters: %v", err).After(2 * time.Second)
	}
	var lastErr error
	for i := range clusters.Items {
		c := &clusters.Items[i]
		if c.Spec.SPIRE == nil || c.Spec.SPIRE.TrustDomain != td.Name() {
			continue
		}
		s, err := b.Identity.Lookup(ctx, c.Name, *c.Spec.SPIRE)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	if lastErr != nil {
		return nil, vmanswer.Refuse(http.StatusServiceUnavailable, ReasonBusy, "the trust bundle of SPIRE server %s is not at hand: %v", td, lastErr).After(5 * time.Second)
	}
	return nil, vmanswer.Refuse(http.StatusForbidden, ReasonUnknownTrustDomain, "no HypervisorCluster's spec.spire names trust domain %s", td)
}

// liveClaim is the claim id names, if it is alive, records exactly that
// identity and a VM, and proof is its broker proof.
func (b *Broker) liveClaim(ctx context.Context, id spiffeid.ID, proof, remote string) (*hfv1.MachineClaim, *vmanswer.Refusal) {
	ns, name, uid, err := spire.ParseVMID(id.TrustDomain(), id)
	if err != nil {
		return nil, vmanswer.Refuse(http.StatusForbidden, ReasonNotAVMIdentity, "%s is not a HyperFleet VM identity: %v", id, err)
	}
	claim := &hfv1.MachineClaim{}
	if err := b.Reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, claim); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, vmanswer.Refuse(http.StatusForbidden, ReasonNoLiveClaim, "no MachineClaim %s/%s exists", ns, name)
		}
		return nil, vmanswer.Refuse(http.StatusServiceUnavailable, ReasonBusy, "read MachineClaim %s/%s: %v", ns, name, err).After(2 * time.Second)
	}
	st := claim.Status.Identity
	switch {
	case string(claim.UID) != uid:
		return nil, vmanswer.Refuse(http.StatusForbidden, ReasonNoLiveClaim, "MachineClaim %s/%s is another claim than %s (uid %s)", ns, name, id, claim.UID)
	case st == nil || st.SPIFFEID != id.String() || !st.Issued():
		return claim, vmanswer.Refuse(http.StatusForbidden, ReasonNoLiveClaim, "MachineClaim %s/%s was issued no identity %s", ns, name, id)
	case st.Misuse != nil:
		return claim, vmanswer.Refuse(http.StatusForbidden, ReasonIdentityCompromised, "the identity %s of MachineClaim %s/%s was used by someone other than its VM (%s); no credential is handed out for it",
			id, ns, name, st.Misuse.Reason)
	}
	if ref := b.checkProof(ctx, claim, id, proof, remote); ref != nil {
		return claim, ref
	}
	switch {
	case !claim.DeletionTimestamp.IsZero() || claim.EndRequested() || claim.Status.End != nil:
		return claim, vmanswer.Refuse(http.StatusForbidden, ReasonNotBootstrapping, "MachineClaim %s/%s is ending", ns, name)
	case claim.Status.VMRef == nil:
		return claim, vmanswer.Refuse(http.StatusForbidden, ReasonNotBootstrapping, "MachineClaim %s/%s has no VM", ns, name)
	case st.CredentialRequestedAt != nil:
		return claim, vmanswer.Refuse(http.StatusConflict, ReasonAlreadyIssued, "the VM of MachineClaim %s/%s asked for its credential already, at %s; a credential is handed out once",
			ns, name, st.CredentialRequestedAt.UTC().Format(time.RFC3339))
	}
	cluster := &hfv1.HypervisorCluster{}
	if err := b.Clusters.Get(ctx, client.ObjectKey{Name: claim.Status.VMRef.HypervisorCluster}, cluster); client.IgnoreNotFound(err) != nil {
		return claim, vmanswer.Refuse(http.StatusServiceUnavailable, ReasonBusy, "read HypervisorCluster %s: %v", claim.Status.VMRef.HypervisorCluster, err).After(2 * time.Second)
	}
	if c := cluster.Spec.SPIRE; c != nil && c.SecretStore != nil {
		// The operator writes this VM's credential to the store; a second
		// one from the broker would make two.
		return claim, vmanswer.Refuse(http.StatusForbidden, ReasonNotBootstrapping, "the VMs of HypervisorCluster %s read their runner credential from its secrets store (spec.spire.secretStore), not from the broker", cluster.Name)
	}
	return claim, nil
}

// checkProof refuses a request whose broker proof is not its claim's,
// which is a stolen identity (stolen); a proof that cannot be checked,
// its claim's ownership key gone from the ring, is refused without a
// misuse: the key was removed while the claim was in flight, which is not
// the VM's doing.
func (b *Broker) checkProof(ctx context.Context, claim *hfv1.MachineClaim, id spiffeid.ID, proof, remote string) *vmanswer.Refusal {
	if b.Proofs == nil {
		return b.stolen(ctx, claim, id, proof, remote)
	}
	err := b.Proofs.VerifyBrokerProof(claim, proof)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, identity.ErrWrongProof):
		return b.stolen(ctx, claim, id, proof, remote)
	}
	return vmanswer.Refuse(http.StatusForbidden, ReasonKeyUnavailable, "the broker proof of MachineClaim %s/%s cannot be checked: %v", claim.Namespace, claim.Name, err)
}

// stolen refuses a valid SVID presented without its claim's broker proof:
// whoever holds it attested with the claim's join token without being the
// VM. The misuse is recorded in the claim (under its resourceVersion; a
// conflict reads it again), which the claim controller then evicts and
// fails; the request is refused whether or not the record could be
// written, and a later request records it if it could not.
func (b *Broker) stolen(ctx context.Context, claim *hfv1.MachineClaim, id spiffeid.ID, proof, remote string) *vmanswer.Refusal {
	what := "without a broker proof"
	if proof != "" {
		what = "with a broker proof that is not its VM's"
	}
	msg := fmt.Sprintf("a valid X509-SVID of %s was presented to the credential broker from %s %s", id, remote, what)
	identity.CountMisuse(hfv1.MisuseBrokerProofInvalid)
	for attempt := 0; ; attempt++ {
		marked := claim.DeepCopy()
		if !identity.RecordMisuse(marked, hfv1.MisuseBrokerProofInvalid, msg, b.clock().Now()) {
			break
		}
		err := b.recordFacts(ctx, claim, marked.Status.Identity, claim.Status.Bootstrap)
		if err == nil {
			b.Recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.IdentityStolenReason), "The VM's identity was stolen: "+msg)
			break
		}
		fresh := &hfv1.MachineClaim{}
		if !apierrors.IsConflict(err) || attempt == 4 || b.Reader.Get(ctx, client.ObjectKeyFromObject(claim), fresh) != nil || fresh.UID != claim.UID {
			ctrl.LoggerFrom(ctx).Error(err, "Could not record a stolen identity in its claim", "MachineClaim", client.ObjectKeyFromObject(claim).String())
			break
		}
		*claim = *fresh
	}
	return vmanswer.Refuse(http.StatusForbidden, ReasonBrokerProofInvalid, "%s; the identity is evicted and its claim fails", msg)
}

// waitingForJobRetry is when a VM that stands by for a job asks again.
const waitingForJobRetry = 10 * time.Second

// deliver records the request, mints the credential and records it; a VM
// that waits for its job is told to ask again, nothing written.
func (b *Broker) deliver(ctx context.Context, claim *hfv1.MachineClaim) (*Response, *vmanswer.Refusal) {
	if w, ok := b.Issuer.(JobWaiter); ok && w.WaitingForJob(ctx, claim) {
		return nil, vmanswer.Refuse(http.StatusServiceUnavailable, ReasonWaitingForJob, "MachineClaim %s/%s stands by until its RunnerPool binds it a job", claim.Namespace, claim.Name).After(waitingForJobRetry)
	}
	requested := claim.Status.Identity.DeepCopy()
	requested.CredentialRequestedAt = &metav1.Time{Time: b.clock().Now()}
	if err := b.recordFacts(ctx, claim, requested, claim.Status.Bootstrap); err != nil {
		// A conflict is another replica serving the same VM's retry, or
		// the claim controller writing: the VM asks again and one wins.
		return nil, vmanswer.Refuse(http.StatusServiceUnavailable, ReasonBusy, "record the request in MachineClaim %s/%s: %v", claim.Namespace, claim.Name, err).After(time.Second)
	}
	// The issuer fills in the bootstrap record of a copy: recordIssued
	// writes it as the change from the claim as recorded.
	minted := claim.DeepCopy()
	cred, err := b.Issuer.RunnerCredential(ctx, minted)
	if err != nil {
		// Nothing was handed out: free the claim for the VM's retry.
		b.undo(ctx, claim)
		ref := vmanswer.Refuse(http.StatusServiceUnavailable, ReasonIssueFailed, "issue the runner credential: %v", err)
		ref.RetryAfter = 5 * time.Second
		if c := errclass.Classify(err); c == errclass.ClassConfiguration || c == errclass.ClassPermanent {
			ref.Status, ref.RetryAfter = http.StatusBadGateway, 0
		}
		return nil, ref
	}
	if err := b.recordIssued(ctx, claim, minted.Status.Bootstrap); err != nil {
		// The credential exists but is not recorded: withhold it (the
		// runner never comes online, and the claim is replaced) rather
		// than hand out something the operator would not clean up.
		return nil, vmanswer.Refuse(http.StatusInternalServerError, ReasonIssueFailed, "record the issued credential in MachineClaim %s/%s: %v", claim.Namespace, claim.Name, err)
	}
	b.Recorder.Eventf(claim, corev1.EventTypeNormal, "CredentialDelivered", "The credential broker handed runner %s its single-use %s credential (identity %s)",
		cred.RunnerName, cred.Method, claim.Status.Identity.SPIFFEID)
	return &Response{
		Method: string(cred.Method), JITConfig: jit(cred), RegistrationToken: regToken(cred),
		RegistrationURL: cred.RegistrationURL, Job: cred.Job, ExpiresAt: cred.ExpiresAt,
	}, nil
}

// jit is c's secret when its method's credential is a JIT configuration
// (agentconfig.MethodSpec, which the method's platform registered).
func jit(c workload.Credential) string {
	if spec, ok := agentconfig.LookupMethod(agentconfig.BootstrapMethod(c.Method)); ok && spec.JITConfig {
		return c.Secret.Reveal()
	}
	return ""
}

// regToken is c's secret when its method's credential is a token: what
// the VM's agent registers or runs with, whichever platform's it is.
func regToken(c workload.Credential) string {
	if spec, ok := agentconfig.LookupMethod(agentconfig.BootstrapMethod(c.Method)); ok && !spec.JITConfig {
		return c.Secret.Reveal()
	}
	return ""
}

// recordIssued writes the bootstrap status the issuer filled in, reading
// the claim again on a conflict.
func (b *Broker) recordIssued(ctx context.Context, claim *hfv1.MachineClaim, issued *hfv1.BootstrapStatus) error {
	for attempt := 0; ; attempt++ {
		err := b.recordFacts(ctx, claim, claim.Status.Identity, issued)
		if err == nil || !apierrors.IsConflict(err) || attempt == 4 {
			return err
		}
		fresh := &hfv1.MachineClaim{}
		if err := b.Reader.Get(ctx, client.ObjectKeyFromObject(claim), fresh); err != nil {
			return err
		}
		*claim = *fresh
	}
}

// undo clears the recorded request after a failed mint.
func (b *Broker) undo(ctx context.Context, claim *hfv1.MachineClaim) {
	fresh := &hfv1.MachineClaim{}
	if err := b.Reader.Get(ctx, client.ObjectKeyFromObject(claim), fresh); err != nil || fresh.Status.Identity == nil {
		return
	}
	cleared := fresh.Status.Identity.DeepCopy()
	cleared.CredentialRequestedAt = nil
	if err := b.recordFacts(ctx, fresh, cleared, fresh.Status.Bootstrap); err != nil {
		ctrl.LoggerFrom(ctx).Info("Could not clear the credential request after a failed issue; the claim's VM cannot retry", "err", err.Error())
	}
}

// recordFacts writes the broker's facts about a claim and nothing else:
// status.identity and status.bootstrap as given, as a JSON merge patch
// computed against the claim as read (so it names only what changed in
// those two fields), under the claim's resourceVersion (a conflict means
// the claim was written since; the caller decides whether to read it
// again). These facts must be stored before a credential leaves: the
// broker serves on every replica, the claim reconciler runs on the leader
// alone. It never writes a condition or the phase; the reconciler derives
// those from these facts when the status write wakes it through its watch
// (docs/architecture.md, "Who writes a claim's status"). On success claim
// is the claim as stored.
func (b *Broker) recordFacts(ctx context.Context, claim *hfv1.MachineClaim, id *hfv1.IdentityStatus, boot *hfv1.BootstrapStatus) error {
	after := claim.DeepCopy()
	after.Status.Identity, after.Status.Bootstrap = id.DeepCopy(), boot.DeepCopy()
	if err := b.Client.Status().Patch(ctx, after, client.MergeFromWithOptions(claim, client.MergeFromWithOptimisticLock{})); err != nil {
		return err
	}
	*claim = *after
	return nil
}

func (b *Broker) clock() clock.PassiveClock {
	if b.Clock == nil {
		return clock.RealClock{}
	}
	return b.Clock
}
