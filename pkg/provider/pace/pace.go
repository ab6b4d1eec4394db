// Package pace learns how long each kind of hypervisor task takes and
// says when to look at one in flight, for hypervisors with no way to wait
// for a task (Proxmox's task status, which the operator polls) and for the
// operator's own waits on one (a standby VM's resume).
package pace

import (
	"sync"
	"time"
)

// Task pacing. A hypervisor may have no way to wait for a task: the
// operator polls its status. Polling on a fixed backoff finds a task done up to one
// interval late, and every VM's start is a chain of tasks (clone, config,
// upload, start), so those lags add up on the path from job queued to
// runner online (docs/performance.md, cold start). A cluster's tasks of one
// kind take about the same time each run (the same template, storage and
// node size), so the provider learns each kind's typical duration from the
// tasks it saw finish and looks first just before that, then closely while
// the task is due, and backs off only once it is clearly late. The result
// is usually two status reads per task and a lag of about NearPoll.
const (
	// NearPoll is the interval while a task is due.
	NearPoll = 100 * time.Millisecond
	// MinPoll and MaxPoll bound the look at a task of a kind not seen
	// yet, or one that is late: a quarter of the time it has run so far.
	MinPoll = 250 * time.Millisecond
	MaxPoll = 2 * time.Second
	// paceWeight is how much one slower observation moves the typical
	// duration up (an exponentially weighted moving average).
	paceWeight = 0.3
)

// Tasks keeps the typical duration of each kind of task. Safe for
// concurrent use; the zero value knows nothing.
type Tasks struct {
	mu      sync.Mutex
	typical map[string]time.Duration
}

// Observe records that a task of kind op was seen done took after it
// started. took is an upper bound: the task ended at most one look
// earlier. A task seen done sooner than the typical duration therefore
// sets it at once (the look before the typical end keeps probing lower
// until a task is found still running); a slower one moves it up by
// paceWeight of the difference, so one stalled task does not make every
// later look late.
func (p *Tasks) Observe(op string, took time.Duration) {
	if took <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.typical == nil {
		p.typical = map[string]time.Duration{}
	}
	prev, ok := p.typical[op]
	if !ok || took < prev {
		p.typical[op] = took
		return
	}
	p.typical[op] = prev + time.Duration(paceWeight*float64(took-prev))
}

// Next is how long to wait before looking at a task of kind op that has
// run for elapsed.
func (p *Tasks) Next(op string, elapsed time.Duration) time.Duration {
	p.mu.Lock()
	typ := p.typical[op]
	p.mu.Unlock()
	if typ > 0 {
		// Look a little before the typical end, so that a task that got
		// faster is seen at once and the estimate shrinks.
		due := typ - min(typ/10, 2*NearPoll)
		switch {
		case elapsed < due:
			return max(due-elapsed, NearPoll)
		case elapsed < typ*3/2:
			return NearPoll
		}
	}
	// Unknown or late: a quarter of the time it has run so far.
	return min(max(elapsed/4, MinPoll), MaxPoll)
}
