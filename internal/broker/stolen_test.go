package broker

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/spire"
)

// TestBrokerRefusesAStolenIdentity: a valid X509-SVID of a live claim
// presented without the broker proof the operator placed in the claim's VM
// (whoever attested with a join token stolen elsewhere has the SVID, not
// the proof) gets no credential: the broker refuses it, records the misuse
// in the claim, says so with an event and counts it; from then on the
// claim's identity gets nothing, not even with the right proof.
func TestBrokerRefusesAStolenIdentity(t *testing.T) {
	claim := liveClaim("runner-1")
	w := newWorld(t, claim, liveClaim("runner-2"))
	svid := w.ca.svid(t, vmID("runner-1"), time.Now().Add(time.Hour))
	misuse := func() float64 {
		return testutil.ToFloat64(metrics.IdentityMisuse.WithLabelValues(string(hfv1.MisuseBrokerProofInvalid)))
	}
	before := misuse()

	// The thief has no proof at all.
	rec, ref, _ := w.callWithProof(t, http.MethodPost, svid, "")
	if rec.Code != http.StatusForbidden || ref.Reason != ReasonBrokerProofInvalid || !strings.Contains(ref.Message, "without a broker proof") {
		t.Fatalf("SVID without a proof: %d %+v, want 403 %s", rec.Code, ref, ReasonBrokerProofInvalid)
	}
	got := &hfv1.MachineClaim{}
	if err := w.client.Get(context.Background(), client.ObjectKeyFromObject(claim), got); err != nil {
		t.Fatal(err)
	}
	m := got.Status.Identity.Misuse
	if m == nil || m.Reason != hfv1.MisuseBrokerProofInvalid || !strings.Contains(m.Message, "192.0.2.1:1234") || got.Status.Identity.CredentialRequestedAt != nil {
		t.Fatalf("the misuse is not recorded as it should be: %+v, credential requested %v", m, got.Status.Identity.CredentialRequestedAt)
	}
	if e := <-w.events.Events; !strings.Contains(e, "Warning IdentityStolen") {
		t.Errorf("event %q, want a Warning IdentityStolen", e)
	}
	// Another claim's proof is no better; the record stays the first.
	rec, ref, _ = w.callWithProof(t, http.MethodPost, svid, w.proofOf(t, w.ca.svid(t, vmID("runner-2"), time.Now().Add(time.Hour))))
	if rec.Code != http.StatusForbidden || ref.Reason != ReasonIdentityCompromised {
		t.Fatalf("SVID with another claim's proof after the misuse: %d %+v", rec.Code, ref)
	}
	// Nor does the VM's own proof get anything now: whoever has the
	// proof, the identity is someone else's too.
	rec, ref, _ = w.call(t, http.MethodPost, svid)
	if rec.Code != http.StatusForbidden || ref.Reason != ReasonIdentityCompromised {
		t.Fatalf("the right proof after the misuse: %d %+v, want 403 %s", rec.Code, ref, ReasonIdentityCompromised)
	}
	if misuse() != before+1 || w.issuer.calls != 0 {
		t.Errorf("misuse counted %v times, credentials minted %d; want 1 and 0", misuse()-before, w.issuer.calls)
	}

	// A wrong proof on a fresh claim is a theft as well; the right one is
	// delivered.
	w2 := newWorld(t, liveClaim("runner-3"), liveClaim("runner-4"))
	rec, ref, _ = w2.callWithProof(t, http.MethodPost, w2.ca.svid(t, vmID("runner-3"), time.Now().Add(time.Hour)), "not-the-proof")
	if rec.Code != http.StatusForbidden || ref.Reason != ReasonBrokerProofInvalid || !strings.Contains(ref.Message, "not its VM's") {
		t.Fatalf("wrong proof: %d %+v", rec.Code, ref)
	}
	if rec, _, resp := w2.call(t, http.MethodPost, w2.ca.svid(t, vmID("runner-4"), time.Now().Add(time.Hour))); rec.Code != http.StatusOK || resp.JITConfig != "jit-runner-4" {
		t.Fatalf("the right proof: %d %s", rec.Code, rec.Body)
	}
}

// countingServer is a SPIRE server whose bundle can change and whose
// bundle reads are counted.
type countingServer struct {
	identity.ServerAPI
	reads  atomic.Int64
	mu     sync.Mutex
	bundle *x509bundle.Bundle
}

func (s *countingServer) X509Bundle(context.Context) (*x509bundle.Bundle, error) {
	s.reads.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bundle, nil
}
func (*countingServer) Close() error { return nil }

// selfSigned is a certificate anyone can make: a self-signed CA-less leaf
// whose URI SAN is an ID of the trust domain.
func selfSigned(t *testing.T, id string) []*x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(id)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "attacker"}, URIs: []*url.URL{u},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return []*x509.Certificate{cert}
}

// TestBrokerFloodDoesNotReadSPIRE: certificates anyone can make, with an
// ID of a configured trust domain, no longer make the broker read the
// SPIRE server's bundle on every request: 200 of them at once read it at
// most once (the first, forced by a failed verification), and no more
// until --spire-forced-refresh-interval has passed; a VM whose SVID comes
// from a CA the bundle in hand lacks (the server rotated it) still gets
// its credential through that one read.
func TestBrokerFloodDoesNotReadSPIRE(t *testing.T) {
	claim := liveClaim("runner-1")
	w := newWorld(t, claim)
	now := time.Now()
	var clock atomic.Pointer[time.Time]
	clock.Store(&now)
	rotated := newCA(t, td)
	srv := &countingServer{bundle: x509bundle.FromX509Authorities(w.ca.td, []*x509.Certificate{w.ca.cert})}
	reg := identity.NewRegistry()
	reg.Dial = func(context.Context, spire.Config) (identity.ServerAPI, error) { return srv, nil }
	reg.Now = func() time.Time { return *clock.Load() }
	reg.ForcedRefreshInterval = 30 * time.Second
	w.broker.Identity = reg

	// The first request connects (one read).
	if rec, ref, _ := w.callWithProof(t, http.MethodPost, selfSigned(t, vmID("runner-1")), ""); rec.Code != http.StatusForbidden || ref.Reason != ReasonInvalidSVID {
		t.Fatalf("self-signed: %d %+v", rec.Code, ref)
	}
	if n := srv.reads.Load(); n != 1 {
		t.Fatalf("%d bundle reads after the first request, want 1 (connecting)", n)
	}
	var wg sync.WaitGroup
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.callWithProof(t, http.MethodPost, selfSigned(t, vmID("runner-1")), "")
		}()
	}
	wg.Wait()
	if n := srv.reads.Load(); n != 1 {
		t.Fatalf("200 self-signed certificates made %d bundle reads within the interval, want none beyond the first", n)
	}
	// The server's CA rotates; once the interval has passed, the first
	// certificate that does not verify reads the bundle again, and the
	// VM's SVID of the new CA verifies.
	srv.mu.Lock()
	srv.bundle = x509bundle.FromX509Authorities(w.ca.td, []*x509.Certificate{w.ca.cert, rotated.cert})
	srv.mu.Unlock()
	later := now.Add(31 * time.Second)
	clock.Store(&later)
	if rec, _, resp := w.call(t, http.MethodPost, rotated.svid(t, vmID("runner-1"), time.Now().Add(time.Hour))); rec.Code != http.StatusOK || resp.JITConfig != "jit-runner-1" {
		t.Fatalf("an SVID of the rotated CA: %d %s", rec.Code, rec.Body)
	}
	if n := srv.reads.Load(); n != 2 {
		t.Errorf("%d bundle reads, want 2", n)
	}
	suppressed := testutil.ToFloat64(metrics.SPIREBundleReads.WithLabelValues("forced", "suppressed"))
	if suppressed < 200 {
		t.Errorf("hyperfleet_spire_bundle_reads_total{trigger=forced,result=suppressed} = %v, want at least 200", suppressed)
	}
}
