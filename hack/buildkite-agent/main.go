// Command buildkite-agent is the real Buildkite agent's job loop, built from
// the github.com/buildkite/agent/v3 module that this directory's go.mod
// requires, for HyperFleet's Buildkite test world
// (internal/testworld/simulator/buildkite).
//
// The agent's own main (its clicommand package) does not build here: every
// release from v3.62 on imports drjosh.dev/zzglob, which the Go module proxy
// refuses. Its agent and api packages build, and they are the part that
// speaks to Buildkite: registration, connect, ping, job acquisition, accept,
// start, log chunks, finish and disconnect are the agent's code
// (agent.AgentWorker, agent.JobRunner, api.Client, core.Client). What this
// main replaces is the command line (only the flags below, with the real
// agent's names and environment variables) and the `bootstrap` subcommand
// the job runner starts for each job: the real one checks out the
// repository and runs hooks and plugins; this one (runBootstrap) runs the
// job's BUILDKITE_COMMAND with bash in a checkout directory under the build
// path and exits with its status. See docs/testing.md, "The Buildkite
// agent".
//
//	buildkite-agent start --token T --endpoint URL [--name N] [--tags k=v,...]
//	    [--acquire-job ID] [--disconnect-after-job] [--build-path DIR]
//	    [--bootstrap-script CMD] [--spawn N]
//	buildkite-agent bootstrap   (started by the agent for each job)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/buildkite/agent/v3/agent"
	"github.com/buildkite/agent/v3/api"
	"github.com/buildkite/agent/v3/core"
	"github.com/buildkite/agent/v3/logger"
	"github.com/buildkite/agent/v3/metrics"
	"github.com/buildkite/agent/v3/version"
	"github.com/buildkite/shellwords"
)

// The exit codes the real `buildkite-agent start` gives when --acquire-job
// cannot take its job (its `start` command, v3.138.1): the
// job was taken or cancelled (27), or is locked behind its dependencies (28).
const (
	exitAcquisitionRejected = 27
	exitJobLocked           = 28
)

// The real agent's default --endpoint (v3.138.1).
const defaultEndpoint = "https://agent-edge.buildkite.com/v3"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: buildkite-agent start [flags] | bootstrap | --version")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "start":
		os.Exit(start(os.Args[2:]))
	case "bootstrap":
		os.Exit(runBootstrap())
	case "--version", "-v", "version":
		// The real agent prints "buildkite-agent version 3.x.y+build".
		fmt.Printf("buildkite-agent version %s+%s\n", version.Version(), version.BuildNumber())
	default:
		fmt.Fprintf(os.Stderr, "buildkite-agent: unknown command %q (this build has start and bootstrap)\n", os.Args[1])
		os.Exit(2)
	}
}

// startEnv are the environment variables start's flags read.
var startEnv = []string{
	"BUILDKITE_AGENT_TOKEN", "BUILDKITE_AGENT_ENDPOINT", "BUILDKITE_AGENT_NAME", "BUILDKITE_AGENT_TAGS",
	"BUILDKITE_AGENT_ACQUIRE_JOB", "BUILDKITE_AGENT_DISCONNECT_AFTER_JOB", "BUILDKITE_BUILD_PATH",
	"BUILDKITE_BOOTSTRAP_SCRIPT_PATH", "BUILDKITE_AGENT_SPAWN", "BUILDKITE_AGENT_DEBUG",
}

// env returns the environment variable name's value, or def when unset: the
// real agent reads every flag from an environment variable too.
func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func envBool(name string) bool {
	b, _ := strconv.ParseBool(os.Getenv(name))
	return b
}

func start(args []string) int {
	fs := flag.NewFlagSet("start", flag.ContinueOnError)
	token := fs.String("token", env("BUILDKITE_AGENT_TOKEN", ""), "the agent (registration) token")
	endpoint := fs.String("endpoint", env("BUILDKITE_AGENT_ENDPOINT", defaultEndpoint), "the agent API endpoint")
	name := fs.String("name", env("BUILDKITE_AGENT_NAME", ""), "the agent's name (%spawn is replaced with its index)")
	tags := fs.String("tags", env("BUILDKITE_AGENT_TAGS", ""), "comma-separated key=value tags")
	acquire := fs.String("acquire-job", env("BUILDKITE_AGENT_ACQUIRE_JOB", ""), "acquire and run this job id only")
	disconnect := fs.Bool("disconnect-after-job", envBool("BUILDKITE_AGENT_DISCONNECT_AFTER_JOB"), "disconnect after one job")
	buildPath := fs.String("build-path", env("BUILDKITE_BUILD_PATH", ""), "where jobs' checkouts are made")
	bootstrap := fs.String("bootstrap-script", env("BUILDKITE_BOOTSTRAP_SCRIPT_PATH", ""), "the command that runs each job")
	spawnDefault, _ := strconv.Atoi(env("BUILDKITE_AGENT_SPAWN", "1"))
	spawn := fs.Int("spawn", spawnDefault, "how many agents to run (this build runs exactly 1)")
	debug := fs.Bool("debug", envBool("BUILDKITE_AGENT_DEBUG"), "debug logging")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "buildkite-agent start: unexpected arguments %q\n", fs.Args())
		return 2
	}
	// As the real `start` does (clicommand.UnsetConfigFromEnvironment):
	// the flags' environment variables, the registration token's among
	// them, leave the agent's environment before anything runs, so that
	// the bootstrap (which inherits it) never sees them.
	for _, name := range startEnv {
		_ = os.Unsetenv(name)
	}
	if *token == "" {
		fmt.Fprintln(os.Stderr, "buildkite-agent start: missing --token (or BUILDKITE_AGENT_TOKEN)")
		return 2
	}
	if *buildPath == "" {
		fmt.Fprintln(os.Stderr, "buildkite-agent start: missing --build-path (or BUILDKITE_BUILD_PATH)")
		return 2
	}
	// The real agent spawns several workers; HyperFleet's VMs run one job
	// each, and one worker is all this build supports (said, not ignored).
	if *spawn != 1 {
		fmt.Fprintln(os.Stderr, "buildkite-agent start: this build runs --spawn 1 only")
		return 2
	}
	if *bootstrap == "" {
		exe, err := os.Executable()
		if err != nil {
			fmt.Fprintf(os.Stderr, "buildkite-agent start: %v\n", err)
			return 1
		}
		// As the real agent: its own executable's bootstrap subcommand.
		*bootstrap = shellwords.Quote(exe) + " bootstrap"
	}
	if *name == "" {
		host, _ := os.Hostname()
		*name = host + "-%spawn"
	}

	printer := logger.NewTextPrinter(os.Stderr)
	l := logger.NewConsoleLogger(printer, os.Exit)
	// The real agent's default --log-level is notice.
	l.SetLevel(logger.NOTICE)
	if *debug {
		l.SetLevel(logger.DEBUG)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	err := run(ctx, l, runConfig{
		token: *token, endpoint: *endpoint, name: strings.ReplaceAll(*name, "%spawn", "1"),
		tags: splitList(*tags), acquireJob: *acquire, disconnectAfterJob: *disconnect,
		buildPath: *buildPath, bootstrapScript: *bootstrap, debug: *debug,
	})
	var exit core.ProcessExit
	switch {
	case err == nil:
		return 0
	case errors.Is(err, core.ErrJobAcquisitionRejected):
		l.Errorf("%v", err)
		return exitAcquisitionRejected
	case errors.Is(err, core.ErrJobLocked):
		l.Errorf("%v", err)
		return exitJobLocked
	case errors.As(err, &exit):
		// The job ran and failed: the agent did its part (the real agent
		// without --reflect-exit-status exits 0 here too).
		return 0
	default:
		l.Errorf("%v", err)
		return 1
	}
}

type runConfig struct {
	token, endpoint, name string
	tags                  []string
	acquireJob            string
	disconnectAfterJob    bool
	buildPath             string
	bootstrapScript       string
	debug                 bool
}

// run is the part of the real agent's `start` command (v3.138.1) that this
// build needs: the agent configuration, the API client, registration
// through core.Client, one AgentWorker in an AgentPool, and the pool's run
// to its end.
func run(ctx context.Context, l logger.Logger, c runConfig) error {
	if err := os.MkdirAll(c.buildPath, 0o755); err != nil {
		return fmt.Errorf("create build path: %w", err)
	}
	conf := agent.AgentConfiguration{
		BootstrapScript:    c.bootstrapScript,
		BuildPath:          c.buildPath,
		CommandEval:        true,
		DisconnectAfterJob: c.disconnectAfterJob,
		AcquireJob:         c.acquireJob,
		// The real agent's flag defaults:
		// cancel grace 10 s, signal grace 9 s; no PTY, so that the log the
		// simulator records is the command's bytes.
		CancelGracePeriod: 10,
		SignalGracePeriod: 9 * time.Second,
		Shell:             "/bin/bash -e -c",
		ANSITimestamps:    false,
		TimestampLines:    false,
	}
	tags, err := agent.FetchTags(ctx, l, agent.FetchTagsConfig{Tags: c.tags})
	if err != nil {
		return fmt.Errorf("tags: %w", err)
	}
	apiClient := api.NewClient(l, api.Config{
		Endpoint:  c.endpoint,
		Token:     c.token,
		UserAgent: fmt.Sprintf("buildkite-agent/%s.%s (%s; %s)", version.Version(), version.BuildNumber(), "linux", "hyperfleet-testworld"),
		DebugHTTP: c.debug,
	})
	client := &core.Client{APIClient: apiClient, Logger: l}
	reg, err := client.Register(ctx, api.AgentRegisterRequest{
		Name:               c.name,
		ScriptEvalEnabled:  true,
		Tags:               tags,
		IgnoreInDispatches: c.acquireJob != "",
	})
	if err != nil {
		return fmt.Errorf("register: %w", err)
	}
	mc := metrics.NewCollector(l, metrics.CollectorConfig{})
	worker := agent.NewAgentWorker(l.WithFields(logger.StringField("agent", reg.Name)), reg, mc, apiClient, agent.AgentWorkerConfig{
		AgentConfiguration: conf,
		CancelSignal:       15, // SIGTERM, the real agent's --cancel-signal default
		SignalGracePeriod:  conf.SignalGracePeriod,
		Debug:              c.debug,
		SpawnIndex:         1,
		AgentStdout:        os.Stdout,
	})
	pool, err := agent.NewAgentPool([]*agent.AgentWorker{worker}, &conf)
	if err != nil {
		return fmt.Errorf("agent pool: %w", err)
	}
	return pool.Start(ctx)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// runBootstrap is this build's job runner in place of the real `bootstrap`:
// the agent's JobRunner starts it with the job's environment and uploads
// what it writes as the job's log. It makes the checkout directory the real
// bootstrap would (BUILDKITE_BUILD_PATH/<agent name>/<org>/<pipeline>), runs
// BUILDKITE_COMMAND there with bash -e -c (the real default shell), and
// exits with the command's status, which the agent reports on finish.
func runBootstrap() int {
	command := os.Getenv("BUILDKITE_COMMAND")
	if strings.TrimSpace(command) == "" {
		fmt.Fprintln(os.Stderr, "bootstrap: the job has no BUILDKITE_COMMAND (this build runs command steps only)")
		return 1
	}
	dir := filepath.Join(os.Getenv("BUILDKITE_BUILD_PATH"),
		sanitize(os.Getenv("BUILDKITE_AGENT_NAME")),
		sanitize(os.Getenv("BUILDKITE_ORGANIZATION_SLUG")),
		sanitize(os.Getenv("BUILDKITE_PIPELINE_SLUG")))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "bootstrap: create checkout directory: %v\n", err)
		return 1
	}
	fmt.Printf("~~~ Running commands\n$ %s\n", command)
	cmd := exec.Command("/bin/bash", "-e", "-c", command)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr, cmd.Stdin = os.Stdout, os.Stderr, nil
	cmd.Env = append(os.Environ(), "BUILDKITE_BUILD_CHECKOUT_PATH="+dir)
	err := cmd.Run()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exitErr):
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return exitErr.ExitCode()
	default:
		fmt.Fprintf(os.Stderr, "bootstrap: %v\n", err)
		return 1
	}
}

// sanitize keeps a path element from climbing out of the build path, as
// the real bootstrap's dirForAgentName does for the agent's name.
func sanitize(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == '/' || r == '\\' || r == 0 {
			return '-'
		}
		return r
	}, s)
	if s == "" || s == "." || s == ".." {
		return "_"
	}
	return s
}
