// Package cachelag keeps a controller from acting on an informer cache that
// has not yet seen the controller's own last write of an object.
//
// Why: a controller reads objects from a cache that trails the API server.
// A reconcile that reads a version older than the one it just wrote would
// repeat a step already taken (for a MachineClaim, a second cloud-init
// delivery issues a second runner credential). The Tracker remembers the
// resourceVersion of each object's last write by UID; a reconcile that
// finds the cache older waits for the watch event instead, with a requeue
// that backs off (an API server or informer under load may take seconds,
// and a fixed short requeue would spin).
//
// The Tracker also remembers which UID holds each name, so that a
// controller's per-object memory is dropped when a reconcile finds the name
// gone or taken by a new object, whatever became of the old one while the
// controller was not looking.
package cachelag

import (
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Requeue delays while the cache is older than the last write.
const (
	FirstWait = 50 * time.Millisecond
	MaxWait   = 5 * time.Second
	// ReportAfter is the count of consecutive stale reads at which the
	// lag is worth a log line.
	ReportAfter = 8
)

// Wait is the requeue after the n-th consecutive stale read (n from 0):
// 50 ms doubling to 5 s.
func Wait(n int) time.Duration {
	if n >= 8 {
		return MaxWait
	}
	return min(FirstWait<<n, MaxWait)
}

// Tracker holds the last write and the UID under each name. The zero value
// is ready to use.
type Tracker struct {
	written sync.Map // types.UID -> uint64 resourceVersion
	waits   sync.Map // types.UID -> int consecutive stale reads
	names   sync.Map // types.NamespacedName -> types.UID
}

// Stale reports whether the cache shows obj older than its last write,
// with the requeue to wait for it and the count of stale reads so far.
func (t *Tracker) Stale(obj client.Object) (wait time.Duration, stale bool, reads int) {
	v, ok := t.written.Load(obj.GetUID())
	cur, err := strconv.ParseUint(obj.GetResourceVersion(), 10, 64)
	// resourceVersions are etcd revisions; one that does not parse is
	// never called stale.
	if !ok || err != nil || cur >= v.(uint64) {
		t.waits.Delete(obj.GetUID())
		return 0, false, 0
	}
	n := 0
	if w, ok := t.waits.Load(obj.GetUID()); ok {
		n = w.(int)
	}
	t.waits.Store(obj.GetUID(), n+1)
	return Wait(n), true, n
}

// Wrote records obj's resourceVersion after a write.
func (t *Tracker) Wrote(obj client.Object) {
	if rv, err := strconv.ParseUint(obj.GetResourceVersion(), 10, 64); err == nil {
		t.written.Store(obj.GetUID(), rv)
	}
}

// Done drops the last write of an object nothing more is written to.
func (t *Tracker) Done(uid types.UID) { t.written.Delete(uid) }

// Observe records that name holds uid now. When another object held the
// name before, its memory is dropped and its UID returned (ok true): the
// controller drops the rest of what it kept about it.
func (t *Tracker) Observe(name types.NamespacedName, uid types.UID) (forgotten types.UID, ok bool) {
	if old, loaded := t.names.Swap(name, uid); loaded && old.(types.UID) != uid {
		return t.forget(old.(types.UID)), true
	}
	return "", false
}

// Gone drops the memory of the object last seen under name, which is gone,
// and returns its UID (ok false when no object was seen under name).
func (t *Tracker) Gone(name types.NamespacedName) (forgotten types.UID, ok bool) {
	if old, loaded := t.names.LoadAndDelete(name); loaded {
		return t.forget(old.(types.UID)), true
	}
	return "", false
}

func (t *Tracker) forget(uid types.UID) types.UID {
	t.written.Delete(uid)
	t.waits.Delete(uid)
	return uid
}

// Remembers reports whether the Tracker holds anything about uid.
func (t *Tracker) Remembers(uid types.UID) bool {
	_, w := t.written.Load(uid)
	_, s := t.waits.Load(uid)
	return w || s
}

// Names is how many names the Tracker maps to a UID.
func (t *Tracker) Names() int {
	n := 0
	t.names.Range(func(any, any) bool { n++; return true })
	return n
}
