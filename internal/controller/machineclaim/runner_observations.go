package machineclaim

import (
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/hyperfleet/hyperfleet/internal/guardedmap"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// RunnerObservation is a claim's runner as the latest runner list of its scope
// showed it.
type RunnerObservation struct {
	// Present is false when the list no longer has the runner (an
	// ephemeral runner is removed by the platform after its job).
	Present bool
	// State is the runner's state when present.
	State workload.RunnerState
	// At is when the list was read.
	At time.Time
}

// RunnerObservations hold the latest runner observation of each claim, by claim
// UID. They live in memory only: the next resync rebuilds them from the CI
// platform, and what a claim concluded from them is in its status
// (docs/architecture.md, "Demand records in the API server").
type RunnerObservations struct {
	m guardedmap.Map[types.UID, RunnerObservation]
}

// NewRunnerObservations returns an empty store.
func NewRunnerObservations() *RunnerObservations { return &RunnerObservations{} }

// Get returns the claim's latest observation.
func (o *RunnerObservations) Get(uid types.UID) (RunnerObservation, bool) {
	if o == nil {
		return RunnerObservation{}, false
	}
	return o.m.Get(uid)
}

// Set records an observation and reports whether it differs from the
// previous one in what it says (presence or state).
func (o *RunnerObservations) Set(uid types.UID, v RunnerObservation) bool {
	old, ok := o.m.Swap(uid, v)
	return !ok || old.Present != v.Present || old.State != v.State
}

// Forget drops a claim's observation.
func (o *RunnerObservations) Forget(uid types.UID) {
	if o != nil {
		o.m.Delete(uid)
	}
}
