package controller

import (
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/schedule"
)

// evaluateSchedules works out the pool's minimums now from
// spec.scaling.schedules (package schedule) into s.sched, reports them in
// status.schedule and condition SchedulesValid, and returns a result that
// wakes the pool when a window next opens or closes: the pool is requeued,
// never waited for.
func (r *RunnerPoolReconciler) evaluateSchedules(s *poolScope) phase.Result {
	pool := s.pool
	sc := pool.Spec.Scaling
	specs := make([]schedule.Spec, 0, len(sc.Schedules))
	for _, w := range sc.Schedules {
		specs = append(specs, schedule.Spec{Name: w.Name, Cron: w.Cron, TimeZone: w.TimeZone, Duration: w.Duration.Duration,
			MinReplicas: w.MinReplicas, MinIdle: w.MinIdle, Standby: w.Standby})
	}
	compiled, errs := schedule.Compile(specs, s.now)
	s.sched = schedule.Evaluate(s.now, sc.MinReplicas, ptrOr(sc.MinIdle, 0), compiled)
	st := &pool.Status
	if len(specs) == 0 {
		st.Schedule = nil
		meta.RemoveStatusCondition(&st.Conditions, string(hfv1.RunnerPoolSchedulesValidCondition))
		return phase.Next()
	}
	out := &hfv1.ScheduleStatus{EffectiveMinReplicas: s.sched.MinReplicas, EffectiveMinIdle: s.sched.MinIdle}
	for _, w := range s.sched.Active {
		out.ActiveWindows = append(out.ActiveWindows, hfv1.ActiveWindow{Name: w.Name, Start: metav1.NewTime(w.Start), End: metav1.NewTime(w.End)})
	}
	res := phase.Next()
	if !s.sched.NextChange.IsZero() {
		out.NextChange = &metav1.Time{Time: s.sched.NextChange}
		// A second late: the window is open (or closed) when the pool looks.
		res = res.Sooner(s.sched.NextChange.Sub(s.now) + time.Second)
	}
	st.Schedule = out
	if len(errs) == 0 {
		conditions.Set(&st.Conditions, pool.Generation, hfv1.RunnerPoolSchedulesValidCondition, metav1.ConditionTrue, hfv1.ReadyReason,
			fmt.Sprintf("%d schedules in use", len(compiled)))
		return res
	}
	msgs := make([]string, 0, len(errs))
	for _, err := range errs {
		var se *schedule.Error
		if errors.As(err, &se) {
			msgs = append(msgs, fmt.Sprintf("spec.scaling.schedules[%s]: %v", se.Name, se.Err))
		} else {
			msgs = append(msgs, err.Error())
		}
	}
	msg := conditions.Truncate(strings.Join(msgs, "; ")+"; these open no window until fixed", 1024)
	if old := hfv1.FindCondition(st.Conditions, hfv1.RunnerPoolSchedulesValidCondition); old == nil || old.Status != metav1.ConditionFalse || old.Message != msg {
		r.Recorder.Event(pool, corev1.EventTypeWarning, string(hfv1.ScheduleInvalidReason), msg)
	}
	conditions.Set(&st.Conditions, pool.Generation, hfv1.RunnerPoolSchedulesValidCondition, metav1.ConditionFalse, hfv1.ScheduleInvalidReason, msg)
	return res
}
