//go:build !windows

package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	buildkitesim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite/buildkitesimtest"
)

// TestBuildkiteSimulator runs the agent of a platform buildkite VM against
// the Buildkite simulator with the real buildkite-agent (hack/buildkite-agent),
// downloaded as the simulator's release tarball and checked against its
// SHA-256: the agent registers with the VM's cluster agent token (placed
// as the operator places it), takes one job of its queue, runs the real
// shell command, and exits; the agent reports the job, removes the
// downloaded agent, empties the build path and powers off. The token never
// appears on a command line or in the log. A second VM whose token was
// deleted cannot register: the agent exits ExitRunnerFailed and the job
// waits. A VM made for a job gets a job acquisition token and runs
// buildkite-agent with --acquire-job: it takes that job although another
// job of its queue came first, and a token for another job acquires
// nothing (the real agent exits 27, the agent ExitRunnerFailed).
//
// Not parallel: it sets SSL_CERT_FILE (the simulator's CA), which the
// agent's download client and buildkite-agent trust.
func TestBuildkiteSimulator(t *testing.T) {
	bk := buildkitesimtest.Start(t, buildkitesim.Config{})
	caFile := filepath.Join(t.TempDir(), "sim-ca.pem")
	if err := os.WriteFile(caFile, bk.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SSL_CERT_FILE", caFile)
	cluster := bk.Sim.CreateCluster("hyperfleet")
	if _, err := bk.Sim.CreateQueue(cluster.ID, "linux"); err != nil {
		t.Fatal(err)
	}
	if err := bk.Sim.CreatePipeline("app", cluster.ID); err != nil {
		t.Fatal(err)
	}
	sum, err := bk.Sim.AgentTarballSHA256()
	if err != nil {
		t.Fatal(err)
	}
	pkgURL := bk.URL + "/_sim/agent/" + buildkitesim.TarballName(bk.Sim.AgentVersion())

	config := func(v *vm, name string) *agentconfig.Config {
		c := v.baseConfig()
		c.Platform, c.BootstrapMethod = agentconfig.PlatformBuildkite, agentconfig.BootstrapAgentToken
		c.RegistrationURL = bk.URL + "/v3"
		c.Runner = agentconfig.Runner{Name: name, Labels: []string{"queue=linux", "os=linux"}, Software: agentconfig.Software{
			DownloadURL: pkgURL, DownloadSHA256: sum, InstallPath: "/opt/buildkite-agent", RunScript: "buildkite-agent",
			WorkDir: "/var/lib/hyperfleet/builds", OS: "linux", Arch: "amd64",
		}}
		v.opts.IdleTimeout, v.opts.DownloadTimeout = time.Minute, time.Minute
		return c
	}

	build, err := bk.Sim.CreateBuild("app", "agent test", []buildkitesim.Step{
		{Key: "hello", Command: `echo "hello from $(uname -s)"; test -d "$PWD"`, Agents: []string{"queue=linux", "os=linux"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	job := build.JobIDs[0]

	t.Run("one job", func(t *testing.T) {
		tok, err := bk.Sim.CreateToken(cluster.ID, "hyperfleet agent vm-1", time.Now().Add(30*time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		v := newVM(t)
		v.secret = tok.Secret
		v.writeConfig(config(v, "vm-1"))
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		code := v.run(ctx)
		v.checkCommon(code, ExitOK, 1)
		info, _ := bk.Sim.Job(job)
		if info.State != "passed" || info.ExitStatus == nil || *info.ExitStatus != 0 || info.Agent != "vm-1" {
			t.Fatalf("job = %+v; agent log:\n%s", info, v.log.String())
		}
		if !strings.Contains(info.Log, "hello from Linux") {
			t.Errorf("the job's log lacks the command's output:\n%s", info.Log)
		}
		if _, err := os.Lstat(filepath.Join(v.root, "/opt/buildkite-agent")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("downloaded agent not removed: %v", err)
		}
		if entries, err := os.ReadDir(filepath.Join(v.root, "/var/lib/hyperfleet/builds")); err != nil || len(entries) != 0 {
			t.Errorf("build path not emptied: %v %v", entries, err)
		}
		log := v.log.String()
		for _, want := range []string{"runner package verified", "buildkite-agent online", "job started", "Finished job", "downloaded runner removed"} {
			if !strings.Contains(log, want) {
				t.Errorf("log lacks %q", want)
			}
		}
		if strings.Contains(log, tok.Secret) {
			t.Error("the agent token is in the log")
		}
		for _, a := range bk.Sim.Agents() {
			if a.Name == "vm-1" && a.State != "disconnected" {
				t.Errorf("agent vm-1 is %s after its job", a.State)
			}
		}
	})

	t.Run("deleted token", func(t *testing.T) {
		tok, err := bk.Sim.CreateToken(cluster.ID, "hyperfleet agent vm-2", time.Now().Add(30*time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if err := bk.Sim.DeleteToken(cluster.ID, tok.ID); err != nil {
			t.Fatal(err)
		}
		waiting, err := bk.Sim.CreateBuild("app", "never run", []buildkitesim.Step{{Key: "w", Command: "echo never", Agents: []string{"queue=linux"}}})
		if err != nil {
			t.Fatal(err)
		}
		v := newVM(t)
		v.secret = tok.Secret
		v.writeConfig(config(v, "vm-2"))
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		code := v.run(ctx)
		v.checkCommon(code, ExitRunnerFailed, 1)
		if info, _ := bk.Sim.Job(waiting.JobIDs[0]); info.State != "scheduled" || info.Agent != "" {
			t.Errorf("a job ran with a deleted token: %+v", info)
		}
		if strings.Contains(v.log.String(), tok.Secret) {
			t.Error("the agent token is in the log")
		}
	})

	// A VM made for a job: a job acquisition token for the second job of
	// a build and --acquire-job, so the agent takes that job although the
	// first one matches it as well, and takes nothing else.
	jobConfig := func(v *vm, name, acquire string) *agentconfig.Config {
		c := config(v, name)
		c.BootstrapMethod, c.Runner.AcquireJob = agentconfig.BootstrapJobToken, acquire
		return c
	}
	issuer, err := bk.Sim.CreateToken(cluster.ID, "hyperfleet agent stack", time.Now().Add(30*time.Minute))
	if err != nil {
		t.Fatal(err)
	}

	t.Run("acquire job", func(t *testing.T) {
		b, err := bk.Sim.CreateBuild("app", "bound", []buildkitesim.Step{
			{Key: "first", Command: "echo first", Agents: []string{"queue=linux"}},
			{Key: "second", Command: "echo second job", Agents: []string{"queue=linux"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		jat, err := bk.Sim.IssueJobToken(issuer.Secret, "linux", b.JobIDs[1], 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		v := newVM(t)
		v.secret = jat
		v.writeConfig(jobConfig(v, "vm-3", b.JobIDs[1]))
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		code := v.run(ctx)
		v.checkCommon(code, ExitOK, 1)
		if info, _ := bk.Sim.Job(b.JobIDs[1]); info.State != "passed" || info.Agent != "vm-3" || !strings.Contains(info.Log, "second job") {
			t.Fatalf("bound job = %+v; agent log:\n%s", info, v.log.String())
		}
		if info, _ := bk.Sim.Job(b.JobIDs[0]); info.State != "scheduled" || info.Agent != "" {
			t.Errorf("the agent of a job token took another job: %+v", info)
		}
		if strings.Contains(v.log.String(), jat) {
			t.Error("the job token is in the log")
		}
		if log := v.log.String(); !strings.Contains(log, "job started") || strings.Contains(log, "without a line saying its job started") {
			t.Errorf("the agent did not see the acquired job start:\n%s", log)
		}
	})

	t.Run("token for another job", func(t *testing.T) {
		b, err := bk.Sim.CreateBuild("app", "mismatch", []buildkitesim.Step{
			{Key: "x", Command: "echo x", Agents: []string{"queue=linux"}},
			{Key: "y", Command: "echo y", Agents: []string{"queue=linux"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		jat, err := bk.Sim.IssueJobToken(issuer.Secret, "linux", b.JobIDs[0], 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		v := newVM(t)
		v.secret = jat
		v.writeConfig(jobConfig(v, "vm-4", b.JobIDs[1]))
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		code := v.run(ctx)
		v.checkCommon(code, ExitRunnerFailed, 1)
		for _, id := range b.JobIDs {
			if info, _ := bk.Sim.Job(id); info.State != "scheduled" || info.Agent != "" {
				t.Errorf("a job ran with a token for another job: %+v", info)
			}
		}
	})
}
