// Package bench holds the benchmark harness's pure parts: percentiles,
// ratios against a physical minimum, a job's trace cut into phases, the
// operator process's resource readings from /proc, and the report
// (docs/performance.md and its timeline figure). The harness that drives
// the world is test/bench; keeping this apart lets unit tests cover every
// number the report prints without starting anything.
package bench

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Percentile returns the p-th percentile (0 < p <= 100) of ds by the
// nearest-rank method, so that the p99 of 100 samples is the 99th
// smallest, a value that was measured, not interpolated. Zero for no
// samples.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	rank = min(max(rank, 1), len(s))
	return s[rank-1]
}

// Ratio is measured / best, the headline form of every figure: both are
// taken in the same run on the same machine, so the machine's load
// cancels out. Zero when best is not positive (nothing to compare with).
func Ratio(measured, best time.Duration) float64 {
	if best <= 0 {
		return 0
	}
	return float64(measured) / float64(best)
}

// MedianWorst returns the median (the lower one of an even count, a value
// that was measured) and the largest of rs; zeros for none.
func MedianWorst(rs []float64) (median, worst float64) {
	if len(rs) == 0 {
		return 0, 0
	}
	s := slices.Clone(rs)
	slices.Sort(s)
	return s[(len(s)-1)/2], s[len(s)-1]
}

// Summary is a sample's size and percentiles.
type Summary struct {
	N   int           `json:"n"`
	P50 time.Duration `json:"p50"`
	P95 time.Duration `json:"p95"`
	P99 time.Duration `json:"p99"`
	Max time.Duration `json:"max"`
}

// Summarize returns ds's summary.
func Summarize(ds []time.Duration) Summary {
	return Summary{N: len(ds), P50: Percentile(ds, 50), P95: Percentile(ds, 95), P99: Percentile(ds, 99), Max: Percentile(ds, 100)}
}

// Event names of a job's life, in the order they happen.
const (
	EventQueued    = "queued"
	EventClaim     = "claim"
	EventClone     = "clone"
	EventConfigure = "configure"
	EventBoot      = "boot"
	EventRunnerUp  = "runner online"
	EventJobStart  = "job start"
	EventJobEnd    = "job end"
	EventPowerOff  = "power-off"
	EventDestroyed = "destroyed"
)

// Lifecycle is the order of a job's events.
var Lifecycle = []string{EventQueued, EventClaim, EventClone, EventConfigure, EventBoot, EventRunnerUp, EventJobStart, EventJobEnd, EventPowerOff, EventDestroyed}

// Trace is when each event of one job's life was first seen.
type Trace map[string]time.Time

// Phase is the span between two consecutive events of a trace.
type Phase struct {
	From, To   string
	Start, End time.Duration // since the trace's first event
}

// Phases cuts t into the spans between consecutive Lifecycle events, with
// times relative to the queued event. An event missing from t is an
// error: a phase cannot be drawn without both ends. Events out of order
// (a clock read late) are an error too, naming them.
func Phases(t Trace) ([]Phase, error) {
	for _, e := range Lifecycle {
		if t[e].IsZero() {
			return nil, fmt.Errorf("trace has no %q event", e)
		}
	}
	origin := t[Lifecycle[0]]
	out := make([]Phase, 0, len(Lifecycle)-1)
	for i := 1; i < len(Lifecycle); i++ {
		from, to := Lifecycle[i-1], Lifecycle[i]
		if t[to].Before(t[from]) {
			return nil, fmt.Errorf("trace event %q (%s) precedes %q (%s)", to, t[to].Format(time.RFC3339Nano), from, t[from].Format(time.RFC3339Nano))
		}
		out = append(out, Phase{From: from, To: to, Start: t[from].Sub(origin), End: t[to].Sub(origin)})
	}
	return out, nil
}

// PerMinute is n events over d, per minute.
func PerMinute(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Minutes()
}
