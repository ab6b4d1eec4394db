package controller

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/poolclaims"
)

// TestPoolSchedules: a pool's working-hours window raises the minimums the
// scaling decision reads, status.schedule shows it, the pass asks to be
// woken just after the window closes; after it the base minimums are back
// and the wake-up is the next opening. An unusable schedule sets
// SchedulesValid False (one event per new message) while the others work;
// without schedules the status and the condition go.
func TestPoolSchedules(t *testing.T) {
	rec := record.NewFakeRecorder(16)
	r := &RunnerPoolReconciler{Recorder: rec}
	pool := &hfv1.RunnerPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "runners", Generation: 3},
		Spec: hfv1.RunnerPoolSpec{Scaling: hfv1.Scaling{MinReplicas: 1, MaxReplicas: 10, Schedules: []hfv1.ScalingSchedule{{
			Name: "working-hours", Cron: "0 8 * * 1-5", TimeZone: "Europe/Berlin", Duration: metav1.Duration{Duration: 10 * time.Hour},
			MinReplicas: ptr.To[int32](4), MinIdle: ptr.To[int32](3),
		}}}},
	}
	pass := func(now time.Time) (*poolScope, time.Duration) {
		s := &poolScope{pool: pool, now: now, claims: &poolclaims.Claims{}}
		res := r.evaluateSchedules(s)
		return s, res.After()
	}
	// unitEpoch is a Wednesday, 13:00 in Berlin.
	s, wake := pass(unitEpoch)
	in := s.scalingInput(0, 0, 0, 0)
	if in.MinReplicas != 4 || in.MinIdle != 3 {
		t.Errorf("in the window the decision reads min %d, minIdle %d; want 4, 3", in.MinReplicas, in.MinIdle)
	}
	// kubectl's Min column: the minimum the pool scales to now.
	if s.setCounts(); pool.Status.MinReplicas != 4 {
		t.Errorf("in the window status.minReplicas is %d, want the schedule's 4", pool.Status.MinReplicas)
	}
	closes := time.Date(2025, 1, 1, 17, 0, 0, 0, time.UTC)
	st := pool.Status.Schedule
	if st == nil || st.EffectiveMinReplicas != 4 || st.EffectiveMinIdle != 3 || len(st.ActiveWindows) != 1 || st.ActiveWindows[0].Name != "working-hours" ||
		!st.ActiveWindows[0].Start.Equal(&metav1.Time{Time: time.Date(2025, 1, 1, 7, 0, 0, 0, time.UTC)}) || !st.ActiveWindows[0].End.Time.Equal(closes) ||
		st.NextChange == nil || !st.NextChange.Time.Equal(closes) {
		t.Errorf("status.schedule %+v", st)
	}
	if want := closes.Sub(unitEpoch) + time.Second; wake != want {
		t.Errorf("wakes after %s, want %s (just after the window closes)", wake, want)
	}
	if c := hfv1.FindCondition(pool.Status.Conditions, hfv1.RunnerPoolSchedulesValidCondition); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("SchedulesValid %+v, want True", c)
	}

	s, wake = pass(closes)
	if in := s.scalingInput(0, 0, 0, 0); in.MinReplicas != 1 || in.MinIdle != 0 || len(pool.Status.Schedule.ActiveWindows) != 0 {
		t.Errorf("after the window: min %d, minIdle %d, windows %+v; want the base 1, 0 and none", in.MinReplicas, in.MinIdle, pool.Status.Schedule.ActiveWindows)
	}
	if s.setCounts(); pool.Status.MinReplicas != 1 {
		t.Errorf("after the window status.minReplicas is %d, want the spec's 1", pool.Status.MinReplicas)
	}
	if want := 14*time.Hour + time.Second; wake != want {
		t.Errorf("wakes after %s, want %s (Thursday 08:00 in Berlin)", wake, want)
	}

	pool.Spec.Scaling.Schedules = append(pool.Spec.Scaling.Schedules, hfv1.ScalingSchedule{Name: "mars", Cron: "0 8 * * *", TimeZone: "Mars/Olympus_Mons",
		Duration: metav1.Duration{Duration: time.Hour}, MinReplicas: ptr.To[int32](9)})
	for range 2 {
		s, _ = pass(unitEpoch)
	}
	c := hfv1.FindCondition(pool.Status.Conditions, hfv1.RunnerPoolSchedulesValidCondition)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != string(hfv1.ScheduleInvalidReason) || !strings.Contains(c.Message, `spec.scaling.schedules[mars]: timeZone "Mars/Olympus_Mons"`) {
		t.Errorf("SchedulesValid %+v, want False naming the schedule and its zone", c)
	}
	if s.sched.MinReplicas != 4 {
		t.Errorf("with one unusable schedule the others still work: min %d, want 4", s.sched.MinReplicas)
	}
	if n := len(rec.Events); n != 1 {
		t.Errorf("%d events for one unusable schedule over two passes, want 1", n)
	}

	pool.Spec.Scaling.Schedules = nil
	s, wake = pass(unitEpoch)
	if pool.Status.Schedule != nil || hfv1.FindCondition(pool.Status.Conditions, hfv1.RunnerPoolSchedulesValidCondition) != nil || wake != 0 || s.sched.MinReplicas != 1 {
		t.Errorf("without schedules: status %+v, conditions %+v, wake %s, min %d", pool.Status.Schedule, pool.Status.Conditions, wake, s.sched.MinReplicas)
	}
}
