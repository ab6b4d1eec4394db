// Package feeds runs the job feed listeners of RunnerPools on the leader
// (docs/github.md, "Runner scale sets"): one goroutine per pool that names
// a feed (a GitHub runner scale set, workload.Feed), started, restarted
// and stopped by the RunnerPool controller (Ensure, Stop), each recording
// what it hears as the pool's demand (CIJobs, through internal/demand) and
// keeping a State the controller reports in the pool's status.
//
// A listener holds the feed's message session, so it runs where the
// controllers run: Listeners is a leader-elected manager runnable, and its
// listeners end with the leadership (giving their sessions back). It
// writes only demand records; everything else about a pool stays the pool
// controller's.
package feeds

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/hyperfleet/hyperfleet/internal/demand"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// Phase is where a listener is.
type Phase string

const (
	// Starting: opening (creating or adopting) the feed and its session.
	Starting Phase = "Starting"
	// Listening: the session is held; events come in.
	Listening Phase = "Listening"
	// Refused: the platform refused the feed (the user's to fix); tried
	// again after RefusedRetry.
	Refused Phase = "Refused"
	// Conflict: another listener holds the feed's session.
	Conflict Phase = "Conflict"
	// Failed: the listener stopped on an error; started again after a
	// backoff.
	Failed Phase = "Failed"
)

// State is what a pool's listener reports.
type State struct {
	Phase Phase
	// FeedID is the platform's id of the feed; 0 until it was opened.
	FeedID int64
	// Since is when the current session was first heard from (Listening).
	Since time.Time
	// LastEvent is when the listener last received an event.
	LastEvent time.Time
	// Statistics are the feed's counts at its last event.
	Statistics *workload.FeedStatistics
	// Err is why the listener is Refused, in Conflict or Failed.
	Err error
	// RetryAt is when a stopped listener starts again.
	RetryAt time.Time
}

// Config is one pool's listener.
type Config struct {
	// Pool is the RunnerPool whose demand the listener records.
	Pool types.NamespacedName
	// Host is the pool's API host (workload.Scope.Host): the jobs the feed
	// reports are that host's (workload.Job.Host).
	Host string
	// Key identifies the configuration (the feed, its scope and the
	// credentials' key); Ensure restarts a listener whose Key changed.
	Key string
	// Open returns the feed, with the pool's current credentials: it is
	// called at every (re)start, so a rotated token is picked up.
	Open func(ctx context.Context) (workload.Feed, error)
	// Capacity is how many runners the pool may have at most (its
	// maxReplicas), sent to the platform with each wait for messages.
	Capacity int
}

// Retry bounds. Vars so that tests can shorten them.
var (
	// RefusedRetry is how long a refused feed waits before it is opened
	// again (the refusal usually needs the user, whose fix also changes
	// the Key and restarts at once).
	RefusedRetry = time.Minute
	// ConflictRetry is how long a listener waits when another holds the
	// session past the client's own waiting.
	ConflictRetry = 30 * time.Second
	// FailedBackoffFirst and FailedBackoffCap bound the backoff of a
	// listener that stopped on an error.
	FailedBackoffFirst = time.Second
	FailedBackoffCap   = time.Minute
	// RecordRetries and RecordRetryWait bound the retries of one demand
	// record write (the API server restarting, a conflict): the event is
	// then dropped, and the resync finds its job.
	RecordRetries   = 5
	RecordRetryWait = time.Second
)

// Recorder writes job events as CIJobs (demand.Recorder).
type Recorder interface {
	Apply(ctx context.Context, pool types.NamespacedName, ev workload.JobEvent, source string) (demand.Outcome, error)
}

// Listeners runs the listeners. Its zero value is not usable: set the
// fields, then add it to the manager (it needs leader election).
type Listeners struct {
	// Recorder records the listeners' job events as demand.
	Recorder Recorder
	// Owner names the listeners to the platform (the operator's id): every
	// replica uses the same, so a new leader's session is recognisably
	// the same install's.
	Owner string
	// Wake, when set, is called with a pool whose State changed (the pool
	// controller's event channel), never blocking.
	Wake func(pool types.NamespacedName)
	// Clock is the real clock unless set (tests).
	Clock clock.Clock
	// Log is the listeners' logger.
	Log logr.Logger

	mu      sync.Mutex
	ctx     context.Context
	running map[types.NamespacedName]*listener
	wg      sync.WaitGroup
}

// listener is one pool's.
type listener struct {
	key      string
	cancel   context.CancelFunc
	done     chan struct{}
	capacity atomic.Int64

	mu    sync.Mutex
	state State
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: listeners
// run on the leader only.
func (l *Listeners) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable: it enables Ensure until ctx ends, then
// stops every listener and waits for them to give their sessions back.
func (l *Listeners) Start(ctx context.Context) error {
	l.mu.Lock()
	if l.Clock == nil {
		l.Clock = clock.RealClock{}
	}
	l.ctx = ctx
	if l.running == nil {
		l.running = map[types.NamespacedName]*listener{}
	}
	l.mu.Unlock()
	<-ctx.Done()
	l.mu.Lock()
	for pool, ln := range l.running {
		ln.cancel()
		metrics.ForgetFeed(pool.Namespace, pool.Name)
	}
	l.running = nil
	l.mu.Unlock()
	l.wg.Wait()
	return nil
}

// Ensure runs the listener of cfg.Pool with cfg: it starts one, restarts
// one whose Key changed, and otherwise only updates its capacity. It
// reports false when the listeners are not running (before Start, or on a
// replica that is not the leader): nothing was started.
func (l *Listeners) Ensure(cfg Config) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx == nil || l.ctx.Err() != nil {
		return false
	}
	if ln := l.running[cfg.Pool]; ln != nil {
		if ln.key == cfg.Key {
			ln.capacity.Store(int64(cfg.Capacity))
			return true
		}
		l.Log.Info("Restarting a runner scale-set listener: its configuration changed", "RunnerPool", cfg.Pool)
		ln.cancel()
		delete(l.running, cfg.Pool)
	}
	ctx, cancel := context.WithCancel(l.ctx)
	ln := &listener{key: cfg.Key, cancel: cancel, done: make(chan struct{}), state: State{Phase: Starting}}
	ln.capacity.Store(int64(cfg.Capacity))
	l.running[cfg.Pool] = ln
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer close(ln.done)
		l.run(ctx, cfg, ln)
	}()
	return true
}

// Stop stops the pool's listener, if any (its session is given back in the
// background).
func (l *Listeners) Stop(pool types.NamespacedName) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ln := l.running[pool]; ln != nil {
		ln.cancel()
		delete(l.running, pool)
		metrics.ForgetFeed(pool.Namespace, pool.Name)
	}
}

// State is the pool's listener's state; false when none runs.
func (l *Listeners) State(pool types.NamespacedName) (State, bool) {
	l.mu.Lock()
	ln := l.running[pool]
	l.mu.Unlock()
	if ln == nil {
		return State{}, false
	}
	return ln.current(), true
}

// set changes the listener's state and wakes its pool when the phase or
// the feed changed (not for every event: the pool reads LastEvent and the
// statistics on its own passes).
func (l *Listeners) set(pool types.NamespacedName, ln *listener, change func(*State)) {
	ln.mu.Lock()
	before := ln.state
	change(&ln.state)
	after := ln.state
	ln.mu.Unlock()
	if after.Phase == Listening {
		metrics.FeedListening.WithLabelValues(pool.Namespace, pool.Name).Set(1)
	} else {
		metrics.FeedListening.WithLabelValues(pool.Namespace, pool.Name).Set(0)
	}
	if (before.Phase != after.Phase || before.FeedID != after.FeedID || !errors.Is(after.Err, before.Err)) && l.Wake != nil {
		l.Wake(pool)
	}
}

// run opens the feed and listens, again and again, until ctx ends.
func (l *Listeners) run(ctx context.Context, cfg Config, ln *listener) {
	log := l.Log.WithValues("RunnerPool", cfg.Pool)
	backoff := FailedBackoffFirst
	for ctx.Err() == nil {
		l.set(cfg.Pool, ln, func(s *State) { s.Phase, s.Err, s.RetryAt, s.Since = Starting, nil, time.Time{}, time.Time{} })
		feed, err := cfg.Open(ctx)
		if err == nil {
			l.set(cfg.Pool, ln, func(s *State) { s.FeedID = feed.ID() })
			log.Info("Listening to the runner scale set", "scaleSetID", feed.ID())
			err = feed.Listen(ctx, l.Owner, func() int { return int(ln.capacity.Load()) }, func(ctx context.Context, ev workload.FeedEvent) error {
				ev.Job.Host = cfg.Host
				l.handle(ctx, cfg.Pool, ln, ev)
				return nil
			})
		}
		if ctx.Err() != nil {
			return
		}
		if ln.current().Phase == Listening {
			// It listened before it stopped: a new failure, not the
			// next of a row.
			backoff = FailedBackoffFirst
		}
		phase, wait := Failed, backoff
		switch {
		case errors.Is(err, workload.ErrFeedConflict):
			phase, wait = Conflict, ConflictRetry
		case errclass.Classify(err) == errclass.ClassConfiguration:
			phase, wait = Refused, RefusedRetry
		default:
			backoff = min(backoff*2, FailedBackoffCap)
		}
		if err == nil {
			err = errors.New("the listener stopped without an error")
		}
		retryAt := l.Clock.Now().Add(wait)
		l.set(cfg.Pool, ln, func(s *State) { s.Phase, s.Err, s.RetryAt, s.Since = phase, err, retryAt, time.Time{} })
		metrics.FeedRestarts.WithLabelValues(cfg.Pool.Namespace, cfg.Pool.Name, reason(phase)).Inc()
		log.Info("The runner scale-set listener stopped; starting it again later", "phase", phase, "retryIn", wait, "error", err.Error())
		t := l.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

func (ln *listener) current() State {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	return ln.state
}

// reason is the restart metric's reason label of a phase.
func reason(p Phase) string {
	switch p {
	case Refused:
		return "ScaleSetRefused"
	case Conflict:
		return "SessionConflict"
	}
	return "ListenerFailed"
}

// handle records one event. Failures are counted and logged, never
// returned: a failed record must not end the session (the message was
// acknowledged already; the resync finds the job).
func (l *Listeners) handle(ctx context.Context, pool types.NamespacedName, ln *listener, ev workload.FeedEvent) {
	l.set(pool, ln, func(s *State) {
		if s.Phase != Listening {
			s.Phase, s.Since, s.Err = Listening, ev.At, nil
		}
		s.LastEvent = ev.At
		if ev.Statistics != nil {
			st := *ev.Statistics
			s.Statistics = &st
		}
	})
	log := l.Log.WithValues("RunnerPool", pool)
	switch {
	case ev.Unresolved != nil:
		metrics.FeedEvents.WithLabelValues(pool.Namespace, pool.Name, "unknown", "unresolved").Inc()
		log.Info("A scale-set job message names no job the CI platform's API shows yet; the resync will find it", "error", ev.Unresolved.Error())
		return
	case ev.Job.ID == "":
		metrics.FeedEvents.WithLabelValues(pool.Namespace, pool.Name, "statistics", "recorded").Inc()
		return
	}
	state := string(ev.Job.State)
	var out demand.Outcome
	var err error
	for attempt := 0; attempt <= RecordRetries; attempt++ {
		out, err = l.Recorder.Apply(ctx, pool, workload.JobEvent{Action: "listener", Job: ev.Job}, demand.SourceListener)
		if err == nil || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(RecordRetryWait):
		}
	}
	switch {
	case err != nil:
		metrics.FeedEvents.WithLabelValues(pool.Namespace, pool.Name, state, "error").Inc()
		log.Error(err, "Could not record a job the runner scale set reported; the resync will find it", "job", ev.Job.ID, "repository", ev.Job.Repository)
	case out == demand.Unchanged:
		metrics.FeedEvents.WithLabelValues(pool.Namespace, pool.Name, state, "unchanged").Inc()
	default:
		metrics.FeedEvents.WithLabelValues(pool.Namespace, pool.Name, state, "recorded").Inc()
		log.V(1).Info("Recorded a job the runner scale set reported", "job", ev.Job.ID, "repository", ev.Job.Repository, "state", state, "outcome", out)
	}
}
