//go:build !windows

package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github/githubvm"
)

const simPAT = "ghp_agentTest000000000000000000000000000"

// simCall calls the simulator's REST API with the PAT and decodes the
// JSON answer, which must have status want.
func simCall(t *testing.T, gs *githubsimtest.Server, method, path string, body any, want int) map[string]any {
	t.Helper()
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, gs.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "token "+simPAT)
	req.Header.Set("Accept", "application/vnd.github+json")
	resp, err := gs.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("%s %s: HTTP %d, want %d: %s", method, path, resp.StatusCode, want, raw)
	}
	out := map[string]any{}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s: %v: %s", method, path, err, raw)
	}
	return out
}

// TestGitHubSimulator runs the agent against the GitHub simulator with the
// simulator's own runner package, downloaded over HTTPS and checked
// against its SHA-256, in both bootstrap methods: the runner comes
// online, runs the job it is given, exits, and is gone from the
// simulator; the agent cleans up and powers off.
//
// Not parallel: it sets SSL_CERT_FILE (the simulator's CA), which the
// agent's default HTTP client trusts.
func TestGitHubSimulator(t *testing.T) {
	for _, tool := range []string{"sh", "curl", "base64", "sed"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is required by the simulator's runner scripts (make test-deps installs curl): %v", tool, err)
		}
	}
	gs, pkgURL, pkgSHA := startRunnerSimulator(t)

	// runJob runs the agent with c until the simulator job for label has
	// run on runner name, and checks the outcome.
	runJob := func(t *testing.T, v *vm, c *agentconfig.Config, name, label string) {
		t.Helper()
		c.Runner.Software.DownloadURL, c.Runner.Software.DownloadSHA256 = pkgURL, pkgSHA
		v.writeConfig(c)
		v.opts.IdleTimeout = time.Minute
		v.opts.DownloadTimeout = time.Minute
		job, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted", label}, Duration: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan int, 1)
		go func() { done <- v.run(ctx) }()

		// The job runs until the simulator completes it.
		deadline := time.Now().Add(60 * time.Second)
		for {
			j, _ := gs.Sim.Job(job.ID)
			if j.Status == "in_progress" {
				if j.RunnerName != name {
					t.Fatalf("job taken by %q, want %q", j.RunnerName, name)
				}
				break
			}
			select {
			case code := <-done:
				t.Fatalf("agent exited %d before the job started (job %+v)", code, j)
			case <-time.After(50 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				cancel()
				<-done
				t.Fatalf("the runner did not take the job: %+v", j)
			}
		}
		if err := gs.Sim.CompleteJob(job.ID, "success"); err != nil {
			t.Fatal(err)
		}
		var code int
		select {
		case code = <-done:
		case <-time.After(60 * time.Second):
			cancel()
			code = <-done
			t.Errorf("the agent did not finish after the job completed")
		}
		v.checkCommon(code, ExitOK, 1)
		if j, _ := gs.Sim.Job(job.ID); j.Status != "completed" || j.Conclusion != "success" || j.RunnerName != name {
			t.Errorf("job = %+v", j)
		}
		if r, ok := gs.Sim.RunnerByName(name); ok && !r.Removed {
			t.Errorf("runner still registered after its job: %+v", r)
		}
		if _, err := os.Lstat(v.install()); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("downloaded runner not removed: %v", err)
		}
		if entries, err := os.ReadDir(v.work()); err != nil || len(entries) != 0 {
			t.Errorf("work directory: %v %v", entries, err)
		}
		if left, _ := os.ReadDir(v.opts.TempDir); len(left) != 0 {
			t.Errorf("temporary files left: %v", left)
		}
		log := v.log.String()
		for _, want := range []string{"runner package verified", "runner online", "Running job: build", "Job build completed with result: Succeeded", "downloaded runner removed"} {
			if !strings.Contains(log, want) {
				t.Errorf("log lacks %q", want)
			}
		}
	}

	t.Run("jit-config", func(t *testing.T) {
		out := simCall(t, gs, "POST", "/orgs/octo-org/actions/runners/generate-jitconfig",
			map[string]any{"name": "agent-jit", "runner_group_id": 1, "labels": []string{"self-hosted", "hyperfleet", "agent-jit"}, "work_folder": "_work"}, 201)
		jit, _ := out["encoded_jit_config"].(string)
		if jit == "" {
			t.Fatalf("no encoded_jit_config: %v", out)
		}
		v := newVM(t)
		v.secret = jit
		c := v.baseConfig()
		runJob(t, v, c, "agent-jit", "agent-jit")
	})

	t.Run("runner-token", func(t *testing.T) {
		out := simCall(t, gs, "POST", "/repos/octo-org/app/actions/runners/registration-token", nil, 201)
		token, _ := out["token"].(string)
		if token == "" {
			t.Fatalf("no token: %v", out)
		}
		v := newVM(t)
		v.secret = token
		c := v.baseConfig()
		c.BootstrapMethod = githubvm.MethodRegistrationToken
		c.RegistrationURL = gs.URL + "/octo-org/app"
		c.Runner.Name, c.Runner.Labels = "agent-reg", []string{"hyperfleet", "agent-reg"}
		runJob(t, v, c, "agent-reg", "agent-reg")
		if !strings.Contains(v.log.String(), "runner registered") {
			t.Error("log lacks the registration")
		}
	})
}

// startRunnerSimulator starts the GitHub simulator for the agent's tests,
// trusted through SSL_CERT_FILE (so the test cannot be parallel), with
// short runner long-polls, and returns it with the URL and SHA-256 of its
// runner package.
func startRunnerSimulator(t *testing.T) (gs *githubsimtest.Server, pkgURL, pkgSHA string) {
	t.Helper()
	gs = githubsimtest.Start(t, githubsim.Config{
		Organizations:    []githubsim.OrgConfig{{Login: "octo-org"}},
		Repositories:     []githubsim.RepoConfig{{Name: "octo-org/app"}},
		PATs:             []githubsim.PATConfig{{Token: simPAT, Login: "octocat"}},
		HeartbeatTimeout: githubsim.Duration(10 * time.Second),
	})
	caFile := filepath.Join(t.TempDir(), "sim-ca.pem")
	if err := os.WriteFile(caFile, gs.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SSL_CERT_FILE", caFile)
	// Short long-polls, so a stopped runner does not linger in one.
	t.Setenv("HF_SIM_POLL_WAIT", "1")
	pkgURL = gs.URL + "/_sim/runner/actions-runner-linux-x64.tar.gz"
	resp, err := gs.Client().Get(pkgURL)
	if err != nil {
		t.Fatal(err)
	}
	pkg, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("runner package: HTTP %d, %v", resp.StatusCode, err)
	}
	sum := sha256.Sum256(pkg)
	return gs, pkgURL, hex.EncodeToString(sum[:])
}
