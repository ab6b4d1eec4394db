// Package tpmenroll serves the TPM DevID enrollment of VMs that attest
// with their TPM (docs/identity.md, "TPM"): the two endpoints on the agent
// server's listener, beside the credential broker, that end with a DevID
// certificate spire-server's tpm_devid node attestor accepts.
//
//  1. enroll (agentconfig.TPMEnrollPath): the VM sends what its TPM made
//     (tpmdevid.Enrollment: the EK certificate, an AK, a DevID key the AK
//     certified) with its claim's enrollment proof. The operator checks
//     the proof, the EK certificate against the cluster's EK CAs and the
//     certification, and answers with a credential activation challenge
//     that only the TPM holding that EK and that AK can open.
//  2. activate (agentconfig.TPMActivatePath): the VM sends the enrollment
//     again with the opened secret; on the right one the operator records
//     the TPM in the claim and signs the DevID certificate, whose common
//     name is the one the claim's alias entry selects.
//
// Nothing is kept between the two calls: the challenge's secret is derived
// from the claim and the enrollment (identity.Issuer.ActivationSecret), so
// any replica answers either. No work before a proof: the enrollment
// proof's header names the claim and the ownership key, its mac covers
// both, and it is checked in constant time
// (identity.Issuer.VerifyEnrollmentProof) before the claim is read, before
// any event, log line above debug level or byte of the body; a request
// without a valid one costs an HMAC and is answered with a closed
// connection. The first TPM to enroll for a claim is its TPM: the proof
// reaches the claim's VM alone, through the hypervisor's guest channel, so
// another TPM presenting it means the proof was taken from that VM, which
// is recorded as a misuse (TPMMismatch) that fails the claim. Every answer
// is counted in hyperfleet_tpm_enrollment_requests_total; refusals of an
// identified claim are events on it, and refusals are logged at debug
// level with an Info line at most every 10 s (httpsserver.RefusalLog).
// Like the broker, it writes only facts (status.identity) as merge patches
// under the claim's resourceVersion, never a condition or the phase.
package tpmenroll

import (
	"context"
	"crypto/sha1" //nolint:gosec // SPIRE names a DevID agent by its certificate's SHA-1; not a security use
	"crypto/subtle"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

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
	"github.com/hyperfleet/hyperfleet/internal/secretref"
	"github.com/hyperfleet/hyperfleet/internal/spire"
	"github.com/hyperfleet/hyperfleet/internal/tpmdevid"
	"github.com/hyperfleet/hyperfleet/internal/vmanswer"
)

// maxBody bounds a request's body: an enrollment is a few KiB (an RSA EK
// certificate, two public areas, an attestation and a signature, base64).
const maxBody = 32 << 10

// Issuer derives and checks what the operator placed in the VM
// (identity.Issuer).
type Issuer interface {
	VerifyEnrollmentProof(proof string) (identity.EnrollmentRef, error)
	KeyIDOf(claim *hfv1.MachineClaim) (int, error)
	ActivationSecret(claim *hfv1.MachineClaim, e *tpmdevid.Enrollment) ([]byte, error)
}

// Handler serves agentconfig.TPMEnrollPath and agentconfig.TPMActivatePath.
type Handler struct {
	// Client writes claims' status; Reader reads claims from the API
	// server (fresh); Clusters reads HypervisorClusters and templates (a
	// cache is fine); Secrets reads the CA Secrets the cluster names.
	Client   client.Client
	Reader   client.Reader
	Clusters client.Reader
	Secrets  client.Reader
	Issuer   Issuer
	Recorder record.EventRecorder
	Clock    clock.PassiveClock
	// Limiter bounds the enrollments checked per second across all VMs
	// (each costs RSA work and Secret reads); nil: 10/s, bursts of 20.
	Limiter *rate.Limiter

	// setup fills in the defaults once (Limiter, refusals' message).
	setup    sync.Once
	refusals httpsserver.RefusalLog
}

// Reasons of the answers, as the agent and the metrics see them.
const (
	ReasonChallenged             = "Challenged"
	ReasonEnrolled               = "Enrolled"
	ReasonMethodNotAllowed       = "MethodNotAllowed"
	ReasonEnrollmentProofInvalid = "EnrollmentProofInvalid"
	ReasonKeyUnavailable         = "OwnershipKeyUnavailable"
	ReasonNotEnrolling           = "NotEnrolling"
	ReasonIdentityCompromised    = "IdentityCompromised"
	ReasonRateLimited            = "RateLimited"
	ReasonBadRequest             = "BadRequest"
	ReasonTPMNotConfigured       = "TPMNotConfigured"
	ReasonEKUntrusted            = "EKUntrusted"
	ReasonEnrollmentInvalid      = "EnrollmentInvalid"
	ReasonTPMMismatch            = "TPMMismatch"
	ReasonEKShared               = "EKShared"
	ReasonActivationFailed       = "ActivationFailed"
	ReasonBusy                   = "Busy"
)

// Refusal is the body of every answer but a 200.
type Refusal = vmanswer.Body

func busy(format string, args ...any) *vmanswer.Refusal {
	return vmanswer.Refuse(http.StatusServiceUnavailable, ReasonBusy, format, args...).After(2 * time.Second)
}

// notConfigured refuses a VM whose cluster's (or template's) TPM trust
// cannot be read yet: a Secret or setting still to come, so the VM asks
// again.
func notConfigured(format string, args ...any) *vmanswer.Refusal {
	return vmanswer.Refuse(http.StatusServiceUnavailable, ReasonTPMNotConfigured, format, args...).After(10 * time.Second)
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.setup.Do(func() {
		h.Limiter = httpsserver.LimiterOr(h.Limiter)
		h.refusals.Message = "TPM enrollment refused requests (see hyperfleet_tpm_enrollment_requests_total)"
	})
	ctx := r.Context()
	endpoint := "enroll"
	if r.URL.Path == agentconfig.TPMActivatePath {
		endpoint = "activate"
	}
	claim, resp, ref := h.handle(ctx, r, endpoint)
	if ref == nil {
		reason := ReasonChallenged
		if endpoint == "activate" {
			reason = ReasonEnrolled
		}
		metrics.TPMEnrollmentRequests.WithLabelValues(endpoint, reason).Inc()
		vmanswer.WriteOK(w, resp)
		return
	}
	metrics.TPMEnrollmentRequests.WithLabelValues(endpoint, ref.Reason).Inc()
	log := ctrl.LoggerFrom(ctx)
	kv := []any{"remote", r.RemoteAddr, "endpoint", endpoint, "message", ref.Message}
	if claim != nil {
		kv = append(kv, "MachineClaim", client.ObjectKeyFromObject(claim).String())
		if !ref.Transient() {
			h.Recorder.Eventf(claim, corev1.EventTypeWarning, string(hfv1.TPMEnrollmentRefusedReason), "The TPM enrollment of the VM was refused (%s): %s", ref.Reason, ref.Message)
		}
	}
	h.refusals.Refused(log, ref.Reason, "TPM enrollment refused a request", kv...)
	// Whatever of the body is unread stays unread: the VM asks again on
	// a new connection.
	httpsserver.DropConnection(w)
	vmanswer.Write(w, ref)
}

// handle runs the checks in order; claim is set once one is identified.
func (h *Handler) handle(ctx context.Context, r *http.Request, endpoint string) (*hfv1.MachineClaim, any, *vmanswer.Refusal) {
	if r.Method != http.MethodPost {
		return nil, nil, vmanswer.Refuse(http.StatusMethodNotAllowed, ReasonMethodNotAllowed, "use POST")
	}
	// The proof first, on its own: nothing is read, written or logged
	// above debug level for a request without a valid one.
	ref, refusal := h.checkProof(r.Header.Get(agentconfig.EnrollmentProofHeader))
	if refusal != nil {
		return nil, nil, refusal
	}
	claim, refusal := h.enrollingClaim(ctx, ref)
	if refusal != nil {
		return claim, nil, refusal
	}
	// Limited after the proof, so that strangers cannot use up the VMs'
	// budget.
	if !h.Limiter.Allow() {
		return claim, nil, vmanswer.Refuse(http.StatusTooManyRequests, ReasonRateLimited, "too many TPM enrollments at once; retry shortly").After(time.Second)
	}
	r.Body = http.MaxBytesReader(nil, r.Body, maxBody)
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	var req agentconfig.TPMActivateRequest // TPMEnrollRequest's fields and the answer
	if err := dec.Decode(&req); err != nil {
		return claim, nil, vmanswer.Refuse(http.StatusBadRequest, ReasonBadRequest, "the request is not a %s request: %v", endpoint, err)
	}
	if req.SPIFFEID != claim.Status.Identity.SPIFFEID {
		return claim, nil, vmanswer.Refuse(http.StatusBadRequest, ReasonBadRequest, "the request names SPIFFE ID %q, not the claim's %s", req.SPIFFEID, claim.Status.Identity.SPIFFEID)
	}
	if endpoint == "enroll" && req.Answer != nil {
		return claim, nil, vmanswer.Refuse(http.StatusBadRequest, ReasonBadRequest, "an enroll request carries no answer")
	}
	v, refusal := h.verify(ctx, claim, &req.Enrollment)
	if refusal != nil {
		return claim, nil, refusal
	}
	secret, err := h.Issuer.ActivationSecret(claim, &req.Enrollment)
	if err != nil {
		return claim, nil, busy("derive the activation secret: %v", err)
	}
	if endpoint == "enroll" {
		ch, err := v.Challenge(secret)
		if err != nil {
			return claim, nil, vmanswer.Refuse(http.StatusForbidden, ReasonEnrollmentInvalid, "make the credential activation challenge: %v", err)
		}
		return claim, &agentconfig.TPMChallenge{Challenge: ch}, nil
	}
	if subtle.ConstantTimeCompare(secret, req.Answer) != 1 {
		return claim, nil, vmanswer.Refuse(http.StatusForbidden, ReasonActivationFailed,
			"the answer is not the challenge's secret: the DevID and AK are not in the TPM whose EK certificate was sent")
	}
	resp, refusal := h.issue(ctx, claim, v)
	return claim, resp, refusal
}

// checkProof checks the enrollment proof on its own (its mac covers the
// claim and the key it names) and returns what it names. The refusals say
// nothing of any claim: nothing was looked up.
func (h *Handler) checkProof(proof string) (identity.EnrollmentRef, *vmanswer.Refusal) {
	if proof == "" {
		return identity.EnrollmentRef{}, vmanswer.Refuse(http.StatusForbidden, ReasonEnrollmentProofInvalid, "no enrollment proof (header %s)", agentconfig.EnrollmentProofHeader)
	}
	if h.Issuer == nil {
		return identity.EnrollmentRef{}, vmanswer.Refuse(http.StatusForbidden, ReasonEnrollmentProofInvalid, "this operator checks no enrollment proofs")
	}
	ref, err := h.Issuer.VerifyEnrollmentProof(proof)
	switch {
	case errors.Is(err, identity.ErrKeyUnavailable):
		// The proof's form is right, its key gone from the ring: the
		// VM's claim cannot enroll with this operator (a key removed
		// while it was in flight), which only the ring's owner fixes.
		return identity.EnrollmentRef{}, vmanswer.Refuse(http.StatusForbidden, ReasonKeyUnavailable, "the enrollment proof is derived from ownership key %s, which the operator's key ring no longer holds: %v", proofKeyID(proof), err)
	case err != nil:
		return identity.EnrollmentRef{}, vmanswer.Refuse(http.StatusForbidden, ReasonEnrollmentProofInvalid, "the enrollment proof (header %s) is not one this operator issued", agentconfig.EnrollmentProofHeader)
	}
	return ref, nil
}

// proofKeyID is the key id part of an enrollment proof, for messages.
func proofKeyID(proof string) string {
	if parts := strings.Split(proof, "/"); len(parts) == 5 {
		return parts[3]
	}
	return "?"
}

// enrollingClaim is the claim a verified proof names, if its VM may enroll
// now.
func (h *Handler) enrollingClaim(ctx context.Context, ref identity.EnrollmentRef) (*hfv1.MachineClaim, *vmanswer.Refusal) {
	ns, name := ref.Namespace, ref.Name
	claim := &hfv1.MachineClaim{}
	if err := h.Reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, claim); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, vmanswer.Refuse(http.StatusForbidden, ReasonNotEnrolling, "MachineClaim %s/%s no longer exists", ns, name)
		}
		return nil, busy("read MachineClaim %s/%s: %v", ns, name, err)
	}
	if string(claim.UID) != ref.UID {
		return nil, vmanswer.Refuse(http.StatusForbidden, ReasonNotEnrolling, "MachineClaim %s/%s is another claim than uid %s (the VM's claim is gone)", ns, name, ref.UID)
	}
	if id, err := h.Issuer.KeyIDOf(claim); err != nil || id != ref.KeyID {
		// The operator derives a claim's proofs with the key its status
		// records: a proof of another key was not issued for this claim.
		return claim, vmanswer.Refuse(http.StatusForbidden, ReasonEnrollmentProofInvalid, "the enrollment proof is derived from ownership key %d, not MachineClaim %s/%s's", ref.KeyID, ns, name)
	}
	st := claim.Status.Identity
	switch {
	case st == nil || st.TPM == nil || st.TPM.EntriesCreatedAt == nil:
		return claim, vmanswer.Refuse(http.StatusForbidden, ReasonNotEnrolling, "MachineClaim %s/%s was issued no TPM identity", ns, name)
	case st.Misuse != nil:
		return claim, vmanswer.Refuse(http.StatusForbidden, ReasonIdentityCompromised, "the identity of MachineClaim %s/%s was used by someone other than its VM (%s); no TPM is enrolled for it", ns, name, st.Misuse.Reason)
	case !claim.DeletionTimestamp.IsZero() || claim.EndRequested() || claim.Status.End != nil:
		return claim, vmanswer.Refuse(http.StatusForbidden, ReasonNotEnrolling, "MachineClaim %s/%s is ending", ns, name)
	case claim.Status.VMRef == nil:
		return claim, vmanswer.Refuse(http.StatusForbidden, ReasonNotEnrolling, "MachineClaim %s/%s has no VM", ns, name)
	case st.AttestedAt != nil:
		return claim, vmanswer.Refuse(http.StatusConflict, ReasonNotEnrolling, "the VM of MachineClaim %s/%s attested already, at %s", ns, name, st.AttestedAt.UTC().Format(time.RFC3339))
	}
	return claim, nil
}

// verify checks e against the EK CAs the claim's cluster (and, narrowing
// them, its template) names, and that it comes from the claim's TPM.
func (h *Handler) verify(ctx context.Context, claim *hfv1.MachineClaim, e *tpmdevid.Enrollment) (*tpmdevid.Verified, *vmanswer.Refusal) {
	cluster := &hfv1.HypervisorCluster{}
	if err := h.Clusters.Get(ctx, client.ObjectKey{Name: claim.Status.VMRef.HypervisorCluster}, cluster); err != nil {
		return nil, busy("read HypervisorCluster %s: %v", claim.Status.VMRef.HypervisorCluster, err)
	}
	cfg := cluster.Spec.SPIRE
	if cfg == nil || cfg.TPM == nil {
		return nil, notConfigured("HypervisorCluster %s has no spec.spire.tpm", cluster.Name)
	}
	pools, ref := h.ekPools(ctx, claim, cfg.TPM)
	if ref != nil {
		return nil, ref
	}
	var v *tpmdevid.Verified
	for _, pool := range pools {
		got, err := tpmdevid.Verify(e, pool, h.clock().Now())
		switch {
		case errors.Is(err, tpmdevid.ErrUntrustedEK):
			return nil, vmanswer.Refuse(http.StatusForbidden, ReasonEKUntrusted, "the TPM's EK certificate does not chain to the EK CAs of %s: %v", poolName(pool, pools), err)
		case err != nil:
			return nil, vmanswer.Refuse(http.StatusForbidden, ReasonEnrollmentInvalid, "the enrollment does not verify: %v", err)
		}
		v = got
	}
	if rec := claim.Status.Identity.TPM.EKFingerprint; rec != "" && rec != v.EKFingerprint {
		return nil, h.mismatch(ctx, claim, rec, v.EKFingerprint)
	}
	if other, ref := h.sharedEK(ctx, claim, v.EKFingerprint); ref != nil || other != "" {
		if ref != nil {
			return nil, ref
		}
		return nil, vmanswer.Refuse(http.StatusForbidden, ReasonEKShared,
			"claim %s enrolled a TPM with the same EK certificate (%s): the VMs share one TPM state, cloned from a template whose TPM had been started, and a DevID made in one would load in the other; set spec.attestation.tpm.addVirtualTPM, or give the template a TPM state that was never started (docs/templates.md, \"TPM\")",
			other, short(v.EKFingerprint))
	}
	return v, nil
}

// sharedEK is another live claim that enrolled a TPM with the same EK
// certificate, if any. Two VMs with one EK share their TPM's seeds (a
// template's started TPM state copied into its clones), so a DevID key
// made in one loads in the other: such a TPM proves nothing about which VM
// it is in.
func (h *Handler) sharedEK(ctx context.Context, claim *hfv1.MachineClaim, ek string) (string, *vmanswer.Refusal) {
	var claims hfv1.MachineClaimList
	if err := h.Clusters.List(ctx, &claims); err != nil {
		return "", busy("list MachineClaims: %v", err)
	}
	for i := range claims.Items {
		c := &claims.Items[i]
		if c.UID == claim.UID || c.Status.Identity == nil || c.Status.Identity.TPM == nil {
			continue
		}
		if c.Status.Identity.TPM.EKFingerprint == ek {
			return c.Namespace + "/" + c.Name, nil
		}
	}
	return "", nil
}

// poolName says which bundle refused an EK.
func poolName(pool *x509.CertPool, pools []*x509.CertPool) string {
	if len(pools) > 1 && pool == pools[1] {
		return "the template's spec.attestation.tpm.ekCABundleRef"
	}
	return "the cluster's spec.spire.tpm.ekCABundleRef"
}

// ekPools are the CA pools an EK certificate must chain to: the cluster's
// (the platform team's trust) and, when the claim's template names one,
// the template's too, which can only narrow the cluster's.
func (h *Handler) ekPools(ctx context.Context, claim *hfv1.MachineClaim, cfg *hfv1.SPIRETPMConfig) ([]*x509.CertPool, *vmanswer.Refusal) {
	ref := cfg.EKCABundleRef
	pem, err := secretref.Value(ctx, h.Secrets, "spec.spire.tpm.ekCABundleRef", ref.Namespace, ref.Name, ref.Key)
	if err != nil {
		return nil, notConfigured("read the EK CA bundle: %v", err)
	}
	cluster := x509.NewCertPool()
	if !cluster.AppendCertsFromPEM(pem) {
		return nil, notConfigured("spec.spire.tpm.ekCABundleRef (%s/%s key %s) holds no PEM certificate", ref.Namespace, ref.Name, ref.Key)
	}
	pools := []*x509.CertPool{cluster}
	tmpl := &hfv1.HypervisorMachineTemplate{}
	if err := h.Clusters.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: claim.Spec.TemplateRef.Name}, tmpl); err != nil {
		return nil, busy("read HypervisorMachineTemplate %s/%s: %v", claim.Namespace, claim.Spec.TemplateRef.Name, err)
	}
	if t := tmpl.Spec.Attestation.TPM; t != nil && t.EKCABundleRef != nil {
		pem, err := secretref.Value(ctx, h.Secrets, "spec.attestation.tpm.ekCABundleRef", claim.Namespace, t.EKCABundleRef.Name, t.EKCABundleRef.Key)
		if err != nil {
			return nil, notConfigured("read the template's EK CA bundle: %v", err)
		}
		narrow := x509.NewCertPool()
		if !narrow.AppendCertsFromPEM(pem) {
			return nil, vmanswer.Refuse(http.StatusForbidden, ReasonTPMNotConfigured, "the template's spec.attestation.tpm.ekCABundleRef holds no PEM certificate")
		}
		pools = append(pools, narrow)
	}
	return pools, nil
}

// mismatch records that another TPM than the claim's presented its
// enrollment proof: the claim controller evicts the identity and fails the
// claim, and the broker hands out nothing for it.
func (h *Handler) mismatch(ctx context.Context, claim *hfv1.MachineClaim, recorded, got string) *vmanswer.Refusal {
	msg := fmt.Sprintf("a TPM with EK certificate %s presented the enrollment proof of the claim, whose VM's TPM is %s", short(got), short(recorded))
	identity.CountMisuse(hfv1.MisuseTPMMismatch)
	err := h.writeIdentity(ctx, claim, func(st *hfv1.IdentityStatus, c *hfv1.MachineClaim) bool {
		return identity.RecordMisuse(c, hfv1.MisuseTPMMismatch, msg, h.clock().Now())
	})
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Could not record a TPM mismatch in its claim", "MachineClaim", client.ObjectKeyFromObject(claim).String())
	} else {
		h.Recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.IdentityStolenReason), "The VM's enrollment proof was used by another TPM: "+msg)
	}
	return vmanswer.Refuse(http.StatusForbidden, ReasonTPMMismatch, "%s; the identity is evicted and its claim fails", msg)
}

// issue records the TPM and the DevID certificate in the claim, then
// returns the certificate: recorded first, so that the claim reconciler
// looks for the agent it names, and a restart knows what to ban.
func (h *Handler) issue(ctx context.Context, claim *hfv1.MachineClaim, v *tpmdevid.Verified) (*agentconfig.TPMActivateResponse, *vmanswer.Refusal) {
	cluster := &hfv1.HypervisorCluster{}
	if err := h.Clusters.Get(ctx, client.ObjectKey{Name: claim.Status.VMRef.HypervisorCluster}, cluster); err != nil {
		return nil, busy("read HypervisorCluster %s: %v", claim.Status.VMRef.HypervisorCluster, err)
	}
	cfg := cluster.Spec.SPIRE.TPM
	ca, ref := h.devIDCA(ctx, cfg)
	if ref != nil {
		return nil, ref
	}
	ttl := time.Hour
	if cfg.DevIDCertificateTTL != nil {
		ttl = cfg.DevIDCertificateTTL.Duration
	}
	now := h.clock().Now()
	// A minute back for clocks a little behind the operator's.
	notAfter := now.Add(ttl)
	der, err := ca.IssueDevID(v.DevIDKey, spire.DevIDCommonName(string(claim.UID)), now.Add(-time.Minute), notAfter)
	if err != nil {
		return nil, busy("sign the DevID certificate: %v", err)
	}
	sum := sha1.Sum(der) //nolint:gosec // SPIRE's agent id, see the import
	fingerprint := hex.EncodeToString(sum[:])
	err = h.writeIdentity(ctx, claim, func(st *hfv1.IdentityStatus, _ *hfv1.MachineClaim) bool {
		if st.TPM.EKFingerprint != "" && st.TPM.EKFingerprint != v.EKFingerprint {
			return false
		}
		st.TPM.EKFingerprint, st.TPM.DevIDFingerprint = v.EKFingerprint, fingerprint
		st.TPM.EnrolledAt, st.TPM.DevIDNotAfter = &metav1.Time{Time: now}, &metav1.Time{Time: notAfter.Truncate(time.Second)}
		return true
	})
	if err != nil {
		return nil, busy("record the enrollment in MachineClaim %s/%s: %v", claim.Namespace, claim.Name, err)
	}
	if claim.Status.Identity.TPM.DevIDFingerprint != fingerprint {
		return nil, h.mismatch(ctx, claim, claim.Status.Identity.TPM.EKFingerprint, v.EKFingerprint)
	}
	h.Recorder.Eventf(claim, corev1.EventTypeNormal, "TPMEnrolled", "The VM's TPM (EK certificate %s) enrolled; DevID certificate %s valid until %s",
		short(v.EKFingerprint), short(fingerprint), notAfter.UTC().Format(time.RFC3339))
	return &agentconfig.TPMActivateResponse{DevIDCertificate: der, CACertificates: [][]byte{ca.Certificate().Raw}}, nil
}

// devIDCA reads the CA the cluster signs DevID certificates with.
func (h *Handler) devIDCA(ctx context.Context, cfg *hfv1.SPIRETPMConfig) (*tpmdevid.CA, *vmanswer.Refusal) {
	ref := cfg.DevIDCASecretRef
	cert, err := secretref.Value(ctx, h.Secrets, "spec.spire.tpm.devIDCASecretRef", ref.Namespace, ref.Name, corev1.TLSCertKey)
	var key []byte
	if err == nil {
		key, err = secretref.Value(ctx, h.Secrets, "spec.spire.tpm.devIDCASecretRef", ref.Namespace, ref.Name, corev1.TLSPrivateKeyKey)
	}
	var ca *tpmdevid.CA
	if err == nil {
		ca, err = tpmdevid.ParseCA(cert, key)
	}
	if errors.Is(err, tpmdevid.ErrCANotDedicated) {
		// Not a Secret still to come: a CA the operator must not sign
		// DevIDs with, which only its owner replaces.
		return nil, vmanswer.Refuse(http.StatusForbidden, ReasonTPMNotConfigured, "the DevID CA (spec.spire.tpm.devIDCASecretRef %s/%s) is refused: %v", ref.Namespace, ref.Name, err)
	}
	if err != nil {
		return nil, notConfigured("the DevID CA (spec.spire.tpm.devIDCASecretRef %s/%s): %v", ref.Namespace, ref.Name, err)
	}
	return ca, nil
}

// writeIdentity applies change to the claim's status.identity and writes
// it as a merge patch under the claim's resourceVersion, reading the claim
// again on a conflict (at most 5 tries). change returns false to write
// nothing. On success claim is the claim as stored.
func (h *Handler) writeIdentity(ctx context.Context, claim *hfv1.MachineClaim, change func(st *hfv1.IdentityStatus, c *hfv1.MachineClaim) bool) error {
	for attempt := 0; ; attempt++ {
		after := claim.DeepCopy()
		if after.Status.Identity == nil || after.Status.Identity.TPM == nil {
			return errors.New("the claim has no TPM identity any more")
		}
		if !change(after.Status.Identity, after) {
			return nil
		}
		err := h.Client.Status().Patch(ctx, after, client.MergeFromWithOptions(claim, client.MergeFromWithOptimisticLock{}))
		if err == nil {
			*claim = *after
			return nil
		}
		fresh := &hfv1.MachineClaim{}
		if !apierrors.IsConflict(err) || attempt == 4 {
			return err
		}
		if err := h.Reader.Get(ctx, client.ObjectKeyFromObject(claim), fresh); err != nil {
			return err
		}
		if fresh.UID != claim.UID {
			return errors.New("the claim was replaced")
		}
		*claim = *fresh
	}
}

// short is a fingerprint's first 16 hex digits, for messages.
func short(fingerprint string) string {
	if len(fingerprint) > 16 {
		return fingerprint[:16]
	}
	return fingerprint
}

func (h *Handler) clock() clock.PassiveClock {
	if h.Clock == nil {
		return clock.RealClock{}
	}
	return h.Clock
}
