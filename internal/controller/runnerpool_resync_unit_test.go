package controller

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim"
	"github.com/hyperfleet/hyperfleet/internal/demand"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// queuedOnly is a CI platform whose scope lists the same queued jobs at
// every resync and has no runner.
type queuedOnly struct {
	workload.Provider
	jobs []workload.Job
}

func (queuedOnly) Scope() workload.Scope { return workload.Scope{Owner: "octo-org"} }

func (queuedOnly) ListRunners(context.Context, string) ([]workload.Runner, error) { return nil, nil }

func (q queuedOnly) QueuedJobs(context.Context, []string) ([]workload.Job, error) { return q.jobs, nil }

func (queuedOnly) Repositories(context.Context) ([]string, error) {
	return []string{"octo-org/app"}, nil
}

// TestResyncSkipsRecordedQueuedJobs: a queued job the pool's namespace
// already holds a CIJob of is not written again at every resync. Writing it
// cost, per queued job and resync, a create the API server refused as
// existing and an uncached read (demand.Recorder): with 100 jobs queued and
// a 5 s resync the churn benchmark made 81 Kubernetes POSTs and 113 GETs
// per completed job. A job not recorded yet still is.
func TestResyncSkipsRecordedQueuedJobs(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := hfv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	pool := &hfv1.RunnerPool{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "runners"}}
	var jobs []workload.Job
	for id := int64(1); id <= 3; id++ {
		jobs = append(jobs, workload.Job{ID: strconv.FormatInt(id, 10), Platform: hfv1.WorkloadGitHubActions, Repository: "octo-org/app", Labels: []string{"self-hosted"}, State: workload.JobQueued, CreatedAt: unitEpoch})
	}
	var creates, gets atomic.Int32
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pool).WithStatusSubresource(pool).
		WithIndex(&hfv1.CIJob{}, fieldindex.JobPool, func(o client.Object) []string { return []string{o.(*hfv1.CIJob).Spec.RunnerPoolRef.Name} }).
		WithIndex(&hfv1.MachineClaim{}, fieldindex.ClaimPool, func(o client.Object) []string { return nil }).
		WithInterceptorFuncs(interceptor.Funcs{
			Create: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
				if _, ok := o.(*hfv1.CIJob); ok {
					creates.Add(1)
				}
				return c.Create(ctx, o, opts...)
			},
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, o client.Object, opts ...client.GetOption) error {
				if _, ok := o.(*hfv1.CIJob); ok {
					gets.Add(1)
				}
				return c.Get(ctx, key, o, opts...)
			},
		}).Build()
	clk := clocktesting.NewFakeClock(unitEpoch.Add(time.Minute))
	s := &PoolResync{Client: c, Recorder: demand.NewRecorder(c, nil, clk), Runners: machineclaim.NewRunnerObservations(), Clock: clk}
	cands := []demand.Candidate{{Pool: types.NamespacedName{Namespace: "team", Name: "runners"}, Platform: hfv1.WorkloadGitHubActions, Scope: workload.Scope{Owner: "octo-org"},
		RunnerLabels: []string{"self-hosted"}, Verified: true}}
	// One job already recorded (its webhook arrived), and the repository
	// known from it.
	if err := demand.NewRecorder(c, nil, clk).Record(context.Background(), cands[0].Pool, workload.JobEvent{Action: "queued", Job: jobs[0]}, demand.SourceWebhook); err != nil {
		t.Fatal(err)
	}
	creates.Store(0)
	g := &resyncGroup{key: "k", p: queuedOnly{jobs: jobs}, pools: []*hfv1.RunnerPool{pool}}
	if err := s.resyncGroup(context.Background(), g, cands); err != nil {
		t.Fatal(err)
	}
	if n := creates.Load(); n != 2 {
		t.Fatalf("first resync: %d CIJob creates, want 2 (the jobs not recorded yet)", n)
	}
	var list hfv1.CIJobList
	if err := c.List(context.Background(), &list); err != nil || len(list.Items) != 3 {
		t.Fatalf("%d CIJobs (%v), want 3", len(list.Items), err)
	}
	creates.Store(0)
	gets.Store(0)
	if err := s.resyncGroup(context.Background(), g, cands); err != nil {
		t.Fatal(err)
	}
	if n, m := creates.Load(), gets.Load(); n != 0 || m != 0 {
		t.Fatalf("a resync of jobs all recorded: %d CIJob creates and %d reads, want none", n, m)
	}
}

// manyRepositories is an organization scope with n repositories.
type manyRepositories struct {
	workload.Provider
	n int
}

func (manyRepositories) Scope() workload.Scope { return workload.Scope{Owner: "octo-org"} }

func (m manyRepositories) Repositories(context.Context) ([]string, error) {
	out := make([]string, 0, m.n+1)
	for i := range m.n {
		out = append(out, fmt.Sprintf("octo-org/repo-%02d", i))
	}
	// Another account's repository is never scanned.
	return append(out, "someone/else"), nil
}

// TestRepositoriesToScan: the repositories of recorded jobs are scanned
// at every resync; of the organization's others at most
// MaxRepositoryScans a resync, in turns that cover every one.
func TestRepositoriesToScan(t *testing.T) {
	s := &PoolResync{MaxRepositoryScans: 10}
	g := &resyncGroup{key: "org", p: manyRepositories{n: 25}}
	recorded := map[string]bool{"Octo-Org/repo-03": true, "someone/other": true}
	seen := map[string]int{}
	for turn := range 3 {
		got, err := s.repositoriesToScan(context.Background(), g, recorded)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 11 || !slices.Contains(got, "Octo-Org/repo-03") {
			t.Fatalf("turn %d: %d repositories %v; want the recorded one and 10 others", turn, len(got), got)
		}
		for _, r := range got {
			seen[r]++
		}
	}
	if len(seen) != 25 || seen["Octo-Org/repo-03"] != 3 || seen["someone/else"] != 0 || seen["someone/other"] != 0 {
		t.Errorf("three turns scanned %d repositories: %v; want all 25 of the organization, the recorded one every time", len(seen), seen)
	}
}
