package machineclaim

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/pace"
)

// TestResumePace: a resumed claim whose VM is still suspended looks again
// as the cluster's resumes pace it (pkg/provider/pace: before anything is
// learnt, soon and then a quarter of the time so far; once learnt, just
// before the typical end); the pass that first finds the VM back learns
// how long the resume took, per cluster; a later pass, or a claim not
// resuming, is left alone.
func TestResumePace(t *testing.T) {
	r, _, clk, _ := serviceWorld(t)
	resumedAt := metav1.NewTime(clk.Now())
	claim := func(reason hfv1.ConditionReason) *hfv1.MachineClaim {
		c := unitClaim("resumed", 0)
		c.Status.Standby = &hfv1.StandbyStatus{SuspendedAt: &resumedAt, ResumedAt: &resumedAt}
		c.Status.Conditions = []metav1.Condition{{Type: string(hfv1.MachineClaimProvisionedCondition), Status: metav1.ConditionFalse, Reason: string(reason)}}
		return &c
	}
	pass := func(c *hfv1.MachineClaim, ph provider.Phase, after time.Duration) phase.Result {
		t.Helper()
		clk.SetTime(resumedAt.Add(after))
		s := &claimScope{claim: c, claimEnv: r.env(), storedConditions: c.Status.Conditions}
		return r.paceResume(s, unitCluster, &provider.EnsureResult{Phase: ph}, phase.StopAndRequeue(standbyPoll))
	}
	for _, c := range []struct {
		name  string
		after time.Duration
		want  time.Duration
	}{
		{"nothing learnt, just asked", 0, pace.MinPoll},
		{"nothing learnt, 4 s in: a quarter of that", 4 * time.Second, time.Second},
	} {
		if got := pass(claim(hfv1.ResumingReason), provider.PhaseSuspended, c.after); !got.Stopped() || got.After() != c.want {
			t.Errorf("%s: look again after %s, want %s", c.name, got.After(), c.want)
		}
	}
	// Back after 3 s: learnt; the next resume is looked at just before.
	if got := pass(claim(hfv1.ResumingReason), provider.PhaseBooting, 3*time.Second); got.After() != standbyPoll {
		t.Errorf("the pass that finds the VM back keeps its own result, got %s", got.After())
	}
	learnt := r.resumes.Next(unitCluster, 0)
	if learnt < 2500*time.Millisecond || learnt >= 3*time.Second {
		t.Errorf("after a 3 s resume the next is looked at after %s, want just before 3 s", learnt)
	}
	if got := pass(claim(hfv1.ResumingReason), provider.PhaseSuspended, 3*time.Second); got.After() != pace.NearPoll {
		t.Errorf("a resume due: look again after %s, want %s", got.After(), pace.NearPoll)
	}
	if got := r.resumes.Next("another-cluster", 0); got != pace.MinPoll {
		t.Errorf("another cluster's first resume: %s, want %s (nothing learnt there)", got, pace.MinPoll)
	}
	// A later pass of the same claim (its condition no longer Resuming)
	// learns nothing; a claim never resumed keeps its result.
	pass(claim(hfv1.BuildingVMReason), provider.PhaseRunning, time.Minute)
	if got := r.resumes.Next(unitCluster, 0); got != learnt {
		t.Errorf("a later pass learnt again: %s, was %s", got, learnt)
	}
	cold := unitClaim("cold", 0)
	if got := pass(&cold, provider.PhaseSuspended, time.Second); got.After() != standbyPoll {
		t.Errorf("a claim never resumed: look after %s, want its own %s", got.After(), standbyPoll)
	}
}
