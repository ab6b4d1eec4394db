package ipam

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestRebuildDuplicates(t *testing.T) {
	a := NewAllocator(mustPool(t, Spec{Addresses: []string{"10.0.0.0/24"}, Prefix: 24, Gateways: []string{"10.0.0.1"}}))
	conflicts := a.Rebuild([]Allocation{
		{Owner: "uid-c", Address: ip("10.0.0.5")},
		{Owner: "uid-a", Address: ip("10.0.0.5")},
		{Owner: "", Address: ip("10.0.0.7")},
		{Owner: "uid-d", Address: ip("10.0.0.6")},
		{Owner: "uid-b", Address: ip("10.0.0.5")},
		{Owner: "uid-d", Address: ip("10.0.0.6")}, // recorded twice by one owner: one allocation
		{Owner: "uid-e"},
	})
	want := []Conflict{
		{Allocation: Allocation{Owner: "", Address: ip("10.0.0.7")}, Reason: ConflictInvalid},
		{Allocation: Allocation{Owner: "uid-e"}, Reason: ConflictInvalid},
		{Allocation: Allocation{Owner: "uid-b", Address: ip("10.0.0.5")}, Reason: ConflictDuplicate, Holder: "uid-a"},
		{Allocation: Allocation{Owner: "uid-c", Address: ip("10.0.0.5")}, Reason: ConflictDuplicate, Holder: "uid-a"},
	}
	if !slices.Equal(conflicts, want) {
		t.Fatalf("conflicts\n got: %+v\nwant: %+v", conflicts, want)
	}
	if got := conflicts[2].String(); got != "10.0.0.5 is recorded by both uid-a and uid-b; uid-a keeps it" {
		t.Errorf("String() = %q", got)
	}
	if got := conflicts[0].String(); got != `allocation of "10.0.0.7" to "" is invalid and ignored` {
		t.Errorf("String() = %q", got)
	}
	if owner, _ := a.Owner(ip("10.0.0.5")); owner != "uid-a" {
		t.Errorf("Owner(10.0.0.5) = %q, want uid-a (first in owner order)", owner)
	}
	wantAllocs := []Allocation{{Owner: "uid-a", Address: ip("10.0.0.5")}, {Owner: "uid-d", Address: ip("10.0.0.6")}}
	if got := a.Allocations(); !slices.Equal(got, wantAllocs) {
		t.Errorf("Allocations = %v, want %v", got, wantAllocs)
	}
	// The losers' claims still believe they hold the address: their stale
	// releases must not free it.
	if err := a.Release("uid-c", ip("10.0.0.5")); !errors.Is(err, ErrNotOwner) {
		t.Errorf("Release by a losing owner: %v, want ErrNotOwner", err)
	}
	if got, _ := a.Allocate("uid-f"); got != ip("10.0.0.2") {
		t.Errorf("Allocate after rebuild = %v, want 10.0.0.2", got)
	}
}

func TestRebuildKeepsAddressesOutsideThePool(t *testing.T) {
	// The pool shrank from 10.0.0.0/23 with gateway 10.0.1.254 to
	// 10.0.0.0/24 with gateway 10.0.0.1; claims still hold what they had.
	a := NewAllocator(mustPool(t, Spec{Addresses: []string{"10.0.0.0/24"}, Prefix: 24, Gateways: []string{"10.0.0.1"}}))
	conflicts := a.Rebuild([]Allocation{
		{Owner: "uid-v6", Address: ip("2001:db8::1")},
		{Owner: "uid-out", Address: ip("10.0.1.5")},
		{Owner: "uid-in", Address: ip("10.0.0.5")},
		{Owner: "uid-gw", Address: ip("10.0.0.1")},
		{Owner: "uid-mapped", Address: ip("::ffff:10.0.0.9")},
	})
	want := []Conflict{
		{Allocation: Allocation{Owner: "uid-gw", Address: ip("10.0.0.1")}, Reason: ConflictOutsidePool},
		{Allocation: Allocation{Owner: "uid-out", Address: ip("10.0.1.5")}, Reason: ConflictOutsidePool},
		{Allocation: Allocation{Owner: "uid-v6", Address: ip("2001:db8::1")}, Reason: ConflictOutsidePool},
	}
	if !slices.Equal(conflicts, want) {
		t.Fatalf("conflicts\n got: %+v\nwant: %+v", conflicts, want)
	}
	if got := conflicts[1].String(); got != "10.0.1.5 held by uid-out is no longer in the pool; it stays reserved until released" {
		t.Errorf("String() = %q", got)
	}
	if c := a.Counts(); c != (Counts{Total: 253, Allocated: 2, Free: 251, OutOfPool: 3}) {
		t.Errorf("Counts = %+v", c)
	}
	if owner, _ := a.Owner(ip("10.0.0.9")); owner != "uid-mapped" {
		t.Errorf("the IPv4-mapped record was not stored as its IPv4 address (owner %q)", owner)
	}
	// Reserved: nobody else gets it, even by name.
	if err := a.AllocateSpecific("uid-x", ip("10.0.1.5")); !errors.Is(err, ErrInUse) {
		t.Errorf("AllocateSpecific of a reserved outside address: %v, want ErrInUse", err)
	}
	// An owner holding only an outside address gets a new one from Allocate.
	if got, err := a.Allocate("uid-out"); err != nil || got != ip("10.0.0.2") {
		t.Errorf("Allocate(uid-out) = %v, %v; want 10.0.0.2", got, err)
	}
	if err := a.Release("uid-out", ip("10.0.1.5")); err != nil {
		t.Fatal(err)
	}
	if c := a.Counts(); c.OutOfPool != 2 || c.Allocated != 3 {
		t.Errorf("Counts after releasing an outside address = %+v", c)
	}
	if err := a.AllocateSpecific("uid-x", ip("10.0.1.5")); !errors.Is(err, ErrNotInPool) {
		t.Errorf("AllocateSpecific of a released outside address: %v, want ErrNotInPool", err)
	}
}

func TestRebuildReplacesState(t *testing.T) {
	a := NewAllocator(mustPool(t, Spec{Addresses: []string{"10.0.0.0/24"}, Prefix: 24}))
	for i := range 10 {
		if _, err := a.Allocate(fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	if conflicts := a.Rebuild([]Allocation{{Owner: "x", Address: ip("10.0.0.3")}}); len(conflicts) != 0 {
		t.Fatalf("conflicts = %v", conflicts)
	}
	if got := a.Allocations(); !slices.Equal(got, []Allocation{{Owner: "x", Address: ip("10.0.0.3")}}) {
		t.Errorf("Allocations = %v", got)
	}
	if got, _ := a.Allocate("y"); got != ip("10.0.0.1") {
		t.Errorf("Allocate = %v, want 10.0.0.1", got)
	}
}

// TestRebuildRandomRecords feeds random records (duplicates, records
// outside the pool, repeated records) in random orders and checks the
// result against a direct computation of the documented rule.
func TestRebuildRandomRecords(t *testing.T) {
	pool := mustPool(t, Spec{Addresses: []string{"10.0.0.0/26"}, ExcludedAddresses: []string{"10.0.0.8/29"}, Prefix: 24, Gateways: []string{"10.0.0.1"}})
	rng := rand.New(rand.NewPCG(2, 2026))
	for round := range 200 {
		var records []Allocation
		for range rng.IntN(120) {
			// 10.0.0.0-10.0.0.79: in the pool, excluded, gateway and beyond.
			addr := netip.AddrFrom4([4]byte{10, 0, 0, byte(rng.IntN(80))})
			records = append(records, Allocation{Owner: fmt.Sprintf("uid-%02d", rng.IntN(40)), Address: addr})
		}
		// Expected: per address the smallest owner wins.
		winners := map[netip.Addr]string{}
		for _, r := range records {
			if w, ok := winners[r.Address]; !ok || r.Owner < w {
				winners[r.Address] = r.Owner
			}
		}
		var wantAllocs []Allocation
		var wantConflicts []Conflict
		seen := map[Allocation]bool{}
		for _, r := range records {
			if seen[r] {
				continue
			}
			seen[r] = true
			if w := winners[r.Address]; w != r.Owner {
				wantConflicts = append(wantConflicts, Conflict{Allocation: r, Reason: ConflictDuplicate, Holder: w})
				continue
			}
			wantAllocs = append(wantAllocs, r)
			if !pool.Contains(r.Address) {
				wantConflicts = append(wantConflicts, Conflict{Allocation: r, Reason: ConflictOutsidePool})
			}
		}
		slices.SortFunc(wantAllocs, func(x, y Allocation) int { return x.Address.Compare(y.Address) })
		slices.SortFunc(wantConflicts, func(x, y Conflict) int {
			if c := x.Address.Compare(y.Address); c != 0 {
				return c
			}
			return strings.Compare(x.Owner, y.Owner)
		})

		for shuffle := range 3 {
			rng.Shuffle(len(records), func(i, j int) { records[i], records[j] = records[j], records[i] })
			a := NewAllocator(pool)
			conflicts := a.Rebuild(records)
			if !slices.Equal(conflicts, wantConflicts) {
				t.Fatalf("round %d shuffle %d: conflicts\n got: %v\nwant: %v", round, shuffle, conflicts, wantConflicts)
			}
			if got := a.Allocations(); !slices.Equal(got, wantAllocs) {
				t.Fatalf("round %d shuffle %d: allocations\n got: %v\nwant: %v", round, shuffle, got, wantAllocs)
			}
			var inPool, outside int64
			for _, al := range wantAllocs {
				if pool.Contains(al.Address) {
					inPool++
				} else {
					outside++
				}
			}
			if c := a.Counts(); c.Allocated != inPool || c.OutOfPool != outside || c.Free != c.Total-inPool {
				t.Fatalf("round %d: Counts = %+v, want %d allocated, %d outside", round, c, inPool, outside)
			}
		}
	}
}
