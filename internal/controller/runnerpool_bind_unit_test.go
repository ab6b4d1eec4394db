package controller

import (
	"context"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/poolclaims"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
)

// TestWarmClaimsBoundToQueuedJobs: a Buildkite pool binds its queued jobs,
// oldest first, to its warm claims standing by (Bootstrapped, reason
// WaitingForJob), oldest first, by writing their jobID: a stale claim, one
// near its idle deadline and one already bound are not bound, a bound claim
// counts as starting rather than idle, and the jobs left get claims of their
// own. A pass whose cache does not show the binds yet binds none of those
// jobs again, to another claim or a new one, and cannot rebind the claims
// (their resourceVersion moved on); once the cache shows them, the
// expectations go.
func TestWarmClaimsBoundToQueuedJobs(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := hfv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	const (
		j0 = "0190a3b2-0000-4000-8000-000000000000"
		j1 = "0190a3b2-0000-4000-8000-000000000001"
		j2 = "0190a3b2-0000-4000-8000-000000000002"
		j3 = "0190a3b2-0000-4000-8000-000000000003"
	)
	pool := &hfv1.RunnerPool{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "bk", UID: "pool-uid"},
		Spec: hfv1.RunnerPoolSpec{TemplateRef: hfv1.ObjectName{Name: "debian"},
			Workload: hfv1.Workload{Type: hfv1.WorkloadBuildkite, Buildkite: &hfv1.BuildkiteWorkload{Queue: "linux"}}}}
	// claim is a claim of the pool created age ago, whose VM stood by since
	// standby ago (bound to job when set: its runner came online).
	claim := func(name string, age, standby time.Duration, job, hash string) *hfv1.MachineClaim {
		c := &hfv1.MachineClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name, UID: types.UID(name + "-uid"),
				CreationTimestamp: metav1.NewTime(unitEpoch.Add(-age))},
			Spec: hfv1.MachineClaimSpec{TemplateRef: pool.Spec.TemplateRef, RunnerPoolRef: &hfv1.ObjectName{Name: "bk"},
				WorkloadConfig: &hfv1.WorkloadConfig{Type: hfv1.WorkloadBuildkite, Buildkite: &hfv1.BuildkiteAgentConfig{Queue: "linux", JobID: job}}},
			Status: hfv1.MachineClaimStatus{TemplateHash: hash,
				Bootstrap: &hfv1.BootstrapStatus{RegisteredAt: &metav1.Time{Time: unitEpoch.Add(-standby)}}},
		}
		reason := hfv1.WaitingForJobReason
		if job != "" {
			reason = hfv1.RunnerOnlineReason
		}
		c.Status.Conditions = []metav1.Condition{
			{Type: string(hfv1.MachineClaimProvisionedCondition), Status: metav1.ConditionTrue, Reason: string(hfv1.ReadyReason)},
			{Type: string(hfv1.MachineClaimBootstrappedCondition), Status: metav1.ConditionTrue, Reason: string(reason)},
		}
		return c
	}
	objs := []*hfv1.MachineClaim{
		claim("a", 20*time.Minute, 5*time.Minute, "", "h1"),
		claim("b", 10*time.Minute, time.Minute, "", "h1"),
		claim("near-idle-timeout", 40*time.Minute, 25*time.Minute, "", "h1"),
		claim("stale", 30*time.Minute, 2*time.Minute, "", "h0"),
		claim("bound", 50*time.Minute, 3*time.Minute, j0, "h1"),
	}
	builder := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pool)
	for _, o := range objs {
		builder = builder.WithObjects(o)
	}
	c := builder.Build()
	r := &RunnerPoolReconciler{Client: c, Clock: clocktesting.NewFakeClock(unitEpoch), Recorder: record.NewFakeRecorder(32), Workloads: githubsimtest.Backends(t, nil)}
	job := func(id string, age time.Duration) *hfv1.CIJob {
		return &hfv1.CIJob{Spec: hfv1.CIJobSpec{Platform: hfv1.WorkloadBuildkite, JobKey: id},
			Status: hfv1.CIJobStatus{State: hfv1.CIJobQueued, QueuedAt: &metav1.Time{Time: unitEpoch.Add(-age)}}}
	}
	pending := []*hfv1.CIJob{job(j3, time.Minute), job(j1, 3*time.Minute), job(j0, 5*time.Minute), job(j2, 2*time.Minute)}
	// scope is a pass over what the cache shows: the API server's claims,
	// or (lagging) the ones given.
	scope := func(listed []hfv1.MachineClaim) *poolScope {
		if listed == nil {
			var list hfv1.MachineClaimList
			if err := c.List(context.Background(), &list); err != nil {
				t.Fatal(err)
			}
			listed = list.Items
		}
		s := &poolScope{pool: pool, now: unitEpoch, listed: listed, pending: pending, removed: map[scaling.Reason]int{}, ended: map[types.UID]bool{}}
		// As the pool's load copies them: the values, sharing what they
		// point to.
		owned := append([]hfv1.MachineClaim(nil), listed...)
		s.claims = poolclaims.Classify(owned, "h1", false)
		boundIdleToStarting(s.claims)
		return s
	}
	names := func(list []*hfv1.MachineClaim) []string {
		var out []string
		for _, x := range list {
			out = append(out, x.Name)
		}
		slices.Sort(out)
		return out
	}
	jobOf := func(name string) string {
		var got hfv1.MachineClaim
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: "team", Name: name}, &got); err != nil {
			t.Fatal(err)
		}
		return got.Spec.WorkloadConfig.Buildkite.JobID
	}

	s := scope(nil)
	var lagging []hfv1.MachineClaim
	for i := range s.listed {
		lagging = append(lagging, *s.listed[i].DeepCopy())
	}
	if got, want := names(s.claims.Idle), []string{"a", "b", "near-idle-timeout", "stale"}; !slices.Equal(got, want) {
		t.Fatalf("idle claims %v, want %v (a bound claim is not idle)", got, want)
	}
	if err := r.bindStandby(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"a": j1, "b": j2, "near-idle-timeout": "", "stale": "", "bound": j0} {
		if got := jobOf(name); got != want {
			t.Errorf("claim %s bound to %q, want %q", name, got, want)
		}
	}
	if got, want := names(s.claims.Starting), []string{"a", "b", "bound"}; !slices.Equal(got, want) {
		t.Errorf("starting claims after the binds %v, want %v", got, want)
	}
	if got := r.unboundJobs(s); !slices.Equal(got, []string{j3}) {
		t.Errorf("jobs left for new claims %v, want [%s]", got, j3)
	}

	// The next pass's cache does not show the binds yet.
	s = scope(lagging)
	if got := r.unboundJobs(s); !slices.Equal(got, []string{j3}) {
		t.Errorf("jobs left for new claims with a lagging cache %v, want [%s]: a job bound a moment ago was bound again", got, j3)
	}
	if err := r.bindStandby(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	if jobOf("a") != j1 || jobOf("b") != j2 {
		t.Errorf("a lagging pass rebound a warm claim: a %q, b %q", jobOf("a"), jobOf("b"))
	}
	if got := r.binds.pending(client.ObjectKeyFromObject(pool), lagging, unitEpoch); !got[j1] || !got[j2] {
		t.Errorf("binds expected while the cache lags: %v", got)
	}
	// The cache caught up: nothing is expected any more.
	s = scope(nil)
	if got := r.binds.pending(client.ObjectKeyFromObject(pool), s.listed, unitEpoch); len(got) != 0 {
		t.Errorf("binds still expected after the cache showed them: %v", got)
	}
	if got := r.unboundJobs(s); !slices.Equal(got, []string{j3}) {
		t.Errorf("jobs left for new claims %v, want [%s]", got, j3)
	}
}

// TestBindable: a warm claim is bound only while its next lifecycle limit
// is at least the pool's bootstrapTimeout away (or half its idleTimeout,
// when that is shorter).
func TestBindable(t *testing.T) {
	l := scaling.Limits{BootstrapTimeout: 10 * time.Minute, IdleTimeout: 30 * time.Minute, MaxLifetime: 6 * time.Hour}
	standing := func(since, created time.Duration) *hfv1.MachineClaim {
		return &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(unitEpoch.Add(-created))},
			Status: hfv1.MachineClaimStatus{Bootstrap: &hfv1.BootstrapStatus{RegisteredAt: &metav1.Time{Time: unitEpoch.Add(-since)}}}}
	}
	for _, tc := range []struct {
		name     string
		c        *hfv1.MachineClaim
		l        scaling.Limits
		bindable bool
	}{
		{"fresh", standing(time.Minute, 3*time.Minute), l, true},
		{"20 minutes left", standing(10*time.Minute, 12*time.Minute), l, true},
		{"9 minutes left", standing(21*time.Minute, 23*time.Minute), l, false},
		{"idle timeout reached", standing(31*time.Minute, 33*time.Minute), l, false},
		{"near max lifetime", standing(time.Minute, 6*time.Hour-5*time.Minute), l, false},
		{"short idle timeout: half of it", standing(time.Minute, 2*time.Minute), scaling.Limits{BootstrapTimeout: 10 * time.Minute, IdleTimeout: 4 * time.Minute}, true},
		{"short idle timeout, past half", standing(3*time.Minute, 4*time.Minute), scaling.Limits{BootstrapTimeout: 10 * time.Minute, IdleTimeout: 4 * time.Minute}, false},
		{"no limits", standing(time.Hour, 2*time.Hour), scaling.Limits{}, true},
	} {
		if got := bindable(tc.c, tc.l, unitEpoch); got != tc.bindable {
			t.Errorf("%s: bindable %v, want %v", tc.name, got, tc.bindable)
		}
	}
}
