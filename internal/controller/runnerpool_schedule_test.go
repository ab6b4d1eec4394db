package controller_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// TestRunnerPoolSchedule: a pool whose base minimum is zero grows to its
// schedule's two warm runners when the window opens (Europe/Berlin wall
// clock) and shrinks back to none after it closes, woken by its own
// requeue at each change. The operator's clock is moved forward to just
// before each change; a touch of the pool then makes it look once, and
// the change itself needs no event.
func TestRunnerPoolSchedule(t *testing.T) {
	clk := &shiftedClock{}
	w := startPoolWorld(t, poolWorldOptions{clock: clk})
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	open := clk.Now().Truncate(time.Minute).Add(10 * time.Minute).In(berlin)
	const window = 2 * time.Minute
	pool := w.newPool("sched", func(p *hfv1.RunnerPool) {
		p.Spec.Scaling.Schedules = []hfv1.ScalingSchedule{{
			Name: "burst", TimeZone: "Europe/Berlin", Duration: metav1.Duration{Duration: window}, MinIdle: ptr.To[int32](2),
			Cron: fmt.Sprintf("%d %d %d %d *", open.Minute(), open.Hour(), open.Day(), int(open.Month())),
		}}
	})
	w.waitPool(pool, "the window's opening in status, nothing built", 30*time.Second, func(p *hfv1.RunnerPool) error {
		if st := p.Status.Schedule; st == nil || st.NextChange == nil || !st.NextChange.Time.Equal(open) || len(st.ActiveWindows) != 0 || st.EffectiveMinIdle != 0 || p.Status.Replicas != 0 {
			return fmt.Errorf("schedule %+v, replicas %d", st, p.Status.Replicas)
		}
		if !hfv1.IsConditionTrue(p.Status.Conditions, hfv1.RunnerPoolSchedulesValidCondition) {
			return fmt.Errorf("SchedulesValid %+v", hfv1.FindCondition(p.Status.Conditions, hfv1.RunnerPoolSchedulesValidCondition))
		}
		return nil
	})

	start := time.Now()
	clk.advance(open.Add(-3 * time.Second).Sub(clk.Now()))
	touch(t, pool)
	w.waitPool(pool, "two warm runners in the window", 120*time.Second, func(p *hfv1.RunnerPool) error {
		st := p.Status.Schedule
		if st == nil || len(st.ActiveWindows) != 1 || st.EffectiveMinIdle != 2 || !st.ActiveWindows[0].End.Time.Equal(open.Add(window)) {
			return fmt.Errorf("schedule %+v", st)
		}
		if p.Status.IdleReplicas != 2 {
			return fmt.Errorf("idle %d, starting %d", p.Status.IdleReplicas, p.Status.StartingReplicas)
		}
		return nil
	})
	t.Logf("the window opened and two runners registered in %s", time.Since(start).Round(time.Second))

	if left := open.Add(window).Sub(clk.Now()); left > 3*time.Second {
		clk.advance(left - 3*time.Second)
	}
	touch(t, pool)
	w.waitPool(pool, "no VM after the window", 60*time.Second, func(p *hfv1.RunnerPool) error {
		st := p.Status.Schedule
		if st == nil || len(st.ActiveWindows) != 0 || st.EffectiveMinIdle != 0 || st.NextChange == nil || !st.NextChange.After(open.Add(window)) {
			return fmt.Errorf("schedule %+v", st)
		}
		if p.Status.Replicas != 0 {
			return fmt.Errorf("replicas %d (idle %d)", p.Status.Replicas, p.Status.IdleReplicas)
		}
		return nil
	})
}

// touch changes an annotation of the pool, which makes its controller
// look at it once.
func touch(t *testing.T, pool *hfv1.RunnerPool) {
	t.Helper()
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{"test.hyperfleet.io/touched":%q}}}`, strconv.FormatInt(time.Now().UnixNano(), 10))
	if err := env.Client.Patch(context.Background(), pool.DeepCopy(), client.RawPatch("application/merge-patch+json", patch)); err != nil {
		t.Fatal(err)
	}
}
