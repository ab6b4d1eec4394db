package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
)

func TestManagerRefusesChangesUntilRebuilt(t *testing.T) {
	m := NewManager()
	if _, err := m.Allocate("pool-a", "uid-1"); !errors.Is(err, ErrUnknownPool) || err.Error() != "IPPool pool-a: IP pool not known to the allocator" {
		t.Errorf("Allocate from an unknown pool: %v", err)
	}
	m.SetPool("pool-a", mustPool(t, Spec{Addresses: []string{"10.0.0.0/24"}, Prefix: 24, Gateways: []string{"10.0.0.1"}}))
	if m.Rebuilt("pool-a") {
		t.Fatal("a new pool is rebuilt before Rebuild")
	}
	_, err := m.Allocate("pool-a", "uid-1")
	if !errors.Is(err, ErrNotRebuilt) || err.Error() != "IPPool pool-a: IP pool not rebuilt from MachineClaim allocations yet" {
		t.Errorf("Allocate before rebuild: %v", err)
	}
	if err := m.AllocateSpecific("pool-a", "uid-1", ip("10.0.0.9")); !errors.Is(err, ErrNotRebuilt) {
		t.Errorf("AllocateSpecific before rebuild: %v", err)
	}
	if err := m.Release("pool-a", "uid-1", ip("10.0.0.9")); !errors.Is(err, ErrNotRebuilt) {
		t.Errorf("Release before rebuild: %v", err)
	}
	if _, err := m.ReleaseOwner("pool-a", "uid-1"); !errors.Is(err, ErrNotRebuilt) {
		t.Errorf("ReleaseOwner before rebuild: %v", err)
	}
	// Reads work before the rebuild.
	if c, err := m.Counts("pool-a"); err != nil || c.Total != 253 {
		t.Errorf("Counts before rebuild = %+v, %v", c, err)
	}

	conflicts, err := m.Rebuild("pool-a", []Allocation{{Owner: "uid-0", Address: ip("10.0.0.2")}})
	if err != nil || len(conflicts) != 0 {
		t.Fatalf("Rebuild = %v, %v", conflicts, err)
	}
	if !m.Rebuilt("pool-a") {
		t.Fatal("Rebuilt is false after Rebuild")
	}
	addr, err := m.Allocate("pool-a", "uid-1")
	if err != nil || addr != ip("10.0.0.3") {
		t.Fatalf("Allocate after rebuild = %v, %v; want 10.0.0.3 (10.0.0.2 was recorded)", addr, err)
	}
	if owner, ok := m.Owner("pool-a", addr); !ok || owner != "uid-1" {
		t.Errorf("Owner = %q, %v", owner, ok)
	}
	if owner, ok := m.Owner("pool-b", addr); ok {
		t.Errorf("Owner in an unknown pool = %q", owner)
	}
	if err := m.Release("pool-a", "uid-9", addr); !errors.Is(err, ErrNotOwner) {
		t.Errorf("Release by another owner: %v", err)
	}
	if released, err := m.ReleaseOwner("pool-a", "uid-1"); err != nil || !slices.Equal(released, []netip.Addr{addr}) {
		t.Errorf("ReleaseOwner = %v, %v", released, err)
	}
	if err := m.AllocateSpecific("pool-a", "uid-2", ip("10.0.0.1")); !errors.Is(err, ErrNotInPool) {
		t.Errorf("AllocateSpecific of the gateway: %v", err)
	}
}

func TestManagerExhaustionNamesThePool(t *testing.T) {
	m := NewManager()
	m.SetPool("tiny", mustPool(t, Spec{Addresses: []string{"10.0.0.4/31"}, Prefix: 24}))
	if _, err := m.Rebuild("tiny", nil); err != nil {
		t.Fatal(err)
	}
	for _, owner := range []string{"a", "b"} {
		if _, err := m.Allocate("tiny", owner); err != nil {
			t.Fatal(err)
		}
	}
	_, err := m.Allocate("tiny", "c")
	if want := "IPPool tiny: all 2 addresses are allocated; add entries to spec.addresses, remove exclusions or delete unused MachineClaims: IP pool exhausted"; !errors.Is(err, ErrExhausted) || err.Error() != want {
		t.Errorf("error\n got: %v\nwant: %s", err, want)
	}
}

func TestManagerSetPoolKeepsAllocations(t *testing.T) {
	m := NewManager()
	wide := mustPool(t, Spec{Addresses: []string{"10.0.0.0/24"}, Prefix: 24, Gateways: []string{"10.0.0.1"}})
	m.SetPool("p", wide)
	if _, err := m.Rebuild("p", nil); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := m.Allocate("p", fmt.Sprint("uid-", i)); err != nil { // 10.0.0.2-10.0.0.6
			t.Fatal(err)
		}
	}

	// Only nameservers change: same allocator, new spec.
	renamed := mustPool(t, Spec{Addresses: []string{"10.0.0.0/24"}, Prefix: 24, Gateways: []string{"10.0.0.1"}, Nameservers: []string{"10.0.0.53"}})
	if conflicts := m.SetPool("p", renamed); len(conflicts) != 0 {
		t.Errorf("SetPool with the same addresses reported %v", conflicts)
	}
	if p, _ := m.Pool("p"); p != renamed {
		t.Error("Pool did not return the new spec")
	}

	// Shrink: 10.0.0.5 and 10.0.0.6 fall out and stay reserved.
	narrow := mustPool(t, Spec{Addresses: []string{"10.0.0.0-10.0.0.4"}, Prefix: 24, Gateways: []string{"10.0.0.1"}})
	conflicts := m.SetPool("p", narrow)
	want := []Conflict{
		{Allocation: Allocation{Owner: "uid-3", Address: ip("10.0.0.5")}, Reason: ConflictOutsidePool},
		{Allocation: Allocation{Owner: "uid-4", Address: ip("10.0.0.6")}, Reason: ConflictOutsidePool},
	}
	if !slices.Equal(conflicts, want) {
		t.Fatalf("SetPool shrink conflicts = %+v, want %+v", conflicts, want)
	}
	if !m.Rebuilt("p") {
		t.Error("replacing the spec lost the rebuilt mark")
	}
	if c, _ := m.Counts("p"); c != (Counts{Total: 3, Allocated: 3, Free: 0, OutOfPool: 2}) {
		t.Errorf("Counts after shrink = %+v", c)
	}
	if _, err := m.Allocate("p", "uid-new"); !errors.Is(err, ErrExhausted) {
		t.Errorf("Allocate after shrink: %v, want ErrExhausted", err)
	}

	// Grow back: the reserved addresses are in the pool again.
	if conflicts := m.SetPool("p", wide); len(conflicts) != 0 {
		t.Errorf("SetPool grow reported %v", conflicts)
	}
	if c, _ := m.Counts("p"); c != (Counts{Total: 253, Allocated: 5, Free: 248}) {
		t.Errorf("Counts after growing back = %+v", c)
	}
	if allocs, _ := m.Allocations("p"); len(allocs) != 5 {
		t.Errorf("Allocations = %v", allocs)
	}
}

func TestManagerRemovePool(t *testing.T) {
	m := NewManager()
	spec := Spec{Addresses: []string{"10.0.0.0/24"}, Prefix: 24}
	m.SetPool("p", mustPool(t, spec))
	if _, err := m.Rebuild("p", nil); err != nil {
		t.Fatal(err)
	}
	m.RemovePool("p")
	m.RemovePool("p") // idempotent
	if _, err := m.Allocate("p", "uid"); !errors.Is(err, ErrUnknownPool) {
		t.Errorf("Allocate from a removed pool: %v", err)
	}
	if _, err := m.Counts("p"); !errors.Is(err, ErrUnknownPool) {
		t.Errorf("Counts of a removed pool: %v", err)
	}
	if _, err := m.Rebuild("p", nil); !errors.Is(err, ErrUnknownPool) {
		t.Errorf("Rebuild of a removed pool: %v", err)
	}
	if _, ok := m.Pool("p"); ok {
		t.Error("Pool returns a removed pool")
	}
	// Re-created under the same name, it must be rebuilt again: claims may
	// still record addresses from its previous life.
	m.SetPool("p", mustPool(t, spec))
	if m.Rebuilt("p") {
		t.Error("a re-created pool is rebuilt without Rebuild")
	}
}

// TestManagerConcurrent allocates from several goroutines while others
// read, replace the spec and rebuild another pool; run with -race.
func TestManagerConcurrent(t *testing.T) {
	m := NewManager()
	spec := Spec{Addresses: []string{"10.0.0.0/22"}, Prefix: 22, Gateways: []string{"10.0.0.1"}}
	m.SetPool("p", mustPool(t, spec))
	m.SetPool("q", mustPool(t, Spec{Addresses: []string{"2001:db8::/64"}, Prefix: 64}))
	for _, name := range []string{"p", "q"} {
		if _, err := m.Rebuild(name, nil); err != nil {
			t.Fatal(err)
		}
	}
	const workers, each = 8, 100
	got := make([][]netip.Addr, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				addr, err := m.Allocate("p", fmt.Sprintf("w%d-%d", w, i))
				if err != nil {
					t.Errorf("Allocate: %v", err)
					return
				}
				got[w] = append(got[w], addr)
				if _, err := m.Allocate("q", fmt.Sprintf("w%d-%d", w, i)); err != nil {
					t.Errorf("Allocate q: %v", err)
					return
				}
			}
		}()
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		for range 50 {
			m.SetPool("p", mustPool(t, spec))
			_, _ = m.Counts("p")
		}
	}()
	go func() {
		defer wg.Done()
		// Rebuilding one pool must not disturb allocations in another.
		m.SetPool("r", mustPool(t, Spec{Addresses: []string{"10.1.0.0/16"}, Prefix: 16}))
		var recorded []Allocation
		for i := range 2000 {
			recorded = append(recorded, Allocation{Owner: fmt.Sprint("r-", i), Address: netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})})
		}
		for range 20 {
			if _, err := m.Rebuild("r", recorded); err != nil {
				t.Errorf("Rebuild r: %v", err)
			}
		}
	}()
	wg.Wait()

	seen := map[netip.Addr]bool{}
	for _, addrs := range got {
		for _, a := range addrs {
			if seen[a] {
				t.Fatalf("%v allocated twice", a)
			}
			seen[a] = true
		}
	}
	if c, _ := m.Counts("p"); c.Allocated != workers*each || len(seen) != workers*each {
		t.Errorf("Counts = %+v, distinct = %d, want %d", c, len(seen), workers*each)
	}
	if c, _ := m.Counts("q"); c.Allocated != workers*each {
		t.Errorf("Counts(q) = %+v, want %d allocated", c, workers*each)
	}

	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, a := range got[w] {
				if err := m.Release("p", fmt.Sprintf("w%d-%d", w, i), a); err != nil {
					t.Errorf("Release: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	if c, _ := m.Counts("p"); c.Allocated != 0 || c.Free != c.Total {
		t.Errorf("Counts after releasing everything = %+v", c)
	}
}

// TestManagerReleaseOwnerEverywhere: every address an owner holds, in every
// rebuilt pool, is freed, whatever its claim's status records; other
// owners keep theirs and pools not rebuilt are left alone.
func TestManagerReleaseOwnerEverywhere(t *testing.T) {
	m := NewManager()
	m.SetPool("a", mustPool(t, Spec{Addresses: []string{"10.0.0.0/24"}, Prefix: 24}))
	m.SetPool("b", mustPool(t, Spec{Addresses: []string{"10.1.0.0/24"}, Prefix: 24}))
	m.SetPool("later", mustPool(t, Spec{Addresses: []string{"10.2.0.0/24"}, Prefix: 24}))
	for _, p := range []string{"a", "b"} {
		if _, err := m.Rebuild(p, nil); err != nil {
			t.Fatal(err)
		}
	}
	mine := map[string]netip.Addr{}
	for _, p := range []string{"a", "b"} {
		addr, err := m.Allocate(p, "uid-gone")
		if err != nil {
			t.Fatal(err)
		}
		mine[p] = addr
	}
	other, err := m.Allocate("a", "uid-other")
	if err != nil {
		t.Fatal(err)
	}
	got := m.ReleaseOwnerEverywhere("uid-gone")
	want := []Released{{Pool: "a", Address: mine["a"]}, {Pool: "b", Address: mine["b"]}}
	if !slices.Equal(got, want) {
		t.Fatalf("ReleaseOwnerEverywhere = %v, want %v", got, want)
	}
	for p, addr := range mine {
		if o, held := m.Owner(p, addr); held {
			t.Errorf("%s in pool %s is still held by %s", addr, p, o)
		}
	}
	if o, _ := m.Owner("a", other); o != "uid-other" {
		t.Errorf("another owner's address %s is now held by %q", other, o)
	}
	if again := m.ReleaseOwnerEverywhere("uid-gone"); len(again) != 0 {
		t.Errorf("a second release freed %v", again)
	}
}
