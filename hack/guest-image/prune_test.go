package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestPruneKeepsTheRecentlyUsedAgentImages: of ten agent images used
// within the last hours, prune keeps the kept most recently used, and of
// the saved states as many, counted apart (Mutation: counting states and
// agent images together keeps 6 in all and fails this test; the old test
// had no states and passed it); an
// image unused for longer than unusedFor goes whatever its kind, and the
// base and template images used since stay.
func TestPruneKeepsTheRecentlyUsedAgentImages(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	use := func(name string, ago time.Duration) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, "disk.raw"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, now.Add(-ago), now.Add(-ago)); err != nil {
			t.Fatal(err)
		}
	}
	var want []string
	for i := range 10 {
		name := "agent-" + string(rune('a'+i))
		use(name, time.Duration(i)*time.Hour)
		if i < kept {
			want = append(want, name)
		}
	}
	// Saved states are bounded the same way, counted apart from the
	// agent images.
	for i := range kept + 2 {
		name := "state-" + string(rune('a'+i))
		use(name, time.Duration(i)*time.Hour+30*time.Minute)
		if i < kept {
			want = append(want, name)
		}
	}
	use("base-old", unusedFor+time.Hour)
	use("base-new", time.Hour)
	use("template-new", 2*time.Hour)
	want = append(want, "base-new", "template-new")

	prune(dir)

	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("after prune: %v, want %v", got, want)
	}
}
