package controller

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/poolclaims"
)

// standbyPool is the pool world's pool with a standby tier of size.
func standbyPool(minReplicas, maxReplicas, size int32) *hfv1.RunnerPool {
	p := poolWorldPool(minReplicas, maxReplicas)
	p.Spec.Standby = &hfv1.Standby{Size: size, MaxAge: &metav1.Duration{Duration: 4 * time.Hour}}
	return p
}

// suspend plays the claim controller on a standby claim whose VM it
// suspended at the world's now.
func (w *poolWorld) suspend(c *hfv1.MachineClaim) {
	w.t.Helper()
	at := metav1.NewTime(w.clk.Now())
	c.Status.TemplateHash = "hash-1"
	c.Status.Standby = &hfv1.StandbyStatus{SuspendedAt: &at}
	w.updateClaimStatus(c)
}

// tier sorts the pool's claims by standby state: ready, building, taken
// (spec.standby cleared, not ended) and ended.
func (w *poolWorld) tier() (ready, building, taken, ended []*hfv1.MachineClaim) {
	w.t.Helper()
	for _, c := range w.sortedClaims() {
		switch {
		case c.Spec.End != nil:
			ended = append(ended, c)
		case stateOf(c) == poolclaims.StandbyReady:
			ready = append(ready, c)
		case stateOf(c) == poolclaims.StandbyBuilding:
			building = append(building, c)
		case c.Status.Standby != nil:
			taken = append(taken, c)
		}
	}
	return ready, building, taken, ended
}

// TestStandbyTierWarmFirstStandbyNextColdLast walks a pool's standby tier
// through its life: refilled to its size with no demand, taken for a job
// (no new VM for it) and refilled behind it, a burst larger than the tier
// served by the tier first and new VMs for the rest, the tier's VMs
// replaced when they reach maxAge and when the template changes; status,
// counts and the claims' spec as the pool writes them.
func TestStandbyTierWarmFirstStandbyNextColdLast(t *testing.T) {
	w := newPoolWorld(t, unitEpoch, standbyPool(0, 10, 2))
	w.pass()
	_, building, _, _ := w.tier()
	if len(building) != 2 || len(w.claims()) != 2 {
		t.Fatalf("a pool with standby.size 2 and no demand made %d claims, %d of them standby, want 2 standby", len(w.claims()), len(building))
	}
	for _, c := range building {
		if !c.Spec.Standby || c.Spec.RunnerPoolRef == nil {
			t.Fatalf("claim %s: spec.standby %v, runnerPoolRef %v; the pool makes its tier's claims with both", c.Name, c.Spec.Standby, c.Spec.RunnerPoolRef)
		}
		w.clk.Step(time.Second)
		w.suspend(c)
	}
	w.pass()
	if p := w.pool(); p.Status.Standby == nil || p.Status.Standby.Ready != 2 || p.Status.Standby.Size != 2 || len(w.claims()) != 2 {
		t.Fatalf("a full tier: status.standby %+v with %d claims, want 2 ready of size 2 and nothing created", p.Status.Standby, len(w.claims()))
	}
	if c := hfv1.FindCondition(w.pool().Status.Conditions, hfv1.RunnerPoolStandbyCondition); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("condition Standby %+v, want True", c)
	}

	// One job: the oldest standby VM is taken, no VM is created for it,
	// and the tier is refilled behind it.
	oldest, _, _, _ := w.tier()
	if err := w.c.Create(w.ctx(), poolWorldJob(1, hfv1.CIJobQueued, w.clk.Now())); err != nil {
		t.Fatal(err)
	}
	w.pass()
	ready, building, taken, _ := w.tier()
	if len(taken) != 1 || taken[0].Name != oldest[0].Name || len(ready) != 1 || len(building) != 1 || len(w.claims()) != 3 {
		t.Fatalf("one job: taken %v (oldest %s), ready %d, building %d, %d claims; want the oldest taken, one ready left, one refilling, nothing else made",
			names(taken), oldest[0].Name, len(ready), len(building), len(w.claims()))
	}
	if st := w.pool().Status; st.StartingReplicas != 1 || st.Standby.Resuming != 1 {
		t.Errorf("status: starting %d, standby %+v; want the taken VM starting and resuming", st.StartingReplicas, st.Standby)
	}
	w.suspend(building[0])

	// A burst of four more jobs: the two ready VMs are taken, two new
	// ones built for the rest, and the tier refilled behind them.
	for id := int64(2); id <= 5; id++ {
		if err := w.c.Create(w.ctx(), poolWorldJob(id, hfv1.CIJobQueued, w.clk.Now())); err != nil {
			t.Fatal(err)
		}
	}
	w.pass()
	ready, building, taken, _ = w.tier()
	cold := 0
	for _, c := range w.claims() {
		if c.Status.Standby == nil && !c.Spec.Standby {
			cold++
		}
	}
	if len(taken) != 3 || len(ready) != 0 || cold != 2 || len(building) != 2 {
		t.Fatalf("a burst of 4 more: taken %d (want 3), ready %d (0), new runners %d (2), refilling %d (2)", len(taken), len(ready), cold, len(building))
	}
	for _, c := range building {
		w.suspend(c)
	}

	// The jobs done: their claims go; the tier waits out its maxAge, then
	// is replaced.
	for _, c := range w.sortedClaims() {
		if !c.Spec.Standby {
			w.destroy(c)
		}
	}
	for _, j := range w.jobList() {
		if err := w.c.Delete(w.ctx(), &j); err != nil {
			t.Fatal(err)
		}
	}
	w.pass()
	w.clk.Step(4 * time.Hour)
	w.pass()
	_, _, _, ended := w.tier()
	if len(ended) != 2 {
		t.Fatalf("after maxAge: %d standby claims asked to end, want 2", len(ended))
	}
	for _, c := range ended {
		if c.Spec.End.Reason != hfv1.EndStandbyExpired {
			t.Errorf("claim %s ends for %s, want %s", c.Name, c.Spec.End.Reason, hfv1.EndStandbyExpired)
		}
	}
	w.endClaims()
	w.pass()
	if _, building, _, _ := w.tier(); len(building) != 2 {
		t.Fatalf("after the expired tier went: %d refilling, want 2", len(building))
	}
}

// TestStandbyTierDriftAndRefusal: a template change replaces the standby
// VMs (they are not runners: nothing waits for a job), and a template
// whose VMs attest with SPIRE gets no tier, with condition Standby False
// saying why.
func TestStandbyTierDriftAndRefusal(t *testing.T) {
	w := newPoolWorld(t, unitEpoch, standbyPool(0, 10, 1))
	w.pass()
	_, building, _, _ := w.tier()
	w.suspend(building[0])
	tmpl := &hfv1.HypervisorMachineTemplate{}
	if err := w.c.Get(w.ctx(), client.ObjectKey{Namespace: poolWorldNamespace, Name: "debian"}, tmpl); err != nil {
		t.Fatal(err)
	}
	tmpl.Status.TemplateHash = "hash-2"
	if err := w.c.Status().Update(w.ctx(), tmpl); err != nil {
		t.Fatal(err)
	}
	w.pass()
	_, _, _, ended := w.tier()
	if len(ended) != 1 || ended[0].Spec.End.Reason != hfv1.EndDriftReplaced {
		t.Fatalf("after a template change: ended %v, want the standby claim replaced (drift)", names(ended))
	}

	tmpl.Spec.Attestation.Method = hfv1.AttestationJoinToken
	if err := w.c.Update(w.ctx(), tmpl); err != nil {
		t.Fatal(err)
	}
	w.endClaims()
	before := len(w.claims())
	w.pass()
	w.clk.Step(time.Hour)
	w.pass()
	// The one refilled with the drift stays until its own controller
	// fails it (machineclaim/standby.go); no new one is made.
	if n := len(w.claims()); n != before {
		t.Errorf("a pool whose template attests made %d standby claims, want none", n-before)
	}
	c := hfv1.FindCondition(w.pool().Status.Conditions, hfv1.RunnerPoolStandbyCondition)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != string(hfv1.StandbyUnsupportedReason) {
		t.Errorf("condition Standby %+v, want False %s", c, hfv1.StandbyUnsupportedReason)
	}
}

func names(cs []*hfv1.MachineClaim) []string {
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}
