package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
)

var (
	// ErrUnknownPool means no pool of that name was set (or it was
	// removed); the IPPool controller has not seen it yet.
	ErrUnknownPool = errors.New("IP pool not known to the allocator")
	// ErrNotRebuilt means the pool's allocations have not been rebuilt
	// from the MachineClaims since it was set; allocating now could hand
	// out an address a claim already records (docs/architecture.md,
	// "Static IP pools").
	// Retry after the rebuild.
	ErrNotRebuilt = errors.New("IP pool not rebuilt from MachineClaim allocations yet")
)

// Manager holds one Allocator per IPPool, keyed by pool name. It is safe
// for concurrent use: the map has its own lock and each pool another, so a
// rebuild of one pool does not stall allocations from the others.
//
// A pool starts not rebuilt. Until Rebuild has been called for it, the
// calls that change allocations (Allocate, AllocateSpecific, Release,
// ReleaseOwner) fail with ErrNotRebuilt; reads work and report the empty
// state. This is how "rebuild before the first allocation after a restart"
// is enforced rather than hoped for.
type Manager struct {
	mu    sync.RWMutex
	pools map[string]*managedPool
}

type managedPool struct {
	mu      sync.Mutex
	alloc   *Allocator
	rebuilt bool
	// removed is set under mu when the pool leaves the map, so a call that
	// looked it up just before fails instead of allocating from a pool
	// that no longer exists.
	removed bool
}

// NewManager returns a manager without pools.
func NewManager() *Manager {
	return &Manager{pools: map[string]*managedPool{}}
}

// SetPool installs pool p under name, or replaces the spec of an installed
// pool. A replaced pool keeps its allocations and its rebuilt mark; held
// addresses the new spec no longer hands out stay reserved and are
// returned as ConflictOutsidePool. When the allocatable space is unchanged
// (only gateways outside it, nameservers or search domains changed) the
// allocator is kept as is.
func (m *Manager) SetPool(name string, p *Pool) []Conflict {
	m.mu.Lock()
	defer m.mu.Unlock()
	mp, ok := m.pools[name]
	if !ok {
		m.pools[name] = &managedPool{alloc: NewAllocator(p)}
		return nil
	}
	mp.mu.Lock()
	defer mp.mu.Unlock()
	old := mp.alloc
	if old.pool.Family == p.Family && slices.Equal(old.pool.Allocatable, p.Allocatable) {
		old.pool = p
		return nil
	}
	next := NewAllocator(p)
	conflicts := next.Rebuild(old.Allocations())
	mp.alloc = next
	return conflicts
}

// RemovePool forgets the pool and its allocations. Callers remove a pool
// only once no claim holds an address from it (the IPPool's finalizer).
func (m *Manager) RemovePool(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if mp, ok := m.pools[name]; ok {
		mp.mu.Lock()
		mp.removed = true
		mp.mu.Unlock()
		delete(m.pools, name)
	}
}

// with runs fn on the named pool under its lock.
func (m *Manager) with(name string, fn func(mp *managedPool) error) error {
	m.mu.RLock()
	mp, ok := m.pools[name]
	m.mu.RUnlock()
	if !ok {
		return fmt.Errorf("IPPool %s: %w", name, ErrUnknownPool)
	}
	mp.mu.Lock()
	defer mp.mu.Unlock()
	if mp.removed {
		return fmt.Errorf("IPPool %s: %w", name, ErrUnknownPool)
	}
	if err := fn(mp); err != nil {
		return fmt.Errorf("IPPool %s: %w", name, err)
	}
	return nil
}

// mutate is with for calls that change allocations: they wait for the
// rebuild.
func (m *Manager) mutate(name string, fn func(a *Allocator) error) error {
	return m.with(name, func(mp *managedPool) error {
		if !mp.rebuilt {
			return ErrNotRebuilt
		}
		return fn(mp.alloc)
	})
}

// Pool returns the named pool's spec; treat it as read-only.
func (m *Manager) Pool(name string) (*Pool, bool) {
	var p *Pool
	err := m.with(name, func(mp *managedPool) error { p = mp.alloc.pool; return nil })
	return p, err == nil
}

// Rebuild replaces the named pool's allocations with those recorded in
// MachineClaims' status (see Allocator.Rebuild for conflicts) and marks it
// rebuilt. Pass no allocations to mark a pool no claim uses as rebuilt.
//
// Rebuild replaces, it does not merge: call it once per pool, before the
// first allocation, from a complete and current list of claims (a synced
// cache). Allocations made between taking that list and calling Rebuild
// would be forgotten.
func (m *Manager) Rebuild(name string, allocations []Allocation) ([]Conflict, error) {
	var conflicts []Conflict
	err := m.with(name, func(mp *managedPool) error {
		conflicts = mp.alloc.Rebuild(allocations)
		mp.rebuilt = true
		return nil
	})
	return conflicts, err
}

// Rebuilt reports whether the named pool exists and has been rebuilt.
func (m *Manager) Rebuilt(name string) bool {
	var rebuilt bool
	_ = m.with(name, func(mp *managedPool) error { rebuilt = mp.rebuilt; return nil })
	return rebuilt
}

// Allocate gives owner the lowest free address of the named pool (see
// Allocator.Allocate). Errors match ErrUnknownPool, ErrNotRebuilt,
// ErrExhausted or ErrNoOwner.
func (m *Manager) Allocate(name, owner string) (netip.Addr, error) {
	var addr netip.Addr
	err := m.mutate(name, func(a *Allocator) error {
		var err error
		addr, err = a.Allocate(owner)
		return err
	})
	return addr, err
}

// AllocateSpecific gives owner addr from the named pool (see
// Allocator.AllocateSpecific).
func (m *Manager) AllocateSpecific(name, owner string, addr netip.Addr) error {
	return m.mutate(name, func(a *Allocator) error { return a.AllocateSpecific(owner, addr) })
}

// Release frees addr in the named pool if owner holds it (see
// Allocator.Release).
func (m *Manager) Release(name, owner string, addr netip.Addr) error {
	return m.mutate(name, func(a *Allocator) error { return a.Release(owner, addr) })
}

// ReleaseOwner frees every address owner holds in the named pool.
func (m *Manager) ReleaseOwner(name, owner string) ([]netip.Addr, error) {
	var released []netip.Addr
	err := m.mutate(name, func(a *Allocator) error { released = a.ReleaseOwner(owner); return nil })
	return released, err
}

// Released is one address ReleaseOwnerEverywhere freed.
type Released struct {
	Pool    string
	Address netip.Addr
}

// ReleaseOwnerEverywhere frees every address owner holds in any rebuilt
// pool and returns them by pool name, then address. It is how a deleted
// claim gives back an address allocated in memory whose record in the
// claim's status was never written (the status write failed): releasing
// only what the status lists would leak it until the next restart. Pools
// not rebuilt yet are skipped: nothing can be allocated in them, and their
// rebuild reads the claims' status, which no longer lists the owner.
func (m *Manager) ReleaseOwnerEverywhere(owner string) []Released {
	m.mu.RLock()
	names := make([]string, 0, len(m.pools))
	for name := range m.pools {
		names = append(names, name)
	}
	m.mu.RUnlock()
	slices.Sort(names)
	var out []Released
	for _, name := range names {
		// Errors mean the pool went away or is not rebuilt: nothing of
		// owner's is held there.
		_ = m.mutate(name, func(a *Allocator) error {
			for _, addr := range a.ReleaseOwner(owner) {
				out = append(out, Released{Pool: name, Address: addr})
			}
			return nil
		})
	}
	return out
}

// Owner returns the holder of addr in the named pool; false when the
// address is free or the pool unknown.
func (m *Manager) Owner(name string, addr netip.Addr) (string, bool) {
	var owner string
	var ok bool
	_ = m.with(name, func(mp *managedPool) error { owner, ok = mp.alloc.Owner(addr); return nil })
	return owner, ok
}

// Counts returns the named pool's totals.
func (m *Manager) Counts(name string) (Counts, error) {
	var c Counts
	err := m.with(name, func(mp *managedPool) error { c = mp.alloc.Counts(); return nil })
	return c, err
}

// Allocations returns the named pool's held addresses in address order.
func (m *Manager) Allocations(name string) ([]Allocation, error) {
	var out []Allocation
	err := m.with(name, func(mp *managedPool) error { out = mp.alloc.Allocations(); return nil })
	return out, err
}
