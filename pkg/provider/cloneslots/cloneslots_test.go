package cloneslots

import (
	"fmt"
	"slices"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

const lapse = 30 * time.Second

var t0 = time.Date(2026, 11, 29, 6, 0, 0, 0, time.UTC)

// world is a Slots on a fake clock that records whom it wakes and the
// queue lengths it reports.
type world struct {
	clock  *clocktesting.FakeClock
	slots  *Slots
	woken  []string
	queues []int
}

func newWorld(cfg Config) *world {
	w := &world{clock: clocktesting.NewFakeClock(t0)}
	cfg.Lapse, cfg.Now = lapse, w.clock.Now
	cfg.Wake = func(o provider.Owner) { w.woken = append(w.woken, o.UID) }
	cfg.Observe = func(n int) { w.queues = append(w.queues, n) }
	w.slots = New(cfg)
	return w
}

// owner is VM vmid's owner in these tests; VM 0's has no UID.
func owner(vmid int) provider.Owner {
	if vmid == 0 {
		return provider.Owner{}
	}
	return provider.Owner{UID: fmt.Sprintf("o%d", vmid)}
}

// step is one call on the Slots, or time passing.
type step struct {
	op       string // hold, take, release, releaseHold, forget, leave, watch, unwatch, wait
	vmid     int
	node     string
	storages []string
	wait     time.Duration
	// want is what hold and take return.
	want bool
	// woken are the owners release and releaseHold wake, in order.
	woken []string
}

func hold(vmid int, node string, want bool, storages ...string) step {
	return step{op: "hold", vmid: vmid, node: node, storages: storages, want: want}
}

func take(vmid int, node string, want bool, storages ...string) step {
	return step{op: "take", vmid: vmid, node: node, storages: storages, want: want}
}

func release(vmid int, woken ...string) step { return step{op: "release", vmid: vmid, woken: woken} }

func releaseHold(vmid int, woken ...string) step {
	return step{op: "releaseHold", vmid: vmid, woken: woken}
}

func do(op string, vmid int) step { return step{op: op, vmid: vmid} }

func wait(d time.Duration) step { return step{op: "wait", wait: d} }

// run does s, failing t when its answer is not s's.
func (w *world) run(t *testing.T, s step) {
	t.Helper()
	w.woken = nil
	switch s.op {
	case "hold":
		if got := w.slots.Hold(s.vmid, s.node, s.storages); got != s.want {
			t.Fatalf("Hold(%d, %s, %v) = %v, want %v", s.vmid, s.node, s.storages, got, s.want)
		}
	case "take":
		if got := w.slots.Take(s.vmid, owner(s.vmid), s.node, s.storages); got != s.want {
			t.Fatalf("Take(%d, %s, %v) = %v, want %v", s.vmid, s.node, s.storages, got, s.want)
		}
	case "release", "releaseHold", "forget", "leave":
		switch s.op {
		case "release":
			w.slots.Release(s.vmid)
		case "releaseHold":
			w.slots.ReleaseHold(s.vmid)
		case "forget":
			w.slots.Forget(s.vmid)
		case "leave":
			w.slots.Leave(owner(s.vmid).UID)
		}
		if !slices.Equal(w.woken, s.woken) {
			t.Fatalf("%s(%d) woke %v, want %v", s.op, s.vmid, w.woken, s.woken)
		}
	case "watch", "unwatch":
		w.slots.Watch(s.vmid, s.op == "watch")
	case "wait":
		w.clock.Step(s.wait)
	default:
		t.Fatalf("unknown step %q", s.op)
	}
}

func TestSlots(t *testing.T) {
	cases := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{name: "a node's limit bounds the clones on it, not on another", cfg: Config{PerNode: 1}, steps: []step{
			take(1, "n1", true), take(1, "n1", true), take(2, "n1", false), take(3, "n2", true),
			release(1, "o2"), take(2, "n1", true),
		}},
		{name: "a storage's limit bounds the clones onto it from every node", cfg: Config{PerStorage: 1}, steps: []step{
			take(1, "n1", true, "shared"), take(2, "n2", false, "shared"), take(3, "n2", true, "n2/local"),
			take(4, "n1", false, "n1/local", "shared"), release(1, "o2"),
		}},
		{name: "no limits", steps: []step{
			take(1, "n1", true, "s"), take(2, "n1", true, "s"), hold(3, "n1", true, "s"), take(4, "n1", true, "s"),
		}},
		{name: "first come first served among competitors", cfg: Config{PerNode: 1}, steps: []step{
			take(1, "n1", true), take(2, "n1", false), take(3, "n1", false),
			release(1, "o2"), take(3, "n1", false), take(2, "n1", true),
			release(2, "o3"), take(3, "n1", true),
		}},
		{name: "a VM waiting ahead counts against every limit it competes for", cfg: Config{PerNode: 2, PerStorage: 1}, steps: []step{
			take(1, "n1", true, "a"), take(2, "n1", false, "a"), take(3, "n1", false, "b"),
			take(4, "n2", false, "b"), take(5, "n2", true, "c"),
		}},
		{name: "a release wakes only the waiting owners a slot is free for", cfg: Config{PerNode: 2}, steps: []step{
			take(1, "n1", true), take(2, "n1", true), take(3, "n1", false), take(4, "n1", false), take(5, "n1", false),
			release(1, "o3"), release(2, "o3", "o4"),
		}},
		{name: "a release of no slot wakes nobody", cfg: Config{PerNode: 1}, steps: []step{
			take(1, "n1", true), take(2, "n1", false), release(9),
		}},
		{name: "a placement holds the slot for its clone", cfg: Config{PerNode: 1}, steps: []step{
			hold(1, "n1", true), hold(1, "n1", true), hold(2, "n1", false),
			take(2, "n1", false), take(1, "n1", true), take(2, "n1", false),
		}},
		{name: "a hold lapses after Lapse, not before", cfg: Config{PerNode: 1}, steps: []step{
			hold(1, "n1", true), wait(lapse), hold(2, "n1", false), wait(time.Second), hold(2, "n1", true),
			take(1, "n1", false),
		}},
		{name: "a slot its clone took does not lapse", cfg: Config{PerNode: 1}, steps: []step{
			hold(1, "n1", true), take(1, "n1", true), wait(2 * lapse), hold(2, "n1", false), take(2, "n1", false),
		}},
		{name: "a placement waits behind the queue", cfg: Config{PerNode: 1}, steps: []step{
			take(1, "n1", true), take(2, "n1", false), release(1, "o2"), hold(3, "n1", false), take(2, "n1", true),
		}},
		{name: "a waiting VM that stops asking leaves the queue", cfg: Config{PerNode: 1}, steps: []step{
			take(1, "n1", true), take(2, "n1", false), release(1, "o2"),
			wait(lapse + time.Second), hold(3, "n1", true),
		}},
		{name: "a waiting VM that keeps asking keeps its place", cfg: Config{PerNode: 1}, steps: []step{
			take(1, "n1", true), take(2, "n1", false),
			wait(lapse / 2), take(2, "n1", false), wait(lapse / 2), take(2, "n1", false), wait(lapse / 2),
			release(1, "o2"), take(3, "n1", false), take(2, "n1", true),
		}},
		{name: "ReleaseHold frees a hold and wakes", cfg: Config{PerNode: 1}, steps: []step{
			hold(1, "n1", true), take(2, "n1", false), releaseHold(1, "o2"), take(2, "n1", true),
		}},
		{name: "ReleaseHold keeps a clone's slot", cfg: Config{PerNode: 1}, steps: []step{
			take(1, "n1", true), take(2, "n1", false), releaseHold(1), take(2, "n1", false), release(1, "o2"),
		}},
		{name: "Forget drops the slot and the place without waking", cfg: Config{PerNode: 1}, steps: []step{
			take(1, "n1", true), take(2, "n1", false), take(3, "n1", false),
			do("forget", 1), take(3, "n1", false), do("forget", 2), take(3, "n1", true),
		}},
		{name: "Leave drops the owner's place", cfg: Config{PerNode: 1}, steps: []step{
			take(1, "n1", true), take(2, "n1", false), take(3, "n1", false), do("leave", 2), release(1, "o3"),
		}},
		{name: "an owner without a UID is not woken", cfg: Config{PerNode: 1}, steps: []step{
			take(1, "n1", true), take(0, "n1", false), take(2, "n1", false), release(1),
		}},
		{name: "a clone stops counting after StaleAfter", cfg: Config{PerNode: 1, StaleAfter: 5 * time.Minute}, steps: []step{
			take(1, "n1", true), wait(5*time.Minute - time.Second), take(2, "n1", false),
			wait(time.Second), take(2, "n1", true), take(1, "n1", true),
		}},
		{name: "a clone's age starts when it takes its placement's hold", cfg: Config{PerNode: 1, StaleAfter: 5 * time.Minute}, steps: []step{
			hold(1, "n1", true), wait(20 * time.Second), take(1, "n1", true), wait(5*time.Minute - 10*time.Second),
			take(2, "n1", false),
		}},
		{name: "a watched clone counts however old", cfg: Config{PerNode: 1, StaleAfter: 5 * time.Minute}, steps: []step{
			take(1, "n1", true), do("watch", 1), wait(time.Hour), take(2, "n1", false),
			do("unwatch", 1), take(2, "n1", true),
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(c.cfg)
			for _, s := range c.steps {
				w.run(t, s)
			}
		})
	}
}

// TestObserve: the queue's length is reported when a clone is refused
// and when the queue shrinks.
func TestObserve(t *testing.T) {
	w := newWorld(Config{PerNode: 1})
	for _, s := range []step{
		take(1, "n1", true), take(2, "n1", false), take(3, "n1", false), take(2, "n1", false),
		release(1, "o2"), take(2, "n1", true), do("forget", 3),
	} {
		w.run(t, s)
	}
	if want := []int{1, 2, 2, 1, 0}; !slices.Equal(w.queues, want) {
		t.Errorf("observed %v, want %v", w.queues, want)
	}
	w.queues = nil
	w.run(t, take(4, "n1", false))
	w.run(t, wait(lapse+time.Second))
	w.run(t, take(5, "n1", false))
	if want := []int{1, 0, 1}; !slices.Equal(w.queues, want) {
		t.Errorf("a lapsed VM leaving: observed %v, want %v", w.queues, want)
	}
}
