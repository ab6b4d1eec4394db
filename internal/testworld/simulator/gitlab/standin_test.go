package gitlabsim

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	gitlab "gitlab.com/gitlab-org/api/client-go"
)

// standIn downloads the stand-in from the simulator, as a VM's cloud-init
// would, checks it against the published release.sha256, and returns its
// path. bash and curl must be installed (they are in the test-world guests);
// a missing one fails the test.
func (w *world) standIn(t *testing.T) string {
	t.Helper()
	for _, tool := range []string{"bash", "curl", "awk", "setsid"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the gitlab-runner stand-in needs %s: %v", tool, err)
		}
	}
	status, _, bin := w.call(t, "GET", "/_sim/gitlab-runner/gitlab-runner-linux-amd64", nil, nil)
	if status != 200 {
		t.Fatalf("download: %d", status)
	}
	status, _, sums := w.call(t, "GET", "/_sim/gitlab-runner/release.sha256", nil, nil)
	sum := sha256.Sum256(bin)
	if status != 200 || !strings.Contains(string(sums), hex.EncodeToString(sum[:])+" *binaries/gitlab-runner-linux-amd64\n") {
		t.Fatalf("release.sha256 (%d) does not list the download's digest: %s", status, sums)
	}
	path := filepath.Join(t.TempDir(), "gitlab-runner")
	if err := os.WriteFile(path, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// runStandIn runs `gitlab-runner run-single` with the flags the in-VM agent
// will give it, and returns its stderr and exit error.
func runStandIn(t *testing.T, bin, url, token string, extra ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append([]string{"run-single", "--url", url, "--token", token, "--executor", "shell", "--max-builds", "1", "--wait-timeout", "20", "--builds-dir", t.TempDir()}, extra...)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "HF_SIM_POLL_INTERVAL=0.1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	return stderr.String(), err
}

// TestStandInRunsShellJobs runs real shell jobs with the stand-in: the
// trace holds the script's output (quotes, &&, redirections and a
// multi-line command survive the JSON and shell quoting), variables reach
// the script, a failing script fails the job with its exit code, and a
// deleted runner's token is refused.
func TestStandInRunsShellJobs(t *testing.T) {
	w := newWorld(t)
	bin := w.standIn(t)
	url := w.srv.URL
	r := w.createRunner(t, groupToken, &gitlab.CreateUserRunnerOptions{RunnerType: ptr(GroupType), GroupID: ptr(w.groupID(t, "acme/platform")), TagList: ptr([]string{"hyperfleet"})})

	pl, err := w.sim.CreatePipeline(PipelineRequest{Project: "acme/platform/app", Jobs: []JobConfig{{
		Name: "build", Tags: []string{"hyperfleet"}, Variables: map[string]string{"GREETING": "it's <ok> & \"fine\""},
		Script: []string{`echo "hello from $CI_JOB_NAME in $CI_PROJECT_PATH"`, `echo "$GREETING" && echo tail >&2`, "for i in 1 2; do\n  echo line-$i\ndone", `test -n "$CI_JOB_TOKEN"`},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if stderr, err := runStandIn(t, bin, url, r.Token); err != nil {
		t.Fatalf("stand-in: %v\n%s", err, stderr)
	}
	t.Logf("successful job ran in %v", time.Since(start))
	j, _ := w.sim.Job(pl.Jobs[0])
	for _, want := range []string{"Running with gitlab-runner", "$ echo \"hello from $CI_JOB_NAME in $CI_PROJECT_PATH\"\n", "hello from build in acme/platform/app\n", "it's <ok> & \"fine\"\ntail\n", "line-1\nline-2\n", "Job succeeded\n"} {
		if !strings.Contains(j.Trace, want) {
			t.Errorf("trace lacks %q:\n%s", want, j.Trace)
		}
	}
	if j.Status != StatusSuccess || j.ExitCode == nil || *j.ExitCode != 0 || j.RunnerID != r.ID {
		t.Fatalf("job: %+v", j)
	}

	pl, err = w.sim.CreatePipeline(PipelineRequest{Project: "acme/platform/app", Jobs: []JobConfig{{Name: "broken", Tags: []string{"hyperfleet"}, Script: []string{"echo before", "exit 3", "echo never"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if stderr, err := runStandIn(t, bin, url, r.Token); err != nil {
		t.Fatalf("stand-in on a failing job (run-single exits 0 after its job): %v\n%s", err, stderr)
	}
	j, _ = w.sim.Job(pl.Jobs[0])
	if j.Status != StatusFailed || j.ExitCode == nil || *j.ExitCode != 3 || j.FailureReason != "script_failure" ||
		!strings.Contains(j.Trace, "before\n") || strings.Contains(j.Trace, "never") || !strings.Contains(j.Trace, "ERROR: Job failed: exit status 3\n") {
		t.Fatalf("failed job: %+v", j)
	}

	if _, err := w.client(t, groupToken).Runners.DeleteRegisteredRunnerByID(r.ID); err != nil {
		t.Fatal(err)
	}
	stderr, err := runStandIn(t, bin, url, r.Token)
	if err == nil || !strings.Contains(stderr, "is removed") {
		t.Fatalf("stand-in with a deleted runner's token: %v\n%s", err, stderr)
	}
}

// TestStandInStopsCanceledJob cancels a running job through REST: the
// stand-in learns it from the answer to its next trace patch or heartbeat
// (403 with Job-Status: canceled), stops the script and exits.
func TestStandInStopsCanceledJob(t *testing.T) {
	w := newWorld(t)
	bin := w.standIn(t)
	r := w.createRunner(t, adminPAT, &gitlab.CreateUserRunnerOptions{RunnerType: ptr(InstanceType)})
	pidFile := filepath.Join(t.TempDir(), "sleep.pid")
	pl, err := w.sim.CreatePipeline(PipelineRequest{Project: "acme/web", User: "owner", Jobs: []JobConfig{{Name: "slow", Script: []string{"sleep 20 & echo $! > " + pidFile, "echo started", "wait"}}}})
	if err != nil {
		t.Fatal(err)
	}
	owner := w.client(t, ownerPAT)
	go func() {
		for range 100 {
			if j, _ := w.sim.Job(pl.Jobs[0]); strings.Contains(j.Trace, "started") {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if _, _, err := owner.Jobs.CancelJob("acme/web", pl.Jobs[0]); err != nil {
			t.Errorf("cancel: %v", err)
		}
	}()
	start := time.Now()
	if stderr, err := runStandIn(t, bin, w.srv.URL, r.Token); err != nil {
		t.Fatalf("stand-in: %v\n%s", err, stderr)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("stand-in took %v to stop a canceled job", d)
	}
	if j, _ := w.sim.Job(pl.Jobs[0]); j.Status != StatusCanceled {
		t.Fatalf("job: %+v", j)
	}
	raw, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatal("the canceled script's child kept running")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
