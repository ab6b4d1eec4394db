package cloudinit

import (
	"strings"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/pkg/workload/gitlab/gitlabvm"
)

// TestGitLabAgentConfig: a gitlab-ci VM's agent.json names the platform,
// the runner-auth-token method, the GitLab instance, gitlab-runner (baked
// in, or downloaded with its checksum) and the builds directory; it
// carries no token (it arrives in the running VM) and no tags (they are
// the runner's at GitLab).
func TestGitLabAgentConfig(t *testing.T) {
	v := baseVars()
	v.Platform, v.BootstrapMethod = PlatformGitLabCI, BootstrapRunnerAuthToken
	v.RegistrationURL = "https://gitlab.example.com"
	v.Labels = List{"self-hosted", "hyperfleet", "linux"}
	v.RunnerConfig = RunnerConfig{InstallPath: "/opt/gitlab-runner", RunScript: "gitlab-runner", WorkDir: "/var/lib/hyperfleet/builds", OS: "linux", Arch: "amd64",
		DownloadURL: "https://gitlab-runner-downloads.s3.amazonaws.com/v18.6.0/binaries/gitlab-runner-linux-amd64", DownloadSHA256: strings.Repeat("ab", 32)}
	cfg := renderedAgentConfig(t, v)
	sw := cfg.Runner.Software
	if cfg.Platform != gitlabvm.Platform || cfg.BootstrapMethod != gitlabvm.MethodRunnerAuthToken ||
		cfg.RegistrationURL != v.RegistrationURL || len(cfg.Runner.Labels) != 0 || cfg.Runner.Group != "" ||
		sw.RunScript != "gitlab-runner" || sw.InstallPath != "/opt/gitlab-runner" || sw.DownloadURL != v.RunnerConfig.DownloadURL ||
		sw.DownloadSHA256 != v.RunnerConfig.DownloadSHA256 || sw.WorkDir != "/var/lib/hyperfleet/builds" ||
		cfg.SecretsFile != agentconfig.SecretsFile || cfg.RegistrationToken != "" {
		t.Fatalf("agent.json: %+v", cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("the rendered config does not validate: %v", err)
	}

	v.BootstrapMethod = BootstrapAgentToken
	if _, err := Render(Input{Vars: v}); err == nil || !strings.Contains(err.Error(), `must be "runner-auth-token" with Platform gitlab-ci`) {
		t.Errorf("a gitlab-ci VM with Buildkite's method: %v", err)
	}
}
