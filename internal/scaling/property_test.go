package scaling

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
)

// propertyCases is how many inputs each property draws: Plan is pure and
// cheap (2,000 cases take about 20 ms), so far more than the minimum.
const propertyCases = 2000

var baseNow = time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC)

// count draws 0..40, biased towards zero and small values so that pools
// fitting under maxReplicas are common.
func count(t *rapid.T, label string) int {
	switch rapid.IntRange(0, 2).Draw(t, label+" size") {
	case 0:
		return 0
	case 1:
		return rapid.IntRange(0, 5).Draw(t, label)
	default:
		return rapid.IntRange(0, 40).Draw(t, label)
	}
}

// inputs draws Inputs: small realistic counts, consistent bounds, and
// LowDemandSince nil, in the past or in the future of Now. rapid shrinks a
// failing one towards zeros and nil, so the input it reports is minimal.
var inputs = rapid.Custom(func(t *rapid.T) Input {
	in := Input{MaxReplicas: rapid.IntRange(1, 60).Draw(t, "maxReplicas")}
	in.MinReplicas = rapid.IntRange(0, in.MaxReplicas).Draw(t, "minReplicas")
	in.MinIdle = rapid.IntRange(0, in.MaxReplicas).Draw(t, "minIdle")
	if rapid.IntRange(0, 3).Draw(t, "delay set") != 0 {
		in.ScaleDownDelay = time.Duration(rapid.Int64Range(0, int64(10*time.Minute)).Draw(t, "scaleDownDelay"))
	}
	in.Pending = count(t, "pending")
	in.Starting, in.StaleStarting = count(t, "starting"), count(t, "staleStarting")
	in.Idle, in.StaleIdle = count(t, "idle"), count(t, "staleIdle")
	in.Busy = count(t, "busy")
	in.Terminating = count(t, "terminating")
	in.Retained = count(t, "retained") / 4 // failed VMs kept for debugging are few
	in.Now = baseNow.Add(time.Duration(rapid.Int64Range(0, int64(24*time.Hour)-1).Draw(t, "now")))
	switch rapid.IntRange(0, 3).Draw(t, "lowDemandSince kind") {
	case 0: // nil
	case 1, 2: // in the past, up to 15 minutes, sometimes exactly now
		since := in.Now.Add(-time.Duration(rapid.Int64Range(0, int64(15*time.Minute)).Draw(t, "low demand for")))
		if rapid.IntRange(0, 7).Draw(t, "exactly now") == 0 {
			since = in.Now
		}
		in.LowDemandSince = &since
	case 3: // in the future
		since := in.Now.Add(time.Duration(rapid.Int64Range(1, int64(10*time.Minute)).Draw(t, "ahead by")))
		in.LowDemandSince = &since
	}
	return in
})

func describeInput(in Input) string {
	lds := "nil"
	if in.LowDemandSince != nil {
		lds = fmt.Sprintf("Now%+v", in.LowDemandSince.Sub(in.Now))
	}
	return fmt.Sprintf("Input{Min:%d Max:%d MinIdle:%d Delay:%v Pending:%d Starting:%d StaleStarting:%d Idle:%d StaleIdle:%d Busy:%d Terminating:%d Retained:%d Now:%s LowDemandSince:%s} (Live=%d)",
		in.MinReplicas, in.MaxReplicas, in.MinIdle, in.ScaleDownDelay, in.Pending, in.Starting, in.StaleStarting,
		in.Idle, in.StaleIdle, in.Busy, in.Terminating, in.Retained, in.Now.Format(time.RFC3339Nano), lds, in.Live())
}

func describeDecision(in Input, d Decision) string {
	lds, at := "nil", "zero"
	if d.LowDemandSince != nil {
		lds = fmt.Sprintf("Now%+v", d.LowDemandSince.Sub(in.Now))
	}
	if !d.ScaleDownAt.IsZero() {
		at = fmt.Sprintf("Now%+v", d.ScaleDownAt.Sub(in.Now))
	}
	return fmt.Sprintf("Decision{Desired:%d Create:%d RemoveStaleStarting:%d RemoveStaleIdle:%d RemoveIdle:%d LowDemandSince:%s ScaleDownAt:%s Limit:%q}",
		d.Desired, d.Create, d.RemoveStaleStarting, d.RemoveStaleIdle, d.RemoveIdle, lds, at, d.Limit)
}

// checkProperty runs prop over propertyCases generated inputs; prop returns an empty string when the property holds,
// otherwise what broke. rapid shrinks a failing input before reporting it.
func checkProperty(t *testing.T, prop func(Input, Decision) string) {
	t.Helper()
	proptest.Check(t, propertyCases, func(rt *rapid.T) {
		in := inputs.Draw(rt, "input")
		d := Plan(in)
		if msg := prop(in, d); msg != "" {
			rt.Fatalf("%s\n  input:    %s\n  decision: %s", msg, describeInput(in), describeDecision(in, d))
		}
	})
}

// vms is the number of VMs that exist for the input (live, terminating
// and retained).
func vms(in Input) int { return in.Live() + in.Terminating + in.Retained }

// Feature: hyperfleet-operator, Property 9: RunnerPool Scaling Behavior
//
// The properties of Plan below are the rule alone; the operator creating
// and ending MachineClaims by it is internal/controller's
// TestPoolScalingProperty.
//
// TestPropertyNeverAboveMax: the VMs after the decision (live claims left,
// created ones, terminating ones including the claims just removed, and
// retained ones) never exceed maxReplicas when they did not already; and
// nothing is created when they already reach it.
func TestPropertyNeverAboveMax(t *testing.T) {
	var under, over int
	checkProperty(t, func(in Input, d Decision) string {
		after := in.Live() - d.Removals() + d.Create + in.Terminating + in.Retained + d.Removals()
		if d.Create < 0 {
			return "Create is negative"
		}
		if vms(in) <= in.MaxReplicas {
			under++
			if after > in.MaxReplicas {
				return fmt.Sprintf("VMs after the decision = %d > maxReplicas %d", after, in.MaxReplicas)
			}
		} else {
			over++
		}
		if vms(in) >= in.MaxReplicas && d.Create != 0 {
			return fmt.Sprintf("Create = %d with %d VMs existing and maxReplicas %d", d.Create, vms(in), in.MaxReplicas)
		}
		return ""
	})
	// The generator must exercise both sides.
	// Each a tenth of the cases at least (rapid runs a fifth of them under
	// -short, as in the race run).
	if n := under + over; under < n/10 || over < n/10 {
		t.Errorf("generator drew %d inputs under maxReplicas and %d over; want both >= %d", under, over, n/10)
	}
}

// Feature: hyperfleet-operator, Property 9: RunnerPool Scaling Behavior
//
// TestPropertyNeverBelowMin: removals never take the live claims below
// desired (beyond what drift replacement removes), and desired honours
// minReplicas within the ceiling left by retained VMs.
func TestPropertyNeverBelowMin(t *testing.T) {
	checkProperty(t, func(in Input, d Decision) string {
		left := in.Live() - d.Removals()
		fresh := in.Live() - in.StaleStarting - in.StaleIdle
		if floor := min(d.Desired, fresh); left < floor {
			return fmt.Sprintf("live left after removals = %d < min(desired, fresh live) = %d", left, floor)
		}
		if floor := min(in.MinReplicas, in.MaxReplicas-in.Retained); d.Desired < floor {
			return fmt.Sprintf("desired = %d < min(minReplicas, maxReplicas-retained) = %d", d.Desired, floor)
		}
		if d.Desired > max(in.Busy, in.MaxReplicas-in.Retained) {
			return fmt.Sprintf("desired = %d above max(busy, maxReplicas-retained)", d.Desired)
		}
		if left+d.Create > max(d.Desired, left) {
			return fmt.Sprintf("creations take live to %d, above desired %d", left+d.Create, d.Desired)
		}
		return ""
	})
}

// Feature: hyperfleet-operator, Property 9: RunnerPool Scaling Behavior
//
// TestPropertyNeverRemovesBusy: every removal comes from a claim of the
// kind it names, busy claims are never removed, and desired keeps them.
func TestPropertyNeverRemovesBusy(t *testing.T) {
	checkProperty(t, func(in Input, d Decision) string {
		switch {
		case d.RemoveIdle < 0 || d.RemoveStaleIdle < 0 || d.RemoveStaleStarting < 0:
			return "a removal count is negative"
		case d.RemoveIdle > in.Idle:
			return "RemoveIdle > Idle"
		case d.RemoveStaleIdle > in.StaleIdle:
			return "RemoveStaleIdle > StaleIdle"
		case d.RemoveStaleStarting > in.StaleStarting:
			return "RemoveStaleStarting > StaleStarting"
		case d.Removals() > in.Live()-in.Busy:
			return "removals exceed the claims that are not busy"
		case d.Desired < in.Busy:
			return "Desired < Busy"
		}
		return ""
	})
}

// Feature: hyperfleet-operator, Property 9: RunnerPool Scaling Behavior
//
// TestPropertyScaleDownWaitsForDelay: surplus idle claims are removed only
// once demand stayed low for scaleDownDelay, counted from LowDemandSince
// (or from now when it is unset or in the future); while they wait,
// ScaleDownAt says until when.
func TestPropertyScaleDownWaitsForDelay(t *testing.T) {
	var cases, removed, waiting int
	checkProperty(t, func(in Input, d Decision) string {
		cases++
		since := in.Now
		if in.LowDemandSince != nil && !in.LowDemandSince.After(in.Now) {
			since = *in.LowDemandSince
		}
		if d.RemoveIdle > 0 {
			removed++
			if since.Add(in.ScaleDownDelay).After(in.Now) {
				return fmt.Sprintf("idle removed before the delay: low since Now%+v, delay %v", since.Sub(in.Now), in.ScaleDownDelay)
			}
			if d.LowDemandSince == nil || !d.LowDemandSince.Equal(since) {
				return "LowDemandSince not kept while removing surplus"
			}
		}
		if !d.ScaleDownAt.IsZero() {
			waiting++
			if d.RemoveIdle != 0 {
				return "ScaleDownAt set although idle claims are removed now"
			}
			if !d.ScaleDownAt.After(in.Now) || !d.ScaleDownAt.Equal(since.Add(in.ScaleDownDelay)) {
				return "ScaleDownAt is not LowDemandSince+scaleDownDelay in the future"
			}
		}
		if d.LowDemandSince != nil && d.LowDemandSince.After(in.Now) {
			return "LowDemandSince returned in the future"
		}
		return ""
	})
	if removed < cases/40 || waiting < cases/40 {
		t.Errorf("generator drew %d inputs removing idle claims and %d waiting of %d; want both >= %d", removed, waiting, cases, cases/40)
	}
}

// step applies a decision to the world and lets the world advance: the
// removed claims' VMs and those already terminating are destroyed, and the
// starting claims register and become idle.
func step(in Input, d Decision) Input {
	in.StaleStarting -= d.RemoveStaleStarting
	in.StaleIdle -= d.RemoveStaleIdle
	in.Idle -= d.RemoveIdle
	in.Terminating += d.Removals()
	in.Starting += d.Create

	in.Terminating = 0
	in.Idle += in.Starting
	in.StaleIdle += in.StaleStarting
	in.Starting, in.StaleStarting = 0, 0
	in.Now = in.Now.Add(in.ScaleDownDelay + time.Second)
	in.LowDemandSince = d.LowDemandSince
	return in
}

func isNoop(in Input, d Decision) bool {
	return d.Create == 0 && d.Removals() == 0 && in.Live() == d.Desired
}

// Feature: hyperfleet-operator, Property 9: RunnerPool Scaling Behavior
//
// TestPropertyConverges: with demand held constant, applying Plan's
// decisions reaches within 20 steps a pool of exactly desired live claims
// where Plan does nothing, and stays there.
func TestPropertyConverges(t *testing.T) {
	checkProperty(t, func(start Input, _ Decision) string {
		in := start
		for i := range 20 {
			d := Plan(in)
			if msg := invariants(in, d); msg != "" {
				return fmt.Sprintf("step %d: %s (at %s, %s)", i, msg, describeInput(in), describeDecision(in, d))
			}
			if isNoop(in, d) {
				next := step(in, d)
				if d2 := Plan(next); !isNoop(next, d2) {
					return fmt.Sprintf("step %d: no-op is not a fixed point: next %s gives %s", i, describeInput(next), describeDecision(next, d2))
				}
				return ""
			}
			in = step(in, d)
			if in.Pending != start.Pending || in.Busy != start.Busy {
				return "the simulation changed demand"
			}
		}
		return fmt.Sprintf("no fixed point within 20 steps; last %s gives %s", describeInput(in), describeDecision(in, Plan(in)))
	})
}

// invariants are the safety properties checked at every simulated step.
func invariants(in Input, d Decision) string {
	after := in.Live() + d.Create + in.Terminating + in.Retained
	switch {
	case vms(in) <= in.MaxReplicas && after > in.MaxReplicas:
		return "VMs exceed maxReplicas"
	case d.Removals() > in.Live()-in.Busy || d.RemoveIdle > in.Idle:
		return "removes more than the idle and stale claims"
	case d.Desired < in.Busy:
		return "desired below busy"
	}
	return ""
}

// Feature: hyperfleet-operator, Property 9: RunnerPool Scaling Behavior
//
// TestPropertyIdempotent: Plan is deterministic and leaves its input,
// LowDemandSince included, untouched.
func TestPropertyIdempotent(t *testing.T) {
	proptest.Check(t, propertyCases, func(rt *rapid.T) {
		in := inputs.Draw(rt, "input")
		orig := in // shares LowDemandSince; its value is kept in before
		var before *time.Time
		if in.LowDemandSince != nil {
			v := *in.LowDemandSince
			before = &v
		}
		d1 := Plan(in)
		// A second input equal in value but with its own LowDemandSince.
		in2 := in
		if in.LowDemandSince != nil {
			v := *in.LowDemandSince
			in2.LowDemandSince = &v
		}
		d2 := Plan(in2)
		d3 := Plan(in)
		fail := func(msg string) {
			rt.Fatalf("%s\n  input:    %s\n  decision: %s", msg, describeInput(orig), describeDecision(orig, d1))
		}
		if !reflect.DeepEqual(d1, d2) || !reflect.DeepEqual(d1, d3) {
			fail(fmt.Sprintf("Plan not deterministic: then %s, then %s", describeDecision(in, d2), describeDecision(in, d3)))
		}
		if in != orig {
			fail("Plan changed its input")
		}
		if before != nil && !before.Equal(*in.LowDemandSince) {
			fail(fmt.Sprintf("Plan changed the LowDemandSince it was given to Now%+v", in.LowDemandSince.Sub(in.Now)))
		}
	})
}

// ruleBeforeStandby is the rule as it stood before the standby tier,
// written again from the package documentation rather than copied from
// Plan, and checked against that Plan before the tier was added. It takes
// the generator's inputs (counts non-negative, bounds consistent), so it
// sanitizes nothing.
func ruleBeforeStandby(in Input) Decision {
	var d Decision
	want := max(in.MinReplicas, in.Busy+in.Pending+in.MinIdle)
	roomForRunners := in.MaxReplicas - in.Retained
	d.Desired = max(in.Busy, min(want, roomForRunners))
	if want > roomForRunners {
		d.Limit = AtMaxReplicas
	}
	d.RemoveStaleStarting, d.RemoveStaleIdle = in.StaleStarting, in.StaleIdle
	fresh := in.Starting + in.Idle + in.Busy
	if fresh > d.Desired {
		low := in.Now
		if in.LowDemandSince != nil && !in.LowDemandSince.After(in.Now) {
			low = *in.LowDemandSince
		}
		d.LowDemandSince = &low
		due, surplus := low.Add(in.ScaleDownDelay), min(fresh-d.Desired, in.Idle)
		if due.After(in.Now) && surplus > 0 {
			d.ScaleDownAt = due
		} else if !due.After(in.Now) {
			d.RemoveIdle = surplus
		}
	}
	// A removed claim's VM exists until it is destroyed, so removals leave
	// the VM count as it was.
	free := in.MaxReplicas - (in.Live() + in.Terminating + in.Retained)
	if missing := d.Desired - (fresh - d.RemoveIdle); missing > 0 {
		d.Create = max(min(missing, free), 0)
		if d.Create < missing && d.Limit == NotLimited {
			d.Limit = WaitingForTermination
		}
	}
	return d
}

// Feature: hyperfleet-operator, Property 9: RunnerPool Scaling Behavior
//
// TestPropertyRuleBeforeStandby: Plan decides what the rule before the
// standby tier decided.
func TestPropertyRuleBeforeStandby(t *testing.T) {
	checkProperty(t, func(in Input, d Decision) string {
		if want := ruleBeforeStandby(in); !sameDecision(d, want) {
			return "differs from the rule before the standby tier, which decides " + describeDecision(in, want)
		}
		return ""
	})
}
