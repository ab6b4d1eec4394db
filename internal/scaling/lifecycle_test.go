package scaling

import (
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
)

func TestExpired(t *testing.T) {
	t0 := baseNow
	m := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Minute) }
	all := Limits{BootstrapTimeout: 10 * time.Minute, IdleTimeout: 15 * time.Minute, JobTimeout: 60 * time.Minute, MaxLifetime: 120 * time.Minute}
	busy := ClaimTimes{Created: m(0), Provisioning: m(1), Registered: m(5), JobStarted: m(20)}
	idle := ClaimTimes{Created: m(0), Provisioning: m(1), Registered: m(5)}
	booting := ClaimTimes{Created: m(0), Provisioning: m(30)}
	for _, tc := range []struct {
		name        string
		c           ClaimTimes
		l           Limits
		now         time.Time
		reached     Expiry
		nextAt      time.Time
		ignoresNext bool // the doc leaves next unspecified once a limit is reached
	}{
		{name: "maxLifetime beats a job timeout reached earlier", c: busy, l: Limits{JobTimeout: 10 * time.Minute, MaxLifetime: 60 * time.Minute},
			now: m(200), reached: Expiry{MaxLifetime, m(60)}},
		{name: "maxLifetime beats an idle timeout", c: idle, l: all, now: m(121), reached: Expiry{MaxLifetime, m(120)}},
		{name: "maxLifetime beats a bootstrap timeout", c: booting, l: all, now: m(130), reached: Expiry{MaxLifetime, m(120)}},
		{name: "maxLifetime reached exactly at its deadline", c: ClaimTimes{Created: m(0)}, l: all, now: m(120), reached: Expiry{MaxLifetime, m(120)}},
		{name: "maxLifetime needs a creation time", c: ClaimTimes{}, l: all, now: m(1000)},

		{name: "busy judged by jobTimeout, not idle or bootstrap", c: busy, l: all, now: m(40), nextAt: m(80)},
		{name: "busy reaches jobTimeout", c: busy, l: all, now: m(80), reached: Expiry{JobTimeout, m(80)}, ignoresNext: true},
		{name: "busy with jobTimeout disabled has only maxLifetime", c: busy, l: Limits{IdleTimeout: time.Minute, BootstrapTimeout: time.Minute, MaxLifetime: 120 * time.Minute},
			now: m(100), nextAt: m(120)},
		{name: "busy with jobTimeout disabled and no maxLifetime never expires", c: busy, l: Limits{IdleTimeout: time.Minute, BootstrapTimeout: time.Minute}, now: m(1000)},

		{name: "idle judged by idleTimeout", c: idle, l: all, now: m(19), nextAt: m(20)},
		{name: "idle reaches idleTimeout", c: idle, l: all, now: m(20), reached: Expiry{IdleTimeout, m(20)}, ignoresNext: true},
		{name: "idle ignores bootstrapTimeout and jobTimeout", c: idle, l: Limits{BootstrapTimeout: time.Minute, JobTimeout: time.Minute}, now: m(1000)},

		{name: "never registered reaches bootstrapTimeout from provisioning", c: booting, l: all, now: m(40), reached: Expiry{BootstrapTimeout, m(40)}, ignoresNext: true},
		{name: "bootstrapTimeout is not counted from creation", c: booting, l: all, now: m(35), nextAt: m(40)},
		{name: "a claim not provisioning yet never bootstrap-times-out", c: ClaimTimes{Created: m(0)}, l: Limits{BootstrapTimeout: time.Minute}, now: m(1000)},
		{name: "a claim not provisioning yet still has maxLifetime", c: ClaimTimes{Created: m(0)}, l: all, now: m(60), nextAt: m(120)},

		{name: "next is the earliest future deadline: idle first", c: idle, l: all, now: m(10), nextAt: m(20)},
		{name: "next is the earliest future deadline: maxLifetime first", c: idle, l: Limits{IdleTimeout: 3 * time.Hour, MaxLifetime: 2 * time.Hour}, now: m(10), nextAt: m(120)},
		{name: "a passed jobTimeout is reached before maxLifetime", c: busy, l: Limits{JobTimeout: 30 * time.Minute, MaxLifetime: 120 * time.Minute},
			now: m(60), reached: Expiry{JobTimeout, m(50)}, ignoresNext: true},

		{name: "zero limits are disabled", c: busy, l: Limits{}, now: m(100000)},
		{name: "zero limits are disabled for idle", c: idle, l: Limits{}, now: m(100000)},
		{name: "zero limits are disabled for booting", c: booting, l: Limits{}, now: m(100000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reached, next := Expired(tc.c, tc.l, tc.now)
			if reached.Reason != tc.reached.Reason || !reached.At.Equal(tc.reached.At) {
				t.Errorf("reached = %v at %v, want %v at %v", reached.Reason, reached.At, tc.reached.Reason, tc.reached.At)
			}
			if next.Reason != "" {
				t.Errorf("next has a reason %q", next.Reason)
			}
			if !tc.ignoresNext && !next.At.Equal(tc.nextAt) {
				t.Errorf("next at %v, want %v", next.At, tc.nextAt)
			}
		})
	}
}

func TestReasonHard(t *testing.T) {
	for _, r := range []Reason{JobCompleted, IdleTimeout, MaxLifetime, JobTimeout, BootstrapTimeout, DriftReplaced,
		ScaledDown, Orphaned, Failed, PoweredOff, Deleted, "", "MAX_LIFETIME", "job_timeout "} {
		if want := r == "max_lifetime" || r == "job_timeout"; r.Hard() != want {
			t.Errorf("Reason(%q).Hard() = %v, want %v", r, r.Hard(), want)
		}
	}
}

// genClaim is a claim, its pool's limits and an instant: each time is zero
// or after the previous one, each limit zero or up to three hours.
type genClaim struct {
	c   ClaimTimes
	l   Limits
	now time.Time
}

var claims = rapid.Custom(func(rt *rapid.T) genClaim {
	t := baseNow
	later := func(label string) time.Time {
		t = t.Add(time.Duration(rapid.Int64Range(0, int64(time.Hour)-1).Draw(rt, label)))
		return t
	}
	limit := func(label string) time.Duration {
		if rapid.IntRange(0, 3).Draw(rt, label+" set") == 0 {
			return 0
		}
		return time.Duration(rapid.Int64Range(1, int64(3*time.Hour)).Draw(rt, label))
	}
	var g genClaim
	if rapid.IntRange(0, 7).Draw(rt, "created set") != 0 {
		g.c.Created = later("created")
	}
	// A claim goes through the phases in order and stops at any of them.
	phases := rapid.IntRange(0, 3).Draw(rt, "phases")
	if phases >= 1 {
		g.c.Provisioning = later("provisioning")
	}
	if phases >= 2 {
		g.c.Registered = later("registered")
	}
	if phases >= 3 {
		g.c.JobStarted = later("jobStarted")
	}
	if rapid.IntRange(0, 9).Draw(rt, "drop provisioning") == 0 { // out-of-order or partial times: Expired must still be total
		g.c.Provisioning = time.Time{}
	}
	g.l = Limits{BootstrapTimeout: limit("bootstrapTimeout"), IdleTimeout: limit("idleTimeout"), JobTimeout: limit("jobTimeout"), MaxLifetime: limit("maxLifetime")}
	g.now = baseNow.Add(time.Duration(rapid.Int64Range(0, int64(8*time.Hour)-1).Draw(rt, "now")))
	return g
})

func (g genClaim) GoString() string {
	rel := func(x time.Time) string {
		if x.IsZero() {
			return "zero"
		}
		return fmt.Sprintf("t0%+v", x.Sub(baseNow))
	}
	return fmt.Sprintf("claim{Created:%s Provisioning:%s Registered:%s JobStarted:%s} %+v now=%s",
		rel(g.c.Created), rel(g.c.Provisioning), rel(g.c.Registered), rel(g.c.JobStarted), g.l, rel(g.now))
}

// Feature: hyperfleet-operator, Property 10: VM Lifecycle Policy Enforcement
//
// TestPropertyExpired: a reached limit is in the past of now, the next
// deadline in its future, the reason is the limit reached (maxLifetime
// when it is, else the one of the claim's phase), and only maxLifetime and
// jobTimeout are hard. The operator's enforcement of the limits (the
// RunnerPool reconciler ending and replacing claims) is
// internal/controller's TestLifecyclePolicyProperty.
//
// Mutation: Expired reporting every reached limit as maxLifetime fails
// this test; before the check of the phase's own limit it passed.
func TestPropertyExpired(t *testing.T) {
	var cases, reachedN, nextN int
	proptest.Check(t, propertyCases, func(rt *rapid.T) {
		g := claims.Draw(rt, "claim")
		cases++
		reached, next := Expired(g.c, g.l, g.now)
		fail := func(msg string) {
			rt.Fatalf("%s\n  input: %#v\n  reached=%+v next=%+v", msg, g, reached, next)
		}
		if reached.Reason != "" {
			reachedN++
			if reached.At.After(g.now) {
				fail("reached in the future")
			}
		} else if !reached.At.IsZero() {
			fail("reached has a time but no reason")
		}
		if !next.At.IsZero() {
			nextN++
			if !next.At.After(g.now) {
				fail("next deadline not after now")
			}
		}
		if next.Reason != "" {
			fail("next has a reason")
		}
		if reached.Reason.Hard() != (reached.Reason == MaxLifetime || reached.Reason == JobTimeout) {
			fail("Hard() wrong")
		}
		// The reason must apply to the claim's phase.
		var phase Reason
		switch {
		case !g.c.JobStarted.IsZero():
			phase = JobTimeout
		case !g.c.Registered.IsZero():
			phase = IdleTimeout
		case !g.c.Provisioning.IsZero():
			phase = BootstrapTimeout
		}
		if reached.Reason != "" && reached.Reason != MaxLifetime && reached.Reason != phase {
			fail(fmt.Sprintf("reason %q does not apply to a claim in phase %q", reached.Reason, phase))
		}
		// maxLifetime wins whenever it is reached.
		if ml := g.c.Created.Add(g.l.MaxLifetime); g.l.MaxLifetime > 0 && !g.c.Created.IsZero() && !g.now.Before(ml) &&
			(reached.Reason != MaxLifetime || !reached.At.Equal(ml)) {
			fail("maxLifetime reached but not reported")
		}
		// Otherwise the limit of the claim's phase is the one reported, at
		// its deadline, when it is reached; and nothing when no limit is.
		mlReached := g.l.MaxLifetime > 0 && !g.c.Created.IsZero() && !g.now.Before(g.c.Created.Add(g.l.MaxLifetime))
		var from time.Time
		var limit time.Duration
		switch phase {
		case JobTimeout:
			from, limit = g.c.JobStarted, g.l.JobTimeout
		case IdleTimeout:
			from, limit = g.c.Registered, g.l.IdleTimeout
		case BootstrapTimeout:
			from, limit = g.c.Provisioning, g.l.BootstrapTimeout
		}
		phaseReached := limit > 0 && !g.now.Before(from.Add(limit))
		switch {
		case mlReached:
		case phaseReached && (reached.Reason != phase || !reached.At.Equal(from.Add(limit))):
			fail(fmt.Sprintf("%s reached at %s but reported %q at %s", phase, from.Add(limit), reached.Reason, reached.At))
		case !phaseReached && reached.Reason != "":
			fail(fmt.Sprintf("no limit reached but %q reported", reached.Reason))
		}
	})
	if reachedN < cases/20 || nextN < cases/20 {
		t.Errorf("generator drew %d claims with a reached limit and %d with a next deadline of %d; want both >= %d", reachedN, nextN, cases, cases/20)
	}
}
