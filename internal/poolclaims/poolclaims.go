// Package poolclaims sorts a RunnerPool's claims for scaling: the state
// each one is in (StateOf, Classify), the instants and limits of its
// lifecycle (Times, Limits), and the expectations that keep a pool from
// deciding twice against a cache that has not shown its writes yet.
package poolclaims

import (
	"slices"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
)

// State is where one of a pool's claims stands, for scaling.
type State int

const (
	Starting State = iota
	Idle
	Busy
	Terminating
	Retained
	Finished
	// Deleted: finished and about to go with the next collection
	// deletion of its namespace's finished claims (labelled
	// hyperfleet.io/finished, its finalizer removed): counted nowhere, as
	// if it were gone.
	Deleted
	// StandbyReady: in the pool's standby tier (spec.standby), suspended
	// to disk, ready to be taken for a job.
	StandbyReady
	// StandbyBuilding: in the standby tier, its VM being built, booted or
	// suspended.
	StandbyBuilding
)

// Claims are a pool's claims sorted into the states scaling counts.
type Claims struct {
	Starting, Idle, Busy, Terminating, Retained, Finished []*hfv1.MachineClaim
	// StandbyReady and StandbyBuilding are the standby tier.
	StandbyReady, StandbyBuilding []*hfv1.MachineClaim
	// Stale marks live (starting, idle, busy) and standby claims built
	// from an older template; busy ones are replaced after their job.
	Stale map[types.UID]bool
}

// Classify sorts claims by state. hash is the pool's current
// template hash (empty when unknown: nothing is stale then).
func Classify(claims []hfv1.MachineClaim, hash string, retains bool) *Claims {
	return classify(claims, func(*hfv1.MachineClaim) string { return hash }, retains)
}

// ClassifyTemplates sorts the claims of a pool with several templates
// (spec.placement) by state: each claim is stale against the current hash
// of its own template, hashes[spec.templateRef.name] (a template without
// a hash there makes none of its claims stale).
func ClassifyTemplates(claims []hfv1.MachineClaim, hashes map[string]string, retains bool) *Claims {
	return classify(claims, func(c *hfv1.MachineClaim) string { return hashes[c.Spec.TemplateRef.Name] }, retains)
}

func classify(claims []hfv1.MachineClaim, hashOf func(*hfv1.MachineClaim) string, retains bool) *Claims {
	pc := &Claims{Stale: map[types.UID]bool{}}
	for i := range claims {
		c := &claims[i]
		state := StateOf(c, retains)
		switch state {
		case Starting:
			pc.Starting = append(pc.Starting, c)
		case Idle:
			pc.Idle = append(pc.Idle, c)
		case Busy:
			pc.Busy = append(pc.Busy, c)
		case Terminating:
			pc.Terminating = append(pc.Terminating, c)
		case Retained:
			pc.Retained = append(pc.Retained, c)
		case Finished:
			pc.Finished = append(pc.Finished, c)
		case StandbyReady:
			pc.StandbyReady = append(pc.StandbyReady, c)
		case StandbyBuilding:
			pc.StandbyBuilding = append(pc.StandbyBuilding, c)
		}
		if hash := hashOf(c); state != Terminating && state != Retained && state != Finished && state != Deleted &&
			hash != "" && c.Status.TemplateHash != "" && c.Status.TemplateHash != hash {
			pc.Stale[c.UID] = true
		}
	}
	// Oldest first: scale-down and drift replacement remove the VMs
	// closest to their maxLifetime, and history keeps the newest; the
	// standby tier's oldest are the longest suspended, taken first for a
	// job and closest to the tier's maxAge.
	for _, l := range [][]*hfv1.MachineClaim{pc.Starting, pc.Idle, pc.Busy, pc.Terminating, pc.Retained, pc.Finished, pc.StandbyBuilding} {
		slices.SortFunc(l, func(a, b *hfv1.MachineClaim) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
	}
	slices.SortFunc(pc.StandbyReady, func(a, b *hfv1.MachineClaim) int {
		return a.Status.Standby.SuspendedAt.Compare(b.Status.Standby.SuspendedAt.Time)
	})
	return pc
}

// StateOf is one claim's state for scaling.
func StateOf(c *hfv1.MachineClaim, retains bool) State {
	st := c.Status.Bootstrap
	switch {
	case c.Labels[hfv1.FinishedLabel] == hfv1.FinishedLabelValue && !slices.Contains(c.Finalizers, hfv1.MachineClaimFinalizer):
		return Deleted
	case c.IsFinished(), c.Disowned():
		// A disowned claim's VM is no longer the pool's: the pool does
		// not count it, and replaces it.
		return Finished
	case c.HasFailed() && c.DeletionTimestamp.IsZero():
		if c.Status.VMRef == nil {
			return Finished
		}
		if retains {
			return Retained
		}
		return Terminating
	case c.EndRequested(), c.Ended():
		// Claims the pool asked to end count as terminating until they
		// are gone: a VM still being destroyed holds its place.
		return Terminating
	case c.Spec.Standby && c.Status.Standby != nil && c.Status.Standby.SuspendedAt != nil:
		return StandbyReady
	case c.Spec.Standby:
		return StandbyBuilding
	case st != nil && (st.Job() != "" || st.RunnerState == hfv1.RunnerStateBusy):
		return Busy
	case hfv1.IsConditionTrue(c.Status.Conditions, hfv1.MachineClaimBootstrappedCondition):
		return Idle
	}
	return Starting
}

// Times are the instants a claim's lifecycle limits count from.
//
// A VM taken from the standby tier starts its life as a runner at its
// resume (status.standby.resumedAt): its maxLifetime and bootstrapTimeout
// count from there, the time it stood by being bounded by the tier's
// maxAge instead.
func Times(c *hfv1.MachineClaim) scaling.ClaimTimes {
	t := scaling.ClaimTimes{Created: c.CreationTimestamp.Time}
	if pt := c.Status.PhaseTimes; pt != nil && pt.Provisioning != nil {
		t.Provisioning = pt.Provisioning.Time
	}
	if st := c.Status.Standby; st != nil && st.ResumedAt != nil {
		t.Created, t.Provisioning = st.ResumedAt.Time, st.ResumedAt.Time
	}
	if st := c.Status.Bootstrap; st != nil {
		if st.RegisteredAt != nil {
			t.Registered = st.RegisteredAt.Time
		}
		if st.JobStartedAt != nil && st.Job() != "" {
			t.JobStarted = st.JobStartedAt.Time
		}
	}
	return t
}

// Limits are a pool's lifecycle limits.
func Limits(p *hfv1.RunnerPool) scaling.Limits {
	l := p.Spec.Lifecycle
	d := func(v *metav1.Duration, def time.Duration) time.Duration {
		if v == nil {
			return def
		}
		return v.Duration
	}
	return scaling.Limits{
		BootstrapTimeout: d(l.BootstrapTimeout, 10*time.Minute),
		IdleTimeout:      d(l.IdleTimeout, 30*time.Minute),
		JobTimeout:       d(l.JobTimeout, 3*time.Hour),
		MaxLifetime:      d(l.MaxLifetime, 6*time.Hour),
	}
}

// Expectations remember the claims a pool created or deleted until the
// cache shows them, so that a decision is never made twice against a
// cache that lags the API server (the ReplicaSet controller's technique).
// They live in memory: after a restart the cache is synced before the
// first reconcile, which is all they protect.
//
// A pool's pass takes a Mark before it lists its claims and hands it to
// Satisfied with the list: a watch event that arrives between the list and
// the check must not count for that list, which was read before the cache
// had the event. (Counting it made a burst of 55 jobs get 57 claims: two
// claims' create events came in after the list that lacked them and before
// the check, which then took both creates as shown.)
type Expectations struct {
	mu sync.Mutex
	m  map[types.NamespacedName]*expectation
	// seq numbers the watch events Observed, in order: an event numbered
	// at or below a Mark was in the cache before that Mark was taken.
	seq uint64
}

// Mark is a point in the order of the cache's events (Expectations.Mark).
type Mark uint64

type expectation struct {
	creates map[string]created      // claim names created
	deletes map[types.UID]time.Time // claims deleted or asked to end
	// activates are standby claims the pool took for a job (cleared
	// spec.standby): a pass whose cache still shows them in the tier
	// would take another one for the same job.
	activates map[types.UID]time.Time
	// seen are claim names the cache announced (Observed) before their
	// creation was recorded here: the watch can be faster than the
	// create call's return.
	seen map[string]observation
}

// created is one claim creation the pool waits to see: when its write
// returned, and the number of the watch event that announced it (0 while
// none has).
type created struct {
	at       time.Time
	observed uint64
}

// observation is a watch event about a claim whose creation is not
// recorded yet: when it came and its number.
type observation struct {
	at  time.Time
	seq uint64
}

// ExpectationTimeout bounds how long a pool waits for its cache: an
// expectation older than this is dropped (the write probably failed
// after all, and the next decision recomputes from what is there).
// Expectations are stamped when their write returns, not when the
// reconcile began: a reconcile that creates dozens of claims on a slow
// API server can outlast the timeout, and stamping its first instant
// dropped the last claims' expectations before the cache could show them
// (a burst of 55 jobs then got 56 claims).
const ExpectationTimeout = time.Minute

func (e *Expectations) get(pool types.NamespacedName) *expectation {
	if e.m == nil {
		e.m = map[types.NamespacedName]*expectation{}
	}
	pe := e.m[pool]
	if pe == nil {
		pe = &expectation{creates: map[string]created{}, deletes: map[types.UID]time.Time{}, activates: map[types.UID]time.Time{}, seen: map[string]observation{}}
		e.m[pool] = pe
	}
	return pe
}

// Mark returns the point the cache's events have reached: take it before
// listing the claims that Satisfied is then given.
func (e *Expectations) Mark() Mark {
	e.mu.Lock()
	defer e.mu.Unlock()
	return Mark(e.seq)
}

// Created records a claim the pool created.
func (e *Expectations) Created(pool types.NamespacedName, name string, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	pe := e.get(pool)
	c := created{at: now}
	if o, ok := pe.seen[name]; ok {
		delete(pe.seen, name)
		c.observed = o.seq
	}
	pe.creates[name] = c
}

// Observed records that the cache announced a claim of the pool (its
// watch's create or delete event): from then on the cache has seen that
// write, even if the claim is gone by the pool's next look. A claim whose
// whole life fits between two of the pool's looks (a short job on a fast
// hypervisor) would otherwise never show in a list, and the pool would
// decide nothing until ExpectationTimeout: the churn benchmark's pools
// stalled for a minute (docs/performance.md). Call it once the cache holds
// the event (a controller's event handler runs after the informer stored
// the object).
func (e *Expectations) Observed(pool types.NamespacedName, name string, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seq++
	pe := e.get(pool)
	if c, ok := pe.creates[name]; ok {
		if c.observed == 0 {
			c.observed = e.seq
			pe.creates[name] = c
		}
		return
	}
	if _, ok := pe.seen[name]; !ok {
		pe.seen[name] = observation{at: now, seq: e.seq}
	}
}

// Ended records a claim the pool deleted or asked to end.
func (e *Expectations) Ended(pool types.NamespacedName, uid types.UID, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.get(pool).deletes[uid] = now
}

// Activated records a standby claim the pool took out of its tier.
func (e *Expectations) Activated(pool types.NamespacedName, uid types.UID, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.get(pool).activates[uid] = now
}

// Satisfied reports whether claims (listed from the cache after mark was
// taken) show every write the pool made; it forgets the writes they show
// and those that timed out. A creation counts as shown when the claim is
// listed, or when the cache announced it before mark (the claim may have
// come and gone since): an announcement after mark may postdate the list.
func (e *Expectations) Satisfied(pool types.NamespacedName, mark Mark, claims []hfv1.MachineClaim, now time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	pe := e.m[pool]
	if pe == nil {
		return true
	}
	names := make(map[string]bool, len(claims))
	ending := make(map[types.UID]bool, len(claims))
	present := make(map[types.UID]bool, len(claims))
	standing := make(map[types.UID]bool, len(claims))
	for i := range claims {
		c := &claims[i]
		names[c.Name] = true
		present[c.UID] = true
		if StateOf(c, true) == Terminating || c.HasFailed() {
			ending[c.UID] = true
		}
		standing[c.UID] = c.Spec.Standby
	}
	for name, c := range pe.creates {
		shown := names[name] || (c.observed != 0 && c.observed <= uint64(mark))
		if shown || now.Sub(c.at) > ExpectationTimeout {
			delete(pe.creates, name)
		}
	}
	for uid, at := range pe.deletes {
		if !present[uid] || ending[uid] || now.Sub(at) > ExpectationTimeout {
			delete(pe.deletes, uid)
		}
	}
	for uid, at := range pe.activates {
		if !standing[uid] || now.Sub(at) > ExpectationTimeout {
			delete(pe.activates, uid)
		}
	}
	for name, o := range pe.seen {
		// Claims the pool did not create (or whose creation failed after
		// all) are not waited for; their names are forgotten in time.
		if now.Sub(o.at) > ExpectationTimeout {
			delete(pe.seen, name)
		}
	}
	done := len(pe.creates) == 0 && len(pe.deletes) == 0 && len(pe.activates) == 0
	if done && len(pe.seen) == 0 {
		delete(e.m, pool)
	}
	return done
}

// Forget drops a deleted pool's Expectations.
func (e *Expectations) Forget(pool types.NamespacedName) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.m, pool)
}
