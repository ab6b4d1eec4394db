// Package cloneslots is the one accounting of the clones a hypervisor
// cluster runs at once, for every hypervisor kind that clones a template
// into a new VM. A cluster bounds them per node and per storage
// (provider.ClusterConfig's ClonesPerNode and ClonesPerStorage): a burst of
// clones onto one disk makes every one of them slow, and the hypervisor's
// own locks time out under it.
//
// The rules are the same whatever the hypervisor, and they are subtle
// enough that two copies drifted apart (one woke every waiting owner on a
// freed slot and served whoever asked first, the other woke only those a
// slot was free for and served them in arrival order), so they live here
// once:
//
//   - A slot is keyed by VM id and counted against one node and a list of
//     storage keys; the caller makes a storage key unique for what it
//     bounds (a node's local storage prefixed with the node's name).
//   - A placement that finds a slot free holds it (Hold), so that what it
//     reports (provider.EnsureResult.Waits) stays true in a burst: the
//     clone requests of concurrent placements come in any order, and a
//     slot free at placement would otherwise go to another VM's request
//     first. A hold its clone never takes lapses after Config.Lapse.
//   - A clone that finds no slot (Take) waits in one queue, first come
//     first served among the VMs that compete for the same node or
//     storages; a waiting VM that stops asking for Config.Lapse leaves it.
//   - A freed slot wakes (Config.Wake) the waiting owners that would get a
//     slot now, no others: each woken owner's call costs a status write.
//   - Optionally (Config.StaleAfter), a slot stops counting once its clone
//     is that old unless the caller watches its work go on (Watch): a
//     clone made in one call whose owner never comes back to see it must
//     not keep the slot for ever.
//
// A Slots has its own lock, so that the slot state needs no lock of its
// user; it never calls out while holding it, except Config.Observe.
package cloneslots

import (
	"slices"
	"sync"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Config is what a Slots counts against and whom it tells.
type Config struct {
	// PerNode and PerStorage bound the clones in flight on one node and
	// onto one storage key; zero means no bound.
	PerNode, PerStorage int
	// Lapse is how long a slot held at placement waits for its clone to
	// take it, and how long a waiting VM stays queued without asking
	// again, before either is dropped.
	Lapse time.Duration
	// StaleAfter, when positive, stops counting a slot that old (from its
	// placement's hold or its clone's start) unless it is watched (Watch).
	// It must exceed Lapse: a hold gone stale before it lapses would
	// count again once its clone takes it, past a limit another VM's
	// slot may have filled meanwhile.
	StaleAfter time.Duration
	// Now is the clock.
	Now func() time.Time
	// Wake, if set, is told of each waiting owner that would get a slot
	// after one is freed.
	Wake func(provider.Owner)
	// Observe, if set, is told the number of VMs waiting whenever the
	// queue changes or a clone is refused.
	Observe func(waiting int)
}

// Slots counts clone slots by the rules of the package documentation. It
// is safe for concurrent use.
type Slots struct {
	cfg Config

	mu sync.Mutex
	// inUse are the slots taken, by VM id.
	inUse map[int]*slot
	// queue are the VMs waiting for a slot, in arrival order.
	queue []*waiter
}

// slot is a clone in flight, or a slot held at placement for a clone not
// begun yet.
type slot struct {
	node     string
	storages []string
	// since is when the placement held the slot, or when the clone took
	// it.
	since time.Time
	// held: taken by a placement, not by its clone yet (lapses after
	// Config.Lapse).
	held bool
	// watched: the caller sees the clone's work go on, so the slot counts
	// however old it is (Config.StaleAfter).
	watched bool
}

// waiter is a VM waiting for a slot.
type waiter struct {
	vmid     int
	owner    provider.Owner
	node     string
	storages []string
	// seen is when the VM last asked.
	seen time.Time
}

// New returns empty Slots counted by cfg.
func New(cfg Config) *Slots {
	return &Slots{cfg: cfg, inUse: map[int]*slot{}}
}

// Hold takes a slot for VM vmid, just placed on node to write to
// storages, when its clone could begin now, and reports whether vmid has
// a slot. The clones in flight, the slots held before it and every VM
// waiting go first. A VM refused here is not queued: its clone asks again
// (Take).
func (s *Slots) Hold(vmid int, node string, storages []string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	s.dropLapsedHoldsLocked(now)
	if s.inUse[vmid] != nil {
		return true
	}
	t := s.tallyLocked(now)
	for _, w := range s.queue {
		if now.Sub(w.seen) <= s.cfg.Lapse {
			t.add(w.node, w.storages)
		}
	}
	if !s.fits(t, node, storages) {
		return false
	}
	s.inUse[vmid] = &slot{node: node, storages: storages, since: now, held: true}
	return true
}

// Take takes a slot for owner's VM vmid, whose clone is about to begin on
// node writing to storages, and reports whether it has one: the slot its
// placement holds, one free after the VMs queued before it for the same
// node or storages, or none, and then vmid waits in the queue.
func (s *Slots) Take(vmid int, owner provider.Owner, node string, storages []string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	s.dropLapsedHoldsLocked(now)
	if sl := s.inUse[vmid]; sl != nil {
		if sl.held {
			// The clone takes the slot its placement held: from now on
			// it is a clone in flight, no longer a hold.
			sl.held, sl.since = false, now
		}
		s.leaveLocked(func(w *waiter) bool { return w.vmid == vmid })
		return true
	}
	s.leaveLocked(func(w *waiter) bool { return now.Sub(w.seen) > s.cfg.Lapse })
	t := s.tallyLocked(now)
	mine := -1
	for i, w := range s.queue {
		if w.vmid == vmid {
			mine = i
			w.seen = now
			break
		}
		// Count the VMs ahead in the queue: those that compete for the
		// same limits go first.
		t.add(w.node, w.storages)
	}
	if !s.fits(t, node, storages) {
		if mine < 0 {
			s.queue = append(s.queue, &waiter{vmid: vmid, owner: owner, node: node, storages: storages, seen: now})
		}
		s.observeLocked()
		return false
	}
	if mine >= 0 {
		s.queue = slices.Delete(s.queue, mine, mine+1)
		s.observeLocked()
	}
	s.inUse[vmid] = &slot{node: node, storages: storages, since: now}
	return true
}

// Release frees vmid's slot, if it has one, and wakes the waiting owners
// that would get a slot now (Config.Wake), so that they do not wait out
// their poll interval.
func (s *Slots) Release(vmid int) { s.release(vmid, false) }

// ReleaseHold frees vmid's slot only if it is a placement's hold (the VM
// is placed elsewhere, or deleted before its clone), waking as Release.
func (s *Slots) ReleaseHold(vmid int) { s.release(vmid, true) }

func (s *Slots) release(vmid int, holdOnly bool) {
	s.mu.Lock()
	sl := s.inUse[vmid]
	if sl == nil || holdOnly && !sl.held {
		s.mu.Unlock()
		return
	}
	delete(s.inUse, vmid)
	var wake []provider.Owner
	if s.cfg.Wake != nil {
		wake = s.admissibleLocked(s.cfg.Now())
	}
	s.mu.Unlock()
	for _, o := range wake {
		s.cfg.Wake(o)
	}
}

// Forget drops vmid's slot and its place in the queue without waking
// anyone: the VM id is given up (excluded, or its VM deleted) and whatever
// it held is accounted for by the caller.
func (s *Slots) Forget(vmid int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.inUse, vmid)
	s.leaveLocked(func(w *waiter) bool { return w.vmid == vmid })
}

// Leave drops every place in the queue of the owner with uid: it waits for
// no clone any more (it is placed again, done or deleted).
func (s *Slots) Leave(uid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leaveLocked(func(w *waiter) bool { return w.owner.UID == uid })
}

// Watch says whether the caller sees the work of vmid's clone go on (a
// copy running in the background): a watched slot counts however old it
// is (Config.StaleAfter). Nothing happens when vmid has no slot.
func (s *Slots) Watch(vmid int, watched bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl := s.inUse[vmid]; sl != nil {
		sl.watched = watched
	}
}

// InUse reports whether vmid has a slot, held by its placement or taken
// by its clone.
func (s *Slots) InUse(vmid int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inUse[vmid] != nil
}

// admissibleLocked returns the owners of the waiting VMs that would get a
// slot now, by the rule Take applies: the slots counted plus every VM
// queued earlier for the same node or storages stay under the limits.
func (s *Slots) admissibleLocked(now time.Time) []provider.Owner {
	t := s.tallyLocked(now)
	var out []provider.Owner
	for _, w := range s.queue {
		if s.fits(t, w.node, w.storages) && w.owner.UID != "" {
			out = append(out, w.owner)
		}
		// Later VMs count this one as ahead of them.
		t.add(w.node, w.storages)
	}
	return out
}

// dropLapsedHoldsLocked frees the slots held at placement whose clone has
// not taken them within Config.Lapse.
func (s *Slots) dropLapsedHoldsLocked(now time.Time) {
	for vmid, sl := range s.inUse {
		if sl.held && now.Sub(sl.since) > s.cfg.Lapse {
			delete(s.inUse, vmid)
		}
	}
}

// leaveLocked drops the waiting VMs drop selects, telling Config.Observe
// when the queue shrank.
func (s *Slots) leaveLocked(drop func(*waiter) bool) {
	before := len(s.queue)
	s.queue = slices.DeleteFunc(s.queue, drop)
	if len(s.queue) != before {
		s.observeLocked()
	}
}

func (s *Slots) observeLocked() {
	if s.cfg.Observe != nil {
		s.cfg.Observe(len(s.queue))
	}
}

// tally counts clones by node and by storage key.
type tally struct{ node, storage map[string]int }

func (t tally) add(node string, storages []string) {
	t.node[node]++
	for _, st := range storages {
		t.storage[st]++
	}
}

// tallyLocked counts the slots in use, but for stale ones
// (Config.StaleAfter).
func (s *Slots) tallyLocked(now time.Time) tally {
	t := tally{node: map[string]int{}, storage: map[string]int{}}
	for _, sl := range s.inUse {
		if s.cfg.StaleAfter > 0 && !sl.watched && now.Sub(sl.since) >= s.cfg.StaleAfter {
			continue
		}
		t.add(sl.node, sl.storages)
	}
	return t
}

// fits reports whether one more clone on node to storages stays within
// the limits, given the clones t counts ahead of it.
func (s *Slots) fits(t tally, node string, storages []string) bool {
	if s.cfg.PerNode > 0 && t.node[node] >= s.cfg.PerNode {
		return false
	}
	for _, st := range storages {
		if s.cfg.PerStorage > 0 && t.storage[st] >= s.cfg.PerStorage {
			return false
		}
	}
	return true
}
