package controller

import (
	"slices"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
)

// poolClaimState is where one of a pool's claims stands, for scaling.
type poolClaimState int

const (
	claimStarting poolClaimState = iota
	claimIdle
	claimBusy
	claimTerminating
	claimRetained
	claimFinished
)

// poolClaims are a pool's claims sorted into the states scaling counts.
type poolClaims struct {
	starting, idle, busy, terminating, retained, finished []*hfv1.MachineClaim
	// stale marks live (starting, idle, busy) claims built from an older
	// template; busy ones are replaced after their job.
	stale map[types.UID]bool
}

// classifyClaims sorts claims by state. hash is the pool's current
// template hash (empty when unknown: nothing is stale then).
func classifyClaims(claims []hfv1.MachineClaim, hash string, retains bool) *poolClaims {
	pc := &poolClaims{stale: map[types.UID]bool{}}
	for i := range claims {
		c := &claims[i]
		state := claimStateOf(c, retains)
		switch state {
		case claimStarting:
			pc.starting = append(pc.starting, c)
		case claimIdle:
			pc.idle = append(pc.idle, c)
		case claimBusy:
			pc.busy = append(pc.busy, c)
		case claimTerminating:
			pc.terminating = append(pc.terminating, c)
		case claimRetained:
			pc.retained = append(pc.retained, c)
		case claimFinished:
			pc.finished = append(pc.finished, c)
		}
		if (state == claimStarting || state == claimIdle || state == claimBusy) && hash != "" && c.Status.TemplateHash != "" && c.Status.TemplateHash != hash {
			pc.stale[c.UID] = true
		}
	}
	// Oldest first: scale-down and drift replacement remove the VMs
	// closest to their maxLifetime, and history keeps the newest.
	for _, l := range [][]*hfv1.MachineClaim{pc.starting, pc.idle, pc.busy, pc.terminating, pc.retained, pc.finished} {
		slices.SortFunc(l, func(a, b *hfv1.MachineClaim) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
	}
	return pc
}

// claimStateOf is one claim's state for scaling.
func claimStateOf(c *hfv1.MachineClaim, retains bool) poolClaimState {
	st := c.Status.Bootstrap
	switch {
	case c.IsFinished():
		return claimFinished
	case c.HasFailed() && c.DeletionTimestamp.IsZero():
		if c.Status.VMRef == nil {
			return claimFinished
		}
		if retains {
			return claimRetained
		}
		return claimTerminating
	case c.EndRequested(), c.Ended():
		// Claims the pool asked to end count as terminating until they
		// are gone: a VM still being destroyed holds its place.
		return claimTerminating
	case st != nil && (st.JobID != 0 || st.RunnerState == hfv1.RunnerStateBusy):
		return claimBusy
	case hfv1.IsConditionTrue(c.Status.Conditions, hfv1.MachineClaimBootstrappedCondition):
		return claimIdle
	}
	return claimStarting
}

// claimTimes are the instants a claim's lifecycle limits count from.
func claimTimes(c *hfv1.MachineClaim) scaling.ClaimTimes {
	t := scaling.ClaimTimes{Created: c.CreationTimestamp.Time}
	if pt := c.Status.PhaseTimes; pt != nil && pt.Provisioning != nil {
		t.Provisioning = pt.Provisioning.Time
	}
	if st := c.Status.Bootstrap; st != nil {
		if st.RegisteredAt != nil {
			t.Registered = st.RegisteredAt.Time
		}
		if st.JobStartedAt != nil && st.JobID != 0 {
			t.JobStarted = st.JobStartedAt.Time
		}
	}
	return t
}

// poolLimits are a pool's lifecycle limits.
func poolLimits(p *hfv1.RunnerPool) scaling.Limits {
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

// expectations remember the claims a pool created or deleted until the
// cache shows them, so that a decision is never made twice against a
// cache that lags the API server (the ReplicaSet controller's technique).
// They live in memory: after a restart the cache is synced before the
// first reconcile, which is all they protect.
type expectations struct {
	mu sync.Mutex
	m  map[types.NamespacedName]*poolExpectation
}

type poolExpectation struct {
	creates map[string]time.Time    // claim names created
	deletes map[types.UID]time.Time // claims deleted or asked to end
}

// expectationTimeout bounds how long a pool waits for its cache: an
// expectation older than this is dropped (the write probably failed
// after all, and the next decision recomputes from what is there).
// Expectations are stamped when their write returns, not when the
// reconcile began: a reconcile that creates dozens of claims on a slow
// API server can outlast the timeout, and stamping its first instant
// dropped the last claims' expectations before the cache could show them
// (a burst of 55 jobs then got 56 claims).
const expectationTimeout = time.Minute

func (e *expectations) get(pool types.NamespacedName) *poolExpectation {
	if e.m == nil {
		e.m = map[types.NamespacedName]*poolExpectation{}
	}
	pe := e.m[pool]
	if pe == nil {
		pe = &poolExpectation{creates: map[string]time.Time{}, deletes: map[types.UID]time.Time{}}
		e.m[pool] = pe
	}
	return pe
}

// created records a claim the pool created.
func (e *expectations) created(pool types.NamespacedName, name string, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.get(pool).creates[name] = now
}

// ended records a claim the pool deleted or asked to end.
func (e *expectations) ended(pool types.NamespacedName, uid types.UID, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.get(pool).deletes[uid] = now
}

// satisfied reports whether claims (from the cache) show every write the
// pool made; it forgets the writes they show and those that timed out.
func (e *expectations) satisfied(pool types.NamespacedName, claims []hfv1.MachineClaim, now time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	pe := e.m[pool]
	if pe == nil {
		return true
	}
	names := make(map[string]bool, len(claims))
	ending := make(map[types.UID]bool, len(claims))
	present := make(map[types.UID]bool, len(claims))
	for i := range claims {
		c := &claims[i]
		names[c.Name] = true
		present[c.UID] = true
		if claimStateOf(c, true) == claimTerminating || c.HasFailed() {
			ending[c.UID] = true
		}
	}
	for name, at := range pe.creates {
		if names[name] || now.Sub(at) > expectationTimeout {
			delete(pe.creates, name)
		}
	}
	for uid, at := range pe.deletes {
		if !present[uid] || ending[uid] || now.Sub(at) > expectationTimeout {
			delete(pe.deletes, uid)
		}
	}
	if len(pe.creates) == 0 && len(pe.deletes) == 0 {
		delete(e.m, pool)
		return true
	}
	return false
}

// forget drops a deleted pool's expectations.
func (e *expectations) forget(pool types.NamespacedName) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.m, pool)
}
