// Package guardedmap is a map that is safe for concurrent use and whose
// nil pointer reads as empty: what the in-memory stores one controller
// writes and others read are built on (a cluster's DNS service, a claim's
// latest runner observation), so that the locking is written once.
package guardedmap

import "sync"

// Map is a map from K to V guarded by a read-write lock. The zero value is
// an empty map ready to use; a nil *Map reads as empty.
type Map[K comparable, V any] struct {
	mu sync.RWMutex
	m  map[K]V
}

// Get returns k's value; false when there is none.
func (m *Map[K, V]) Get(k K) (V, bool) {
	if m == nil {
		var zero V
		return zero, false
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	v, ok := m.m[k]
	return v, ok
}

// Swap sets k's value to v and returns the value it replaced; false when
// k had none.
func (m *Map[K, V]) Swap(k K, v V) (V, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = map[K]V{}
	}
	old, ok := m.m[k]
	m.m[k] = v
	return old, ok
}

// Delete drops k's value; a nil *Map has none.
func (m *Map[K, V]) Delete(k K) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.m, k)
}

// Keys returns the keys whose value keep accepts, in no order.
func (m *Map[K, V]) Keys(keep func(V) bool) []K {
	if m == nil {
		return nil
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out []K
	for k, v := range m.m {
		if keep(v) {
			out = append(out, k)
		}
	}
	return out
}
