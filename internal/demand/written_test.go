package demand

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// apiCalls counts a client's calls by verb.
type apiCalls struct {
	mu sync.Mutex
	n  map[string]int
}

func (a *apiCalls) add(verb string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n[verb]++
}

// take returns the counts so far as "verb=n ..." (sorted) and resets them.
func (a *apiCalls) take() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := ""
	for _, v := range []string{"create", "get", "update"} {
		if a.n[v] > 0 {
			s += fmt.Sprintf("%s=%d ", v, a.n[v])
		}
	}
	a.n = map[string]int{}
	return s
}

// countedClient is a direct client of the test's API server that counts
// its creates, gets and updates.
func countedClient(t *testing.T, e *testenv.Environment) (client.WithWatch, *apiCalls) {
	t.Helper()
	c, err := client.NewWithWatch(e.Config, client.Options{Scheme: e.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	calls := &apiCalls{n: map[string]int{}}
	return interceptor.NewClient(c, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			calls.add("create")
			return c.Create(ctx, obj, opts...)
		},
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			calls.add("get")
			return c.Get(ctx, key, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			calls.add("update")
			return c.Update(ctx, obj, opts...)
		},
	}), calls
}

// TestRecorderWritesOnceAfterItsOwnWrite: a job's events after the one
// that created its record are one update each, with no refused create and
// no read, and, signed with the owner's own secret, an in_progress event
// and a completed event after the in_progress this Recorder wrote need no
// confirmation (neither the platform nor the API server is asked).
func TestRecorderWritesOnceAfterItsOwnWrite(t *testing.T) {
	e := testEnv(t)
	ctx := context.Background()
	ns := newNamespace(t, e.Client)
	pool := nn(ns, "gpu")
	c, calls := countedClient(t, e)
	readers := &countingReaders{asked: map[types.NamespacedName]int{}, err: fmt.Errorf("the platform must not be asked")}
	rec := NewRecorder(c, c, nil).ConfirmWebhookEvents(readers, time.Hour)
	now := time.Now()
	for _, step := range []struct {
		state workload.JobState
		want  Outcome
		calls string
	}{
		{workload.JobQueued, Created, "create=1 "},
		{workload.JobInProgress, Updated, "update=1 "},
		{workload.JobCompleted, Updated, "update=1 "},
		{workload.JobCompleted, Unchanged, ""},
	} {
		ev := webhookEvent(5, step.state, now, "d-"+string(step.state))
		ev.OwnerSigned = true
		got, err := rec.Apply(ctx, pool, ev, SourceWebhook)
		if err != nil || got != step.want {
			t.Fatalf("%s: %s, %v; want %s", step.state, got, err, step.want)
		}
		if got := calls.take(); got != step.calls {
			t.Errorf("%s: calls %q, want %q", step.state, got, step.calls)
		}
	}
	if readers.count(pool) != 0 {
		t.Errorf("the platform was asked %d times", readers.count(pool))
	}
	if cj := getJob(t, e.Client, ns, 5); cj.Status.State != hfv1.CIJobCompleted || cj.Status.RunnerName != "runner-1" || cj.Status.LastDeliveryID != "d-completed" {
		t.Fatalf("record %+v", cj.Status)
	}
}

// TestRecorderStaleCopy: what this Recorder remembers writing goes stale
// when another replica writes the record, or someone deletes it; the
// next event is still recorded right, from the API server.
func TestRecorderStaleCopy(t *testing.T) {
	e := testEnv(t)
	ctx := context.Background()
	ns := newNamespace(t, e.Client)
	pool := nn(ns, "gpu")
	c, calls := countedClient(t, e)
	a, b := NewRecorder(c, c, nil), NewRecorder(e.Client, e.Client, nil)
	now := time.Now()
	mustApply := func(r *Recorder, state workload.JobState, delivery string, want Outcome) {
		t.Helper()
		got, err := r.Apply(ctx, pool, webhookEvent(6, state, now, delivery), SourceWebhook)
		if err != nil || got != want {
			t.Fatalf("%s %s: %s, %v; want %s", state, delivery, got, err, want)
		}
	}
	mustApply(a, workload.JobQueued, "a-queued", Created)
	// Another replica moves the record on; a's copy is stale.
	mustApply(b, workload.JobInProgress, "b-progress", Updated)
	calls.take()
	mustApply(a, workload.JobInProgress, "a-progress", Unchanged)
	if got := calls.take(); got != "create=1 get=1 update=1 " {
		t.Errorf("stale copy: calls %q, want the refused update, the refused create and a read", got)
	}
	mustApply(a, workload.JobCompleted, "a-completed", Updated)
	if cj := getJob(t, e.Client, ns, 6); cj.Status.State != hfv1.CIJobCompleted || cj.Status.LastDeliveryID != "a-completed" {
		t.Fatalf("record %+v", cj.Status)
	}

	// Deleted under the copy: the next event that says more creates it
	// again.
	mustApply(a, workload.JobQueued, "a-queued", Unchanged)
	id := int64(7)
	for _, step := range []struct {
		state workload.JobState
		want  Outcome
	}{{workload.JobQueued, Created}, {workload.JobInProgress, Updated}} {
		if got, err := a.Apply(ctx, pool, webhookEvent(id, step.state, now, "x"), SourceWebhook); err != nil || got != step.want {
			t.Fatalf("%s: %s, %v", step.state, got, err)
		}
	}
	if err := e.Client.Delete(ctx, getJob(t, e.Client, ns, id)); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Apply(ctx, pool, webhookEvent(id, workload.JobCompleted, now, "x-completed"), SourceWebhook); err != nil || got != Created {
		t.Fatalf("completed after the record was deleted: %s, %v; want %s", got, err, Created)
	}
	if cj := getJob(t, e.Client, ns, id); cj.Status.State != hfv1.CIJobCompleted || cj.Status.RunnerName != "runner-1" {
		t.Fatalf("recreated record %+v", cj.Status)
	}
}

// platformSays is a CI platform whose API reports every job as job,
// counting the reads.
type platformSays struct {
	job   workload.Job
	reads int
}

func (p *platformSays) JobReaderFor(context.Context, types.NamespacedName) (workload.JobReader, error) {
	return p, nil
}

func (p *platformSays) GetJob(_ context.Context, _ string, id string) (workload.Job, error) {
	p.reads++
	j := p.job
	j.ID, j.Platform = id, hfv1.WorkloadGitHubActions
	return j, nil
}

// TestSharedSecretCostsOneConfirmationPerJob: signed with the shared
// fallback secret, an honest job's events cost one API read, when it
// starts; its completion, the next step in order, is recorded as
// delivered. What is recorded of the start is what the API says.
func TestSharedSecretCostsOneConfirmationPerJob(t *testing.T) {
	e := testEnv(t)
	ctx := context.Background()
	pool := nn(newNamespace(t, e.Client), "gpu")
	now := time.Now()
	platform := &platformSays{job: workload.Job{Repository: "octo-org/app", State: workload.JobInProgress, RunnerName: "pool-runner-7", RunnerID: 7, StartedAt: now}}
	rec := NewRecorder(e.Client, e.Client, nil).ConfirmWebhookEvents(platform, time.Hour)
	for _, step := range []struct {
		state workload.JobState
		reads int
	}{{workload.JobQueued, 0}, {workload.JobInProgress, 1}, {workload.JobCompleted, 1}} {
		ev := webhookEvent(8, step.state, now, "d-"+string(step.state))
		if err := rec.Record(ctx, pool, ev, SourceWebhook); err != nil {
			t.Fatal(err)
		}
		if platform.reads != step.reads {
			t.Fatalf("%s: %d API reads so far, want %d", step.state, platform.reads, step.reads)
		}
	}
	if cj := getJob(t, e.Client, pool.Namespace, 8); cj.Status.State != hfv1.CIJobCompleted || cj.Status.RunnerName != "pool-runner-7" {
		t.Fatalf("record %+v; want completed, on the runner the API named", cj.Status)
	}
}
