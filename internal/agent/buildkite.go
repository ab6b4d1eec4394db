package agent

import (
	"cmp"
	"context"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// Lines buildkite-agent logs that the agent watches for (the real agent's
// agent and core packages, which hack/buildkite-agent builds).
const (
	// bkLineWaiting: registered and connected, pinging for work.
	bkLineWaiting = "Waiting for instructions"
	// bkLineAssigned: Buildkite gave the agent a job ("Assigned job <id>.
	// Accepting...").
	bkLineAssigned = "Assigned job "
	// bkLineAcquiring: with --acquire-job, registered and asking for the
	// job ("Attempting to acquire job <id>..."); no ping comes first.
	bkLineAcquiring = "Attempting to acquire job "
	// bkLineStarting: with --acquire-job, the job was acquired and starts
	// ("Starting job at <url>#<id>").
	bkLineStarting = "Starting job at "
)

// EnvBuildkiteAgentToken is where buildkite-agent reads its token, as its
// --token flag: never on the command line, which any user of the VM can
// read in ps.
const EnvBuildkiteAgentToken = "BUILDKITE_AGENT_TOKEN"

// buildkiteRunner is Buildkite's runner kind: the VM's own cluster agent
// token from the config's CredentialSource (bootstrapMethod agent-token),
// buildkite-agent installed (downloaded with its SHA-256 checked, or baked
// into the image at installPath/runScript), and run as
// `buildkite-agent start --disconnect-after-job`: it registers with the
// token, takes one job of its tags (queue first), runs it in the build
// path, and exits. A VM made for one job (bootstrapMethod job-token) gets
// a job acquisition token instead and adds `--acquire-job <id>`: the agent
// takes that job or exits 27. The token lives in the process's environment only;
// the agent's per-registration access token in its memory only, so no
// credential file stays behind.
type buildkiteRunner struct{}

func (buildkiteRunner) credentialFiles() []string { return nil }

func (buildkiteRunner) run(ctx context.Context, a *agent, p *place) error {
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
	if cred.Method != cfg.BootstrapMethod {
		return fail(ExitInternal, "the credential source returned a %s credential; this Buildkite agent takes a %s", cred.Method, cfg.BootstrapMethod)
	}
	if err := cred.validate(); err != nil {
		return err
	}
	a.secrets = append(a.secrets, cred.RegistrationToken)
	a.log.Info("agent token obtained", "credential", cred)

	install := p.install
	if sw.DownloadURL == "" && install == "" {
		return fail(ExitRunnerSoftware, "runner.software.installPath is empty; no buildkite-agent to run")
	}
	if err := a.installRunner(ctx, &sw, install, []string{sw.RunScript}); err != nil {
		return err
	}
	if err := a.prepareWorkDir("", p.work, p.user); err != nil {
		return err
	}
	endpoint := cmp.Or(cred.RegistrationURL, cfg.RegistrationURL)
	args := []string{"start", "--disconnect-after-job", "--endpoint", endpoint, "--name", cfg.Runner.Name, "--build-path", p.work}
	if cfg.BootstrapMethod == agentconfig.BootstrapJobToken {
		// Bound to the job the VM was made for: the agent acquires it
		// (and only it: the token is good for nothing else) or exits 27.
		args = append(args, "--acquire-job", cfg.Runner.AcquireJob)
	}
	if len(cfg.Runner.Labels) > 0 {
		args = append(args, "--tags", strings.Join(cfg.Runner.Labels, ","))
	}
	a.log.Info("starting buildkite-agent", "binary", filepath.Join(install, sw.RunScript), "args", strings.Join(args, " "))

	var online, jobStarted atomic.Bool
	started := make(chan string, 1)
	watch := func(line string) {
		switch {
		case strings.Contains(line, bkLineAssigned), strings.Contains(line, bkLineStarting):
			job := ""
			if i := strings.Index(line, bkLineAssigned); i >= 0 {
				job, _, _ = strings.Cut(strings.TrimSpace(line[i+len(bkLineAssigned):]), ".")
			} else if _, frag, ok := strings.Cut(line, "#"); ok {
				job, _, _ = strings.Cut(frag, " ")
			}
			a.jobStarted.Store(true)
			if !jobStarted.Swap(true) {
				started <- job
			}
		case strings.Contains(line, bkLineWaiting), strings.Contains(line, bkLineAcquiring):
			a.runnerOnline.Store(true)
			if !online.Swap(true) {
				a.log.Info("buildkite-agent online: waiting for a job")
			}
		}
	}
	proc, err := a.start(filepath.Join(install, sw.RunScript), args, p.work, p.user.env(EnvBuildkiteAgentToken+"="+cred.RegistrationToken), p.user, sw.RunScript, watch)
	if err != nil {
		return fail(ExitRunnerSoftware, "start %s: %v", sw.RunScript, err)
	}
	result := a.supervise(ctx, proc, started, &jobStarted, &online, "buildkite-agent")
	a.log.Info("buildkite-agent exited", "status", proc.describeExit(), "jobStarted", jobStarted.Load())
	if result != nil {
		return result
	}
	// buildkite-agent exits 0 once its one job ran, whatever the job's
	// status (which it reported to Buildkite); non-zero is its own
	// failure: a refused token, no connection.
	if code := proc.exitCode(); code != 0 {
		return fail(ExitRunnerFailed, "buildkite-agent failed (%s): %s", proc.describeExit(), cmp.Or(proc.stderrTail(), "(no error output)"))
	}
	if !jobStarted.Load() {
		a.log.Warn("buildkite-agent exited 0 without a line saying its job started")
	}
	return nil
}
