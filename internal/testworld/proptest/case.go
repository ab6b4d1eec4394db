package proptest

import (
	"os"
	"slices"
	"sync"
	"testing"
)

// Case is the test as one generated case's world sees it: what the world
// registers with Cleanup runs, and the directories TempDir made are
// removed, when the case ends (Close), not when the test does. A property
// that builds a world per case (servers, listeners, processes) would
// otherwise keep every case's world until the test ends: rapid runs a
// hundred cases and then, shrinking a failure, hundreds more, and the
// test ran out of file descriptors before it could report the failure.
type Case struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
}

// NewCase is a Case of t; the caller closes it when the case ends.
func NewCase(t testing.TB) *Case { return &Case{TB: t} }

// Cleanup registers f to run when the case ends, last registered first.
func (c *Case) Cleanup(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cleanups = append(c.cleanups, f)
}

// TempDir is a new directory removed when the case ends.
func (c *Case) TempDir() string {
	c.Helper()
	dir, err := os.MkdirTemp(c.TB.TempDir(), "case")
	if err != nil {
		c.Fatalf("proptest: a case's directory: %v", err)
	}
	c.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// Close runs the case's cleanups.
func (c *Case) Close() {
	c.mu.Lock()
	fs := c.cleanups
	c.cleanups = nil
	c.mu.Unlock()
	for _, f := range slices.Backward(fs) {
		f()
	}
}
