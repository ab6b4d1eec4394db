package agent

import (
	"context"
	"fmt"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// runnerKind is one CI platform's part of Run: what happens between the
// shared steps before it (the config read and removed, the paths checked,
// the runner user looked up, the secrets directory made and the ready
// hint sent) and those after it (cleanup, the power-off notice and the
// power-off). Each platform is one implementation in a file of its own
// (github.go, generic.go, buildkite.go), chosen by the config's platform
// (runnerKindFor); the credential sources, the runner user, the process
// handling (start, stop, output into the log) and the cleanup are the
// agent's and shared.
type runnerKind interface {
	// run obtains what the platform's runner needs (its credential, or
	// the VM's identity), installs and runs it for its one job, and
	// returns the error whose exit code Run returns (nil: ExitOK).
	run(ctx context.Context, a *agent, p *place) error
	// credentialFiles are the files the runner writes into installPath
	// that let it talk to its platform; the agent removes them once the
	// runner is gone and at cleanup.
	credentialFiles() []string
}

// place is where a runner kind works: the config, the install and work
// directories (under Options.Root; install is empty when the config names
// none) and the runner user.
type place struct {
	cfg           *agentconfig.Config
	install, work string
	user          *runAs
}

// runnerKindFor is the runner kind of platform; a platform this agent
// does not run is ExitUnsupported.
func runnerKindFor(platform agentconfig.Platform) (runnerKind, error) {
	switch platform {
	case agentconfig.PlatformGitHubActions:
		return githubRunner{}, nil
	case agentconfig.PlatformGeneric:
		return genericRunner{}, nil
	case agentconfig.PlatformGitLabCI:
		return gitlabRunner{}, nil
	case agentconfig.PlatformBuildkite:
		return buildkiteRunner{}, nil
	}
	return nil, &UnsupportedError{What: fmt.Sprintf("platform %q", platform)}
}
