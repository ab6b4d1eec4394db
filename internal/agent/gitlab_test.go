//go:build !windows

package agent

import (
	"slices"
	"strings"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
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
	if k, err := runnerKindFor(agentconfig.PlatformGitLabCI); err != nil || k.credentialFiles() != nil {
		t.Fatalf("runnerKindFor(gitlab-ci) = %v, %v", k, err)
	}
	if err := (Credential{Method: agentconfig.BootstrapRunnerAuthToken}).validate(); err == nil {
		t.Fatal("a runner-auth-token credential without a token validated")
	}
}
