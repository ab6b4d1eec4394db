// Package simclock is the clock HyperFleet's simulators schedule their work
// on: the real clock, or a FakeClock that tests advance by hand.
package simclock

import (
	"sort"
	"sync"
	"time"
)

// Clock is a simulator's source of time. Everything a simulator schedules
// runs on it, so a test that injects a FakeClock decides exactly when a
// clone finishes or a job completes, without sleeping.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f in its own goroutine (real clock) or from Advance
	// (fake clock) once d has elapsed. The returned Timer can cancel it.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a cancellable pending AfterFunc call.
type Timer interface {
	// Stop cancels the call; it reports whether the call was still pending.
	Stop() bool
}

// RealClock is the wall clock.
type RealClock struct{}

// Now returns time.Now.
func (RealClock) Now() time.Time { return time.Now() }

// AfterFunc wraps time.AfterFunc.
func (RealClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// FakeClock is a manually advanced Clock for deterministic tests. Timers fire
// synchronously inside Advance, in due order, each seeing Now equal to its due
// time, so when Advance returns every effect that was due has happened.
type FakeClock struct {
	mu     sync.Mutex
	now    time.Time
	seq    uint64
	timers []*fakeTimer
}

type fakeTimer struct {
	clock *FakeClock
	when  time.Time
	seq   uint64
	f     func()
	done  bool
}

// NewFakeClock returns a FakeClock set to start.
func NewFakeClock(start time.Time) *FakeClock {
	return &FakeClock{now: start}
}

// Now returns the fake time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc registers f to run when the fake time reaches Now()+d. A
// non-positive d still waits for the next Advance (even Advance(0)), which
// mirrors a real timer never firing inside the caller's own stack.
func (c *FakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &fakeTimer{clock: c, when: c.now.Add(d), seq: c.seq, f: f}
	c.timers = append(c.timers, t)
	return t
}

// Stop cancels the timer.
func (t *fakeTimer) Stop() bool {
	t.clock.mu.Lock()
	defer t.clock.mu.Unlock()
	if t.done {
		return false
	}
	t.done = true
	return true
}

// Pending returns how many timers wait to fire; tests use it to know that a
// request is parked on the clock before they Advance.
func (c *FakeClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if !t.done {
			n++
		}
	}
	return n
}

// Advance moves the fake time forward by d, firing every timer that becomes
// due on the way (including timers registered by fired callbacks).
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	target := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		next := c.popDueLocked(target)
		if next == nil {
			if c.now.Before(target) {
				c.now = target
			}
			c.mu.Unlock()
			return
		}
		if next.when.After(c.now) {
			c.now = next.when
		}
		c.mu.Unlock()
		next.f()
	}
}

// popDueLocked removes and returns the earliest pending timer due at or
// before target, or nil.
func (c *FakeClock) popDueLocked(target time.Time) *fakeTimer {
	live := c.timers[:0]
	for _, t := range c.timers {
		if !t.done {
			live = append(live, t)
		}
	}
	c.timers = live
	sort.Slice(c.timers, func(i, j int) bool {
		if c.timers[i].when.Equal(c.timers[j].when) {
			return c.timers[i].seq < c.timers[j].seq
		}
		return c.timers[i].when.Before(c.timers[j].when)
	})
	if len(c.timers) == 0 || c.timers[0].when.After(target) {
		return nil
	}
	t := c.timers[0]
	t.done = true
	c.timers = c.timers[1:]
	return t
}
