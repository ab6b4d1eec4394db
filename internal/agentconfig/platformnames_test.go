package agentconfig

// The CI platforms' names as this package's tests spell them. The
// platforms declare them in their own packages, which import this one, so
// the tests of this package cannot import them; registered_test.go checks
// that these are the registered ones.
const (
	PlatformGitHubActions    Platform        = "github-actions"
	PlatformGitLabCI         Platform        = "gitlab-ci"
	PlatformBuildkite        Platform        = "buildkite"
	BootstrapRunnerAuthToken BootstrapMethod = "runner-auth-token"
	BootstrapAgentToken      BootstrapMethod = "agent-token"
	BootstrapJobToken        BootstrapMethod = "job-token"
)
