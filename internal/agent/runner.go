package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// Lines of the runner's output the agent watches for, as printed by the
// real actions/runner (and the GitHub simulator's runner).
const (
	lineListening = "Listening for Jobs"
	lineJobStart  = "Running job:"
)

// configure registers an ephemeral runner with the runner's config script
// (runner-token). The token goes in ACTIONS_RUNNER_INPUT_TOKEN, which the
// runner reads like its --token option, never on the command line.
func (a *agent) configure(ctx context.Context, cfg *agentconfig.Config, sw *agentconfig.Software, install, work string, user *runAs, cred Credential) error {
	args := []string{"--unattended", "--url", cred.RegistrationURL, "--name", cfg.Runner.Name}
	if len(cfg.Runner.Labels) > 0 {
		args = append(args, "--labels", strings.Join(cfg.Runner.Labels, ","))
	}
	if cfg.Runner.Group != "" {
		args = append(args, "--runnergroup", cfg.Runner.Group)
	}
	args = append(args, "--work", work, "--ephemeral", "--disableupdate", "--replace")
	a.log.Info("registering the runner", "script", sw.ConfigScript, "args", strings.Join(args, " "))

	p, err := a.start(filepath.Join(install, sw.ConfigScript), args, install, user.env("ACTIONS_RUNNER_INPUT_TOKEN="+cred.RegistrationToken), user, sw.ConfigScript, nil)
	if err != nil {
		return fail(ExitRunnerSoftware, "start %s: %v", sw.ConfigScript, err)
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		a.log.Warn("stopping the runner's config script: the agent was asked to stop")
		p.stop(a.opts.StopGracePeriod)
		return fail(ExitInternal, "interrupted while registering the runner: %v", ctx.Err())
	}
	if code := p.exitCode(); code != 0 {
		tail := p.stderrTail()
		if tail == "" {
			tail = "(no error output)"
		}
		return fail(ExitRegistration, "%s failed (%s): %s", sw.ConfigScript, p.describeExit(), tail)
	}
	a.log.Info("runner registered", "name", cfg.Runner.Name)
	return nil
}

// runRunner runs the runner until it exits, the idle timeout passes
// without a job, or ctx is cancelled.
func (a *agent) runRunner(ctx context.Context, sw *agentconfig.Software, install string, user *runAs, cred Credential) error {
	var extra []string
	if spec, _ := agentconfig.LookupMethod(cred.Method); spec.JITConfig {
		// Like its --jitconfig option, which would show in ps.
		extra = append(extra, "ACTIONS_RUNNER_INPUT_JITCONFIG="+cred.JITConfig)
	}
	var online, jobStarted atomic.Bool
	started := make(chan string, 1)
	watch := func(line string) {
		switch {
		case strings.Contains(line, lineJobStart):
			job := strings.TrimSpace(line[strings.Index(line, lineJobStart)+len(lineJobStart):])
			a.jobStarted.Store(true)
			if !jobStarted.Swap(true) {
				started <- job
			}
		case strings.Contains(line, lineListening):
			a.runnerOnline.Store(true)
			if !online.Swap(true) {
				a.log.Info("runner online: listening for jobs")
			}
		}
	}
	a.log.Info("starting the runner", "script", sw.RunScript, "method", cred.Method)
	p, err := a.start(filepath.Join(install, sw.RunScript), nil, install, user.env(extra...), user, sw.RunScript, watch)
	if err != nil {
		return fail(ExitRunnerSoftware, "start %s: %v", sw.RunScript, err)
	}

	result := a.supervise(ctx, p, started, &jobStarted, &online, "the runner")
	// The runner is gone: so must be its registration.
	a.removeCredentialFiles()
	a.log.Info("runner exited", "status", p.describeExit(), "jobStarted", jobStarted.Load())
	if result != nil {
		return result
	}
	if code := p.exitCode(); code != 0 {
		return fail(ExitRunnerFailed, "the runner failed (%s)", p.describeExit())
	}
	if !jobStarted.Load() {
		a.log.Warn("the runner exited 0 without a \"Running job:\" line")
	}
	return nil
}

// supervise waits for a CI platform's runner process (named name in logs
// and errors) to exit: a job reported on started disarms the idle timeout;
// no job within it, or ctx's end, stops the process. It returns nil when
// the process exited on its own (its exit status is the caller's to read).
func (a *agent) supervise(ctx context.Context, p *process, started <-chan string, jobStarted, online *atomic.Bool, name string) error {
	var idle <-chan time.Time
	if a.opts.IdleTimeout > 0 {
		t := time.NewTimer(a.opts.IdleTimeout)
		defer t.Stop()
		idle = t.C
	}
	for {
		select {
		case <-p.done:
			return nil
		case job := <-started:
			idle = nil
			a.log.Info("job started", "job", job, "runner", name)
		case <-idle:
			if jobStarted.Load() {
				idle = nil
				continue
			}
			a.log.Warn("no job started within the idle timeout; stopping "+name, "idleTimeout", a.opts.IdleTimeout, "online", online.Load())
			p.stop(a.opts.StopGracePeriod)
			return fail(ExitIdle, "%s started no job within --idle-timeout %s", name, a.opts.IdleTimeout)
		case <-ctx.Done():
			a.log.Warn("stopping "+name+": the agent was asked to stop", "jobStarted", jobStarted.Load())
			p.stop(a.opts.StopGracePeriod)
			return fail(ExitInternal, "stopped before %s finished: %v", name, ctx.Err())
		}
	}
}

// process is a runner script running in its own process group, its output
// copied line by line into the log.
type process struct {
	cmd     *exec.Cmd
	done    chan struct{} // closed once the script exited and its output was read
	waitErr error

	mu   sync.Mutex
	tail []string // last lines of stderr

	// group is what holds the script and its children together (the
	// process group on Unix, a job object on Windows).
	group processGroup
}

const tailLines = 20

// start runs path with args in dir as user, copying its stdout and stderr
// into the log attributed to name, and calling watch (if set) with every
// line.
func (a *agent) start(path string, args []string, dir string, env []string, user *runAs, name string, watch func(string)) (*process, error) {
	cmd := exec.Command(path, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.SysProcAttr = scriptProcAttr(user.cred)
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	if err := p.contain(); err != nil {
		// A script whose children could outlive it must not run: they
		// would keep the job's files and the credential after cleanup.
		_ = cmd.Process.Kill()
		outR.Close()
		errR.Close()
		_ = cmd.Wait()
		return nil, fmt.Errorf("containing %s (pid %d): %w", name, cmd.Process.Pid, err)
	}
	a.log.Info("process started", "script", name, "pid", cmd.Process.Pid)

	var readers sync.WaitGroup
	readers.Add(2)
	go a.copyLines(&readers, outR, name, "stdout", watch, nil)
	go a.copyLines(&readers, errR, name, "stderr", watch, p.addTail)
	go func() {
		// Whatever the script left behind in its group goes with it; then
		// nothing holds the pipes open any more.
		p.waitErr = p.waitAndEnd()
		readDone := make(chan struct{})
		go func() { readers.Wait(); close(readDone) }()
		select {
		case <-readDone:
		case <-time.After(5 * time.Second):
			// A process that left the group still holds a pipe.
			outR.Close()
			errR.Close()
			<-readDone
		}
		close(p.done)
	}()
	return p, nil
}

// copyLines logs r line by line (long lines in pieces), with secrets
// redacted.
func (a *agent) copyLines(wg *sync.WaitGroup, r *os.File, name, stream string, watch func(string), tail func(string)) {
	defer wg.Done()
	defer r.Close()
	const maxLine = 64 << 10
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), maxLine)
	sc.Split(func(data []byte, atEOF bool) (int, []byte, error) {
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			return i + 1, bytes.TrimSuffix(data[:i], []byte("\r")), nil
		}
		if len(data) >= maxLine || (atEOF && len(data) > 0) {
			return len(data), data, nil
		}
		return 0, nil, nil
	})
	for sc.Scan() {
		line := a.redact(sc.Text())
		a.log.Info("runner output", "script", name, "stream", stream, "line", line)
		if watch != nil {
			watch(line)
		}
		if tail != nil {
			tail(line)
		}
	}
	_, _ = io.Copy(io.Discard, r)
}

func (a *agent) redact(line string) string {
	for _, s := range a.secrets {
		line = strings.ReplaceAll(line, s, "[REDACTED]")
	}
	return line
}

func (p *process) addTail(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tail = append(p.tail, line)
	if len(p.tail) > tailLines {
		p.tail = p.tail[len(p.tail)-tailLines:]
	}
}

func (p *process) stderrTail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.TrimSpace(strings.Join(p.tail, "\n"))
}

// stop interrupts the process group (SIGINT; on Windows CTRL_BREAK), then
// kills it after grace, and waits for the process to end.
func (p *process) stop(grace time.Duration) {
	p.interruptGroup()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return
	case <-t.C:
	}
	p.killGroup()
	<-p.done
}

// exitCode is the script's exit status; -1 when a signal ended it.
func (p *process) exitCode() int {
	if p.cmd.ProcessState == nil {
		return -1
	}
	return p.cmd.ProcessState.ExitCode()
}

func (p *process) describeExit() string {
	st := p.cmd.ProcessState
	if st == nil {
		return fmt.Sprintf("did not run: %v", p.waitErr)
	}
	if sig, ok := killedBy(st); ok {
		return "killed by signal " + sig
	}
	var ee *exec.ExitError
	if p.waitErr != nil && !errors.As(p.waitErr, &ee) {
		return fmt.Sprintf("exit status %d (%v)", st.ExitCode(), p.waitErr)
	}
	return fmt.Sprintf("exit status %d", st.ExitCode())
}
