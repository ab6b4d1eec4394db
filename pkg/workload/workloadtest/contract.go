// Package workloadtest is the workload contract suite: the behaviour every
// CI platform's workload.Provider owes the controllers (pkg/workload's
// documentation), checked in the platform's neutral terms against a
// platform simulator. Each back-end's tests run it with a Harness of their
// simulator, so that every platform is held to the same contract
// (docs/architecture.md, "CI platforms as plug-ins").
//
// The platforms differ where their runner models do, and a harness says
// how through Capabilities instead of the suite skipping cases: GitHub's
// JIT configuration and GitLab's runner creation register the runner when
// the credential is issued, while Buildkite's credential is a cluster agent
// token for one VM and the agent exists only once buildkite-agent registers
// with it (the suite then starts the runner software through
// Harness.StartRunner and checks that nothing was registered before);
// Buildkite binds every credential to one queued job (its job acquisition
// token), so the suite queues a job for each runner it issues there, and
// the runner takes it as soon as it starts;
// GitHub and GitLab number their runners, while Buildkite's agent ids are
// UUIDs that workload.Runner.ID cannot hold, so Buildkite's runners are
// found and removed by name; a Buildkite agent is stopped through its next
// ping, so its removal is waited for. Job ids are decimal numbers on
// GitHub and GitLab and UUIDs on Buildkite; the suite checks every
// platform's against what the API admits (hfv1.ValidateJobID).
//
// The generic workload (pkg/workload/generic) does not run the suite: it
// has no CI platform, so no Provider, credential, runner or job (its VMs
// run a script the template gives, and its claims end with the VM).
package workloadtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// Capabilities says where a platform's runner model differs from the
// contract's common shape; the suite checks the platform's own behaviour
// in each case, never skips it.
type Capabilities struct {
	// RegistersOnIssue: IssueCredential registers the runner (GitHub's JIT
	// configuration, GitLab's runner authentication token), so GetRunner
	// finds it before any runner software runs. False where the VM's
	// runner software registers itself with the credential (Buildkite's
	// agent token): GetRunner then finds nothing until StartRunner ran.
	RegistersOnIssue bool
	// NumericRunnerIDs: the platform numbers its runners (GitHub, GitLab),
	// so Runner.ID is set. False where its ids do not fit an int64
	// (Buildkite's UUIDs): Runner.ID is zero and runners are removed by
	// name.
	NumericRunnerIDs bool
	// Expiring: the credential expires on its own (Buildkite's agent
	// tokens), so Credential.ExpiresAt is set and after IssuedAt.
	Expiring bool
	// BindsJobs: every credential is for one queued job (RunnerSpec.Job;
	// Buildkite's job acquisition token), and a runner bound to none gets
	// no credential (ErrJobNotBindable). The suite queues a job for each
	// runner it issues; a started runner takes that job at once, so it may
	// be busy where others are idle, and its job's run is cancelled before
	// it is deregistered.
	BindsJobs bool
	// EventualRemoval: deregistering a connected runner takes effect when
	// its runner software next asks the platform (Buildkite's agent stop
	// answers the agent's next ping), so the suite waits, up to
	// RemovalTimeout, for GetRunner to stop finding it.
	EventualRemoval bool
}

// RemovalTimeout bounds the wait for an EventualRemoval platform's runner
// to go after deregistration.
const RemovalTimeout = 15 * time.Second

// Harness is one platform's account on its simulator.
type Harness struct {
	// Capabilities are the platform's differences.
	Capabilities Capabilities
	// Provider is the account under test, its scope holding Repository.
	Provider workload.Provider
	// Repository is a repository (full path) of the scope jobs are queued
	// in; Outside one outside the scope.
	Repository, Outside string
	// Spec is the runner the suite issues a credential for; its Name is
	// made unique per use.
	Spec workload.RunnerSpec
	// QueueJob queues a job asking for labels in repository, that waits for
	// a runner until it is taken or cancelled, and returns its id.
	QueueJob func(t *testing.T, repository string, labels []string) string
	// UnknownJobID is a well-formed job id no job has.
	UnknownJobID string
	// TakeJob makes the runner of cred take job id as the platform's own
	// runner software does, and returns once the platform reports it
	// running (the runner is then busy). It may leave a process running
	// until the test ends.
	TakeJob func(t *testing.T, cred workload.Credential, id string)
	// StartRunner starts the platform's runner software with cred and
	// returns once the platform has it registered and online, taking no
	// job. Required unless Capabilities.RegistersOnIssue.
	StartRunner func(t *testing.T, cred workload.Credential)
}

// Run runs the contract against the harnesses newHarness builds (one per
// subtest, so that they do not share state).
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	harness := func(t *testing.T) Harness {
		t.Helper()
		h := newHarness(t)
		if !h.Capabilities.RegistersOnIssue && h.StartRunner == nil {
			t.Fatal("the harness has no StartRunner, and its credentials do not register runners (Capabilities.RegistersOnIssue)")
		}
		return h
	}
	t.Run("credential and runner lifecycle", func(t *testing.T) { runnerLifecycle(t, harness(t)) })
	t.Run("queued jobs and cancellation", func(t *testing.T) { jobs(t, harness(t)) })
	t.Run("busy runner stays", func(t *testing.T) { busyRunner(t, harness(t)) })
}

func issue(t *testing.T, h Harness, name string) workload.Credential {
	t.Helper()
	spec := h.Spec
	spec.Name = name
	spec.Labels = slices.Clone(h.Spec.Labels)
	if h.Capabilities.BindsJobs {
		if cred, err := h.Provider.IssueCredential(context.Background(), spec); !errors.Is(err, workload.ErrJobNotBindable) || !cred.Secret.IsZero() {
			t.Fatalf("IssueCredential(%s) bound to no job: %+v, %v; want ErrJobNotBindable", name, cred, err)
		}
		spec.Job, spec.JobRepository = h.QueueJob(t, h.Repository, h.Spec.Labels), h.Repository
	}
	cred, err := h.Provider.IssueCredential(context.Background(), spec)
	if err != nil {
		t.Fatalf("IssueCredential(%s): %v", name, err)
	}
	if cred.Job != spec.Job {
		t.Fatalf("credential of %s is for job %q, want %q", name, cred.Job, spec.Job)
	}
	if cred.Secret.IsZero() || cred.RunnerName != name || cred.IssuedAt.IsZero() {
		t.Fatalf("credential of %s: %+v", name, cred)
	}
	if printed := fmt.Sprintf("%v %+v %#v %s", cred, cred, cred, cred.Secret); strings.Contains(printed, cred.Secret.Reveal()) {
		t.Fatalf("the credential's secret prints: %s", printed)
	}
	if h.Capabilities.Expiring != (!cred.ExpiresAt.IsZero() && cred.ExpiresAt.After(cred.IssuedAt)) {
		t.Fatalf("credential of %s: expires at %s, issued at %s (expiring: %v)", name, cred.ExpiresAt, cred.IssuedAt, h.Capabilities.Expiring)
	}
	return cred
}

// runnerLifecycle: the scope verifies; an issued runner (once its runner
// software registered, where the credential does not register it) is
// found by name and prefix (and not by another prefix); deregistering it,
// twice, leaves it gone.
func runnerLifecycle(t *testing.T, h Harness) {
	ctx := context.Background()
	if err := h.Provider.VerifyScope(ctx); err != nil {
		t.Fatalf("VerifyScope: %v", err)
	}
	cred := issue(t, h, "contract-life-1")
	if !h.Capabilities.RegistersOnIssue {
		if r, err := h.Provider.GetRunner(ctx, "contract-life-1"); !errors.Is(err, workload.ErrNotFound) {
			t.Fatalf("GetRunner before the runner software registered: %v %+v, want ErrNotFound", err, r)
		}
		h.StartRunner(t, cred)
	}
	r, err := h.Provider.GetRunner(ctx, "contract-life-1")
	if err != nil || r.Name != "contract-life-1" || cred.RunnerID != 0 && r.ID != cred.RunnerID || r.State == workload.RunnerBusy && !h.Capabilities.BindsJobs ||
		h.Capabilities.NumericRunnerIDs != (r.ID != 0) {
		t.Fatalf("GetRunner: %v %+v", err, r)
	}
	if !workload.Covers(r.Labels, h.Spec.Labels) {
		t.Fatalf("runner labels %v do not cover the spec's %v", r.Labels, h.Spec.Labels)
	}
	list, err := h.Provider.ListRunners(ctx, "contract-life-")
	if err != nil || !slices.ContainsFunc(list, func(x workload.Runner) bool { return x.Name == "contract-life-1" }) {
		t.Fatalf("ListRunners(contract-life-): %v %+v", err, list)
	}
	if list, err := h.Provider.ListRunners(ctx, "contract-other-"); err != nil || len(list) != 0 {
		t.Fatalf("ListRunners(contract-other-): %v %+v", err, list)
	}
	if h.Capabilities.BindsJobs {
		// The runner took the job it was bound to: its run is cancelled,
		// and the runner is left with no job.
		j, err := h.Provider.GetJob(ctx, h.Repository, cred.Job)
		if err != nil {
			t.Fatalf("GetJob of the runner's job: %v", err)
		}
		if err := h.Provider.CancelRun(ctx, h.Repository, j.RunID); err != nil {
			t.Fatalf("CancelRun of the runner's job: %v", err)
		}
		waitFor(t, RemovalTimeout, "the runner's cancelled job leaves it", func() bool {
			r, err := h.Provider.GetRunner(ctx, "contract-life-1")
			return errors.Is(err, workload.ErrNotFound) || err == nil && r.State != workload.RunnerBusy
		})
	}
	if _, err := h.Provider.GetRunner(ctx, "contract-none"); !errors.Is(err, workload.ErrNotFound) {
		t.Fatalf("GetRunner of no runner: %v, want ErrNotFound", err)
	}
	for i := range 2 {
		if err := h.Provider.DeregisterRunner(ctx, r.ID, r.Name); err != nil {
			t.Fatalf("DeregisterRunner #%d: %v", i+1, err)
		}
	}
	if h.Capabilities.EventualRemoval {
		waitFor(t, RemovalTimeout, "the deregistered runner is gone", func() bool {
			_, err := h.Provider.GetRunner(ctx, "contract-life-1")
			return errors.Is(err, workload.ErrNotFound)
		})
	}
	if _, err := h.Provider.GetRunner(ctx, "contract-life-1"); !errors.Is(err, workload.ErrNotFound) {
		t.Fatalf("GetRunner after deregistration: %v, want ErrNotFound", err)
	}
	if err := h.Provider.DeregisterRunner(ctx, r.ID, r.Name); err != nil {
		t.Fatalf("DeregisterRunner of a gone runner: %v", err)
	}
}

// jobs: a queued job is listed with its labels for its repository only,
// read by id, and its run cancelled. The job is queued before the
// repositories are listed: a Buildkite organization's repositories are the
// pipelines with open builds (the only ones that can hold a queued job).
func jobs(t *testing.T, h Harness) {
	ctx := context.Background()
	id := h.QueueJob(t, h.Repository, h.Spec.Labels)
	if err := hfv1.ValidateJobID(id); err != nil {
		t.Fatalf("job id %q does not fit the API: %v", id, err)
	}
	repos, err := h.Provider.Repositories(ctx)
	if err != nil || !slices.Contains(repos, h.Repository) || slices.Contains(repos, h.Outside) {
		t.Fatalf("Repositories: %v %v (want %s, not %s)", err, repos, h.Repository, h.Outside)
	}
	queued, err := h.Provider.QueuedJobs(ctx, []string{h.Repository})
	if err != nil {
		t.Fatalf("QueuedJobs: %v", err)
	}
	i := slices.IndexFunc(queued, func(j workload.Job) bool { return j.ID == id })
	if i < 0 {
		t.Fatalf("QueuedJobs does not list job %s: %+v", id, queued)
	}
	j := queued[i]
	if j.State != workload.JobQueued || !strings.EqualFold(j.Repository, h.Repository) || !workload.Covers(h.Spec.Labels, j.Labels) || j.RunID == 0 {
		t.Fatalf("queued job: %+v", j)
	}
	if outside, err := h.Provider.QueuedJobs(ctx, []string{h.Outside}); err == nil && slices.ContainsFunc(outside, func(x workload.Job) bool { return x.ID == id }) {
		t.Fatalf("job %s listed for %s", id, h.Outside)
	}
	got, err := h.Provider.GetJob(ctx, h.Repository, id)
	if err != nil || got.ID != id || got.Platform != j.Platform || got.Platform == "" || got.State != workload.JobQueued || got.RunID != j.RunID {
		t.Fatalf("GetJob: %v %+v", err, got)
	}
	if _, err := h.Provider.GetJob(ctx, h.Repository, h.UnknownJobID); !errors.Is(err, workload.ErrNotFound) {
		t.Fatalf("GetJob of no job: %v, want ErrNotFound", err)
	}
	if err := h.Provider.CancelRun(ctx, h.Repository, j.RunID); err != nil {
		t.Fatalf("CancelRun: %v", err)
	}
	waitFor(t, 10*time.Second, "the cancelled job completes", func() bool {
		got, err := h.Provider.GetJob(ctx, h.Repository, id)
		return err == nil && got.State == workload.JobCompleted
	})
}

// busyRunner: a runner running a job is busy, and deregistering it
// returns ErrRunnerBusy and leaves it.
func busyRunner(t *testing.T, h Harness) {
	ctx := context.Background()
	cred := issue(t, h, "contract-busy-1")
	id := cred.Job
	if id == "" {
		id = h.QueueJob(t, h.Repository, h.Spec.Labels)
	}
	// A platform whose runner software registers itself gets its runner
	// from TakeJob alone, as a VM's runner registers and takes its job.
	h.TakeJob(t, cred, id)
	r, err := h.Provider.GetRunner(ctx, "contract-busy-1")
	if err != nil || r.State != workload.RunnerBusy {
		t.Fatalf("GetRunner of the busy runner: %v %+v", err, r)
	}
	running, err := h.Provider.GetJob(ctx, h.Repository, id)
	if err != nil || running.State != workload.JobInProgress || running.RunnerName != "contract-busy-1" || running.StartedAt.IsZero() {
		t.Fatalf("running job: %v %+v", err, running)
	}
	if err := h.Provider.DeregisterRunner(ctx, r.ID, r.Name); !errors.Is(err, workload.ErrRunnerBusy) {
		t.Fatalf("DeregisterRunner of a busy runner: %v, want ErrRunnerBusy", err)
	}
	if _, err := h.Provider.GetRunner(ctx, "contract-busy-1"); err != nil {
		t.Fatalf("the busy runner is gone after a refused deregistration: %v", err)
	}
}

func waitFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
