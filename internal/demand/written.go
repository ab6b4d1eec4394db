package demand

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// writtenSize bounds the CIJobs a Recorder remembers writing: a job's
// events come seconds to hours apart, and a record older than the last
// writtenSize writes is read from the cache or the API server instead.
const writtenSize = 2048

// written remembers the CIJobs this Recorder last wrote, as the API server
// returned them (with their resourceVersion). A job's next event then
// updates that copy in one write, without the create that would be refused
// and the uncached read before the update: a job's events come in bursts
// (in_progress then completed within milliseconds for a short job), faster
// than the manager's cache sees the previous write. The copy may be stale
// (another replica, the resync or a person wrote since): the update then
// fails on its resourceVersion and the Recorder reads the record from the
// API server, as without the copy. Safe for concurrent use.
type written struct {
	mu   sync.Mutex
	jobs map[types.NamespacedName]*hfv1.CIJob
	// order is a ring of the keys in jobs, oldest at next, to evict.
	order []types.NamespacedName
	next  int
}

func newWritten() *written {
	return &written{jobs: make(map[types.NamespacedName]*hfv1.CIJob, writtenSize)}
}

// get returns a copy of the record last written under key, if remembered.
func (w *written) get(key types.NamespacedName) (*hfv1.CIJob, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	cj, ok := w.jobs[key]
	if !ok {
		return nil, false
	}
	return cj.DeepCopy(), true
}

// put remembers cj as written, evicting the oldest record when full.
func (w *written) put(cj *hfv1.CIJob) {
	key := types.NamespacedName{Namespace: cj.Namespace, Name: cj.Name}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.jobs[key]; !ok {
		if len(w.order) < writtenSize {
			w.order = append(w.order, key)
		} else {
			delete(w.jobs, w.order[w.next])
			w.order[w.next] = key
			w.next = (w.next + 1) % writtenSize
		}
	}
	w.jobs[key] = cj.DeepCopy()
}

// forget drops key: its copy proved stale or the record is gone.
func (w *written) forget(key types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.jobs, key)
}
