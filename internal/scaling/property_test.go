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

// inputs draws Inputs: small realistic counts, consistent bounds, a
// standby tier or none, and LowDemandSince nil, in the past or in the
// future of Now. rapid shrinks a failing one towards zeros and nil, so the
// input it reports is minimal.
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
	drawStandby(t, &in)
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

// drawStandby draws the standby tier, in a quarter of the inputs each:
// none; at its size, split between ready and building claims, so that a
// tier with nothing to do is common; below its size (claims activated or
// removed, or a raised size), so that refills are; any counts (a lowered
// size too). Half of the inputs with a tier have stale and expired
// standby claims too, and half have maxReplicas raised to leave some room
// beside the VMs that exist: without it, the counts drawn fill most pools
// before demand is met, and the tier is rarely refilled.
func drawStandby(t *rapid.T, in *Input) {
	kind := rapid.IntRange(0, 3).Draw(t, "standby kind")
	if kind == 0 {
		return
	}
	in.StandbySize = count(t, "standbySize")
	switch kind {
	case 1:
		in.Standby = rapid.IntRange(0, in.StandbySize).Draw(t, "standby")
		in.StandbyBuilding = in.StandbySize - in.Standby
	case 2:
		in.Standby = rapid.IntRange(0, in.StandbySize).Draw(t, "standby")
		in.StandbyBuilding = rapid.IntRange(0, in.StandbySize-in.Standby).Draw(t, "standbyBuilding")
	default:
		in.Standby, in.StandbyBuilding = count(t, "standby"), count(t, "standbyBuilding")
	}
	if rapid.Bool().Draw(t, "stale or expired standby") {
		in.StaleStandby, in.ExpiredStandby = count(t, "staleStandby")/2, count(t, "expiredStandby")/2
	}
	if rapid.Bool().Draw(t, "room") {
		room := rapid.IntRange(0, in.Pending+in.MinIdle+in.StandbySize).Draw(t, "room beside the VMs")
		in.MaxReplicas = max(in.MaxReplicas, vms(*in)+room)
	}
}

// withoutStandby is in with no standby tier.
func withoutStandby(in Input) Input {
	in.StandbySize, in.Standby, in.StandbyBuilding, in.StaleStandby, in.ExpiredStandby = 0, 0, 0, 0, 0
	return in
}

func describeInput(in Input) string {
	lds := "nil"
	if in.LowDemandSince != nil {
		lds = fmt.Sprintf("Now%+v", in.LowDemandSince.Sub(in.Now))
	}
	return fmt.Sprintf("Input{Min:%d Max:%d MinIdle:%d Delay:%v Pending:%d Starting:%d StaleStarting:%d Idle:%d StaleIdle:%d Busy:%d Terminating:%d Retained:%d "+
		"StandbySize:%d Standby:%d StandbyBuilding:%d StaleStandby:%d ExpiredStandby:%d Now:%s LowDemandSince:%s} (Live=%d)",
		in.MinReplicas, in.MaxReplicas, in.MinIdle, in.ScaleDownDelay, in.Pending, in.Starting, in.StaleStarting,
		in.Idle, in.StaleIdle, in.Busy, in.Terminating, in.Retained,
		in.StandbySize, in.Standby, in.StandbyBuilding, in.StaleStandby, in.ExpiredStandby, in.Now.Format(time.RFC3339Nano), lds, in.Live())
}

func describeDecision(in Input, d Decision) string {
	lds, at := "nil", "zero"
	if d.LowDemandSince != nil {
		lds = fmt.Sprintf("Now%+v", d.LowDemandSince.Sub(in.Now))
	}
	if !d.ScaleDownAt.IsZero() {
		at = fmt.Sprintf("Now%+v", d.ScaleDownAt.Sub(in.Now))
	}
	return fmt.Sprintf("Decision{Desired:%d Activate:%d Create:%d RemoveStaleStarting:%d RemoveStaleIdle:%d RemoveIdle:%d LowDemandSince:%s ScaleDownAt:%s Limit:%q "+
		"CreateStandby:%d RemoveStaleStandby:%d RemoveExpiredStandby:%d RemoveSurplusStandby:%d StandbyLimit:%q}",
		d.Desired, d.Activate, d.Create, d.RemoveStaleStarting, d.RemoveStaleIdle, d.RemoveIdle, lds, at, d.Limit,
		d.CreateStandby, d.RemoveStaleStandby, d.RemoveExpiredStandby, d.RemoveSurplusStandby, d.StandbyLimit)
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

// vms is the number of VMs that exist for the input (live, terminating,
// retained and standby).
func vms(in Input) int { return in.Live() + in.Terminating + in.Retained + in.StandbyClaims() }

// vmsAfter is the number of VMs that exist once the decision is applied:
// the live claims, the standby claims kept and created, those being
// destroyed (the removed claims among them) and the retained ones.
func vmsAfter(in Input, d Decision) int {
	standby := in.Standby - d.Activate - d.RemoveSurplusStandby + in.StandbyBuilding + d.CreateStandby
	return liveAfter(in, d) + standby + destroyed(in, d) + in.Retained
}

// liveAfter is the number of live claims once the decision is applied:
// activated standby claims become starting ones.
func liveAfter(in Input, d Decision) int { return in.Live() - d.Removals() + d.Activate + d.Create }

// destroyed is the number of VMs being destroyed once the decision is
// applied.
func destroyed(in Input, d Decision) int { return in.Terminating + d.Removals() + d.StandbyRemovals() }

// Feature: hyperfleet-operator, Property 9: RunnerPool Scaling Behavior
//
// The properties of Plan below are the rule alone; the operator creating
// and ending MachineClaims by it is internal/controller's
// TestPoolScalingProperty.
//
// TestPropertyNeverAboveMax: the VMs after the decision (live claims left,
// activated and created ones, terminating ones including the claims just
// removed, retained ones, and every standby claim, created ones included)
// never exceed maxReplicas when they did not already; and nothing is
// created when they already reach it.
func TestPropertyNeverAboveMax(t *testing.T) {
	var under, over int
	checkProperty(t, func(in Input, d Decision) string {
		after := vmsAfter(in, d)
		if d.Create < 0 || d.CreateStandby < 0 {
			return "Create or CreateStandby is negative"
		}
		if vms(in) <= in.MaxReplicas {
			under++
			if after > in.MaxReplicas {
				return fmt.Sprintf("VMs after the decision = %d > maxReplicas %d", after, in.MaxReplicas)
			}
		} else {
			over++
		}
		if vms(in) >= in.MaxReplicas && d.Create+d.CreateStandby != 0 {
			return fmt.Sprintf("Create = %d and CreateStandby = %d with %d VMs existing and maxReplicas %d", d.Create, d.CreateStandby, vms(in), in.MaxReplicas)
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
		if left+d.Activate+d.Create > max(d.Desired, left) {
			return fmt.Sprintf("activations and creations take live to %d, above desired %d", left+d.Activate+d.Create, d.Desired)
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
// removed claims' VMs and those already terminating are destroyed, the
// starting claims (activated ones included) register and become idle, and
// half of the standby claims being built (rounded up) become ready.
func step(in Input, d Decision) Input {
	in.StaleStarting -= d.RemoveStaleStarting
	in.StaleIdle -= d.RemoveStaleIdle
	in.Idle -= d.RemoveIdle
	in.Standby -= d.Activate + d.RemoveSurplusStandby
	in.StaleStandby -= d.RemoveStaleStandby
	in.ExpiredStandby -= d.RemoveExpiredStandby
	in.Terminating += d.Removals() + d.StandbyRemovals()
	in.Starting += d.Create + d.Activate
	in.StandbyBuilding += d.CreateStandby

	in.Terminating = 0
	in.Idle += in.Starting
	in.StaleIdle += in.StaleStarting
	in.Starting, in.StaleStarting = 0, 0
	built := (in.StandbyBuilding + 1) / 2
	in.Standby, in.StandbyBuilding = in.Standby+built, in.StandbyBuilding-built
	in.Now = in.Now.Add(in.ScaleDownDelay + time.Second)
	in.LowDemandSince = d.LowDemandSince
	return in
}

// isNoop says the pool is at rest: the decision does nothing, the live
// claims are desired, and no VM is being built or destroyed.
func isNoop(in Input, d Decision) bool {
	return d.Create == 0 && d.Removals() == 0 && in.Live() == d.Desired &&
		d.Activate == 0 && d.CreateStandby == 0 && d.StandbyRemovals() == 0 && in.StandbyBuilding == 0 && in.Terminating == 0
}

// settle applies Plan's decisions to the world, demand held constant,
// until the pool is at rest, within 20 steps, checking the invariants at
// every step and that rest is a fixed point. It returns the pool at rest
// and Plan's decision for it, or what broke.
func settle(start Input) (Input, Decision, string) {
	in := start
	for i := range 20 {
		d := Plan(in)
		if msg := invariants(in, d); msg != "" {
			return in, d, fmt.Sprintf("step %d: %s (at %s, %s)", i, msg, describeInput(in), describeDecision(in, d))
		}
		if isNoop(in, d) {
			next := step(in, d)
			if d2 := Plan(next); !isNoop(next, d2) {
				return in, d, fmt.Sprintf("step %d: no-op is not a fixed point: next %s gives %s", i, describeInput(next), describeDecision(next, d2))
			}
			return in, d, ""
		}
		in = step(in, d)
		if in.Pending != start.Pending || in.Busy != start.Busy {
			return in, d, "the simulation changed demand"
		}
	}
	return in, Plan(in), fmt.Sprintf("no fixed point within 20 steps; last %s gives %s", describeInput(in), describeDecision(in, Plan(in)))
}

// Feature: hyperfleet-operator, Property 9: RunnerPool Scaling Behavior
//
// TestPropertyConverges: with demand held constant, applying Plan's
// decisions reaches within 20 steps a pool at rest, exactly desired live
// claims where Plan does nothing, and stays there. At rest the standby
// tier is at its size when maxReplicas has room for it beside desired
// (less retained VMs), else as full as the room allows, StandbyLimit
// saying so.
func TestPropertyConverges(t *testing.T) {
	var cases, filled int
	checkProperty(t, func(start Input, _ Decision) string {
		cases++
		rest, d, msg := settle(start)
		if msg != "" {
			return msg
		}
		if msg := tierAtRest(rest, d); msg != "" {
			return fmt.Sprintf("%s (at rest %s, %s)", msg, describeInput(rest), describeDecision(rest, d))
		}
		if rest.StandbySize > 0 && rest.Standby == rest.StandbySize {
			filled++
		}
		return ""
	})
	if filled < cases/20 {
		t.Errorf("the simulation filled %d standby tiers of %d pools; want >= %d", filled, cases, cases/20)
	}
}

// Feature: hyperfleet-operator, Property 9: RunnerPool Scaling Behavior
//
// TestPropertyStandbyFillsWithoutDemand: with no job queued or running and
// room under maxReplicas for the tier beside desired (less retained VMs),
// applying Plan's decisions takes the tier to its size, every claim ready,
// from wherever it starts.
func TestPropertyStandbyFillsWithoutDemand(t *testing.T) {
	var cases, roomy, fromBelow int
	checkProperty(t, func(start Input, _ Decision) string {
		cases++
		start.Pending, start.Busy = 0, 0
		rest, d, msg := settle(start)
		if msg != "" {
			return msg
		}
		if start.StandbySize == 0 || d.Desired+start.StandbySize > start.MaxReplicas-start.Retained {
			return ""
		}
		roomy++
		if start.Standby+start.StandbyBuilding < start.StandbySize {
			fromBelow++
		}
		if rest.Standby != start.StandbySize || rest.StandbyBuilding != 0 {
			return fmt.Sprintf("the tier settled at %d ready and %d building, not its size %d (at rest %s)",
				rest.Standby, rest.StandbyBuilding, start.StandbySize, describeInput(rest))
		}
		return ""
	})
	if roomy < cases/10 || fromBelow < cases/40 {
		t.Errorf("generator drew %d pools with room for their tier of %d, %d of them below their size; want >= %d and >= %d",
			roomy, cases, fromBelow, cases/10, cases/40)
	}
}

// tierAtRest checks the standby tier of a pool at rest: never above its
// size, at its size when the room allows, and short of it only with
// StandbyLimit AtMaxReplicas.
func tierAtRest(in Input, d Decision) string {
	fits := min(in.StandbySize, in.MaxReplicas-in.Retained-d.Desired)
	switch {
	case in.Standby > in.StandbySize:
		return "tier above its size at rest"
	case in.Standby < fits:
		return fmt.Sprintf("tier at rest is %d, below the %d that fit", in.Standby, fits)
	case in.Standby < in.StandbySize && d.StandbyLimit != AtMaxReplicas:
		return fmt.Sprintf("tier at rest is short of its size with StandbyLimit %q", d.StandbyLimit)
	}
	return ""
}

// invariants are the safety properties checked at every simulated step.
func invariants(in Input, d Decision) string {
	switch {
	case vms(in) <= in.MaxReplicas && vmsAfter(in, d) > in.MaxReplicas:
		return "VMs exceed maxReplicas"
	case d.Removals() > in.Live()-in.Busy || d.RemoveIdle > in.Idle:
		return "removes more than the idle and stale claims"
	case d.Desired < in.Busy:
		return "desired below busy"
	case d.Activate+d.RemoveSurplusStandby > in.Standby:
		return "activates or removes more than the ready standby claims"
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
// TestPropertyRuleBeforeStandby: without a standby tier (every standby
// count zero), Plan decides what the rule before the tier decided, the
// standby fields of the decision zero.
func TestPropertyRuleBeforeStandby(t *testing.T) {
	checkProperty(t, func(in Input, _ Decision) string {
		in = withoutStandby(in)
		if got, want := Plan(in), ruleBeforeStandby(in); !sameDecision(got, want) {
			return fmt.Sprintf("without standby claims, %s\n  differs from the rule before the standby tier, which decides %s",
				describeDecision(in, got), describeDecision(in, want))
		}
		return ""
	})
}

// shortfall is the live claims the decision's desired asks for beyond
// those its removals leave.
func shortfall(in Input, d Decision) int { return max(d.Desired-(in.Live()-d.Removals()), 0) }

// Feature: hyperfleet-operator, Property 9: RunnerPool Scaling Behavior
//
// TestPropertyStandbyServesDemandFirst: warm first, standby next, cold
// last. Idle claims count in live, so only the shortfall beyond them is
// served; ready standby claims serve as much of it as they can, never
// more, and nothing is created while one of them could serve instead.
// Limit says why the shortfall is not met, naming what holds the room.
func TestPropertyStandbyServesDemandFirst(t *testing.T) {
	var cases, warm, cold, waiting int
	checkProperty(t, func(in Input, d Decision) string {
		cases++
		short := shortfall(in, d)
		switch {
		case d.Activate < 0:
			return "Activate is negative"
		case d.Activate > in.Standby:
			return "activates more standby claims than are ready"
		case d.Activate > short:
			return fmt.Sprintf("activates %d beyond the shortfall %d that idle claims leave", d.Activate, short)
		case d.Activate < min(short, in.Standby):
			return fmt.Sprintf("activates %d of %d ready standby claims for a shortfall of %d", d.Activate, in.Standby, short)
		case d.Create > 0 && d.Activate < in.Standby:
			return "creates while a ready standby claim could serve the shortfall"
		case d.Activate+d.Create > short:
			return "activations and creations exceed the shortfall"
		case d.Activate+d.Create < short && d.Limit == NotLimited:
			return "shortfall left unmet without a Limit"
		case d.Limit == WaitingForTermination && destroyed(in, d) == 0:
			return "WaitingForTermination with no VM being destroyed"
		case d.Limit == WaitingForTermination && d.Desired+in.StandbyBuilding > in.MaxReplicas-in.Retained:
			return "WaitingForTermination although desired does not fit beside the standby claims being built once those VMs are gone"
		case d.Limit == WaitingForStandby && d.Desired+in.StandbyBuilding <= in.MaxReplicas-in.Retained:
			return "WaitingForStandby although desired fits beside the standby claims being built"
		}
		if d.Activate > 0 && in.Idle > 0 {
			warm++
		}
		if d.Activate > 0 && d.Create > 0 {
			cold++
		}
		if d.Limit == WaitingForStandby {
			waiting++
		}
		return ""
	})
	if warm < cases/40 || cold < cases/40 || waiting < cases/200 {
		t.Errorf("generator drew %d inputs activating beside idle claims, %d activating and creating, %d waiting for standby claims of %d; want >= %d, %d, %d",
			warm, cold, waiting, cases, cases/40, cases/40, cases/200)
	}
}

// Feature: hyperfleet-operator, Property 9: RunnerPool Scaling Behavior
//
// TestPropertyStandbyRefillBehindDemand: the tier is refilled up to its
// size and no further, only once the live shortfall is met, and with all
// the room left; a refill cut short says why in StandbyLimit, and only
// there.
func TestPropertyStandbyRefillBehindDemand(t *testing.T) {
	var cases, refilled, cut int
	checkProperty(t, func(in Input, d Decision) string {
		cases++
		tier := in.Standby - d.Activate - d.RemoveSurplusStandby + in.StandbyBuilding
		need := max(in.StandbySize-tier, 0)
		// The VMs the tier at its size needs room beside: the live claims
		// after the decision, or desired when above them.
		fits := max(liveAfter(in, d), d.Desired) + in.StandbySize
		switch {
		case d.CreateStandby > need:
			return fmt.Sprintf("CreateStandby %d above the %d the tier of %d lacks", d.CreateStandby, need, tier)
		case d.CreateStandby > 0 && d.Activate+d.Create < shortfall(in, d):
			return "refills the tier while the live shortfall is unmet"
		case d.CreateStandby < need && vmsAfter(in, d) < in.MaxReplicas:
			return fmt.Sprintf("refill stops at %d of %d with room left under maxReplicas", d.CreateStandby, need)
		case (d.CreateStandby < need) != (d.StandbyLimit != NotLimited):
			return fmt.Sprintf("StandbyLimit %q for a refill of %d of %d", d.StandbyLimit, d.CreateStandby, need)
		case d.StandbyLimit == WaitingForTermination && destroyed(in, d) == 0:
			return "StandbyLimit WaitingForTermination with no VM being destroyed"
		case d.StandbyLimit == WaitingForTermination && fits > in.MaxReplicas-in.Retained:
			return "StandbyLimit WaitingForTermination although the tier does not fit beside the live claims once those VMs are gone"
		case d.StandbyLimit == AtMaxReplicas && fits <= in.MaxReplicas-in.Retained:
			return "StandbyLimit AtMaxReplicas although the tier fits beside the live claims"
		case d.StandbyLimit != NotLimited && d.StandbyLimit != AtMaxReplicas && d.StandbyLimit != WaitingForTermination:
			return fmt.Sprintf("StandbyLimit %q", d.StandbyLimit)
		}
		if d.CreateStandby > 0 {
			refilled++
		}
		if d.CreateStandby < need {
			cut++
		}
		return ""
	})
	if refilled < cases/40 || cut < cases/40 {
		t.Errorf("generator drew %d inputs refilling the tier and %d cutting the refill short of %d; want both >= %d", refilled, cut, cases, cases/40)
	}
}

// Feature: hyperfleet-operator, Property 9: RunnerPool Scaling Behavior
//
// TestPropertyStandbyRemovals: every stale and every expired standby claim
// is removed; a tier above its size loses ready claims that are not
// activated, down to its size and no further (building ones wait until
// ready).
func TestPropertyStandbyRemovals(t *testing.T) {
	var cases, surplus int
	checkProperty(t, func(in Input, d Decision) string {
		cases++
		ready := in.Standby - d.Activate - d.RemoveSurplusStandby
		tier := ready + in.StandbyBuilding
		switch {
		case d.RemoveStaleStandby != in.StaleStandby:
			return fmt.Sprintf("removes %d of %d stale standby claims", d.RemoveStaleStandby, in.StaleStandby)
		case d.RemoveExpiredStandby != in.ExpiredStandby:
			return fmt.Sprintf("removes %d of %d expired standby claims", d.RemoveExpiredStandby, in.ExpiredStandby)
		case d.RemoveSurplusStandby < 0 || ready < 0:
			return "removes more ready standby claims than are left after activation"
		case d.RemoveSurplusStandby > 0 && tier < in.StandbySize:
			return fmt.Sprintf("surplus removal takes the tier to %d, below its size %d", tier, in.StandbySize)
		case ready > 0 && tier > in.StandbySize:
			return fmt.Sprintf("keeps %d ready standby claims in a tier of %d above its size %d", ready, tier, in.StandbySize)
		}
		if d.RemoveSurplusStandby > 0 {
			surplus++
		}
		return ""
	})
	if surplus < cases/40 {
		t.Errorf("generator drew %d inputs removing surplus standby claims of %d; want >= %d", surplus, cases, cases/40)
	}
}

// Feature: hyperfleet-operator, Property 9: RunnerPool Scaling Behavior
//
// TestPropertyStandbyAtSizeChangesNothing: a tier at its size, all fresh,
// with no live shortfall, is a fixpoint: the decision is the one for the
// same pool without a tier.
func TestPropertyStandbyAtSizeChangesNothing(t *testing.T) {
	var cases, atSize int
	checkProperty(t, func(in Input, d Decision) string {
		cases++
		if in.StaleStandby+in.ExpiredStandby != 0 || in.Standby+in.StandbyBuilding != in.StandbySize || in.StandbySize == 0 || shortfall(in, d) > 0 {
			return ""
		}
		atSize++
		if bare := Plan(withoutStandby(in)); !sameDecision(d, bare) {
			return "a tier at its size with no shortfall changes the decision from " + describeDecision(in, bare)
		}
		return ""
	})
	if atSize < cases/40 {
		t.Errorf("generator drew %d inputs with a tier at its size and no shortfall of %d; want >= %d", atSize, cases, cases/40)
	}
}
