package pace

import (
	"testing"
	"time"
)

func TestTaskPace(t *testing.T) {
	var p Tasks
	// Nothing seen yet: a quarter of the run so far, within bounds.
	for _, tc := range []struct{ elapsed, want time.Duration }{
		{0, MinPoll},
		{2 * time.Second, 500 * time.Millisecond},
		{time.Minute, MaxPoll},
	} {
		if got := p.Next("clone", tc.elapsed); got != tc.want {
			t.Errorf("unknown kind, elapsed %s: next = %s, want %s", tc.elapsed, got, tc.want)
		}
	}

	p.Observe("clone", 5*time.Second)
	for _, tc := range []struct{ elapsed, want time.Duration }{
		{0, 4800 * time.Millisecond},        // just before the typical end
		{4750 * time.Millisecond, NearPoll}, // due: never less than NearPoll
		{5 * time.Second, NearPoll},         // due
		{7400 * time.Millisecond, NearPoll}, // still within half again the typical
		{8 * time.Second, 2 * time.Second},  // late: back off
		{20 * time.Second, MaxPoll},         // very late
	} {
		if got := p.Next("clone", tc.elapsed); got != tc.want {
			t.Errorf("typical 5s, elapsed %s: next = %s, want %s", tc.elapsed, got, tc.want)
		}
	}
	if got := p.Next("start", 0); got != MinPoll {
		t.Errorf("another kind is not paced by the clone's history: next = %s, want %s", got, MinPoll)
	}

	// A task seen done sooner sets the typical duration (an upper bound of
	// its true one); a slower one moves it up by paceWeight of the
	// difference.
	p.Observe("clone", 4800*time.Millisecond)
	if got, want := p.typical["clone"], 4800*time.Millisecond; got != want {
		t.Errorf("typical after a faster task = %s, want %s", got, want)
	}
	p.Observe("clone", 5800*time.Millisecond)
	if got, want := p.typical["clone"], 5100*time.Millisecond; got != want {
		t.Errorf("typical after a slower task = %s, want %s", got, want)
	}
	p.Observe("clone", 0) // a clock step back is ignored
	if got, want := p.typical["clone"], 5100*time.Millisecond; got != want {
		t.Errorf("typical after a zero observation = %s, want %s", got, want)
	}
}

// TestTaskPaceConverges drives the pace against tasks of a fixed true
// duration, polling as it says, and checks the lag between a task's end
// and the look that finds it done settles at no more than NearPoll after a
// few tasks, with two or three looks per task.
func TestTaskPaceConverges(t *testing.T) {
	for _, truth := range []time.Duration{300 * time.Millisecond, 5 * time.Second, 40 * time.Second} {
		var p Tasks
		var lag time.Duration
		var looks int
		for range 8 {
			elapsed, n := time.Duration(0), 0
			for elapsed < truth {
				elapsed += p.Next("clone", elapsed)
				n++
			}
			p.Observe("clone", elapsed)
			lag, looks = elapsed-truth, n
		}
		if lag > NearPoll || looks > 3 {
			t.Errorf("task of %s: after 8 tasks the look finds it done %s late after %d looks; want <= %s and <= 3 looks", truth, lag, looks, NearPoll)
		}
	}
}
