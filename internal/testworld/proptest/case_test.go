package proptest

import (
	"os"
	"slices"
	"testing"
)

// TestCaseCleansUpWhenTheCaseEnds: a Case runs its cleanups, last first,
// and removes its directories at Close, before the test ends; nothing runs
// twice.
func TestCaseCleansUpWhenTheCaseEnds(t *testing.T) {
	c := NewCase(t)
	var ran []int
	c.Cleanup(func() { ran = append(ran, 1) })
	c.Cleanup(func() { ran = append(ran, 2) })
	dir := c.TempDir()
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("TempDir: %v", err)
	}
	c.Close()
	if !slices.Equal(ran, []int{2, 1}) {
		t.Errorf("cleanups ran as %v, want [2 1]", ran)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the case's directory is still there after Close: %v", err)
	}
	c.Close()
	if len(ran) != 2 {
		t.Errorf("a second Close ran cleanups again: %v", ran)
	}
}
