package guardedmap

import (
	"slices"
	"sync"
	"testing"
)

// TestNilMapReadsAsEmpty: a nil *Map has no values and forgets nothing.
func TestNilMapReadsAsEmpty(t *testing.T) {
	var m *Map[string, int]
	if v, ok := m.Get("a"); ok || v != 0 {
		t.Fatalf("Get on a nil Map = %d, %v; want none", v, ok)
	}
	m.Delete("a")
	if keys := m.Keys(func(int) bool { return true }); keys != nil {
		t.Fatalf("Keys of a nil Map = %v, want none", keys)
	}
}

// TestSwapGetDeleteKeys: Swap returns what it replaced, Get what was set
// last, Delete forgets, and Keys keeps only the values keep accepts.
func TestSwapGetDeleteKeys(t *testing.T) {
	var m Map[string, int]
	if old, ok := m.Swap("a", 1); ok || old != 0 {
		t.Fatalf("first Swap replaced %d, %v; want nothing", old, ok)
	}
	if old, ok := m.Swap("a", 2); !ok || old != 1 {
		t.Fatalf("second Swap replaced %d, %v; want 1", old, ok)
	}
	m.Swap("b", 3)
	m.Swap("c", 4)
	if v, ok := m.Get("a"); !ok || v != 2 {
		t.Fatalf("Get(a) = %d, %v; want 2", v, ok)
	}
	keys := m.Keys(func(v int) bool { return v%2 == 0 })
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"a", "c"}) {
		t.Fatalf("Keys of even values = %v, want [a c]", keys)
	}
	m.Delete("a")
	if _, ok := m.Get("a"); ok {
		t.Fatal("Get(a) after Delete found a value")
	}
}

// TestConcurrentUse: writers and readers at once (run with -race).
func TestConcurrentUse(t *testing.T) {
	var m Map[int, int]
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for j := range 100 {
				m.Swap(j, i)
				m.Delete(j - 1)
			}
		}()
		go func() {
			defer wg.Done()
			for j := range 100 {
				m.Get(j)
				m.Keys(func(int) bool { return true })
			}
		}()
	}
	wg.Wait()
	if v, ok := m.Get(99); !ok || v < 0 || v > 7 {
		t.Fatalf("Get(99) = %d, %v; want a writer's value", v, ok)
	}
}
