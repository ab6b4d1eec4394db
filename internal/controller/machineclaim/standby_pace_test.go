package machineclaim

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestResumePace: a resumed claim whose VM is still suspended looks again
// when the cluster's resumes have been taking (a first guess before any
// was seen), then every resumePoll; the pass that first finds the VM
// back learns how long the resume took, a quarter of the way from what
// was learnt before, per cluster; a claim not resuming is left alone.
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
		ph    provider.Phase
		after time.Duration
		want  time.Duration
	}{
		{"nothing learnt: the first guess", provider.PhaseSuspended, 300 * time.Millisecond, firstResumeGuess - 300*time.Millisecond},
		{"past the guess: polled", provider.PhaseSuspended, 2 * time.Second, resumePoll},
	} {
		if got := pass(claim(hfv1.ResumingReason), c.ph, c.after); got.After() != c.want {
			t.Errorf("%s: look again after %s, want %s", c.name, got.After(), c.want)
		}
	}
	// Back after 3 s: learnt; the next resume is looked at then.
	if got := pass(claim(hfv1.ResumingReason), provider.PhaseBooting, 3*time.Second); got.After() != standbyPoll {
		t.Errorf("the pass that finds the VM back keeps its own result, got %s", got.After())
	}
	if got := r.resumes.next(unitCluster, 0); got != 3*time.Second {
		t.Errorf("after a 3 s resume the next is looked at after %s, want 3s", got)
	}
	if got := r.resumes.next("another-cluster", 0); got != firstResumeGuess {
		t.Errorf("another cluster's first resume: %s, want the first guess %s", got, firstResumeGuess)
	}
	// A 7 s resume moves it a quarter of the way: 4 s.
	r.resumes.learn(unitCluster, 7*time.Second)
	if got := r.resumes.next(unitCluster, time.Second); got != 3*time.Second {
		t.Errorf("after 3 s and 7 s resumes, one second in: look after %s, want 3s (4 s learnt)", got)
	}
	// A later pass of the same claim (its condition no longer Resuming)
	// learns nothing; a claim not resuming keeps its result.
	before := r.resumes.next(unitCluster, 0)
	pass(claim(hfv1.BuildingVMReason), provider.PhaseRunning, time.Minute)
	if got := r.resumes.next(unitCluster, 0); got != before {
		t.Errorf("a later pass learnt again: %s, was %s", got, before)
	}
	cold := unitClaim("cold", 0)
	if got := pass(&cold, provider.PhaseSuspended, time.Second); got.After() != standbyPoll {
		t.Errorf("a claim that was never resumed: look after %s, want its own %s", got.After(), standbyPoll)
	}
}
