package hypervisors

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

func TestTransitionsExpiry(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	var gauge []int
	s := NewTransitions(TransitionOptions{TTL: 60 * time.Second, Observe: func(n int) { gauge = append(gauge, n) }})
	k := VMKey{Cluster: "pve", VM: "vm://101"}
	if _, ok := s.Active(k, t0); ok {
		t.Fatal("an unmarked VM is in transition")
	}
	if got := s.Mark(k, HintAgent, t0); got != Marked {
		t.Fatalf("Mark = %s", got)
	}
	if until, ok := s.Active(k, t0.Add(59*time.Second)); !ok || !until.Equal(t0.Add(60*time.Second)) {
		t.Fatalf("Active after 59 s = %v %v", until, ok)
	}
	if _, ok := s.Active(k, t0.Add(60*time.Second)); ok {
		t.Fatal("still in transition after its TTL: it must fall back to the listing")
	}
	if n := s.Len(t0.Add(60 * time.Second)); n != 0 {
		t.Fatalf("Len after expiry = %d", n)
	}
	if !slices.Contains(gauge, 1) || gauge[len(gauge)-1] != 0 {
		t.Fatalf("gauge observations %v, want 1 then 0", gauge)
	}
	if s.Poll() != DefaultTransitionPoll {
		t.Fatalf("Poll = %s", s.Poll())
	}
}

// TestTransitionsDedupe: a source marks a VM once per lifetime, even after
// the TTL: a repeated (or replayed) hint never keeps a VM polled; another
// source extends it; Forget starts afresh.
func TestTransitionsDedupe(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	s := NewTransitions(TransitionOptions{TTL: 10 * time.Second})
	k := VMKey{Cluster: "pve", VM: "vm://101"}
	s.Mark(k, HintJobCompleted, t0)
	if got := s.Mark(k, HintJobCompleted, t0.Add(5*time.Second)); got != Duplicate {
		t.Fatalf("second mark by the same source = %s", got)
	}
	if until, _ := s.Active(k, t0.Add(5*time.Second)); !until.Equal(t0.Add(10 * time.Second)) {
		t.Fatalf("a duplicate extended the transition to %v", until)
	}
	if got := s.Mark(k, HintJobCompleted, t0.Add(20*time.Second)); got != Duplicate {
		t.Fatalf("the same source after expiry = %s, want Duplicate", got)
	}
	if got := s.Mark(k, HintAgent, t0.Add(20*time.Second)); got != Marked {
		t.Fatalf("another source = %s", got)
	}
	if until, ok := s.Active(k, t0.Add(25*time.Second)); !ok || !until.Equal(t0.Add(30*time.Second)) {
		t.Fatalf("after the agent's hint: %v %v", until, ok)
	}
	s.Forget(k, t0.Add(25*time.Second))
	if got := s.Mark(k, HintJobCompleted, t0.Add(26*time.Second)); got != Marked {
		t.Fatalf("after Forget = %s", got)
	}
}

// TestTransitionsBounded: at most Max VMs are in transition; a hint beyond
// is left to the listing (Full); spent entries make room.
func TestTransitionsBounded(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	s := NewTransitions(TransitionOptions{TTL: 10 * time.Second, Max: 3})
	for i := range 3 {
		if got := s.Mark(VMKey{"pve", provider.ID(fmt.Sprint("vm://", 100+i))}, HintAgent, t0); got != Marked {
			t.Fatalf("mark %d = %s", i, got)
		}
	}
	if got := s.Mark(VMKey{"pve", "vm://200"}, HintAgent, t0.Add(time.Second)); got != Full {
		t.Fatalf("fourth VM = %s, want Full", got)
	}
	if n := s.Len(t0.Add(time.Second)); n != 3 {
		t.Fatalf("Len = %d", n)
	}
	// Once the first three are spent, new VMs get in; the set never holds
	// more than Max entries.
	for i := range 5 {
		if got := s.Mark(VMKey{"pve", provider.ID(fmt.Sprint("vm://", 300+i))}, HintAgent, t0.Add(11*time.Second)); got != Marked && i < 3 {
			t.Fatalf("mark after expiry %d = %s", i, got)
		}
	}
	s.mu.Lock()
	n := len(s.m)
	s.mu.Unlock()
	if n > 3 {
		t.Fatalf("the set holds %d entries, bound 3", n)
	}
	if got := s.Mark(VMKey{"other", "vm://100"}, HintAgent, t0.Add(11*time.Second)); got != Full {
		t.Fatalf("a VM of another cluster with the set full = %s", got)
	}
}
