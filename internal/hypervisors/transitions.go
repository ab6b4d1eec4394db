package hypervisors

import (
	"sort"
	"sync"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// HintSource says who told the operator that a VM is about to stop.
type HintSource string

const (
	// HintAgent is the in-VM agent's call just before it powers the VM off.
	HintAgent HintSource = "agent"
	// HintJobCompleted is the completed job of the VM's runner (a
	// workflow_job webhook, or the resync reading the job).
	HintJobCompleted HintSource = "job-completed"
	// HintRunnerGone is the resync no longer finding the VM's runner on the
	// CI platform (an ephemeral runner is removed after its one job).
	HintRunnerGone HintSource = "runner-gone"
)

// Outcome of Transitions.Mark.
type MarkOutcome string

const (
	// Marked: the VM is in transition now.
	Marked MarkOutcome = "marked"
	// Duplicate: this source already marked the VM; nothing changed.
	Duplicate MarkOutcome = "duplicate"
	// Full: the set holds its maximum of VMs in transition; the VM is left
	// to the listing.
	Full MarkOutcome = "full"
)

// VMKey names a VM: its cluster and its id there.
type VMKey struct {
	Cluster string
	VM      provider.ID
}

// Transition defaults (docs/architecture.md, "Power-off hints").
const (
	// DefaultTransitionTTL is how long a hinted VM is read directly before
	// it is left to the listing again.
	DefaultTransitionTTL = 60 * time.Second
	// DefaultTransitionPoll is how often a VM in transition is read.
	DefaultTransitionPoll = time.Second
	// DefaultMaxTransitions bounds the VMs in transition at once, hence the
	// per-VM status reads per poll period.
	DefaultMaxTransitions = 256
)

type transition struct {
	until time.Time
	// sources that marked the VM: each marks it once per VM lifetime, so
	// no hint, repeated, keeps a VM polled past its TTL.
	sources map[HintSource]bool
}

// Transitions is the set of VMs "in transition": VMs a hint says are about
// to stop, which may be read one by one (per-VM status) for a bounded time
// instead of waiting for the cluster's batch listing. It is bounded (Max
// VMs at once), each entry expires after TTL, and each hint source marks a
// VM once: a hint, even a forged or repeated one, costs at most TTL/poll
// reads of one VM. Safe for concurrent use. The zero value is not usable;
// use NewTransitions.
type Transitions struct {
	ttl, poll time.Duration
	max       int
	// observe receives the number of VMs in transition after each change
	// (the metrics gauge); nil ignores it.
	observe func(int)

	mu sync.Mutex
	m  map[VMKey]*transition
}

// TransitionOptions configure a Transitions set; zero values take the
// defaults.
type TransitionOptions struct {
	TTL, Poll time.Duration
	Max       int
	// Observe receives the number of VMs in transition after each change.
	Observe func(int)
}

// NewTransitions returns an empty set.
func NewTransitions(o TransitionOptions) *Transitions {
	t := &Transitions{ttl: o.TTL, poll: o.Poll, max: o.Max, observe: o.Observe, m: map[VMKey]*transition{}}
	if t.ttl <= 0 {
		t.ttl = DefaultTransitionTTL
	}
	if t.poll <= 0 {
		t.poll = DefaultTransitionPoll
	}
	if t.max <= 0 {
		t.max = DefaultMaxTransitions
	}
	return t
}

// Poll is how often a VM in transition is read.
func (t *Transitions) Poll() time.Duration {
	if t == nil {
		return DefaultTransitionPoll
	}
	return t.poll
}

// Mark puts the VM in transition until now+TTL, unless source already
// marked it (Duplicate) or the set is full (Full). A second source marking
// a VM in transition extends it to now+TTL.
func (t *Transitions) Mark(k VMKey, source HintSource, now time.Time) MarkOutcome {
	if t == nil {
		return Full
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(now)
	e := t.m[k]
	switch {
	case e != nil && e.sources[source]:
		return Duplicate
	case e == nil && t.activeLocked(now) >= t.max:
		return Full
	case e == nil:
		if len(t.m) >= t.max {
			t.evictSpentLocked(now)
		}
		e = &transition{sources: map[HintSource]bool{}}
		t.m[k] = e
	}
	e.sources[source] = true
	e.until = now.Add(t.ttl)
	t.observeLocked(now)
	return Marked
}

// Active reports whether the VM is in transition at now, and until when.
func (t *Transitions) Active(k VMKey, now time.Time) (time.Time, bool) {
	if t == nil {
		return time.Time{}, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[k]
	if e == nil || !now.Before(e.until) {
		t.observeLocked(now)
		return time.Time{}, false
	}
	return e.until, true
}

// Forget drops the VM (its claim ended or it is gone): a later VM with the
// same id starts afresh.
func (t *Transitions) Forget(k VMKey, now time.Time) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.m, k)
	t.observeLocked(now)
}

// Len is the number of VMs in transition at now.
func (t *Transitions) Len(now time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.activeLocked(now)
}

func (t *Transitions) activeLocked(now time.Time) int {
	n := 0
	for _, e := range t.m {
		if now.Before(e.until) {
			n++
		}
	}
	return n
}

// expireLocked drops spent entries beyond the bound. Spent entries (TTL
// over) are kept while there is room, so that a source cannot mark the VM
// again; the claim's end forgets them.
func (t *Transitions) expireLocked(now time.Time) {
	for len(t.m) > t.max {
		if !t.evictSpentLocked(now) {
			return
		}
	}
}

// evictSpentLocked drops the spent entry that expired first; false when
// none is spent.
func (t *Transitions) evictSpentLocked(now time.Time) bool {
	var spent []VMKey
	for k, e := range t.m {
		if !now.Before(e.until) {
			spent = append(spent, k)
		}
	}
	if len(spent) == 0 {
		return false
	}
	sort.Slice(spent, func(i, j int) bool { return t.m[spent[i]].until.Before(t.m[spent[j]].until) })
	delete(t.m, spent[0])
	return true
}

func (t *Transitions) observeLocked(now time.Time) {
	if t.observe != nil {
		t.observe(t.activeLocked(now))
	}
}
