package controller

import (
	"context"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/poolclaims"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
)

// TestNewClaimsBoundToQueuedJobs: a Buildkite pool makes each new claim
// for a queued job that no live claim of the pool is made for, oldest job
// first (spec.workloadConfig.buildkite.jobID); claims beyond the unbound
// jobs (warm ones) stay unbound, and a job whose claim ended is bound
// again. The pool's own claim section is not written through.
func TestNewClaimsBoundToQueuedJobs(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := hfv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	pool := &hfv1.RunnerPool{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "bk", UID: "pool-uid"},
		Spec: hfv1.RunnerPoolSpec{TemplateRef: hfv1.ObjectName{Name: "debian"},
			Workload: hfv1.Workload{Type: hfv1.WorkloadBuildkite, Buildkite: &hfv1.BuildkiteWorkload{Queue: "linux"}}}}
	// createClaims creates in parallel: the names' counter is atomic.
	var n atomic.Int64
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pool).
		WithInterceptorFuncs(interceptor.Funcs{Create: func(ctx context.Context, cl client.WithWatch, o client.Object, opts ...client.CreateOption) error {
			o.SetName(o.GetGenerateName() + strconv.FormatInt(n.Add(1), 10)) // the fake client does not generate names
			return cl.Create(ctx, o, opts...)
		}}).Build()
	r := &RunnerPoolReconciler{Client: c, Clock: clocktesting.NewFakeClock(unitEpoch), Workloads: githubsimtest.Backends(t, nil)}

	job := func(id string, age time.Duration) *hfv1.CIJob {
		return &hfv1.CIJob{Spec: hfv1.CIJobSpec{Platform: hfv1.WorkloadBuildkite, JobKey: id},
			Status: hfv1.CIJobStatus{State: hfv1.CIJobQueued, QueuedAt: &metav1.Time{Time: unitEpoch.Add(-age)}}}
	}
	const (
		j1 = "0190a3b2-0000-4000-8000-000000000001"
		j2 = "0190a3b2-0000-4000-8000-000000000002"
		j3 = "0190a3b2-0000-4000-8000-000000000003"
		j4 = "0190a3b2-0000-4000-8000-000000000004"
	)
	boundTo := func(id string) *hfv1.MachineClaim {
		return &hfv1.MachineClaim{Spec: hfv1.MachineClaimSpec{WorkloadConfig: &hfv1.WorkloadConfig{Type: hfv1.WorkloadBuildkite,
			Buildkite: &hfv1.BuildkiteAgentConfig{Queue: "linux", JobID: id}}}}
	}
	v := &poolScope{pool: pool, now: unitEpoch, removed: map[scaling.Reason]int{},
		// j1 has a starting claim; j4's claim ended, so j4 waits again.
		claims:  &poolclaims.Claims{Starting: []*hfv1.MachineClaim{boundTo(j1)}, Terminating: []*hfv1.MachineClaim{boundTo(j4)}},
		pending: []*hfv1.CIJob{job(j3, time.Minute), job(j1, 3*time.Minute), job(j4, 30*time.Second), job(j2, 2*time.Minute)},
	}
	if err := r.createClaims(context.Background(), v, 4, false); err != nil {
		t.Fatal(err)
	}
	var list hfv1.MachineClaimList
	if err := c.List(context.Background(), &list, client.InNamespace("team")); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, claim := range list.Items {
		wc := claim.Spec.WorkloadConfig
		if wc == nil || wc.Type != hfv1.WorkloadBuildkite || wc.Buildkite == nil {
			t.Fatalf("claim %s: workloadConfig %+v", claim.Name, wc)
		}
		got = append(got, wc.Buildkite.JobID)
	}
	slices.Sort(got)
	if want := []string{"", j2, j3, j4}; !slices.Equal(got, want) {
		t.Errorf("new claims bound to %q, want %q (one each for the unbound jobs, one warm)", got, want)
	}
	if _, ps, _ := r.Workloads.Pool(pool, nil); ps.Claim != nil && ps.Claim.Buildkite != nil && ps.Claim.Buildkite.JobID != "" {
		t.Error("binding a claim wrote into the pool's claim section")
	}
}
