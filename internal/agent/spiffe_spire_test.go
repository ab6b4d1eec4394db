//go:build spire && !windows

package agent

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github/githubvm"
	"github.com/hyperfleet/hyperfleet/test/spiretest"
)

const spireTrustDomain = "example.org"

// spireWorld is a real spire-server and a credential broker that accepts
// X509-SVIDs of its trust domain, as the operator will run them.
type spireWorld struct {
	server *spiretest.Server
	broker *testBroker
	bin    string // spire-agent
}

func newSPIREWorld(t *testing.T) *spireWorld {
	t.Helper()
	server := spiretest.StartServer(t, spireTrustDomain)
	bundle, err := x509bundle.Parse(spiffeid.RequireTrustDomainFromString(spireTrustDomain), server.Bundle)
	if err != nil {
		t.Fatalf("parsing the server's bundle: %v", err)
	}
	return &spireWorld{
		server: server,
		broker: newTestBroker(t, bundle),
		bin:    filepath.Join(spiretest.SpireDir(t), "spire-agent"),
	}
}

// vmIdentity creates what the operator creates for a VM: a join token
// whose agent is aliased spiffe://<td>/hyperfleet/node/ns/<claim>/uid and
// a registration entry spiffe://<td>/vm/ns/<claim>/uid for the agent's
// uid, parented to it. It returns the token and the entry's SPIFFE ID.
func (w *spireWorld) vmIdentity(t *testing.T, claim string) (token, id string) {
	t.Helper()
	return w.vmIdentitySelecting(t, claim, fmt.Sprintf("uid:%d", os.Getuid()))
}

// vmIdentitySelecting is vmIdentity with an entry for the unix selector
// value sel (uid:N, user:NAME).
func (w *spireWorld) vmIdentitySelecting(t *testing.T, claim, sel string) (token, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	node := "/hyperfleet/node/ns/" + claim + "/uid"
	token, err := w.server.CreateJoinToken(ctx, node, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	workload := "/vm/ns/" + claim + "/uid"
	if err := w.server.CreateEntries(ctx, &types.Entry{
		Id:        "hyperfleet." + claim,
		SpiffeId:  w.server.ID(workload),
		ParentId:  w.server.ID(node),
		Selectors: []*types.Selector{{Type: "unix", Value: sel}},
	}); err != nil {
		t.Fatal(err)
	}
	return token, "spiffe://" + spireTrustDomain + workload
}

// placeSecrets puts what the operator places in the running VM through
// its guest channel, token and the proof of brokerCase, under root.
func placeSecrets(t *testing.T, root, token, brokerCase string) {
	t.Helper()
	path := filepath.Join(root, agentconfig.SecretsFile)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	doc, err := json.Marshal(agentconfig.GuestSecrets{JoinToken: token, BrokerProof: "proof-" + brokerCase})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, doc, 0o666); err != nil {
		t.Fatal(err)
	}
}

// source is a BrokerSource for token (placed in its VM as the operator
// would) and the broker's case path.
func (w *spireWorld) source(t *testing.T, token, wantID, brokerCase string, log *syncBuffer) (*BrokerSource, string) {
	t.Helper()
	root := t.TempDir()
	placeSecrets(t, root, token, brokerCase)
	s := &agentconfig.SPIFFE{
		AttestationMethod: agentconfig.AttestationJoinToken,
		SPIFFEID:          wantID,
		TrustDomain:       spireTrustDomain,
		TrustBundle:       string(w.server.Bundle),
		ServerAddress:     w.server.Address,
		BrokerURL:         w.broker.srv.URL + "/credential/" + brokerCase,
		BrokerCA:          w.broker.caPEM,
	}
	return &BrokerSource{
		Method:        githubvm.MethodJIT,
		SPIFFE:        s,
		SecretsFile:   agentconfig.SecretsFile,
		Root:          root,
		SPIREAgent:    w.bin,
		AttestTimeout: 2 * time.Minute,
		Logger:        slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		UserAgent:     "hyperfleet-agent/test",
	}, root
}

// testBroker is the credential broker's contract: POST with the
// X509-SVID as client certificate, verified against the trust domain's
// bundle (with go-spiffe, in the test only), and the case's broker proof.
// The last path element, one per case, picks the answer: refuse (403),
// busy (503 with Retry-After, then 200), any other a credential (200).
type testBroker struct {
	srv   *httptest.Server
	caPEM string

	mu    sync.Mutex
	seen  map[string][]string // case -> SPIFFE IDs of the calls
	calls map[string]int
}

// brokerJIT is the JIT configuration the broker hands out for id.
func brokerJIT(id string) string { return "JIT-FROM-BROKER-" + id }

func newTestBroker(t *testing.T, bundle *x509bundle.Bundle) *testBroker {
	t.Helper()
	b := &testBroker{seen: map[string][]string{}, calls: map[string]int{}}
	b.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			http.Error(w, `{"reason":"BadRequest","message":"POST with a client certificate"}`, http.StatusBadRequest)
			return
		}
		id, _, err := x509svid.Verify(r.TLS.PeerCertificates, bundle)
		if err != nil {
			w.WriteHeader(http.StatusUnauthorized)
			_ = json.NewEncoder(w).Encode(map[string]string{"reason": "BadSVID", "message": err.Error()})
			return
		}
		brokerCase := filepath.Base(r.URL.Path)
		if got := r.Header.Get(agentconfig.BrokerProofHeader); got != "proof-"+brokerCase {
			w.WriteHeader(http.StatusForbidden)
			_ = json.NewEncoder(w).Encode(map[string]string{"reason": "BrokerProofInvalid", "message": "proof " + got})
			return
		}
		b.mu.Lock()
		b.seen[brokerCase] = append(b.seen[brokerCase], id.String())
		b.calls[brokerCase]++
		n := b.calls[brokerCase]
		b.mu.Unlock()
		switch {
		case brokerCase == "refuse":
			w.WriteHeader(http.StatusForbidden)
			_ = json.NewEncoder(w).Encode(map[string]string{"reason": "ClaimReleased", "message": "the claim of " + id.String() + " was released"})
			return
		case brokerCase == "busy" && n == 1:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{
			"method":    "jit-config",
			"jitConfig": brokerJIT(id.String()),
			"expiresAt": time.Now().Add(time.Hour).UTC().Format(time.RFC3339),
		})
	}))
	// StartTLS keeps this config and adds the server's certificate; the
	// client's is verified by the handler, against the SPIFFE bundle.
	b.srv.TLS = &tls.Config{ClientAuth: tls.RequireAnyClientCert}
	b.srv.StartTLS()
	t.Cleanup(b.srv.Close)
	b.caPEM = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: b.srv.Certificate().Raw}))
	return b
}

func (b *testBroker) seenIDs(brokerCase string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.seen[brokerCase]...)
}

// checkNothingLeft: no SPIRE file under root, no spire-agent running with
// a config under it, the token in neither log nor error.
func checkNothingLeft(t *testing.T, root, token, log string, err error) {
	t.Helper()
	dir := filepath.Join(root, SPIREDir)
	if entries, rerr := os.ReadDir(dir); rerr != nil || len(entries) != 0 {
		t.Errorf("the SPIRE directory %s is not empty after Credential: %v (%v)", dir, entries, rerr)
	}
	if pids := spireAgentsUnder(t, root); len(pids) != 0 {
		t.Errorf("spire-agent still running after Credential: pids %v", pids)
	}
	if strings.Contains(log, token) {
		t.Errorf("the join token is in the agent's log:\n%s", log)
	}
	if err != nil && strings.Contains(err.Error(), token) {
		t.Errorf("the join token is in the error: %v", err)
	}
}

// spireAgentsUnder are the pids of processes whose command line names a
// path under root: the spire-agents a BrokerSource with that Root started.
func spireAgentsUnder(t *testing.T, root string) []string {
	t.Helper()
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	var pids []string
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if strings.Contains(string(b), "spire-agent") && strings.Contains(string(b), root) {
			pids = append(pids, filepath.Base(filepath.Dir(p)))
		}
	}
	return pids
}

// TestBrokerSourceSPIRE runs broker mode against a real spire-server and
// spire-agent and a credential broker over mTLS.
func TestBrokerSourceSPIRE(t *testing.T) {
	w := newSPIREWorld(t)
	usedToken, usedID := w.vmIdentity(t, "ok")

	t.Run("ok", func(t *testing.T) {
		t.Parallel()
		log := &syncBuffer{}
		src, root := w.source(t, usedToken, usedID, "ok", log)
		cred, err := src.Credential(context.Background())
		if err != nil {
			t.Fatalf("Credential: %v (exit code %d)\n%s", err, exitCode(err), log)
		}
		if cred.Method != githubvm.MethodJIT || cred.JITConfig != brokerJIT(usedID) {
			t.Errorf("credential %+v, want the broker's JIT configuration for %s", cred, usedID)
		}
		if got := w.broker.seenIDs("ok"); len(got) != 1 || got[0] != usedID {
			t.Errorf("the broker saw SPIFFE IDs %v, want exactly [%s]", got, usedID)
		}
		checkNothingLeft(t, root, usedToken, log.String(), nil)
		if strings.Contains(log.String(), cred.JITConfig) {
			t.Errorf("the credential is in the log:\n%s", log)
		}
		for _, want := range []string{"spire-agent attested; its config with the join token removed", "X509-SVID obtained", "spire-agent stopped", "SPIRE directory removed"} {
			if !strings.Contains(log.String(), want) {
				t.Errorf("log lacks %q:\n%s", want, log)
			}
		}
	})

	t.Run("reused", func(t *testing.T) {
		t.Parallel()
		// The "ok" case spends the token first.
		waitSeen(t, w.broker, "ok")
		log := &syncBuffer{}
		src, root := w.source(t, usedToken, usedID, "reused", log)
		start := time.Now()
		_, err := src.Credential(context.Background())
		if code := exitCode(err); code != ExitAttestation {
			t.Fatalf("exit code %d (%v), want ExitAttestation\n%s", code, err, log)
		}
		if elapsed := time.Since(start); elapsed > time.Minute {
			t.Errorf("the refused token took %s to fail", elapsed)
		}
		if !strings.Contains(err.Error(), "refused the join token") || !errors.Is(err, errJoinTokenRefused) {
			t.Errorf("error does not say the token was refused: %v", err)
		}
		checkNothingLeft(t, root, usedToken, log.String(), err)
	})

	t.Run("refuse", func(t *testing.T) {
		t.Parallel()
		token, id := w.vmIdentity(t, "refuse")
		log := &syncBuffer{}
		src, root := w.source(t, token, id, "refuse", log)
		_, err := src.Credential(context.Background())
		if code := exitCode(err); code != ExitBrokerRefused {
			t.Fatalf("exit code %d (%v), want ExitBrokerRefused\n%s", code, err, log)
		}
		for _, want := range []string{"403", "ClaimReleased", "was released"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error lacks %q: %v", want, err)
			}
		}
		checkNothingLeft(t, root, token, log.String(), err)
	})

	t.Run("busy", func(t *testing.T) {
		t.Parallel()
		token, id := w.vmIdentity(t, "busy")
		log := &syncBuffer{}
		src, root := w.source(t, token, id, "busy", log)
		cred, err := src.Credential(context.Background())
		if err != nil {
			t.Fatalf("Credential: %v\n%s", err, log)
		}
		if cred.JITConfig != brokerJIT(id) {
			t.Errorf("credential for the wrong id")
		}
		if got := w.broker.seenIDs("busy"); len(got) != 2 {
			t.Errorf("the broker was called %d times, want 2 (503, then 200)", len(got))
		}
		checkNothingLeft(t, root, token, log.String(), nil)
	})

	t.Run("wrongid", func(t *testing.T) {
		t.Parallel()
		token, _ := w.vmIdentity(t, "wrongid")
		log := &syncBuffer{}
		want := "spiffe://" + spireTrustDomain + "/vm/ns/other/uid"
		src, root := w.source(t, token, want, "wrongid", log)
		_, err := src.Credential(context.Background())
		if code := exitCode(err); code != ExitAttestation {
			t.Fatalf("exit code %d (%v), want ExitAttestation\n%s", code, err, log)
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name the expected ID: %v", err)
		}
		checkNothingLeft(t, root, token, log.String(), err)
	})

	t.Run("method", func(t *testing.T) {
		t.Parallel()
		// A jit-config credential for a runner-token config is refused:
		// the runner would be registered without its name and labels.
		token, id := w.vmIdentity(t, "method")
		log := &syncBuffer{}
		src, root := w.source(t, token, id, "method", log)
		src.Method = githubvm.MethodRegistrationToken
		_, err := src.Credential(context.Background())
		if code := exitCode(err); code != ExitBrokerRefused || !strings.Contains(err.Error(), "bootstrapMethod is runner-token") {
			t.Fatalf("exit code %d (%v), want ExitBrokerRefused naming the bootstrapMethod\n%s", code, err, log)
		}
		if strings.Contains(err.Error(), brokerJIT(id)) || strings.Contains(log.String(), brokerJIT(id)) {
			t.Errorf("the refused credential was shown")
		}
		checkNothingLeft(t, root, token, log.String(), err)
	})

	t.Run("socket", func(t *testing.T) {
		t.Parallel()
		// A spire-agent the image runs itself: the agent uses its
		// Workload API, starts none and uses no join token (what the
		// operator placed is used for its broker proof only).
		token, id := w.vmIdentity(t, "socket")
		pre := spiretest.StartAgent(t, w.server, token)
		log := &syncBuffer{}
		src, root := w.source(t, "a-token-nobody-uses", id, "socket", log)
		src.SPIRESocket = pre.SocketPath
		cred, err := src.Credential(context.Background())
		if err != nil {
			t.Fatalf("Credential: %v\n%s", err, log)
		}
		if cred.JITConfig != brokerJIT(id) {
			t.Errorf("credential for the wrong id")
		}
		if strings.Contains(log.String(), "spire-agent started") {
			t.Errorf("a spire-agent was started beside the pre-installed one:\n%s", log)
		}
		if pre.ExitErr() != nil {
			t.Errorf("the pre-installed spire-agent was stopped: %v", pre.ExitErr())
		}
		checkNothingLeft(t, root, token, log.String(), nil)
	})

	t.Run("deadline", func(t *testing.T) {
		t.Parallel()
		// No SPIRE server at the address: the attestation deadline ends
		// it, --attest-timeout in one case, expiresAt in the other.
		for _, byExpiry := range []bool{false, true} {
			token, id := w.vmIdentity(t, fmt.Sprintf("deadline-%v", byExpiry))
			log := &syncBuffer{}
			src, root := w.source(t, token, id, "deadline", log)
			src.SPIFFE.ServerAddress = "127.0.0.1:1"
			if byExpiry {
				src.ExpiresAt = time.Now().Add(3 * time.Second)
			} else {
				src.AttestTimeout = 3 * time.Second
			}
			start := time.Now()
			_, err := src.Credential(context.Background())
			if code := exitCode(err); code != ExitAttestation {
				t.Fatalf("expiresAt %v: exit code %d (%v), want ExitAttestation\n%s", byExpiry, code, err, log)
			}
			if elapsed := time.Since(start); elapsed < 2*time.Second || elapsed > 30*time.Second {
				t.Errorf("expiresAt %v: failed after %s, want about 3s", byExpiry, elapsed)
			}
			if !strings.Contains(err.Error(), "before the attestation deadline") {
				t.Errorf("expiresAt %v: error does not name the deadline: %v", byExpiry, err)
			}
			checkNothingLeft(t, root, token, log.String(), err)
		}
	})

	t.Run("run", func(t *testing.T) {
		t.Parallel()
		// The whole agent: broker mode, then the runner with the broker's
		// JIT configuration.
		token, id := w.vmIdentity(t, "run")
		v := newVM(t)
		v.secret = brokerJIT(id)
		writeScript(t, filepath.Join(v.install(), "run.sh"), v.goodRunner(0))
		c := v.baseConfig()
		c.WorkloadMethod = agentconfig.WorkloadBroker
		placeSecrets(t, v.root, token, "run")
		c.SPIFFE = &agentconfig.SPIFFE{
			AttestationMethod: agentconfig.AttestationJoinToken, SPIFFEID: id,
			TrustDomain: spireTrustDomain, TrustBundle: string(w.server.Bundle), ServerAddress: w.server.Address,
			BrokerURL: w.broker.srv.URL + "/credential/run", BrokerCA: w.broker.caPEM,
		}
		v.writeConfig(c)
		v.opts.SPIREAgent = w.bin
		v.opts.AttestTimeout = 2 * time.Minute
		v.checkCommon(v.run(context.Background()), ExitOK, 1)
		if got := v.read("run.jit"); got != v.secret {
			t.Errorf("ACTIONS_RUNNER_INPUT_JITCONFIG = %q, want the broker's", got)
		}
		checkNothingLeft(t, v.root, token, v.log.String(), nil)
	})
}

// waitSeen waits until the broker had a call for brokerCase.
func waitSeen(t *testing.T, b *testBroker, brokerCase string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for len(b.seenIDs(brokerCase)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal(errors.New("the broker saw no call for " + brokerCase))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
