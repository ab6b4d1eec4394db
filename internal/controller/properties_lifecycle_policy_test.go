package controller

import (
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
)

// lifecycleClaim is one generated claim of property 10 and what the test
// knows of it: the instants its limits count from.
type lifecycleClaim struct {
	name string
	// created, provisioning (zero: still waiting for capacity),
	// registered (zero: not online) and jobStarted (zero: no job).
	created, provisioning, registered, jobStarted time.Time
	job                                           int64
}

// limitModel is the rule of the lifecycle limits for one claim
// (docs/architecture.md, "Lifecycle: labels, sweep, retention, stuck
// detection", and spec.lifecycle's field documentation), restated here
// rather than taken from scaling.Expired: maxLifetime counts from the
// claim's creation and ends it whatever it does; a busy claim is also
// bounded by jobTimeout from its job's start, an idle one by idleTimeout
// from its registration, one whose VM is being built by bootstrapTimeout
// from the start of provisioning. A zero limit is off. It returns the limit
// reached at now (maxLifetime first) and the earliest deadline not reached
// yet (zero: none).
func limitModel(c lifecycleClaim, l scaling.Limits, now time.Time) (scaling.Reason, time.Time) {
	type deadline struct {
		reason scaling.Reason
		at     time.Time
	}
	var ds []deadline
	if l.MaxLifetime > 0 {
		ds = append(ds, deadline{scaling.MaxLifetime, c.created.Add(l.MaxLifetime)})
	}
	switch {
	case !c.jobStarted.IsZero():
		if l.JobTimeout > 0 {
			ds = append(ds, deadline{scaling.JobTimeout, c.jobStarted.Add(l.JobTimeout)})
		}
	case !c.registered.IsZero():
		if l.IdleTimeout > 0 {
			ds = append(ds, deadline{scaling.IdleTimeout, c.registered.Add(l.IdleTimeout)})
		}
	case !c.provisioning.IsZero():
		if l.BootstrapTimeout > 0 {
			ds = append(ds, deadline{scaling.BootstrapTimeout, c.provisioning.Add(l.BootstrapTimeout)})
		}
	}
	var reached scaling.Reason
	var next time.Time
	for _, d := range ds {
		switch {
		case !now.Before(d.at):
			if reached == "" {
				reached = d.reason
			}
		case next.IsZero() || d.at.Before(next):
			next = d.at
		}
	}
	return reached, next
}

// drawLimit is a lifecycle limit: unset (the pool's default), off, or a
// few minutes (so that every kind of limit is reached in a short run).
func drawLimit(t *rapid.T, label string) (*metav1.Duration, time.Duration) {
	switch rapid.IntRange(0, 5).Draw(t, label+" kind") {
	case 0:
		return nil, 0
	case 1:
		return &metav1.Duration{}, 0
	default:
		d := time.Duration(rapid.IntRange(1, 40).Draw(t, label)) * time.Minute
		return &metav1.Duration{Duration: d}, d
	}
}

// Feature: hyperfleet-operator, Property 10: VM Lifecycle Policy Enforcement
//
// TestLifecyclePolicyProperty drives the RunnerPool reconciler (its whole
// pass, on the pool world of cheapworld_pool_test.go) over a pool whose
// spec.lifecycle sets each limit unset (the default), off or to a few
// minutes, and one to six claims in every state a limit applies to
// (waiting for capacity, provisioning, idle, busy) with their instants in
// the past. Time moves from deadline to deadline, as the pass's requeue
// asks; the test plays the claim controller, destroying the claims asked
// to end. At every pass:
//   - a claim is asked to end exactly when the model (limitModel) says a
//     limit is reached, with that limit as the reason: bootstrapTimeout,
//     idleTimeout, jobTimeout or maxLifetime, never another, and a
//     bootstrap timeout as a failure;
//   - a busy claim ended by a hard limit has its job cancelled first, and
//     no other job is cancelled;
//   - the pass asks to come back no later than the next deadline;
//   - the pool replaces what it ended: after the claim controller destroyed
//     the ended claims, the next pass brings the live claims back to
//     minReplicas (nothing else asks for VMs here).
//
// Mutation: enforceLifecycle (runnerpool_lifecycle.go) reporting every
// reached limit as maxLifetime (reached.Reason = scaling.MaxLifetime)
// fails this test (a claim past bootstrapTimeout ended for max_lifetime);
// the old test, over scaling.Expired alone, passed it.
// Mutation: enforceLifecycle skipping the busy claims (no check of
// pc.Busy) fails this test (a job past jobTimeout never ended); the old
// test passed it.
// Mutation: enforceLifecycle not asking to come back at the next
// deadline (res.Sooner(next...) removed) fails this test (a limit reached
// 1 s later waited for the pool's 30 s resync); the old test passed it.
func TestLifecyclePolicyProperty(t *testing.T) {
	seen := map[scaling.Reason]int{}
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		now := unitEpoch.Add(12 * time.Hour)
		var limits scaling.Limits
		var lc hfv1.Lifecycle
		lc.BootstrapTimeout, limits.BootstrapTimeout = drawLimit(rt, "bootstrapTimeout")
		lc.IdleTimeout, limits.IdleTimeout = drawLimit(rt, "idleTimeout")
		lc.JobTimeout, limits.JobTimeout = drawLimit(rt, "jobTimeout")
		lc.MaxLifetime, limits.MaxLifetime = drawLimit(rt, "maxLifetime")
		// The defaults of unset limits (poolclaims.Limits).
		for _, d := range []struct {
			set *metav1.Duration
			v   *time.Duration
			def time.Duration
		}{{lc.BootstrapTimeout, &limits.BootstrapTimeout, 10 * time.Minute}, {lc.IdleTimeout, &limits.IdleTimeout, 30 * time.Minute},
			{lc.JobTimeout, &limits.JobTimeout, 3 * time.Hour}, {lc.MaxLifetime, &limits.MaxLifetime, 6 * time.Hour}} {
			if d.set == nil {
				*d.v = d.def
			}
		}
		n := rapid.IntRange(1, 6).Draw(rt, "claims")
		pool := poolWorldPool(int32(n), int32(n+rapid.IntRange(0, 2).Draw(rt, "headroom")))
		pool.Spec.Lifecycle = lc
		ago := func(label string, before time.Time) time.Time {
			// Seconds apart, so that a deadline can fall inside the pool's
			// 30 s resync: the pass must ask for it, not rely on the resync.
			return before.Add(-time.Duration(rapid.IntRange(0, 45*60).Draw(rt, label)) * time.Second)
		}
		var objs []client.Object
		model := map[string]lifecycleClaim{}
		for i := range n {
			lcl := lifecycleClaim{name: fmt.Sprintf("claim-%d", i)}
			c := poolWorldClaim(pool, lcl.name, time.Time{})
			// Instants in order: created, provisioning, registered, job.
			state := rapid.SampledFrom([]string{"waiting", "provisioning", "idle", "busy"}).Draw(rt, lcl.name+" state")
			t := now
			if state == "busy" {
				lcl.jobStarted = ago(lcl.name+" job for", t)
				t = lcl.jobStarted
			}
			if state == "busy" || state == "idle" {
				lcl.registered = ago(lcl.name+" online for", t)
				t = lcl.registered
			}
			if state != "waiting" {
				lcl.provisioning = ago(lcl.name+" provisioning for", t)
				t = lcl.provisioning
			}
			lcl.created = ago(lcl.name+" waited for", t)
			c.CreationTimestamp = metav1.NewTime(lcl.created)
			if !lcl.provisioning.IsZero() {
				c.Status.PhaseTimes = &hfv1.PhaseTimes{Provisioning: &metav1.Time{Time: lcl.provisioning}}
			}
			if !lcl.registered.IsZero() {
				setOnline(c, metav1.NewTime(lcl.registered))
			}
			if !lcl.jobStarted.IsZero() {
				lcl.job = int64(1000 + i)
				setBusy(c, lcl.job, metav1.NewTime(lcl.jobStarted))
				objs = append(objs, poolWorldJob(lcl.job, hfv1.CIJobInProgress, lcl.jobStarted))
			}
			objs = append(objs, c)
			model[lcl.name] = lcl
		}
		w := newPoolWorld(rt, now, pool, objs...)
		// Deadline to deadline: at most one pass per generated instant
		// and limit, and a few for the replacements.
		for step := 0; step < 4*n+4 && len(model) > 0; step++ {
			at := w.clk.Now()
			res := w.pass()
			ended := w.endClaims()
			cancelled := w.jobs.takeCancelled()
			wantCancelled := []string{}
			next := time.Time{}
			for name, m := range model {
				want, nextAt := limitModel(m, limits, at)
				e := ended[name]
				switch {
				case want == "" && e != nil:
					rt.Fatalf("at %s claim %s (%s) was asked to end (%s: %s) before any limit %+v", at.Format(time.TimeOnly), name, describeLC(m), e.Reason, e.Message, limits)
				case want != "" && e == nil:
					rt.Fatalf("at %s claim %s (%s) reached %s (limits %+v) and was not asked to end", at.Format(time.TimeOnly), name, describeLC(m), want, limits)
				case want != "" && e.Reason != want:
					rt.Fatalf("at %s claim %s (%s) was ended for %s, want %s (limits %+v): %s", at.Format(time.TimeOnly), name, describeLC(m), e.Reason, want, limits, e.Message)
				case want != "" && e.Fail != (want == scaling.BootstrapTimeout):
					rt.Fatalf("claim %s ended for %s with fail=%v; a bootstrap timeout, and only it, is a failure", name, want, e.Fail)
				}
				if want != "" {
					seen[want]++
					if m.job != 0 && want.Hard() {
						wantCancelled = append(wantCancelled, strconv.FormatInt(m.job, 10))
					}
					delete(model, name)
					continue
				}
				if !nextAt.IsZero() && (next.IsZero() || nextAt.Before(next)) {
					next = nextAt
				}
			}
			slices.Sort(cancelled)
			slices.Sort(wantCancelled)
			if !slices.Equal(cancelled, wantCancelled) {
				rt.Fatalf("at %s jobs cancelled %v, want %v (the jobs of busy claims a hard limit ended)", at.Format(time.TimeOnly), cancelled, wantCancelled)
			}
			if !next.IsZero() && (res.RequeueAfter <= 0 || at.Add(res.RequeueAfter).After(next)) {
				rt.Fatalf("at %s the pass asks to come back in %s; the next limit is reached at %s", at.Format(time.TimeOnly), res.RequeueAfter, next.Format(time.TimeOnly))
			}
			// Replacement: the ended claims are gone; the next pass fills
			// the pool back to minReplicas.
			if len(ended) > 0 {
				w.pass()
				live := 0
				for name, c := range w.claims() {
					if ended[name] != nil {
						rt.Fatalf("claim %s was ended and destroyed but is listed again", name)
					}
					if isLive(c) || c.Spec.End != nil {
						live++
					}
				}
				if live != n {
					rt.Fatalf("after %d claims ended and were destroyed, the pool has %d claims, want minReplicas %d (each ended one replaced)", len(ended), live, n)
				}
				w.endClaims() // a replacement may itself be ended at once; not judged here
				w.jobs.takeCancelled()
			}
			if next.IsZero() {
				break
			}
			w.clk.SetTime(next)
		}
	})
	// Every limit must have been seen to end a claim (not under -short,
	// where rapid runs a fifth of the cases: too few to be sure of it).
	if testing.Short() {
		return
	}
	for _, r := range []scaling.Reason{scaling.BootstrapTimeout, scaling.IdleTimeout, scaling.JobTimeout, scaling.MaxLifetime} {
		if seen[r] == 0 {
			t.Errorf("no generated claim ended for %s (seen %v): the generator misses a limit", r, seen)
		}
	}
}

// describeLC describes a generated claim's instants.
func describeLC(m lifecycleClaim) string {
	s := "created " + m.created.Format(time.TimeOnly)
	for _, x := range []struct {
		what string
		at   time.Time
	}{{"provisioning", m.provisioning}, {"online", m.registered}, {"job", m.jobStarted}} {
		if !x.at.IsZero() {
			s += ", " + x.what + " " + x.at.Format(time.TimeOnly)
		}
	}
	return s
}
