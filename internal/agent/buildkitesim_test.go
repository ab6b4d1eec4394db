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
// waits.
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
}
