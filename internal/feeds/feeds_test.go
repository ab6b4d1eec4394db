package feeds

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hyperfleet/hyperfleet/internal/demand"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

func TestMain(m *testing.M) {
	RefusedRetry, ConflictRetry = 50*time.Millisecond, 50*time.Millisecond
	FailedBackoffFirst, FailedBackoffCap = 10*time.Millisecond, 40*time.Millisecond
	RecordRetries, RecordRetryWait = 2, time.Millisecond
	m.Run()
}

// recorded is a Recorder that keeps what it is given; fail makes the next
// calls fail.
type recorded struct {
	mu     sync.Mutex
	events []workload.JobEvent
	source []string
	fail   atomic.Int32
	seen   map[string]workload.JobState
}

func (r *recorded) Apply(_ context.Context, _ types.NamespacedName, ev workload.JobEvent, source string) (demand.Outcome, error) {
	if r.fail.Load() > 0 {
		r.fail.Add(-1)
		return demand.Unchanged, errors.New("the API server is restarting")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events, r.source = append(r.events, ev), append(r.source, source)
	if r.seen == nil {
		r.seen = map[string]workload.JobState{}
	}
	if r.seen[ev.Job.ID] == ev.Job.State {
		return demand.Unchanged, nil
	}
	r.seen[ev.Job.ID] = ev.Job.State
	return demand.Created, nil
}

func (r *recorded) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

// scripted is a Feed whose Listen hands over the events it is sent and
// returns what it is told to.
type scripted struct {
	id       int64
	events   chan workload.FeedEvent
	end      chan error
	capacity atomic.Int64
	owner    atomic.Value
}

func newScripted(id int64) *scripted {
	return &scripted{id: id, events: make(chan workload.FeedEvent, 16), end: make(chan error, 1)}
}

func (f *scripted) ID() int64 { return f.id }

func (f *scripted) Listen(ctx context.Context, owner string, capacity func() int, handle func(context.Context, workload.FeedEvent) error) error {
	f.owner.Store(owner)
	for {
		f.capacity.Store(int64(capacity()))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-f.end:
			return err
		case ev := <-f.events:
			if err := handle(ctx, ev); err != nil {
				return err
			}
		}
	}
}

func start(t *testing.T, rec Recorder) (*Listeners, *sync.Map) {
	t.Helper()
	woken := &sync.Map{}
	l := &Listeners{Recorder: rec, Owner: "hyperfleet-test", Log: testr.New(t), Wake: func(p types.NamespacedName) {
		n, _ := woken.LoadOrStore(p, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = l.Start(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(5 * time.Second)
	for !l.Ensure(Config{Pool: types.NamespacedName{Name: "probe"}, Key: "probe", Open: func(context.Context) (workload.Feed, error) {
		return nil, errors.New("probe")
	}}) {
		if time.Now().After(deadline) {
			t.Fatal("the listeners never started")
		}
		time.Sleep(time.Millisecond)
	}
	l.Stop(types.NamespacedName{Name: "probe"})
	return l, woken
}

func waitPhase(t *testing.T, l *Listeners, pool types.NamespacedName, want Phase) State {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, ok := l.State(pool)
		if ok && st.Phase == want {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s: phase %s (running %v), want %s", pool, st.Phase, ok, want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

var pool = types.NamespacedName{Namespace: "ci", Name: "runners"}

// TestListenerRecordsAndReports: the listener opens its feed, reports
// Listening from the first event, records job events as listener demand
// (a repeated one unchanged), keeps the feed's counts, passes the pool's
// capacity on as it changes, and wakes the pool when its phase changes.
func TestListenerRecordsAndReports(t *testing.T) {
	rec := &recorded{}
	l, woken := start(t, rec)
	feed := newScripted(42)
	cfg := Config{Pool: pool, Key: "a", Capacity: 5, Open: func(context.Context) (workload.Feed, error) { return feed, nil }}
	if !l.Ensure(cfg) {
		t.Fatal("Ensure refused")
	}
	if st := waitPhase(t, l, pool, Starting); st.FeedID != 42 && st.FeedID != 0 {
		t.Fatalf("state = %+v", st)
	}
	at := time.Date(2026, 11, 26, 9, 0, 0, 0, time.UTC)
	feed.events <- workload.FeedEvent{At: at, Statistics: &workload.FeedStatistics{Assigned: 1, Runners: 2}}
	st := waitPhase(t, l, pool, Listening)
	if st.FeedID != 42 || !st.Since.Equal(at) || st.Statistics == nil || st.Statistics.Assigned != 1 || st.Statistics.Runners != 2 {
		t.Fatalf("listening state = %+v", st)
	}
	job := workload.Job{ID: "7", Platform: "github-actions", Repository: "octo-org/app", State: workload.JobQueued}
	feed.events <- workload.FeedEvent{At: at.Add(time.Second), Job: job}
	feed.events <- workload.FeedEvent{At: at.Add(2 * time.Second), Job: job}
	feed.events <- workload.FeedEvent{At: at.Add(3 * time.Second), Unresolved: errors.New("no such job")}
	deadline := time.Now().Add(5 * time.Second)
	for rec.count() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d events recorded", rec.count())
		}
		time.Sleep(time.Millisecond)
	}
	rec.mu.Lock()
	if rec.source[0] != demand.SourceListener || rec.events[0].Job.ID != "7" {
		t.Errorf("recorded %+v from %v", rec.events[0], rec.source)
	}
	rec.mu.Unlock()
	if got := feed.owner.Load(); got != "hyperfleet-test" {
		t.Errorf("owner = %v", got)
	}
	cfg.Capacity = 9
	l.Ensure(cfg) // same key: no restart, the new capacity
	feed.events <- workload.FeedEvent{At: at.Add(4 * time.Second)}
	for feed.capacity.Load() != 9 {
		if time.Now().After(deadline) {
			t.Fatalf("capacity %d, want 9", feed.capacity.Load())
		}
		time.Sleep(time.Millisecond)
	}
	if n, ok := woken.Load(pool); !ok || n.(*atomic.Int32).Load() < 2 {
		t.Errorf("the pool was not woken for its phase changes")
	}
}

// TestListenerRestarts: a refused feed is Refused and tried again later,
// a held session is a Conflict, any other end is Failed with a growing
// backoff; a listener that stopped is opened again with the current
// credentials (Open is called anew), a changed Key restarts it at once,
// and Stop ends it.
func TestListenerRestarts(t *testing.T) {
	l, _ := start(t, &recorded{})
	var opens atomic.Int32
	var outcome atomic.Value
	outcome.Store(fmt.Errorf("unknown runner group: %w", workload.ErrInvalidRequest))
	open := func(context.Context) (workload.Feed, error) {
		opens.Add(1)
		if err, _ := outcome.Load().(error); err != nil {
			return nil, err
		}
		return newScripted(1), nil
	}
	l.Ensure(Config{Pool: pool, Key: "a", Open: open})
	st := waitPhase(t, l, pool, Refused)
	if st.Err == nil || !errors.Is(st.Err, workload.ErrInvalidRequest) || st.RetryAt.IsZero() {
		t.Fatalf("refused state = %+v", st)
	}
	outcome.Store(fmt.Errorf("scale set hf: %w", workload.ErrFeedConflict))
	waitPhase(t, l, pool, Conflict)
	outcome.Store(fmt.Errorf("GitHub answered 502: %w", workload.ErrUnavailable))
	waitPhase(t, l, pool, Failed)
	before := opens.Load()
	deadline := time.Now().Add(5 * time.Second)
	for opens.Load() < before+2 {
		if time.Now().After(deadline) {
			t.Fatalf("a failed listener was not opened again (%d opens)", opens.Load())
		}
		time.Sleep(time.Millisecond)
	}

	// A new configuration restarts it at once.
	fresh := newScripted(2)
	l.Ensure(Config{Pool: pool, Key: "b", Open: func(context.Context) (workload.Feed, error) { return fresh, nil }})
	fresh.events <- workload.FeedEvent{At: time.Now()}
	if st := waitPhase(t, l, pool, Listening); st.FeedID != 2 {
		t.Fatalf("after the restart: %+v", st)
	}
	l.Stop(pool)
	if _, ok := l.State(pool); ok {
		t.Fatal("a stopped listener still has a state")
	}
}

// TestRecordFailuresDoNotEndTheSession: a demand record that cannot be
// written is retried, then given up (the resync finds the job); the
// session goes on.
func TestRecordFailuresDoNotEndTheSession(t *testing.T) {
	rec := &recorded{}
	rec.fail.Store(int32(RecordRetries + 1))
	l, _ := start(t, rec)
	feed := newScripted(3)
	l.Ensure(Config{Pool: pool, Key: "a", Open: func(context.Context) (workload.Feed, error) { return feed, nil }})
	feed.events <- workload.FeedEvent{At: time.Now(), Job: workload.Job{ID: "1", State: workload.JobQueued}}
	feed.events <- workload.FeedEvent{At: time.Now(), Job: workload.Job{ID: "2", State: workload.JobQueued}}
	deadline := time.Now().Add(5 * time.Second)
	for rec.count() < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the second job was never recorded")
		}
		time.Sleep(time.Millisecond)
	}
	if st, _ := l.State(pool); st.Phase != Listening {
		t.Fatalf("state = %+v", st)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.events[0].Job.ID != "2" {
		t.Fatalf("recorded %+v, want job 2 only", rec.events)
	}
}

// TestEnsureBeforeStart: nothing runs before the leader's Start, and
// Ensure says so.
func TestEnsureBeforeStart(t *testing.T) {
	l := &Listeners{Recorder: &recorded{}, Log: testr.New(t)}
	if l.Ensure(Config{Pool: pool, Key: "a"}) {
		t.Fatal("Ensure ran a listener before Start")
	}
	if _, ok := l.State(pool); ok {
		t.Fatal("a state before Start")
	}
}
