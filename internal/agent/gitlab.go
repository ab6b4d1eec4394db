package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// EnvGitLabToken is the environment variable gitlab-runner reads its
// runner authentication token from (its --token flag's), so that the
// token never shows on the command line (ps).
const EnvGitLabToken = "CI_SERVER_TOKEN"

// Lines gitlab-runner logs that the agent watches for (network/gitlab.go
// of gitlab-runner, and the test world's stand-in).
const (
	// glLineReceived: GitLab gave the runner a job ("Checking for jobs...
	// received", with job=<id> among its fields).
	glLineReceived = "Checking for jobs... received"
	// glLineForbidden: GitLab refused the runner's token (the runner was
	// deleted): `run` keeps asking, so the agent stops it.
	glLineForbidden = "Checking for jobs... forbidden"
)

// gitlabConfigDir is where the agent writes gitlab-runner's config.toml
// when it runs the runner as root for a job user: under /run, in memory
// and not on the VM's disk, root's alone, and removed when the runner
// exits.
const gitlabConfigDir = "/run/hyperfleet/gitlab-runner"

// gitlabRunner is GitLab CI's runner kind: the runner authentication
// token of the runner the operator created for this VM alone (from the
// config's CredentialSource), gitlab-runner installed (downloaded with its
// SHA-256 checked, GitLab publishing the bare binary, or baked into the
// image; runner.software.runScript names the binary in installPath) and
// run for one job with the shell executor. The operator deletes the runner
// when the claim ends and pauses it as soon as it sees its job
// (docs/gitlab.md), so the token dies with the VM and serves no job after
// the first.
//
// The shell executor runs the job with the runner's environment, as the
// runner's user unless the runner runs as root and is told another
// (gitlab-runner run --user; run-single has no such flag). So where the
// agent has a runner user other than its own (--run-as, root's agent), the
// job runs as that user and gitlab-runner as the agent's user (root),
// reading its token from a config file only root reads
// (runForJobUser): the job reads the token in neither its environment nor
// a file, nor the runner's memory or environment (another user's process).
// Where the runner user is the agent's own (--run-as ""), job and runner
// share a user whatever the agent does, and the runner is run-single
// with the token in its environment (runSingle).
type gitlabRunner struct{}

// GitLabRunner is GitLab CI's runner kind (gitlabvm.Platform).
var GitLabRunner RunnerKind = gitlabRunner{}

// credentialFiles: the runner's config file is not in installPath; it is
// removed when the runner exits (runForJobUser).
func (gitlabRunner) credentialFiles() []string { return nil }

func (gitlabRunner) run(ctx context.Context, a *agent, p *place) error {
	sw := p.cfg.Runner.Software
	cred, err := a.credential(ctx, p)
	if err != nil {
		return err
	}
	a.log.Info("runner credential obtained", "credential", cred)
	if err := a.installBinary(ctx, &sw, p.install, sw.RunScript); err != nil {
		return err
	}
	bin := filepath.Join(p.install, sw.RunScript)
	if p.user.cred == nil {
		return runSingle(ctx, a, p, bin, cred.RegistrationToken)
	}
	return runForJobUser(ctx, a, p, bin, cred.RegistrationToken)
}

// runSingle runs `gitlab-runner run-single` for one job as the runner
// user, with the token in its environment, and returns once it exited.
func runSingle(ctx context.Context, a *agent, p *place, bin, token string) error {
	if err := a.prepareWorkDir(p.install, p.work, p.user); err != nil {
		return err
	}
	args := gitlabRunSingleArgs(p.cfg.RegistrationURL, p.cfg.Runner.Name, p.work, a.opts.IdleTimeout.Seconds())
	a.log.Info("starting gitlab-runner run-single", "binary", p.cfg.Runner.Software.RunScript, "url", p.cfg.RegistrationURL, "buildsDir", p.work)
	var jobStarted atomic.Bool
	proc, err := a.start(bin, args, p.work, p.user.env(EnvGitLabToken+"="+token), p.user, p.cfg.Runner.Software.RunScript, func(line string) {
		if strings.Contains(line, glLineReceived) && !jobStarted.Swap(true) {
			a.jobStarted.Store(true)
			a.log.Info("job started", "job", gitlabJobOf(line), "runner", "gitlab-runner")
		}
	})
	if err != nil {
		return fail(ExitRunnerSoftware, "start %s: %v", p.cfg.Runner.Software.RunScript, err)
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

// runForJobUser runs `gitlab-runner run --user <runner user>` as the
// agent's user (root) with the token in a config file only root reads,
// so that the job runs as the runner user and cannot read the token. `run`
// serves jobs until it is stopped: at the first job it receives the agent
// sends it SIGQUIT, on which it asks for no other job and exits once that
// one ended (commands/multi.go of gitlab-runner). A runner that started no
// job within the idle timeout is stopped (supervise); one whose token
// GitLab refuses (the runner was deleted) too, at once.
func runForJobUser(ctx context.Context, a *agent, p *place, bin, token string) error {
	// The runner user writes the builds directory; installPath, with the
	// binary root runs, stays root's.
	if err := a.prepareWorkDir("", p.work, p.user); err != nil {
		return err
	}
	dir := filepath.Join(a.opts.Root, gitlabConfigDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fail(ExitInternal, "create %s for gitlab-runner's config: %v", dir, err)
	}
	defer func() {
		if err := os.RemoveAll(dir); err != nil {
			a.log.Error("cannot remove gitlab-runner's config, which holds the runner token", "path", dir, "error", err)
		} else {
			a.log.Info("runner config removed", "path", dir)
		}
	}()
	if err := os.Chmod(dir, 0o700); err != nil {
		return fail(ExitInternal, "make %s root's alone: %v", dir, err)
	}
	config := filepath.Join(dir, "config.toml")
	if err := writeNewFile(config, gitlabRunConfig(p.cfg.RegistrationURL, p.cfg.Runner.Name, token, p.work), 0o600); err != nil {
		return fail(ExitInternal, "write gitlab-runner's config: %v", err)
	}
	args := gitlabRunArgs(config, p.work, p.user.name)
	a.log.Info("starting gitlab-runner run for one job", "binary", p.cfg.Runner.Software.RunScript, "url", p.cfg.RegistrationURL, "buildsDir", p.work, "jobUser", p.user.name)

	var online, jobStarted, refused atomic.Bool
	started := make(chan string, 1)
	quit, stop := make(chan struct{}, 1), make(chan struct{}, 1)
	watch := func(line string) {
		switch {
		case strings.Contains(line, glLineReceived):
			a.jobStarted.Store(true)
			if !jobStarted.Swap(true) {
				quit <- struct{}{}
				started <- gitlabJobOf(line)
			}
		case strings.Contains(line, glLineForbidden):
			if !refused.Swap(true) {
				stop <- struct{}{}
			}
		}
	}
	// The runner runs as the agent's own user, in the agent's environment
	// (the job gets the runner's, and the token is not in it) with the
	// template's proxy.
	self := &runAs{uid: os.Getuid(), gid: os.Getgid(), proxyEnv: p.user.proxyEnv}
	proc, err := a.start(bin, args, p.work, self.env(), self, p.cfg.Runner.Software.RunScript, watch)
	if err != nil {
		return fail(ExitRunnerSoftware, "start %s: %v", p.cfg.Runner.Software.RunScript, err)
	}
	go func() {
		select {
		case <-quit:
			// The one job runs on; no other is asked for.
			if err := proc.cmd.Process.Signal(syscall.SIGQUIT); err != nil && !errors.Is(err, os.ErrProcessDone) {
				a.log.Error("cannot tell gitlab-runner to take no other job", "error", err)
			}
		case <-stop:
			proc.interruptGroup()
		case <-proc.done:
		}
	}()
	result := a.supervise(ctx, proc, started, &jobStarted, &online, "gitlab-runner")
	a.log.Info("runner exited", "status", proc.describeExit(), "jobStarted", jobStarted.Load())
	switch {
	case result != nil:
		return result
	case refused.Load():
		return fail(ExitRunnerFailed, "GitLab refused the runner's token (was the runner deleted?); gitlab-runner stopped (%s)", proc.describeExit())
	}
	if code := proc.exitCode(); code != 0 {
		return fail(ExitRunnerFailed, "the runner failed (%s)", proc.describeExit())
	}
	if !jobStarted.Load() {
		a.log.Warn("gitlab-runner exited 0 without a line saying it received its job")
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

// gitlabRunArgs are gitlab-runner's arguments to serve the runner of
// config, working in buildsDir, its jobs run as jobUser.
func gitlabRunArgs(config, buildsDir, jobUser string) []string {
	return []string{"run", "--config", config, "--working-directory", buildsDir, "--user", jobUser}
}

// gitlabRunConfig is gitlab-runner's config.toml for the VM's one runner:
// one job at a time, the shell executor, building in buildsDir.
func gitlabRunConfig(url, name, token, buildsDir string) []byte {
	var b strings.Builder
	b.WriteString("# Written by hyperfleet-agent for this VM's one job; removed when gitlab-runner exits.\n")
	b.WriteString("concurrent = 1\n\n[[runners]]\n")
	if name != "" {
		fmt.Fprintf(&b, "  name = %s\n", tomlString(name))
	}
	fmt.Fprintf(&b, "  url = %s\n  token = %s\n  executor = \"shell\"\n  builds_dir = %s\n  limit = 1\n",
		tomlString(url), tomlString(token), tomlString(buildsDir))
	return []byte(b.String())
}

// tomlString is s as a TOML basic string.
func tomlString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, "\\u%04X", r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// gitlabJobOf is the job id of a "Checking for jobs... received" line
// (its job=<id> field); "" when it has none.
func gitlabJobOf(line string) string {
	for _, f := range strings.Fields(line) {
		if id, ok := strings.CutPrefix(f, "job="); ok {
			return id
		}
	}
	return ""
}

// writeNewFile writes data to a new file at path with mode perm, replacing
// none: a file already there (a symbolic link planted to redirect the
// write) is removed first.
func writeNewFile(path string, data []byte, perm os.FileMode) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
