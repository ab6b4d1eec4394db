package agent

import (
	"context"

	"github.com/hyperfleet/hyperfleet/pkg/workload/github/githubvm"
)

// GitHubActionsRunner is GitHub Actions' runner kind (githubvm.Platform).
var GitHubActionsRunner RunnerKind = githubRunner{}

// githubRunner is GitHub Actions' runner kind: the single-use runner
// credential from the config's CredentialSource, actions/runner installed
// (downloaded with its SHA-256 checked, or baked into the image),
// registered with its config script for runner-token, and run for one job
// (runRunner, runner.go).
type githubRunner struct{}

// credentialFiles are what the runner's config script (or a JIT
// configuration) writes into installPath and what lets it talk to GitHub.
func (githubRunner) credentialFiles() []string {
	return []string{".credentials", ".credentials_rsaparams", ".runner"}
}

func (githubRunner) run(ctx context.Context, a *agent, p *place) error {
	cfg, sw := p.cfg, p.cfg.Runner.Software
	cred, err := a.credential(ctx, p)
	if err != nil {
		return err
	}
	a.log.Info("runner credential obtained", "credential", cred)

	scripts := []string{sw.RunScript}
	if cred.Method == githubvm.MethodRegistrationToken {
		scripts = append(scripts, sw.ConfigScript)
	}
	if err := a.installRunner(ctx, &sw, p.install, scripts); err != nil {
		return err
	}
	// A runner baked into the image must not carry a registration.
	a.removeCredentialFiles()
	if err := a.prepareWorkDir(p.install, p.work, p.user); err != nil {
		return err
	}
	if cred.Method == githubvm.MethodRegistrationToken {
		if err := a.configure(ctx, cfg, &sw, p.install, p.work, p.user, cred); err != nil {
			return err
		}
	}
	return a.runRunner(ctx, &sw, p.install, p.user, cred)
}
