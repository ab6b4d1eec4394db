package ipam

import (
	"fmt"
	"math/big"
	mrand "math/rand"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"testing/quick"
)

// model is a deliberately naive allocator: a map of holders and a
// hand-written notion of which addresses a spec allows, derived from the
// spec and not from Pool.Allocatable, so that a mistake there shows up as a
// disagreement.
type model struct {
	spec     Spec
	entries  []Range
	excluded []Range
	gateways []netip.Addr
	network  netip.Prefix
	holders  map[netip.Addr]string
}

func newModel(t *testing.T, spec Spec) *model {
	m := &model{spec: spec, holders: map[netip.Addr]string{}}
	for _, s := range spec.Addresses {
		m.entries = append(m.entries, mustRange(t, s))
	}
	slices.SortFunc(m.entries, func(a, b Range) int { return a.First.Compare(b.First) })
	for _, s := range spec.ExcludedAddresses {
		m.excluded = append(m.excluded, mustRange(t, s))
	}
	for _, s := range spec.Gateways {
		m.gateways = append(m.gateways, netip.MustParseAddr(s))
	}
	m.network = netip.PrefixFrom(m.entries[0].First, int(spec.Prefix)).Masked()
	return m
}

// reservedBy reports whether a is the network or broadcast address of an
// IPv4 prefix shorter than /31, or the anycast address of an IPv6 prefix
// shorter than /127.
func reservedBy(p netip.Prefix, a netip.Addr) bool {
	if a.Is4() {
		return p.Bits() < 31 && (a == p.Masked().Addr() || a == lastOf(p))
	}
	return p.Bits() < 127 && a == p.Masked().Addr()
}

// excludedOrSpecial is every reason an address inside an entry is not
// handed out.
func (m *model) excludedOrSpecial(a netip.Addr) bool {
	for _, x := range m.excluded {
		if x.Contains(a) {
			return true
		}
	}
	if slices.Contains(m.gateways, a) || reservedBy(m.network, a) {
		return true
	}
	for _, e := range m.entries {
		if e.Prefix.IsValid() && reservedBy(e.Prefix, a) {
			return true
		}
	}
	return false
}

func (m *model) allowed(a netip.Addr) bool {
	return slices.ContainsFunc(m.entries, func(e Range) bool { return e.Contains(a) }) && !m.excludedOrSpecial(a)
}

// lowestFree walks each entry from its start; holders and exclusions in
// the tests are few, so the walk is short even in a /64.
func (m *model) lowestFree() (netip.Addr, bool) {
	for _, e := range m.entries {
		for a := e.First; a.IsValid() && e.Contains(a); a = a.Next() {
			if _, held := m.holders[a]; !held && m.allowed(a) {
				return a, true
			}
		}
	}
	return netip.Addr{}, false
}

func (m *model) held(owner string) []netip.Addr {
	var out []netip.Addr
	for a, o := range m.holders {
		if o == owner {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

func (m *model) allocations() []Allocation {
	var out []Allocation
	for a, o := range m.holders {
		out = append(out, Allocation{Owner: o, Address: a})
	}
	slices.SortFunc(out, func(x, y Allocation) int { return x.Address.Compare(y.Address) })
	return out
}

// randomAddr picks a candidate for AllocateSpecific: often a held address,
// often one near an entry's start (where exclusions, gateways and network
// addresses sit), sometimes one just outside an entry.
func (m *model) randomAddr(rng *rand.Rand) netip.Addr {
	if len(m.holders) > 0 && rng.IntN(3) == 0 {
		all := m.allocations()
		return all[rng.IntN(len(all))].Address
	}
	e := m.entries[rng.IntN(len(m.entries))]
	switch rng.IntN(4) {
	case 0:
		return e.First.Prev()
	case 1:
		return e.Last.Next()
	default:
		a := e.First
		for range rng.IntN(300) {
			if !e.Contains(a.Next()) {
				break
			}
			a = a.Next()
		}
		return a
	}
}

var propertyPools = []struct {
	name string
	spec Spec
	// total is the exact Counts().Total; -1 for pools too large to count
	// by walking.
	total int64
}{
	{"IPv4 /24 bitmap", Spec{Addresses: []string{"10.0.0.0/24"}, ExcludedAddresses: []string{"10.0.0.100-10.0.0.120"}, Prefix: 24, Gateways: []string{"10.0.0.1"}}, -1},
	{"IPv4 /28 exhausts", Spec{Addresses: []string{"10.0.0.0/28"}, Prefix: 28, Gateways: []string{"10.0.0.1"}}, -1},
	{"IPv4 entries of every form", Spec{
		Addresses:         []string{"10.0.0.200/32", "10.0.0.100-10.0.0.140", "10.0.0.0/26", "10.0.0.64/31"},
		ExcludedAddresses: []string{"10.0.0.10/31", "10.0.0.130-10.0.0.135", "10.0.0.0/30"},
		Prefix:            24, Gateways: []string{"10.0.0.101", "10.0.0.200"},
	}, -1},
	{"IPv4 /11 runs", Spec{Addresses: []string{"10.0.0.0/11"}, ExcludedAddresses: []string{"10.0.0.5/32", "10.0.0.40-10.0.0.60"}, Prefix: 11, Gateways: []string{"10.0.0.1"}}, 1<<21 - 2 - 1 - 1 - 21},
	{"IPv6 /64 runs", Spec{Addresses: []string{"2001:db8::/64"}, ExcludedAddresses: []string{"2001:db8::10-2001:db8::20"}, Prefix: 64, Gateways: []string{"2001:db8::1"}}, 1<<63 - 1},
	{"IPv6 small pieces", Spec{Addresses: []string{"2001:db8::/124", "2001:db8::100-2001:db8::104", "2001:db8::ffff/128"}, Prefix: 64, Gateways: []string{"2001:db8::2"}}, -1},
}

// TestAllocatorProperties runs random operations against the allocator and
// the model, and checks after each step:
//   - Allocate returns the model's lowest free address, never one held by
//     someone else, never an excluded, gateway, network, broadcast or
//     anycast address;
//   - allocate then release returns to the same counts and allocations;
//   - counts agree with the model;
//   - a fresh allocator rebuilt from Allocations() (shuffled) equals the
//     original, and the test carries on with the rebuilt one.
func TestAllocatorProperties(t *testing.T) {
	for pi, pc := range propertyPools {
		t.Run(pc.name, func(t *testing.T) {
			pool := mustPool(t, pc.spec)
			m := newModel(t, pc.spec)
			a := NewAllocator(pool)
			rng := rand.New(rand.NewPCG(uint64(pi), 20261121))
			total := pc.total
			if total < 0 {
				total = 0
				for _, e := range m.entries {
					for x := e.First; x.IsValid() && e.Contains(x); x = x.Next() {
						if m.allowed(x) {
							total++
						}
					}
				}
			}
			owners := func() string { return fmt.Sprintf("uid-%03d", rng.IntN(400)) }

			for step := range 3000 {
				op := rng.IntN(100)
				switch {
				case op < 40: // Allocate
					owner := owners()
					got, err := a.Allocate(owner)
					var want netip.Addr
					ok := true
					if held := m.held(owner); slices.ContainsFunc(held, m.allowed) {
						want = held[slices.IndexFunc(held, m.allowed)]
					} else {
						want, ok = m.lowestFree()
					}
					if !ok {
						if err == nil {
							t.Fatalf("step %d: Allocate(%s) = %v on a full pool", step, owner, got)
						}
						break
					}
					if err != nil || got != want {
						t.Fatalf("step %d: Allocate(%s) = %v, %v; want %v", step, owner, got, err, want)
					}
					if h, held := m.holders[got]; held && h != owner {
						t.Fatalf("step %d: %v handed to %s while %s holds it", step, got, owner, h)
					}
					if m.excludedOrSpecial(got) {
						t.Fatalf("step %d: handed out excluded or reserved %v", step, got)
					}
					m.holders[got] = owner
				case op < 50: // AllocateSpecific
					owner, addr := owners(), m.randomAddr(rng)
					err := a.AllocateSpecific(owner, addr)
					h, held := m.holders[addr]
					switch {
					case held && h == owner:
						if err != nil {
							t.Fatalf("step %d: AllocateSpecific(%s, %v) by its holder: %v", step, owner, addr, err)
						}
					case held:
						if err == nil {
							t.Fatalf("step %d: AllocateSpecific(%s, %v) took it from %s", step, owner, addr, h)
						}
					case !m.allowed(addr):
						if err == nil {
							t.Fatalf("step %d: AllocateSpecific(%s, %v) handed out a disallowed address", step, owner, addr)
						}
					default:
						if err != nil {
							t.Fatalf("step %d: AllocateSpecific(%s, %v): %v", step, owner, addr, err)
						}
						m.holders[addr] = owner
					}
				case op < 80: // Release, sometimes by the wrong owner
					if len(m.holders) == 0 {
						break
					}
					all := m.allocations()
					al := all[rng.IntN(len(all))]
					owner := al.Owner
					if rng.IntN(5) == 0 {
						owner = owners()
					}
					err := a.Release(owner, al.Address)
					if owner == al.Owner {
						if err != nil {
							t.Fatalf("step %d: Release(%s, %v): %v", step, owner, al.Address, err)
						}
						delete(m.holders, al.Address)
					} else if err == nil {
						t.Fatalf("step %d: Release(%s, %v) freed %s's address", step, owner, al.Address, al.Owner)
					}
				case op < 85: // ReleaseOwner
					owner := owners()
					want := m.held(owner)
					if got := a.ReleaseOwner(owner); !slices.Equal(got, want) {
						t.Fatalf("step %d: ReleaseOwner(%s) = %v, want %v", step, owner, got, want)
					}
					for _, x := range want {
						delete(m.holders, x)
					}
				case op < 95: // allocate + release is a no-op
					before, beforeAllocs := a.Counts(), a.Allocations()
					got, err := a.Allocate("transient")
					if err == nil {
						if err := a.Release("transient", got); err != nil {
							t.Fatalf("step %d: Release(transient): %v", step, err)
						}
					}
					if after := a.Counts(); after != before || !slices.Equal(a.Allocations(), beforeAllocs) {
						t.Fatalf("step %d: allocate+release changed the state: %+v -> %+v", step, before, after)
					}
				default: // rebuild from the recorded allocations
					recorded := a.Allocations()
					rng.Shuffle(len(recorded), func(i, j int) { recorded[i], recorded[j] = recorded[j], recorded[i] })
					b := NewAllocator(pool)
					if conflicts := b.Rebuild(recorded); len(conflicts) != 0 {
						t.Fatalf("step %d: rebuild of a consistent state reported %v", step, conflicts)
					}
					if !slices.Equal(b.Allocations(), a.Allocations()) || b.Counts() != a.Counts() {
						t.Fatalf("step %d: rebuilt state differs: %+v vs %+v", step, b.Counts(), a.Counts())
					}
					a = b
				}

				c := a.Counts()
				n := int64(len(m.holders))
				if c.Allocated != n || c.Total != total || c.OutOfPool != 0 || (total < 1<<62 && c.Free != total-n) {
					t.Fatalf("step %d: Counts = %+v, want %d of %d allocated", step, c, n, total)
				}
				if step%100 == 0 && !slices.Equal(a.Allocations(), m.allocations()) {
					t.Fatalf("step %d: allocations differ from the model", step)
				}
			}
		})
	}
}

// TestU128 checks the 128-bit helpers against math/big.
func TestU128(t *testing.T) {
	two128 := new(big.Int).Lsh(big.NewInt(1), 128)
	toBig := func(u u128) *big.Int {
		return new(big.Int).Or(new(big.Int).Lsh(new(big.Int).SetUint64(u.hi), 64), new(big.Int).SetUint64(u.lo))
	}
	mod := func(b *big.Int) *big.Int { return new(big.Int).Mod(b, two128) }
	maxBig := new(big.Int).Sub(two128, big.NewInt(1))
	prop := func(ah, al, bh, bl uint64) bool {
		x, y := u128{ah, al}, u128{bh, bl}
		bx, by := toBig(x), toBig(y)
		sat := new(big.Int).Add(bx, by)
		if sat.Cmp(maxBig) > 0 {
			sat = maxBig
		}
		return x.cmp(y) == bx.Cmp(by) &&
			toBig(x.add(y)).Cmp(mod(new(big.Int).Add(bx, by))) == 0 &&
			toBig(x.sub(y)).Cmp(mod(new(big.Int).Sub(bx, by))) == 0 &&
			toBig(x.addSat(y)).Cmp(sat) == 0
	}
	if err := quick.Check(prop, &quick.Config{MaxCount: 5000, Rand: mrand.New(mrand.NewSource(1))}); err != nil {
		t.Error(err)
	}
	// Edge values quick.Check rarely draws.
	for _, v := range [][4]uint64{{0, 0, 0, 0}, {0, ^uint64(0), 0, 1}, {^uint64(0), ^uint64(0), 0, 1}, {1, 0, 0, 1}} {
		if !prop(v[0], v[1], v[2], v[3]) {
			t.Errorf("u128 arithmetic wrong for %v", v)
		}
	}
	roundTrip := func(b [16]byte, four bool) bool {
		if four {
			a := netip.AddrFrom4([4]byte(b[:4]))
			return toU128(a).addr(IPv4) == a
		}
		a := netip.AddrFrom16(b)
		return toU128(a).addr(IPv6) == a
	}
	if err := quick.Check(roundTrip, &quick.Config{Rand: mrand.New(mrand.NewSource(2))}); err != nil {
		t.Error(err)
	}
	if got := rangeSize(u128{}, maxU128); got != maxU128 {
		t.Errorf("rangeSize of everything = %v, want saturation", got)
	}
	if got := (u128{hi: 1}).int64Sat(); got != 1<<63-1 {
		t.Errorf("int64Sat(2^64) = %d", got)
	}
}
