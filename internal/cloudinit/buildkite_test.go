package cloudinit

import (
	"slices"
	"strings"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite/buildkitevm"
)

// TestBuildkiteAgentConfig: a buildkite VM's agent.json names the platform,
// the agent-token method, the agent API endpoint and the agent's tags, and
// carries no token (it arrives in the running VM); a VM made for one job
// takes the job-token method and names the job.
func TestBuildkiteAgentConfig(t *testing.T) {
	v := baseVars()
	v.Platform, v.BootstrapMethod = PlatformBuildkite, BootstrapAgentToken
	v.RegistrationURL = "https://agent.buildkite.com/v3"
	// As the claim controller gives them: the routing marks first.
	v.Labels = List{"self-hosted", "hyperfleet", "queue=linux", "os=linux", "queue:default"}
	v.RunnerGroup = ""
	v.RunnerConfig = RunnerConfig{InstallPath: "/usr/local/bin", RunScript: "buildkite-agent", WorkDir: "/var/lib/hyperfleet/builds", OS: "linux", Arch: "amd64"}
	cfg := renderedAgentConfig(t, v)
	if cfg.Platform != buildkitevm.Platform || cfg.BootstrapMethod != buildkitevm.MethodAgentToken ||
		cfg.RegistrationURL != v.RegistrationURL || !slices.Equal(cfg.Runner.Labels, []string{"queue=linux", "os=linux"}) ||
		cfg.Runner.Software.RunScript != "buildkite-agent" || cfg.SecretsFile != agentconfig.SecretsFile || cfg.RegistrationToken != "" {
		t.Fatalf("agent.json: %+v", cfg)
	}

	// A VM made for one job: the job-token method and the job to acquire.
	bound := v
	bound.AcquireJob = "0190a3b2-6c1e-4a8f-9d2b-3e4f5a6b7c8d"
	cfg = renderedAgentConfig(t, bound)
	if cfg.BootstrapMethod != buildkitevm.MethodJobToken || cfg.Runner.AcquireJob != bound.AcquireJob {
		t.Fatalf("agent.json of a bound VM: %+v", cfg)
	}
	// A warm VM: job-token, and the job comes with the credential.
	warm := v
	warm.BootstrapMethod = BootstrapJobToken
	cfg = renderedAgentConfig(t, warm)
	if cfg.BootstrapMethod != buildkitevm.MethodJobToken || cfg.Runner.AcquireJob != "" {
		t.Fatalf("agent.json of a warm VM: %+v", cfg)
	}
	bound.AcquireJob = "42"
	if _, err := Render(Input{Vars: bound}); err == nil || !strings.Contains(err.Error(), "acquireJob: \"42\" is not a Buildkite job UUID") {
		t.Errorf("a bound VM with a malformed job: %v", err)
	}

	v.BootstrapMethod = BootstrapJITConfig
	if _, err := Render(Input{Vars: v}); err == nil || !strings.Contains(err.Error(), `must be "agent-token" or "job-token" with Platform buildkite`) {
		t.Errorf("a buildkite VM with a GitHub method: %v", err)
	}
}
