package gitlabsim

import (
	"bufio"
	"os"
	"os/exec"
	osuser "os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	gitlab "gitlab.com/gitlab-org/api/client-go"
)

// standInRun is `gitlab-runner run` of the stand-in, running, with the
// lines of its stderr.
type standInRun struct {
	cmd  *exec.Cmd
	done chan error

	mu    sync.Mutex
	lines []string
	seen  chan string // every stderr line, as it comes
}

// startRun writes cfg, config.toml for one runner (as hyperfleet-agent
// writes it: root's, mode 0600, in a directory of its own) and starts
// `gitlab-runner run --config cfg --working-directory builds [--user
// USER]`.
func startRun(t *testing.T, bin, cfg, url, token, builds, jobUser string) *standInRun {
	t.Helper()
	toml := "concurrent = 1\n\n[[runners]]\n  name = \"vm-1\"\n  url = \"" + url + "\"\n  token = \"" + token + "\"\n  executor = \"shell\"\n  builds_dir = \"" + builds + "\"\n  limit = 1\n"
	if err := os.WriteFile(cfg, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"run", "--config", cfg, "--working-directory", builds}
	if jobUser != "" {
		args = append(args, "--user", jobUser)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "HF_SIM_POLL_INTERVAL=0.1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &standInRun{cmd: cmd, done: make(chan error, 1), seen: make(chan string, 1024)}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			r.mu.Lock()
			r.lines = append(r.lines, sc.Text())
			r.mu.Unlock()
			r.seen <- sc.Text()
		}
		r.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
	})
	return r
}

// waitLine waits for a stderr line holding s.
func (r *standInRun) waitLine(t *testing.T, s string) string {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l := <-r.seen:
			if strings.Contains(l, s) {
				return l
			}
		case <-timeout:
			t.Fatalf("no line %q from the stand-in:\n%s", s, r.output())
		}
	}
}

// wait waits for the stand-in to exit.
func (r *standInRun) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("the stand-in did not exit:\n%s", r.output())
		return nil
	}
}

func (r *standInRun) output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.lines, "\n")
}

// TestStandInRunServesUntilQuit: `gitlab-runner run`, as the real runner,
// serves jobs until it is stopped (its one-job limit is not its own: the
// agent stops it), logging "Checking for jobs... received" for each; on
// SIGQUIT it asks for no other job, finishes the one it runs and exits 0.
func TestStandInRunServesUntilQuit(t *testing.T) {
	w := newWorld(t)
	bin := w.standIn(t)
	r := w.createRunner(t, groupToken, &gitlab.CreateUserRunnerOptions{RunnerType: ptr(GroupType), GroupID: ptr(w.groupID(t, "acme/platform")), TagList: ptr([]string{"hyperfleet"})})
	queue := func(script ...string) int64 {
		pl, err := w.sim.CreatePipeline(PipelineRequest{Project: "acme/platform/app", Jobs: []JobConfig{{Name: "build", Tags: []string{"hyperfleet"}, Script: script}}})
		if err != nil {
			t.Fatal(err)
		}
		return pl.Jobs[0]
	}
	first, second := queue("echo one"), queue("echo two")
	run := startRun(t, bin, filepath.Join(t.TempDir(), "config.toml"), w.srv.URL, r.Token, t.TempDir(), "")
	run.waitLine(t, "job="+itoa(first))
	run.waitLine(t, "job="+itoa(second))
	third := queue("sleep 1", "echo three")
	run.waitLine(t, "job="+itoa(third))
	if err := run.cmd.Process.Signal(syscall.SIGQUIT); err != nil {
		t.Fatal(err)
	}
	fourth := queue("echo four")
	if err := run.wait(t); err != nil {
		t.Fatalf("run after SIGQUIT: %v\n%s", err, run.output())
	}
	for _, id := range []int64{first, second, third} {
		if j, _ := w.sim.Job(id); j.Status != StatusSuccess || j.RunnerID != r.ID {
			t.Errorf("job %d: %s on runner %d", id, j.Status, j.RunnerID)
		}
	}
	if j, _ := w.sim.Job(fourth); j.Status != StatusPending {
		t.Errorf("a job queued after SIGQUIT: %s, want pending", j.Status)
	}
}

// TestStandInRunsTheJobAsAnotherUser: with `run --user`, as the real shell
// executor when its runner runs as root, the job runs as that user (su),
// and what the job tries against its runner fails: the runner's token is
// in neither the job's environment nor a file it can read (config.toml,
// root's and 0600), and the runner's own environment (/proc/<pid>/environ,
// which reading needs the right to trace the process) is closed to it.
// The same job run without --user, as the runner's own user, reads both:
// the attack is real. Needs root (su to another user), as in a VM.
func TestStandInRunsTheJobAsAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("running the job as another user needs root (su), as gitlab-runner in a VM runs")
	}
	if _, err := exec.LookPath("su"); err != nil {
		t.Fatalf("the stand-in runs jobs as another user with su: %v", err)
	}
	nobody, err := osuser.Lookup("nobody")
	if err != nil {
		t.Skipf("no user nobody to run the job as: %v", err)
	}
	w := newWorld(t)
	bin := w.standIn(t)
	r := w.createRunner(t, groupToken, &gitlab.CreateUserRunnerOptions{RunnerType: ptr(GroupType), GroupID: ptr(w.groupID(t, "acme/platform")), TagList: ptr([]string{"hyperfleet"})})
	builds := filepath.Join(t.TempDir(), "builds")
	if err := os.MkdirAll(builds, 0o755); err != nil {
		t.Fatal(err)
	}
	// The builds directory is the job user's, as the agent hands it over;
	// the test's temporary directories above it must be passable.
	for _, d := range []string{filepath.Dir(builds), filepath.Dir(filepath.Dir(builds))} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	uid, gid := atoi(t, nobody.Uid), atoi(t, nobody.Gid)
	if err := os.Chown(builds, uid, gid); err != nil {
		t.Fatal(err)
	}
	for d := filepath.Dir(filepath.Dir(builds)); d != "/"; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			t.Skipf("%s is not passable by other users; the job could not reach its builds directory", d)
		}
	}
	// The job knows where config.toml is, as a hostile job finds it. The
	// markers are split in the script, whose commands the trace echoes, so
	// that only their output holds them whole.
	steal := func(cfg string) int64 {
		pl, err := w.sim.CreatePipeline(PipelineRequest{Project: "acme/platform/app", Jobs: []JobConfig{{Name: "steal", Tags: []string{"hyperfleet"},
			Variables: map[string]string{"HF_CONFIG": cfg},
			Script: []string{
				`echo "uid=$(id -u)"`,
				`if env | grep -q glrt-; then echo "STOLEN""-FROM-ENVIRONMENT"; fi`,
				`if grep -qs glrt- "$HF_CONFIG"; then echo "STOLEN""-FROM-CONFIG"; fi`,
				`for p in /proc/[0-9]*; do if tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -q 'gitlab-runner run'; then if tr '\0' '\n' <"$p/environ" >/dev/null 2>&1; then echo "ENVIRON-OF-RUNNER""-READ pid=${p#/proc/}"; else echo "environ of runner ${p#/proc/} refused"; fi; fi; done`,
			},
		}}})
		if err != nil {
			t.Fatal(err)
		}
		return pl.Jobs[0]
	}
	stolen := []string{"STOLEN-FROM-CONFIG", "ENVIRON-OF-RUNNER-READ"}
	for _, tc := range []struct {
		user, uid string
		// stolen: without --user the job runs as the runner (root) and
		// the same attack reads the token: the check can fail.
		stolen bool
	}{{user: "nobody", uid: nobody.Uid}, {user: "", uid: "0", stolen: true}} {
		cfg := filepath.Join(t.TempDir(), "config.toml")
		id := steal(cfg)
		run := startRun(t, bin, cfg, w.srv.URL, r.Token, builds, tc.user)
		run.waitLine(t, "job="+itoa(id))
		if err := run.cmd.Process.Signal(syscall.SIGQUIT); err != nil {
			t.Fatal(err)
		}
		if err := run.wait(t); err != nil {
			t.Fatalf("run --user %q: %v\n%s", tc.user, err, run.output())
		}
		j, _ := w.sim.Job(id)
		if j.Status != StatusSuccess {
			t.Fatalf("job of run --user %q: %+v\n%s", tc.user, j, run.output())
		}
		if !strings.Contains(j.Trace, "uid="+tc.uid+"\n") || !strings.Contains(j.Trace, "of runner") {
			t.Errorf("run --user %q: the job did not run as uid %s, or found no runner process to try:\n%s", tc.user, tc.uid, j.Trace)
		}
		if strings.Contains(j.Trace, "STOLEN-FROM-ENVIRONMENT") {
			t.Errorf("run --user %q: the token was in the job's environment:\n%s", tc.user, j.Trace)
		}
		for _, s := range stolen {
			if strings.Contains(j.Trace, s) != tc.stolen {
				t.Errorf("run --user %q: %s in the trace is %v, want %v:\n%s", tc.user, s, !tc.stolen, tc.stolen, j.Trace)
			}
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
