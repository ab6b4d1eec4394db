package scaling

import (
	"cmp"
	"slices"
	"time"
)

// Backoff is the replacement backoff of a pool whose claims keep failing
// before their runner comes online (a broken image, a runner that cannot
// register): instead of cloning, registering and destroying VMs in a tight
// loop, the pool waits longer after each failure once Threshold of them
// came in a row. A claim whose runner comes online resets the count.
type Backoff struct {
	// Threshold is the number of consecutive failures from which
	// replacements wait.
	Threshold int
	// Base is the wait at Threshold failures; it doubles with each further
	// one, up to Cap.
	Base, Cap time.Duration
}

// DefaultBackoff waits 30 s after the third failure in a row, doubling to
// at most 10 minutes (docs/runnerpool.md).
func DefaultBackoff() Backoff {
	return Backoff{Threshold: 3, Base: 30 * time.Second, Cap: 10 * time.Minute}
}

// Delay is the wait before the next replacement after failures
// consecutive failures: zero below Threshold.
func (b Backoff) Delay(failures int) time.Duration {
	if b.Threshold <= 0 || failures < b.Threshold || b.Base <= 0 {
		return 0
	}
	d := b.Base
	for range failures - b.Threshold {
		if d >= b.Cap/2 {
			return b.Cap
		}
		d *= 2
	}
	return min(d, b.Cap)
}

// Attempt is the outcome of one claim, as far as the backoff counts it.
type Attempt struct {
	// ID identifies the claim (its UID).
	ID string
	// At is when the outcome happened (the failure, or the runner online).
	At time.Time
	// Failed is true for a claim that failed or ended before its runner
	// came online, false for one whose runner came online.
	Failed bool
	// Reason says why it failed, for the condition.
	Reason string
}

// BackoffState is what a pool remembers between decisions (its status).
type BackoffState struct {
	Failures        int
	LastFailure     string
	LastFailureTime time.Time
	NextAttempt     time.Time // zero: replacements do not wait
	// ObservedThrough and Counted say which attempts were counted: all
	// before ObservedThrough, and those at it whose ID is in Counted.
	ObservedThrough time.Time
	Counted         []string
}

// Observe folds the attempts not counted yet into s, in time order (then by
// ID), and returns how many new failures it counted. Attempts already
// counted, by time or ID, change nothing, so the same claims may be shown
// again on every decision and after a restart.
func (b Backoff) Observe(s BackoffState, attempts []Attempt) (BackoffState, int) {
	fresh := make([]Attempt, 0, len(attempts))
	for _, a := range attempts {
		switch {
		case a.At.Before(s.ObservedThrough):
		case a.At.Equal(s.ObservedThrough) && slices.Contains(s.Counted, a.ID):
		default:
			fresh = append(fresh, a)
		}
	}
	slices.SortFunc(fresh, func(x, y Attempt) int { return cmp.Or(x.At.Compare(y.At), cmp.Compare(x.ID, y.ID)) })
	failures := 0
	for _, a := range fresh {
		if a.At.After(s.ObservedThrough) {
			s.ObservedThrough, s.Counted = a.At, nil
		}
		s.Counted = append(slices.Clone(s.Counted), a.ID)
		if !a.Failed {
			s.Failures, s.NextAttempt = 0, time.Time{}
			continue
		}
		failures++
		s.Failures++
		s.LastFailure, s.LastFailureTime = a.Reason, a.At
		if d := b.Delay(s.Failures); d > 0 {
			s.NextAttempt = a.At.Add(d)
		} else {
			s.NextAttempt = time.Time{}
		}
	}
	return s, failures
}

// Waiting reports whether replacements wait at now, and until when.
func (s BackoffState) Waiting(now time.Time) (time.Time, bool) {
	return s.NextAttempt, !s.NextAttempt.IsZero() && now.Before(s.NextAttempt)
}
