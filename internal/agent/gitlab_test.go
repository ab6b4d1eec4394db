//go:build !windows

package agent

import (
	"slices"
	"strings"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/pkg/workload/gitlab/gitlabvm"
)

// TestGitLabRunSingleArgs: one job with the shell executor, waiting the
// idle timeout for it, building in the work directory; the token is never
// an argument (it travels in CI_SERVER_TOKEN).
func TestGitLabRunSingleArgs(t *testing.T) {
	got := gitlabRunSingleArgs("https://gitlab.example", "hf-claim", "/home/runner/builds", 600)
	want := []string{"run-single", "--url", "https://gitlab.example", "--executor", "shell", "--max-builds", "1",
		"--builds-dir", "/home/runner/builds", "--name", "hf-claim", "--wait-timeout", "600"}
	if !slices.Equal(got, want) {
		t.Fatalf("args %q, want %q", got, want)
	}
	if strings.Contains(strings.Join(got, " "), "token") {
		t.Fatal("a token flag on the command line")
	}
	if k, err := runnerKindFor(gitlabvm.Platform); err != nil || k.credentialFiles() != nil {
		t.Fatalf("runnerKindFor(gitlab-ci) = %v, %v", k, err)
	}
	if err := (Credential{Method: gitlabvm.MethodRunnerAuthToken}).validate(); err == nil {
		t.Fatal("a runner-auth-token credential without a token validated")
	}
}

// TestGitLabCredentialFromEachSource: the broker's answer and the secret
// store's document carry a runner authentication token as
// registrationToken, which the GitLab runner kind runs with.
func TestGitLabCredentialFromEachSource(t *testing.T) {
	cred, err := parseBrokerCredential([]byte(`{"method":"runner-auth-token","registrationToken":"glrt-from-broker"}`))
	if err != nil || cred.Method != gitlabvm.MethodRunnerAuthToken || cred.RegistrationToken != "glrt-from-broker" {
		t.Errorf("broker: %v, %v", cred, err)
	}
	if _, err := parseBrokerCredential([]byte(`{"method":"runner-auth-token"}`)); err == nil || !strings.Contains(err.Error(), "runner-auth-token credential without a token") {
		t.Errorf("broker without a token: %v", err)
	}
	if err := (agentconfig.StoredCredential{Method: gitlabvm.MethodRunnerAuthToken, RegistrationToken: "glrt-x"}).Validate(); err != nil {
		t.Errorf("secret store: %v", err)
	}
}

// TestGitLabRunForJobUser: `gitlab-runner run` of the VM's one runner, its
// jobs as the runner user (--user), the token in config.toml and never an
// argument; config.toml's strings are TOML's, whatever they hold; the
// agent reads the job id from the line the runner logs when it gets one.
func TestGitLabRunForJobUser(t *testing.T) {
	got := gitlabRunArgs("/run/hyperfleet/gitlab-runner/config.toml", "/var/lib/hyperfleet/builds", "runner")
	want := []string{"run", "--config", "/run/hyperfleet/gitlab-runner/config.toml", "--working-directory", "/var/lib/hyperfleet/builds", "--user", "runner"}
	if !slices.Equal(got, want) {
		t.Fatalf("args %q, want %q", got, want)
	}
	cfg := string(gitlabRunConfig("https://gitlab.example", `vm "1"\x`, "glrt-abc", "/var/lib/builds\n"))
	for _, line := range []string{"concurrent = 1\n", "[[runners]]\n", `  name = "vm \"1\"\\x"` + "\n", `  url = "https://gitlab.example"` + "\n",
		`  token = "glrt-abc"` + "\n", `  executor = "shell"` + "\n", `  builds_dir = "/var/lib/builds\u000A"` + "\n", "  limit = 1\n"} {
		if !strings.Contains(cfg, line) {
			t.Errorf("config.toml lacks %q:\n%s", line, cfg)
		}
	}
	if id := gitlabJobOf("Checking for jobs... received                       job=9000003 job_name=build repo_url=https://gitlab.example/acme/app.git runner=glrt-1ed89a5e"); id != "9000003" {
		t.Errorf("job of the received line: %q", id)
	}
	if id := gitlabJobOf("Checking for jobs... received"); id != "" {
		t.Errorf("job of a line without one: %q", id)
	}
}
