//go:build !windows

package agent

import (
	"context"
	"encoding/pem"
	"errors"
	"io/fs"
	"net/http/httptest"
	"os"
	osuser "os/user"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	gitlab "gitlab.com/gitlab-org/api/client-go"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	gitlabsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/gitlab"
	"github.com/hyperfleet/hyperfleet/pkg/workload/gitlab/gitlabvm"
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
	gw := startGitLabWorld(t, "glpat-agenttest000000000000")
	sim, api := gw.sim, gw.api
	newRunner := func(name string) *gitlab.UserRunner {
		r, _, err := api.Users.CreateUserRunner(&gitlab.CreateUserRunnerOptions{RunnerType: gitlab.Ptr("instance_type"), Description: gitlab.Ptr(name), TagList: gitlab.Ptr([]string{"hyperfleet"})})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	config := gw.vmConfig

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
		v.checkNoFileHolds(r.Token)
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

// TestGitLabJobRunsAsTheRunnerUser performs the attack of a job that
// copies its runner's token, in a VM whose agent runs as root with a
// runner user (--run-as, here nobody): the agent runs `gitlab-runner run
// --user <runner user>` as root, its token in a config file only root
// reads, and the job, run as the runner user, looks for the token where
// it would find it: in its environment, in that config file, in the
// runner's environment (/proc/<pid>/environ). It finds it nowhere, the
// job succeeds, a second job queued for the same tags stays for another
// VM (the agent stopped the runner asking at its first job), and the
// config is gone afterwards. The same runner with the agent's own user
// (--run-as "", run-single) hands the job the token in its environment
// and its own: the check can fail. Needs root, as a VM's agent runs.
//
// Not parallel: it sets SSL_CERT_FILE, as TestGitLabSimulator does.
func TestGitLabJobRunsAsTheRunnerUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("running the job as another user needs root, as the VM's agent runs")
	}
	nobody, err := osuser.Lookup("nobody")
	if err != nil {
		t.Skipf("no user nobody to run the job as: %v", err)
	}
	gw := startGitLabWorld(t, "glpat-agentjobuser00000000")
	sim, api := gw.sim, gw.api

	// The markers are split in the script, whose commands the trace
	// echoes, so that only their output holds them whole.
	steal := []string{
		`echo "uid=$(id -u)"`,
		`if env | grep -q glrt-; then echo "STOLEN""-FROM-ENVIRONMENT"; fi`,
		`if grep -qs glrt- "$HF_CONFIG"; then echo "STOLEN""-FROM-CONFIG"; else echo "config refused or absent"; fi`,
		`for p in /proc/[0-9]*; do if tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -q 'gitlab-runner run'; then if tr '\0' '\n' <"$p/environ" 2>/dev/null | grep -q .; then echo "ENVIRON-OF-RUNNER""-READ ${p#/proc/}"; else echo "environ of runner ${p#/proc/} refused"; fi; fi; done`,
	}
	for _, tc := range []struct {
		name, runAs, uid string
		stolen           []string
	}{
		{name: "runner user", runAs: "nobody", uid: nobody.Uid},
		{name: "agent's own user", runAs: "", uid: "0", stolen: []string{"STOLEN-FROM-ENVIRONMENT", "ENVIRON-OF-RUNNER-READ"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _, err := api.Users.CreateUserRunner(&gitlab.CreateUserRunnerOptions{RunnerType: gitlab.Ptr("instance_type"), Description: gitlab.Ptr("vm-" + tc.uid), TagList: gitlab.Ptr([]string{"job-user-" + tc.uid})})
			if err != nil {
				t.Fatal(err)
			}
			v := newVM(t)
			// The job knows where the agent writes gitlab-runner's config.
			config := filepath.Join(v.root, gitlabConfigDir, "config.toml")
			queue := func() int64 {
				pl, err := sim.CreatePipeline(gitlabsim.PipelineRequest{Project: "acme/app", Jobs: []gitlabsim.JobConfig{{Name: "steal", Tags: []string{"job-user-" + tc.uid},
					Variables: map[string]string{"HF_CONFIG": config}, Script: steal}}})
				if err != nil {
					t.Fatal(err)
				}
				return pl.Jobs[0]
			}
			first, second := queue(), queue()
			v.opts.RunAs = tc.runAs
			// The runner user reaches its builds directory under the
			// test's root, as it does under / in a VM.
			for _, d := range []string{v.root, filepath.Dir(v.root)} {
				if err := os.Chmod(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			v.secret = r.Token
			v.writeConfig(gw.vmConfig(v, "vm"))
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			v.checkCommon(v.run(ctx), ExitOK, 1)
			j, _ := sim.Job(first)
			if j.Status != gitlabsim.StatusSuccess || j.RunnerID != r.ID {
				t.Fatalf("job = %+v; agent log:\n%s", j, v.log.String())
			}
			if !strings.Contains(j.Trace, "uid="+tc.uid+"\n") || !strings.Contains(j.Trace, "of runner") && tc.runAs != "" {
				t.Errorf("the job did not run as uid %s, or found no runner process to try:\n%s", tc.uid, j.Trace)
			}
			for _, marker := range []string{"STOLEN-FROM-ENVIRONMENT", "STOLEN-FROM-CONFIG", "ENVIRON-OF-RUNNER-READ"} {
				if want := slices.Contains(tc.stolen, marker); strings.Contains(j.Trace, marker) != want {
					t.Errorf("%s in the job's trace: %v, want %v:\n%s", marker, !want, want, j.Trace)
				}
			}
			if j, _ := sim.Job(second); j.Status != gitlabsim.StatusPending {
				t.Errorf("the second job: %s on runner %d, want pending (one job per VM)", j.Status, j.RunnerID)
			}
			if tc.runAs != "" {
				for _, want := range []string{"starting gitlab-runner run for one job", "job started", "runner config removed"} {
					if !strings.Contains(v.log.String(), want) {
						t.Errorf("log lacks %q", want)
					}
				}
			}
			v.checkNoFileHolds(r.Token)
			if err := sim.CancelJob(second); err != nil {
				t.Fatal(err)
			}
		})
	}

	// `run` keeps asking with a refused token; the agent stops it at the
	// first refusal.
	t.Run("deleted runner", func(t *testing.T) {
		r, _, err := api.Users.CreateUserRunner(&gitlab.CreateUserRunnerOptions{RunnerType: gitlab.Ptr("instance_type"), Description: gitlab.Ptr("vm-gone"), TagList: gitlab.Ptr([]string{"gone"})})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := api.Runners.DeleteRegisteredRunnerByID(r.ID); err != nil {
			t.Fatal(err)
		}
		v := newVM(t)
		v.opts.RunAs = "nobody"
		v.secret = r.Token
		v.writeConfig(gw.vmConfig(v, "vm"))
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		v.checkCommon(v.run(ctx), ExitRunnerFailed, 1)
		if !strings.Contains(v.log.String(), "GitLab refused the runner's token") {
			t.Errorf("the agent did not say the token was refused:\n%s", v.log.String())
		}
		if _, err := os.Stat(filepath.Join(v.root, gitlabConfigDir)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the runner's config is left: %v", err)
		}
	})
}

// gitlabWorld is the GitLab simulator behind TLS, with an administrator's
// client and the stand-in's SHA-256, for the agent's GitLab tests.
type gitlabWorld struct {
	sim *gitlabsim.Simulator
	url string
	api *gitlab.Client
	sum string
}

// startGitLabWorld starts the simulator (project acme/app, an
// administrator with token adminPAT) and sets SSL_CERT_FILE to its CA,
// which the agent's download client and the stand-in's curl trust: a test
// that calls it is not parallel. The CA is in a directory any user
// passes, as a VM's CA bundle is readable by all.
func startGitLabWorld(t *testing.T, adminPAT string) *gitlabWorld {
	t.Helper()
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
	caDir := t.TempDir()
	for _, d := range []string{caDir, filepath.Dir(caDir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	caFile := filepath.Join(caDir, "sim-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SSL_CERT_FILE", caFile)
	t.Setenv("HF_SIM_POLL_INTERVAL", "0.1")
	api, err := gitlab.NewClient(adminPAT, gitlab.WithBaseURL(srv.URL+"/api/v4"), gitlab.WithHTTPClient(srv.Client()), gitlab.WithoutRetries())
	if err != nil {
		t.Fatal(err)
	}
	_, sum := gitlabsim.RunnerStandIn()
	return &gitlabWorld{sim: sim, url: srv.URL, api: api, sum: sum}
}

// vmConfig is the config of a gitlab-ci VM whose runner is called name,
// downloading the stand-in as GitLab publishes the runner; it sets v's
// timeouts for the simulator's pace.
func (w *gitlabWorld) vmConfig(v *vm, name string) *agentconfig.Config {
	c := v.baseConfig()
	c.Platform, c.BootstrapMethod, c.RegistrationURL = gitlabvm.Platform, gitlabvm.MethodRunnerAuthToken, w.url
	c.Runner = agentconfig.Runner{Name: name, Software: agentconfig.Software{
		DownloadURL: w.url + "/_sim/gitlab-runner/gitlab-runner-linux-amd64", DownloadSHA256: w.sum,
		InstallPath: "/opt/gitlab-runner", RunScript: "gitlab-runner", WorkDir: "/var/lib/hyperfleet/builds", OS: "linux", Arch: "amd64",
	}}
	v.opts.IdleTimeout, v.opts.DownloadTimeout = 20*time.Second, time.Minute
	return c
}

// checkNoFileHolds fails the test for every file left in the VM that
// holds secret.
func (v *vm) checkNoFileHolds(secret string) {
	v.t.Helper()
	_ = filepath.WalkDir(v.root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if b, _ := os.ReadFile(p); strings.Contains(string(b), secret) {
				v.t.Errorf("%s holds the runner token after the job", p)
			}
		}
		return nil
	})
}
