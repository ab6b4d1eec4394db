package stuck

import (
	"context"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
)

func TestCheck(t *testing.T) {
	bounds := Bounds{Pending: time.Minute, Provisioning: 10 * time.Minute, Terminating: 5 * time.Minute}
	at := func(d time.Duration) *metav1.Time { return &metav1.Time{Time: unitEpoch.Add(d)} }
	tests := []struct {
		name      string
		phase     hfv1.MachineClaimPhase
		times     *hfv1.PhaseTimes
		now       time.Duration
		wantStuck bool
		wantWake  time.Duration
	}{
		{"within the bound", hfv1.MachineClaimProvisioning, &hfv1.PhaseTimes{Provisioning: at(0)}, 9 * time.Minute, false, time.Minute},
		{"at the bound", hfv1.MachineClaimProvisioning, &hfv1.PhaseTimes{Provisioning: at(0)}, 10 * time.Minute, true, 0},
		{"counted from the current phase's entry", hfv1.MachineClaimProvisioning, &hfv1.PhaseTimes{Pending: at(0), Provisioning: at(30 * time.Minute)}, 35 * time.Minute, false, 5 * time.Minute},
		{"past the Pending bound", hfv1.MachineClaimPending, &hfv1.PhaseTimes{Pending: at(0)}, 2 * time.Minute, true, 0},
		{"a phase without a bound", hfv1.MachineClaimBootstrapping, &hfv1.PhaseTimes{Bootstrapping: at(0)}, 24 * time.Hour, false, 0},
		{"Ready is never stuck", hfv1.MachineClaimReady, &hfv1.PhaseTimes{Ready: at(0)}, 24 * time.Hour, false, 0},
		{"no phase times", hfv1.MachineClaimPending, nil, time.Hour, false, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := unitClaim("c")
			c.Status.Phase, c.Status.PhaseTimes = tc.phase, tc.times
			got := Check(&c, tc.phase, bounds, unitEpoch.Add(tc.now))
			if got.Stuck != tc.wantStuck || got.Wake != tc.wantWake {
				t.Fatalf("Check = %+v, want stuck %v wake %s", got, tc.wantStuck, tc.wantWake)
			}
		})
	}
}

// TestMark follows one claim through phases on a fake clock: the
// condition names the phase and what the claim waits on, the event comes
// once per stay, the gauge counts it by phase, and a claim that moves on
// is no longer counted.
func TestMark(t *testing.T) {
	clk := clocktesting.NewFakeClock(unitEpoch)
	events := record.NewFakeRecorder(10)
	d := &Detector{Recorder: events, Bounds: Bounds{Provisioning: 10 * time.Minute, Terminating: 5 * time.Minute}}
	c := unitClaim("stuck-" + strings.ToLower(t.Name()))
	c.Namespace = "stuck-test"
	c.Status.Phase = hfv1.MachineClaimProvisioning
	c.Status.PhaseTimes = &hfv1.PhaseTimes{Provisioning: &metav1.Time{Time: unitEpoch}}
	c.Status.Task = &hfv1.TaskReference{ID: "UPID:pve1:0001:clone", Operation: "clone"}
	meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{Type: string(hfv1.MachineClaimProvisionedCondition), Status: metav1.ConditionFalse,
		Reason: string(hfv1.CloningReason), Message: "cloning from template 9000"})
	gauge := func(p hfv1.MachineClaimPhase) float64 { return stuckGauge(t, p) }
	basePro, baseTerm := gauge(hfv1.MachineClaimProvisioning), gauge(hfv1.MachineClaimTerminating)
	ctx := context.Background()

	clk.Step(4 * time.Minute)
	res := d.Mark(ctx, &c, c.Status.Phase, clk.Now(), ctrl.Result{RequeueAfter: time.Hour})
	if res.RequeueAfter != 6*time.Minute || hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimStuckCondition) != nil {
		t.Fatalf("before the bound: requeue %s, conditions %+v", res.RequeueAfter, c.Status.Conditions)
	}

	clk.Step(6 * time.Minute)
	for range 3 {
		d.Mark(ctx, &c, c.Status.Phase, clk.Now(), ctrl.Result{})
	}
	cond := hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimStuckCondition)
	if cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != string(hfv1.NoProgressReason) ||
		!strings.Contains(cond.Message, "In phase Provisioning") || !strings.Contains(cond.Message, "clone (UPID:pve1:0001:clone)") ||
		!strings.Contains(cond.Message, "Cloning: cloning from template 9000") {
		t.Fatalf("Stuck = %+v", cond)
	}
	if len(events.Events) != 1 || !strings.HasPrefix(<-events.Events, "Warning Stuck In phase Provisioning") {
		t.Fatalf("want exactly one Stuck event, %d left", len(events.Events))
	}
	if got := gauge(hfv1.MachineClaimProvisioning); got != basePro+1 {
		t.Fatalf("hyperfleet_claims_stuck{phase=Provisioning} = %v, want %v", got, basePro+1)
	}

	// Moves on: no longer stuck, no longer counted.
	c.Status.Phase = hfv1.MachineClaimTerminating
	c.Status.PhaseTimes.Terminating = &metav1.Time{Time: clk.Now()}
	d.Mark(ctx, &c, c.Status.Phase, clk.Now(), ctrl.Result{})
	if cond := hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimStuckCondition); cond.Status != metav1.ConditionFalse || cond.Reason != string(hfv1.ProgressingReason) {
		t.Fatalf("after progress: Stuck = %+v", cond)
	}
	if got := gauge(hfv1.MachineClaimProvisioning); got != basePro {
		t.Fatalf("Provisioning gauge %v after the claim moved on, want %v", got, basePro)
	}

	// Stuck again in a later phase: a new event for the new stay.
	clk.Step(5 * time.Minute)
	d.Mark(ctx, &c, c.Status.Phase, clk.Now(), ctrl.Result{})
	if len(events.Events) != 1 || !strings.HasPrefix(<-events.Events, "Warning Stuck In phase Terminating") {
		t.Fatal("no Stuck event for the stay in Terminating")
	}
	if got := gauge(hfv1.MachineClaimTerminating); got != baseTerm+1 {
		t.Fatalf("Terminating gauge %v, want %v", got, baseTerm+1)
	}
	// Finished: forgotten.
	c.Status.Phase = hfv1.MachineClaimFinished
	d.Mark(ctx, &c, c.Status.Phase, clk.Now(), ctrl.Result{})
	if got := gauge(hfv1.MachineClaimTerminating); got != baseTerm {
		t.Fatalf("Terminating gauge %v after the claim finished, want %v", got, baseTerm)
	}
}

// TestStuckGaugeReset: setting the controller up puts every bounded phase's
// gauge at zero (the series exist before any claim is stuck) and forgets
// the claims counted before; phases without a bound get no series from it.
func TestStuckGaugeReset(t *testing.T) {
	gauge := func(p hfv1.MachineClaimPhase) float64 { return stuckGauge(t, p) }
	var s Detector
	key := types.NamespacedName{Namespace: "stuck-reset", Name: "c"}
	s.Set(key, hfv1.MachineClaimDraining, true)
	if got := gauge(hfv1.MachineClaimDraining); got != 1 {
		t.Fatalf("Draining gauge %v with one stuck claim, want 1", got)
	}
	metrics.ClaimsStuck.DeleteLabelValues(string(hfv1.MachineClaimPending))
	s.Bounds = Bounds{Draining: time.Hour}
	s.Reset()
	if got := gauge(hfv1.MachineClaimDraining); got != 0 {
		t.Fatalf("Draining gauge %v after reset, want 0", got)
	}
	if s.m != nil {
		t.Fatalf("stuck claims after reset: %v", s.m)
	}
	if metrics.ClaimsStuck.DeleteLabelValues(string(hfv1.MachineClaimPending)) {
		t.Fatal("reset created a series for Pending, which has no bound")
	}
	// Forgotten: the claim moving on changes nothing.
	s.Set(key, hfv1.MachineClaimDraining, false)
	if got := gauge(hfv1.MachineClaimDraining); got != 0 {
		t.Fatalf("Draining gauge %v, want 0", got)
	}
}

// stuckGauge reads hyperfleet_claims_stuck{phase}.
func stuckGauge(t *testing.T, p hfv1.MachineClaimPhase) float64 {
	t.Helper()
	var m dto.Metric
	if err := metrics.ClaimsStuck.WithLabelValues(string(p)).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

var unitEpoch = time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)

// unitClaim is a claim created at unitEpoch.
func unitClaim(name string) hfv1.MachineClaim {
	return hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name),
		CreationTimestamp: metav1.Time{Time: unitEpoch}}}
}
