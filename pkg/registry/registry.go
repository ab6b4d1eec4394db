// Package registry is the one mechanism by which the operator binary makes
// its pluggable back-ends known by name: CI platforms (pkg/workload),
// hypervisor kinds (pkg/provider) and DNS services (internal/dnsreg). The
// binary's main registers each back-end it ships, next to the others, so
// that shipping one more is its package and one line there; the shared
// code looks a back-end up by the name the API spells (spec.provider,
// spec.workload.type, spec.dns.dnsProvider.type) and never switches over
// names itself.
package registry

import (
	"fmt"
	"maps"
	"reflect"
	"sync"
)

// Registry holds the back-ends of one kind, by name. Its zero value is not
// usable: build one with New. It is safe for concurrent use.
type Registry[K ~string, V any] struct {
	// what names the registry in panics ("workload type", "hypervisor
	// kind"), so a doubled registration says which binary line is wrong.
	what string
	mu   sync.Mutex
	byK  map[K]V
}

// New returns an empty registry; what names its keys in panic messages.
func New[K ~string, V any](what string) *Registry[K, V] {
	return &Registry[K, V]{what: what, byK: map[K]V{}}
}

// Register adds v under k. Registering a name twice, or an empty name or
// a nil value, is a programming error of the binary's main and panics, as
// init-time registration does in database/sql and image. Registering the
// very same comparable value under its name again changes nothing: a test
// world that runs the operator in-process registers the built-in kinds it
// uses, whether or not its binary did already.
func (r *Registry[K, V]) Register(k K, v V) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, dup := r.byK[k]; dup {
		if same(old, v) {
			return
		}
		panic(fmt.Sprintf("registry: %s %s is registered twice", r.what, k))
	}
	if k == "" || isNil(v) {
		panic(fmt.Sprintf("registry: Register needs a %s and a value", r.what))
	}
	r.byK[k] = v
}

// Registered returns a copy of everything registered so far.
func (r *Registry[K, V]) Registered() map[K]V {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.byK)
}

// Lookup returns the value registered under k.
func (r *Registry[K, V]) Lookup(k K) (V, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.byK[k]
	return v, ok
}

// isNil says whether v is nil or a nil func, pointer, map, slice, channel
// or interface: a typed nil in V would pass v == nil unnoticed.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Func, reflect.Pointer, reflect.Map, reflect.Slice, reflect.Chan, reflect.Interface:
		return rv.IsNil()
	}
	return false
}

// same says whether a and b are one comparable value; values of
// incomparable types (funcs, maps) are never the same.
func same(a, b any) bool {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	return va.IsValid() && vb.IsValid() && va.Type() == vb.Type() && va.Comparable() && vb.Comparable() && a == b
}
