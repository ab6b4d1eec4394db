package ipam

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"testing"
)

// ip keeps address literals in tables short.
var ip = netip.MustParseAddr

func TestAllocateLowestFirst(t *testing.T) {
	a := NewAllocator(mustPool(t, Spec{Addresses: []string{"10.0.0.0/29"}, Prefix: 29, Gateways: []string{"10.0.0.1"}}))
	// .0 network, .1 gateway, .7 broadcast: .2 to .6 remain.
	var got []string
	for i := range 5 {
		addr, err := a.Allocate(fmt.Sprintf("claim-%d", i))
		if err != nil {
			t.Fatalf("Allocate #%d: %v", i, err)
		}
		got = append(got, addr.String())
	}
	if want := []string{"10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"}; !slices.Equal(got, want) {
		t.Fatalf("allocated %q, want %q", got, want)
	}
	_, err := a.Allocate("claim-5")
	if !errors.Is(err, ErrExhausted) {
		t.Fatalf("Allocate on a full pool: %v, want ErrExhausted", err)
	}
	if want := "all 5 addresses are allocated; add entries to spec.addresses, remove exclusions or delete unused MachineClaims: IP pool exhausted"; err.Error() != want {
		t.Errorf("error\n got: %s\nwant: %s", err, want)
	}
	if err := a.Release("claim-2", ip("10.0.0.4")); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := a.Release("claim-0", ip("10.0.0.2")); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// The lowest hole is filled first, whatever the release order.
	for _, want := range []string{"10.0.0.2", "10.0.0.4"} {
		if addr, err := a.Allocate("claim-" + want); err != nil || addr != ip(want) {
			t.Errorf("Allocate = %v, %v; want %s", addr, err, want)
		}
	}
	if c := a.Counts(); c != (Counts{Total: 5, Allocated: 5, Free: 0}) {
		t.Errorf("Counts = %+v", c)
	}
}

func TestAllocateAcrossEntriesAndExclusions(t *testing.T) {
	a := NewAllocator(mustPool(t, Spec{
		Addresses:         []string{"192.168.1.100/32", "192.168.1.10-192.168.1.13", "192.168.1.20/30"},
		ExcludedAddresses: []string{"192.168.1.11/32"},
		Prefix:            24,
		Gateways:          []string{"192.168.1.12"},
	}))
	// 192.168.1.11 excluded, .12 the gateway, .20 and .23 the /30's network
	// and broadcast.
	want := []string{"192.168.1.10", "192.168.1.13", "192.168.1.21", "192.168.1.22", "192.168.1.100"}
	for i, w := range want {
		addr, err := a.Allocate(fmt.Sprint(i))
		if err != nil || addr != ip(w) {
			t.Fatalf("Allocate #%d = %v, %v; want %s", i, addr, err, w)
		}
	}
	if _, err := a.Allocate("x"); !errors.Is(err, ErrExhausted) {
		t.Errorf("Allocate after %d: %v, want ErrExhausted", len(want), err)
	}
}

func TestAllocateIsIdempotentPerOwner(t *testing.T) {
	a := NewAllocator(mustPool(t, Spec{Addresses: []string{"10.0.0.0/24"}, Prefix: 24}))
	first, err := a.Allocate("uid-a")
	if err != nil {
		t.Fatal(err)
	}
	again, err := a.Allocate("uid-a")
	if err != nil || again != first {
		t.Fatalf("second Allocate = %v, %v; want %v again", again, err, first)
	}
	if c := a.Counts(); c.Allocated != 1 {
		t.Errorf("Allocated = %d after two calls by one owner, want 1", c.Allocated)
	}
	if _, err := a.Allocate(""); !errors.Is(err, ErrNoOwner) {
		t.Errorf("Allocate(\"\") = %v, want ErrNoOwner", err)
	}
	if err := a.AllocateSpecific("", ip("10.0.0.9")); !errors.Is(err, ErrNoOwner) {
		t.Errorf("AllocateSpecific(\"\") = %v, want ErrNoOwner", err)
	}
}

func TestAllocateSpecific(t *testing.T) {
	a := NewAllocator(mustPool(t, Spec{
		Addresses: []string{"10.0.0.0/24"}, ExcludedAddresses: []string{"10.0.0.50-10.0.0.59"}, Prefix: 24, Gateways: []string{"10.0.0.1"},
	}))
	if err := a.AllocateSpecific("uid-a", ip("10.0.0.7")); err != nil {
		t.Fatalf("AllocateSpecific: %v", err)
	}
	if err := a.AllocateSpecific("uid-a", ip("10.0.0.7")); err != nil {
		t.Errorf("AllocateSpecific by the holder again: %v, want nil", err)
	}
	err := a.AllocateSpecific("uid-b", ip("10.0.0.7"))
	if !errors.Is(err, ErrInUse) || err.Error() != "10.0.0.7 is held by uid-a: address held by another owner" {
		t.Errorf("AllocateSpecific of a held address: %v", err)
	}
	// The IPv4-mapped spelling is the same address.
	if err := a.AllocateSpecific("uid-b", ip("::ffff:10.0.0.7")); !errors.Is(err, ErrInUse) {
		t.Errorf("AllocateSpecific of the mapped form of a held address: %v, want ErrInUse", err)
	}
	for _, s := range []string{"10.0.0.0", "10.0.0.1", "10.0.0.55", "10.0.0.255", "10.0.1.7", "2001:db8::7"} {
		err := a.AllocateSpecific("uid-b", ip(s))
		if !errors.Is(err, ErrNotInPool) {
			t.Errorf("AllocateSpecific(%s) = %v, want ErrNotInPool", s, err)
		}
	}
	if _, err := a.Allocate("uid-c"); err != nil {
		t.Fatal(err)
	}
	if got, _ := a.Owner(ip("10.0.0.2")); got != "uid-c" {
		t.Errorf("Owner(10.0.0.2) = %q, want uid-c (lowest free)", got)
	}
	if c := a.Counts(); c != (Counts{Total: 243, Allocated: 2, Free: 241}) {
		t.Errorf("Counts = %+v", c)
	}
}

func TestRelease(t *testing.T) {
	a := NewAllocator(mustPool(t, Spec{Addresses: []string{"10.0.0.0/24"}, Prefix: 24}))
	addr, _ := a.Allocate("uid-a")
	err := a.Release("uid-b", addr)
	if !errors.Is(err, ErrNotOwner) {
		t.Fatalf("Release by another owner: %v, want ErrNotOwner", err)
	}
	if want := "10.0.0.1 is held by uid-a, not uid-b; only its holder releases it: address held by another owner, not released"; err.Error() != want {
		t.Errorf("error\n got: %s\nwant: %s", err, want)
	}
	if owner, ok := a.Owner(addr); !ok || owner != "uid-a" {
		t.Fatalf("after a refused release Owner = %q, %v; want uid-a", owner, ok)
	}
	if err := a.Release("uid-a", addr); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, ok := a.Owner(addr); ok {
		t.Errorf("%v still has an owner after release", addr)
	}
	if err := a.Release("uid-a", addr); err != nil {
		t.Errorf("second Release: %v, want nil", err)
	}
	if c := a.Counts(); c.Allocated != 0 || c.Free != c.Total {
		t.Errorf("Counts after release = %+v", c)
	}
}

func TestReleaseOwner(t *testing.T) {
	a := NewAllocator(mustPool(t, Spec{Addresses: []string{"10.0.0.0/24"}, Prefix: 24}))
	for _, s := range []string{"10.0.0.9", "10.0.0.3", "10.0.0.5"} {
		if err := a.AllocateSpecific("uid-a", ip(s)); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := a.Allocate("uid-b")
	if got := a.Addresses("uid-a"); !slices.Equal(got, []netip.Addr{ip("10.0.0.3"), ip("10.0.0.5"), ip("10.0.0.9")}) {
		t.Errorf("Addresses(uid-a) = %v", got)
	}
	// An owner holding several addresses gets its lowest back from Allocate.
	if got, _ := a.Allocate("uid-a"); got != ip("10.0.0.3") {
		t.Errorf("Allocate(uid-a) = %v, want 10.0.0.3", got)
	}
	released := a.ReleaseOwner("uid-a")
	if !slices.Equal(released, []netip.Addr{ip("10.0.0.3"), ip("10.0.0.5"), ip("10.0.0.9")}) {
		t.Errorf("ReleaseOwner = %v", released)
	}
	if got := a.Allocations(); !slices.Equal(got, []Allocation{{Owner: "uid-b", Address: b}}) {
		t.Errorf("Allocations after ReleaseOwner = %v", got)
	}
	if got := a.ReleaseOwner("nobody"); len(got) != 0 {
		t.Errorf("ReleaseOwner(nobody) = %v", got)
	}
}

func TestIPv6Slash64(t *testing.T) {
	a := NewAllocator(mustPool(t, Spec{
		Addresses: []string{"2001:db8::/64"}, ExcludedAddresses: []string{"2001:db8::10-2001:db8::1f"}, Prefix: 64, Gateways: []string{"2001:db8::1"},
	}))
	// ::2-::f is small enough for a bitmap; ::20 to the end is not.
	if len(a.segs) != 2 || a.segs[0].bits == nil || a.segs[1].bits != nil {
		t.Fatalf("segments of the /64: %+v", a.segs)
	}
	var addrs []netip.Addr
	for i := range 2000 {
		addr, err := a.Allocate(fmt.Sprint("uid-", i))
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, addr)
	}
	if addrs[0] != ip("2001:db8::2") || addrs[13] != ip("2001:db8::f") || addrs[14] != ip("2001:db8::20") {
		t.Errorf("first addresses %v, want ::2..::f then ::20 (gateway, anycast and exclusion skipped)", addrs[:16])
	}
	if c := a.Counts(); c != (Counts{Total: math.MaxInt64, Allocated: 2000, Free: math.MaxInt64}) {
		t.Errorf("Counts = %+v", c)
	}
	if n := len(a.segs[1].runs.runs); n != 1 {
		t.Errorf("2000 lowest-first allocations make %d runs, want 1", n)
	}
	// Punch holes; they come back lowest first.
	for _, i := range []int{1500, 3, 700} {
		if err := a.Release(fmt.Sprint("uid-", i), addrs[i]); err != nil {
			t.Fatal(err)
		}
	}
	for _, i := range []int{3, 700, 1500} {
		if got, err := a.Allocate(fmt.Sprint("new-", i)); err != nil || got != addrs[i] {
			t.Errorf("Allocate = %v, %v; want %v", got, err, addrs[i])
		}
	}
	if got, _ := a.Allocate("next"); got != addrs[len(addrs)-1].Next() {
		t.Errorf("Allocate after refilling = %v, want %v", got, addrs[len(addrs)-1].Next())
	}
}

func TestCountsSmallIPv6(t *testing.T) {
	a := NewAllocator(mustPool(t, Spec{Addresses: []string{"2001:db8::/120"}, Prefix: 64}))
	// 256 addresses minus the /120's subnet-router anycast address, which is
	// also the /64's.
	if c := a.Counts(); c != (Counts{Total: 255, Free: 255}) {
		t.Errorf("Counts = %+v", c)
	}
}

func TestBitmap(t *testing.T) {
	for _, n := range []uint64{1, 63, 64, 65, 4095, 4096, 4097, 65536} {
		b := newBitmap(n)
		for i := range n {
			got, ok := b.firstClear()
			if !ok || got != i {
				t.Fatalf("n=%d: firstClear = %d, %v; want %d", n, got, ok, i)
			}
			b.set(i)
		}
		if got, ok := b.firstClear(); ok {
			t.Fatalf("n=%d: full bitmap reports %d free", n, got)
		}
		b.clear(n - 1)
		b.clear(n / 2)
		if got, ok := b.firstClear(); !ok || got != n/2 {
			t.Errorf("n=%d: firstClear = %d, %v; want %d", n, got, ok, n/2)
		}
	}
}

func TestRunSet(t *testing.T) {
	var rs runSet
	first, last := u128{lo: 100}, u128{lo: 200}
	for _, x := range []uint64{100, 102, 101, 104, 105, 103, 150} {
		rs.add(u128{lo: x})
	}
	want := []run{{u128{lo: 100}, u128{lo: 105}}, {u128{lo: 150}, u128{lo: 150}}}
	if !slices.Equal(rs.runs, want) {
		t.Fatalf("runs = %v, want %v", rs.runs, want)
	}
	if got, ok := rs.lowestFree(first, last); !ok || got != (u128{lo: 106}) {
		t.Errorf("lowestFree = %v, %v; want 106", got, ok)
	}
	rs.remove(u128{lo: 102}) // split
	rs.remove(u128{lo: 100}) // trim front
	rs.remove(u128{lo: 105}) // trim back
	rs.remove(u128{lo: 150}) // delete
	want = []run{{u128{lo: 101}, u128{lo: 101}}, {u128{lo: 103}, u128{lo: 104}}}
	if !slices.Equal(rs.runs, want) {
		t.Fatalf("runs = %v, want %v", rs.runs, want)
	}
	if got, ok := rs.lowestFree(first, last); !ok || got != first {
		t.Errorf("lowestFree = %v, %v; want 100", got, ok)
	}
	full := runSet{runs: []run{{first, last}}}
	if _, ok := full.lowestFree(first, last); ok {
		t.Error("a run covering the segment leaves a free address")
	}
}

func TestEmptyPoolAndZeroAddr(t *testing.T) {
	a := NewAllocator(mustPool(t, Spec{Addresses: []string{"10.0.0.1/32"}, Prefix: 24, Gateways: []string{"10.0.0.1"}}))
	_, err := a.Allocate("uid-a")
	if want := "the pool has no address to hand out; add entries to spec.addresses or remove exclusions: IP pool exhausted"; !errors.Is(err, ErrExhausted) || err.Error() != want {
		t.Errorf("Allocate from an empty pool: %v", err)
	}

	// The zero Addr must not alias "::", whose map key is also all zeros.
	v6 := NewAllocator(mustPool(t, Spec{Addresses: []string{"2001:db8::/64"}, Prefix: 64}))
	if conflicts := v6.Rebuild([]Allocation{{Owner: "uid-z", Address: ip("::")}}); len(conflicts) != 1 || conflicts[0].Reason != ConflictOutsidePool {
		t.Fatalf("Rebuild with :: = %v", conflicts)
	}
	if owner, ok := v6.Owner(netip.Addr{}); ok {
		t.Errorf("Owner(zero Addr) = %q", owner)
	}
	if err := v6.AllocateSpecific("uid-y", netip.Addr{}); !errors.Is(err, ErrNotInPool) {
		t.Errorf("AllocateSpecific(zero Addr) = %v, want ErrNotInPool", err)
	}
	if err := v6.Release("uid-y", netip.Addr{}); err != nil {
		t.Errorf("Release(zero Addr) = %v", err)
	}
	if owner, ok := v6.Owner(ip("::")); !ok || owner != "uid-z" {
		t.Errorf("Owner(::) = %q, %v; want uid-z", owner, ok)
	}
}
