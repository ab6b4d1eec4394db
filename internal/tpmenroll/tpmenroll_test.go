package tpmenroll

import (
	"bytes"
	"context"
	"crypto/sha1" //nolint:gosec // SPIRE's agent id, as in the handler
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/spire"
	"github.com/hyperfleet/hyperfleet/internal/testworld/swtpm"
	"github.com/hyperfleet/hyperfleet/internal/tpmdevid"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
)

const (
	ns        = "ci"
	claimName = "runner-1"
	claimUID  = "6f1c9a2e-0000-4000-8000-000000000001"
	spiffeID  = "spiffe://example.org/vm/ci/runner-1/6f1c9a2e-0000-4000-8000-000000000001"
)

// world is a claim whose VM may enroll, its cluster and template, the CA
// Secrets, and the handler.
type world struct {
	t        *testing.T
	h        *Handler
	c        client.Client
	issuer   *identity.Issuer
	devIDCA  *tpmdevid.CA
	recorder *record.FakeRecorder
	// reads counts the handler's reads of claims.
	reads *countingReader
}

func newWorld(t *testing.T, ekBundle []byte, templateBundle []byte) *world {
	t.Helper()
	scheme := runtime.NewScheme()
	_ = hfv1.AddToScheme(scheme)
	_ = corev1.AddToScheme(scheme)
	devIDCA, err := tpmdevid.NewCA("HyperFleet DevID CA", 24*time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	caCert, caKey, err := devIDCA.PEM()
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	claim := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: claimName, UID: types.UID(claimUID)},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: "tpm-template"}},
		Status: hfv1.MachineClaimStatus{
			VMRef: &hfv1.VMReference{HypervisorCluster: "pve", ProviderID: "proxmox://1000"},
			Identity: &hfv1.IdentityStatus{
				SPIFFEID: spiffeID, NodeID: "spiffe://example.org/hyperfleet/node/ci/runner-1/" + claimUID, EntryID: spire.EntryIDFor(claimUID),
				TPM: &hfv1.TPMIdentityStatus{EntriesCreatedAt: &now, SecretsDeliveredAt: &now},
			},
		},
	}
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tpm-template"}}
	tmpl.Spec.Attestation.Method = hfv1.AttestationTPM
	objs := []client.Object{
		claim, tmpl,
		&hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: "pve"}, Spec: hfv1.HypervisorClusterSpec{SPIRE: &hfv1.SPIREConfig{
			TrustDomain: "example.org",
			TPM: &hfv1.SPIRETPMConfig{
				EKCABundleRef:    hfv1.SecretKeySelector{Namespace: "hyperfleet-system", Name: "ek-ca", Key: "ca.pem"},
				DevIDCASecretRef: hfv1.SecretReference{Namespace: "hyperfleet-system", Name: "devid-ca"},
			},
		}}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "hyperfleet-system", Name: "ek-ca"}, Data: map[string][]byte{"ca.pem": ekBundle}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "hyperfleet-system", Name: "devid-ca"}, Data: map[string][]byte{corev1.TLSCertKey: caCert, corev1.TLSPrivateKeyKey: caKey}},
	}
	if templateBundle != nil {
		tmpl.Spec.Attestation.TPM = &hfv1.TPMAttestation{EKCABundleRef: &hfv1.LocalSecretKeySelector{Name: "tenant-ek-ca", Key: "ca.pem"}}
		objs = append(objs, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tenant-ek-ca"}, Data: map[string][]byte{"ca.pem": templateBundle}})
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithStatusSubresource(&hfv1.MachineClaim{}).Build()
	issuer := &identity.Issuer{Keys: keyRing(t, 0)}
	rec := record.NewFakeRecorder(32)
	reads := &countingReader{Reader: c}
	return &world{t: t, c: c, issuer: issuer, devIDCA: devIDCA, recorder: rec, reads: reads,
		h: &Handler{Client: c, Reader: reads, Clusters: c, Secrets: c, Issuer: issuer, Recorder: rec}}
}

// keyRing is an ownership key ring of the given key ids.
func keyRing(t *testing.T, ids ...int) *ownership.Signer {
	t.Helper()
	var keys []ownership.Key
	for _, id := range ids {
		keys = append(keys, ownership.Key{ID: id, Secret: bytes.Repeat([]byte{byte(3 + id)}, ownership.MinKeyLength)})
	}
	r, err := ownership.NewKeyRing("test", keys)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// countingReader counts the claims read from the API server.
type countingReader struct {
	client.Reader
	gets atomic.Int64
}

func (r *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	r.gets.Add(1)
	return r.Reader.Get(ctx, key, obj, opts...)
}

func (w *world) claim() *hfv1.MachineClaim {
	w.t.Helper()
	c := &hfv1.MachineClaim{}
	if err := w.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: claimName}, c); err != nil {
		w.t.Fatal(err)
	}
	return c
}

func (w *world) proof() string {
	w.t.Helper()
	p, err := w.issuer.EnrollmentProof(w.claim())
	if err != nil {
		w.t.Fatal(err)
	}
	return p
}

// post sends body to path with proof and decodes a 200 into out; it
// returns the status and, for a refusal, its reason.
func (w *world) post(path, proof string, body any, out any) (int, string) {
	w.t.Helper()
	data, _ := json.Marshal(body)
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(data))
	if proof != "" {
		req.Header.Set(agentconfig.EnrollmentProofHeader, proof)
	}
	rr := httptest.NewRecorder()
	w.h.ServeHTTP(rr, req)
	if rr.Code != http.StatusOK {
		var ref Refusal
		_ = json.Unmarshal(rr.Body.Bytes(), &ref)
		w.t.Logf("%s: %d %s: %s", path, rr.Code, ref.Reason, ref.Message)
		return rr.Code, ref.Reason
	}
	if err := json.Unmarshal(rr.Body.Bytes(), out); err != nil {
		w.t.Fatal(err)
	}
	return rr.Code, ""
}

// enroll runs the whole protocol for the TPM at socket; it returns the
// activate call's status and reason, and the certificate on success.
func (w *world) enroll(socket, proof string) (int, string, *x509.Certificate) {
	w.t.Helper()
	g, e, err := tpmdevid.Enroll(socket)
	if err != nil {
		w.t.Fatal(err)
	}
	var ch agentconfig.TPMChallenge
	if code, reason := w.post(agentconfig.TPMEnrollPath, proof, agentconfig.TPMEnrollRequest{SPIFFEID: spiffeID, Enrollment: *e}, &ch); code != http.StatusOK {
		return code, reason, nil
	}
	answer, err := g.Activate(ch.Challenge)
	if err != nil {
		w.t.Fatalf("the TPM could not open its own challenge: %v", err)
	}
	var resp agentconfig.TPMActivateResponse
	code, reason := w.post(agentconfig.TPMActivatePath, proof, agentconfig.TPMActivateRequest{SPIFFEID: spiffeID, Enrollment: *e, Answer: answer}, &resp)
	if code != http.StatusOK {
		return code, reason, nil
	}
	cert, err := x509.ParseCertificate(resp.DevIDCertificate)
	if err != nil {
		w.t.Fatal(err)
	}
	return code, "", cert
}

func bundle(t *testing.T, ca *swtpm.LocalCA) []byte {
	t.Helper()
	b, err := ca.BundlePEM()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestEnrollment: a TPM whose EK the cluster's CA vouches for enrolls with
// its claim's proof and gets a DevID certificate for its own DevID key,
// with the claim's common name, from the cluster's DevID CA; the claim
// records the TPM and the certificate SPIRE will name the agent by.
func TestEnrollment(t *testing.T) {
	ca := swtpm.NewLocalCAForTest(t)
	tpm := swtpm.StartForTest(t, ca)
	w := newWorld(t, bundle(t, ca), nil)
	before := testutil.ToFloat64(metrics.TPMEnrollmentRequests.WithLabelValues("activate", ReasonEnrolled))

	code, reason, cert := w.enroll(tpm.Socket, w.proof())
	if code != http.StatusOK {
		t.Fatalf("enrollment: %d %s", code, reason)
	}
	if cert.Subject.CommonName != spire.DevIDCommonName(claimUID) {
		t.Errorf("DevID certificate CN %q, want %q", cert.Subject.CommonName, spire.DevIDCommonName(claimUID))
	}
	pool := x509.NewCertPool()
	pool.AddCert(w.devIDCA.Certificate())
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Errorf("the DevID certificate does not verify against the DevID CA: %v", err)
	}
	st := w.claim().Status.Identity.TPM
	sum := sha1.Sum(cert.Raw) //nolint:gosec // SPIRE's agent id
	if st.DevIDFingerprint != hex.EncodeToString(sum[:]) || len(st.EKFingerprint) != 64 || st.EnrolledAt == nil || st.DevIDNotAfter == nil {
		t.Errorf("status.identity.tpm after the enrollment: %+v", st)
	}
	if got := testutil.ToFloat64(metrics.TPMEnrollmentRequests.WithLabelValues("activate", ReasonEnrolled)); got != before+1 {
		t.Errorf("tpm_enrollment_requests_total{activate,Enrolled} = %v, want %v", got, before+1)
	}

	// The same TPM again (an agent restarted before it attested) gets a
	// new certificate for the same TPM.
	if code, reason, _ := w.enroll(tpm.Socket, w.proof()); code != http.StatusOK {
		t.Errorf("the same TPM again: %d %s", code, reason)
	}
}

// TestCopiedProofOnAnotherTPM: the seed and the enrollment proof copied to
// another VM with another TPM get nothing once the claim's TPM enrolled:
// the other TPM is refused, the misuse is recorded in the claim (which
// then fails), and counted.
func TestCopiedProofOnAnotherTPM(t *testing.T) {
	ca := swtpm.NewLocalCAForTest(t)
	mine, other := swtpm.StartForTest(t, ca), swtpm.StartForTest(t, ca)
	w := newWorld(t, bundle(t, ca), nil)
	proof := w.proof()
	if code, reason, _ := w.enroll(mine.Socket, proof); code != http.StatusOK {
		t.Fatalf("the claim's own TPM: %d %s", code, reason)
	}
	before := testutil.ToFloat64(metrics.IdentityMisuse.WithLabelValues(string(hfv1.MisuseTPMMismatch)))
	code, reason, _ := w.enroll(other.Socket, proof)
	if code != http.StatusForbidden || reason != ReasonTPMMismatch {
		t.Fatalf("another TPM with the claim's proof: %d %s, want 403 %s", code, reason, ReasonTPMMismatch)
	}
	st := w.claim().Status.Identity
	if st.Misuse == nil || st.Misuse.Reason != hfv1.MisuseTPMMismatch {
		t.Errorf("misuse after another TPM enrolled: %+v", st.Misuse)
	}
	if got := testutil.ToFloat64(metrics.IdentityMisuse.WithLabelValues(string(hfv1.MisuseTPMMismatch))); got != before+1 {
		t.Errorf("identity_misuse_total{TPMMismatch} = %v, want %v", got, before+1)
	}
	// And the claim's own TPM gets nothing more either.
	if code, reason, _ := w.enroll(mine.Socket, proof); code != http.StatusForbidden || reason != ReasonIdentityCompromised {
		t.Errorf("the claim's TPM after the misuse: %d %s, want 403 %s", code, reason, ReasonIdentityCompromised)
	}
}

// TestSharedEK: a second claim whose VM has the same TPM state (cloned
// from a template whose TPM had been started, so the same EK) is refused:
// a DevID made in one of them would load in the other.
func TestSharedEK(t *testing.T) {
	ca := swtpm.NewLocalCAForTest(t)
	tpm := swtpm.StartForTest(t, ca)
	w := newWorld(t, bundle(t, ca), nil)
	now := metav1.Now()
	other := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "runner-0", UID: "uid-0"}}
	if err := w.c.Create(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	_, e, err := tpmdevid.Enroll(tpm.Socket)
	if err != nil {
		t.Fatal(err)
	}
	v, err := tpmdevid.Verify(e, mustPool(t, bundle(t, ca)), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	other.Status.Identity = &hfv1.IdentityStatus{SPIFFEID: "spiffe://example.org/vm/ci/runner-0/uid-0", TPM: &hfv1.TPMIdentityStatus{EntriesCreatedAt: &now, EKFingerprint: v.EKFingerprint}}
	if err := w.c.Status().Update(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	if code, reason, _ := w.enroll(tpm.Socket, w.proof()); code != http.StatusForbidden || reason != ReasonEKShared {
		t.Fatalf("a TPM whose EK another claim enrolled: %d %s, want 403 %s", code, reason, ReasonEKShared)
	}
}

func mustPool(t *testing.T, pem []byte) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(pem) {
		t.Fatal("no certificate in the bundle")
	}
	return p
}

// TestUntrustedEK: a TPM whose EK another CA signed is refused, whether
// the cluster's bundle or a tenant's narrower one (the template's) leaves
// it out; the claim gets an event.
func TestUntrustedEK(t *testing.T) {
	trusted, untrusted := swtpm.NewLocalCAForTest(t), swtpm.NewLocalCAForTest(t)
	// A local CA makes its certificates with its first TPM.
	tpm, tpm2 := swtpm.StartForTest(t, untrusted), swtpm.StartForTest(t, trusted)
	w := newWorld(t, bundle(t, trusted), nil)
	code, reason, _ := w.enroll(tpm.Socket, w.proof())
	if code != http.StatusForbidden || reason != ReasonEKUntrusted {
		t.Fatalf("an EK of an untrusted CA: %d %s, want 403 %s", code, reason, ReasonEKUntrusted)
	}
	select {
	case e := <-w.recorder.Events:
		if !strings.Contains(e, "TPMEnrollmentRefused") || !strings.Contains(e, ReasonEKUntrusted) {
			t.Errorf("event %q", e)
		}
	default:
		t.Error("no event on the claim")
	}

	// The template narrows: the cluster trusts both CAs, the tenant only
	// the other one.
	both := append(bundle(t, trusted), bundle(t, untrusted)...)
	w = newWorld(t, both, bundle(t, untrusted))
	if code, reason, _ := w.enroll(tpm2.Socket, w.proof()); code != http.StatusForbidden || reason != ReasonEKUntrusted {
		t.Errorf("an EK the template's bundle leaves out: %d %s, want 403 %s", code, reason, ReasonEKUntrusted)
	}
	// A template cannot widen: an EK only it trusts is refused too.
	w = newWorld(t, bundle(t, trusted), bundle(t, untrusted))
	if code, reason, _ := w.enroll(tpm.Socket, w.proof()); code != http.StatusForbidden || reason != ReasonEKUntrusted {
		t.Errorf("an EK only the template trusts: %d %s, want 403 %s", code, reason, ReasonEKUntrusted)
	}
}

// TestRefusals: without the claim's proof, with a wrong answer, for a
// claim that is not enrolling: nothing is signed.
func TestRefusals(t *testing.T) {
	ca := swtpm.NewLocalCAForTest(t)
	tpm := swtpm.StartForTest(t, ca)
	w := newWorld(t, bundle(t, ca), nil)
	_, e, err := tpmdevid.Enroll(tpm.Socket)
	if err != nil {
		t.Fatal(err)
	}
	proof := w.proof()
	var out agentconfig.TPMChallenge
	for _, c := range []struct {
		name, proof, path string
		body              any
		code              int
		reason            string
	}{
		{"no proof", "", agentconfig.TPMEnrollPath, agentconfig.TPMEnrollRequest{SPIFFEID: spiffeID, Enrollment: *e}, http.StatusForbidden, ReasonEnrollmentProofInvalid},
		{"another mac", strings.TrimSuffix(proof, proof[len(proof)-4:]) + "AAAA", agentconfig.TPMEnrollPath, agentconfig.TPMEnrollRequest{SPIFFEID: spiffeID, Enrollment: *e}, http.StatusForbidden, ReasonEnrollmentProofInvalid},
		{"another SPIFFE ID", proof, agentconfig.TPMEnrollPath, agentconfig.TPMEnrollRequest{SPIFFEID: spiffeID + "x", Enrollment: *e}, http.StatusBadRequest, ReasonBadRequest},
		{"a wrong answer", proof, agentconfig.TPMActivatePath, agentconfig.TPMActivateRequest{SPIFFEID: spiffeID, Enrollment: *e, Answer: bytes.Repeat([]byte{9}, 32)}, http.StatusForbidden, ReasonActivationFailed},
		{"a tampered certification", proof, agentconfig.TPMEnrollPath, agentconfig.TPMEnrollRequest{SPIFFEID: spiffeID, Enrollment: tampered(*e)}, http.StatusForbidden, ReasonEnrollmentInvalid},
	} {
		t.Run(c.name, func(t *testing.T) {
			if code, reason := w.post(c.path, c.proof, c.body, &out); code != c.code || reason != c.reason {
				t.Errorf("%d %s, want %d %s", code, reason, c.code, c.reason)
			}
		})
	}
	if st := w.claim().Status.Identity.TPM; st.DevIDFingerprint != "" || st.EKFingerprint != "" {
		t.Errorf("a refused enrollment recorded %+v", st)
	}

	// A claim whose VM attested already enrolls no more.
	claim := w.claim()
	claim.Status.Identity.AttestedAt = &metav1.Time{Time: time.Now()}
	if err := w.c.Status().Update(context.Background(), claim); err != nil {
		t.Fatal(err)
	}
	if code, reason := w.post(agentconfig.TPMEnrollPath, proof, agentconfig.TPMEnrollRequest{SPIFFEID: spiffeID, Enrollment: *e}, &out); code != http.StatusConflict || reason != ReasonNotEnrolling {
		t.Errorf("an attested claim: %d %s, want 409 %s", code, reason, ReasonNotEnrolling)
	}
}

// tampered flips a bit of the certification's signature.
func tampered(e tpmdevid.Enrollment) tpmdevid.Enrollment {
	sig := append([]byte(nil), e.CertifySignature...)
	sig[len(sig)-1] ^= 1
	e.CertifySignature = sig
	return e
}
