package agent

import (
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite/buildkitevm"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github/githubvm"
	"github.com/hyperfleet/hyperfleet/pkg/workload/gitlab/gitlabvm"
)

// The tests run the platforms the agent binary runs, registered as its
// main registers them (cmd/hyperfleet-agent checks that it registers every
// platform the config knows).
func init() {
	RegisterRunner(githubvm.Platform, GitHubActionsRunner)
	RegisterRunner(gitlabvm.Platform, GitLabRunner)
	RegisterRunner(buildkitevm.Platform, BuildkiteRunner)
	RegisterRunner(agentconfig.PlatformGeneric, GenericRunner)
}

// TestRegisterRunnerRefusesATakenPlatform: one runner kind per platform.
func TestRegisterRunnerRefusesATakenPlatform(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("registering gitlab-ci's runner kind twice did not panic")
		}
	}()
	RegisterRunner(gitlabvm.Platform, GenericRunner)
}
