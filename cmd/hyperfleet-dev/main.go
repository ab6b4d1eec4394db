// Command hyperfleet-dev runs HyperFleet's whole loop on this machine: a
// real kube-apiserver and etcd, the Proxmox VE and GitHub simulators (and
// Buildkite's or GitLab's with --platform), the operator and simulated VMs
// running the real hyperfleet-agent (`make dev`).
//
// It is a binary of its own, not a command of the operator, so that the
// operator (cmd/hyperfleet) links none of this test world: the simulators,
// internal/testworld/devenv, test/testenv and envtest (cmd/hyperfleet/deps_test.go
// keeps it so).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "hyperfleet-dev:", err)
		os.Exit(1)
	}
}

const usage = `Usage: hyperfleet-dev [flags]   (make dev DEV_FLAGS="...")

Runs HyperFleet's whole loop on this machine: a real kube-apiserver and etcd
(built from source and cached on the first run), the Proxmox VE and GitHub
simulators (and Buildkite's or GitLab's with --platform buildkite or gitlab),
the operator, and simulated VMs running the real hyperfleet-agent. It queues
--jobs CI jobs on the --platform's simulator and shows jobs, claims and VMs as
they change.

While it runs: press Enter to queue one more job, type a number and Enter to
queue that many, type q and Enter (or Ctrl-C) to stop.

`

func run(args []string) error {
	fs := flag.NewFlagSet("hyperfleet-dev", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), usage); fs.PrintDefaults() }
	jobs := fs.Int("jobs", 5, "jobs to queue at start")
	jobDuration := fs.Duration("job-duration", 3*time.Second, "how long each simulated job runs")
	minReplicas := fs.Int("min-replicas", 0, "RunnerPool minReplicas (warm VMs kept ready)")
	maxReplicas := fs.Int("max-replicas", 5, "RunnerPool maxReplicas")
	dir := fs.String("dir", "", "directory for the kubeconfig, logs and guest consoles (default: a new one under the system's temp dir)")
	exitWhenDone := fs.Bool("exit-when-done", false, "exit once every job ran and the pool is back to minReplicas (for scripts and CI); exit status 1 on --timeout")
	timeout := fs.Duration("timeout", 20*time.Minute, "with --exit-when-done: give up after this long")
	refresh := fs.Duration("refresh", time.Second, "how often the table is refreshed")
	verbose := fs.Int("v", 0, "operator log verbosity (0 info, 1 debug) in <dir>/operator.log")
	simAdmin := fs.Bool("simulator-admin", false, "enable the simulators' /_sim/ admin APIs (state dumps, faults, clock); loopback clients only")
	timings := fs.String("timings", "fast", "the Proxmox simulator's timing preset: fast (clone 1 s, boot 2 s, status refresh 1 s) or realistic (Proxmox VE's own: status refresh 10 s, clone 5 s, boot 20 s; docs/testing.md)")
	notices := fs.Bool("power-off-notices", true, "guests announce their power-off to the operator, which then reads their VM at once instead of waiting for the status refresh (docs/architecture.md, \"Power-off hints\"); false leaves detection to the listing")
	spiffe := fs.Bool("spiffe", false, "give every VM a SPIFFE identity: run a real spire-server (built from source and cached on the first run), attest each VM's spire-agent with a join token and hand out runner credentials through the operator's credential broker (docs/identity.md)")
	secretStore := fs.Bool("secret-store", false, "with --spiffe: hand out runner credentials through a secrets store instead of the broker: run a fake Vault on loopback HTTPS whose JWT auth trusts spire-server's keys; each VM logs in with its JWT-SVID and reads its credential once (docs/secrets-store.md)")
	tpm := fs.Bool("tpm", false, "with --spiffe: attest every VM with its TPM instead of a join token: each simulated VM gets a swtpm virtual TPM whose EK the Proxmox simulator's swtpm local CA certifies, the operator certifies a DevID key in it, and spire-agent attests with tpm_devid (docs/identity.md, \"TPM\")")
	platform := fs.String("platform", "github", "the CI platform of the pool and its jobs: github (GitHub Actions runners), buildkite (the real buildkite-agent, built from source and cached on the first run, in every VM; docs/buildkite.md) or gitlab (a runner of the GitLab simulator's group in every VM: the simulator's gitlab-runner stand-in; docs/gitlab.md)")
	metricsAddr := fs.String("metrics-bind-address", "", "serve the operator's Prometheus /metrics at this address (e.g. 127.0.0.1:8080; port 0 picks a free one); empty: off")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	workloadType, ok := platforms[*platform]
	switch {
	case !ok:
		return fmt.Errorf("--platform %q: use github, buildkite or gitlab", *platform)
	case *jobs < 0:
		return errors.New("--jobs must not be negative")
	case *maxReplicas < 1 || *minReplicas < 0 || *minReplicas > *maxReplicas:
		return errors.New("--min-replicas and --max-replicas: need 0 <= min <= max and max >= 1")
	case *tpm && !*spiffe:
		return errors.New("--tpm needs --spiffe: the TPM attests the VM's spire-agent")
	case *secretStore && !*spiffe:
		return errors.New("--secret-store needs --spiffe: the VMs log in to the store with their JWT-SVIDs")
	}
	if *dir == "" {
		d, err := os.MkdirTemp("", "hyperfleet-dev-")
		if err != nil {
			return err
		}
		*dir = d
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	progress := os.Stderr
	agent, err := buildAgent(ctx, *dir, progress)
	if err != nil {
		return err
	}
	opts := devenv.Options{
		Dir: *dir, AgentBinary: agent, Progress: progress, LogLevel: *verbose,
		MinReplicas: int32(*minReplicas), MaxReplicas: int32(*maxReplicas), SimulatorAdmin: *simAdmin, MetricsAddr: *metricsAddr,
		Timings: *timings, NoPowerOffNotices: !*notices,
		SPIFFE: *spiffe, SecretStore: *secretStore, TPM: *tpm,
		Platform: workloadType,
	}
	if workloadType == hfv1.WorkloadBuildkite {
		if opts.BuildkiteAgentBinary, err = buildBuildkiteAgent(ctx, progress); err != nil {
			return err
		}
	}
	w, err := devenv.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer func() {
		fmt.Fprintln(progress, "==> Stopping (files kept in "+*dir+")")
		if err := w.Stop(); err != nil {
			fmt.Fprintln(progress, "hyperfleet-dev: stop:", err)
		}
	}()
	fmt.Fprintf(progress, "==> Ready. In another terminal:\n    export KUBECONFIG=%s\n    kubectl get runnerpools,machineclaims -n %s\n", w.KubeconfigPath, devenv.Namespace)
	if w.MetricsURL != "" {
		fmt.Fprintf(progress, "    Operator metrics: %s\n", w.MetricsURL)
	}
	if w.VaultURL != "" {
		fmt.Fprintf(progress, "    Secrets store (fake Vault): %s\n", w.VaultURL)
	}
	if *simAdmin {
		fmt.Fprintf(progress, "    Simulator admin APIs: %s/_sim/ and %s/_sim/\n", strings.TrimSuffix(w.ProxmoxURL, "/api2/json"), w.GitHubURL)
	}
	if w.Buildkite != nil {
		fmt.Fprintf(progress, "    Buildkite simulator: %s (organization %s, pipeline %s, queue %s)\n", w.Buildkite.URL, devenv.BuildkiteOrganization, devenv.BuildkitePipeline, devenv.JobLabel)
	}
	if w.GitLab != nil {
		fmt.Fprintf(progress, "    GitLab simulator: %s (group %s, project %s, runner tag %s)\n", w.GitLab.URL, devenv.GitLabGroup, devenv.GitLabProject, devenv.JobLabel)
	}
	if err := w.QueueJobs(*jobs, *jobDuration); err != nil {
		return err
	}

	quit := make(chan struct{})
	enqueue := func(n int) error { return w.QueueJobs(n, *jobDuration) }
	go readCommands(os.Stdin, enqueue, quit, progress)

	var deadline <-chan time.Time
	if *exitWhenDone {
		deadline = time.After(*timeout)
	}
	table := &liveTable{out: os.Stdout, tty: isTerminal(os.Stdout)}
	tick := time.NewTicker(*refresh)
	defer tick.Stop()
	for {
		snap, err := w.Snapshot(ctx)
		if err == nil {
			table.show(snap, *minReplicas, *maxReplicas)
			if *exitWhenDone && len(snap.PlatformJobs) > 0 && snap.Done(*minReplicas) {
				fmt.Fprintf(progress, "==> All %d jobs ran; the pool is back to %d VMs.\n", len(snap.PlatformJobs), *minReplicas)
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-quit:
			return nil
		case <-deadline:
			return fmt.Errorf("not done after %s (see %s/operator.log)", *timeout, *dir)
		case <-tick.C:
		}
	}
}

// platforms are --platform's values.
var platforms = map[string]hfv1.WorkloadType{
	"github": hfv1.WorkloadGitHubActions, "buildkite": hfv1.WorkloadBuildkite, "gitlab": hfv1.WorkloadGitLabCI,
}

// buildBuildkiteAgent returns the buildkite-agent the Buildkite simulator
// serves as its release tarball, which every VM downloads: what
// hack/buildkite-agent/build.sh prints (built from Buildkite's source the
// first time, a few minutes, then cached).
func buildBuildkiteAgent(ctx context.Context, progress io.Writer) (string, error) {
	fmt.Fprintln(progress, "==> Building buildkite-agent (the first run builds it from source, then cached)")
	var out strings.Builder
	cmd := exec.CommandContext(ctx, "bash", filepath.Join("hack", "buildkite-agent", "build.sh"))
	cmd.Dir = testenv.RepoRoot()
	cmd.Stdout, cmd.Stderr = &out, progress
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build buildkite-agent with hack/buildkite-agent/build.sh: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	return strings.TrimSpace(lines[len(lines)-1]), nil
}

// buildAgent builds the agent from this checkout into dir/bin: the guests
// run the very binary a template would carry.
func buildAgent(ctx context.Context, dir string, progress io.Writer) (string, error) {
	out := filepath.Join(dir, "bin", "hyperfleet-agent")
	fmt.Fprintln(progress, "==> Building hyperfleet-agent (static binary, run by every simulated VM)")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, "./cmd/hyperfleet-agent")
	cmd.Dir = testenv.RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = progress, progress
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build hyperfleet-agent (run from a HyperFleet checkout with Go installed): %w", err)
	}
	return out, nil
}

// readCommands queues jobs from the user's input until EOF or "q".
func readCommands(in io.Reader, enqueue func(n int) error, quit chan<- struct{}, out io.Writer) {
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		n := 1
		switch {
		case line == "q" || line == "quit":
			close(quit)
			return
		case line != "":
			v, err := strconv.Atoi(line)
			if err != nil || v < 1 || v > 1000 {
				fmt.Fprintln(out, "Enter queues one job, a number (1-1000) queues that many, q quits.")
				continue
			}
			n = v
		}
		if err := enqueue(n); err != nil {
			fmt.Fprintln(out, "queue:", err)
		}
	}
}
