// Package githubvm is GitHub Actions' side of a VM: the names the operator
// and the in-VM agent share (the platform the agent config carries, the
// runner credentials), and the platform's part of the agent config
// (agentconfig.PlatformSpec), registered when the package is loaded. It
// links nothing but the agent config's format, so the agent binary imports
// it as the operator's back-end (pkg/workload/github) does.
package githubvm

import "github.com/hyperfleet/hyperfleet/internal/agentconfig"

// Platform is GitHub Actions in the agent config, its workload type
// (hfv1.WorkloadGitHubActions): the agent runs actions/runner for one job.
const Platform agentconfig.Platform = "github-actions"

// GitHub's runner credentials, the template's spec.bootstrap.method values
// (hfv1.BootstrapJITConfig, hfv1.BootstrapRunnerToken), which the agent
// config knows as the API's (agentconfig.JITConfigMethod,
// agentconfig.RegistrationTokenMethod).
const (
	// MethodJIT is a just-in-time runner configuration: the runner is
	// already registered, for one job, and is started with it.
	MethodJIT = agentconfig.BootstrapJITConfig
	// MethodRegistrationToken is a registration token (valid one hour):
	// the agent runs the runner's config script with it to register an
	// ephemeral runner, then runs the runner.
	MethodRegistrationToken = agentconfig.BootstrapRunnerToken
)

// Spec is GitHub Actions' part of the agent config.
var Spec = agentconfig.PlatformSpec{
	Platform: Platform,
	Methods:  []agentconfig.MethodSpec{agentconfig.JITConfigMethod, agentconfig.RegistrationTokenMethod},
	Default:  true,
	Windows:  true,
	Validate: validate,
}

func init() { agentconfig.RegisterPlatform(Spec) }

// validate checks a GitHub Actions config: a registration token needs the
// URL and the name the runner registers with; the runner is actions/runner
// with its config and run scripts.
func validate(c *agentconfig.Config, bad agentconfig.Reporter) {
	if c.BootstrapMethod == MethodRegistrationToken {
		if c.RegistrationURL == "" {
			bad("registrationURL", "is empty; bootstrapMethod runner-token needs the URL the runner registers to, such as https://github.com/octo-org/octo-repo")
		}
		if c.Runner.Name == "" {
			bad("runner.name", "is empty; bootstrapMethod runner-token needs the runner's name")
		}
	}
	agentconfig.ValidateActionsRunner(&c.Runner, bad)
}
