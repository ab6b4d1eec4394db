package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Sentinel errors of the allocator and the manager; match them with
// errors.Is, the returned errors carry the details.
var (
	// ErrExhausted means every address of the pool is held. Retrying helps
	// only once addresses are released or added.
	ErrExhausted = errors.New("IP pool exhausted")
	// ErrInUse means the address asked for is held by another owner.
	ErrInUse = errors.New("address held by another owner")
	// ErrNotInPool means the address is not one the pool hands out: outside
	// its entries, excluded, a gateway, or a network, broadcast or anycast
	// address.
	ErrNotInPool = errors.New("address not in the pool")
	// ErrNotOwner means a release named an owner that does not hold the
	// address. The address stays with its holder.
	ErrNotOwner = errors.New("address held by another owner, not released")
	// ErrNoOwner means the owner is empty; every address must be traceable
	// to a MachineClaim UID.
	ErrNoOwner = errors.New("owner must not be empty")
)

// Allocation is one address held by one owner (a MachineClaim UID).
type Allocation struct {
	Owner   string
	Address netip.Addr
}

// Counts are the numbers an IPPool's status reports. Each is capped at
// 2^63-1 (an IPv6 /64 holds 2^64 addresses).
type Counts struct {
	// Total is the number of addresses the pool hands out.
	Total int64
	// Allocated is the number of those addresses held.
	Allocated int64
	// Free is Total minus Allocated.
	Free int64
	// OutOfPool is the number of held addresses the pool no longer hands
	// out (its spec shrank); they stay reserved until their owner releases
	// them.
	OutOfPool int64
}

// Allocator hands out the addresses of one pool, lowest first, and records
// who holds each. It is not safe for concurrent use; Manager serialises
// access.
//
// Invariants: an address has at most one owner; an address of
// Pool.Allocatable is marked in its segment exactly when it has an owner;
// owned addresses outside Pool.Allocatable (the pool shrank) are counted in
// outside and never handed out again until released.
type Allocator struct {
	pool    *Pool
	segs    []segment
	total   u128
	inPool  u128
	outside int64
	// hint is the lowest segment that may have a free address: all
	// segments before it are full, so allocation on a nearly full pool
	// does not rescan them.
	hint   int
	owners map[addrKey]string
	// first is each owner's first address and extra the further ones of
	// the rare owner holding several: the common case then costs no slice
	// allocation per owner.
	first map[string]netip.Addr
	extra map[string][]netip.Addr
}

// addrKey is an address as a map key: 16 bytes without the pointer a
// netip.Addr carries for zones, so the owner map hashes fast and the GC does
// not scan its keys. IPv4 addresses take their IPv4-mapped form; canon
// unmaps every IPv6 spelling of an IPv4 address, so keys never collide.
type addrKey [16]byte

func keyOf(a netip.Addr) addrKey { return a.As16() }

func (k addrKey) addr() netip.Addr { return netip.AddrFrom16(k).Unmap() }

// NewAllocator returns an allocator for p with nothing allocated.
func NewAllocator(p *Pool) *Allocator {
	a := &Allocator{pool: p}
	a.reset(0)
	return a
}

func (a *Allocator) reset(sizeHint int) {
	a.segs = make([]segment, len(a.pool.Allocatable))
	a.total = u128{}
	for i, r := range a.pool.Allocatable {
		a.segs[i] = newSegment(r)
		a.total = a.total.addSat(a.segs[i].size)
	}
	a.inPool = u128{}
	a.outside = 0
	a.hint = 0
	a.owners = make(map[addrKey]string, sizeHint)
	a.first = make(map[string]netip.Addr, sizeHint)
	a.extra = map[string][]netip.Addr{}
}

// Pool is the pool the allocator hands out.
func (a *Allocator) Pool() *Pool { return a.pool }

// segmentOf returns the index of the segment holding addr, or -1.
func (a *Allocator) segmentOf(addr netip.Addr) int {
	if !addr.IsValid() || familyOf(addr) != a.pool.Family {
		return -1
	}
	x := toU128(addr)
	lo, hi := 0, len(a.segs)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		switch {
		case a.segs[m].last.cmp(x) < 0:
			lo = m + 1
		case x.cmp(a.segs[m].first) < 0:
			hi = m
		default:
			return m
		}
	}
	return -1
}

// Allocate gives owner the lowest free address of the pool. It is
// idempotent: if owner already holds an address the pool hands out (the
// lowest, if several), that address is returned again, so a reconcile that
// allocated but failed to record the allocation gets the same address on
// its retry instead of leaking one. An owner holding only addresses the
// pool no longer hands out gets a new one. The error matches ErrExhausted
// when nothing is free.
func (a *Allocator) Allocate(owner string) (netip.Addr, error) {
	if owner == "" {
		return netip.Addr{}, ErrNoOwner
	}
	held, known := a.lowestHeldInPool(owner)
	if held.IsValid() {
		return held, nil
	}
	for i := a.hint; i < len(a.segs); i++ {
		s := &a.segs[i]
		x, ok := s.lowestFree()
		if !ok {
			continue
		}
		a.hint = i
		s.set(x)
		a.inPool = a.inPool.inc()
		addr := x.addr(a.pool.Family)
		a.owners[keyOf(addr)] = owner
		// Owner string hashing is most of an allocation's cost, so the
		// lookup above tells whether owner is new instead of record asking
		// again.
		if known {
			a.extra[owner] = append(a.extra[owner], addr)
		} else {
			a.first[owner] = addr
		}
		return addr, nil
	}
	a.hint = len(a.segs)
	if a.total == (u128{}) {
		return netip.Addr{}, fmt.Errorf("the pool has no address to hand out; add entries to spec.addresses or remove exclusions: %w", ErrExhausted)
	}
	return netip.Addr{}, fmt.Errorf("all %d addresses are allocated; add entries to spec.addresses, remove exclusions or delete unused MachineClaims: %w", a.total.int64Sat(), ErrExhausted)
}

// lowestHeldInPool is the lowest address owner holds that the pool hands
// out, or the zero Addr; known reports whether owner holds any address.
func (a *Allocator) lowestHeldInPool(owner string) (best netip.Addr, known bool) {
	consider := func(x netip.Addr) {
		if a.segmentOf(x) >= 0 && (!best.IsValid() || x.Less(best)) {
			best = x
		}
	}
	h, known := a.first[owner]
	if known {
		consider(h)
		for _, x := range a.extra[owner] {
			consider(x)
		}
	}
	return best, known
}

// AllocateSpecific gives owner the address addr. It is idempotent when
// owner already holds addr; it fails with ErrInUse when another owner holds
// it and with ErrNotInPool when the pool does not hand it out.
func (a *Allocator) AllocateSpecific(owner string, addr netip.Addr) error {
	if owner == "" {
		return ErrNoOwner
	}
	addr = canon(addr)
	if !addr.IsValid() {
		return fmt.Errorf("no address given: %w", ErrNotInPool)
	}
	if h, ok := a.owners[keyOf(addr)]; ok {
		if h == owner {
			return nil
		}
		return fmt.Errorf("%s is held by %s: %w", addr, h, ErrInUse)
	}
	i := a.segmentOf(addr)
	if i < 0 {
		return fmt.Errorf("%s is not handed out by this pool (outside spec.addresses, excluded, a gateway, or a network, broadcast or anycast address): %w", addr, ErrNotInPool)
	}
	a.segs[i].set(toU128(addr))
	a.inPool = a.inPool.inc()
	a.record(owner, addr)
	return nil
}

// Release frees addr if owner holds it. Releasing a free address is a no-op
// (releases are retried). Releasing an address another owner holds fails
// with ErrNotOwner and changes nothing: a stale release from a deleted
// claim must never free the address of the claim that took it next.
func (a *Allocator) Release(owner string, addr netip.Addr) error {
	addr = canon(addr)
	// The zero Addr has the key of "::"; it is never held.
	if !addr.IsValid() {
		return nil
	}
	h, ok := a.owners[keyOf(addr)]
	if !ok {
		return nil
	}
	if h != owner {
		return fmt.Errorf("%s is held by %s, not %s; only its holder releases it: %w", addr, h, owner, ErrNotOwner)
	}
	a.drop(owner, addr)
	return nil
}

// ReleaseOwner frees every address owner holds, in or out of the pool, and
// returns them in address order.
func (a *Allocator) ReleaseOwner(owner string) []netip.Addr {
	held := a.Addresses(owner)
	for _, addr := range held {
		a.drop(owner, addr)
	}
	return held
}

// Owner returns the holder of addr.
func (a *Allocator) Owner(addr netip.Addr) (string, bool) {
	if !addr.IsValid() {
		return "", false
	}
	h, ok := a.owners[keyOf(canon(addr))]
	return h, ok
}

// Addresses returns the addresses owner holds, in address order.
func (a *Allocator) Addresses(owner string) []netip.Addr {
	h, ok := a.first[owner]
	if !ok {
		return nil
	}
	held := append([]netip.Addr{h}, a.extra[owner]...)
	slices.SortFunc(held, netip.Addr.Compare)
	return held
}

// Counts returns the pool's totals for its status.
func (a *Allocator) Counts() Counts {
	return Counts{
		Total:     a.total.int64Sat(),
		Allocated: a.inPool.int64Sat(),
		Free:      a.total.sub(a.inPool).int64Sat(),
		OutOfPool: a.outside,
	}
}

// Allocations returns every held address, in and out of the pool, in
// address order. Rebuild of a fresh allocator from it reproduces this one.
func (a *Allocator) Allocations() []Allocation {
	out := make([]Allocation, 0, len(a.owners))
	for k, owner := range a.owners {
		out = append(out, Allocation{Owner: owner, Address: k.addr()})
	}
	slices.SortFunc(out, func(x, y Allocation) int { return x.Address.Compare(y.Address) })
	return out
}

func (a *Allocator) record(owner string, addr netip.Addr) {
	a.owners[keyOf(addr)] = owner
	if _, ok := a.first[owner]; ok {
		a.extra[owner] = append(a.extra[owner], addr)
	} else {
		a.first[owner] = addr
	}
}

func (a *Allocator) drop(owner string, addr netip.Addr) {
	delete(a.owners, keyOf(addr))
	more := a.extra[owner]
	if a.first[owner] == addr {
		if len(more) == 0 {
			delete(a.first, owner)
		} else {
			a.first[owner] = more[0]
			more = more[1:]
		}
	} else if i := slices.Index(more, addr); i >= 0 {
		more = slices.Delete(more, i, i+1)
	}
	if len(more) == 0 {
		delete(a.extra, owner)
	} else {
		a.extra[owner] = more
	}
	if i := a.segmentOf(addr); i >= 0 {
		a.segs[i].clear(toU128(addr))
		a.inPool = a.inPool.dec()
		a.hint = min(a.hint, i)
	} else {
		a.outside--
	}
}

// ConflictReason says why Rebuild did not take a recorded allocation as is.
type ConflictReason string

const (
	// ConflictDuplicate: another owner records the same address and keeps
	// it (see Rebuild for who wins). The losing claim's VM may be using an
	// address another VM has: the caller must act on it, not ignore it.
	ConflictDuplicate ConflictReason = "DuplicateAddress"
	// ConflictOutsidePool: the address is held but the pool no longer hands
	// it out (spec shrank, an exclusion or gateway was added). It stays
	// reserved to its owner until released.
	ConflictOutsidePool ConflictReason = "OutsidePool"
	// ConflictInvalid: the record has no owner or no valid address; it is
	// ignored.
	ConflictInvalid ConflictReason = "InvalidAllocation"
)

// Conflict is one recorded allocation Rebuild did not take as is.
type Conflict struct {
	Allocation
	Reason ConflictReason
	// Holder is the owner that keeps the address, for ConflictDuplicate.
	Holder string
}

// String describes the conflict for an event or a log line.
func (c Conflict) String() string {
	switch c.Reason {
	case ConflictDuplicate:
		return fmt.Sprintf("%s is recorded by both %s and %s; %s keeps it", c.Address, c.Holder, c.Owner, c.Holder)
	case ConflictOutsidePool:
		return fmt.Sprintf("%s held by %s is no longer in the pool; it stays reserved until released", c.Address, c.Owner)
	default:
		return fmt.Sprintf("allocation of %q to %q is invalid and ignored", c.Address, c.Owner)
	}
}

// Rebuild replaces the allocator's state with the allocations recorded in
// MachineClaims' status, as done after a restart before the first new
// allocation. The result does not depend on the order of allocations.
//
// Nothing is silently merged:
//   - when several owners record one address, the owner that sorts first
//     (byte-wise string order of the owner, a claim UID) keeps it and each
//     other owner is reported as ConflictDuplicate; the rule is arbitrary
//     but stable across restarts, so the same claim wins every time;
//   - an address the pool no longer hands out stays reserved to its owner
//     and is reported as ConflictOutsidePool;
//   - a record without owner or address is reported as ConflictInvalid.
//
// The same owner recording the same address twice is one allocation.
// Conflicts come invalid records first, then by address and owner.
func (a *Allocator) Rebuild(allocations []Allocation) []Conflict {
	a.reset(len(allocations))
	var conflicts []Conflict
	// Sort small pointer-free keys rather than the records themselves:
	// swapping records that hold strings costs GC write barriers, and this
	// sort is most of a rebuild.
	type sortKey struct {
		addr u128 // the address's 16-byte form, IPv4 mapped
		i    int
	}
	keys := make([]sortKey, 0, len(allocations))
	for i, al := range allocations {
		if al.Owner == "" || !al.Address.IsValid() {
			conflicts = append(conflicts, Conflict{Allocation: al, Reason: ConflictInvalid})
			continue
		}
		keys = append(keys, sortKey{addr: toU128(netip.AddrFrom16(keyOf(canon(al.Address)))), i: i})
	}
	// Address order also makes segment updates append-mostly, which keeps
	// the runs of large segments cheap to build.
	slices.SortFunc(keys, func(x, y sortKey) int {
		if c := x.addr.cmp(y.addr); c != 0 {
			return c
		}
		return strings.Compare(allocations[x.i].Owner, allocations[y.i].Owner)
	})
	at := func(k sortKey) Allocation {
		return Allocation{Owner: allocations[k.i].Owner, Address: canon(allocations[k.i].Address)}
	}
	for i := 0; i < len(keys); {
		winner := at(keys[i])
		j := i + 1
		for ; j < len(keys) && keys[j].addr == keys[i].addr; j++ {
			if loser := at(keys[j]); loser.Owner != allocations[keys[j-1].i].Owner {
				conflicts = append(conflicts, Conflict{Allocation: loser, Reason: ConflictDuplicate, Holder: winner.Owner})
			}
		}
		i = j
		if s := a.segmentOf(winner.Address); s >= 0 {
			a.segs[s].set(toU128(winner.Address))
			a.inPool = a.inPool.inc()
		} else {
			a.outside++
			conflicts = append(conflicts, Conflict{Allocation: winner, Reason: ConflictOutsidePool})
		}
		a.record(winner.Owner, winner.Address)
	}
	// Within one address the outside-pool report of the winner was appended
	// after its losers; restore address-then-owner order.
	slices.SortStableFunc(conflicts, func(x, y Conflict) int {
		if (x.Reason == ConflictInvalid) != (y.Reason == ConflictInvalid) {
			if x.Reason == ConflictInvalid {
				return -1
			}
			return 1
		}
		if x.Reason == ConflictInvalid {
			return 0
		}
		if c := x.Address.Compare(y.Address); c != 0 {
			return c
		}
		return strings.Compare(x.Owner, y.Owner)
	})
	return conflicts
}
