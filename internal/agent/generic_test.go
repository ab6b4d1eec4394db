//go:build !windows

package agent

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// genericConfig is a generic config without SPIFFE: the script, run as
// the test's own user, the claim and a deadline in ttl.
func (v *vm) genericConfig(script string, ttl time.Duration) *agentconfig.Config {
	me, err := user.Current()
	if err != nil {
		v.t.Fatal(err)
	}
	return &agentconfig.Config{
		Version:        agentconfig.CurrentVersion,
		Platform:       agentconfig.PlatformGeneric,
		WorkloadMethod: agentconfig.WorkloadDirect,
		Generic: &agentconfig.Generic{
			Script:   script,
			User:     me.Username,
			Claim:    agentconfig.ClaimRef{Namespace: "ci", Name: "batch-1", UID: "uid-1"},
			Deadline: time.Now().Add(ttl).Truncate(time.Second),
		},
		Runner:           agentconfig.Runner{Software: agentconfig.Software{WorkDir: workPath}},
		PowerOffOnFinish: true,
	}
}

// genericRecorder is a script that records what it saw: its environment,
// uid, working directory, then leaves files in the work directory and
// exits with code.
func (v *vm) genericRecorder(code int) string {
	r := filepath.Join(v.rec, "script")
	return `printf '%s' "$HYPERFLEET_CLAIM" >` + r + `.claim
printf '%s' "$HYPERFLEET_CLAIM_UID" >` + r + `.uid-env
printf '%s' "$HYPERFLEET_DEADLINE" >` + r + `.deadline
printf '%s' "${SPIFFE_ENDPOINT_SOCKET-<unset>}" >` + r + `.socket
id -u >` + r + `.uid
pwd >` + r + `.pwd
mkdir -p sub && echo data >sub/file && echo top >top
echo "script says hello"
exit ` + strconv.Itoa(code)
}

func TestGenericScriptRuns(t *testing.T) {
	t.Parallel()
	v := newVM(t)
	v.secret = ""
	c := v.genericConfig(v.genericRecorder(0), time.Hour)
	v.writeConfig(c)
	v.checkCommon(v.run(context.Background()), ExitOK, 1)
	for file, want := range map[string]string{
		"script.claim":    "ci/batch-1",
		"script.uid-env":  "uid-1",
		"script.deadline": c.Generic.Deadline.UTC().Format(time.RFC3339),
		"script.socket":   "<unset>",
		"script.pwd":      v.work(),
		"script.uid":      strconv.Itoa(os.Getuid()),
	} {
		if got := v.read(file); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}
	if !strings.Contains(v.log.String(), "script says hello") {
		t.Error("the script's output is not in the agent's log")
	}
	if entries, err := os.ReadDir(v.work()); err != nil || len(entries) != 0 {
		t.Errorf("work directory not emptied: %v %v", entries, err)
	}
}

func TestGenericScriptFailureStillPowersOff(t *testing.T) {
	t.Parallel()
	v := newVM(t)
	v.secret = ""
	v.writeConfig(v.genericConfig(v.genericRecorder(3), time.Hour))
	v.checkCommon(v.run(context.Background()), ExitRunnerFailed, 1)
	if !strings.Contains(v.log.String(), "exit status 3") {
		t.Error("the script's exit status is not logged")
	}
	if entries, err := os.ReadDir(v.work()); err != nil || len(entries) != 0 {
		t.Errorf("work directory not emptied: %v %v", entries, err)
	}
}

// A script that hangs is stopped at the deadline and the VM powers off.
func TestGenericDeadlineStopsAHangingScript(t *testing.T) {
	t.Parallel()
	v := newVM(t)
	v.secret = ""
	v.opts.StopGracePeriod = time.Second
	started := filepath.Join(v.rec, "started")
	c := v.genericConfig(`echo x >sleeping; touch `+started+`; exec sleep 600`, 0)
	// Far enough for the agent to start the script on a loaded machine
	// (a deadline that passed first ends the run with ExitExpired, which
	// the checks below report), near enough to keep the test short.
	c.Generic.Deadline = time.Now().Add(8 * time.Second)
	v.writeConfig(c)
	code := v.run(context.Background())
	v.checkCommon(code, ExitDeadline, 1)
	if _, err := os.Stat(started); err != nil {
		t.Errorf("the script never started: %v", err)
	}
	if entries, err := os.ReadDir(v.work()); err != nil || len(entries) != 0 {
		t.Errorf("work directory not emptied: %v %v", entries, err)
	}
}

func TestGenericPastDeadlineRunsNothing(t *testing.T) {
	t.Parallel()
	v := newVM(t)
	v.secret = ""
	c := v.genericConfig(v.genericRecorder(0), time.Hour)
	c.Generic.Deadline = time.Now().Add(-time.Minute)
	v.writeConfig(c)
	v.checkCommon(v.run(context.Background()), ExitExpired, 1)
	if _, err := os.Stat(filepath.Join(v.rec, "script.claim")); err == nil {
		t.Error("the script ran after its deadline")
	}
}

func TestGenericScriptAsOtherUser(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Skip("needs root to switch users")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody")
	}
	v := newVM(t)
	v.secret = ""
	v.openToOthers()
	// The config's user wins over --run-as, which names no user here.
	v.opts.RunAs = "hyperfleet-no-such-user"
	c := v.genericConfig(v.genericRecorder(0), time.Hour)
	c.Generic.User = "nobody"
	v.writeConfig(c)
	v.checkCommon(v.run(context.Background()), ExitOK, 1)
	if got := v.read("script.uid"); got != nobody.Uid {
		t.Errorf("script uid = %s, want nobody's %s", got, nobody.Uid)
	}
	if got := v.read("script.pwd"); got != v.work() {
		t.Errorf("script ran in %s, want %s", got, v.work())
	}
}

// A generic config naming a user the VM does not have fails before the
// script runs, naming generic.user.
func TestGenericScriptUserMissing(t *testing.T) {
	t.Parallel()
	v := newVM(t)
	v.secret = ""
	c := v.genericConfig(v.genericRecorder(0), time.Hour)
	c.Generic.User = "hyperfleet-no-such-user"
	v.writeConfig(c)
	v.checkCommon(v.run(context.Background()), ExitInternal, 1)
	if !strings.Contains(v.log.String(), `generic.user \"hyperfleet-no-such-user\": no such user`) {
		t.Errorf("the log does not say which user is missing:\n%s", v.log.String())
	}
	if _, err := os.Stat(filepath.Join(v.rec, "script.claim")); err == nil {
		t.Error("the script ran")
	}
}

// openToOthers lets another user than the test's reach the VM's root
// (its work directory) and write the records, as a script of another
// user does.
func (v *vm) openToOthers() {
	v.t.Helper()
	for _, d := range []string{v.root, filepath.Dir(v.root), v.dir, filepath.Dir(v.dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			v.t.Fatal(err)
		}
	}
	if err := os.Chmod(v.rec, 0o777); err != nil {
		v.t.Fatal(err)
	}
}

// fakeIdentity is an IdentityHolder: a socket path, and whether it was
// released after the script ran.
type fakeIdentity struct {
	socket   string
	released chan struct{}
	as       *syscall.Credential
}

func (f *fakeIdentity) Credential(context.Context) (Credential, error) {
	panic("a generic VM asked for a runner credential")
}

func (f *fakeIdentity) HoldIdentity(_ context.Context, as *syscall.Credential) (*HeldIdentity, error) {
	f.as = as
	return &HeldIdentity{Socket: f.socket, SPIFFEID: "spiffe://hyperfleet.io/vm/ci/batch-1/uid-1", Release: func() { close(f.released) }}, nil
}

// With SPIFFE the script sees the held identity's socket, and the
// identity is released only after the script ended.
func TestGenericScriptGetsTheWorkloadAPI(t *testing.T) {
	t.Parallel()
	v := newVM(t)
	v.secret = ""
	id := &fakeIdentity{socket: "/run/hyperfleet/spire/attest-1/api.sock", released: make(chan struct{})}
	v.opts.NewCredentialSource = func(*agentconfig.Config) (CredentialSource, error) { return id, nil }
	released := filepath.Join(v.rec, "released-before-script-ended")
	c := v.genericConfig(v.genericRecorder(0), time.Hour)
	c.WorkloadMethod = agentconfig.WorkloadBroker
	c.SecretsFile, c.SecretsDeadline = agentconfig.SecretsFile, time.Now().Add(time.Minute)
	c.SPIFFE = &agentconfig.SPIFFE{AttestationMethod: agentconfig.AttestationJoinToken, TrustDomain: "hyperfleet.io",
		TrustBundle: testTrustBundle(t), ServerAddress: "spire.example:8081"}
	v.writeConfig(c)
	go func() {
		<-id.released
		if _, err := os.Stat(filepath.Join(v.rec, "script.socket")); err != nil {
			_ = os.WriteFile(released, nil, 0o644)
		}
	}()
	v.checkCommon(v.run(context.Background()), ExitOK, 1)
	if got := v.read("script.socket"); got != "unix://"+id.socket {
		t.Errorf("SPIFFE_ENDPOINT_SOCKET = %q, want unix://%s", got, id.socket)
	}
	select {
	case <-id.released:
	default:
		t.Error("the identity was not released after the script")
	}
	if _, err := os.Stat(released); err == nil {
		t.Error("the identity was released before the script ran")
	}
}

// The power-off notice carries the script's exit status.
func TestGenericPowerOffNoticeCarriesTheExitStatus(t *testing.T) {
	t.Parallel()
	var (
		mu     sync.Mutex
		bodies []map[string]any
	)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		bodies = append(bodies, body)
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	}))
	defer srv.Close()
	v := newVM(t)
	v.secret = ""
	c := v.genericConfig(v.genericRecorder(4), time.Hour)
	c.PowerOffNotify = &agentconfig.PowerOffNotify{URL: srv.URL + "/hints/v1/power-off", Token: strings.Repeat("cd", 32),
		Claim: c.Generic.Claim, CA: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))}
	v.writeConfig(c)
	v.checkCommon(v.run(context.Background()), ExitRunnerFailed, 1)
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 1 || bodies[0]["scriptExitStatus"] != float64(4) {
		t.Errorf("notices %v: want one with scriptExitStatus 4", bodies)
	}
}

// TestAnUnknownPlatformIsUnsupported: a platform the agent does not run
// is ExitUnsupported (an agent older than its operator), not an invalid
// file; cmd/hyperfleet-agent checks that every platform has its kind.
func TestAnUnknownPlatformIsUnsupported(t *testing.T) {
	t.Parallel()
	var unsupported *UnsupportedError
	if _, err := runnerKindFor("jenkins"); !errors.As(err, &unsupported) {
		t.Errorf("an unknown platform: %v, want an UnsupportedError", err)
	}
}
