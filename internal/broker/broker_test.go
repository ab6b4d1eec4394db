package broker

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/time/rate"
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
	"github.com/hyperfleet/hyperfleet/internal/testworld/credmethods"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// ca is a trust domain's X.509 authority that signs X509-SVIDs.
type ca struct {
	td   spiffeid.TrustDomain
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newCA(t *testing.T, td string) *ca {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	d := spiffeid.RequireTrustDomainFromString(td)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{Organization: []string{"SPIRE"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		URIs: []*url.URL{d.ID().URL()},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &ca{td: d, cert: cert, key: key}
}

// svid is an X509-SVID for id valid until notAfter, as a TLS peer chain.
func (c *ca) svid(t *testing.T, id string, notAfter time.Time) []*x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(id)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{Organization: []string{"SPIRE"}},
		NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs: []*url.URL{u},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return []*x509.Certificate{cert}
}

// bundleServer is a SPIRE server that only hands out its bundle.
type bundleServer struct {
	identity.ServerAPI
	bundle *x509bundle.Bundle
}

func (b bundleServer) X509Bundle(context.Context) (*x509bundle.Bundle, error) { return b.bundle, nil }
func (bundleServer) Close() error                                             { return nil }

// issuer mints fake credentials and records them as the real one does.
type issuer struct {
	mu    sync.Mutex
	calls int
	err   error
}

func (i *issuer) RunnerCredential(_ context.Context, c *hfv1.MachineClaim) (workload.Credential, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.calls++
	if i.err != nil {
		return workload.Credential{}, i.err
	}
	c.Status.Bootstrap = &hfv1.BootstrapStatus{RunnerName: c.Name, RunnerID: 42, CredentialIssuedAt: &metav1.Time{Time: time.Now()}}
	return workload.Credential{Method: credmethods.MethodJIT, Secret: workload.NewSecret("jit-" + c.Name), RunnerName: c.Name, RunnerID: 42}, nil
}

type world struct {
	broker *Broker
	client client.Client
	ca     *ca
	issuer *issuer
	events *record.FakeRecorder
	// proofs derives the claims' broker proofs, as the operator does.
	proofs *identity.Issuer
}

const td = "example.org"

func newWorld(t *testing.T, objs ...client.Object) *world {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := hfv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	cluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: "pve"}, Spec: hfv1.HypervisorClusterSpec{
		SPIRE: &hfv1.SPIREConfig{TrustDomain: td, ServerAddress: "spire:8081", ServerAPI: hfv1.SPIREServerAPI{AdminSocket: "/run/spire.sock"}}}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(append(objs, cluster)...).
		WithStatusSubresource(&hfv1.MachineClaim{}).Build()
	auth := newCA(t, td)
	reg := identity.NewRegistry()
	reg.Dial = func(context.Context, spire.Config) (identity.ServerAPI, error) {
		return bundleServer{bundle: x509bundle.FromX509Authorities(auth.td, []*x509.Certificate{auth.cert})}, nil
	}
	iss := &issuer{}
	events := record.NewFakeRecorder(100)
	proofs := &identity.Issuer{Keys: keyRing(t, 0)}
	return &world{
		broker: &Broker{Client: c, Reader: c, Clusters: c, Identity: reg, Issuer: iss, Proofs: proofs, Recorder: events, Limiter: rate.NewLimiter(rate.Inf, 1)},
		client: c, ca: auth, issuer: iss, events: events, proofs: proofs,
	}
}

// keyRing is an ownership key ring of the given key ids.
func keyRing(t *testing.T, ids ...int) *ownership.Signer {
	t.Helper()
	var keys []ownership.Key
	for _, id := range ids {
		keys = append(keys, ownership.Key{ID: id, Secret: bytes.Repeat([]byte{byte(1 + id)}, ownership.MinKeyLength)})
	}
	r, err := ownership.NewKeyRing("test", keys)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// proofOf is the broker proof the operator placed in the VM of the claim
// that peer's SPIFFE ID names (by its UID, the ID's last segment), "" for
// no peer.
func (w *world) proofOf(t *testing.T, peer []*x509.Certificate) string {
	t.Helper()
	if len(peer) == 0 || len(peer[0].URIs) == 0 {
		return ""
	}
	segments := strings.Split(peer[0].URIs[0].Path, "/")
	proof, err := w.proofs.BrokerProof(&hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{UID: types.UID(segments[len(segments)-1])}})
	if err != nil {
		t.Fatal(err)
	}
	return proof
}

// liveClaim is a claim with an issued identity and a VM.
func liveClaim(name string) *hfv1.MachineClaim {
	uid := "uid-" + name
	now := metav1.Now()
	return &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: name, UID: types.UID(uid)},
		Status: hfv1.MachineClaimStatus{
			VMRef: &hfv1.VMReference{HypervisorCluster: "pve", VMID: 1000, Node: "pve1"},
			Identity: &hfv1.IdentityStatus{SPIFFEID: vmID(name), NodeID: "spiffe://" + td + "/hyperfleet/node/ci/" + name + "/" + uid,
				EntryID: "hyperfleet." + uid, JoinTokenCreatedAt: &now},
		},
	}
}

func vmID(name string) string { return "spiffe://" + td + "/vm/ci/" + name + "/uid-" + name }

// call sends one request with peer certificates (nil: none) and the
// broker proof of the claim they name, as the claim's VM does.
func (w *world) call(t *testing.T, method string, peer []*x509.Certificate) (*httptest.ResponseRecorder, Refusal, Response) {
	t.Helper()
	return w.callWithProof(t, method, peer, w.proofOf(t, peer))
}

// callWithProof sends one request with peer certificates and proof ("":
// no proof header).
func (w *world) callWithProof(t *testing.T, method string, peer []*x509.Certificate, proof string) (*httptest.ResponseRecorder, Refusal, Response) {
	t.Helper()
	rec := serve(w, newRequest(method, peer, proof))
	var ref Refusal
	var resp Response
	if rec.Code == http.StatusOK {
		if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil {
			t.Fatal(err)
		}
	} else if err := json.Unmarshal(rec.Body.Bytes(), &ref); err != nil {
		t.Fatalf("refusal body %q: %v", rec.Body.String(), err)
	}
	return rec, ref, resp
}

// newRequest is a VM's request with peer certificates and proof ("": no
// proof header).
func newRequest(method string, peer []*x509.Certificate, proof string) *http.Request {
	req := httptest.NewRequest(method, "https://operator"+Path, nil)
	req.TLS = &tls.ConnectionState{PeerCertificates: peer}
	if proof != "" {
		req.Header.Set(agentconfig.BrokerProofHeader, proof)
	}
	return req
}

// serve has the broker answer req.
func serve(w *world, req *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	w.broker.ServeHTTP(rec, req)
	return rec
}

func count(reason string) float64 {
	return testutil.ToFloat64(metrics.BrokerRequests.WithLabelValues(reason))
}

func TestBrokerDeliversOnceToTheClaimsVM(t *testing.T) {
	claim := liveClaim("runner-1")
	w := newWorld(t, claim)
	svid := w.ca.svid(t, vmID("runner-1"), time.Now().Add(time.Hour))
	before := count(ReasonDelivered)

	rec, _, resp := w.call(t, http.MethodPost, svid)
	if rec.Code != http.StatusOK || resp.Method != "jit-config" || resp.JITConfig != "jit-runner-1" {
		t.Fatalf("first request: %d %s %+v", rec.Code, rec.Body, resp)
	}
	if rec.Header().Get("Cache-Control") != "no-store" {
		t.Error("a credential answer may be cached")
	}
	got := &hfv1.MachineClaim{}
	if err := w.client.Get(context.Background(), client.ObjectKeyFromObject(claim), got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Identity.CredentialRequestedAt == nil || got.Status.Bootstrap == nil || got.Status.Bootstrap.RunnerID != 42 {
		t.Fatalf("the delivery is not recorded: identity %+v bootstrap %+v", got.Status.Identity, got.Status.Bootstrap)
	}
	if count(ReasonDelivered) != before+1 {
		t.Error("the delivery was not counted")
	}

	// The same VM again: refused, and nothing is minted.
	rec, ref, _ := w.call(t, http.MethodPost, svid)
	if rec.Code != http.StatusConflict || ref.Reason != ReasonAlreadyIssued || w.issuer.calls != 1 {
		t.Fatalf("second request: %d %+v, credentials minted %d", rec.Code, ref, w.issuer.calls)
	}
	if e := <-w.events.Events; !strings.Contains(e, "CredentialDelivered") {
		t.Errorf("first event %q", e)
	}
	if e := <-w.events.Events; !strings.Contains(e, "CredentialRefused") || !strings.Contains(e, ReasonAlreadyIssued) {
		t.Errorf("second event %q", e)
	}
}

func TestBrokerRefusals(t *testing.T) {
	ending := liveClaim("ending")
	ending.Status.End = &hfv1.MachineClaimEnd{Reason: hfv1.EndJobCompleted, StartedAt: metav1.Now()}
	noVM := liveClaim("no-vm")
	noVM.Status.VMRef = nil
	noToken := liveClaim("no-token")
	noToken.Status.Identity.JoinTokenCreatedAt = nil
	replaced := liveClaim("replaced") // same name, another claim's UID in the id
	viaStore := liveClaim("via-store")
	viaStore.Status.VMRef.HypervisorCluster = "pve-store"
	storeCluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: "pve-store"}, Spec: hfv1.HypervisorClusterSpec{
		SPIRE: &hfv1.SPIREConfig{TrustDomain: td, ServerAddress: "spire:8081", ServerAPI: hfv1.SPIREServerAPI{AdminSocket: "/run/spire.sock"},
			SecretStore: &hfv1.SecretStoreConfig{Address: "https://vault.example.com:8200"}}}}
	w := newWorld(t, liveClaim("runner-1"), ending, noVM, noToken, replaced, viaStore, storeCluster)
	other := newCA(t, "other.org")
	future := time.Now().Add(time.Hour)

	cases := []struct {
		name   string
		method string
		peer   []*x509.Certificate
		status int
		reason string
	}{
		{"GET", http.MethodGet, w.ca.svid(t, vmID("runner-1"), future), http.StatusMethodNotAllowed, ReasonMethodNotAllowed},
		{"no client certificate", http.MethodPost, nil, http.StatusUnauthorized, ReasonNoClientCertificate},
		{"another trust domain", http.MethodPost, other.svid(t, "spiffe://other.org/vm/ci/runner-1/uid-runner-1", future), http.StatusForbidden, ReasonUnknownTrustDomain},
		{"signed by another CA for this trust domain", http.MethodPost, newCA(t, td).svid(t, vmID("runner-1"), future), http.StatusForbidden, ReasonInvalidSVID},
		{"expired SVID", http.MethodPost, w.ca.svid(t, vmID("runner-1"), time.Now().Add(-time.Minute)), http.StatusForbidden, ReasonInvalidSVID},
		{"not a VM id", http.MethodPost, w.ca.svid(t, "spiffe://"+td+"/ns/ci/sa/default", future), http.StatusForbidden, ReasonNotAVMIdentity},
		{"no such claim", http.MethodPost, w.ca.svid(t, vmID("gone"), future), http.StatusForbidden, ReasonNoLiveClaim},
		{"claim with another UID", http.MethodPost, w.ca.svid(t, "spiffe://"+td+"/vm/ci/replaced/uid-old", future), http.StatusForbidden, ReasonNoLiveClaim},
		{"identity not issued", http.MethodPost, w.ca.svid(t, vmID("no-token"), future), http.StatusForbidden, ReasonNoLiveClaim},
		{"claim ending", http.MethodPost, w.ca.svid(t, vmID("ending"), future), http.StatusForbidden, ReasonNotBootstrapping},
		{"claim without VM", http.MethodPost, w.ca.svid(t, vmID("no-vm"), future), http.StatusForbidden, ReasonNotBootstrapping},
		// The operator writes its credential to the cluster's secrets store.
		{"claim of a secrets store cluster", http.MethodPost, w.ca.svid(t, vmID("via-store"), future), http.StatusForbidden, ReasonNotBootstrapping},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := count(tc.reason)
			rec, ref, _ := w.call(t, tc.method, tc.peer)
			if rec.Code != tc.status || ref.Reason != tc.reason || ref.Message == "" {
				t.Fatalf("got %d %+v, want %d %s with a message", rec.Code, ref, tc.status, tc.reason)
			}
			if count(tc.reason) != before+1 {
				t.Errorf("refusal %s not counted", tc.reason)
			}
		})
	}
	if w.issuer.calls != 0 {
		t.Errorf("%d credentials minted for refused requests", w.issuer.calls)
	}
}

func TestBrokerRateLimitAndFailedIssue(t *testing.T) {
	w := newWorld(t, liveClaim("runner-1"), liveClaim("runner-2"))
	w.broker.Limiter = rate.NewLimiter(rate.Every(time.Hour), 1)
	svid1 := w.ca.svid(t, vmID("runner-1"), time.Now().Add(time.Hour))
	svid2 := w.ca.svid(t, vmID("runner-2"), time.Now().Add(time.Hour))
	if rec, _, _ := w.call(t, http.MethodPost, svid1); rec.Code != http.StatusOK {
		t.Fatalf("first: %d %s", rec.Code, rec.Body)
	}
	rec, ref, _ := w.call(t, http.MethodPost, svid2)
	if rec.Code != http.StatusTooManyRequests || ref.Reason != ReasonRateLimited || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("over the limit: %d %+v Retry-After %q", rec.Code, ref, rec.Header().Get("Retry-After"))
	}

	// A transient failure to mint leaves the claim free for the VM's retry.
	w.broker.Limiter = rate.NewLimiter(rate.Inf, 1)
	w.issuer.err = errclass.Errorf(errclass.ClassTransient, "Unavailable", "GitHub is down")
	rec, ref, _ = w.call(t, http.MethodPost, svid2)
	if rec.Code != http.StatusServiceUnavailable || ref.Reason != ReasonIssueFailed || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("failed issue: %d %+v", rec.Code, ref)
	}
	w.issuer.err = nil
	if rec, _, resp := w.call(t, http.MethodPost, svid2); rec.Code != http.StatusOK || resp.JITConfig != "jit-runner-2" {
		t.Fatalf("retry after a failed issue: %d %s", rec.Code, rec.Body)
	}
	// A configuration failure is not retried.
	w3 := newWorld(t, liveClaim("runner-3"))
	w3.issuer.err = errclass.Errorf(errclass.ClassConfiguration, "BadCredentials", "the PAT was revoked")
	rec, ref, _ = w3.call(t, http.MethodPost, w3.ca.svid(t, vmID("runner-3"), time.Now().Add(time.Hour)))
	if rec.Code != http.StatusBadGateway || ref.Reason != ReasonIssueFailed || rec.Header().Get("Retry-After") != "" {
		t.Fatalf("configuration failure: %d %+v", rec.Code, ref)
	}
}

// waitingIssuer is an issuer whose claims' VMs stand by for a job until
// one is bound.
type waitingIssuer struct {
	*issuer
	waiting bool
}

func (w *waitingIssuer) WaitingForJob(context.Context, *hfv1.MachineClaim) bool { return w.waiting }

// TestBrokerWritesNothingForAVMWaitingForItsJob: a warm VM that stands by
// until its pool binds it a job is told to ask again (503, Retry-After,
// reason WaitingForJob) with nothing minted and nothing written to its
// claim, however often it asks; once a job is bound it gets its credential.
func TestBrokerWritesNothingForAVMWaitingForItsJob(t *testing.T) {
	claim := liveClaim("warm-1")
	w := newWorld(t, claim)
	waiting := &waitingIssuer{issuer: w.issuer, waiting: true}
	w.broker.Issuer = waiting
	svid := w.ca.svid(t, vmID("warm-1"), time.Now().Add(time.Hour))
	rv := func() string {
		got := &hfv1.MachineClaim{}
		if err := w.client.Get(context.Background(), client.ObjectKeyFromObject(claim), got); err != nil {
			t.Fatal(err)
		}
		return got.ResourceVersion
	}
	before := rv()
	for range 3 {
		rec, ref, _ := w.call(t, http.MethodPost, svid)
		if rec.Code != http.StatusServiceUnavailable || ref.Reason != ReasonWaitingForJob || rec.Header().Get("Retry-After") == "" {
			t.Fatalf("a VM waiting for its job: %d %+v (Retry-After %q)", rec.Code, ref, rec.Header().Get("Retry-After"))
		}
	}
	if after := rv(); after != before || w.issuer.calls != 0 {
		t.Fatalf("waiting VMs' polls wrote the claim (resourceVersion %s -> %s) or minted %d credentials", before, after, w.issuer.calls)
	}
	waiting.waiting = false
	if rec, _, resp := w.call(t, http.MethodPost, svid); rec.Code != http.StatusOK || resp.JITConfig != "jit-warm-1" {
		t.Fatalf("once bound: %d %s", rec.Code, rec.Body)
	}
}
