package agent

import (
	"cmp"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite/buildkitevm"
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

// BuildkiteBootstrapCommand is the hidden hyperfleet-agent subcommand that
// buildkite-agent runs as its bootstrap-script: it drops from the agent's
// own user to the job's and runs the real bootstrap (BuildkiteBootstrap).
const BuildkiteBootstrapCommand = "buildkite-bootstrap"

// EnvBuildkiteAgentToken is where buildkite-agent reads its token, as its
// --token flag: never on the command line, which any user of the VM can
// read in ps.
const EnvBuildkiteAgentToken = "BUILDKITE_AGENT_TOKEN"

// buildkiteRunner is Buildkite's runner kind: a job acquisition token for
// the one job the VM is bound to, with that job, from the config's
// CredentialSource (bootstrapMethod job-token; a warm VM waits there until
// its pool binds it a job), buildkite-agent installed (downloaded with its
// SHA-256 checked, or baked into the image at installPath/runScript), and
// run as `buildkite-agent start --acquire-job <job> --disconnect-after-job`:
// it registers with the token, takes that job or exits 27, runs it in the
// build path, and exits. (An agent-token credential, which no operator of
// this version issues, runs without --acquire-job.)
//
// buildkite-agent runs as the agent's own user (root), and the job (its
// bootstrap: hooks, plugins, the command) as the runner user, through the
// agent's bootstrap-script: the hidden `hyperfleet-agent
// buildkite-bootstrap` (buildkite_bootstrap.go) drops to the runner user
// and runs `buildkite-agent bootstrap` with the job's environment. So the
// job cannot read buildkite-agent's memory or environment (its agent access
// token, which asks for work, and the registration token), and its own
// environment carries only the job's access token Buildkite gave for it
// (BUILDKITE_AGENT_ACCESS_TOKEN). The registration token lives in
// buildkite-agent's environment only, the agent's access token in its
// memory only, so no credential file stays behind.
type buildkiteRunner struct{}

// BuildkiteRunner is Buildkite's runner kind (buildkitevm.Platform).
var BuildkiteRunner RunnerKind = buildkiteRunner{}

func (buildkiteRunner) credentialFiles() []string { return nil }

func (buildkiteRunner) run(ctx context.Context, a *agent, p *place) error {
	cfg, sw := p.cfg, p.cfg.Runner.Software
	cred, err := a.credential(ctx, p)
	if err != nil {
		return err
	}
	if cred.Method != cfg.BootstrapMethod {
		return fail(ExitInternal, "the credential source returned a %s credential; this Buildkite agent takes a %s", cred.Method, cfg.BootstrapMethod)
	}
	job, err := buildkiteJob(cfg, cred)
	if err != nil {
		return err
	}
	a.log.Info("agent token obtained", "credential", cred, "job", job)

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
	bin := filepath.Join(install, sw.RunScript)
	endpoint := cmp.Or(cred.RegistrationURL, cfg.RegistrationURL)
	args := []string{"start", "--disconnect-after-job", "--endpoint", endpoint, "--name", cfg.Runner.Name, "--build-path", p.work}
	if job != "" {
		// Bound to the job the VM was made for: the agent acquires it
		// (and only it: the token is good for nothing else) or exits 27.
		args = append(args, "--acquire-job", job)
	}
	if len(cfg.Runner.Labels) > 0 {
		args = append(args, "--tags", strings.Join(cfg.Runner.Labels, ","))
	}
	own, err := lookupRunAs("", "the agent's own user")
	if err != nil {
		return err
	}
	own.proxyEnv = p.user.proxyEnv
	if p.user.cred != nil {
		script, err := bootstrapScript(p.user.name, bin)
		if err != nil {
			return err
		}
		args = append(args, "--bootstrap-script", script)
	} else {
		a.log.Warn("the job runs as the agent's own user, as buildkite-agent does: it can read buildkite-agent's memory and environment (pass --run-as a user of its own)", "user", own.describe())
	}
	a.log.Info("starting buildkite-agent", "binary", bin, "args", strings.Join(args, " "), "jobUser", p.user.describe())

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
	proc, err := a.start(bin, args, p.work, own.env(EnvBuildkiteAgentToken+"="+cred.RegistrationToken), own, sw.RunScript, watch)
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

// buildkiteJobRE is a Buildkite job id: a UUID, lower-case hex.
var buildkiteJobRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// buildkiteJob is the job a job-token credential acquires: the one the
// credential names (a warm VM learns it there, when its pool binds it
// one), else the config's runner.acquireJob (a VM made for the job). A
// credential for another job than the config names is refused, as is a
// job-token credential that names no job at all. An agent-token
// credential acquires none.
func buildkiteJob(cfg *agentconfig.Config, cred Credential) (string, error) {
	if cred.Method != buildkitevm.MethodJobToken {
		if cred.Job != "" {
			return "", fail(ExitBadConfig, "the %s credential names job %s; only a job-token credential is for one job", cred.Method, cred.Job)
		}
		return "", nil
	}
	job, want := cred.Job, cfg.Runner.AcquireJob
	switch {
	case job == "" && want == "":
		return "", fail(ExitBadConfig, "the job-token credential names no job, and neither does runner.acquireJob; nothing to acquire")
	case job == "":
		job = want
	case want != "" && job != want:
		return "", fail(ExitBadConfig, "the job-token credential is for job %s, but runner.acquireJob names job %s; not acquiring either", job, want)
	}
	if !buildkiteJobRE.MatchString(job) {
		return "", fail(ExitBadConfig, "the job-token credential's job %q is not a Buildkite job UUID", job)
	}
	return job, nil
}

// bootstrapScript is buildkite-agent's --bootstrap-script: this binary's
// hidden buildkite-bootstrap command (BuildkiteBootstrap), which runs
// `<bin> bootstrap` as user. buildkite-agent splits the value into words
// as a shell would (shellwords), so each word is single-quoted; a path
// with a single quote is refused rather than escaped.
func bootstrapScript(user, bin string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fail(ExitInternal, "find this agent's own binary for buildkite-agent's bootstrap-script: %v", err)
	}
	words := []string{self, BuildkiteBootstrapCommand, "--user", user, "--", bin, "bootstrap"}
	for i, w := range words {
		if strings.ContainsAny(w, "'\x00") {
			return "", fail(ExitInternal, "%q cannot be part of buildkite-agent's bootstrap-script (it holds a single quote)", w)
		}
		words[i] = "'" + w + "'"
	}
	return strings.Join(words, " "), nil
}
