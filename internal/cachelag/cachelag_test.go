package cachelag

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func object(uid types.UID, rv string) *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "o", Namespace: "ns", UID: uid, ResourceVersion: rv}}
}

// TestStaleBacksOff: while the cache shows an object older than its last
// write, the requeue doubles from 50 ms to 5 s; once the cache caught up,
// the next lag starts at 50 ms again.
func TestStaleBacksOff(t *testing.T) {
	var tr Tracker
	tr.Wrote(object("a", "100"))
	want := []time.Duration{50, 100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000}
	for i, w := range want {
		wait, stale, reads := tr.Stale(object("a", "99"))
		if !stale || wait != w*time.Millisecond || reads != i {
			t.Fatalf("stale read %d: wait %s stale %v reads %d, want %s", i+1, wait, stale, reads, w*time.Millisecond)
		}
	}
	if _, stale, _ := tr.Stale(object("a", "100")); stale {
		t.Fatal("a cache that shows the last write is called stale")
	}
	if wait, _, _ := tr.Stale(object("a", "99")); wait != FirstWait {
		t.Errorf("first wait of a new lag: %s, want %s", wait, FirstWait)
	}
	if got := Wait(1 << 20); got != MaxWait {
		t.Errorf("Wait after very many stale reads: %s, want %s", got, MaxWait)
	}
	for _, rv := range []string{"", "not-a-number"} {
		if _, stale, _ := tr.Stale(object("a", rv)); stale {
			t.Errorf("resourceVersion %q called stale", rv)
		}
	}
	if _, stale, _ := tr.Stale(object("never-written", "1")); stale {
		t.Error("an object never written is called stale")
	}
	tr.Done("a")
	if _, stale, _ := tr.Stale(object("a", "1")); stale || tr.Remembers("a") {
		t.Error("Done left the last write")
	}
}

// TestNamesForget: the memory of an object is dropped when its name is
// found gone or taken by another object, and the controller is told.
func TestNamesForget(t *testing.T) {
	var forgotten []types.UID
	var tr Tracker
	note := func(uid types.UID, ok bool) {
		if ok {
			forgotten = append(forgotten, uid)
		}
	}
	gone, kept := types.NamespacedName{Namespace: "ns", Name: "gone"}, types.NamespacedName{Namespace: "ns", Name: "kept"}
	note(tr.Observe(gone, "g1"))
	note(tr.Observe(kept, "k1"))
	tr.Wrote(object("g1", "5"))
	tr.Wrote(object("k1", "5"))
	tr.Stale(object("k1", "4"))
	note(tr.Observe(kept, "k1")) // the same object again: nothing forgotten

	note(tr.Gone(gone))
	if tr.Remembers("g1") || !tr.Remembers("k1") || len(forgotten) != 1 || forgotten[0] != "g1" {
		t.Fatalf("after the name went: remembers g1 %v k1 %v, forgotten %v", tr.Remembers("g1"), tr.Remembers("k1"), forgotten)
	}
	note(tr.Observe(kept, "k2")) // the name taken by a new object
	if tr.Remembers("k1") || len(forgotten) != 2 || forgotten[1] != "k1" || tr.Names() != 1 {
		t.Fatalf("after the name was taken: remembers k1 %v, forgotten %v, names %d", tr.Remembers("k1"), forgotten, tr.Names())
	}
	note(tr.Gone(types.NamespacedName{Namespace: "ns", Name: "never-seen"}))
	if len(forgotten) != 2 {
		t.Fatalf("a name never seen forgot %v", forgotten)
	}
}
