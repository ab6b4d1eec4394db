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
	"fmt"
	"strconv"
	"strings"
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
	rec := &recordingTB{T: t}
	// rapid reports a failure first and then replays the failing case,
	// logging every draw; a long replay (or one that passes: a flaky
	// failure) pushes the message out of a CI log's last lines, so it is
	// repeated as the test's last line.
	defer func() {
		if len(rec.failures) > 0 {
			t.Logf("proptest: the property failed (repeated after rapid's replay):\n%s", strings.Join(rec.failures, "\n"))
		}
	}()
	rapid.Check(rec, prop)
}

// recordingTB is the test as rapid sees it, keeping the messages rapid
// fails it with.
type recordingTB struct {
	*testing.T
	failures []string
}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.Helper()
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
	r.T.Errorf(format, args...)
}

func (r *recordingTB) Error(args ...any) {
	r.Helper()
	r.failures = append(r.failures, fmt.Sprint(args...))
	r.T.Error(args...)
}

func (r *recordingTB) Fatalf(format string, args ...any) {
	r.Helper()
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
	r.T.Fatalf(format, args...)
}

func (r *recordingTB) Fatal(args ...any) {
	r.Helper()
	r.failures = append(r.failures, fmt.Sprint(args...))
	r.T.Fatal(args...)
}

// Draws is a source of small random choices (IntN, as math/rand/v2's Rand
// has) taken from rapid, for generators written as a series of choices:
// rapid records each one, so it replays and shrinks a failing case (towards
// zero: fewer items, the first of each list).
type Draws struct{ T *rapid.T }

// IntN draws an int in [0, n); n must be positive.
func (d Draws) IntN(n int) int { return rapid.IntRange(0, n-1).Draw(d.T, "choice") }
