package scaling

import (
	"fmt"
	mrand "math/rand"
	"reflect"
	"testing"
	"testing/quick"
	"time"
)

// propertyCases is how many inputs each property draws.
const propertyCases = 2000

var baseNow = time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC)

// genInput is an Input drawn by testing/quick: small realistic counts,
// consistent bounds, and LowDemandSince nil, in the past or in the future
// of Now.
type genInput struct{ Input }

// count draws 0..40, biased towards zero and small values so that pools
// fitting under maxReplicas are common.
func count(r *mrand.Rand) int {
	switch r.Intn(3) {
	case 0:
		return 0
	case 1:
		return r.Intn(6)
	default:
		return r.Intn(41)
	}
}

func randomInput(r *mrand.Rand) Input {
	in := Input{MaxReplicas: 1 + r.Intn(60)}
	in.MinReplicas = r.Intn(in.MaxReplicas + 1)
	in.MinIdle = r.Intn(in.MaxReplicas + 1)
	if r.Intn(4) != 0 {
		in.ScaleDownDelay = time.Duration(r.Int63n(int64(10*time.Minute) + 1))
	}
	in.Pending = count(r)
	in.Starting, in.StaleStarting = count(r), count(r)
	in.Idle, in.StaleIdle = count(r), count(r)
	in.Busy = count(r)
	in.Terminating = count(r)
	in.Retained = count(r) / 4 // failed VMs kept for debugging are few
	in.Now = baseNow.Add(time.Duration(r.Int63n(int64(24 * time.Hour))))
	switch r.Intn(4) {
	case 0: // nil
	case 1, 2: // in the past, up to 15 minutes, sometimes exactly now
		t := in.Now.Add(-time.Duration(r.Int63n(int64(15*time.Minute) + 1)))
		if r.Intn(8) == 0 {
			t = in.Now
		}
		in.LowDemandSince = &t
	case 3: // in the future
		t := in.Now.Add(time.Duration(1 + r.Int63n(int64(10*time.Minute))))
		in.LowDemandSince = &t
	}
	return in
}

// Generate implements quick.Generator.
func (genInput) Generate(r *mrand.Rand, _ int) reflect.Value {
	return reflect.ValueOf(genInput{randomInput(r)})
}

// GoString is what quick.Check prints for a failing input.
func (g genInput) GoString() string { return describeInput(g.Input) }

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

// checkProperty runs prop over propertyCases generated inputs; prop
// returns an empty string when the property holds, otherwise what broke.
func checkProperty(t *testing.T, seed int64, cases int, prop func(Input, Decision) string) {
	t.Helper()
	f := func(g genInput) bool {
		d := Plan(g.Input)
		if msg := prop(g.Input, d); msg != "" {
			t.Errorf("%s\n  input:    %s\n  decision: %s", msg, describeInput(g.Input), describeDecision(g.Input, d))
			return false
		}
		return true
	}
	if err := quick.Check(f, &quick.Config{MaxCount: cases, Rand: mrand.New(mrand.NewSource(seed))}); err != nil {
		t.Error(err)
	}
}

// vms is the number of VMs that exist for the input (live, terminating
// and retained).
func vms(in Input) int { return in.Live() + in.Terminating + in.Retained }

// TestPropertyNeverAboveMax: the VMs after the decision (live claims left,
// created ones, terminating ones including the claims just removed, and
// retained ones) never exceed maxReplicas when they did not already; and
// nothing is created when they already reach it.
func TestPropertyNeverAboveMax(t *testing.T) {
	var under, over int
	checkProperty(t, 1, propertyCases, func(in Input, d Decision) string {
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
	if under < propertyCases/10 || over < propertyCases/10 {
		t.Errorf("generator drew %d inputs under maxReplicas and %d over; want both >= %d", under, over, propertyCases/10)
	}
}

// TestPropertyNeverBelowMin: removals never take the live claims below
// desired (beyond what drift replacement removes), and desired honours
// minReplicas within the ceiling left by retained VMs.
func TestPropertyNeverBelowMin(t *testing.T) {
	checkProperty(t, 2, propertyCases, func(in Input, d Decision) string {
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

// TestPropertyNeverRemovesBusy: every removal comes from a claim of the
// kind it names, busy claims are never removed, and desired keeps them.
func TestPropertyNeverRemovesBusy(t *testing.T) {
	checkProperty(t, 3, propertyCases, func(in Input, d Decision) string {
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

// TestPropertyScaleDownWaitsForDelay: surplus idle claims are removed only
// once demand stayed low for scaleDownDelay, counted from LowDemandSince
// (or from now when it is unset or in the future); while they wait,
// ScaleDownAt says until when.
func TestPropertyScaleDownWaitsForDelay(t *testing.T) {
	var removed, waiting int
	checkProperty(t, 4, propertyCases, func(in Input, d Decision) string {
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
	if removed < 50 || waiting < 50 {
		t.Errorf("generator drew %d inputs removing idle claims and %d waiting; want both >= 50", removed, waiting)
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

// TestPropertyConverges: with demand held constant, applying Plan's
// decisions reaches within 20 steps a pool of exactly desired live claims
// where Plan does nothing, and stays there.
func TestPropertyConverges(t *testing.T) {
	checkProperty(t, 5, 500, func(start Input, _ Decision) string {
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

// TestPropertyIdempotent: Plan is deterministic and leaves its input,
// LowDemandSince included, untouched.
func TestPropertyIdempotent(t *testing.T) {
	f := func(g genInput) bool {
		in := g.Input
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
		fail := func(msg string) bool {
			t.Errorf("%s\n  input:    %s\n  decision: %s", msg, describeInput(orig), describeDecision(orig, d1))
			return false
		}
		if !reflect.DeepEqual(d1, d2) || !reflect.DeepEqual(d1, d3) {
			return fail(fmt.Sprintf("Plan not deterministic: then %s, then %s", describeDecision(in, d2), describeDecision(in, d3)))
		}
		if in != orig {
			return fail("Plan changed its input")
		}
		if before != nil && !before.Equal(*in.LowDemandSince) {
			return fail(fmt.Sprintf("Plan changed the LowDemandSince it was given to Now%+v", in.LowDemandSince.Sub(in.Now)))
		}
		return true
	}
	if err := quick.Check(f, &quick.Config{MaxCount: propertyCases, Rand: mrand.New(mrand.NewSource(6))}); err != nil {
		t.Error(err)
	}
}
