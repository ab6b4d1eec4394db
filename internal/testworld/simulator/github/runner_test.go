package githubsim

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/procgroup"
)

// tlsFixture runs the simulator on the real clock behind HTTPS with a
// certificate from SelfSignedCertificate, so the runner scripts talk to it
// exactly as they would to the standalone binary.
type tlsFixture struct {
	*fixture
	caPEM []byte
}

func newTLSFixture(t *testing.T, mutate ...func(*Config)) *tlsFixture {
	t.Helper()
	for _, tool := range []string{"sh", "curl", "base64", "sed"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is required by the runner scripts (hack/test-deps.sh installs curl): %v", tool, err)
		}
	}
	cfg := testConfig(t)
	cfg.HeartbeatTimeout = Duration(2 * time.Second)
	for _, m := range mutate {
		m(&cfg)
	}
	cert, caPEM, err := SelfSignedCertificate("127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	sim, err := New(cfg, WithCACertificate(caPEM))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(sim)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	srv.Client().Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: pool}
	sim.SetServerURL(srv.URL)
	hooks := newHookReceiver(t)
	if _, err := sim.AddWebhook(Webhook{URL: hooks.srv.URL, Secret: hookSecret}); err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, sim: sim, srv: srv, hooks: hooks}
	t.Cleanup(func() {
		srv.Close()
		sim.Close()
	})
	return &tlsFixture{fixture: f, caPEM: caPEM}
}

// installRunner downloads and unpacks the runner package into a new
// directory.
func (f *tlsFixture) installRunner() string {
	f.t.Helper()
	resp, err := f.srv.Client().Get(f.srv.URL + "/_sim/runner/actions-runner-linux-x64.tar.gz")
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/gzip" {
		f.t.Fatalf("runner package: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	gz, err := gzip.NewReader(resp.Body)
	if err != nil {
		f.t.Fatal(err)
	}
	dir := f.t.TempDir()
	tr := tar.NewReader(gz)
	names := []string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			f.t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		if bytes.IndexByte(data, 0) >= 0 {
			f.t.Errorf("runner package file %s is binary", h.Name)
		}
		if err := os.WriteFile(filepath.Join(dir, h.Name), data, os.FileMode(h.Mode)); err != nil {
			f.t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	if strings.Join(names, ",") != "config.sh,run.sh,sim-ca.pem" {
		f.t.Fatalf("runner package holds %v", names)
	}
	return dir
}

// script runs one of the runner scripts in its own process group.
type script struct {
	cmd    *exec.Cmd
	leader *procgroup.Leader // the script leads its group
	out    *syncBuffer
	done   chan struct{}
	err    error
	killed bool
}

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

func startScript(t *testing.T, dir string, args ...string) *script {
	t.Helper()
	cmd := exec.Command("sh", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HF_SIM_POLL_WAIT=1", "HF_SIM_RETRIES=3", "HF_SIM_CA=")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	sc := &script{cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = sc.out, sc.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc.leader = procgroup.New(cmd)
	go func() {
		sc.err = sc.leader.Wait(procgroup.KillGroup)
		close(sc.done)
	}()
	t.Cleanup(func() { sc.kill() })
	return sc
}

// kill ends the script and its children (curl) at once.
func (sc *script) kill() {
	if sc.leader.Signal(syscall.SIGKILL) == nil {
		sc.killed = true
	}
	<-sc.done
}

// wait returns the exit code, failing the test after d.
func (sc *script) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-sc.done:
	case <-time.After(d):
		sc.kill()
		t.Fatalf("script did not exit within %s; output:\n%s", d, sc.out.String())
	}
	return sc.cmd.ProcessState.ExitCode()
}

func runScript(t *testing.T, dir string, args ...string) (int, string) {
	t.Helper()
	sc := startScript(t, dir, args...)
	code := sc.wait(t, 30*time.Second)
	checkShellErrors(t, sc.out.String())
	return code, sc.out.String()
}

// checkShellErrors fails on messages of the shell itself: the scripts
// must only print their own.
func checkShellErrors(t *testing.T, out string) {
	t.Helper()
	for _, bad := range []string{"Illegal option", ": not found", "syntax error", "unexpected", "Bad substitution", "parameter not set"} {
		if strings.Contains(out, bad) {
			t.Errorf("script output has a shell error (%q):\n%s", bad, out)
		}
	}
}

// runOneJob checks the life of a runner process that has been started:
// it comes online, takes exactly one job, reports the webhooks, exits 0,
// and is removed; the next job is not taken.
func runOneJob(t *testing.T, f *tlsFixture, sc *script, name string) {
	t.Helper()
	waitFor(t, 20*time.Second, name+" online", func() bool {
		r, ok := f.sim.RunnerByName(name)
		return ok && r.Status == "online"
	})
	job, err := f.sim.EnqueueJob(JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted", "hyperfleet"}, Duration: 700 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if code := sc.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("run.sh exited %d; output:\n%s", code, sc.out.String())
	}
	out := sc.out.String()
	checkShellErrors(t, out)
	for _, want := range []string{"√ Connected to GitHub", "Listening for Jobs", "Running job: build", "Job build completed with result: Succeeded"} {
		if !strings.Contains(out, want) {
			t.Errorf("run.sh output lacks %q:\n%s", want, out)
		}
	}
	got, _ := f.sim.Job(job.ID)
	if got.Status != "completed" || got.Conclusion != "success" || got.RunnerName != name {
		t.Errorf("job = %+v", got)
	}
	if _, ok := f.sim.RunnerByName(name); ok {
		t.Errorf("runner %s still registered after its job", name)
	}
	f.flush()
	hs := f.hooks.forJob(t, job.ID) // checks signatures
	if actions(hs) != "queued,in_progress,completed" || hs[1].runner != name || hs[2].runner != name {
		t.Errorf("webhooks = %s (runner %q)", actions(hs), hs[len(hs)-1].runner)
	}
	// The exited runner takes nothing more.
	next, err := f.sim.EnqueueJob(JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted", "hyperfleet"}, Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if got, _ := f.sim.Job(next.ID); got.Status != "queued" || got.RunnerID != 0 {
		t.Errorf("second job = %+v", got)
	}
}

func TestRunnerScriptsJIT(t *testing.T) {
	f := newTLSFixture(t)
	dir := f.installRunner()
	out := f.mustCall("POST", "/orgs/octo-org/actions/runners/generate-jitconfig", testPAT,
		map[string]any{"name": "jit-vm-1", "runner_group_id": 2, "labels": []string{"self-hosted", "Linux", "X64", "hyperfleet"}, "work_folder": "/tmp/w"}, 201)
	sc := startScript(t, dir, "./run.sh", "--jitconfig", out["encoded_jit_config"].(string))
	runOneJob(t, f, sc, "jit-vm-1")
	raw, err := os.ReadFile(filepath.Join(dir, ".runner"))
	if err != nil || !strings.Contains(string(raw), `"workFolder": "/tmp/w"`) || !strings.Contains(string(raw), f.srv.URL) {
		t.Errorf(".runner = %s (%v)", raw, err)
	}
}

func TestRunnerScriptsRegistrationToken(t *testing.T) {
	f := newTLSFixture(t)
	dir := f.installRunner()
	tok := f.mustCall("POST", "/repos/octo-org/app/actions/runners/registration-token", testPAT, nil, 201)["token"].(string)
	code, out := runScript(t, dir, "./config.sh", "--url", f.srv.URL+"/octo-org/app", "--token", tok, "--ephemeral", "--unattended",
		"--name", "reg-vm-1", "--labels", "hyperfleet,big", "--runnergroup", "Default", "--work", "_work", "--disableupdate")
	if code != 0 || !strings.Contains(out, "√ Runner successfully added") {
		t.Fatalf("config.sh exited %d:\n%s", code, out)
	}
	st, ok := f.sim.RunnerByName("reg-vm-1")
	if !ok || !st.Ephemeral || st.JIT || st.Status != "offline" || st.Scope != "octo-org/app" || strings.Join(st.Labels, ",") != "self-hosted,Linux,"+archLabel()+",hyperfleet,big" {
		t.Fatalf("registered runner = %+v", st)
	}
	for _, f := range []string{".runner", ".credentials", ".credentials_rsaparams"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v", f, fi, err)
		}
	}
	// Configuring twice fails like the real runner.
	if code, out := runScript(t, dir, "./config.sh", "--url", f.srv.URL+"/octo-org/app", "--token", tok, "--name", "x"); code != 1 || !strings.Contains(out, "already configured") {
		t.Errorf("second config.sh: %d %s", code, out)
	}
	sc := startScript(t, dir, "./run.sh")
	runOneJob(t, f, sc, "reg-vm-1")
}

func archLabel() string {
	out, _ := exec.Command("uname", "-m").Output()
	switch strings.TrimSpace(string(out)) {
	case "aarch64", "arm64":
		return "ARM64"
	}
	return "X64"
}

func TestRunnerScriptErrors(t *testing.T) {
	f := newTLSFixture(t)
	dir := f.installRunner()
	tok := f.mustCall("POST", "/repos/octo-org/app/actions/runners/registration-token", testPAT, nil, 201)["token"].(string)
	for name, tc := range map[string]struct {
		args []string
		code int
		msg  string
	}{
		"bad token":      {[]string{"./config.sh", "--url", f.srv.URL + "/octo-org/app", "--token", "NOPE", "--name", "a"}, 2, "registration token is not valid"},
		"wrong scope":    {[]string{"./config.sh", "--url", f.srv.URL + "/octo-org", "--token", tok, "--name", "a"}, 2, "issued for octo-org/app"},
		"no url":         {[]string{"./config.sh", "--token", tok}, 1, "--url is required"},
		"missing value":  {[]string{"./config.sh", "--url"}, 1, "--url needs a value"},
		"unknown option": {[]string{"./config.sh", "--bogus"}, 1, "unknown option --bogus"},
		"unreachable":    {[]string{"./config.sh", "--url", "https://127.0.0.1:1/octo-org", "--token", tok, "--name", "a"}, 3, "cannot reach"},
		"not configured": {[]string{"./run.sh"}, 1, "not configured"},
		"bad jitconfig":  {[]string{"./run.sh", "--jitconfig", "%%%"}, 1, "not valid base64"},
	} {
		code, out := runScript(t, dir, tc.args...)
		if code != tc.code || !strings.Contains(out, tc.msg) {
			t.Errorf("%s: exit %d, want %d with %q; output:\n%s", name, code, tc.code, tc.msg, out)
		}
	}
	// A JIT runner deleted before it starts is refused.
	out := f.mustCall("POST", "/repos/octo-org/app/actions/runners/generate-jitconfig", testPAT,
		map[string]any{"name": "gone", "runner_group_id": 1, "labels": []string{"self-hosted"}}, 201)
	id := int64(out["runner"].(map[string]any)["id"].(float64))
	f.mustCall("DELETE", "/repos/octo-org/app/actions/runners/"+itoa(id), testPAT, nil, 204)
	code, text := runScript(t, dir, "./run.sh", "--jitconfig", out["encoded_jit_config"].(string))
	if code != 2 || !strings.Contains(text, "has been removed") {
		t.Errorf("deleted runner: exit %d:\n%s", code, text)
	}
	_ = os.Remove(filepath.Join(dir, ".runner"))
}

func TestRunnerScriptCancelAndDeath(t *testing.T) {
	f := newTLSFixture(t)
	dir := f.installRunner()
	jit := func(name string) string {
		out := f.mustCall("POST", "/orgs/octo-org/actions/runners/generate-jitconfig", testPAT,
			map[string]any{"name": name, "runner_group_id": 1, "labels": []string{"self-hosted", "hyperfleet", name}}, 201)
		return out["encoded_jit_config"].(string)
	}
	// Cancelled: the runner sees it and exits 0.
	sc := startScript(t, dir, "./run.sh", "--jitconfig", jit("cancel-me"))
	waitFor(t, 20*time.Second, "runner online", func() bool { r, ok := f.sim.RunnerByName("cancel-me"); return ok && r.Status == "online" })
	job, _ := f.sim.EnqueueJob(JobRequest{Repository: "octo-org/app", Labels: []string{"cancel-me"}, Duration: time.Hour})
	waitFor(t, 20*time.Second, "job running", func() bool { j, _ := f.sim.Job(job.ID); return j.Status == "in_progress" })
	f.mustCall("POST", "/repos/octo-org/app/actions/runs/"+itoa(job.RunID)+"/cancel", testPAT, nil, 202)
	if code := sc.wait(t, 20*time.Second); code != 0 || !strings.Contains(sc.out.String(), "completed with result: Canceled") {
		t.Errorf("cancelled: exit %d:\n%s", code, sc.out.String())
	}

	// Killed while running a job: offline after the heartbeat timeout,
	// and the job fails.
	dir2 := f.installRunner()
	sc = startScript(t, dir2, "./run.sh", "--jitconfig", jit("doomed"))
	waitFor(t, 20*time.Second, "runner online", func() bool { r, ok := f.sim.RunnerByName("doomed"); return ok && r.Status == "online" })
	job, _ = f.sim.EnqueueJob(JobRequest{Repository: "octo-org/app", Labels: []string{"doomed"}, Duration: time.Hour})
	waitFor(t, 20*time.Second, "job running", func() bool { j, _ := f.sim.Job(job.ID); return j.Status == "in_progress" })
	sc.kill()
	waitFor(t, 20*time.Second, "job failed", func() bool { j, _ := f.sim.Job(job.ID); return j.Status == "completed" })
	if j, _ := f.sim.Job(job.ID); j.Conclusion != "failure" {
		t.Errorf("job of killed runner = %+v", j)
	}
	// An idle runner that is killed goes offline and stays registered.
	dir3 := f.installRunner()
	sc = startScript(t, dir3, "./run.sh", "--jitconfig", jit("idle-killed"))
	waitFor(t, 20*time.Second, "runner online", func() bool { r, ok := f.sim.RunnerByName("idle-killed"); return ok && r.Status == "online" })
	sc.kill()
	waitFor(t, 20*time.Second, "runner offline", func() bool { r, ok := f.sim.RunnerByName("idle-killed"); return ok && r.Status == "offline" })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = f.sim.FlushWebhooks(ctx)
}
