//go:build !windows

package agent

import (
	"context"
	"encoding/pem"
	"errors"
	"io/fs"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gitlab "gitlab.com/gitlab-org/api/client-go"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	gitlabsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/gitlab"
)

// TestGitLabSimulator runs the agent of a platform gitlab-ci VM against the
// GitLab simulator with its gitlab-runner stand-in (the real runner cannot
// be built here, docs/gitlab.md), downloaded as GitLab publishes the bare
// binary and checked against its SHA-256: the agent runs `gitlab-runner
// run-single` with the runner authentication token placed as the operator
// places it, the runner takes the one job for its tags, runs the real shell
// script and exits; the agent removes the downloaded runner, empties the
// builds directory and powers off, and the token is nowhere on the VM's
// disk nor in the log. A second VM holding the token of a deleted runner
// cannot take a job: the agent exits ExitRunnerFailed and the job waits.
//
// Not parallel: it sets SSL_CERT_FILE (the simulator's CA), which the
// agent's download client and the stand-in's curl trust.
func TestGitLabSimulator(t *testing.T) {
	const adminPAT = "glpat-agenttest000000000000"
	sim, err := gitlabsim.New(gitlabsim.Config{
		Projects: []gitlabsim.ProjectConfig{{Path: "acme/app"}},
		Users:    []gitlabsim.UserConfig{{Username: "root", Admin: true}},
		Tokens:   []gitlabsim.TokenConfig{{Token: adminPAT, User: "root", Scopes: []string{"api"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(sim)
	t.Cleanup(func() { srv.Close(); sim.Close() })
	caFile := filepath.Join(t.TempDir(), "sim-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SSL_CERT_FILE", caFile)
	t.Setenv("HF_SIM_POLL_INTERVAL", "0.1")
	api, err := gitlab.NewClient(adminPAT, gitlab.WithBaseURL(srv.URL+"/api/v4"), gitlab.WithHTTPClient(srv.Client()), gitlab.WithoutRetries())
	if err != nil {
		t.Fatal(err)
	}
	newRunner := func(name string) *gitlab.UserRunner {
		r, _, err := api.Users.CreateUserRunner(&gitlab.CreateUserRunnerOptions{RunnerType: gitlab.Ptr("instance_type"), Description: gitlab.Ptr(name), TagList: gitlab.Ptr([]string{"hyperfleet"})})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	_, sum := gitlabsim.RunnerStandIn()
	config := func(v *vm, name string) *agentconfig.Config {
		c := v.baseConfig()
		c.Platform, c.BootstrapMethod, c.RegistrationURL = agentconfig.PlatformGitLabCI, agentconfig.BootstrapRunnerAuthToken, srv.URL
		c.Runner = agentconfig.Runner{Name: name, Software: agentconfig.Software{
			DownloadURL: srv.URL + "/_sim/gitlab-runner/gitlab-runner-linux-amd64", DownloadSHA256: sum,
			InstallPath: "/opt/gitlab-runner", RunScript: "gitlab-runner", WorkDir: "/var/lib/hyperfleet/builds", OS: "linux", Arch: "amd64",
		}}
		v.opts.IdleTimeout, v.opts.DownloadTimeout = 20*time.Second, time.Minute
		return c
	}

	pl, err := sim.CreatePipeline(gitlabsim.PipelineRequest{Project: "acme/app", Jobs: []gitlabsim.JobConfig{{
		Name: "build", Tags: []string{"hyperfleet"}, Script: []string{`echo "hello from $CI_JOB_NAME on $(uname -s)"`, `echo "building in $PWD"`},
	}}})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("one job", func(t *testing.T) {
		r := newRunner("vm-1")
		v := newVM(t)
		v.secret = r.Token
		v.writeConfig(config(v, "vm-1"))
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		v.checkCommon(v.run(ctx), ExitOK, 1)
		j, _ := sim.Job(pl.Jobs[0])
		if j.Status != gitlabsim.StatusSuccess || j.RunnerID != r.ID || j.ExitCode == nil || *j.ExitCode != 0 {
			t.Fatalf("job = %+v; agent log:\n%s", j, v.log.String())
		}
		if !strings.Contains(j.Trace, "hello from build on Linux") || !strings.Contains(j.Trace, "building in "+filepath.Join(v.root, "/var/lib/hyperfleet/builds")) {
			t.Errorf("the job's trace lacks the script's output:\n%s", j.Trace)
		}
		if _, err := os.Lstat(filepath.Join(v.root, "/opt/gitlab-runner")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("downloaded runner not removed: %v", err)
		}
		if entries, err := os.ReadDir(filepath.Join(v.root, "/var/lib/hyperfleet/builds")); err != nil || len(entries) != 0 {
			t.Errorf("builds directory not emptied: %v %v", entries, err)
		}
		for _, want := range []string{"runner package verified", "runner binary installed", "starting gitlab-runner run-single"} {
			if !strings.Contains(v.log.String(), want) {
				t.Errorf("log lacks %q", want)
			}
		}
		// Scrubbed: no file left in the VM holds the token.
		_ = filepath.WalkDir(v.root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				if b, _ := os.ReadFile(p); strings.Contains(string(b), r.Token) {
					t.Errorf("%s holds the runner token after the job", p)
				}
			}
			return nil
		})
	})

	t.Run("deleted runner", func(t *testing.T) {
		r := newRunner("vm-2")
		if _, err := api.Runners.DeleteRegisteredRunnerByID(r.ID); err != nil {
			t.Fatal(err)
		}
		waiting, err := sim.CreatePipeline(gitlabsim.PipelineRequest{Project: "acme/app", Jobs: []gitlabsim.JobConfig{{Name: "never", Tags: []string{"hyperfleet"}, Script: []string{"echo never"}}}})
		if err != nil {
			t.Fatal(err)
		}
		v := newVM(t)
		v.secret = r.Token
		v.writeConfig(config(v, "vm-2"))
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		v.checkCommon(v.run(ctx), ExitRunnerFailed, 1)
		if !strings.Contains(v.log.String(), "is removed") {
			t.Errorf("the runner did not fail for its deleted runner:\n%s", v.log.String())
		}
		if j, _ := sim.Job(waiting.Jobs[0]); j.Status != gitlabsim.StatusPending || j.RunnerID != 0 {
			t.Errorf("a job ran with a deleted runner's token: %+v", j)
		}
	})
}
