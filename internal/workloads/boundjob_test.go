package workloads

import (
	"context"
	"errors"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// TestBoundJobOnlyThePoolsQueuedJob: a claim may be bound only to a queued
// job of its own pool, as the operator's CIJob record says; a claim
// without a pool, a job with no record, another pool's job and a job that
// started are refused with reason JobNotBindable (a configuration error,
// shown on the claim).
func TestBoundJobOnlyThePoolsQueuedJob(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := hfv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	const (
		mine    = "0190a3b2-0000-4000-8000-000000000001"
		other   = "0190a3b2-0000-4000-8000-000000000002"
		started = "0190a3b2-0000-4000-8000-000000000003"
		missing = "0190a3b2-0000-4000-8000-000000000004"
	)
	cijob := func(id, pool string, state hfv1.CIJobState) *hfv1.CIJob {
		return &hfv1.CIJob{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: hfv1.CIJobName(hfv1.WorkloadBuildkite, id)},
			Spec:   hfv1.CIJobSpec{Platform: hfv1.WorkloadBuildkite, JobKey: id, Repository: "acme/app", RunnerPoolRef: hfv1.ObjectName{Name: pool}},
			Status: hfv1.CIJobStatus{State: state}}
	}
	c := fake.NewClientBuilder().WithScheme(scheme).
		WithObjects(cijob(mine, "bk", hfv1.CIJobQueued), cijob(other, "gpu", hfv1.CIJobQueued), cijob(started, "bk", hfv1.CIJobInProgress)).Build()
	w := &Platforms{Client: c}
	claim := func(pool, job string) *hfv1.MachineClaim {
		m := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "bk-1"},
			Spec: hfv1.MachineClaimSpec{WorkloadConfig: &hfv1.WorkloadConfig{Type: hfv1.WorkloadBuildkite, Buildkite: &hfv1.BuildkiteAgentConfig{JobID: job}}}}
		if pool != "" {
			m.Spec.RunnerPoolRef = &hfv1.ObjectName{Name: pool}
		}
		return m
	}
	ctx := context.Background()
	if repo, err := w.boundJob(ctx, claim("bk", mine), mine); err != nil || repo != "acme/app" {
		t.Fatalf("the pool's queued job: %q %v", repo, err)
	}
	for name, tc := range map[string]struct{ pool, job string }{
		"no pool":         {"", mine},
		"no record":       {"bk", missing},
		"another pool's":  {"bk", other},
		"already started": {"bk", started},
	} {
		_, err := w.boundJob(ctx, claim(tc.pool, tc.job), tc.job)
		if !errors.Is(err, workload.ErrJobNotBindable) {
			t.Errorf("%s: %v, want ErrJobNotBindable", name, err)
			continue
		}
		var ce *errclass.Error
		if e := workloadError(nil, err); !errors.As(e, &ce) || ce.Reason != string(hfv1.JobNotBindableReason) || ce.Class != errclass.ClassConfiguration {
			t.Errorf("%s: classified as %v, want a configuration error with reason JobNotBindable", name, e)
		}
	}
}
