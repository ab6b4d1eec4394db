//go:build !windows

package agent

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/testworld/swtpm"
	"github.com/hyperfleet/hyperfleet/internal/tpmdevid"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github/githubvm"
)

// TestSPIREAgentConfigTPM: with a DevID spire-agent attests with
// tpm_devid, its four paths quoted in plugin_data, and no join token; a
// device path that could end its string is refused.
func TestSPIREAgentConfigTPM(t *testing.T) {
	t.Parallel()
	dir := "/run/hyperfleet/spire/attest-1"
	att := nodeAttestor{tpmDevice: "/dev/tpmrm0", devID: &devIDFiles{
		cert: dir + "/devid.pem", pub: dir + "/devid.pub", priv: dir + "/devid.priv"}}
	conf, err := spireAgentConfig(testSPIFFE(), att, dir)
	if err != nil {
		t.Fatal(err)
	}
	want := `	NodeAttestor "tpm_devid" {
		plugin_data {
			devid_cert_path = "/run/hyperfleet/spire/attest-1/devid.pem"
			devid_priv_path = "/run/hyperfleet/spire/attest-1/devid.priv"
			devid_pub_path = "/run/hyperfleet/spire/attest-1/devid.pub"
			tpm_device_path = "/dev/tpmrm0"
		}
	}
`
	if !strings.Contains(string(conf), want) {
		t.Errorf("config lacks\n%s\nin\n%s", want, conf)
	}
	for _, unwanted := range []string{"join_token", "joinToken"} {
		if strings.Contains(string(conf), unwanted) {
			t.Errorf("config has %s:\n%s", unwanted, conf)
		}
	}
	att.tpmDevice = "/dev/tpm\"\n}\nplugins {"
	if _, err := spireAgentConfig(testSPIFFE(), att, dir); exitCode(err) != ExitBadConfig || !strings.Contains(err.Error(), "spiffe.tpmDevicePath") {
		t.Errorf("a device path with a quote: %v, want ExitBadConfig naming spiffe.tpmDevicePath", err)
	}
}

// enrollEndpoint is an httptest TLS server standing in for one of the
// operator's TPM enrollment endpoints, answering with answer; it records
// the paths and proofs it saw.
type enrollEndpoint struct {
	srv   *httptest.Server
	caPEM string

	mu     sync.Mutex
	paths  []string
	proofs []string
}

func newEnrollEndpoint(t *testing.T, answer http.HandlerFunc) *enrollEndpoint {
	t.Helper()
	e := &enrollEndpoint{}
	e.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.paths = append(e.paths, r.URL.Path+"?"+r.URL.RawQuery)
		e.proofs = append(e.proofs, r.Header.Get(agentconfig.EnrollmentProofHeader))
		e.mu.Unlock()
		answer(w, r)
	}))
	t.Cleanup(e.srv.Close)
	e.caPEM = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: e.srv.Certificate().Raw}))
	return e
}

func (e *enrollEndpoint) seen() (paths, proofs []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.paths...), append([]string(nil), e.proofs...)
}

func (e *enrollEndpoint) client(t *testing.T, caPEM string) *tpmClient {
	t.Helper()
	hc, err := brokerHTTPClient(caPEM, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &tpmClient{http: hc, base: e.srv.URL + "/broker/v1/credential?x=1", proof: "enroll-proof", userAgent: "hyperfleet-agent/test", log: slog.New(slog.DiscardHandler)}
}

// TestTPMClient: the enrollment endpoints' client posts to the broker
// host's path with the enrollment proof, takes a 200's JSON, retries a 503
// after its Retry-After, and ends a 403 as a refusal carrying the
// operator's reason; a server it does not trust or that stays busy is
// ExitBrokerUnavailable.
func TestTPMClient(t *testing.T) {
	t.Parallel()
	ch := agentconfig.TPMChallenge{}
	ch.Challenge.Credential, ch.Challenge.Secret = []byte("cred"), []byte("secret")

	t.Run("ok", func(t *testing.T) {
		t.Parallel()
		e := newEnrollEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
			var req agentconfig.TPMEnrollRequest
			if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" || json.NewDecoder(r.Body).Decode(&req) != nil || req.SPIFFEID != "spiffe://x/vm" {
				http.Error(w, `{"reason":"BadRequest","message":"bad"}`, http.StatusBadRequest)
				return
			}
			_ = json.NewEncoder(w).Encode(ch)
		})
		var got agentconfig.TPMChallenge
		err := e.client(t, e.caPEM).post(context.Background(), context.Background(), agentconfig.TPMEnrollPath, agentconfig.TPMEnrollRequest{SPIFFEID: "spiffe://x/vm"}, &got)
		if err != nil {
			t.Fatal(err)
		}
		if string(got.Challenge.Credential) != "cred" || string(got.Challenge.Secret) != "secret" {
			t.Errorf("challenge %+v, want the server's", got)
		}
		paths, proofs := e.seen()
		if len(paths) != 1 || paths[0] != agentconfig.TPMEnrollPath+"?" || proofs[0] != "enroll-proof" {
			t.Errorf("requests %q with proofs %q, want one to %s (the broker URL's query dropped) with the proof", paths, proofs, agentconfig.TPMEnrollPath)
		}
	})

	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		e := newEnrollEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`{"reason":"EKNotTrusted","message":"the EK certificate\nis not from this cluster's hypervisors"}`))
		})
		err := e.client(t, e.caPEM).post(context.Background(), context.Background(), agentconfig.TPMActivatePath, agentconfig.TPMActivateRequest{}, &agentconfig.TPMActivateResponse{})
		if exitCode(err) != ExitAttestation || !errors.Is(err, errTPMEnrollmentRefused) || attestationErrorOf(err) != agentconfig.AttestationTPMEnrollmentRefused {
			t.Fatalf("error %v (exit code %d), want ExitAttestation with errTPMEnrollmentRefused", err, exitCode(err))
		}
		for _, want := range []string{"403", "EKNotTrusted", "is not from this cluster's hypervisors", agentconfig.TPMActivatePath} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error lacks %q: %v", want, err)
			}
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("the operator's message forges a line: %q", err)
		}
		if paths, _ := e.seen(); len(paths) != 1 {
			t.Errorf("%d requests, want 1: a refusal is not retried", len(paths))
		}
	})

	t.Run("busy", func(t *testing.T) {
		t.Parallel()
		n := 0
		var mu sync.Mutex
		e := newEnrollEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			n++
			first := n == 1
			mu.Unlock()
			if first {
				w.Header().Set("Retry-After", "1")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(`{"reason":"NotLeader","message":"ask again"}`))
				return
			}
			_ = json.NewEncoder(w).Encode(ch)
		})
		start := time.Now()
		var got agentconfig.TPMChallenge
		if err := e.client(t, e.caPEM).post(context.Background(), context.Background(), agentconfig.TPMEnrollPath, agentconfig.TPMEnrollRequest{}, &got); err != nil {
			t.Fatal(err)
		}
		if elapsed := time.Since(start); elapsed < time.Second {
			t.Errorf("retried after %s, want Retry-After's 1s", elapsed)
		}
		if paths, _ := e.seen(); len(paths) != 2 || string(got.Challenge.Secret) != "secret" {
			t.Errorf("%d requests, challenge %+v; want 2 (503, then 200) and the challenge", len(paths), got)
		}
	})

	t.Run("busy until the deadline", func(t *testing.T) {
		t.Parallel()
		e := newEnrollEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusTooManyRequests)
		})
		ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
		defer cancel()
		err := e.client(t, e.caPEM).post(context.Background(), ctx, agentconfig.TPMEnrollPath, agentconfig.TPMEnrollRequest{}, &agentconfig.TPMChallenge{})
		if exitCode(err) != ExitBrokerUnavailable || !strings.Contains(err.Error(), "429") || attestationErrorOf(err) != "" {
			t.Fatalf("error %v (exit code %d), want ExitBrokerUnavailable naming the 429, no attestationError", err, exitCode(err))
		}
	})

	t.Run("untrusted", func(t *testing.T) {
		t.Parallel()
		// Every httptest server has the same certificate: another CA.
		e := newEnrollEndpoint(t, func(w http.ResponseWriter, r *http.Request) {})
		err := e.client(t, testTrustBundle(t)).post(context.Background(), context.Background(), agentconfig.TPMEnrollPath, agentconfig.TPMEnrollRequest{}, &agentconfig.TPMChallenge{})
		if exitCode(err) != ExitBrokerUnavailable || !strings.Contains(err.Error(), "spiffe.brokerCA") {
			t.Fatalf("error %v (exit code %d), want ExitBrokerUnavailable naming spiffe.brokerCA", err, exitCode(err))
		}
	})
}

// tpmVM is v configured for attestationMethod tpm against the enrollment
// endpoint e, with its power-off notices going to notices.
func tpmVM(t *testing.T, e *enrollEndpoint, notices *noticeRecorder) *vm {
	t.Helper()
	v := newVM(t)
	writeScript(t, filepath.Join(v.install(), "run.sh"), v.goodRunner(0))
	c := v.brokerConfig(agentconfig.AttestationTPM)
	c.SPIFFE.BrokerURL, c.SPIFFE.BrokerCA = e.srv.URL+"/broker/v1/credential", e.caPEM
	c.PowerOffNotify = notices.notify(t)
	v.writeConfig(c)
	return v
}

// noticeRecorder is the operator's power-off notice endpoint.
type noticeRecorder struct {
	mu      sync.Mutex
	notices []agentconfig.PowerOffNoticeBody
}

func (n *noticeRecorder) notify(t *testing.T) *agentconfig.PowerOffNotify {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b agentconfig.PowerOffNoticeBody
		_ = json.NewDecoder(r.Body).Decode(&b)
		n.mu.Lock()
		n.notices = append(n.notices, b)
		n.mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(srv.Close)
	return &agentconfig.PowerOffNotify{URL: srv.URL + "/hints/v1/power-off", Token: strings.Repeat("cd", 32),
		Claim: agentconfig.ClaimRef{Namespace: "ci", Name: "runner-1", UID: "uid-1"},
		CA:    string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))}
}

func (n *noticeRecorder) attestationErrors() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for _, b := range n.notices {
		out = append(out, b.AttestationError)
	}
	return out
}

// TestTPMNotFound: a VM without a TPM at spiffe.tpmDevicePath fails the
// attestation before it asks the operator anything, and its power-off
// notice says TPMNotFound.
func TestTPMNotFound(t *testing.T) {
	t.Parallel()
	e := newEnrollEndpoint(t, func(w http.ResponseWriter, r *http.Request) {})
	notices := &noticeRecorder{}
	v := tpmVM(t, e, notices)
	v.placeSecrets(agentconfig.GuestSecrets{EnrollmentProof: "enroll-" + v.secret, BrokerProof: "proof-" + v.secret})
	v.checkCommon(v.run(context.Background()), ExitAttestation, 1)
	if got := notices.attestationErrors(); len(got) != 1 || got[0] != agentconfig.AttestationTPMNotFound {
		t.Errorf("power-off notices' attestationError %q, want [%s]", got, agentconfig.AttestationTPMNotFound)
	}
	if !strings.Contains(v.log.String(), "no TPM at "+filepath.Join(v.root, "/dev/tpmrm0")+" (spiffe.tpmDevicePath)") {
		t.Errorf("log does not say where the TPM was looked for:\n%s", v.log)
	}
	if paths, _ := e.seen(); len(paths) != 0 {
		t.Errorf("the enrollment endpoints were called: %q", paths)
	}
	if v.ran("run") {
		t.Error("the runner ran without a credential")
	}
}

// TestTPMRefusesJoinToken: in tpm mode, secrets carrying a join token
// (another mode's, or not this VM's operator's) are refused; nothing is
// enrolled.
func TestTPMRefusesJoinToken(t *testing.T) {
	t.Parallel()
	e := newEnrollEndpoint(t, func(w http.ResponseWriter, r *http.Request) {})
	notices := &noticeRecorder{}
	v := tpmVM(t, e, notices)
	v.placeGuestSecrets()
	v.checkCommon(v.run(context.Background()), ExitAttestation, 1)
	if !strings.Contains(v.log.String(), "hold a join token, but spiffe.attestationMethod is tpm") {
		t.Errorf("log does not say the join token was refused:\n%s", v.log)
	}
	if strings.Contains(v.log.String(), v.secret) {
		t.Error("the log shows the join token")
	}
	if paths, _ := e.seen(); len(paths) != 0 {
		t.Errorf("the enrollment endpoints were called: %q", paths)
	}
	if got := notices.attestationErrors(); len(got) != 1 || got[0] != "" {
		t.Errorf("power-off notices' attestationError %q, want one without", got)
	}
}

// tpmOperator is the operator's side of the TPM enrollment endpoints, as
// an httptest TLS server built on internal/tpmdevid's own operator half:
// it checks the enrollment proof, verifies the enrollment against the
// swtpm local CA's EK bundle (tpmdevid.Verify), challenges with a secret
// derived from the enrollment (the operator keeps no state between the
// two calls), and on the right answer signs a DevID certificate
// (CA.IssueDevID). Its switches make it answer as a busy or refusing
// operator would, or corrupt the challenge so that no TPM can activate it.
type tpmOperator struct {
	srv   *httptest.Server
	caPEM string // the server's certificate, for spiffe.brokerCA
	proof string
	ekCAs *x509.CertPool
	devID *tpmdevid.CA
	key   []byte // derives the challenges' secrets

	// busyFirst answers the first enrollment 503 with Retry-After 1;
	// refuse answers every enrollment 403; corrupt flips a byte of the
	// challenge's encrypted secret.
	busyFirst, refuse, corrupt bool

	mu     sync.Mutex
	calls  map[string]int // path -> requests
	issued [][]byte       // DER DevID certificates
}

func newTPMOperator(t *testing.T, ekBundle []byte, proof string, setup func(*tpmOperator)) *tpmOperator {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ekBundle) {
		t.Fatal("the swtpm local CA's bundle holds no certificate")
	}
	devID, err := tpmdevid.NewCA("hyperfleet test DevID CA", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	o := &tpmOperator{proof: proof, ekCAs: pool, devID: devID, key: []byte("test operator key"), calls: map[string]int{}}
	if setup != nil {
		setup(o)
	}
	o.srv = httptest.NewTLSServer(o)
	t.Cleanup(o.srv.Close)
	o.caPEM = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: o.srv.Certificate().Raw}))
	return o
}

// devIDCAPEM is the DevID CA's certificate, spire-server's devid_ca_path.
func (o *tpmOperator) devIDCAPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: o.devID.Certificate().Raw})
}

func (o *tpmOperator) refusal(w http.ResponseWriter, code int, reason, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"reason": reason, "message": message})
}

// secret is the challenge's secret for an enrollment of spiffeID.
func (o *tpmOperator) secret(spiffeID string, v *tpmdevid.Verified) []byte {
	m := hmac.New(sha256.New, o.key)
	m.Write([]byte(spiffeID + "\x00" + v.EKFingerprint + "\x00" + v.DevIDFingerprint + "\x00"))
	m.Write(v.AKName)
	return m.Sum(nil)
}

func (o *tpmOperator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	o.mu.Lock()
	o.calls[r.URL.Path]++
	n := o.calls[r.URL.Path]
	o.mu.Unlock()
	if r.Method != http.MethodPost {
		o.refusal(w, http.StatusMethodNotAllowed, "MethodNotAllowed", r.Method)
		return
	}
	if r.Header.Get(agentconfig.EnrollmentProofHeader) != o.proof {
		o.refusal(w, http.StatusForbidden, "EnrollmentProofInvalid", "not this claim's enrollment proof")
		return
	}
	var req agentconfig.TPMActivateRequest // TPMEnrollRequest's fields and the answer
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		o.refusal(w, http.StatusBadRequest, "BadRequest", err.Error())
		return
	}
	v, err := tpmdevid.Verify(&req.Enrollment, o.ekCAs, time.Now())
	if err != nil {
		o.refusal(w, http.StatusForbidden, "EnrollmentInvalid", err.Error())
		return
	}
	secret := o.secret(req.SPIFFEID, v)
	switch r.URL.Path {
	case agentconfig.TPMEnrollPath:
		switch {
		case o.busyFirst && n == 1:
			w.Header().Set("Retry-After", "1")
			o.refusal(w, http.StatusServiceUnavailable, "NotLeader", "ask again")
			return
		case o.refuse:
			o.refusal(w, http.StatusForbidden, "ClaimNotEnrolling", "the claim of "+req.SPIFFEID+" enrolls no TPM")
			return
		}
		ch, err := v.Challenge(secret)
		if err != nil {
			o.refusal(w, http.StatusInternalServerError, "ChallengeFailed", err.Error())
			return
		}
		if o.corrupt {
			ch.Secret[len(ch.Secret)/2] ^= 0xff
		}
		_ = json.NewEncoder(w).Encode(agentconfig.TPMChallenge{Challenge: ch})
	case agentconfig.TPMActivatePath:
		if !hmac.Equal(req.Answer, secret) {
			o.refusal(w, http.StatusForbidden, "WrongAnswer", "the answer is not the challenge's secret")
			return
		}
		now := time.Now()
		der, err := o.devID.IssueDevID(v.DevIDKey, devIDCommonName(req.SPIFFEID), now.Add(-time.Minute), now.Add(30*time.Minute))
		if err != nil {
			o.refusal(w, http.StatusInternalServerError, "IssueFailed", err.Error())
			return
		}
		o.mu.Lock()
		o.issued = append(o.issued, der)
		o.mu.Unlock()
		_ = json.NewEncoder(w).Encode(agentconfig.TPMActivateResponse{DevIDCertificate: der, CACertificates: [][]byte{o.devID.Certificate().Raw}})
	default:
		http.NotFound(w, r)
	}
}

// devIDCommonName is the subject CN the test operator gives the DevID of
// the VM spiffeID names (its last path element, the claim's uid): the
// selector tpm_devid:subject:cn:<it> of the VM's node alias.
func devIDCommonName(spiffeID string) string {
	return "hyperfleet." + path.Base(spiffeID)
}

func (o *tpmOperator) counts() (enroll, activate int, issued [][]byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.calls[agentconfig.TPMEnrollPath], o.calls[agentconfig.TPMActivatePath], append([][]byte(nil), o.issued...)
}

// testTPM is a swtpm manufactured by ca (swtpm.StartForTest: a missing
// swtpm fails the test) and the CA's EK bundle.
func testTPM(t *testing.T, ca *swtpm.LocalCA) (*swtpm.TPM, []byte) {
	t.Helper()
	tpm := swtpm.StartForTest(t, ca)
	bundle, err := ca.BundlePEM()
	if err != nil {
		t.Fatal(err)
	}
	return tpm, bundle
}

// tpmSource is a BrokerSource in tpm mode whose VM (root) has tpm at
// /dev/tpmrm0 (a symbolic link to its socket, which go-tpm and
// spire-agent follow) and enrolls at o.
func tpmSource(t *testing.T, tpm *swtpm.TPM, o *tpmOperator, log *syncBuffer) *BrokerSource {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(tpm.Socket, filepath.Join(root, "dev", "tpmrm0")); err != nil {
		t.Fatal(err)
	}
	return &BrokerSource{
		Method: githubvm.MethodJIT,
		SPIFFE: &agentconfig.SPIFFE{
			AttestationMethod: agentconfig.AttestationTPM,
			TPMDevicePath:     "/dev/tpmrm0",
			SPIFFEID:          "spiffe://example.org/vm/ns/tpm/uid",
			TrustDomain:       "example.org",
			BrokerURL:         o.srv.URL + "/credential/tpm",
			BrokerCA:          o.caPEM,
		},
		SecretsFile:   agentconfig.SecretsFile,
		Root:          root,
		AttestTimeout: time.Minute,
		Logger:        slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		UserAgent:     "hyperfleet-agent/test",
	}
}

// TestEnrollTPM enrolls a swtpm's DevID at the operator's endpoints (real
// tpmdevid on both sides): the agent writes the certificate the operator
// issued, in PEM, and the TPM's blobs, 0600, in the run directory; a busy
// operator is asked again after Retry-After, a refusal carries its reason
// (TPMEnrollmentRefused), and a challenge the TPM cannot activate is
// TPMActivationFailed.
func TestEnrollTPM(t *testing.T) {
	t.Parallel()
	tpm, ekBundle := testTPM(t, swtpm.NewLocalCAForTest(t))
	const proof = "enrollment-proof-of-the-claim"
	enroll := func(t *testing.T, o *tpmOperator, proof string) (*spireRun, *syncBuffer, nodeAttestor, error) {
		t.Helper()
		log := &syncBuffer{}
		src := tpmSource(t, tpm, o, log)
		run, err := newSPIRERun(src.Logger, "spire-agent", filepath.Join(src.Root, SPIREDir))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(run.stop)
		att, err := src.enrollTPM(context.Background(), context.Background(), run, proof)
		if err != nil && strings.Contains(err.Error()+log.String(), proof) {
			t.Errorf("the enrollment proof is shown: %v\n%s", err, log)
		}
		return run, log, att, err
	}

	// One TPM: the cases run one after the other (a TPM runs one command
	// at a time, and go-tpm's socket connection is per command).
	t.Run("ok", func(t *testing.T) {
		o := newTPMOperator(t, ekBundle, proof, func(o *tpmOperator) { o.busyFirst = true })
		start := time.Now()
		run, log, att, err := enroll(t, o, proof)
		if err != nil {
			t.Fatalf("enrollTPM: %v (exit code %d)\n%s", err, exitCode(err), log)
		}
		t.Logf("enrolled in %s", time.Since(start).Round(time.Millisecond))
		enrolls, activates, issued := o.counts()
		if enrolls != 2 || activates != 1 || len(issued) != 1 {
			t.Fatalf("operator saw %d enrollments (want 2: 503, then 200) and %d activations (want 1), issued %d", enrolls, activates, len(issued))
		}
		if time.Since(start) < time.Second {
			t.Errorf("the 503's Retry-After (1s) was not waited for")
		}
		// run.dir is <root>/run/hyperfleet/spire/attest-*.
		root := filepath.Dir(filepath.Dir(filepath.Dir(filepath.Dir(run.dir))))
		if att.devID == nil || att.tpmDevice != filepath.Join(root, "dev", "tpmrm0") {
			t.Fatalf("attestor %+v, want tpm_devid at the VM's /dev/tpmrm0", att)
		}
		for _, p := range []string{att.devID.cert, att.devID.pub, att.devID.priv} {
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 || filepath.Dir(p) != run.dir || fi.Size() == 0 {
				t.Errorf("%s: mode %v, size %d; want a non-empty 0600 file in the run directory %s", p, fi.Mode(), fi.Size(), run.dir)
			}
		}
		certPEM, err := os.ReadFile(att.devID.cert)
		if err != nil {
			t.Fatal(err)
		}
		block, rest := pem.Decode(certPEM)
		if block == nil || block.Type != "CERTIFICATE" || !bytes.Equal(block.Bytes, issued[0]) || len(bytes.TrimSpace(rest)) != 0 {
			t.Errorf("devid_cert_path holds %q, want the issued certificate as one PEM CERTIFICATE block", certPEM)
		}
		conf, err := spireAgentConfig(&agentconfig.SPIFFE{TrustDomain: "example.org", ServerAddress: "127.0.0.1:8081"}, att, run.dir)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(conf), `tpm_device_path = "`+att.tpmDevice+`"`) || !strings.Contains(string(conf), `devid_priv_path = "`+att.devID.priv+`"`) {
			t.Errorf("spire-agent's config does not name the DevID:\n%s", conf)
		}
	})

	t.Run("refused", func(t *testing.T) {
		o := newTPMOperator(t, ekBundle, proof, func(o *tpmOperator) { o.refuse = true })
		_, log, _, err := enroll(t, o, proof)
		if exitCode(err) != ExitAttestation || attestationErrorOf(err) != agentconfig.AttestationTPMEnrollmentRefused {
			t.Fatalf("error %v (exit code %d), want ExitAttestation and TPMEnrollmentRefused\n%s", err, exitCode(err), log)
		}
		for _, want := range []string{"403", "ClaimNotEnrolling", "enrolls no TPM"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error lacks the operator's %q: %v", want, err)
			}
		}
	})

	t.Run("wrong proof", func(t *testing.T) {
		o := newTPMOperator(t, ekBundle, proof, nil)
		_, log, _, err := enroll(t, o, "another claim's proof")
		if attestationErrorOf(err) != agentconfig.AttestationTPMEnrollmentRefused || !strings.Contains(err.Error(), "EnrollmentProofInvalid") {
			t.Fatalf("error %v, want TPMEnrollmentRefused with EnrollmentProofInvalid\n%s", err, log)
		}
	})

	t.Run("activation fails", func(t *testing.T) {
		o := newTPMOperator(t, ekBundle, proof, func(o *tpmOperator) { o.corrupt = true })
		_, log, _, err := enroll(t, o, proof)
		if exitCode(err) != ExitAttestation || attestationErrorOf(err) != agentconfig.AttestationTPMActivationFailed {
			t.Fatalf("error %v (exit code %d), want ExitAttestation and TPMActivationFailed\n%s", err, exitCode(err), log)
		}
		if _, activates, _ := o.counts(); activates != 0 {
			t.Errorf("the agent answered a challenge its TPM could not activate (%d activations)", activates)
		}
	})

	t.Run("untrusted EK", func(t *testing.T) {
		// The operator trusts another hypervisor's EK CA: it refuses the
		// enrollment, and says why.
		other, err := swtpm.NewLocalCA(filepath.Join(t.TempDir(), "other"))
		if err != nil {
			t.Fatal(err)
		}
		if err := other.Manufacture(filepath.Join(t.TempDir(), "state")); err != nil {
			t.Fatal(err)
		}
		otherBundle, err := other.BundlePEM()
		if err != nil {
			t.Fatal(err)
		}
		o := newTPMOperator(t, otherBundle, proof, nil)
		_, log, _, err := enroll(t, o, proof)
		if attestationErrorOf(err) != agentconfig.AttestationTPMEnrollmentRefused || !strings.Contains(err.Error(), "EnrollmentInvalid") {
			t.Fatalf("error %v, want TPMEnrollmentRefused with EnrollmentInvalid\n%s", err, log)
		}
	})
}
