//go:build !windows

package agent

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// TestPowerOffNotice: with powerOffNotify the agent announces the power-off
// (bearer token, the claim's identity in the path, what its runner printed
// in the body) before it runs the power-off
// command, retries a 503 (a replica that is not the leader), and powers
// off all the same when the operator refuses or cannot be reached.
func TestPowerOffNotice(t *testing.T) {
	t.Parallel()
	type notice struct {
		auth, path   string
		body         map[string]any
		poweredFirst bool
	}
	var (
		mu      sync.Mutex
		notices []notice
		answers = []int{http.StatusServiceUnavailable, http.StatusAccepted}
	)
	v := newVM(t)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		defer mu.Unlock()
		_, err := os.Stat(filepath.Join(v.dir, "powered-off"))
		notices = append(notices, notice{auth: r.Header.Get("Authorization"), path: r.URL.Path, body: body, poweredFirst: err == nil})
		code := answers[0]
		if len(answers) > 1 {
			answers = answers[1:]
		}
		w.WriteHeader(code)
	}))
	defer srv.Close()
	ca := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	claim := agentconfig.ClaimRef{Namespace: "ci", Name: "runner-1", UID: "uid-1"}
	token := strings.Repeat("ab", 32)

	writeScript(t, filepath.Join(v.install(), "run.sh"), v.goodRunner(0))
	c := v.baseConfig()
	c.PowerOffNotify = &agentconfig.PowerOffNotify{URL: srv.URL + "/hints/v1/power-off", Token: token, Claim: claim, CA: ca}
	v.writeConfig(c)
	v.checkCommon(v.run(context.Background()), ExitOK, 1)
	mu.Lock()
	got := append([]notice(nil), notices...)
	mu.Unlock()
	if len(got) != 2 {
		t.Fatalf("%d notices, want 2 (a 503, then accepted): %+v", len(got), got)
	}
	for _, n := range got {
		if n.auth != "Bearer "+token || n.path != "/hints/v1/power-off/ci/runner-1/uid-1" || n.poweredFirst {
			t.Errorf("notice %+v: want the bearer token at the claim's path, before the power-off", n)
		}
		// What the runner printed: "Listening for Jobs", "Running job:";
		// nothing else (the claim is in the path).
		if n.body["runnerOnline"] != true || n.body["jobStarted"] != true || len(n.body) != 2 {
			t.Errorf("notice body %v: want runnerOnline and jobStarted only", n.body)
		}
	}
	if strings.Contains(v.log.String(), token) {
		t.Error("the log shows the notice token")
	}

	// Refused (a token that does not verify): logged, powered off anyway.
	v2 := newVM(t)
	refuse := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusUnauthorized) }))
	defer refuse.Close()
	writeScript(t, filepath.Join(v2.install(), "run.sh"), v2.goodRunner(0))
	c2 := v2.baseConfig()
	c2.PowerOffNotify = &agentconfig.PowerOffNotify{URL: refuse.URL + "/hints/v1/power-off", Token: token, Claim: claim,
		CA: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: refuse.Certificate().Raw}))}
	v2.writeConfig(c2)
	v2.checkCommon(v2.run(context.Background()), ExitOK, 1)
	if !strings.Contains(v2.log.String(), "the operator refused the power-off notice") {
		t.Error("log lacks the refusal")
	}
}
