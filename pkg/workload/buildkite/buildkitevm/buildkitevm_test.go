package buildkitevm_test

import (
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite/buildkitevm"
)

func buildkiteConfig() agentconfig.Config {
	return agentconfig.Config{
		Version:         agentconfig.CurrentVersion,
		Platform:        buildkitevm.Platform,
		WorkloadMethod:  agentconfig.WorkloadDirect,
		BootstrapMethod: buildkitevm.MethodAgentToken,
		SecretsFile:     agentconfig.SecretsFile,
		SecretsDeadline: time.Date(2025, 6, 1, 12, 30, 0, 0, time.UTC),
		RegistrationURL: "https://agent.buildkite.com/v3",
		Runner: agentconfig.Runner{Name: "linux-abc12", Labels: []string{"queue=linux", "os=linux"}, Software: agentconfig.Software{
			InstallPath: "/usr/local/bin", RunScript: "buildkite-agent", WorkDir: "/var/lib/hyperfleet/builds", OS: "linux", Arch: "amd64",
		}},
		PowerOffOnFinish: true,
	}
}

func TestBuildkiteConfigs(t *testing.T) {
	downloaded := buildkiteConfig()
	downloaded.Runner.Software.InstallPath = "/opt/buildkite-agent"
	downloaded.Runner.Software.DownloadURL = "https://github.com/buildkite/agent/releases/download/v3.138.1/buildkite-agent-linux-amd64-3.138.1.tar.gz"
	downloaded.Runner.Software.DownloadSHA256 = strings.Repeat("ab", 32)
	bound := buildkiteConfig()
	bound.BootstrapMethod, bound.Runner.AcquireJob = buildkitevm.MethodJobToken, "0190a3b2-6c1e-4a8f-9d2b-3e4f5a6b7c8d"
	// A warm VM: its job comes with the credential (GuestSecrets.job).
	warm := buildkiteConfig()
	warm.BootstrapMethod = buildkitevm.MethodJobToken
	for name, c := range map[string]agentconfig.Config{"baked into the image": buildkiteConfig(), "downloaded": downloaded, "bound to a job": bound, "warm": warm} {
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}

	cases := map[string]struct {
		mutate func(*agentconfig.Config)
		want   string
	}{
		"a GitHub method":                  {func(c *agentconfig.Config) { c.BootstrapMethod = agentconfig.BootstrapJITConfig }, `bootstrapMethod: is "jit-config"; platform buildkite takes "agent-token"`},
		"a job token with a malformed job": {func(c *agentconfig.Config) { c.BootstrapMethod, c.Runner.AcquireJob = buildkitevm.MethodJobToken, "42" }, `runner.acquireJob: "42" is not a Buildkite job UUID`},
		"a job without a job token":        {func(c *agentconfig.Config) { c.Runner.AcquireJob = "0190a3b2-6c1e-4a8f-9d2b-3e4f5a6b7c8d" }, `runner.acquireJob: is set but bootstrapMethod is "agent-token"`},
		"no endpoint":                      {func(c *agentconfig.Config) { c.RegistrationURL = "" }, "registrationURL: is empty; platform buildkite needs the agent API endpoint"},
		"a tag without a value":            {func(c *agentconfig.Config) { c.Runner.Labels = []string{"linux"} }, `runner.labels[0]: "linux" is not a Buildkite agent tag`},
		"no name":                          {func(c *agentconfig.Config) { c.Runner.Name = "" }, `runner.name: "" is not a valid agent name`},
		"a relative binary directory":      {func(c *agentconfig.Config) { c.Runner.Software.InstallPath = "bin" }, "runner.software.installPath"},
		"no binary name":                   {func(c *agentconfig.Config) { c.Runner.Software.RunScript = "" }, "runner.software.runScript"},
		"GitHub's architecture name":       {func(c *agentconfig.Config) { c.Runner.Software.Arch = "x64" }, `runner.software.arch: is "x64"; must be amd64 or arm64`},
		"a build path in /usr":             {func(c *agentconfig.Config) { c.Runner.Software.WorkDir = "/usr" }, "runner.software.workDir"},
		"a download into a system dir": {func(c *agentconfig.Config) {
			c.Runner.Software.DownloadURL, c.Runner.Software.DownloadSHA256 = "https://example.test/a.tar.gz", strings.Repeat("a", 64)
		}, "runner.software.installPath"},
		"a download without checksum": {func(c *agentconfig.Config) { c.Runner.Software.DownloadURL = "https://example.test/a.tar.gz" }, "runner.software.downloadSHA256"},
	}
	for name, tc := range cases {
		c := buildkiteConfig()
		tc.mutate(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", name, err, tc.want)
		}
	}
}

func TestStoredAgentToken(t *testing.T) {
	if err := (agentconfig.StoredCredential{Method: buildkitevm.MethodAgentToken, RegistrationToken: "bkct_x"}).Validate(); err != nil {
		t.Errorf("an agent token: %v", err)
	}
	if err := (agentconfig.StoredCredential{Method: buildkitevm.MethodAgentToken}).Validate(); err == nil || !strings.Contains(err.Error(), "registrationToken: is empty; method agent-token") {
		t.Errorf("an agent-token credential without its token: %v", err)
	}
	if err := (agentconfig.StoredCredential{Method: buildkitevm.MethodJobToken, RegistrationToken: "bkjat_x"}).Validate(); err != nil {
		t.Errorf("a job acquisition token: %v", err)
	}
	if err := (agentconfig.StoredCredential{Method: buildkitevm.MethodJobToken}).Validate(); err == nil || !strings.Contains(err.Error(), "registrationToken: is empty; method job-token") {
		t.Errorf("a job-token credential without its token: %v", err)
	}
}
