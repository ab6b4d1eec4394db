package controller

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim"
	"github.com/hyperfleet/hyperfleet/internal/poolclaims"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testobjects"
)

// unitEpoch is the reference instant of the unit tests in this file.
var unitEpoch = time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)

// unitClaim is a bare claim named name, created at unitEpoch+age, changed
// by the mutators.
func unitClaim(name string, age time.Duration, mut ...func(*hfv1.MachineClaim)) hfv1.MachineClaim {
	c := hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{
		Name:              name,
		Namespace:         "default",
		UID:               types.UID("uid-" + name),
		CreationTimestamp: metav1.Time{Time: unitEpoch.Add(age)},
	}}
	for _, m := range mut {
		m(&c)
	}
	return c
}

// withPhase gives a claim the phase and the facts it is derived from
// (status.end for the phases of an ending claim).
func withPhase(p hfv1.MachineClaimPhase) func(*hfv1.MachineClaim) {
	return func(c *hfv1.MachineClaim) {
		c.Status.Phase = p
		e := testobjects.EndOf(p)
		if e == nil {
			return
		}
		if c.Status.End != nil {
			e.Reason, e.Message = c.Status.End.Reason, c.Status.End.Message
		}
		c.Status.End = e
	}
}

// withEndRequest is the claim's pool asking it to end (spec.end).
func withEndRequest(reason hfv1.EndReason, fail bool) func(*hfv1.MachineClaim) {
	return func(c *hfv1.MachineClaim) {
		c.Spec.End = &hfv1.MachineClaimEndRequest{Reason: reason, Message: "the test asks", Fail: fail}
	}
}

func withVM(c *hfv1.MachineClaim) {
	c.Status.VMRef = &hfv1.VMReference{HypervisorCluster: "pve", VMID: 100, Node: "n1"}
}

func withDeleting(c *hfv1.MachineClaim) {
	c.DeletionTimestamp = &metav1.Time{Time: unitEpoch}
	c.Finalizers = []string{hfv1.MachineClaimFinalizer}
}

func withJob(id int64) func(*hfv1.MachineClaim) {
	return func(c *hfv1.MachineClaim) {
		if c.Status.Bootstrap == nil {
			c.Status.Bootstrap = &hfv1.BootstrapStatus{RunnerName: c.Name}
		}
		c.Status.Bootstrap.JobID = id
	}
}

func withRunnerState(s hfv1.RunnerState) func(*hfv1.MachineClaim) {
	return func(c *hfv1.MachineClaim) {
		if c.Status.Bootstrap == nil {
			c.Status.Bootstrap = &hfv1.BootstrapStatus{RunnerName: c.Name}
		}
		c.Status.Bootstrap.RunnerState = s
	}
}

func withBootstrapped(status metav1.ConditionStatus) func(*hfv1.MachineClaim) {
	return func(c *hfv1.MachineClaim) {
		c.Status.Conditions = append(c.Status.Conditions, metav1.Condition{
			Type: string(hfv1.MachineClaimBootstrappedCondition), Status: status, Reason: string(hfv1.RunnerOnlineReason),
			LastTransitionTime: metav1.Time{Time: unitEpoch},
		})
	}
}

func withHash(h string) func(*hfv1.MachineClaim) {
	return func(c *hfv1.MachineClaim) { c.Status.TemplateHash = h }
}

// withEnd records how the claim ended (status.end, keeping whether it
// failed or finished) and the matching status.terminationReason.
func withEnd(reason hfv1.EndReason, msg string) func(*hfv1.MachineClaim) {
	return func(c *hfv1.MachineClaim) {
		if c.Status.End == nil {
			c.Status.End = &hfv1.MachineClaimEnd{}
		}
		c.Status.End.Reason, c.Status.End.Message = reason, msg
		c.Status.TerminationReason = string(reason) + ": " + msg
	}
}

// unitStateName names a poolclaims.State in failure messages.
func unitStateName(s poolclaims.State) string {
	switch s {
	case poolclaims.Starting:
		return "starting"
	case poolclaims.Idle:
		return "idle"
	case poolclaims.Busy:
		return "busy"
	case poolclaims.Terminating:
		return "terminating"
	case poolclaims.Retained:
		return "retained"
	case poolclaims.Finished:
		return "finished"
	case poolclaims.Deleted:
		return "deleted"
	}
	return "unknown"
}

// withFinishedLabel labels the claim finished (hyperfleet.io/finished), as
// the finalizer's removal of a finished claim does; withFinalizer gives it
// the claim controller's finalizer.
func withFinishedLabel(c *hfv1.MachineClaim) {
	c.Labels = map[string]string{hfv1.FinishedLabel: hfv1.FinishedLabelValue}
}

func withFinalizer(c *hfv1.MachineClaim) {
	c.Finalizers = append(c.Finalizers, hfv1.MachineClaimFinalizer)
}

func TestClaimStateOf(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mut     []func(*hfv1.MachineClaim)
		retains bool
		want    poolclaims.State
	}{
		{name: "new claim", want: poolclaims.Starting},
		{name: "provisioning", mut: []func(*hfv1.MachineClaim){withPhase(hfv1.MachineClaimProvisioning), withVM}, want: poolclaims.Starting},
		{name: "bootstrapped false", mut: []func(*hfv1.MachineClaim){withBootstrapped(metav1.ConditionFalse)}, want: poolclaims.Starting},
		{name: "runner offline", mut: []func(*hfv1.MachineClaim){withRunnerState(hfv1.RunnerStateOffline)}, want: poolclaims.Starting},
		{name: "finished", mut: []func(*hfv1.MachineClaim){withPhase(hfv1.MachineClaimFinished)}, want: poolclaims.Finished},
		{name: "finished retains", mut: []func(*hfv1.MachineClaim){withPhase(hfv1.MachineClaimFinished), withVM}, retains: true, want: poolclaims.Finished},
		{name: "finished while deleting", mut: []func(*hfv1.MachineClaim){withPhase(hfv1.MachineClaimFinished), withDeleting}, want: poolclaims.Finished},
		{name: "failed without VM", mut: []func(*hfv1.MachineClaim){withPhase(hfv1.MachineClaimFailed)}, want: poolclaims.Finished},
		{name: "failed without VM retains", mut: []func(*hfv1.MachineClaim){withPhase(hfv1.MachineClaimFailed)}, retains: true, want: poolclaims.Finished},
		{name: "failed with VM retains", mut: []func(*hfv1.MachineClaim){withPhase(hfv1.MachineClaimFailed), withVM}, retains: true, want: poolclaims.Retained},
		{name: "failed with VM", mut: []func(*hfv1.MachineClaim){withPhase(hfv1.MachineClaimFailed), withVM}, want: poolclaims.Terminating},
		{name: "failed with VM deleting retains", mut: []func(*hfv1.MachineClaim){withPhase(hfv1.MachineClaimFailed), withVM, withDeleting}, retains: true, want: poolclaims.Terminating},
		{name: "failed without VM deleting", mut: []func(*hfv1.MachineClaim){withPhase(hfv1.MachineClaimFailed), withDeleting}, want: poolclaims.Terminating},
		{name: "deletion timestamp", mut: []func(*hfv1.MachineClaim){withDeleting}, want: poolclaims.Terminating},
		{name: "deletion timestamp busy", mut: []func(*hfv1.MachineClaim){withDeleting, withJob(7)}, want: poolclaims.Terminating},
		{name: "terminating phase", mut: []func(*hfv1.MachineClaim){withPhase(hfv1.MachineClaimTerminating)}, want: poolclaims.Terminating},
		{name: "pool fails it", mut: []func(*hfv1.MachineClaim){withEndRequest(hfv1.EndBootstrapTimeout, true), withBootstrapped(metav1.ConditionTrue)}, want: poolclaims.Terminating},
		{name: "pool ends it", mut: []func(*hfv1.MachineClaim){withEndRequest(hfv1.EndIdleTimeout, false), withBootstrapped(metav1.ConditionTrue)}, want: poolclaims.Terminating},
		{name: "pool ends it busy", mut: []func(*hfv1.MachineClaim){withEndRequest(hfv1.EndMaxLifetime, false), withJob(3)}, want: poolclaims.Terminating},
		{name: "job id", mut: []func(*hfv1.MachineClaim){withJob(42)}, want: poolclaims.Busy},
		{name: "job id bootstrapped", mut: []func(*hfv1.MachineClaim){withJob(42), withBootstrapped(metav1.ConditionTrue)}, want: poolclaims.Busy},
		{name: "runner busy", mut: []func(*hfv1.MachineClaim){withRunnerState(hfv1.RunnerStateBusy)}, want: poolclaims.Busy},
		{name: "runner busy ready phase", mut: []func(*hfv1.MachineClaim){withPhase(hfv1.MachineClaimReady), withRunnerState(hfv1.RunnerStateBusy), withBootstrapped(metav1.ConditionTrue)}, want: poolclaims.Busy},
		{name: "bootstrapped", mut: []func(*hfv1.MachineClaim){withBootstrapped(metav1.ConditionTrue)}, want: poolclaims.Idle},
		{name: "bootstrapped runner idle", mut: []func(*hfv1.MachineClaim){withPhase(hfv1.MachineClaimReady), withRunnerState(hfv1.RunnerStateIdle), withBootstrapped(metav1.ConditionTrue)}, want: poolclaims.Idle},
		{name: "finished, its collection deletion on its way", mut: []func(*hfv1.MachineClaim){withJob(42), withBootstrapped(metav1.ConditionTrue), withFinishedLabel}, want: poolclaims.Deleted},
		{name: "labelled finished with its finalizer", mut: []func(*hfv1.MachineClaim){withJob(42), withFinishedLabel, withFinalizer}, want: poolclaims.Busy},
		{name: "draining idle", mut: []func(*hfv1.MachineClaim){withPhase(hfv1.MachineClaimDraining), withBootstrapped(metav1.ConditionTrue)}, want: poolclaims.Idle},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := unitClaim("c", 0, tc.mut...)
			if got := poolclaims.StateOf(&c, tc.retains); got != tc.want {
				t.Errorf("poolclaims.StateOf(retains=%v) = %s, want %s", tc.retains, unitStateName(got), unitStateName(tc.want))
			}
		})
	}
}

func unitNames(l []*hfv1.MachineClaim) string {
	n := make([]string, len(l))
	for i, c := range l {
		n[i] = c.Name
	}
	return strings.Join(n, ",")
}

func TestClassifyClaims(t *testing.T) {
	// Listed out of creation order so that sorting is visible.
	claims := []hfv1.MachineClaim{
		unitClaim("start-new", 5*time.Minute),
		unitClaim("idle-new", 4*time.Minute, withBootstrapped(metav1.ConditionTrue), withHash("old")),
		unitClaim("busy-new", 3*time.Minute, withJob(2), withHash("new")),
		unitClaim("start-old", 1*time.Minute, withHash("old")),
		unitClaim("idle-old", 0, withBootstrapped(metav1.ConditionTrue), withHash("new")),
		unitClaim("busy-old", -time.Minute, withRunnerState(hfv1.RunnerStateBusy), withHash("old")),
		unitClaim("fin-new", 2*time.Minute, withPhase(hfv1.MachineClaimFinished)),
		unitClaim("fin-old", -2*time.Minute, withPhase(hfv1.MachineClaimFailed)),
		unitClaim("ret-new", 6*time.Minute, withPhase(hfv1.MachineClaimFailed), withVM),
		unitClaim("ret-old", -3*time.Minute, withPhase(hfv1.MachineClaimFailed), withVM),
		unitClaim("term", 0, withDeleting, withHash("old")),
		unitClaim("start-mid", 2*time.Minute, withHash("")),
	}

	t.Run("buckets", func(t *testing.T) {
		pc := poolclaims.Classify(claims, "new", true)
		for _, b := range []struct {
			name string
			got  []*hfv1.MachineClaim
			want string
		}{
			{"starting", pc.Starting, "start-old,start-mid,start-new"},
			{"idle", pc.Idle, "idle-old,idle-new"},
			{"busy", pc.Busy, "busy-old,busy-new"},
			{"retained", pc.Retained, "ret-old,ret-new"},
			{"finished", pc.Finished, "fin-old,fin-new"},
			{"terminating", pc.Terminating, "term"},
		} {
			if got := unitNames(b.got); got != b.want {
				t.Errorf("%s = %q, want %q (oldest first)", b.name, got, b.want)
			}
		}
		// The buckets point into the caller's slice.
		if len(pc.Starting) > 0 && pc.Starting[0] != &claims[3] {
			t.Errorf("starting[0] is a copy, want a pointer into the claims slice")
		}
	})

	t.Run("retained without retention", func(t *testing.T) {
		pc := poolclaims.Classify(claims, "new", false)
		if len(pc.Retained) != 0 {
			t.Errorf("retained = %q, want none", unitNames(pc.Retained))
		}
		// Terminating is not sorted: compare as a set.
		names := strings.Split(unitNames(pc.Terminating), ",")
		slices.Sort(names)
		if got, want := strings.Join(names, ","), "ret-new,ret-old,term"; got != want {
			t.Errorf("terminating = %q, want %q", got, want)
		}
	})

	t.Run("stale", func(t *testing.T) {
		for _, tc := range []struct {
			hash string
			want []string
		}{
			// Only live claims (starting, idle, busy) count as stale.
			{hash: "new", want: []string{"idle-new", "start-old", "busy-old"}},
			{hash: "old", want: []string{"busy-new", "idle-old"}},
			{hash: "other", want: []string{"idle-new", "busy-new", "start-old", "idle-old", "busy-old"}},
			{hash: "", want: nil},
		} {
			pc := poolclaims.Classify(claims, tc.hash, true)
			want := map[types.UID]bool{}
			for _, n := range tc.want {
				want[types.UID("uid-"+n)] = true
			}
			if len(pc.Stale) != len(want) {
				t.Errorf("hash %q: %d stale claims %v, want %v", tc.hash, len(pc.Stale), pc.Stale, tc.want)
			}
			for uid := range want {
				if !pc.Stale[uid] {
					t.Errorf("hash %q: %s not stale, want stale", tc.hash, uid)
				}
			}
			for uid, v := range pc.Stale {
				if !v || !want[uid] {
					t.Errorf("hash %q: stale[%s] = %v, want absent", tc.hash, uid, v)
				}
			}
		}
	})

	t.Run("empty", func(t *testing.T) {
		pc := poolclaims.Classify(nil, "new", true)
		if pc.Stale == nil {
			t.Fatal("stale map is nil")
		}
		if n := len(pc.Starting) + len(pc.Idle) + len(pc.Busy) + len(pc.Terminating) + len(pc.Retained) + len(pc.Finished) + len(pc.Stale); n != 0 {
			t.Errorf("%d entries for no claims", n)
		}
	})
}

func TestExpectations(t *testing.T) {
	pool := types.NamespacedName{Namespace: "default", Name: "pool"}
	other := types.NamespacedName{Namespace: "default", Name: "other"}
	now := unitEpoch

	t.Run("empty", func(t *testing.T) {
		var e poolclaims.Expectations
		if !e.Satisfied(pool, e.Mark(), nil, now) {
			t.Error("no expectations: not satisfied")
		}
		e.Forget(pool) // no panic on a nil map
	})

	t.Run("created", func(t *testing.T) {
		var e poolclaims.Expectations
		e.Created(pool, "a", now)
		if e.Satisfied(pool, e.Mark(), nil, now) {
			t.Error("satisfied before the created claim is listed")
		}
		if e.Satisfied(pool, e.Mark(), []hfv1.MachineClaim{unitClaim("b", 0)}, now.Add(time.Second)) {
			t.Error("satisfied by another claim")
		}
		if !e.Satisfied(other, e.Mark(), nil, now) {
			t.Error("another pool is not satisfied")
		}
		if !e.Satisfied(pool, e.Mark(), []hfv1.MachineClaim{unitClaim("b", 0), unitClaim("a", 0)}, now.Add(time.Second)) {
			t.Error("not satisfied once the created claim is listed")
		}
		// Seen once is forgotten: a later list without it is fine.
		if !e.Satisfied(pool, e.Mark(), nil, now.Add(2*time.Second)) {
			t.Error("not satisfied after the expectation was met")
		}
	})

	t.Run("ended", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			listed []hfv1.MachineClaim
			want   bool
		}{
			{name: "still listed", listed: []hfv1.MachineClaim{unitClaim("x", 0, withBootstrapped(metav1.ConditionTrue))}, want: false},
			{name: "still listed busy", listed: []hfv1.MachineClaim{unitClaim("x", 0, withJob(1))}, want: false},
			{name: "gone", listed: []hfv1.MachineClaim{unitClaim("y", 0)}, want: true},
			{name: "gone empty list", want: true},
			{name: "deleting", listed: []hfv1.MachineClaim{unitClaim("x", 0, withDeleting)}, want: true},
			{name: "terminating phase", listed: []hfv1.MachineClaim{unitClaim("x", 0, withPhase(hfv1.MachineClaimTerminating))}, want: true},
			{name: "end requested", listed: []hfv1.MachineClaim{unitClaim("x", 0, withEndRequest(hfv1.EndScaledDown, false))}, want: true},
			{name: "fail requested", listed: []hfv1.MachineClaim{unitClaim("x", 0, withEndRequest(hfv1.EndBootstrapTimeout, true))}, want: true},
			{name: "failed retained", listed: []hfv1.MachineClaim{unitClaim("x", 0, withPhase(hfv1.MachineClaimFailed), withVM)}, want: true},
			{name: "failed without VM", listed: []hfv1.MachineClaim{unitClaim("x", 0, withPhase(hfv1.MachineClaimFailed))}, want: true},
			{name: "same name new uid", listed: []hfv1.MachineClaim{unitClaim("x", 0, func(c *hfv1.MachineClaim) { c.UID = "uid-x2" })}, want: true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				var e poolclaims.Expectations
				e.Ended(pool, "uid-x", now)
				if got := e.Satisfied(pool, e.Mark(), tc.listed, now.Add(time.Second)); got != tc.want {
					t.Errorf("satisfied = %v, want %v", got, tc.want)
				}
			})
		}
	})

	t.Run("created and ended", func(t *testing.T) {
		var e poolclaims.Expectations
		e.Created(pool, "a", now)
		e.Ended(pool, "uid-x", now)
		x := unitClaim("x", 0, withBootstrapped(metav1.ConditionTrue))
		if e.Satisfied(pool, e.Mark(), []hfv1.MachineClaim{x}, now) {
			t.Error("satisfied with neither write shown")
		}
		if e.Satisfied(pool, e.Mark(), []hfv1.MachineClaim{x, unitClaim("a", 0)}, now) {
			t.Error("satisfied with the end not shown")
		}
		// The create was forgotten when shown; only the end remains.
		if !e.Satisfied(pool, e.Mark(), []hfv1.MachineClaim{unitClaim("x", 0, withDeleting)}, now) {
			t.Error("not satisfied with both writes shown")
		}
	})

	t.Run("timeout", func(t *testing.T) {
		var e poolclaims.Expectations
		e.Created(pool, "a", now)
		e.Ended(pool, "uid-x", now)
		x := unitClaim("x", 0)
		if e.Satisfied(pool, e.Mark(), []hfv1.MachineClaim{x}, now.Add(poolclaims.ExpectationTimeout)) {
			t.Error("satisfied at exactly poolclaims.ExpectationTimeout")
		}
		if !e.Satisfied(pool, e.Mark(), []hfv1.MachineClaim{x}, now.Add(time.Hour)) {
			t.Error("expired expectations still block")
		}
		if !e.Satisfied(pool, e.Mark(), []hfv1.MachineClaim{x}, now) {
			t.Error("expired expectations came back")
		}
	})

	// A claim whose whole life fits between two of the pool's looks never
	// shows in a list: the cache's announcement satisfies its creation,
	// whether it comes before the create call returned or after.
	t.Run("observed", func(t *testing.T) {
		var e poolclaims.Expectations
		e.Created(pool, "a", now)
		e.Observed(pool, "a", now)
		if !e.Satisfied(pool, e.Mark(), nil, now.Add(time.Second)) {
			t.Error("a created claim the cache announced (and that is gone) still blocks")
		}
		e.Observed(pool, "b", now)
		e.Created(pool, "b", now)
		if !e.Satisfied(pool, e.Mark(), nil, now.Add(time.Second)) {
			t.Error("a claim announced before its creation was recorded still blocks")
		}
		e.Created(pool, "c", now)
		e.Observed(other, "c", now)
		if e.Satisfied(pool, e.Mark(), nil, now.Add(time.Second)) {
			t.Error("another pool's announcement satisfied this pool")
		}
		// Names announced for claims the pool did not create are
		// forgotten in time, and never block.
		var f poolclaims.Expectations
		f.Observed(pool, "foreign", now)
		if !f.Satisfied(pool, f.Mark(), nil, now) {
			t.Error("an announced claim the pool did not create blocks")
		}
		if !f.Satisfied(pool, f.Mark(), nil, now.Add(time.Hour)) {
			t.Error("not satisfied once the announcement expired")
		}
		f.Created(pool, "foreign", now.Add(time.Hour))
		if f.Satisfied(pool, f.Mark(), nil, now.Add(time.Hour)) {
			t.Error("an expired announcement satisfied a later creation")
		}
	})

	// The pool lists its claims, then the cache announces one it created
	// (the list did not have it), then the pool checks: the list decides,
	// and an announcement after the mark does not stand in for it.
	t.Run("announced after the list", func(t *testing.T) {
		var e poolclaims.Expectations
		e.Created(pool, "a", now)
		e.Created(pool, "b", now)
		mark := e.Mark()
		listed := []hfv1.MachineClaim{unitClaim("a", 0)} // b not in the cache yet
		e.Observed(pool, "b", now)
		if e.Satisfied(pool, mark, listed, now) {
			t.Error("an announcement that came after the list satisfied a creation the list lacks")
		}
		// The next pass's mark is after the announcement: b was in the
		// cache then, listed or gone since.
		if !e.Satisfied(pool, e.Mark(), nil, now) {
			t.Error("an announcement before the mark does not satisfy the creation")
		}
	})

	t.Run("forget", func(t *testing.T) {
		var e poolclaims.Expectations
		e.Created(pool, "a", now)
		e.Created(other, "b", now)
		e.Forget(pool)
		if !e.Satisfied(pool, e.Mark(), nil, now) {
			t.Error("forgotten pool not satisfied")
		}
		if e.Satisfied(other, e.Mark(), nil, now) {
			t.Error("Forget dropped another pool's expectations")
		}
	})
}

func TestOutcomeOf(t *testing.T) {
	failedAt := func(c *hfv1.MachineClaim) { c.Status.End.Failed = true }
	for _, tc := range []struct {
		name string
		mut  []func(*hfv1.MachineClaim)
		want scaling.Reason
	}{
		{name: "idle timeout", mut: []func(*hfv1.MachineClaim){withEnd(hfv1.EndIdleTimeout, "idle for 30m")}, want: scaling.IdleTimeout},
		{name: "job timeout", mut: []func(*hfv1.MachineClaim){withEnd(hfv1.EndJobTimeout, "x"), withJob(4)}, want: scaling.JobTimeout},
		{name: "drift replaced", mut: []func(*hfv1.MachineClaim){withEnd(hfv1.EndDriftReplaced, "x")}, want: scaling.DriftReplaced},
		{name: "scaled down", mut: []func(*hfv1.MachineClaim){withEnd(hfv1.EndScaledDown, "x")}, want: scaling.ScaledDown},
		{name: "max lifetime", mut: []func(*hfv1.MachineClaim){withEnd(hfv1.EndMaxLifetime, "x")}, want: scaling.MaxLifetime},
		{name: "job completed", mut: []func(*hfv1.MachineClaim){withEnd(hfv1.EndJobCompleted, "job 4 finished"), withJob(4)}, want: scaling.JobCompleted},
		{name: "orphaned", mut: []func(*hfv1.MachineClaim){withEnd(hfv1.EndOrphaned, "x")}, want: scaling.Orphaned},
		{name: "bootstrap timeout failed", mut: []func(*hfv1.MachineClaim){withEnd(hfv1.EndBootstrapTimeout, "x"), withPhase(hfv1.MachineClaimFailed)}, want: scaling.BootstrapTimeout},
		{name: "failed", mut: []func(*hfv1.MachineClaim){withEnd(hfv1.EndFailed, "clone failed"), withPhase(hfv1.MachineClaimFailed)}, want: scaling.Failed},
		{name: "failed without reason", mut: []func(*hfv1.MachineClaim){withPhase(hfv1.MachineClaimFailed)}, want: scaling.Failed},
		{name: "failed earlier", mut: []func(*hfv1.MachineClaim){withEnd(hfv1.EndDeleted, "x"), withPhase(hfv1.MachineClaimTerminating), failedAt}, want: scaling.Failed},
		{name: "failed after a job", mut: []func(*hfv1.MachineClaim){withEnd(hfv1.EndPoweredOff, "x"), withJob(4), withPhase(hfv1.MachineClaimFailed)}, want: scaling.Failed},
		{name: "powered off after job", mut: []func(*hfv1.MachineClaim){withEnd(hfv1.EndPoweredOff, "VM 100 powered off"), withJob(4)}, want: scaling.JobCompleted},
		{name: "gone after job", mut: []func(*hfv1.MachineClaim){withEnd(hfv1.EndPoweredOff, "VM 100 is gone"), withJob(4)}, want: scaling.JobCompleted},
		{name: "deleted after job", mut: []func(*hfv1.MachineClaim){withEnd(hfv1.EndDeleted, "x"), withJob(4)}, want: scaling.JobCompleted},
		{name: "powered off", mut: []func(*hfv1.MachineClaim){withEnd(hfv1.EndPoweredOff, "VM 100 powered off")}, want: scaling.PoweredOff},
		{name: "powered off busy runner without job", mut: []func(*hfv1.MachineClaim){withEnd(hfv1.EndPoweredOff, "x"), withRunnerState(hfv1.RunnerStateBusy)}, want: scaling.PoweredOff},
		{name: "gone", mut: []func(*hfv1.MachineClaim){withEnd(hfv1.EndPoweredOff, "VM 100 is gone")}, want: scaling.PoweredOff},
		{name: "deleted", mut: []func(*hfv1.MachineClaim){withEnd(hfv1.EndDeleted, "by hand")}, want: scaling.Deleted},
		{name: "no reason", want: scaling.Deleted},
		{name: "unknown code", mut: []func(*hfv1.MachineClaim){withEnd(hfv1.EndReason("whatever"), "x")}, want: scaling.Deleted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := unitClaim("c", 0, tc.mut...)
			if got := machineclaim.Outcome(&c); got != tc.want {
				t.Errorf("machineclaim.Outcome(%q) = %q, want %q", c.Status.TerminationReason, got, tc.want)
			}
		})
	}
}

// conditionReasonRE is metav1.Condition's reason pattern.
var conditionReasonRE = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)

// TestEndConditionReasons: every end reason a pool may request (the
// spec.end enum) and every one the claim records has its own condition
// reason, and each is a valid one.
func TestEndConditionReasons(t *testing.T) {
	seen := map[string]hfv1.EndReason{}
	for _, r := range []hfv1.EndReason{scaling.JobCompleted, scaling.IdleTimeout, scaling.MaxLifetime, scaling.JobTimeout, scaling.BootstrapTimeout,
		scaling.DriftReplaced, scaling.ScaledDown, scaling.Orphaned, scaling.Failed, scaling.PoweredOff, scaling.Deleted} {
		got := r.ConditionReason()
		if got == hfv1.EndedReason || !conditionReasonRE.MatchString(string(got)) {
			t.Errorf("%s.ConditionReason() = %q", r, got)
		}
		if other, dup := seen[string(got)]; dup {
			t.Errorf("%s and %s share condition reason %s", r, other, got)
		}
		seen[string(got)] = r
	}
	if got := hfv1.EndReason("made_up").ConditionReason(); got != hfv1.EndedReason {
		t.Errorf("unknown reason: %q, want %s", got, hfv1.EndedReason)
	}
}

func TestHardEnd(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  []func(*hfv1.MachineClaim)
		want bool
	}{
		{name: "max lifetime", mut: []func(*hfv1.MachineClaim){withEndRequest(hfv1.EndMaxLifetime, false)}, want: true},
		{name: "job timeout", mut: []func(*hfv1.MachineClaim){withEndRequest(hfv1.EndJobTimeout, false)}, want: true},
		{name: "idle timeout", mut: []func(*hfv1.MachineClaim){withEndRequest(hfv1.EndIdleTimeout, false)}, want: false},
		{name: "scaled down", mut: []func(*hfv1.MachineClaim){withEndRequest(hfv1.EndScaledDown, false)}, want: false},
		{name: "ended for a hard reason without a request", mut: []func(*hfv1.MachineClaim){withEnd(hfv1.EndMaxLifetime, "x")}, want: false},
		{name: "none", want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := unitClaim("c", 0, tc.mut...)
			if got := c.HardEnd(); got != tc.want {
				t.Errorf("HardEnd() = %v, want %v", got, tc.want)
			}
		})
	}
}
