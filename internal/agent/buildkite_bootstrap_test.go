//go:build !windows

package agent

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite/buildkitevm"
)

// The test binary is hyperfleet-agent's stand-in: buildkite-agent, started
// by the agent under test, runs os.Executable() as its bootstrap-script
// (bootstrapScript), which is this binary. Before any test runs, it acts as
// the hidden command when it is called as one, as cmd/hyperfleet-agent
// does.
func init() {
	if len(os.Args) > 1 && os.Args[1] == BuildkiteBootstrapCommand {
		os.Exit(BuildkiteBootstrap(os.Args[2:], os.Stderr))
	}
}

// TestBuildkiteBootstrapDropsToTheJobUser runs the hidden command as
// buildkite-agent runs it (as root, with buildkite-agent's environment),
// with a bootstrap that reports what it is: it runs as the job's user with
// that user's groups, HOME, USER and LOGNAME, without the registration
// token or the root marker, with the job's own access token, in the
// directory it was started in, as the same process (exec, so
// buildkite-agent's signals reach it); the job's environment file is
// handed to the job's user, a file it does not own is not; and it exits
// with the bootstrap's status.
func TestBuildkiteBootstrapDropsToTheJobUser(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("this test switches users and must run as root (as buildkite-agent does in a VM)")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	openToAll(t, dir)
	envFile := filepath.Join(dir, "job-env-1")
	if err := os.WriteFile(envFile, []byte("A=1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	notMine := filepath.Join(dir, "job-env-json-1")
	if err := os.WriteFile(notMine, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(notMine, 1, 1); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bootstrap := filepath.Join(dir, "bootstrap.sh")
	writeScript(t, bootstrap, `echo "pid=$$"; id -u; id -g; id -G; env; pwd; exit 7`)
	cmd := exec.Command(self, BuildkiteBootstrapCommand, "--user", "nobody", "--", bootstrap)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/root", "USER=root", "LOGNAME=root", "RUNNER_ALLOW_RUNASROOT=1",
		EnvBuildkiteAgentToken + "=bkjat_registration", "BUILDKITE_AGENT_ACCESS_TOKEN=job-own-token",
		"BUILDKITE_ENV_FILE=" + envFile, "BUILDKITE_ENV_JSON_FILE=" + notMine}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 7 {
		t.Fatalf("exit %v, want the bootstrap's 7:\n%s", err, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) < 4 || lines[0] != "pid="+strconv.Itoa(cmd.Process.Pid) {
		t.Fatalf("the bootstrap is not the process buildkite-agent started (pid %d):\n%s", cmd.Process.Pid, out.String())
	}
	wantGroups := nobody.Gid
	if ids, err := nobody.GroupIds(); err == nil && len(ids) > 0 {
		wantGroups = strings.Join(ids, " ")
	}
	if lines[1] != nobody.Uid || lines[2] != nobody.Gid || !sameSet(lines[3], wantGroups) {
		t.Errorf("uid %s gid %s groups %s; want %s %s %s", lines[1], lines[2], lines[3], nobody.Uid, nobody.Gid, wantGroups)
	}
	env := lines[4:]
	for _, want := range []string{"USER=nobody", "LOGNAME=nobody", "HOME=" + nobody.HomeDir, "BUILDKITE_AGENT_ACCESS_TOKEN=job-own-token", "PATH=/usr/bin:/bin", dir} {
		if !slices.Contains(env, want) {
			t.Errorf("the bootstrap's environment or directory lacks %q:\n%s", want, out.String())
		}
	}
	for _, gone := range []string{"bkjat_registration", "RUNNER_ALLOW_RUNASROOT", "USER=root", "HOME=/root"} {
		if strings.Contains(out.String(), gone) {
			t.Errorf("the bootstrap saw %q:\n%s", gone, out.String())
		}
	}
	if st := statOf(t, envFile); int(st.Uid) != mustAtoi(t, nobody.Uid) {
		t.Errorf("the job's environment file is owned by uid %d, not the job's user", st.Uid)
	}
	if st := statOf(t, notMine); st.Uid != 1 {
		t.Errorf("a file the agent does not own was handed over (uid %d)", st.Uid)
	}
}

// TestBuildkiteBootstrapRefuses: bad arguments and an unknown user run
// nothing.
func TestBuildkiteBootstrapRefuses(t *testing.T) {
	var stderr bytes.Buffer
	for _, args := range [][]string{nil, {"--user", "nobody"}, {"--", "/bin/true"}} {
		stderr.Reset()
		if code := BuildkiteBootstrap(args, &stderr); code != 2 {
			t.Errorf("%q: exit %d, want 2 (%s)", args, code, stderr.String())
		}
	}
	stderr.Reset()
	if code := BuildkiteBootstrap([]string{"--user", "no-such-user-hf", "--", "/bin/true"}, &stderr); code != 1 || !strings.Contains(stderr.String(), "no such user") {
		t.Errorf("an unknown user: exit %d, %s", code, stderr.String())
	}
}

// TestBuildkiteJobOfCredential: the job comes with a job-token
// credential, or from the config of a VM made for it; they must agree,
// one of them must name it, and it must be a job UUID. An agent-token
// credential acquires nothing.
func TestBuildkiteJobOfCredential(t *testing.T) {
	const a, b = "0190a3b2-0000-4000-8000-00000000000a", "0190a3b2-0000-4000-8000-00000000000b"
	cfg := func(acquire string) *agentconfig.Config {
		return &agentconfig.Config{Runner: agentconfig.Runner{AcquireJob: acquire}}
	}
	jobToken := func(job string) Credential {
		return Credential{Method: buildkitevm.MethodJobToken, RegistrationToken: "bkjat_x", Job: job}
	}
	for name, tc := range map[string]struct {
		cfg  *agentconfig.Config
		cred Credential
		want string
		code int
	}{
		"warm VM":         {cfg(""), jobToken(a), a, 0},
		"made for it":     {cfg(a), jobToken(a), a, 0},
		"config only":     {cfg(a), jobToken(""), a, 0},
		"disagree":        {cfg(b), jobToken(a), "", ExitBadConfig},
		"none":            {cfg(""), jobToken(""), "", ExitBadConfig},
		"not a UUID":      {cfg(""), jobToken("../../x"), "", ExitBadConfig},
		"agent token":     {cfg(""), Credential{Method: buildkitevm.MethodAgentToken, RegistrationToken: "t"}, "", 0},
		"agent token job": {cfg(""), Credential{Method: buildkitevm.MethodAgentToken, RegistrationToken: "t", Job: a}, "", ExitBadConfig},
	} {
		got, err := buildkiteJob(tc.cfg, tc.cred)
		if got != tc.want || exitCodeOf(err) != tc.code {
			t.Errorf("%s: %q, %v; want %q, exit %d", name, got, err, tc.want, tc.code)
		}
	}
}

// TestBuildkiteBootstrapScript: every word single-quoted, as
// buildkite-agent's shellwords split them back; a single quote is refused.
func TestBuildkiteBootstrapScript(t *testing.T) {
	self, _ := os.Executable()
	got, err := bootstrapScript("runner", "/opt/buildkite agent/buildkite-agent")
	want := "'" + self + "' 'buildkite-bootstrap' '--user' 'runner' '--' '/opt/buildkite agent/buildkite-agent' 'bootstrap'"
	if err != nil || got != want {
		t.Fatalf("bootstrapScript = %s, %v; want %s", got, err, want)
	}
	if _, err := bootstrapScript("runner", "/opt/it's/buildkite-agent"); err == nil {
		t.Fatal("a path with a single quote was accepted")
	}
}

func exitCodeOf(err error) int {
	var e *exitError
	if errors.As(err, &e) {
		return e.code
	}
	if err != nil {
		return -1
	}
	return 0
}

func sameSet(a, b string) bool {
	x, y := strings.Fields(a), strings.Fields(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y)
}

func statOf(t *testing.T, path string) *syscall.Stat_t {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return info.Sys().(*syscall.Stat_t)
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
