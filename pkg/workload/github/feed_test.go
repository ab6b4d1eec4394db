package github_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/credmethods"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	ghworkload "github.com/hyperfleet/hyperfleet/pkg/workload/github"
)

// feedEvents collects a feed's job events.
type feedEvents struct {
	mu  sync.Mutex
	all []workload.FeedEvent
	ch  chan workload.FeedEvent
}

func (f *feedEvents) handle(_ context.Context, ev workload.FeedEvent) error {
	f.mu.Lock()
	f.all = append(f.all, ev)
	f.mu.Unlock()
	f.ch <- ev
	return nil
}

// next waits for the next job event in state (skipping statistics and
// other states).
func (f *feedEvents) next(t *testing.T, state workload.JobState) workload.FeedEvent {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case ev := <-f.ch:
			if ev.Unresolved != nil {
				t.Fatalf("unresolved job message: %v", ev.Unresolved)
			}
			if ev.Job.ID != "" && ev.Job.State == state {
				return ev
			}
		case <-deadline:
			t.Fatalf("no %s job event within 30 s", state)
		}
	}
}

func orgProvider(t *testing.T, gs *githubsimtest.Server) *ghworkload.Provider {
	t.Helper()
	p, err := ghworkload.New(ghworkload.Config{BaseURL: gs.URL + "/api/v3", Scope: workload.Scope{Owner: "octo-org"}, Token: testPAT,
		Transport: gs.Transport, RunnerURL: gs.URL + "/octo-org"})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestScaleSetFeed: a pool's feed is its runner scale set, created once
// and adopted after; a job queued on GitHub reaches the listener with the
// REST job id webhooks carry (not the service's ids), in each of its
// states; a runner issued for the feed is the scale set's JIT runner and
// takes the job; no webhook is involved.
func TestScaleSetFeed(t *testing.T) {
	gs := githubsimtest.Start(t, simConfig(), githubsim.WithScaleSetPollWait(time.Second))
	p := orgProvider(t, gs)
	ctx := context.Background()
	labels := ghworkload.RunnerLabels("linux", "x64", []string{"scaleset"})
	spec := workload.FeedSpec{Name: "hf-linux", Group: "hyperfleet", Labels: labels}
	feed, err := p.OpenFeed(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	again, err := p.OpenFeed(ctx, spec)
	if err != nil || again.ID() != feed.ID() || feed.ID() == 0 {
		t.Fatalf("opened again: id %d (first %d), %v", again.ID(), feed.ID(), err)
	}
	if n := len(gs.Sim.ScaleSets()); n != 1 {
		t.Fatalf("%d scale sets after opening the feed twice", n)
	}

	events := &feedEvents{ch: make(chan workload.FeedEvent, 256)}
	lctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- feed.Listen(lctx, "hyperfleet-test", func() int { return 7 }, events.handle) }()
	defer stop()

	job, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted", "linux", "scaleset"},
		Duration: 300 * time.Millisecond, WorkflowName: "CI", JobName: "build (linux)"})
	if err != nil {
		t.Fatal(err)
	}
	queued := events.next(t, workload.JobQueued)
	if queued.Job.ID != strconv.FormatInt(job.ID, 10) || queued.Job.RunID != job.RunID || queued.Job.Repository != "octo-org/app" ||
		queued.Job.Name != "build (linux)" || queued.Job.WorkflowName != "CI" || queued.Job.Platform != hfv1.WorkloadGitHubActions ||
		!slices.Equal(queued.Job.Labels, []string{"self-hosted", "linux", "scaleset"}) || queued.At.IsZero() {
		t.Fatalf("queued event = %+v", queued)
	}

	cred, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: "hf-linux-vm-1", Labels: labels, Method: credmethods.MethodJIT, Feed: &spec})
	if err != nil {
		t.Fatal(err)
	}
	r, ok := gs.Sim.RunnerByName("hf-linux-vm-1")
	if !ok || r.ID != cred.RunnerID || !r.JIT {
		t.Fatalf("simulator runner = %+v, %v (credential %+v)", r, ok, cred)
	}
	proc := githubsimtest.StartScript(t, gs.InstallRunner(t), "run.sh", "--jitconfig", cred.Secret.Reveal())
	started := events.next(t, workload.JobInProgress)
	if started.Job.ID != queued.Job.ID || started.Job.RunnerName != "hf-linux-vm-1" || started.Job.RunnerID != cred.RunnerID {
		t.Fatalf("started event = %+v", started.Job)
	}
	completed := events.next(t, workload.JobCompleted)
	if completed.Job.ID != queued.Job.ID || completed.Job.Conclusion != "success" || completed.Job.RunnerName != "hf-linux-vm-1" {
		t.Fatalf("completed event = %+v", completed.Job)
	}
	if code := proc.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("run.sh exited %d:\n%s", code, proc.Output())
	}
	for _, s := range gs.Sim.ScaleSets() {
		if s.MaxCapacity != 7 {
			t.Errorf("X-ScaleSetMaxCapacity seen by the service = %d, want the pool's capacity 7", s.MaxCapacity)
		}
	}
	events.mu.Lock()
	var stats int
	for _, ev := range events.all {
		if ev.Statistics != nil {
			stats++
		}
	}
	events.mu.Unlock()
	if stats == 0 {
		t.Error("no event carried the scale set's statistics")
	}
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Listen returned %v", err)
	}
	for _, s := range gs.Sim.ScaleSets() {
		if s.Session != "" {
			t.Fatalf("the session outlived Listen: %+v", s)
		}
	}
}

// TestScaleSetFeedRefusals: what GitHub refuses, and what the back-end
// refuses before asking, is the user's to fix (workload errors of the
// configuration class), never retried as an outage.
func TestScaleSetFeedRefusals(t *testing.T) {
	gs := githubsimtest.Start(t, simConfig())
	p := orgProvider(t, gs)
	ctx := context.Background()
	if _, err := p.OpenFeed(ctx, workload.FeedSpec{Name: "hf", Group: "no-such-group", Labels: []string{"self-hosted"}}); !errors.Is(err, workload.ErrNotFound) {
		t.Errorf("unknown runner group: %v, want ErrNotFound", err)
	}
	spec := workload.FeedSpec{Name: "hf", Labels: []string{"self-hosted"}}
	if _, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: "x", Method: credmethods.MethodRegistrationToken, Feed: &spec}); !errors.Is(err, workload.ErrInvalidRequest) {
		t.Errorf("registration token for a scale set's runner: %v, want ErrInvalidRequest", err)
	}
	// The Default group serves a feed that names none.
	f, err := p.OpenFeed(ctx, spec)
	if err != nil || f.ID() == 0 {
		t.Fatalf("feed in the Default group: %v", err)
	}
	cred, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: "hf-1", Method: credmethods.MethodJIT, Feed: &spec})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: "hf-1", Method: credmethods.MethodJIT, Feed: &spec}); !errors.Is(err, workload.ErrNameTaken) {
		t.Errorf("a taken runner name: %v, want ErrNameTaken", err)
	}
	if err := p.DeregisterRunner(ctx, cred.RunnerID, "hf-1"); err != nil {
		t.Errorf("a scale set's runner is removed like any other: %v", err)
	}
}
