package controller_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/internal/workloads"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// TestPoolJobReaders: webhook events are confirmed with the CI platform
// account of the pool they were routed to (its template's credentials and
// the pool's scope), and a pool that cannot be read is an error naming it.
func TestPoolJobReaders(t *testing.T) {
	gs := startGitHub(t)
	f := newFixture(t, startSim(t, nil), nil)
	f.useGitHub(gs, nil)
	pool := &hfv1.RunnerPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "confirm"},
		Spec: hfv1.RunnerPoolSpec{
			TemplateRef: hfv1.ObjectName{Name: f.template.Name},
			Workload:    hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{Repository: "octo-org/app", Labels: []string{"confirm"}}},
			Scaling:     hfv1.Scaling{MinReplicas: 0, MaxReplicas: 1},
		},
	}
	f.create(pool)
	job, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted", "confirm"}, Duration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	readers := &controller.PoolJobReaders{Client: env.Client, Providers: &workloads.Platforms{Client: env.Client, Backends: githubsimtest.Backends(t, gs.Transport)}}
	ctx := context.Background()
	reader, err := readers.JobReaderFor(ctx, types.NamespacedName{Namespace: f.namespace, Name: pool.Name})
	if err != nil {
		t.Fatal(err)
	}
	id := strconv.FormatInt(job.ID, 10)
	got, err := reader.GetJob(ctx, "octo-org/app", id)
	if err != nil || got.ID != id || got.State != workload.JobQueued {
		t.Fatalf("GetJob = %+v, %v; want job %d queued", got, err, job.ID)
	}
	// The pool's scope is octo-org/app: another repository is refused, not asked about.
	if _, err := reader.GetJob(ctx, "octo-org/other", id); err == nil {
		t.Fatal("a job outside the pool's scope was read")
	}
	_, err = readers.JobReaderFor(ctx, types.NamespacedName{Namespace: f.namespace, Name: "absent"})
	if err == nil || !strings.Contains(err.Error(), "RunnerPool "+f.namespace+"/absent") {
		t.Fatalf("JobReaderFor(absent pool) = %v, want an error naming it", err)
	}
}
