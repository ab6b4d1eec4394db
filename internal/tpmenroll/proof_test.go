package tpmenroll

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/testworld/swtpm"
)

// TestNoWorkBeforeTheProof: 200 forged enrollment requests (a mac edited,
// a VM's own valid proof with another claim's namespace and name or UID
// put in front, the format before the mac covered the name, none at all)
// make the operator read no claim, record no event and log no line above
// debug level, and each is answered 403 with its connection closed, its
// body unread. Before, each cost an uncached read of the claim the header
// named, and half of them an event on it: 200 forged requests gave 200
// reads and 100 events. The claim's own proof is still read and answered.
func TestNoWorkBeforeTheProof(t *testing.T) {
	w := newWorld(t, []byte("unused"), nil)
	own := w.proof()
	// Another VM's proof, valid for its own claim: what a hostile job in
	// that VM holds.
	attacker := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "attacker", UID: types.UID("uid-attacker")}}
	theirs, err := w.issuer.EnrollmentProof(attacker)
	if err != nil {
		t.Fatal(err)
	}
	tp := strings.Split(theirs, "/")
	forged := []string{
		own[:len(own)-2] + "AA",
		ns + "/" + claimName + "/" + tp[2] + "/" + tp[3] + "/" + tp[4],
		ns + "/" + claimName + "/" + claimUID + "/" + tp[3] + "/" + tp[4],
		ns + "/" + claimName + "/" + claimUID + "/" + tp[4],
		"",
	}
	var infoLines []string
	logger := funcr.NewJSON(func(obj string) {
		if strings.Contains(obj, `"level":0`) {
			infoLines = append(infoLines, obj)
		}
	}, funcr.Options{Verbosity: 1})
	for i := range 200 {
		req := httptest.NewRequest(http.MethodPost, agentconfig.TPMEnrollPath, strings.NewReader(`{"spiffeID":"`+spiffeID+`"}`))
		req = req.WithContext(logr.NewContext(context.Background(), logger))
		if p := forged[i%len(forged)]; p != "" {
			req.Header.Set(agentconfig.EnrollmentProofHeader, p)
		}
		rr := httptest.NewRecorder()
		w.h.ServeHTTP(rr, req)
		if rr.Code != http.StatusForbidden || !strings.Contains(rr.Body.String(), ReasonEnrollmentProofInvalid) || rr.Header().Get("Connection") != "close" {
			t.Fatalf("forged proof %q: %d %s (Connection %q), want 403 %s and a close", forged[i%len(forged)], rr.Code, rr.Body, rr.Header().Get("Connection"), ReasonEnrollmentProofInvalid)
		}
	}
	if n := w.reads.gets.Load(); n != 0 {
		t.Errorf("200 forged proofs made %d reads of claims, want 0", n)
	}
	if n := len(w.recorder.Events); n != 0 {
		t.Errorf("200 forged proofs recorded %d events, want 0: %v", n, <-w.recorder.Events)
	}
	// One Info line at most: RefusalLog's summary of the flood, which
	// names no claim.
	if len(infoLines) > 1 || len(infoLines) == 1 && (strings.Contains(infoLines[0], "MachineClaim") || !strings.Contains(infoLines[0], `"refusedSinceLastLine":1`)) {
		t.Errorf("200 forged proofs logged at Info: %v", infoLines)
	}

	// The claim's own proof is read, once.
	req := httptest.NewRequest(http.MethodPost, agentconfig.TPMEnrollPath, strings.NewReader(`{"spiffeID":"`+spiffeID+`"}`))
	req.Header.Set(agentconfig.EnrollmentProofHeader, own)
	w.h.ServeHTTP(httptest.NewRecorder(), req)
	if n := w.reads.gets.Load(); n != 1 {
		t.Errorf("the claim's own proof made %d reads, want 1", n)
	}
}

// TestEnrollmentSurvivesAKeyRotation: a claim whose identity was planned
// with ownership key 0 (recorded in its status), and whose VM holds the
// enrollment proof of that key, enrolls with an operator restarted after
// hmac-key-1 was added to the ring; the activation secret of the
// challenge, derived on either side of the rotation, is the same. Before,
// the operator derived every proof with the newest key, and the VM's proof
// was refused.
func TestEnrollmentSurvivesAKeyRotation(t *testing.T) {
	ca := swtpm.NewLocalCAForTest(t)
	tpm := swtpm.StartForTest(t, ca)
	w := newWorld(t, bundle(t, ca), nil)
	claim := w.claim()
	zero := int32(0)
	claim.Status.Identity.KeyID = &zero // planned before the rotation
	if err := w.c.Status().Update(context.Background(), claim); err != nil {
		t.Fatal(err)
	}
	proof := w.proof() // what the VM holds
	rotated := &identity.Issuer{Keys: keyRing(t, 0, 1)}
	w.h.Issuer, w.issuer = rotated, rotated
	if code, reason, _ := w.enroll(tpm.Socket, proof); code != http.StatusOK {
		t.Fatalf("the VM's enrollment after the key rotation: %d %s", code, reason)
	}
	// A proof of the new key is not this claim's: the claim records key 0.
	one := int32(1)
	other := w.claim()
	other.Status.Identity.KeyID = &one
	newProof, err := rotated.EnrollmentProof(other)
	if err != nil {
		t.Fatal(err)
	}
	if code, reason, _ := w.enroll(tpm.Socket, newProof); code != http.StatusForbidden || reason != ReasonEnrollmentProofInvalid {
		t.Errorf("a proof of another key than the claim's: %d %s, want 403 %s", code, reason, ReasonEnrollmentProofInvalid)
	}
}

// TestWiderDevIDCAIsRefused: a cluster whose
// spec.spire.tpm.devIDCASecretRef names a CA that may sign other CAs (a
// cluster's root CA, say) gets no DevID certificate signed: the
// activation is refused (403 TPMNotConfigured, an event on the claim
// naming the field and the fix) and nothing is recorded. Before, the
// operator signed DevIDs with any CA.
func TestWiderDevIDCAIsRefused(t *testing.T) {
	ca := swtpm.NewLocalCAForTest(t)
	tpm := swtpm.StartForTest(t, ca)
	w := newWorld(t, bundle(t, ca), nil)
	certPEM, keyPEM := rootCA(t)
	secret := &corev1.Secret{}
	if err := w.c.Get(context.Background(), client.ObjectKey{Namespace: "hyperfleet-system", Name: "devid-ca"}, secret); err != nil {
		t.Fatal(err)
	}
	secret.Data = map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}
	if err := w.c.Update(context.Background(), secret); err != nil {
		t.Fatal(err)
	}
	code, reason, cert := w.enroll(tpm.Socket, w.proof())
	if code != http.StatusForbidden || reason != ReasonTPMNotConfigured || cert != nil {
		t.Fatalf("enrollment with a root CA as the DevID CA: %d %s, certificate %v; want 403 %s", code, reason, cert != nil, ReasonTPMNotConfigured)
	}
	select {
	case e := <-w.recorder.Events:
		if !strings.Contains(e, "devIDCASecretRef") || !strings.Contains(e, "pathLenConstraint") {
			t.Errorf("event %q does not name the field and the constraint", e)
		}
	default:
		t.Error("no event on the claim")
	}
	if st := w.claim().Status.Identity.TPM; st.DevIDFingerprint != "" {
		t.Errorf("a DevID certificate was recorded: %+v", st)
	}
}

// rootCA is a self-signed CA without a path length constraint, as PEM.
func rootCA(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "Cluster Root CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}
