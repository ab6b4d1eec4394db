package cloudinit

import (
	"slices"
	"strings"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// TestBuildkiteAgentConfig: a buildkite VM's agent.json names the platform,
// the agent-token method, the agent API endpoint and the agent's tags, and
// carries no token (it arrives in the running VM).
func TestBuildkiteAgentConfig(t *testing.T) {
	v := baseVars()
	v.Platform, v.BootstrapMethod = PlatformBuildkite, BootstrapAgentToken
	v.RegistrationURL = "https://agent.buildkite.com/v3"
	// As the claim controller gives them: the routing marks first.
	v.Labels = List{"self-hosted", "hyperfleet", "queue=linux", "os=linux", "queue:default"}
	v.RunnerGroup = ""
	v.RunnerConfig = RunnerConfig{InstallPath: "/usr/local/bin", RunScript: "buildkite-agent", WorkDir: "/var/lib/hyperfleet/builds", OS: "linux", Arch: "amd64"}
	cfg := renderedAgentConfig(t, v)
	if cfg.Platform != agentconfig.PlatformBuildkite || cfg.BootstrapMethod != agentconfig.BootstrapAgentToken ||
		cfg.RegistrationURL != v.RegistrationURL || !slices.Equal(cfg.Runner.Labels, []string{"queue=linux", "os=linux"}) ||
		cfg.Runner.Software.RunScript != "buildkite-agent" || cfg.SecretsFile != agentconfig.SecretsFile || cfg.RegistrationToken != "" {
		t.Fatalf("agent.json: %+v", cfg)
	}

	v.BootstrapMethod = BootstrapJITConfig
	if _, err := Render(Input{Vars: v}); err == nil || !strings.Contains(err.Error(), "must be agent-token with Platform buildkite") {
		t.Errorf("a buildkite VM with a GitHub method: %v", err)
	}
}
