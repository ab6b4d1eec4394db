package agent

import (
	"context"
	"path/filepath"
	"strconv"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// EnvGitLabToken is the environment variable gitlab-runner reads its
// runner authentication token from (its --token flag's), so that the
// token never shows on the command line (ps).
const EnvGitLabToken = "CI_SERVER_TOKEN"

// gitlabRunner is GitLab CI's runner kind: the runner authentication
// token of the runner the operator created for this VM alone (from the
// config's CredentialSource), gitlab-runner installed (downloaded with its
// SHA-256 checked, GitLab publishing the bare binary, or baked into the
// image; runner.software.runScript names the binary in installPath) and run with run-single for one job with the
// shell executor. There is no registration step and nothing is written
// into installPath: run-single takes everything on its command line and in
// its environment. The operator deletes the runner when the claim ends
// (docs/gitlab.md), so the token dies with the VM.
type gitlabRunner struct{}

// credentialFiles: run-single writes no config.toml or token file.
func (gitlabRunner) credentialFiles() []string { return nil }

func (gitlabRunner) run(ctx context.Context, a *agent, p *place) error {
	cfg, sw := p.cfg, p.cfg.Runner.Software
	src, err := a.credentialSource(cfg)
	if err != nil {
		return err
	}
	cred, err := src.Credential(ctx)
	a.attestationError = attestationErrorOf(err)
	if err != nil {
		return err
	}
	if err := cred.validate(); err != nil {
		return err
	}
	if cred.Method != agentconfig.BootstrapRunnerAuthToken {
		return fail(ExitBadConfig, "platform gitlab-ci takes a %s credential, not %s", agentconfig.BootstrapRunnerAuthToken, cred.Method)
	}
	a.secrets = append(a.secrets, cred.RegistrationToken)
	a.log.Info("runner credential obtained", "credential", cred)
	if err := a.installBinary(ctx, &sw, p.install, sw.RunScript); err != nil {
		return err
	}
	if err := a.prepareWorkDir(p.install, p.work, p.user); err != nil {
		return err
	}
	args := gitlabRunSingleArgs(cfg.RegistrationURL, cfg.Runner.Name, p.work, a.opts.IdleTimeout.Seconds())
	a.log.Info("starting gitlab-runner run-single", "binary", sw.RunScript, "url", cfg.RegistrationURL, "buildsDir", p.work)
	proc, err := a.start(filepath.Join(p.install, sw.RunScript), args, p.work, p.user.env(EnvGitLabToken+"="+cred.RegistrationToken), p.user, sw.RunScript, nil)
	if err != nil {
		return fail(ExitRunnerSoftware, "start %s: %v", sw.RunScript, err)
	}
	var result error
	select {
	case <-proc.done:
	case <-ctx.Done():
		a.log.Warn("stopping gitlab-runner: the agent was asked to stop")
		result = fail(ExitInternal, "stopped before the runner finished: %v", ctx.Err())
		proc.stop(a.opts.StopGracePeriod)
	}
	a.log.Info("runner exited", "status", proc.describeExit())
	if result != nil {
		return result
	}
	if code := proc.exitCode(); code != 0 {
		return fail(ExitRunnerFailed, "the runner failed (%s)", proc.describeExit())
	}
	return nil
}

// gitlabRunSingleArgs are gitlab-runner's arguments for one job: run-single
// with the shell executor, at most one build, waiting at most idle seconds
// for it (gitlab-runner's --wait-timeout; 0: its default), building in
// buildsDir. The token is not among them (EnvGitLabToken).
func gitlabRunSingleArgs(url, name, buildsDir string, idle float64) []string {
	args := []string{"run-single", "--url", url, "--executor", "shell", "--max-builds", "1", "--builds-dir", buildsDir}
	if name != "" {
		args = append(args, "--name", name)
	}
	if idle > 0 {
		args = append(args, "--wait-timeout", strconv.Itoa(int(idle)))
	}
	return args
}
