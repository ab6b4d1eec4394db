// Package proptest runs pgregory.net/rapid property checks with a number of
// cases chosen per test. rapid takes its count from one process-wide flag
// (-rapid.checks, 100 by default); a property over a pure function can
// afford thousands of cases in milliseconds while one that drives the
// operator against the real API server affords the minimum, so each test
// says how many it wants. The design asks for at least 100 per property
// (docs/testing.md, "Property tests").
package proptest

import (
	"flag"
	"strconv"
	"sync"
	"testing"

	"pgregory.net/rapid"
)

// Minimum is the fewest cases a property test runs.
const Minimum = 100

var (
	// mu serialises Check: the count is a process-wide flag.
	mu sync.Mutex
	// explicit is the count given on the command line (0: none), read
	// once before Check first sets the flag itself.
	explicit     int
	explicitOnce sync.Once
)

// Check runs prop as rapid.Check does, over cases generated inputs (at
// least Minimum), unless -rapid.checks was given on the command line, which
// then wins (to run every property longer, or shorter while debugging).
// Checks run one at a time, in parallel tests too.
func Check(t *testing.T, cases int, prop func(*rapid.T)) {
	t.Helper()
	explicitOnce.Do(func() {
		flag.Visit(func(f *flag.Flag) {
			if f.Name == "rapid.checks" {
				explicit, _ = strconv.Atoi(f.Value.String())
			}
		})
	})
	n := max(cases, Minimum)
	if explicit > 0 {
		n = explicit
	}
	mu.Lock()
	defer mu.Unlock()
	f := flag.Lookup("rapid.checks")
	if f == nil {
		t.Fatal("proptest: rapid registers no -rapid.checks flag")
	}
	before := f.Value.String()
	if err := f.Value.Set(strconv.Itoa(n)); err != nil {
		t.Fatalf("proptest: -rapid.checks=%d: %v", n, err)
	}
	defer func() { _ = f.Value.Set(before) }()
	rapid.Check(t, prop)
}

// Draws is a source of small random choices (IntN, as math/rand/v2's Rand
// has) taken from rapid, for generators written as a series of choices:
// rapid records each one, so it replays and shrinks a failing case (towards
// zero: fewer items, the first of each list).
type Draws struct{ T *rapid.T }

// IntN draws an int in [0, n); n must be positive.
func (d Draws) IntN(n int) int { return rapid.IntRange(0, n-1).Draw(d.T, "choice") }
