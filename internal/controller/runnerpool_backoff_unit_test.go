package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/poolclaims"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
)

func TestAttemptOf(t *testing.T) {
	at := func(d time.Duration) *metav1.Time { return &metav1.Time{Time: unitEpoch.Add(d)} }
	tests := []struct {
		name       string
		mut        func(*hfv1.MachineClaim)
		wantOK     bool
		wantFailed bool
		wantAt     time.Duration
		wantReason string
	}{
		{"starting: undecided", func(c *hfv1.MachineClaim) {
			c.Status.Phase, c.Status.PhaseTimes = hfv1.MachineClaimProvisioning, &hfv1.PhaseTimes{Provisioning: at(0)}
		}, false, false, 0, ""},
		{"runner online: success", func(c *hfv1.MachineClaim) {
			c.Status.Phase, c.Status.PhaseTimes = hfv1.MachineClaimReady, &hfv1.PhaseTimes{Ready: at(time.Minute)}
		}, true, false, time.Minute, ""},
		{"finished after its job: success at Ready", func(c *hfv1.MachineClaim) {
			c.Status.Phase, c.Status.PhaseTimes = hfv1.MachineClaimFinished, &hfv1.PhaseTimes{Ready: at(time.Minute), Finished: at(time.Hour)}
			c.Status.End = &hfv1.MachineClaimEnd{Reason: hfv1.EndJobCompleted, StartedAt: *at(time.Hour), FinishedAt: at(time.Hour)}
			c.Status.TerminationReason = "job_completed: done"
		}, true, false, time.Minute, ""},
		{"failed", func(c *hfv1.MachineClaim) {
			c.Status.Phase, c.Status.PhaseTimes = hfv1.MachineClaimFailed, &hfv1.PhaseTimes{Failed: at(2 * time.Minute)}
			c.Status.End = &hfv1.MachineClaimEnd{Reason: hfv1.EndBootstrapTimeout, Failed: true, StartedAt: *at(2 * time.Minute)}
			c.Spec.End = &hfv1.MachineClaimEndRequest{Reason: hfv1.EndBootstrapTimeout, Message: "the runner did not come online", Fail: true}
		}, true, true, 2 * time.Minute, "bootstrap_timeout"},
		{"powered off before its runner came online", func(c *hfv1.MachineClaim) {
			c.Status.Phase, c.Status.PhaseTimes = hfv1.MachineClaimTerminating, &hfv1.PhaseTimes{Terminating: at(3 * time.Minute)}
			c.Status.End = &hfv1.MachineClaimEnd{Reason: hfv1.EndPoweredOff, StartedAt: *at(3 * time.Minute)}
			c.Status.TerminationReason = "VMPoweredOff: VM 1000 powered off before it was ready"
		}, true, true, 3 * time.Minute, "VMPoweredOff"},
		{"removed by drift replacement: not counted", func(c *hfv1.MachineClaim) {
			c.Status.Phase, c.Status.PhaseTimes = hfv1.MachineClaimFinished, &hfv1.PhaseTimes{Finished: at(time.Minute)}
			c.Status.End = &hfv1.MachineClaimEnd{Reason: hfv1.EndDriftReplaced, StartedAt: *at(time.Minute), FinishedAt: at(time.Minute)}
			c.Status.TerminationReason = "drift_replaced: built from an older template"
		}, false, false, 0, ""},
		{"deleted by hand while starting: not counted", func(c *hfv1.MachineClaim) {
			c.Status.Phase, c.Status.PhaseTimes = hfv1.MachineClaimTerminating, &hfv1.PhaseTimes{Terminating: at(time.Minute)}
			c.Status.End = &hfv1.MachineClaimEnd{Reason: hfv1.EndDeleted, StartedAt: *at(time.Minute)}
		}, false, false, 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := unitClaim("c", 0, tc.mut)
			a, ok := attemptOf(&c)
			if ok != tc.wantOK || a.Failed != tc.wantFailed || (ok && !a.At.Equal(unitEpoch.Add(tc.wantAt))) || !strings.Contains(a.Reason, tc.wantReason) {
				t.Fatalf("attemptOf = %+v, %v", a, ok)
			}
			if ok && a.Failed && !strings.HasPrefix(a.Reason, "MachineClaim c: ") {
				t.Fatalf("reason %q does not name the claim", a.Reason)
			}
		})
	}
}

// TestBackoffSurvivesStatus: the state written to status.replacementBackoff
// and read back (a restarted operator) keeps the wait, and the claims shown
// again are not counted again.
func TestBackoffSurvivesStatus(t *testing.T) {
	b := scaling.DefaultBackoff()
	var attempts []scaling.Attempt
	for i, id := range []string{"a", "b", "c"} {
		attempts = append(attempts, scaling.Attempt{ID: id, At: unitEpoch.Add(time.Duration(i) * time.Second), Failed: true, Reason: "MachineClaim " + id + ": VMPoweredOff"})
	}
	s, _ := b.Observe(scaling.BackoffState{}, attempts)
	st := backoffStatus(s)
	if st == nil || st.ConsecutiveFailures != 3 || st.NextAttemptTime == nil || !st.NextAttemptTime.Time.Equal(unitEpoch.Add(2*time.Second+30*time.Second)) ||
		st.LastFailure != "MachineClaim c: VMPoweredOff" {
		t.Fatalf("status %+v", st)
	}
	restored := backoffState(st)
	again, n := b.Observe(restored, attempts)
	if n != 0 || again.Failures != 3 {
		t.Fatalf("after a restart the same claims counted %d more: %+v", n, again)
	}
	if _, waiting := again.Waiting(unitEpoch.Add(10 * time.Second)); !waiting {
		t.Fatal("a restarted operator does not keep waiting")
	}
	if backoffStatus(scaling.BackoffState{}) != nil {
		t.Fatal("a pool without outcomes gets a replacementBackoff status")
	}
}

// poweredOffAt makes a claim one whose VM powered off at off before its
// runner was seen online.
func poweredOffAt(off time.Time) func(*hfv1.MachineClaim) {
	return func(c *hfv1.MachineClaim) {
		c.Status.Phase, c.Status.PhaseTimes = hfv1.MachineClaimFinished, &hfv1.PhaseTimes{Finished: &metav1.Time{Time: off}}
		c.Status.End = &hfv1.MachineClaimEnd{Reason: hfv1.EndPoweredOff, StartedAt: metav1.Time{Time: off}, FinishedAt: &metav1.Time{Time: off}}
		c.Status.TerminationReason = "VMPoweredOff: powered off before it was ready"
	}
}

// TestShortJobIsNotABackoffFailure: a VM that registers, runs a short job
// and powers off before the operator saw its runner online is not a
// failure once a job record names its runner, and the pool waits
// jobRecordGrace for that record (keeping the claim from pruning) before it
// counts a VM powered off with no job as one.
func TestShortJobIsNotABackoffFailure(t *testing.T) {
	r := &RunnerPoolReconciler{Workloads: ciPlatforms, Recorder: record.NewFakeRecorder(16),
		Backoff: scaling.Backoff{Threshold: 1, Base: time.Hour, Cap: time.Hour}}
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "t"}}
	off := unitEpoch.Add(time.Minute)
	poweredOff := poweredOffAt(off)
	ran, silent := unitClaim("ran", 0, poweredOff), unitClaim("silent", 0, poweredOff)
	job := &hfv1.CIJob{Status: hfv1.CIJobStatus{RunnerName: vmspec.RunnerName(ciPlatforms, &ran, tmpl)}}
	pool := &hfv1.RunnerPool{}
	pass := func(now time.Time) (*poolScope, phase.Result) {
		v := &poolScope{pool: pool, tmpl: tmpl, now: now, undecided: map[types.UID]bool{},
			claims: &poolclaims.Claims{Finished: []*hfv1.MachineClaim{&ran, &silent}}, jobs: map[string]*hfv1.CIJob{"1": job}}
		res, err := r.observeAttempts(context.Background(), v)
		if err != nil {
			t.Fatal(err)
		}
		return v, res
	}

	v, res := pass(off.Add(5 * time.Second))
	if f := v.backoff.Failures; f != 0 {
		t.Fatalf("within the grace: %d failures, want 0 (%+v)", f, pool.Status.ReplacementBackoff)
	}
	if !v.undecided[silent.UID] || v.undecided[ran.UID] {
		t.Fatalf("undecided = %v, want only %s", v.undecided, silent.Name)
	}
	if want := jobRecordGrace - 5*time.Second; res.After() != want || res.Stopped() {
		t.Errorf("requeue = %s (stopped %v), want %s (when the grace ends)", res.After(), res.Stopped(), want)
	}

	v, _ = pass(off.Add(jobRecordGrace + time.Second))
	if f := v.backoff.Failures; f != 1 || !strings.Contains(v.backoff.LastFailure, "MachineClaim silent") {
		t.Fatalf("after the grace: %d failures (last %q), want 1 for claim silent", f, v.backoff.LastFailure)
	}
	if len(v.undecided) != 0 {
		t.Errorf("undecided after the grace = %v", v.undecided)
	}
}

// reportsOf is a JobReportSource for the claims named.
type reportsOf map[types.UID]bool

func (r reportsOf) JobStarted(uid types.UID, _ time.Time) bool { return r[uid] }

// TestJobReportsDoNotHoldReplacements: claims awaiting their job record
// hold replacements back, unless their VM's power-off notice said a job
// started; the report decides nothing: with no job record by the grace's
// end they are failures all the same.
func TestJobReportsDoNotHoldReplacements(t *testing.T) {
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "t"}}
	off := unitEpoch.Add(time.Minute)
	poweredOff := poweredOffAt(off)
	a, b, c := unitClaim("a", 0, poweredOff), unitClaim("b", 0, poweredOff), unitClaim("c", 0, poweredOff)
	for _, tc := range []struct {
		name    string
		reports reportsOf
		allowed int
	}{
		{"no reports: held", nil, 0},
		{"one report: two undecided left, under the threshold", reportsOf{a.UID: true}, 5},
		{"all reported", reportsOf{a.UID: true, b.UID: true, c.UID: true}, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &RunnerPoolReconciler{Workloads: ciPlatforms, Recorder: record.NewFakeRecorder(16),
				Backoff: scaling.Backoff{Threshold: 3, Base: time.Hour, Cap: time.Hour}}
			if tc.reports != nil {
				r.JobReports = tc.reports
			}
			pool := &hfv1.RunnerPool{}
			pass := func(now time.Time) *poolScope {
				v := &poolScope{pool: pool, tmpl: tmpl, now: now, undecided: map[types.UID]bool{}, vouched: map[types.UID]bool{},
					claims: &poolclaims.Claims{Finished: []*hfv1.MachineClaim{&a, &b, &c}}, jobs: map[string]*hfv1.CIJob{}}
				if _, err := r.observeAttempts(context.Background(), v); err != nil {
					t.Fatal(err)
				}
				return v
			}
			v := pass(off.Add(time.Second))
			if got, _ := r.allowedCreations(v, 5); got != tc.allowed {
				t.Fatalf("within the grace: %d creations allowed, want %d", got, tc.allowed)
			}
			if len(v.undecided) != 3 {
				t.Fatalf("undecided = %v, want all three", v.undecided)
			}
			v = pass(off.Add(jobRecordGrace + time.Second))
			if f := v.backoff.Failures; f != 3 {
				t.Fatalf("after the grace with no job record: %d failures, want 3", f)
			}
			if got, _ := r.allowedCreations(v, 5); got != 0 {
				t.Errorf("in backoff: %d creations allowed", got)
			}
		})
	}
}
