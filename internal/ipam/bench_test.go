package ipam

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// uid makes owners shaped like MachineClaim UIDs, so map hashing costs what
// it will in production.
func uid(i int) string { return fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i) }

// BenchmarkAllocateRelease16 measures one Allocate plus one Release on an
// IPv4 /16 (target: < 5 us each, docs/architecture.md, "Performance
// targets"), so ns/op covers both calls.
//   - lowest: 20,000 held with 10,000 holes; the allocation fills the
//     lowest hole and the release reopens it;
//   - churn: 65,000 of 65,533 held; release a random held address, then
//     allocate, which takes exactly that hole, touching a different bitmap
//     word and map bucket each time.
func BenchmarkAllocateRelease16(b *testing.B) {
	benchAllocateRelease(b, Spec{Addresses: []string{"10.0.0.0/16"}, Prefix: 16, Gateways: []string{"10.0.0.1"}})
}

// BenchmarkAllocateRelease64 is the same on an IPv6 /64, whose free space
// is kept as runs of held addresses instead of a bitmap.
func BenchmarkAllocateRelease64(b *testing.B) {
	benchAllocateRelease(b, Spec{Addresses: []string{"2001:db8::/64"}, Prefix: 64, Gateways: []string{"2001:db8::1"}})
}

func benchAllocateRelease(b *testing.B, spec Spec) {
	b.Run("lowest", func(b *testing.B) {
		a := NewAllocator(mustPool(b, spec))
		for i := range 30000 {
			addr, err := a.Allocate(uid(i))
			if err != nil {
				b.Fatal(err)
			}
			if i%3 == 0 {
				if err := a.Release(uid(i), addr); err != nil {
					b.Fatal(err)
				}
			}
		}
		owner := uid(1 << 30)
		start := cpuStart()
		for b.Loop() {
			addr, err := a.Allocate(owner)
			if err != nil {
				b.Fatal(err)
			}
			if err := a.Release(owner, addr); err != nil {
				b.Fatal(err)
			}
		}
		start.report(b)
	})
	b.Run("churn", func(b *testing.B) {
		a := NewAllocator(mustPool(b, spec))
		const held = 65000
		addrs, owners := make([]netip.Addr, held), make([]string, held)
		for i := range held {
			owners[i] = uid(i)
			var err error
			if addrs[i], err = a.Allocate(owners[i]); err != nil {
				b.Fatal(err)
			}
		}
		// Each hole goes to a new owner; the names are made up front so
		// that formatting them is not measured.
		spare := make([]string, held)
		for i := range spare {
			spare[i] = uid(held + i)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		start := cpuStart()
		for b.Loop() {
			k := rng.IntN(held)
			if err := a.Release(owners[k], addrs[k]); err != nil {
				b.Fatal(err)
			}
			owners[k], spare[k] = spare[k], owners[k]
			addr, err := a.Allocate(owners[k])
			if err != nil || addr != addrs[k] {
				b.Fatalf("Allocate = %v, %v; want the hole %v", addr, err, addrs[k])
			}
		}
		start.report(b)
	})
}

// records returns n distinct random addresses of pool with UID owners, in
// random order, as Rebuild receives them from a list of MachineClaims.
func records(b *testing.B, spec Spec, n int) []Allocation {
	p := mustPool(b, spec)
	rng := rand.New(rand.NewPCG(5, 6))
	seen := map[netip.Addr]bool{}
	first := p.Allocatable[0].First
	out := make([]Allocation, 0, n)
	for len(out) < n {
		addr := toU128(first).add(u128{lo: uint64(rng.IntN(60000))}).addr(p.Family)
		if !p.Contains(addr) || seen[addr] {
			continue
		}
		seen[addr] = true
		out = append(out, Allocation{Owner: uid(len(out)), Address: addr})
	}
	return out
}

// BenchmarkRebuild10000 measures rebuilding a /16 from 10,000 recorded
// allocations (target: < 100 ms, docs/architecture.md, "Performance
// targets"). from-status also parses the
// addresses as MachineClaim status stores them ("10.0.12.34/16").
func BenchmarkRebuild10000(b *testing.B) {
	spec := Spec{Addresses: []string{"10.0.0.0/16"}, Prefix: 16, Gateways: []string{"10.0.0.1"}}
	recs := records(b, spec, 10000)
	b.Run("parsed", func(b *testing.B) {
		a := NewAllocator(mustPool(b, spec))
		start := cpuStart()
		for b.Loop() {
			if conflicts := a.Rebuild(recs); len(conflicts) != 0 {
				b.Fatal(conflicts)
			}
		}
		start.report(b)
	})
	b.Run("from-status", func(b *testing.B) {
		pool := mustPool(b, spec)
		status := make([]string, len(recs))
		for i, r := range recs {
			status[i] = pool.WithPrefix(r.Address).String()
		}
		a := NewAllocator(pool)
		buf := make([]Allocation, len(recs))
		start := cpuStart()
		for b.Loop() {
			for i, s := range status {
				addr, err := ParseAllocatedAddress(s)
				if err != nil {
					b.Fatal(err)
				}
				buf[i] = Allocation{Owner: recs[i].Owner, Address: addr}
			}
			if conflicts := a.Rebuild(buf); len(conflicts) != 0 {
				b.Fatal(conflicts)
			}
		}
		start.report(b)
	})
	b.Run("ipv6-64", func(b *testing.B) {
		v6 := Spec{Addresses: []string{"2001:db8::/64"}, Prefix: 64}
		recs := records(b, v6, 10000)
		a := NewAllocator(mustPool(b, v6))
		start := cpuStart()
		for b.Loop() {
			if conflicts := a.Rebuild(recs); len(conflicts) != 0 {
				b.Fatal(conflicts)
			}
		}
		start.report(b)
	})
}
