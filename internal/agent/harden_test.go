//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github/githubvm"
)

// fakeSudo is a sudo that answers `sudo -n -l -U <user>` as sudo 1.9 does
// (LC_ALL=C): rules "" says the user may run nothing.
func fakeSudo(t *testing.T, rules string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "sudo")
	body := `[ "$1 $2 $3" = "-n -l -U" ] || { echo "unexpected arguments: $*" >&2; exit 1; }
echo "User $4 is not allowed to run sudo on vm."`
	if rules != "" {
		body = `echo "Matching Defaults entries for $4 on vm:"
echo "    env_reset, secure_path=/usr/sbin\:/usr/bin"
echo
echo "User $4 may run the following commands on vm:"
echo "    ` + rules + `"`
	}
	writeScript(t, p, body)
	return p
}

// groups is a groupsOf that gives every user names.
func groups(names ...string) func(*user.User) ([]string, error) {
	return func(*user.User) ([]string, error) { return names, nil }
}

// TestJobUserEscalation: how a job user becomes root, as the agent
// finds it: root itself, a root-equivalent group, a sudo rule; and a sudo
// listing it cannot read fails the check closed.
func TestJobUserEscalation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	uid := os.Getuid()
	if uid == 0 {
		// A user that is not root: the check looks at the job user.
		nobody, err := user.Lookup("nobody")
		if err != nil {
			t.Skip("no user nobody")
		}
		uid, _ = strconv.Atoi(nobody.Uid)
	}
	plain := &runAs{name: "job", uid: uid}
	cases := []struct {
		name    string
		h       *hardening
		u       *runAs
		want    string // "" none
		wantErr string
	}{
		{"a plain user", &hardening{sudo: fakeSudo(t, ""), groupsOf: groups("runner", "users")}, plain, "", ""},
		{"root", &hardening{sudo: fakeSudo(t, ""), groupsOf: groups("root")}, &runAs{uid: 0}, "it is root", ""},
		{"docker", &hardening{sudo: fakeSudo(t, ""), groupsOf: groups("runner", "docker")}, plain, "it is in group docker", ""},
		{"sudo group", &hardening{sudo: fakeSudo(t, ""), groupsOf: groups("sudo")}, plain, "it is in group sudo", ""},
		{"disk", &hardening{sudo: fakeSudo(t, ""), groupsOf: groups("disk")}, plain, "it is in group disk", ""},
		{"a sudo rule", &hardening{sudo: fakeSudo(t, "(ALL) NOPASSWD: ALL"), groupsOf: groups("runner")}, plain, "sudo lets it run (ALL) NOPASSWD: ALL", ""},
		{"a narrow sudo rule", &hardening{sudo: fakeSudo(t, "(root) NOPASSWD: /usr/bin/apt-get"), groupsOf: groups("runner")}, plain, "sudo lets it run (root) NOPASSWD: /usr/bin/apt-get", ""},
		{"a sudo that says something else", &hardening{sudo: "/bin/false", groupsOf: groups("runner")}, plain, "", "cannot tell whether sudo lets"},
	}
	for _, tc := range cases {
		why, err := tc.h.escalation(ctx, tc.u)
		got := strings.Join(why, "; ")
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s: error %v, want one saying %q", tc.name, err, tc.wantErr)
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want == "" && got != "", tc.want != "" && !strings.Contains(got, tc.want):
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestRealSudoListing: the listing the check reads is the real sudo's,
// for a user without rules (the machine's sudoers is not the test's to
// change; the real guest shows a rule, test/guest).
func TestRealSudoListing(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Skip("sudo lists another user's rules for root only")
	}
	bin, err := exec.LookPath("sudo")
	if err != nil {
		t.Skip("no sudo here")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody")
	}
	rules, err := (&hardening{sudo: bin}).sudoRules(context.Background(), nobody.Username)
	if err != nil || rules != "" {
		t.Errorf("sudo rules of nobody = %q, %v; want none", rules, err)
	}
	if rules, err := (&hardening{sudo: bin}).sudoRules(context.Background(), "root"); err != nil || !strings.Contains(rules, "ALL") {
		t.Errorf("sudo rules of root = %q, %v; want its ALL rule", rules, err)
	}
}

// escalatingVM is a VM whose job user is in group docker (and, when the
// test runs as root, is root itself), with a GitHub runner of method.
func escalatingVM(t *testing.T, method agentconfig.BootstrapMethod, accept bool, notices *noticeRecorder) (*vm, *agentconfig.Config) {
	t.Helper()
	v := newVM(t)
	v.opts.hardening = &hardening{sudo: fakeSudo(t, ""), groupsOf: groups("runner", "docker")}
	writeScript(t, filepath.Join(v.install(), "config.sh"), v.recorder("config")+`
echo '{"agentId": 2}' >.runner
echo '{}' >.credentials
echo '{}' >.credentials_rsaparams`)
	writeScript(t, filepath.Join(v.install(), "run.sh"), v.goodRunner(0))
	c := v.baseConfig()
	c.BootstrapMethod = method
	if method == githubvm.MethodRegistrationToken {
		c.RegistrationURL, c.Runner.Name = "https://github.example/octo-org/app", "vm-1"
	}
	c.JobMayEscalate = accept
	c.PowerOffNotify = notices.notify(t)
	v.writeConfig(c)
	return v, c
}

// TestEscalatingJobUserIsRefusedForAMultiJobCredential performs the attack
// of a job that takes its VM's runner credential to run other jobs with
// it, on an image whose job user can become root: with a credential that
// serves more than one job (a registration token here; GitLab's runner
// token and Buildkite's agent token alike), the agent refuses before it
// obtains the credential (its secrets stay unread where the operator
// placed them), runs no runner, exits ExitJobUserEscalates and says
// JobUserCanEscalate in its power-off notice. The template's
// jobMayEscalate runs it; a single-job credential (JIT) runs with a
// warning.
func TestEscalatingJobUserIsRefusedForAMultiJobCredential(t *testing.T) {
	t.Parallel()
	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		notices := &noticeRecorder{}
		v, _ := escalatingVM(t, githubvm.MethodRegistrationToken, false, notices)
		v.checkCommon(v.run(context.Background()), ExitJobUserEscalates, 1)
		if got := v.read("config.args") + v.read("run.args"); !strings.Contains(got, "<missing") || strings.Count(got, "<missing") != 2 {
			t.Errorf("a runner script ran: %s", got)
		}
		if _, err := os.Stat(filepath.Join(v.root, agentconfig.SecretsFile)); err != nil {
			t.Errorf("the credential was taken before the refusal: %v", err)
		}
		// Root (a test run as root, whose user the job runs as) or in
		// group docker.
		if log := v.log.String(); !strings.Contains(log, "it is in group docker") && !strings.Contains(log, "it is root") || !strings.Contains(log, "jobMayEscalate") {
			t.Errorf("the log does not say why and what to do:\n%s", log)
		}
		notices.mu.Lock()
		defer notices.mu.Unlock()
		if len(notices.notices) != 1 || notices.notices[0].GuestRefusal != agentconfig.GuestRefusalJobUserEscalates || notices.notices[0].JobStarted {
			t.Errorf("power-off notices %+v, want one saying %s", notices.notices, agentconfig.GuestRefusalJobUserEscalates)
		}
	})
	for _, tc := range []struct {
		name   string
		method agentconfig.BootstrapMethod
		accept bool
	}{{"accepted by the template", githubvm.MethodRegistrationToken, true}, {"single-job credential", githubvm.MethodJIT, false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			notices := &noticeRecorder{}
			v, _ := escalatingVM(t, tc.method, tc.accept, notices)
			v.checkCommon(v.run(context.Background()), ExitOK, 1)
			if got := v.read("run.args"); strings.Contains(got, "<missing") {
				t.Errorf("the runner did not run: %s", got)
			}
			if !strings.Contains(v.log.String(), "the job user can become root") {
				t.Errorf("the log does not warn that the job user can become root:\n%s", v.log.String())
			}
		})
	}
}

// TestPtraceScopeRaised: Yama's ptrace scope is raised to 1, a higher one
// kept, and a kernel without Yama logged.
func TestPtraceScopeRaised(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ was, want string }{{"0\n", "1\n"}, {"1\n", "1\n"}, {"2\n", "2\n"}, {"3\n", "3\n"}} {
		p := filepath.Join(t.TempDir(), "ptrace_scope")
		if err := os.WriteFile(p, []byte(tc.was), 0o644); err != nil {
			t.Fatal(err)
		}
		v := newVM(t)
		(&hardening{ptraceScope: p}).restrictPtrace(&agent{opts: v.opts, log: v.opts.Logger})
		if got, _ := os.ReadFile(p); string(got) != tc.want {
			t.Errorf("ptrace_scope %q became %q, want %q", tc.was, got, tc.want)
		}
	}
	v := newVM(t)
	(&hardening{ptraceScope: filepath.Join(t.TempDir(), "none")}).restrictPtrace(&agent{opts: v.opts, log: v.opts.Logger})
	if !strings.Contains(v.log.String(), "no Yama ptrace scope") {
		t.Errorf("a kernel without Yama is not logged:\n%s", v.log.String())
	}
}

// TestProcMountOptions reads mountinfo as the kernel writes it.
func TestProcMountOptions(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "mountinfo")
	info := `22 27 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw,hidepid=invisible
23 27 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
24 27 0:23 / /my\040proc rw,nosuid,relatime - proc proc rw
`
	if err := os.WriteFile(p, []byte(info), 0o644); err != nil {
		t.Fatal(err)
	}
	opts, flags, err := procMount(p, "/proc")
	if err != nil || opts["hidepid"] != "invisible" || flags != syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC|syscall.MS_RELATIME {
		t.Errorf("/proc: %v, %#x, %v", opts, flags, err)
	}
	if opts, flags, err := procMount(p, "/my proc"); err != nil || opts["hidepid"] != "" || flags != syscall.MS_NOSUID|syscall.MS_RELATIME {
		t.Errorf("/my proc: %v, %#x, %v", opts, flags, err)
	}
	if _, _, err := procMount(p, "/sys"); err == nil || !strings.Contains(err.Error(), "not proc") {
		t.Errorf("/sys: %v", err)
	}
	if _, _, err := procMount(p, "/none"); err == nil {
		t.Error("a path that is no mount point was taken")
	}
}

// The helper process of TestHidepidHidesTheAgentFromTheJob, in a mount
// namespace of its own (HF_HARDEN_HELPER names the proc mount point).
func TestMain(m *testing.M) {
	if target := os.Getenv("HF_HARDEN_HELPER"); target != "" {
		os.Exit(hardenHelper(target))
	}
	os.Exit(m.Run())
}

// hardenHelper mounts a proc instance of its own at target, remounts it
// as the agent remounts /proc, and then, as user nobody, tries what a job
// tries: find this root process and init, read this process's environment
// (which the kernel's uid check refuses in any case). It prints what
// nobody could do and exits 0 when the remount worked and nobody could do
// nothing.
func hardenHelper(target string) int {
	if err := syscall.Mount("proc", target, "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		fmt.Println("mount proc:", err)
		return 2
	}
	v := &agent{log: slog.New(slog.DiscardHandler)}
	(&hardening{proc: target, mountinfo: "/proc/self/mountinfo", remount: remountProc}).hideProcesses(v)
	code := 0
	opts, _, err := procMount("/proc/self/mountinfo", target)
	if err != nil || (opts["hidepid"] != "invisible" && opts["hidepid"] != "2") {
		fmt.Println("not remounted with hidepid:", opts, err)
		code = 3
	}
	me := strconv.Itoa(os.Getpid())
	probe := fmt.Sprintf(`l=$(ls %[1]s) || { echo "cannot list %[1]s"; exit 1; }
printf '%%s\n' "$l" | grep -qx $$ || { echo "does not see itself in %[1]s"; exit 1; }
printf '%%s\n' "$l" | grep -qx %[2]s && echo "sees the agent's process"
printf '%%s\n' "$l" | grep -qx 1 && echo "sees init"
cat %[1]s/%[2]s/environ >/dev/null 2>&1 && echo "reads the agent's environment"
exit 0`, target, me)
	out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", probe).CombinedOutput()
	if err != nil {
		fmt.Println("probe:", err, string(out))
		return 4
	}
	if s := strings.TrimSpace(string(out)); s != "" {
		fmt.Println(s)
		return 5
	}
	return code
}

// TestHidepidHidesTheAgentFromTheJob performs the job's attack on a proc
// file system the agent hardened, on the real kernel: in a mount
// namespace of its own (unshare), a fresh proc instance is remounted by
// the agent's code, and a process of another user (nobody, as the job
// user) can neither see the root process nor init (nor read the root
// process's environment).
func TestHidepidHidesTheAgentFromTheJob(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Skip("needs root: mount namespaces and setpriv")
	}
	for _, bin := range []string{"unshare", "setpriv"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("no %s (util-linux)", bin)
		}
	}
	// Where nobody reaches it (a test's own temporary directory is 0700).
	target, err := os.MkdirTemp("", "hf-harden-proc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(target) })
	if err := os.Chmod(target, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(self), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", self, "-test.run=^$")
	cmd.Env = append(os.Environ(), "HF_HARDEN_HELPER="+target, "HF_HARDEN_SECRET=must-not-leak")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	if err != nil {
		t.Errorf("the job could reach the agent (%v):\n%s", err, out)
	} else {
		t.Logf("the job saw nothing of the agent: %s", strings.TrimSpace(string(out)))
	}
}

// TestSecretsDirIsRootsAlone performs a job user's attack on the
// credential the operator places in the VM (0666, as QEMU's guest agent
// creates files): the image made the secrets directory the job user's
// (or a link to one of its directories), the agent makes it root's 0700
// (or refuses a link) before anything arrives, and the job user reads
// nothing of what then arrives there.
func TestSecretsDirIsRootsAlone(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Skip("needs root to own files as another user")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody")
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	// Where nobody reaches it (a test's own temporary directory is 0700).
	base, err := os.MkdirTemp("", "hf-secrets-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "run", "hyperfleet")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "secrets.json")
	if err := prepareSecretsDir(path, ExitNoSecrets); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(`{"jitConfig": "must-not-leak"}`), 0o666); err != nil {
		t.Fatal(err)
	}
	job := exec.Command("cat", path)
	job.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	if out, err := job.CombinedOutput(); err == nil || strings.Contains(string(out), "must-not-leak") {
		t.Errorf("the job user read the placed credential: %s", out)
	}

	// A link the image planted to a directory of the job user's.
	linked := filepath.Join(base, "run", "linked")
	if err := os.Symlink(filepath.Join(base, "theirs"), linked); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(base, "theirs"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := prepareSecretsDir(filepath.Join(linked, "secrets.json"), ExitNoSecrets); exitCode(err) != ExitNoSecrets || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("a link as the secrets directory: %v", err)
	}
}
