package scaleset

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// EventType is what happened to a job of the scale set.
type EventType string

// Event types. EventStatistics carries only Statistics.
const (
	EventJobAvailable EventType = "JobAvailable"
	EventJobAssigned  EventType = "JobAssigned"
	EventJobStarted   EventType = "JobStarted"
	EventJobCompleted EventType = "JobCompleted"
	EventStatistics   EventType = "Statistics"
)

// Job is a job as events describe it, free of the wire format.
type Job struct {
	// RequestID is the runner request id (what AcquireJobs takes); JobID
	// the service's job id.
	RequestID int64
	JobID     string
	// Repository is owner/name.
	Repository string
	// Workflow is the workflow ref (owner/repo/.github/workflows/x.yml@ref).
	Workflow      string
	WorkflowRunID int64
	DisplayName   string
	Labels        []string
	// RunnerID and RunnerName are set from JobStarted on; Result
	// (succeeded, failed, canceled, ...) on JobCompleted.
	RunnerID   int64
	RunnerName string
	Result     string
}

// Event is one thing the listener learned.
type Event struct {
	Type       EventType
	Job        Job
	Statistics *Statistics
}

// ListenerConfig configures a Listener.
type ListenerConfig struct {
	Client     *Client
	ScaleSetID int
	// Owner names this listener in its session.
	Owner string
	// MaxRunners returns how many more runners the consumer may start
	// now; it is sent with each poll (X-ScaleSetMaxCapacity), from which
	// the service sizes what it offers, so it is required.
	MaxRunners func() int
	// Handle receives events in order; an error stops Run.
	Handle func(ctx context.Context, ev Event) error
	Logger *slog.Logger
	// SessionConflictRetries and SessionConflictWait bound how long Run
	// waits for another listener to give the session up (default 10 tries
	// 30 s apart, as ARC's listener did).
	SessionConflictRetries int
	SessionConflictWait    time.Duration
	// BackoffMin and BackoffMax bound the wait after a failed poll once
	// the client's own retries are spent (default 1 s and 1 min).
	BackoffMin, BackoffMax time.Duration
	// MaxConsecutiveErrors stops Run after that many failed polls in a row
	// (default 20).
	MaxConsecutiveErrors int
}

// Listener holds a scale set's message session and turns its messages
// into Events: it acknowledges each message, acquires every job offered,
// refreshes the session when its token expires, re-creates it when the
// service dropped it, and backs off on service errors.
type Listener struct {
	cfg ListenerConfig
	log *slog.Logger
}

// NewListener checks cfg and fills its defaults.
func NewListener(cfg ListenerConfig) (*Listener, error) {
	if cfg.Client == nil || cfg.Handle == nil || cfg.MaxRunners == nil || cfg.ScaleSetID <= 0 || cfg.Owner == "" {
		return nil, errors.New("scaleset listener: Client, Handle, MaxRunners, ScaleSetID and Owner are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = cfg.Client.log
	}
	if cfg.SessionConflictRetries == 0 {
		cfg.SessionConflictRetries = 10
	}
	if cfg.SessionConflictWait == 0 {
		cfg.SessionConflictWait = 30 * time.Second
	}
	if cfg.BackoffMin == 0 {
		cfg.BackoffMin = time.Second
	}
	if cfg.BackoffMax == 0 {
		cfg.BackoffMax = time.Minute
	}
	if cfg.MaxConsecutiveErrors == 0 {
		cfg.MaxConsecutiveErrors = 20
	}
	return &Listener{cfg: cfg, log: cfg.Logger.With("scaleSetID", cfg.ScaleSetID, "owner", cfg.Owner)}, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// openSession creates the session, waiting out a conflict a bounded
// number of times.
func (l *Listener) openSession(ctx context.Context) (*Session, error) {
	for attempt := 1; ; attempt++ {
		s, err := l.cfg.Client.CreateSession(ctx, l.cfg.ScaleSetID, l.cfg.Owner)
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, ErrSessionConflict) || attempt >= l.cfg.SessionConflictRetries {
			return nil, err
		}
		l.log.Info("another listener holds the session; waiting", "attempt", attempt, "wait", l.cfg.SessionConflictWait)
		if err := sleep(ctx, l.cfg.SessionConflictWait); err != nil {
			return nil, fmt.Errorf("wait for the message session: %w", err)
		}
	}
}

// Run listens until ctx ends (it then deletes the session and returns
// ctx's error) or a failure it cannot ride out.
func (l *Listener) Run(ctx context.Context) (err error) {
	sess, err := l.openSession(ctx)
	if err != nil {
		return err
	}
	defer func() {
		// Give the session back even when ctx is done, so the next
		// listener need not wait for it.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if cerr := sess.Close(cctx); cerr != nil && !errors.Is(cerr, ErrNotFound) {
			l.log.Warn("could not delete the message session", "error", cerr)
		}
	}()
	if st := sess.Info().Statistics; st != nil {
		if err := l.cfg.Handle(ctx, Event{Type: EventStatistics, Statistics: st}); err != nil {
			return fmt.Errorf("handle statistics: %w", err)
		}
	}
	var last int64
	backoff, failures := l.cfg.BackoffMin, 0
	for ctx.Err() == nil {
		msg, err := sess.GetMessage(ctx, last, l.cfg.MaxRunners())
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			failures++
			if failures >= l.cfg.MaxConsecutiveErrors {
				return fmt.Errorf("scale set %d: %d polls failed in a row: %w", l.cfg.ScaleSetID, failures, err)
			}
			if errors.Is(err, ErrNotFound) {
				// The service dropped the session: open a new one; it
				// redelivers what was not acknowledged.
				l.log.Info("message session gone; opening a new one", "error", err)
				if ns, oerr := l.openSession(ctx); oerr == nil {
					sess, last = ns, 0
					continue
				} else if ctx.Err() == nil {
					l.log.Warn("could not reopen the message session", "error", oerr)
				}
			}
			l.log.Warn("polling the message queue failed; backing off", "error", err, "backoff", backoff, "failures", failures)
			if err := sleep(ctx, backoff); err != nil {
				break
			}
			backoff = min(backoff*2, l.cfg.BackoffMax)
			continue
		}
		backoff, failures = l.cfg.BackoffMin, 0
		if msg == nil {
			continue
		}
		if err := l.handle(ctx, sess, msg); err != nil {
			return err
		}
		last = msg.ID
	}
	return ctx.Err()
}

// handle acknowledges a message first (as ARC does: a crash after that
// loses nothing the statistics do not repeat), then acquires the offered
// jobs and passes every job message on.
func (l *Listener) handle(ctx context.Context, sess *Session, msg *Message) error {
	log := l.log.With("messageID", msg.ID)
	if msg.Statistics != nil {
		if err := l.cfg.Handle(ctx, Event{Type: EventStatistics, Statistics: msg.Statistics}); err != nil {
			return fmt.Errorf("handle statistics: %w", err)
		}
	}
	if err := sess.DeleteMessage(ctx, msg.ID); err != nil {
		return fmt.Errorf("acknowledge message %d: %w", msg.ID, err)
	}
	var available []int64
	for _, jm := range msg.Jobs {
		ev := Event{Type: EventType(jm.Type), Job: Job{
			RequestID: jm.RunnerRequestID, JobID: jm.JobID, Repository: jm.OwnerName + "/" + jm.RepositoryName,
			Workflow: jm.JobWorkflowRef, WorkflowRunID: jm.WorkflowRunID, DisplayName: jm.JobDisplayName,
			Labels: jm.RequestLabels, RunnerID: jm.RunnerID, RunnerName: jm.RunnerName, Result: jm.Result,
		}}
		log.Info("job message", "type", jm.Type, "requestID", jm.RunnerRequestID, "repository", ev.Job.Repository, "runner", jm.RunnerName, "result", jm.Result)
		if err := l.cfg.Handle(ctx, ev); err != nil {
			return fmt.Errorf("handle %s of request %d: %w", jm.Type, jm.RunnerRequestID, err)
		}
		if jm.Type == JobAvailable {
			available = append(available, jm.RunnerRequestID)
		}
	}
	if len(available) > 0 {
		got, err := sess.AcquireJobs(ctx, available)
		if err != nil {
			return fmt.Errorf("acquire %d jobs: %w", len(available), err)
		}
		log.Info("jobs acquired", "offered", len(available), "acquired", len(got))
	}
	return nil
}
