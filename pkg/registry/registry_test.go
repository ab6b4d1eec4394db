package registry_test

import (
	"strings"
	"testing"

	"github.com/hyperfleet/hyperfleet/pkg/registry"
)

type name string

// TestRegistry: a name registers once and is looked up; Registered is a
// copy; a doubled name, an empty name and a nil value panic, naming the
// registry's keys.
func TestRegistry(t *testing.T) {
	r := registry.New[name, func() int]("test kind")
	r.Register("a", func() int { return 1 })
	if f, ok := r.Lookup("a"); !ok || f() != 1 {
		t.Fatalf("Lookup(a): found %v", ok)
	}
	if _, ok := r.Lookup("b"); ok {
		t.Fatal("Lookup(b) found a value never registered")
	}
	got := r.Registered()
	delete(got, "a")
	if _, ok := r.Lookup("a"); !ok {
		t.Fatal("deleting from Registered's map removed the registration")
	}
	for _, tc := range []struct {
		name string
		k    name
		v    func() int
		want string
	}{
		{"twice", "a", func() int { return 2 }, "test kind a is registered twice"},
		{"empty name", "", func() int { return 3 }, "needs a test kind"},
		{"nil value", "c", nil, "needs a test kind"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				msg, _ := recover().(string)
				if !strings.Contains(msg, tc.want) {
					t.Fatalf("Register(%q): panic %q, want one saying %q", tc.k, msg, tc.want)
				}
			}()
			r.Register(tc.k, tc.v)
		})
	}
	if _, ok := r.Lookup("c"); ok {
		t.Fatal("a refused registration was kept")
	}
}

type kind struct{ name string }

// TestRegisterSameValue: the very same comparable value registers again
// without effect; another value under its name panics.
func TestRegisterSameValue(t *testing.T) {
	r := registry.New[name, any]("test kind")
	r.Register("a", kind{"a"})
	r.Register("a", kind{"a"})
	if got := r.Registered(); len(got) != 1 || got["a"] != (kind{"a"}) {
		t.Fatalf("Registered() = %v, want a alone", got)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("another value under a taken name did not panic")
		}
	}()
	r.Register("a", kind{"b"})
}
