//go:build !windows

package agent

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github/githubvm"
)

// TestWaitGuestSecrets: the agent waits for the document the operator
// places through the guest channel, takes it only once it is complete,
// removes it, keeps its directory root's alone, and gives up at the
// attestation deadline naming the guest agent.
func TestWaitGuestSecrets(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.DiscardHandler)
	doc := `{"joinToken":"9b2f4c1e-7d3a-4f5b-8c6d-1e2f3a4b5c6d","brokerProof":"proof-1"}`

	t.Run("arrives late, written in pieces", func(t *testing.T) {
		t.Parallel()
		root := t.TempDir()
		path := filepath.Join(root, agentconfig.SecretsFile)
		// The directory exists from boot on, as cloud-init's bootcmd makes
		// it, with a mode the agent tightens.
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		go func() {
			time.Sleep(500 * time.Millisecond)
			// What a reader can see between the guest agent's open and its
			// write: first a part, then the whole.
			_ = os.WriteFile(path, []byte(doc[:20]), 0o666)
			time.Sleep(600 * time.Millisecond)
			_ = os.WriteFile(path, []byte(doc), 0o666)
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		g, err := waitGuestSecrets(context.Background(), ctx, log, sharedHost{log: log}, path, ExitAttestation)
		if err != nil || g.JoinToken != "9b2f4c1e-7d3a-4f5b-8c6d-1e2f3a4b5c6d" || g.BrokerProof != "proof-1" {
			t.Fatalf("waitGuestSecrets = %+v, %v", g, err)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the join token file is still there: %v", err)
		}
		if fi, err := os.Stat(filepath.Dir(path)); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v, %v; want mode 0700", filepath.Dir(path), fi.Mode().Perm(), err)
		}
	})

	t.Run("never placed", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), agentconfig.SecretsFile)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := waitGuestSecrets(context.Background(), ctx, log, sharedHost{log: log}, path, ExitAttestation)
		if exitCode(err) != ExitAttestation || !strings.Contains(err.Error(), "before the deadline") || !strings.Contains(err.Error(), "qemu-guest-agent") {
			t.Fatalf("no token: %v (exit code %d), want ExitAttestation naming the deadline and the guest agent", err, exitCode(err))
		}
		// The directory is made (0700) before anything can be written.
		if fi, err := os.Stat(filepath.Dir(path)); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v, %v; want made with mode 0700", filepath.Dir(path), fi, err)
		}
	})

	t.Run("agent stopped", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), agentconfig.SecretsFile)
		parent, stop := context.WithCancel(context.Background())
		stop()
		_, err := waitGuestSecrets(parent, context.Background(), log, sharedHost{log: log}, path, ExitAttestation)
		if err == nil || exitCode(err) == ExitAttestation {
			t.Fatalf("a stopped agent: %v (exit code %d), want no attestation failure", err, exitCode(err))
		}
	})
}

// TestRefusedTokenNoticed: a join token the SPIRE server refuses as used
// ends the agent with ExitAttestation, and its power-off notice says
// attestationError JoinTokenRefused, which the operator checks against the
// SPIRE server (a used token the VM never used is a stolen one).
func TestRefusedTokenNoticed(t *testing.T) {
	t.Parallel()
	v := newVM(t)
	var (
		mu      sync.Mutex
		notices []agentconfig.PowerOffNoticeBody
		paths   []string
	)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var n agentconfig.PowerOffNoticeBody
		_ = json.NewDecoder(r.Body).Decode(&n)
		mu.Lock()
		notices = append(notices, n)
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	}))
	defer srv.Close()
	// A spire-agent whose server refuses its token: it says so and keeps
	// retrying, as the real one does.
	fake := filepath.Join(v.dir, "spire-agent")
	writeScript(t, fake, `echo 'level=error msg="Agent crashed" error="failed to attest: join token does not exist or has already been used"' >&2; exec sleep 60`)
	c := v.brokerConfig(agentconfig.AttestationJoinToken)
	claim := agentconfig.ClaimRef{Namespace: "ci", Name: "runner-1", UID: "uid-1"}
	c.PowerOffNotify = &agentconfig.PowerOffNotify{URL: srv.URL + "/hints/v1/power-off", Token: strings.Repeat("ab", 32), Claim: claim,
		CA: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))}
	v.writeConfig(c)
	v.placeGuestSecrets()
	v.opts.SPIREAgent = fake
	v.checkCommon(v.run(context.Background()), ExitAttestation, 1)
	mu.Lock()
	defer mu.Unlock()
	if len(notices) != 1 || notices[0].AttestationError != agentconfig.AttestationJoinTokenRefused || paths[0] != "/hints/v1/power-off/ci/runner-1/uid-1" {
		t.Fatalf("notices %+v at %v, want one for %+v with attestationError %s", notices, paths, claim, agentconfig.AttestationJoinTokenRefused)
	}
	if strings.Contains(v.log.String(), v.secret) {
		t.Error("the log shows the join token")
	}
}

// TestCredentialArrivesInTheRunningVM: in direct mode the config holds no
// credential; the agent makes the secrets' directory root's alone, tells
// the operator it waits (a ready hint with the claim in the path, the
// notice token, no body), and runs the runner with the credential the
// operator then places, whose file it removes.
func TestCredentialArrivesInTheRunningVM(t *testing.T) {
	t.Parallel()
	v := newVM(t)
	writeScript(t, filepath.Join(v.install(), "run.sh"), v.goodRunner(0))
	v.holdCredential = true
	dir := filepath.Join(v.root, agentconfig.SecretsDir)
	var (
		mu    sync.Mutex
		hints []string
	)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fi, err := os.Stat(dir)
		mu.Lock()
		hints = append(hints, fmt.Sprintf("%s %s %q %d %v", r.Method, r.URL.Path, r.Header.Get("Authorization"), len(body), err == nil && fi.Mode().Perm() == 0o700))
		mu.Unlock()
		if strings.HasPrefix(r.URL.Path, "/hints/v1/ready/") {
			// The operator places the credential once it hears.
			v.placeCredential(githubvm.MethodJIT)
		}
		w.WriteHeader(http.StatusAccepted)
	}))
	defer srv.Close()
	c := v.baseConfig()
	token := strings.Repeat("cd", 32)
	c.PowerOffNotify = &agentconfig.PowerOffNotify{URL: srv.URL + "/hints/v1/power-off", ReadyURL: srv.URL + "/hints/v1/ready", Token: token,
		Claim: agentconfig.ClaimRef{Namespace: "ci", Name: "runner-1", UID: "uid-1"},
		CA:    string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))}
	v.writeConfig(c)
	v.checkCommon(v.run(context.Background()), ExitOK, 1)
	if got := v.read("run.jit"); got != v.secret {
		t.Errorf("ACTIONS_RUNNER_INPUT_JITCONFIG = %q, want the credential placed in the VM", got)
	}
	if _, err := os.Stat(filepath.Join(v.root, agentconfig.SecretsFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the secrets file is still there: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := fmt.Sprintf("POST /hints/v1/ready/ci/runner-1/uid-1 %q 0 true", "Bearer "+token)
	if len(hints) != 2 || hints[0] != want || !strings.HasPrefix(hints[1], "POST /hints/v1/power-off/ci/runner-1/uid-1 ") {
		t.Errorf("requests to the operator: %q; want the ready hint (%s), then the power-off notice", hints, want)
	}
}

// TestNoCredentialBeforeTheDeadline: a credential that never arrives (no
// guest agent, the operator down), or one of another kind than the
// config's bootstrapMethod, ends the agent at secretsDeadline with
// ExitNoSecrets, naming the file and the guest agent, and powers the VM
// off without running anything.
func TestNoCredentialBeforeTheDeadline(t *testing.T) {
	t.Parallel()
	for name, place := range map[string]*agentconfig.GuestSecrets{
		"nothing placed":    nil,
		"another kind":      {RegistrationToken: "AABBCCDD", RegistrationURL: "https://github.example/o"},
		"a join token only": {JoinToken: "tok", BrokerProof: "proof"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			v := newVM(t)
			writeScript(t, filepath.Join(v.install(), "run.sh"), v.goodRunner(0))
			v.holdCredential = true
			c := v.baseConfig()
			c.SecretsDeadline = time.Now().Add(time.Second)
			v.writeConfig(c)
			if place != nil {
				v.placeSecrets(*place)
			}
			v.checkCommon(v.run(context.Background()), ExitNoSecrets, 1)
			if v.ran("run") {
				t.Error("the runner ran without its credential")
			}
			if log := v.log.String(); !strings.Contains(log, agentconfig.SecretsFile) || place == nil && !strings.Contains(log, "qemu-guest-agent") {
				t.Errorf("the log does not name the secrets file and the guest agent:\n%s", log)
			}
		})
	}
}
