package stuck

import (
	"context"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
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

// TestReport: the detector counts a claim by its phase's verdict, records
// the warning event only for the pass the claim became stuck in, wakes the
// claim when it would become stuck, and forgets it once it moved on or
// finished. It never touches the claim's conditions (status.go sets
// Stuck).
func TestReport(t *testing.T) {
	events := record.NewFakeRecorder(10)
	d := &Detector{Recorder: events, Bounds: Bounds{Provisioning: 10 * time.Minute, Terminating: 5 * time.Minute}}
	c := unitClaim("report-" + strings.ToLower(t.Name()))
	c.Namespace = "stuck-report"
	gauge := func(p hfv1.MachineClaimPhase) float64 { return stuckGauge(t, p) }
	basePro, baseTerm := gauge(hfv1.MachineClaimProvisioning), gauge(hfv1.MachineClaimTerminating)
	ctx := context.Background()

	res := d.Report(ctx, &c, hfv1.MachineClaimProvisioning, Verdict{Since: unitEpoch, Wake: 6 * time.Minute}, "", ctrl.Result{RequeueAfter: time.Hour})
	if res.RequeueAfter != 6*time.Minute || len(events.Events) != 0 || gauge(hfv1.MachineClaimProvisioning) != basePro {
		t.Fatalf("before the bound: requeue %s, %d events, gauge %v", res.RequeueAfter, len(events.Events), gauge(hfv1.MachineClaimProvisioning))
	}
	if res := d.Report(ctx, &c, hfv1.MachineClaimProvisioning, Verdict{Since: unitEpoch, Wake: 6 * time.Minute}, "", ctrl.Result{RequeueAfter: time.Minute}); res.RequeueAfter != time.Minute {
		t.Fatalf("a sooner requeue of the pass must be kept: %s", res.RequeueAfter)
	}

	stuck := Verdict{Stuck: true, Since: unitEpoch}
	d.Report(ctx, &c, hfv1.MachineClaimProvisioning, stuck, "In phase Provisioning since ...", ctrl.Result{})
	for range 2 {
		// Later passes of the same stay: the condition is already True.
		d.Report(ctx, &c, hfv1.MachineClaimProvisioning, stuck, "", ctrl.Result{})
	}
	if len(events.Events) != 1 || !strings.HasPrefix(<-events.Events, "Warning Stuck In phase Provisioning") {
		t.Fatalf("want exactly one Stuck event, %d left", len(events.Events))
	}
	if got := gauge(hfv1.MachineClaimProvisioning); got != basePro+1 {
		t.Fatalf("hyperfleet_claims_stuck{phase=Provisioning} = %v, want %v", got, basePro+1)
	}
	if len(c.Status.Conditions) != 0 {
		t.Fatalf("the detector wrote conditions: %+v", c.Status.Conditions)
	}

	// Moves on: no longer counted.
	d.Report(ctx, &c, hfv1.MachineClaimTerminating, Verdict{Since: unitEpoch, Wake: 5 * time.Minute}, "", ctrl.Result{})
	if got := gauge(hfv1.MachineClaimProvisioning); got != basePro {
		t.Fatalf("Provisioning gauge %v after the claim moved on, want %v", got, basePro)
	}
	d.Report(ctx, &c, hfv1.MachineClaimTerminating, Verdict{Stuck: true, Since: unitEpoch}, "In phase Terminating since ...", ctrl.Result{})
	if got := gauge(hfv1.MachineClaimTerminating); got != baseTerm+1 || len(events.Events) != 1 {
		t.Fatalf("Terminating gauge %v (want %v), %d events (want 1)", got, baseTerm+1, len(events.Events))
	}
	// Finished: forgotten, whatever the verdict.
	if res := d.Report(ctx, &c, hfv1.MachineClaimFinished, Verdict{Wake: time.Minute}, "", ctrl.Result{}); res.RequeueAfter != 0 {
		t.Fatalf("a finished claim is woken after %s", res.RequeueAfter)
	}
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
