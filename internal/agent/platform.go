package agent

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// RunnerKind is one CI platform's part of Run: what happens between the
// shared steps before it (the config read and removed, the paths checked,
// the runner user looked up, the secrets directory made and the ready
// hint sent) and those after it (cleanup, the power-off notice and the
// power-off). Each platform's is one implementation in a file of its own
// (github.go, gitlab.go, buildkite.go, generic.go), registered under the
// platform the config names (RegisterRunner); the credential (credential
// below), the runner user, the process handling (start, supervise,
// output into the log) and the cleanup are the agent's and shared. Its
// methods are unexported: a runner kind works on the agent's own state.
type RunnerKind interface {
	// run obtains what the platform's runner needs (its credential, or
	// the VM's identity), installs and runs it for its one job, and
	// returns the error whose exit code Run returns (nil: ExitOK).
	run(ctx context.Context, a *agent, p *place) error
	// credentialFiles are the files the runner writes into installPath
	// that let it talk to its platform; the agent removes them once the
	// runner is gone and at cleanup.
	credentialFiles() []string
}

// The runner kinds of this agent (RegisterRunner), by platform.
var (
	runnersMu sync.RWMutex
	runners   = map[agentconfig.Platform]RunnerKind{}
)

// RegisterRunner makes the agent run kind for configs of platform (the
// name its package declares, such as gitlabvm.Platform). The agent's main
// registers every platform it runs, as the operator's registers its
// back-ends, so that one more platform is its runner's file and one line
// there. Registering a platform twice, or an empty one or a nil kind, is
// a programming error and panics.
func RegisterRunner(platform agentconfig.Platform, kind RunnerKind) {
	runnersMu.Lock()
	defer runnersMu.Unlock()
	switch {
	case platform == "" || kind == nil:
		panic("agent: RegisterRunner needs a platform and a runner kind")
	case runners[platform] != nil:
		panic(fmt.Sprintf("agent: platform %s is registered twice", platform))
	}
	runners[platform] = kind
}

// RegisteredRunners are the platforms this agent runs, sorted.
func RegisteredRunners() []agentconfig.Platform {
	runnersMu.RLock()
	defer runnersMu.RUnlock()
	out := make([]agentconfig.Platform, 0, len(runners))
	for p := range runners {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
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
func runnerKindFor(platform agentconfig.Platform) (RunnerKind, error) {
	runnersMu.RLock()
	defer runnersMu.RUnlock()
	if kind := runners[platform]; kind != nil {
		return kind, nil
	}
	return nil, &UnsupportedError{What: fmt.Sprintf("platform %q", platform)}
}

// credential obtains the runner credential of p's config from its source,
// checks that the config's platform takes it and that it holds what its
// method needs, and keeps its secrets out of the agent's output: the first
// steps of every platform whose runner takes a credential.
func (a *agent) credential(ctx context.Context, p *place) (Credential, error) {
	src, err := a.credentialSource(p.cfg)
	if err != nil {
		return Credential{}, err
	}
	cred, err := src.Credential(ctx)
	a.attestationError = attestationErrorOf(err)
	if err != nil {
		return Credential{}, err
	}
	if spec, _ := agentconfig.LookupPlatform(p.cfg.Platform); !spec.Takes(cred.Method) {
		return Credential{}, fail(ExitBadConfig, "platform %s takes a %s credential, not %s", p.cfg.Platform, spec.MethodNames(), cred.Method)
	}
	if err := cred.validate(); err != nil {
		return Credential{}, err
	}
	for _, s := range []string{cred.JITConfig, cred.RegistrationToken} {
		if s != "" {
			a.secrets = append(a.secrets, s)
		}
	}
	return cred, nil
}
