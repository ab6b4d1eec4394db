package gitlabvm_test

import (
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/pkg/workload/gitlab/gitlabvm"
)

// TestStoredRunnerAuthToken: a GitLab runner authentication token is kept
// in the secret store as registrationToken, and nothing else.
func TestStoredRunnerAuthToken(t *testing.T) {
	if err := (agentconfig.StoredCredential{Method: gitlabvm.MethodRunnerAuthToken, RegistrationToken: "glrt-x"}).Validate(); err != nil {
		t.Errorf("a runner-auth-token credential: %v", err)
	}
	for want, c := range map[string]agentconfig.StoredCredential{
		"registrationToken: is empty; method runner-auth-token": {Method: gitlabvm.MethodRunnerAuthToken},
		"jitConfig: is set but method is runner-auth-token":     {Method: gitlabvm.MethodRunnerAuthToken, RegistrationToken: "glrt-x", JITConfig: "j"},
	} {
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v", want, err)
		}
	}
}

func gitlabConfig() agentconfig.Config {
	return agentconfig.Config{
		Version:         agentconfig.CurrentVersion,
		Platform:        gitlabvm.Platform,
		WorkloadMethod:  agentconfig.WorkloadDirect,
		BootstrapMethod: gitlabvm.MethodRunnerAuthToken,
		SecretsFile:     agentconfig.SecretsFile,
		SecretsDeadline: time.Now().Add(time.Hour),
		RegistrationURL: "https://gitlab.example.com",
		Runner: agentconfig.Runner{Name: "hf-pool-abcde", Software: agentconfig.Software{
			InstallPath: "/usr/local/bin", RunScript: "gitlab-runner", WorkDir: "/var/lib/hyperfleet/builds", OS: "linux", Arch: "amd64",
		}},
	}
}

// TestGitLabConfigs: a gitlab-ci config names the runner-auth-token
// method, the instance's https URL and the runner binary, baked into the
// image (a system directory is fine) or downloaded with its checksum into
// a directory of its own; each mistake names its field.
func TestGitLabConfigs(t *testing.T) {
	downloaded := gitlabConfig()
	downloaded.Runner.Software.InstallPath = "/opt/gitlab-runner"
	downloaded.Runner.Software.DownloadURL = "https://gitlab-runner-downloads.s3.amazonaws.com/v18.6.0/binaries/gitlab-runner-linux-amd64"
	downloaded.Runner.Software.DownloadSHA256 = strings.Repeat("ab", 32)
	for name, c := range map[string]agentconfig.Config{"baked into the image": gitlabConfig(), "downloaded": downloaded} {
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for name, tc := range map[string]struct {
		mutate func(*agentconfig.Config)
		want   string
	}{
		"a GitHub method":      {func(c *agentconfig.Config) { c.BootstrapMethod = agentconfig.BootstrapJITConfig }, `bootstrapMethod: is "jit-config"; platform gitlab-ci takes "runner-auth-token"`},
		"no instance":          {func(c *agentconfig.Config) { c.RegistrationURL = "" }, "registrationURL: is empty; platform gitlab-ci needs"},
		"a plain http URL":     {func(c *agentconfig.Config) { c.RegistrationURL = "http://gitlab.example.com" }, "registrationURL: \"http://gitlab.example.com\" must be an https:// URL"},
		"tags in the VM":       {func(c *agentconfig.Config) { c.Runner.Labels = []string{"linux"} }, "runner.labels: is set but platform is gitlab-ci"},
		"a relative directory": {func(c *agentconfig.Config) { c.Runner.Software.InstallPath = "bin" }, "runner.software.installPath"},
		"no binary name":       {func(c *agentconfig.Config) { c.Runner.Software.RunScript = "" }, "runner.software.runScript"},
		"builds in /usr":       {func(c *agentconfig.Config) { c.Runner.Software.WorkDir = "/usr" }, "runner.software.workDir"},
		"a download into a system dir": {func(c *agentconfig.Config) {
			c.Runner.Software.DownloadURL, c.Runner.Software.DownloadSHA256 = "https://example.test/gitlab-runner", strings.Repeat("a", 64)
		}, "runner.software.installPath"},
		"a download without checksum": {func(c *agentconfig.Config) { c.Runner.Software.DownloadURL = "https://example.test/gitlab-runner" }, "runner.software.downloadSHA256"},
	} {
		c := gitlabConfig()
		tc.mutate(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", name, err, tc.want)
		}
	}
}
