package demand

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

const confirmPAT = "ghp_demandConfirmTestPATneverLeavesTheTest00"

// countingReaders hands every pool the same reader and counts the pools
// asked for; err, when set, is returned instead.
type countingReaders struct {
	reader workload.JobReader
	err    error

	mu    sync.Mutex
	asked map[types.NamespacedName]int
}

func (c *countingReaders) JobReaderFor(_ context.Context, pool types.NamespacedName) (workload.JobReader, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked[pool]++
	return c.reader, c.err
}

func (c *countingReaders) count(pool types.NamespacedName) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.asked[pool]
}

// webhookEvent is a signed-looking webhook event about a job of
// octo-org/app in state, with its times fresh unless given.
func webhookEvent(id int64, state workload.JobState, at time.Time, delivery string) workload.JobEvent {
	j := workload.Job{ID: strconv.FormatInt(id, 10), Platform: hfv1.WorkloadGitHubActions, RunID: 1, Repository: "octo-org/app", Labels: []string{"self-hosted"}, State: state, CreatedAt: at}
	if state != workload.JobQueued {
		j.StartedAt, j.RunnerName, j.RunnerID = at, "runner-1", 9
	}
	if state == workload.JobCompleted {
		j.CompletedAt, j.Conclusion = at, "success"
	}
	return workload.JobEvent{DeliveryID: delivery, Action: string(state), Job: j}
}

// TestRecorderConfirmsUntrustedWebhookEvents: with the GitHub simulator
// as the CI platform, an out-of-order completed event and a replayed old
// event are recorded as the API reports the job, an event about a job
// the API does not know is not recorded, and fresh in-order events are
// recorded as delivered without asking the API.
func TestRecorderConfirmsUntrustedWebhookEvents(t *testing.T) {
	e := testEnv(t)
	ctx := context.Background()
	gs := githubsimtest.Start(t, githubsim.Config{
		Organizations: []githubsim.OrgConfig{{Login: "octo-org"}},
		Repositories:  []githubsim.RepoConfig{{Name: "octo-org/app"}},
		PATs:          []githubsim.PATConfig{{Token: confirmPAT, Login: "octocat"}},
	})
	// The pool's account, as the operator builds it: the registered GitHub
	// back-end, a template's PAT and the pool's scope.
	be, _ := githubsimtest.Backends(t, gs.Transport).For(hfv1.WorkloadGitHubActions)
	tmpl := &hfv1.HypervisorMachineTemplate{}
	tmpl.Spec.Bootstrap.GitHub = &hfv1.GitHubBootstrap{APIBaseURL: gs.URL + "/api/v3", Owner: "octo-org", Repository: "app",
		Credentials: hfv1.GitHubCredentials{PAT: &hfv1.LocalSecretKeySelector{Name: "github", Key: "token"}}}
	provider, err := be.Provider(ctx, tmpl, workload.Scope{Owner: "octo-org", Repository: "app"},
		func(context.Context, string, string, hfv1.LocalSecretKeySelector) ([]byte, error) {
			return []byte(confirmPAT), nil
		})
	if err != nil {
		t.Fatal(err)
	}
	waiting, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted"}, Duration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	finished, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted"}, Duration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := gs.Sim.CompleteJob(finished.ID, "success"); err != nil {
		t.Fatal(err)
	}
	readers := &countingReaders{reader: provider, asked: map[types.NamespacedName]int{}}
	rec := NewRecorder(e.Client, e.Client, nil).ConfirmWebhookEvents(readers, 10*time.Minute)
	now := time.Now()
	state := func(pool types.NamespacedName, id int64) hfv1.CIJobState {
		return getJob(t, e.Client, pool.Namespace, id).Status.State
	}

	t.Run("completed for a job recorded as queued", func(t *testing.T) {
		pool := nn(newNamespace(t, e.Client), "pool")
		if err := rec.Record(ctx, pool, webhookEvent(waiting.ID, workload.JobQueued, now, "q"), SourceWebhook); err != nil {
			t.Fatal(err)
		}
		if n := readers.count(pool); n != 0 {
			t.Fatalf("a fresh queued event asked the API %d times", n)
		}
		// GitHub says the job still waits: the completion (forged with a
		// leaked secret, or a replay) must not end its demand.
		if err := rec.Record(ctx, pool, webhookEvent(waiting.ID, workload.JobCompleted, now, "c"), SourceWebhook); err != nil {
			t.Fatal(err)
		}
		if got := state(pool, waiting.ID); got != hfv1.CIJobQueued || readers.count(pool) != 1 {
			t.Fatalf("state %s after %d API reads; want queued after 1", got, readers.count(pool))
		}
	})

	t.Run("a job of an Enterprise Server keeps its host when confirmed", func(t *testing.T) {
		pool := nn(newNamespace(t, e.Client), "pool")
		onHost := func(ev workload.JobEvent) workload.JobEvent {
			ev.Job.Host = "ghes.example.com"
			return ev
		}
		if err := rec.Record(ctx, pool, onHost(webhookEvent(waiting.ID, workload.JobQueued, now, "q")), SourceWebhook); err != nil {
			t.Fatal(err)
		}
		// Confirmed with the pool's account, whose answer names no host:
		// the record is still the Enterprise Server's job's.
		if err := rec.Record(ctx, pool, onHost(webhookEvent(waiting.ID, workload.JobCompleted, now, "c")), SourceWebhook); err != nil {
			t.Fatalf("a confirmed event of the host's own job: %v", err)
		}
		if cj := getJob(t, e.Client, pool.Namespace, waiting.ID); cj.Spec.APIHost != "ghes.example.com" || cj.Status.State != hfv1.CIJobQueued {
			t.Fatalf("record on host %q in state %s; want ghes.example.com, queued", cj.Spec.APIHost, cj.Status.State)
		}
	})

	t.Run("completed for a job never recorded", func(t *testing.T) {
		pool := nn(newNamespace(t, e.Client), "pool")
		if err := rec.Record(ctx, pool, webhookEvent(finished.ID, workload.JobCompleted, now, "c"), SourceWebhook); err != nil {
			t.Fatal(err)
		}
		cj := getJob(t, e.Client, pool.Namespace, finished.ID)
		if cj.Status.State != hfv1.CIJobCompleted || cj.Status.RunnerName != "" || readers.count(pool) != 1 {
			t.Fatalf("status %+v after %d API reads; want completed as the API reports it (no runner) after 1", cj.Status, readers.count(pool))
		}
	})

	t.Run("replayed old queued event", func(t *testing.T) {
		pool := nn(newNamespace(t, e.Client), "pool")
		// A captured queued delivery replayed an hour later under a fresh
		// delivery id: GitHub says the job is done, so it creates no demand.
		if err := rec.Record(ctx, pool, webhookEvent(finished.ID, workload.JobQueued, now.Add(-time.Hour), "fresh-id"), SourceWebhook); err != nil {
			t.Fatal(err)
		}
		if got := state(pool, finished.ID); got != hfv1.CIJobCompleted || readers.count(pool) != 1 {
			t.Fatalf("state %s after %d API reads; want completed after 1", got, readers.count(pool))
		}
	})

	t.Run("event about a job the API does not know", func(t *testing.T) {
		pool := nn(newNamespace(t, e.Client), "pool")
		if err := rec.Record(ctx, pool, webhookEvent(987654321, workload.JobQueued, now.Add(-time.Hour), "d"), SourceWebhook); err != nil {
			t.Fatal(err)
		}
		err := e.Client.Get(ctx, types.NamespacedName{Namespace: pool.Namespace, Name: hfv1.CIJobName(hfv1.WorkloadGitHubActions, "987654321")}, &hfv1.CIJob{})
		if !apierrors.IsNotFound(err) || readers.count(pool) != 1 {
			t.Fatalf("Get = %v after %d API reads; want not found after 1", err, readers.count(pool))
		}
	})

	t.Run("fresh in-order events signed with the owner's own secret are not confirmed", func(t *testing.T) {
		pool := nn(newNamespace(t, e.Client), "pool")
		// GitHub says this job waits, but the events are fresh, in order
		// and signed with a secret only the job's owner holds: recorded as
		// delivered, the API is not asked.
		for _, s := range []workload.JobState{workload.JobQueued, workload.JobInProgress, workload.JobCompleted} {
			ev := webhookEvent(waiting.ID, s, now, string(s))
			ev.OwnerSigned = true
			if err := rec.Record(ctx, pool, ev, SourceWebhook); err != nil {
				t.Fatal(err)
			}
		}
		if got := state(pool, waiting.ID); got != hfv1.CIJobCompleted || readers.count(pool) != 0 {
			t.Fatalf("state %s after %d API reads; want completed after 0", got, readers.count(pool))
		}
	})

	// A fresh in_progress signed with the shared fallback secret (any
	// owner whose webhook uses it can sign one about this owner's job):
	// recorded as delivered, it took the job out of pending demand for
	// good (nothing moves a record back) and gave the claim of the runner
	// it names a job that runner never took.
	for _, tc := range []struct {
		name   string
		before []workload.JobState // events recorded first, owner-signed
	}{
		{name: "forged in_progress of a job recorded queued", before: []workload.JobState{workload.JobQueued}},
		{name: "forged in_progress of a job not recorded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := nn(newNamespace(t, e.Client), "pool")
			for _, s := range tc.before {
				ev := webhookEvent(waiting.ID, s, now, "before-"+string(s))
				ev.OwnerSigned = true
				if err := rec.Record(ctx, pool, ev, SourceWebhook); err != nil {
					t.Fatal(err)
				}
			}
			forged := webhookEvent(waiting.ID, workload.JobInProgress, now, "forged")
			forged.Job.RunnerName = "runner-of-a-busy-claim"
			if err := rec.Record(ctx, pool, forged, SourceWebhook); err != nil {
				t.Fatal(err)
			}
			cj := getJob(t, e.Client, pool.Namespace, waiting.ID)
			if cj.Status.State != hfv1.CIJobQueued || cj.Status.RunnerName != "" || readers.count(pool) != 1 {
				t.Fatalf("status %+v after %d API reads; want queued without a runner (as GitHub has it) after 1", cj.Status, readers.count(pool))
			}
			// The same delivery's completion, in order after it, is
			// confirmed too: the start was never confirmed.
			if err := rec.Record(ctx, pool, webhookEvent(waiting.ID, workload.JobCompleted, now, "forged-completed"), SourceWebhook); err != nil {
				t.Fatal(err)
			}
			if got := state(pool, waiting.ID); got != hfv1.CIJobQueued || readers.count(pool) != 2 {
				t.Fatalf("state %s after %d API reads; want queued after 2", got, readers.count(pool))
			}
		})
	}

	t.Run("shared-secret events of a job whose start the API confirmed", func(t *testing.T) {
		pool := nn(newNamespace(t, e.Client), "pool")
		// Recorded in progress by the resync (what the API said), without
		// a runner name: a shared-secret event naming one is confirmed;
		// its completion, the next step in order, is not.
		if err := rec.Record(ctx, pool, workload.JobEvent{Action: "in_progress", Job: workload.Job{ID: strconv.FormatInt(waiting.ID, 10), Platform: hfv1.WorkloadGitHubActions, Repository: "octo-org/app",
			State: workload.JobInProgress, StartedAt: now}}, SourceResync); err != nil {
			t.Fatal(err)
		}
		if err := rec.Record(ctx, pool, webhookEvent(waiting.ID, workload.JobInProgress, now, "names-a-runner"), SourceWebhook); err != nil {
			t.Fatal(err)
		}
		if cj := getJob(t, e.Client, pool.Namespace, waiting.ID); cj.Status.RunnerName != "" || readers.count(pool) != 1 {
			t.Fatalf("status %+v after %d API reads; want no runner (GitHub names none) after 1", cj.Status, readers.count(pool))
		}
		shared := webhookEvent(waiting.ID, workload.JobCompleted, now, "completed")
		shared.Job.RunnerName = ""
		if err := rec.Record(ctx, pool, shared, SourceWebhook); err != nil {
			t.Fatal(err)
		}
		if got := state(pool, waiting.ID); got != hfv1.CIJobCompleted || readers.count(pool) != 1 {
			t.Fatalf("state %s after %d API reads; want completed after 1", got, readers.count(pool))
		}
	})

	t.Run("resync records are not confirmed", func(t *testing.T) {
		pool := nn(newNamespace(t, e.Client), "pool")
		if err := rec.Record(ctx, pool, webhookEvent(waiting.ID, workload.JobCompleted, now.Add(-time.Hour), "r"), SourceResync); err != nil {
			t.Fatal(err)
		}
		if got := state(pool, waiting.ID); got != hfv1.CIJobCompleted || readers.count(pool) != 0 {
			t.Fatalf("state %s after %d API reads; want completed after 0", got, readers.count(pool))
		}
	})

	t.Run("the API cannot be asked", func(t *testing.T) {
		pool := nn(newNamespace(t, e.Client), "pool")
		failing := &countingReaders{err: errors.New("no credentials"), asked: map[types.NamespacedName]int{}}
		rec := NewRecorder(e.Client, e.Client, nil).ConfirmWebhookEvents(failing, 0)
		err := rec.Record(ctx, pool, webhookEvent(finished.ID, workload.JobQueued, now.Add(-time.Hour), "d"), SourceWebhook)
		if err == nil || !errors.Is(err, failing.err) {
			t.Fatalf("Record = %v, want the reader's error", err)
		}
		getErr := e.Client.Get(ctx, types.NamespacedName{Namespace: pool.Namespace, Name: hfv1.CIJobName(hfv1.WorkloadGitHubActions, strconv.FormatInt(finished.ID, 10))}, &hfv1.CIJob{})
		if !apierrors.IsNotFound(getErr) {
			t.Fatalf("an unconfirmed event was recorded: %v", getErr)
		}
	})
}
