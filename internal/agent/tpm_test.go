package agent

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
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
	hc, err := brokerHTTPClient(caPEM, nil)
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
