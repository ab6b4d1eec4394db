package cloudinit

import (
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite/buildkitevm"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github/githubvm"
	"github.com/hyperfleet/hyperfleet/pkg/workload/gitlab/gitlabvm"
)

// The CI platforms' names, as the platforms declare them; importing their
// packages registers them (agentconfig.RegisterPlatform), as linking their
// back-ends does in the operator.
const (
	PlatformGitHubActions    = string(githubvm.Platform)
	PlatformGitLabCI         = string(gitlabvm.Platform)
	PlatformBuildkite        = string(buildkitevm.Platform)
	BootstrapRunnerToken     = string(githubvm.MethodRegistrationToken)
	BootstrapRunnerAuthToken = string(gitlabvm.MethodRunnerAuthToken)
	BootstrapAgentToken      = string(buildkitevm.MethodAgentToken)
	BootstrapJobToken        = string(buildkitevm.MethodJobToken)
)
