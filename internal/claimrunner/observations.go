package claimrunner

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// Observation is a claim's runner as the latest runner list of its scope
// showed it.
type Observation struct {
	// Present is false when the list no longer has the runner (an
	// ephemeral runner is removed by the platform after its job).
	Present bool
	// State is the runner's state when present.
	State workload.RunnerState
	// At is when the list was read.
	At time.Time
}

// Observations hold the latest runner observation of each claim, by claim
// UID. They live in memory only: the next resync rebuilds them from the CI
// platform, and what a claim concluded from them is in its status
// (docs/architecture.md, "Demand records in the API server").
type Observations struct {
	mu sync.RWMutex
	m  map[types.UID]Observation
}

// NewObservations returns an empty store.
func NewObservations() *Observations {
	return &Observations{m: map[types.UID]Observation{}}
}

// Get returns the claim's latest observation.
func (o *Observations) Get(uid types.UID) (Observation, bool) {
	if o == nil {
		return Observation{}, false
	}
	o.mu.RLock()
	defer o.mu.RUnlock()
	v, ok := o.m[uid]
	return v, ok
}

// Set records an observation and reports whether it differs from the
// previous one in what it says (presence or state).
func (o *Observations) Set(uid types.UID, v Observation) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	old, ok := o.m[uid]
	o.m[uid] = v
	return !ok || old.Present != v.Present || old.State != v.State
}

// Forget drops a claim's observation.
func (o *Observations) Forget(uid types.UID) {
	if o == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.m, uid)
}
