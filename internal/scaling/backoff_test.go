package scaling

import (
	"fmt"
	"slices"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func TestBackoffDelay(t *testing.T) {
	b := DefaultBackoff()
	want := map[int]time.Duration{0: 0, 1: 0, 2: 0, 3: 30 * time.Second, 4: time.Minute, 5: 2 * time.Minute,
		6: 4 * time.Minute, 7: 8 * time.Minute, 8: 10 * time.Minute, 9: 10 * time.Minute, 60: 10 * time.Minute, 1 << 20: 10 * time.Minute}
	for n, d := range want {
		if got := b.Delay(n); got != d {
			t.Errorf("Delay(%d) = %s, want %s", n, got, d)
		}
	}
	if got := (Backoff{}).Delay(100); got != 0 {
		t.Errorf("zero Backoff delays %s", got)
	}
}

// TestBackoffSchedule drives a pool's failures on a fake clock: the first
// two replacements are immediate, then each failure doubles the wait up to
// the cap, and a runner coming online resets it.
func TestBackoffSchedule(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	b := DefaultBackoff()
	var s BackoffState
	seq := 0
	fail := func() {
		seq++
		var n int
		s, n = b.Observe(s, []Attempt{{ID: fmt.Sprintf("c%02d", seq), At: clk.Now(), Failed: true, Reason: fmt.Sprintf("claim c%02d: powered off", seq)}})
		if n != 1 {
			t.Fatalf("failure %d counted %d times", seq, n)
		}
	}
	var waits []time.Duration
	for range 9 {
		fail()
		next, waiting := s.Waiting(clk.Now())
		if !waiting {
			waits = append(waits, 0)
			continue
		}
		waits = append(waits, next.Sub(clk.Now()))
		clk.SetTime(next) // the next replacement is created when allowed
		if _, still := s.Waiting(clk.Now()); still {
			t.Fatalf("still waiting at the next attempt time %s", next)
		}
	}
	want := []time.Duration{0, 0, 30 * time.Second, time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute, 10 * time.Minute, 10 * time.Minute}
	if !slices.Equal(waits, want) {
		t.Fatalf("waits %v, want %v", waits, want)
	}
	if s.Failures != 9 || s.LastFailure != "claim c09: powered off" || !s.LastFailureTime.Equal(clk.Now().Add(-10*time.Minute)) {
		t.Fatalf("state %+v", s)
	}
	// A runner online resets the count and the wait.
	s, _ = b.Observe(s, []Attempt{{ID: "ok", At: clk.Now()}})
	if _, waiting := s.Waiting(clk.Now()); waiting || s.Failures != 0 {
		t.Fatalf("after a success: %+v", s)
	}
	fail()
	if _, waiting := s.Waiting(clk.Now()); waiting || s.Failures != 1 {
		t.Fatalf("first failure after a success waits: %+v", s)
	}
}

// TestBackoffObserveCountsOnce: the same claims shown again (every
// reconcile, or after a restart from status) are not counted again, also
// when several share one second; outcomes are applied in time order.
func TestBackoffObserveCountsOnce(t *testing.T) {
	b := DefaultBackoff()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := []Attempt{
		{ID: "b", At: t0, Failed: true, Reason: "b"},
		{ID: "a", At: t0, Failed: true, Reason: "a"},
	}
	s, n := b.Observe(BackoffState{}, a)
	if n != 2 || s.Failures != 2 || !slices.Equal(s.Counted, []string{"a", "b"}) || s.LastFailure != "b" {
		t.Fatalf("first: n %d state %+v", n, s)
	}
	// Again, plus a third in the same second, seen later.
	a = append(a, Attempt{ID: "c", At: t0, Failed: true, Reason: "c"})
	s, n = b.Observe(s, a)
	if n != 1 || s.Failures != 3 || s.NextAttempt != t0.Add(30*time.Second) {
		t.Fatalf("second: n %d state %+v", n, s)
	}
	for range 3 {
		if s2, n := b.Observe(s, a); n != 0 || s2.Failures != 3 {
			t.Fatalf("repeat counted %d: %+v", n, s2)
		}
	}
	// A success before a failure, delivered together: the failure counts
	// after the reset; a success after it resets.
	s, _ = b.Observe(BackoffState{}, []Attempt{{ID: "f", At: t0.Add(2 * time.Second), Failed: true}, {ID: "ok", At: t0.Add(time.Second)}})
	if s.Failures != 1 {
		t.Fatalf("success then failure: %+v", s)
	}
	s, _ = b.Observe(s, []Attempt{{ID: "ok2", At: t0.Add(3 * time.Second)}})
	if s.Failures != 0 {
		t.Fatalf("failure then success: %+v", s)
	}
	// An outcome older than what was observed is not counted.
	if s2, n := b.Observe(s, []Attempt{{ID: "late", At: t0, Failed: true}}); n != 0 || s2.Failures != 0 {
		t.Fatalf("old outcome counted: %+v", s2)
	}
}
