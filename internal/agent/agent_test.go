//go:build !windows

package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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
	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github/githubvm"
)

// syncBuffer is the test log.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// vm is one agent run's world: a --root standing for the VM's file
// system, a config file, a power-off command that leaves a mark, and a
// directory the fake runner scripts record what they saw in.
type vm struct {
	t        *testing.T
	root     string // --root
	dir      string // outside the "VM": config, records, power-off marks
	cfgPath  string
	rec      string // records of the fake scripts
	poweroff string // the power-off script
	log      *syncBuffer
	secret   string
	opts     Options
	// holdCredential keeps writeConfig from placing the runner credential.
	holdCredential bool
}

const (
	installPath = "/opt/actions-runner"
	workPath    = "/home/runner/_work"
)

func newVM(t *testing.T) *vm {
	t.Helper()
	v := &vm{t: t, root: t.TempDir(), dir: t.TempDir(), log: &syncBuffer{}}
	v.cfgPath = filepath.Join(v.dir, "agent.json")
	v.rec = filepath.Join(v.dir, "rec")
	if err := os.Mkdir(v.rec, 0o777); err != nil {
		t.Fatal(err)
	}
	v.poweroff = filepath.Join(v.dir, "poweroff.sh")
	writeScript(t, v.poweroff, `echo off >>"`+filepath.Join(v.dir, "powered-off")+`"`)
	v.secret = "SECRET-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	v.opts = Options{
		ConfigPath:      v.cfgPath,
		Root:            v.root,
		RunAs:           "",
		PowerOffCommand: []string{v.poweroff},
		StopGracePeriod: 5 * time.Second,
		TempDir:         t.TempDir(),
		Version:         "test",
		Logger:          slog.New(slog.NewTextHandler(v.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", v.log.String())
		}
	})
	return v
}

func writeScript(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// baseConfig is a direct jit-config config with powerOffOnFinish.
func (v *vm) baseConfig() *agentconfig.Config {
	return &agentconfig.Config{
		Version:         agentconfig.CurrentVersion,
		Platform:        githubvm.Platform,
		WorkloadMethod:  agentconfig.WorkloadDirect,
		BootstrapMethod: githubvm.MethodJIT,
		SecretsFile:     agentconfig.SecretsFile,
		SecretsDeadline: time.Now().Add(time.Minute),
		Runner: agentconfig.Runner{Software: agentconfig.Software{
			InstallPath: installPath, WorkDir: workPath,
			ConfigScript: "config.sh", RunScript: "run.sh", OS: "linux", Arch: "x64",
		}},
		PowerOffOnFinish: true,
	}
}

// writeConfig writes c as the VM's agent.json and, in direct mode unless
// v.holdCredential, places the runner credential v.secret where the
// operator would once the VM runs.
func (v *vm) writeConfig(c *agentconfig.Config) {
	v.t.Helper()
	if err := c.Validate(); err != nil {
		v.t.Fatalf("test config is invalid: %v", err)
	}
	data, err := c.Marshal()
	if err != nil {
		v.t.Fatal(err)
	}
	if err := os.WriteFile(v.cfgPath, data, 0o600); err != nil {
		v.t.Fatal(err)
	}
	if c.WorkloadMethod == agentconfig.WorkloadDirect && !v.holdCredential {
		v.placeCredential(c.BootstrapMethod)
	}
}

// placeCredential puts the runner credential v.secret of method where the
// agent under v.root waits for it, as the operator places it through the
// guest channel.
func (v *vm) placeCredential(method agentconfig.BootstrapMethod) {
	v.t.Helper()
	g := agentconfig.GuestSecrets{JITConfig: v.secret}
	if spec, _ := agentconfig.LookupMethod(method); !spec.JITConfig {
		g = agentconfig.GuestSecrets{RegistrationToken: v.secret}
	}
	v.placeSecrets(g)
}

// placeSecrets writes g at the secrets file under v.root.
func (v *vm) placeSecrets(g agentconfig.GuestSecrets) {
	v.t.Helper()
	path := filepath.Join(v.root, agentconfig.SecretsFile)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		v.t.Fatal(err)
	}
	doc, err := json.Marshal(g)
	if err != nil {
		v.t.Fatal(err)
	}
	if err := os.WriteFile(path, doc, 0o666); err != nil {
		v.t.Fatal(err)
	}
}

func (v *vm) install() string { return filepath.Join(v.root, installPath) }
func (v *vm) work() string    { return filepath.Join(v.root, workPath) }

// recorder is shell code that records, into the vm's record directory
// under prefix, the arguments, the credential variables, the root
// override, the working directory and whether the config file is still
// there.
func (v *vm) recorder(prefix string) string {
	r := filepath.Join(v.rec, prefix)
	return fmt.Sprintf(`printf '%%s\n' "$#" "$@" >%[1]s.args
printf '%%s' "${ACTIONS_RUNNER_INPUT_JITCONFIG-<unset>}" >%[1]s.jit
printf '%%s' "${ACTIONS_RUNNER_INPUT_TOKEN-<unset>}" >%[1]s.token
printf '%%s' "${RUNNER_ALLOW_RUNASROOT-<unset>}" >%[1]s.asroot
pwd >%[1]s.pwd
id -u >%[1]s.uid
if [ -e %[2]q ]; then echo present >%[1]s.config; else echo absent >%[1]s.config; fi
tr '\\0' ' ' </proc/$$/cmdline >%[1]s.ps`, r, v.cfgPath)
}

// goodRunner is a run.sh that behaves like an ephemeral runner taking one
// job: it writes its registration and work files, prints the real
// runner's lines and exits with code.
func (v *vm) goodRunner(code int) string {
	return v.recorder("run") + fmt.Sprintf(`
echo '{"agentId": 1}' >.runner
echo '{"scheme": "OAuth"}' >.credentials
echo '{}' >.credentials_rsaparams
echo keep >.env
mkdir -p %[1]q/src && echo data >%[1]q/src/file && echo top >%[1]q/top
echo "√ Connected to GitHub"
echo "2026-01-01 00:00:00Z: Listening for Jobs"
echo "2026-01-01 00:00:01Z: Running job: build"
echo "warning on stderr" >&2
echo "2026-01-01 00:00:02Z: Job build completed with result: Succeeded"
exit %[2]d`, v.work(), code)
}

func (v *vm) run(ctx context.Context) int {
	v.t.Helper()
	return Run(ctx, v.opts)
}

func (v *vm) read(name string) string {
	v.t.Helper()
	b, err := os.ReadFile(filepath.Join(v.rec, name))
	if err != nil {
		return "<missing: " + err.Error() + ">"
	}
	return strings.TrimSpace(string(b))
}

func (v *vm) ran(prefix string) bool {
	_, err := os.Stat(filepath.Join(v.rec, prefix+".args"))
	return err == nil
}

// poweredOff is how often the power-off command ran.
func (v *vm) poweredOff() int {
	b, _ := os.ReadFile(filepath.Join(v.dir, "powered-off"))
	return strings.Count(string(b), "off")
}

func (v *vm) checkCommon(code, want int, powerOffs int) {
	v.t.Helper()
	if code != want {
		v.t.Errorf("exit code %d, want %d", code, want)
	}
	if n := v.poweredOff(); n != powerOffs {
		v.t.Errorf("power-off command ran %d times, want %d", n, powerOffs)
	}
	if _, err := os.Stat(v.cfgPath); !errors.Is(err, os.ErrNotExist) {
		v.t.Errorf("config file still there: %v", err)
	}
	if v.secret != "" && strings.Contains(v.log.String(), v.secret) {
		v.t.Errorf("the credential is in the agent's log")
	}
}

// checkCleanedUp: credential files gone, work directory empty.
func (v *vm) checkCleanedUp() {
	v.t.Helper()
	for _, f := range []string{".runner", ".credentials", ".credentials_rsaparams"} {
		if _, err := os.Lstat(filepath.Join(v.install(), f)); !errors.Is(err, os.ErrNotExist) {
			v.t.Errorf("runner credential file %s left behind (%v)", f, err)
		}
	}
	if entries, err := os.ReadDir(v.work()); err == nil && len(entries) != 0 {
		v.t.Errorf("work directory not emptied: %v", entries)
	}
}

func TestJITConfigRun(t *testing.T) {
	t.Parallel()
	v := newVM(t)
	writeScript(t, filepath.Join(v.install(), "run.sh"), v.goodRunner(0))
	v.writeConfig(v.baseConfig())
	code := v.run(context.Background())
	v.checkCommon(code, ExitOK, 1)
	v.checkCleanedUp()

	if got := v.read("run.args"); got != "0" {
		t.Errorf("run.sh arguments = %q, want none", got)
	}
	if got := v.read("run.jit"); got != v.secret {
		t.Errorf("ACTIONS_RUNNER_INPUT_JITCONFIG = %q, want the config's jitConfig", got)
	}
	if got := v.read("run.token"); got != "<unset>" {
		t.Errorf("ACTIONS_RUNNER_INPUT_TOKEN = %q in jit-config mode", got)
	}
	if ps := v.read("run.ps"); strings.Contains(ps, v.secret) {
		t.Errorf("the JIT config is on the runner's command line: %s", ps)
	}
	if got := v.read("run.config"); got != "absent" {
		t.Errorf("the config file was %s while the runner ran", got)
	}
	if got, want := v.read("run.pwd"), v.install(); got != want {
		t.Errorf("runner cwd = %q, want %q", got, want)
	}
	if os.Getuid() == 0 {
		if got := v.read("run.asroot"); got != "1" {
			t.Errorf("RUNNER_ALLOW_RUNASROOT = %q for a runner running as root", got)
		}
	}
	// Kept: a runner of the image, its other files, the work directory.
	for _, p := range []string{filepath.Join(v.install(), "run.sh"), filepath.Join(v.install(), ".env"), v.work()} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	log := v.log.String()
	for _, want := range []string{"runner online", "job started", "Listening for Jobs", `line="warning on stderr"`, "config file removed", "powering the VM off"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q", want)
		}
	}
}

func TestConfigRemovedBeforeAnythingElse(t *testing.T) {
	t.Parallel()
	v := newVM(t)
	writeScript(t, filepath.Join(v.install(), "run.sh"), v.goodRunner(0))
	v.writeConfig(v.baseConfig())
	var present []bool
	v.opts.NewCredentialSource = func(c *agentconfig.Config) (CredentialSource, error) {
		_, err := os.Stat(v.cfgPath)
		present = append(present, err == nil)
		return NewCredentialSource(c)
	}
	v.checkCommon(v.run(context.Background()), ExitOK, 1)
	if len(present) != 1 || present[0] {
		t.Errorf("config file present when the credential source was made: %v", present)
	}
}

func TestRunnerTokenRegistration(t *testing.T) {
	t.Parallel()
	v := newVM(t)
	writeScript(t, filepath.Join(v.install(), "config.sh"), v.recorder("config")+`
echo '{"agentId": 2}' >.runner
echo '{}' >.credentials
echo '{}' >.credentials_rsaparams
echo "√ Runner successfully added"`)
	writeScript(t, filepath.Join(v.install(), "run.sh"), v.goodRunner(0))
	c := v.baseConfig()
	c.BootstrapMethod = githubvm.MethodRegistrationToken
	c.RegistrationURL = "https://github.example/octo-org/app"
	c.Runner.Name, c.Runner.Labels, c.Runner.Group = "vm-1", []string{"hyperfleet", "gpu"}, "ci"
	v.writeConfig(c)
	v.checkCommon(v.run(context.Background()), ExitOK, 1)
	v.checkCleanedUp()

	args := []string{"--unattended", "--url", c.RegistrationURL, "--name", "vm-1", "--labels", "hyperfleet,gpu",
		"--runnergroup", "ci", "--work", v.work(), "--ephemeral", "--disableupdate", "--replace"}
	wantArgs := strconv.Itoa(len(args)) + "\n" + strings.Join(args, "\n")
	if got := v.read("config.args"); got != wantArgs {
		t.Errorf("config.sh arguments:\n%s\nwant\n%s", got, wantArgs)
	}
	if got := v.read("config.token"); got != v.secret {
		t.Errorf("ACTIONS_RUNNER_INPUT_TOKEN = %q, want the registration token", got)
	}
	if ps := v.read("config.ps"); strings.Contains(ps, v.secret) {
		t.Errorf("the token is on config.sh's command line: %s", ps)
	}
	if got := v.read("run.token"); got != "<unset>" {
		t.Errorf("run.sh got the registration token too")
	}
	if got := v.read("run.jit"); got != "<unset>" {
		t.Errorf("run.sh got a JIT config in runner-token mode")
	}
	if got := v.read("run.args"); got != "0" {
		t.Errorf("run.sh arguments = %q, want none", got)
	}
}

func TestRegistrationFailure(t *testing.T) {
	t.Parallel()
	v := newVM(t)
	writeScript(t, filepath.Join(v.install(), "config.sh"), `echo "registering..."
echo "config.sh: registration refused (HTTP 401): the registration token is not valid" >&2
exit 2`)
	writeScript(t, filepath.Join(v.install(), "run.sh"), v.goodRunner(0))
	c := v.baseConfig()
	c.BootstrapMethod = githubvm.MethodRegistrationToken
	c.RegistrationURL, c.Runner.Name = "https://github.example/octo-org", "vm-2"
	v.writeConfig(c)
	v.checkCommon(v.run(context.Background()), ExitRegistration, 1)
	if v.ran("run") {
		t.Error("run.sh ran after a failed registration")
	}
	if !strings.Contains(v.log.String(), "exit status 2): config.sh: registration refused (HTTP 401)") {
		t.Error("the error does not carry config.sh's exit status and error output")
	}
}

func TestRunnerFailure(t *testing.T) {
	t.Parallel()
	v := newVM(t)
	writeScript(t, filepath.Join(v.install(), "run.sh"), v.goodRunner(3))
	v.writeConfig(v.baseConfig())
	v.checkCommon(v.run(context.Background()), ExitRunnerFailed, 1)
	v.checkCleanedUp()
	if !strings.Contains(v.log.String(), "the runner failed (exit status 3)") {
		t.Error("log lacks the runner's exit status")
	}
}

// idleRunner comes online and waits for a job that never comes; with
// ignoreINT it also ignores SIGINT, so only SIGKILL ends it.
func (v *vm) idleRunner(ignoreINT bool) string {
	trap := ""
	if ignoreINT {
		trap = "trap '' INT\n"
	}
	return trap + `echo $$ >` + filepath.Join(v.rec, "pid") + `
sleep 120 &
echo $! >` + filepath.Join(v.rec, "child") + `
echo '{}' >.runner
echo '{}' >.credentials
echo "2026-01-01 00:00:00Z: Listening for Jobs"
wait
sleep 120`
}

func (v *vm) checkGone(names ...string) {
	v.t.Helper()
	for _, n := range names {
		raw, err := os.ReadFile(filepath.Join(v.rec, n))
		if err != nil {
			// On a slow machine the deadline may pass before the script
			// got that far.
			v.t.Logf("%s: %v", n, err)
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
		if err != nil {
			v.t.Errorf("%s: %v", n, err)
			continue
		}
		// Orphans are reaped by init, which may take a moment; a zombie is
		// gone as far as the job is concerned.
		gone := func() bool {
			if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
				return true
			}
			st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if i := bytes.LastIndexByte(st, ')'); err == nil && i > 0 && i+2 < len(st) {
				return st[i+2] == 'Z'
			}
			return false
		}
		for deadline := time.Now().Add(10 * time.Second); !gone(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				v.t.Errorf("process %s (%d) still exists", n, pid)
				break
			}
		}
	}
}

func TestIdleTimeout(t *testing.T) {
	t.Parallel()
	for name, ignoreINT := range map[string]bool{"exits on SIGINT": false, "needs SIGKILL": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			v := newVM(t)
			v.opts.IdleTimeout = 500 * time.Millisecond
			v.opts.StopGracePeriod = time.Second
			writeScript(t, filepath.Join(v.install(), "run.sh"), v.idleRunner(ignoreINT))
			v.writeConfig(v.baseConfig())
			v.checkCommon(v.run(context.Background()), ExitIdle, 1)
			v.checkCleanedUp()
			v.checkGone("pid", "child")
			if !strings.Contains(v.log.String(), "started no job within --idle-timeout") {
				t.Error("log lacks the idle deadline")
			}
		})
	}
}

func TestJobStartDisarmsIdleTimeout(t *testing.T) {
	t.Parallel()
	v := newVM(t)
	// The job line comes at once (well within the idle timeout, which
	// only has to cover starting a shell); the job then runs until the
	// test ends it, which is an idle timeout after the job started, so
	// after the deadline had the job not disarmed it.
	v.opts.IdleTimeout = 3 * time.Second
	finish := filepath.Join(v.dir, "finish")
	writeScript(t, filepath.Join(v.install(), "run.sh"), `echo "Listening for Jobs"
echo "Running job: long"
while [ ! -e `+finish+` ]; do sleep 0.1; done
echo "Job long completed with result: Succeeded"`)
	v.writeConfig(v.baseConfig())
	done := make(chan int, 1)
	go func() { done <- v.run(context.Background()) }()
	for !strings.Contains(v.log.String(), "job started") {
		select {
		case code := <-done:
			t.Fatalf("agent exited %d before the job started", code)
		case <-time.After(20 * time.Millisecond):
		}
	}
	select {
	case code := <-done:
		t.Fatalf("agent exited %d while the job ran", code)
	case <-time.After(v.opts.IdleTimeout):
	}
	if err := os.WriteFile(finish, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	v.checkCommon(<-done, ExitOK, 1)
}

func TestStopOnSignal(t *testing.T) {
	t.Parallel()
	v := newVM(t)
	writeScript(t, filepath.Join(v.install(), "run.sh"), v.idleRunner(false))
	v.writeConfig(v.baseConfig())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() { done <- v.run(ctx) }()
	deadline := time.After(60 * time.Second)
	for !strings.Contains(v.log.String(), "runner online") {
		select {
		case code := <-done:
			t.Fatalf("agent exited %d before the runner came online", code)
		case <-deadline:
			t.Fatal("the runner did not come online")
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	v.checkCommon(<-done, ExitInternal, 1)
	v.checkCleanedUp()
	v.checkGone("pid", "child")
}

func TestBadConfig(t *testing.T) {
	t.Parallel()
	v := newVM(t)
	writeScript(t, filepath.Join(v.install(), "run.sh"), v.goodRunner(0))
	if err := os.WriteFile(v.cfgPath, []byte(`{"version": 2, "jitConfig": "`+v.secret+`", "powerOffOnFinish": true}`), 0o600); err != nil {
		t.Fatal(err)
	}
	v.checkCommon(v.run(context.Background()), ExitBadConfig, 1)
	if v.ran("run") {
		t.Error("the runner ran with a bad config")
	}
	if !strings.Contains(v.log.String(), "version: is 2; this agent reads version 1") {
		t.Error("log lacks the validation message")
	}

	// Not even JSON, and no config at all: no power-off either (the
	// systemd unit's FailureAction covers those).
	v2 := newVM(t)
	_ = os.WriteFile(v2.cfgPath, []byte("not json "+v2.secret), 0o600)
	v2.checkCommon(v2.run(context.Background()), ExitBadConfig, 0)
	v3 := newVM(t)
	v3.checkCommon(v3.run(context.Background()), ExitBadConfig, 0)
}

func TestExpiredCredential(t *testing.T) {
	t.Parallel()
	v := newVM(t)
	writeScript(t, filepath.Join(v.install(), "run.sh"), v.goodRunner(0))
	v.holdCredential = true
	expired := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
	v.writeConfig(v.baseConfig())
	v.placeSecrets(agentconfig.GuestSecrets{JITConfig: v.secret, ExpiresAt: expired})
	v.checkCommon(v.run(context.Background()), ExitExpired, 1)
	if v.ran("run") {
		t.Error("the runner ran with an expired credential")
	}
	if !strings.Contains(v.log.String(), "credential expired at "+expired.Format(time.RFC3339)) {
		t.Error("log lacks the expiry")
	}

	// Not expired yet: runs.
	v2 := newVM(t)
	writeScript(t, filepath.Join(v2.install(), "run.sh"), v2.goodRunner(0))
	v2.holdCredential = true
	v2.writeConfig(v2.baseConfig())
	v2.placeSecrets(agentconfig.GuestSecrets{JITConfig: v2.secret, ExpiresAt: time.Now().Add(time.Hour)})
	v2.checkCommon(v2.run(context.Background()), ExitOK, 1)

	// A join token past its expiresAt is not tried either.
	v3 := newVM(t)
	c3 := v3.brokerConfig(agentconfig.AttestationJoinToken)
	c3.ExpiresAt = expired
	v3.writeConfig(c3)
	v3.checkCommon(v3.run(context.Background()), ExitExpired, 1)
	if !strings.Contains(v3.log.String(), "the join token expired at "+expired.Format(time.RFC3339)) {
		t.Error("log lacks the join token's expiry")
	}
}

func testTrustBundle(t *testing.T) string {
	t.Helper()
	c, err := selfsigned.New("spire.example")
	if err != nil {
		t.Fatal(err)
	}
	return string(c.CAPEM)
}

// brokerConfig is v's config in broker mode with attestation method m.
func (v *vm) brokerConfig(m agentconfig.AttestationMethod) *agentconfig.Config {
	c := v.baseConfig()
	c.WorkloadMethod = agentconfig.WorkloadBroker
	c.SPIFFE = &agentconfig.SPIFFE{AttestationMethod: m, TrustDomain: "hyperfleet.io",
		TrustBundle: testTrustBundle(v.t), ServerAddress: "spire.example:8081", BrokerURL: "https://broker.example"}
	if m == agentconfig.AttestationTPM {
		c.SPIFFE.TPMDevicePath = "/dev/tpmrm0"
		c.SPIFFE.SPIFFEID = "spiffe://hyperfleet.io/vm/ci/runner-1/uid"
	}
	return c
}

// placeGuestSecrets puts what the operator places in a running VM
// through the guest channel (the join token, v.secret, and a broker proof)
// where the agent under v.root waits for it.
func (v *vm) placeGuestSecrets() {
	v.t.Helper()
	v.placeSecrets(agentconfig.GuestSecrets{JoinToken: v.secret, BrokerProof: "proof-" + v.secret})
}

// TestBrokerWithoutSPIREAgent: broker mode in an image without spire-agent
// fails the attestation at once, pointing at the install guide, and
// leaves neither the join token nor a directory behind.
func TestBrokerWithoutSPIREAgent(t *testing.T) {
	t.Parallel()
	v := newVM(t)
	writeScript(t, filepath.Join(v.install(), "run.sh"), v.goodRunner(0))
	v.writeConfig(v.brokerConfig(agentconfig.AttestationJoinToken))
	v.placeGuestSecrets()
	v.opts.SPIREAgent = filepath.Join(v.dir, "no-spire-agent")
	v.checkCommon(v.run(context.Background()), ExitAttestation, 1)
	if v.ran("run") {
		t.Error("the runner ran without a credential")
	}
	if !strings.Contains(v.log.String(), "SPIFFE mode: installing spire-agent") {
		t.Errorf("log does not point at the install guide")
	}
	if entries, err := os.ReadDir(filepath.Join(v.root, SPIREDir)); err != nil || len(entries) != 0 {
		t.Errorf("SPIRE directory left: %v (%v)", entries, err)
	}
	if _, err := os.Stat(filepath.Join(v.root, agentconfig.SecretsFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the join token file is still there: %v", err)
	}
}

func TestPowerOff(t *testing.T) {
	t.Parallel()
	// powerOffOnFinish false: never.
	v := newVM(t)
	writeScript(t, filepath.Join(v.install(), "run.sh"), v.goodRunner(0))
	c := v.baseConfig()
	c.PowerOffOnFinish = false
	v.writeConfig(c)
	v.checkCommon(v.run(context.Background()), ExitOK, 0)

	// A failing power-off command is logged and changes nothing else.
	v2 := newVM(t)
	writeScript(t, filepath.Join(v2.install(), "run.sh"), v2.goodRunner(0))
	v2.opts.PowerOffCommand = []string{"sh", "-c", "echo cannot power off >&2; exit 1"}
	v2.writeConfig(v2.baseConfig())
	v2.checkCommon(v2.run(context.Background()), ExitOK, 0)
	if !strings.Contains(v2.log.String(), "power-off command failed") || !strings.Contains(v2.log.String(), "cannot power off") {
		t.Error("log lacks the power-off failure")
	}
}

func TestMissingRunner(t *testing.T) {
	t.Parallel()
	v := newVM(t)
	v.writeConfig(v.baseConfig())
	v.checkCommon(v.run(context.Background()), ExitRunnerSoftware, 1)
	if !strings.Contains(v.log.String(), "no runner in installPath and no downloadURL") {
		t.Error("log lacks the missing-runner message")
	}

	// runner-token needs the config script too.
	v2 := newVM(t)
	writeScript(t, filepath.Join(v2.install(), "run.sh"), v2.goodRunner(0))
	c := v2.baseConfig()
	c.BootstrapMethod = githubvm.MethodRegistrationToken
	c.RegistrationURL, c.Runner.Name = "https://github.example/octo-org", "vm-3"
	v2.writeConfig(c)
	v2.checkCommon(v2.run(context.Background()), ExitRunnerSoftware, 1)
	if v2.ran("run") {
		t.Error("run.sh ran without config.sh")
	}
}

func TestRunAs(t *testing.T) {
	t.Parallel()
	v := newVM(t)
	writeScript(t, filepath.Join(v.install(), "run.sh"), v.goodRunner(0))
	v.opts.RunAs = "no-such-user-hyperfleet"
	v.writeConfig(v.baseConfig())
	v.checkCommon(v.run(context.Background()), ExitInternal, 1)
	if !strings.Contains(v.log.String(), `--run-as \"no-such-user-hyperfleet\": no such user`) {
		t.Error("log lacks the --run-as error")
	}
	if v.ran("run") {
		t.Error("the runner ran without its user")
	}
}

func TestRunAsOtherUser(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Skip("needs root to switch users")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody")
	}
	v := newVM(t)
	// The "VM" and the record directory must be reachable by nobody.
	for _, d := range []string{v.root, filepath.Dir(v.root), v.dir, filepath.Dir(v.dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	_ = os.Chmod(v.rec, 0o777)
	writeScript(t, filepath.Join(v.install(), "run.sh"), v.goodRunner(0))
	v.opts.RunAs = "nobody"
	v.writeConfig(v.baseConfig())
	v.checkCommon(v.run(context.Background()), ExitOK, 1)
	if got := v.read("run.uid"); got != nobody.Uid {
		t.Errorf("runner uid = %s, want nobody's %s", got, nobody.Uid)
	}
	if got := v.read("run.asroot"); got != "<unset>" {
		t.Errorf("RUNNER_ALLOW_RUNASROOT = %q for a non-root runner", got)
	}
	for _, d := range []string{v.install(), v.work()} {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if uid := fi.Sys().(*syscall.Stat_t).Uid; strconv.Itoa(int(uid)) != nobody.Uid {
			t.Errorf("%s owned by uid %d, want nobody", d, uid)
		}
	}
	v.checkCleanedUp()
}

// packageServer serves pkg over HTTPS at /pkg/name.
func packageServer(t *testing.T, name string, pkg []byte) (*httptest.Server, string) {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/pkg/"+name {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(pkg)
	}))
	t.Cleanup(srv.Close)
	return srv, srv.URL + "/pkg/" + name
}

// chunkedPackageServer is packageServer without a Content-Length: the
// body is flushed in two parts.
func chunkedPackageServer(t *testing.T, name string, pkg []byte) (*httptest.Server, string) {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/pkg/"+name {
			http.NotFound(w, r)
			return
		}
		half := len(pkg) / 2
		_, _ = w.Write(pkg[:half])
		w.(http.Flusher).Flush()
		_, _ = w.Write(pkg[half:])
	}))
	t.Cleanup(srv.Close)
	return srv, srv.URL + "/pkg/" + name
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestDownloadedRunner(t *testing.T) {
	t.Parallel()
	for _, format := range []string{"tar.gz", "zip"} {
		t.Run(format, func(t *testing.T) {
			t.Parallel()
			v := newVM(t)
			es := []entry{dir("bin"), file("run.sh", 0o755, "#!/bin/sh\n"+v.goodRunner(0)+"\n"), file("bin/helper", 0o644, "h"), symlink("bin/run", "../run.sh")}
			pkg := tarGz(t, es...)
			if format == "zip" {
				pkg = zipFile(t, es...)
			}
			srv, url := packageServer(t, "actions-runner-linux-x64."+format, pkg)
			v.opts.HTTPClient = srv.Client()
			// Whatever was in installPath goes.
			writeScript(t, filepath.Join(v.install(), "stale.sh"), "exit 1")
			c := v.baseConfig()
			c.Runner.Software.DownloadURL, c.Runner.Software.DownloadSHA256 = url, sha256Hex(pkg)
			v.writeConfig(c)
			v.checkCommon(v.run(context.Background()), ExitOK, 1)
			if !v.ran("run") {
				t.Fatal("the downloaded runner did not run")
			}
			if _, err := os.Lstat(v.install()); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("downloaded runner not removed: %v", err)
			}
			v.checkCleanedUp()
			if left, _ := os.ReadDir(v.opts.TempDir); len(left) != 0 {
				t.Errorf("temporary files left: %v", left)
			}
			if !strings.Contains(v.log.String(), "runner package verified") {
				t.Error("log lacks the verification")
			}
		})
	}
}

func TestDownloadRefused(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		pkg   func(t *testing.T, v *vm) []byte
		path  string // served path differs: 404
		sha   func(pkg []byte) string
		msg   string
		clear bool // installPath was cleared (the package was accepted, unpacking failed)
		// opts adjusts the agent's options; chunked serves the package
		// without a Content-Length.
		opts    func(o *Options, pkg []byte)
		chunked bool
	}{
		"larger than the download bound": {
			pkg: func(t *testing.T, v *vm) []byte {
				return tarGz(t, file("run.sh", 0o755, "#!/bin/sh\n"+v.goodRunner(0)))
			},
			opts: func(o *Options, pkg []byte) { o.MaxDownloadBytes = int64(len(pkg)) - 1 },
			msg:  "more than the agent's bound",
		},
		"larger than the download bound, no length announced": {
			pkg: func(t *testing.T, v *vm) []byte {
				return tarGz(t, file("run.sh", 0o755, "#!/bin/sh\n"+v.goodRunner(0)))
			},
			opts:    func(o *Options, pkg []byte) { o.MaxDownloadBytes = int64(len(pkg)) - 1 },
			chunked: true,
			msg:     "larger than the agent's bound",
		},
		"unpacks to more than the bound": {
			pkg: func(t *testing.T, v *vm) []byte {
				return tarGz(t, file("run.sh", 0o755, "#!/bin/sh\n"+v.goodRunner(0)), file("bomb", 0o644, strings.Repeat("0", 1<<20)))
			},
			opts:  func(o *Options, _ []byte) { o.MaxUnpackedBytes = 64 << 10 },
			msg:   "--max-unpacked-bytes",
			clear: true,
		},
		"checksum mismatch": {
			pkg: func(t *testing.T, v *vm) []byte {
				return tarGz(t, file("run.sh", 0o755, "#!/bin/sh\n"+v.goodRunner(0)))
			},
			sha: func([]byte) string { return strings.Repeat("ab", 32) },
			msg: "does not match its checksum: downloadSHA256 is " + strings.Repeat("ab", 32) + " but the download has SHA-256 ",
		},
		"not found": {
			pkg: func(t *testing.T, v *vm) []byte {
				return tarGz(t, file("run.sh", 0o755, "#!/bin/sh\n"+v.goodRunner(0)))
			},
			path: "other.tar.gz",
			msg:  "HTTP 404",
		},
		"path traversal": {
			pkg: func(t *testing.T, v *vm) []byte {
				return tarGz(t, file("run.sh", 0o755, "#!/bin/sh\n"+v.goodRunner(0)), file("../../escape", 0o644, "x"))
			},
			msg:   "leaves the install directory",
			clear: true,
		},
		"no run script": {
			pkg:   func(t *testing.T, _ *vm) []byte { return tarGz(t, file("README", 0o644, "x")) },
			msg:   "the runner package has no script run.sh",
			clear: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			v := newVM(t)
			pkg := tc.pkg(t, v)
			srv, url := packageServer(t, "actions-runner-linux-x64.tar.gz", pkg)
			if tc.chunked {
				srv, url = chunkedPackageServer(t, "actions-runner-linux-x64.tar.gz", pkg)
			}
			v.opts.HTTPClient = srv.Client()
			if tc.opts != nil {
				tc.opts(&v.opts, pkg)
			}
			marker := filepath.Join(v.install(), "image-file")
			writeScript(t, marker, "")
			c := v.baseConfig()
			c.Runner.Software.DownloadURL, c.Runner.Software.DownloadSHA256 = url, sha256Hex(pkg)
			if tc.path != "" {
				c.Runner.Software.DownloadURL = srv.URL + "/pkg/" + tc.path
			}
			if tc.sha != nil {
				c.Runner.Software.DownloadSHA256 = tc.sha(pkg)
			}
			v.writeConfig(c)
			v.checkCommon(v.run(context.Background()), ExitRunnerSoftware, 1)
			if v.ran("run") {
				t.Error("a refused runner ran")
			}
			if !strings.Contains(v.log.String(), tc.msg) {
				t.Errorf("log lacks %q", tc.msg)
			}
			if name == "checksum mismatch" && !strings.Contains(v.log.String(), sha256Hex(pkg)) {
				t.Error("log lacks the actual hash")
			}
			_, err := os.Stat(marker)
			if tc.clear != errors.Is(err, os.ErrNotExist) {
				t.Errorf("installPath cleared = %v, want %v", errors.Is(err, os.ErrNotExist), tc.clear)
			}
			if _, err := os.Lstat(filepath.Join(v.root, "opt", "escape")); err == nil {
				t.Error("the package wrote outside installPath")
			}
			if left, _ := os.ReadDir(v.opts.TempDir); len(left) != 0 {
				t.Errorf("temporary files left: %v", left)
			}
		})
	}
}

func TestCredentialNeverPrinted(t *testing.T) {
	t.Parallel()
	c := Credential{Method: githubvm.MethodRegistrationToken, RegistrationToken: "TOKEN-123", RegistrationURL: "https://x/y"}
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "cred", c)
	for _, s := range []string{fmt.Sprint(c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c), buf.String(), fmt.Sprintf("%v", &GuestSource{Method: c.Method, File: agentconfig.SecretsFile})} {
		if strings.Contains(s, "TOKEN-123") {
			t.Errorf("credential printed: %s", s)
		}
	}
	// Nor a broker source's broker proof.
	b := &BrokerSource{Method: githubvm.MethodJIT, SPIFFE: &agentconfig.SPIFFE{BrokerURL: "https://broker.example"}, SecretsFile: agentconfig.SecretsFile,
		proof: "JOIN-TOKEN-456"}
	buf.Reset()
	slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "source", b)
	for _, s := range []string{fmt.Sprint(b), fmt.Sprintf("%+v", b), fmt.Sprintf("%#v", b), fmt.Sprintf("%+v", *b), buf.String()} {
		if strings.Contains(s, "JOIN-TOKEN-456") {
			t.Errorf("join token printed: %s", s)
		}
	}
}
