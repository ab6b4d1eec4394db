package webhook

import (
	"container/list"
	"sync"
	"time"
)

// dedupe remembers recent delivery ids: a bounded LRU whose entries also
// expire after a TTL. It only saves work: the CIJob's name and its
// monotonic state are what make a repeated delivery harmless, across
// replicas and restarts.
type dedupe struct {
	mu    sync.Mutex
	ttl   time.Duration
	size  int
	order *list.List // front: most recent; values are *dedupeEntry
	items map[string]*list.Element
}

type dedupeEntry struct {
	id   string
	seen time.Time
}

func newDedupe(size int, ttl time.Duration) *dedupe {
	return &dedupe{ttl: ttl, size: size, order: list.New(), items: make(map[string]*list.Element, min(size, 1024))}
}

// add records id as seen at now; false when it was already seen within the
// TTL (a duplicate).
func (d *dedupe) add(id string, now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if el, ok := d.items[id]; ok {
		// Seen again: most recently used, remembered for another TTL.
		e := el.Value.(*dedupeEntry)
		fresh := now.Sub(e.seen) < d.ttl
		e.seen = now
		d.order.MoveToFront(el)
		return !fresh
	}
	// Drop expired entries from the back, then the least recent if full.
	for back := d.order.Back(); back != nil; back = d.order.Back() {
		e := back.Value.(*dedupeEntry)
		if now.Sub(e.seen) < d.ttl && d.order.Len() < d.size {
			break
		}
		d.order.Remove(back)
		delete(d.items, e.id)
	}
	d.items[id] = d.order.PushFront(&dedupeEntry{id: id, seen: now})
	return true
}

// forget drops id, so a redelivery is processed again (after a failure).
func (d *dedupe) forget(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if el, ok := d.items[id]; ok {
		d.order.Remove(el)
		delete(d.items, id)
	}
}

func (d *dedupe) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.order.Len()
}
