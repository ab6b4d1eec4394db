package demand

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

var (
	t0 = time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC)
	t1 = t0.Add(30 * time.Second)
	t2 = t0.Add(5 * time.Minute)
)

func jobEvent(id int64, action string, state workload.JobState, delivery string) workload.JobEvent {
	j := workload.Job{
		ID: strconv.FormatInt(id, 10), Platform: hfv1.WorkloadGitHubActions, RunID: 77, RunAttempt: 1, Repository: "octo/app", Labels: []string{"self-hosted", "gpu"},
		State: state, WorkflowName: "CI", Name: "build", CreatedAt: t0,
	}
	if state != workload.JobQueued {
		j.StartedAt, j.RunnerName, j.RunnerID = t1, "hf-gpu-abc12", 31
	}
	if state == workload.JobCompleted {
		j.CompletedAt, j.Conclusion = t2, "success"
	}
	return workload.JobEvent{DeliveryID: delivery, Action: action, Job: j}
}

func TestNewCIJob(t *testing.T) {
	now := t2
	ev := jobEvent(42, "queued", workload.JobQueued, "d1")
	ev.Job.RunnerName = "GitHub Actions 5" // some queued payloads carry one
	ev.Job.CreatedAt = time.Time{}
	cj := NewCIJob(nn("team", "gpu"), ev, SourceWebhook, now)
	if cj.Name != "github-actions-42" || cj.Namespace != "team" {
		t.Fatalf("name %s/%s", cj.Namespace, cj.Name)
	}
	wantLabels := map[string]string{hfv1.ManagedByLabel: "hyperfleet", hfv1.RunnerPoolLabel: "gpu", hfv1.CIJobStateLabel: "queued"}
	for k, v := range wantLabels {
		if cj.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, cj.Labels[k], v)
		}
	}
	st := cj.Status
	if st.State != hfv1.CIJobQueued || !st.QueuedAt.Time.Equal(now) || st.RunnerName != "" || st.StartedAt != nil ||
		st.Source != "webhook" || st.LastDeliveryID != "d1" {
		t.Errorf("status %+v", st)
	}
	if cj.Spec.RunnerPoolRef.Name != "gpu" || cj.Spec.ID() != "42" || cj.Spec.JobID != 42 || cj.Spec.JobKey != "" || cj.Spec.Platform != hfv1.WorkloadGitHubActions || cj.Spec.Repository != "octo/app" || cj.Spec.JobName != "build" {
		t.Errorf("spec %+v", cj.Spec)
	}
	long := jobEvent(43, "queued", workload.JobQueued, strings.Repeat("d", 300))
	long.Job.WorkflowName = strings.Repeat("é", 2000)
	cj = NewCIJob(nn("team", "gpu"), long, SourceResync, now)
	if len([]rune(cj.Spec.WorkflowName)) != maxNameLength || len(cj.Status.LastDeliveryID) != maxDeliveryIDLength {
		t.Errorf("long values not clipped: %d, %d", len([]rune(cj.Spec.WorkflowName)), len(cj.Status.LastDeliveryID))
	}
}

func TestMergeEvent(t *testing.T) {
	pool := nn("team", "gpu")
	queued := jobEvent(1, "queued", workload.JobQueued, "q")
	inProgress := jobEvent(1, "in_progress", workload.JobInProgress, "p")
	completed := jobEvent(1, "completed", workload.JobCompleted, "c")
	completedNoRunner := completed
	completedNoRunner.Job.RunnerName, completedNoRunner.Job.RunnerID = "", 0
	tests := []struct {
		name        string
		first       workload.JobEvent
		then        workload.JobEvent
		wantChanged bool
		wantState   hfv1.CIJobState
		wantRunner  string
	}{
		{"forward", queued, inProgress, true, hfv1.CIJobInProgress, "hf-gpu-abc12"},
		{"forward to completed", inProgress, completed, true, hfv1.CIJobCompleted, "hf-gpu-abc12"},
		{"duplicate", inProgress, inProgress, false, hfv1.CIJobInProgress, "hf-gpu-abc12"},
		{"older", completed, queued, false, hfv1.CIJobCompleted, "hf-gpu-abc12"},
		{"older adds the runner", completedNoRunner, inProgress, true, hfv1.CIJobCompleted, "hf-gpu-abc12"},
		{"older in_progress with nothing new", completed, inProgress, false, hfv1.CIJobCompleted, "hf-gpu-abc12"},
		{"queued never sets a runner", queued, queued, false, hfv1.CIJobQueued, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cj := NewCIJob(pool, tc.first, SourceWebhook, t0)
			before := cj.Status.LastDeliveryID
			changed := MergeEvent(cj, tc.then, SourceResync)
			if changed != tc.wantChanged || cj.Status.State != tc.wantState || cj.Status.RunnerName != tc.wantRunner {
				t.Fatalf("changed %v state %s runner %q; want %v %s %q", changed, cj.Status.State, cj.Status.RunnerName, tc.wantChanged, tc.wantState, tc.wantRunner)
			}
			if cj.Labels[hfv1.CIJobStateLabel] != string(tc.wantState) {
				t.Fatalf("state label %q", cj.Labels[hfv1.CIJobStateLabel])
			}
			if !changed && (cj.Status.LastDeliveryID != before || cj.Status.Source != SourceWebhook) {
				t.Fatalf("an unchanged record got delivery %q source %q", cj.Status.LastDeliveryID, cj.Status.Source)
			}
			if changed && (cj.Status.LastDeliveryID != tc.then.DeliveryID || cj.Status.Source != SourceResync) {
				t.Fatalf("a changed record got delivery %q source %q", cj.Status.LastDeliveryID, cj.Status.Source)
			}
		})
	}
}

// newNamespace creates a namespace for one test.
func newNamespace(t *testing.T, c client.Client) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "demand-"}}
	if err := c.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

func getJob(t *testing.T, c client.Client, ns string, id int64) *hfv1.CIJob {
	t.Helper()
	var cj hfv1.CIJob
	key := types.NamespacedName{Namespace: ns, Name: hfv1.CIJobName(hfv1.WorkloadGitHubActions, strconv.FormatInt(id, 10))}
	if err := c.Get(context.Background(), key, &cj); err != nil {
		t.Fatalf("get CIJob %s: %v", key, err)
	}
	return &cj
}

// TestRecorderOutOfOrder: completed arrives before in_progress (and the
// job was never seen queued): the record is created completed, the late
// in_progress adds nothing it lacks, the late queued changes nothing, and
// repeats leave the object untouched (same resourceVersion).
func TestRecorderOutOfOrder(t *testing.T) {
	e := testEnv(t)
	ctx := context.Background()
	ns := newNamespace(t, e.Client)
	pool := nn(ns, "gpu")
	clk := clocktesting.NewFakePassiveClock(t2)
	rec := NewRecorder(e.Client, nil, clk)

	completed := jobEvent(4242, "completed", workload.JobCompleted, "d-completed")
	completed.Job.RunnerName, completed.Job.RunnerID = "", 0 // runner only known from in_progress
	mustApply := func(ev workload.JobEvent, want Outcome) {
		t.Helper()
		got, err := rec.Apply(ctx, pool, ev, SourceWebhook)
		if err != nil {
			t.Fatalf("Apply %s: %v", ev.Action, err)
		}
		if got != want {
			t.Fatalf("Apply %s = %s, want %s", ev.Action, got, want)
		}
	}
	mustApply(completed, Created)
	cj := getJob(t, e.Client, ns, 4242)
	if cj.Status.State != hfv1.CIJobCompleted || cj.Status.Conclusion != "success" || cj.Status.CompletedAt == nil ||
		!cj.Status.QueuedAt.Time.Equal(t0) || cj.Labels[hfv1.CIJobStateLabel] != "completed" {
		t.Fatalf("after completed: %+v labels %v", cj.Status, cj.Labels)
	}

	mustApply(jobEvent(4242, "in_progress", workload.JobInProgress, "d-progress"), Updated)
	cj = getJob(t, e.Client, ns, 4242)
	if cj.Status.State != hfv1.CIJobCompleted || cj.Status.RunnerName != "hf-gpu-abc12" || cj.Status.RunnerID != 31 ||
		cj.Status.LastDeliveryID != "d-progress" || cj.Labels[hfv1.CIJobStateLabel] != "completed" {
		t.Fatalf("after late in_progress: %+v", cj.Status)
	}
	rv := cj.ResourceVersion

	mustApply(jobEvent(4242, "in_progress", workload.JobInProgress, "d-progress"), Unchanged)
	mustApply(jobEvent(4242, "queued", workload.JobQueued, "d-queued"), Unchanged)
	mustApply(completed, Unchanged)
	if err := rec.Record(ctx, pool, completed, SourceResync); err != nil {
		t.Fatal(err)
	}
	if got := getJob(t, e.Client, ns, 4242).ResourceVersion; got != rv {
		t.Fatalf("duplicates changed the record: resourceVersion %s -> %s", rv, got)
	}
}

// TestRecorderKeepsHostsApart: a job id is recorded for the API host
// whose job it is (spec.apiHost), and the events of another host's job of
// the same id (a GitHub Enterprise Server numbers its jobs as GitHub.com
// does) never change that record: not through the Recorder's own copy, not
// after a restart.
func TestRecorderKeepsHostsApart(t *testing.T) {
	e := testEnv(t)
	ctx := context.Background()
	ns := newNamespace(t, e.Client)
	pool := nn(ns, "gpu")
	queued := jobEvent(4243, "queued", workload.JobQueued, "dotcom-1")
	if out, err := NewRecorder(e.Client, e.Client, nil).Apply(ctx, pool, queued, SourceWebhook); err != nil || out != Created {
		t.Fatalf("GitHub.com's job: %s, %v", out, err)
	}
	ghes := jobEvent(4243, "completed", workload.JobCompleted, "ghes-1")
	ghes.Job.Host = "ghes.example.com"
	for name, rec := range map[string]*Recorder{"a new Recorder": NewRecorder(e.Client, e.Client, nil)} {
		if _, err := rec.Apply(ctx, pool, queued, SourceWebhook); err != nil {
			t.Fatal(err)
		}
		if out, err := rec.Apply(ctx, pool, ghes, SourceWebhook); !errors.Is(err, ErrOtherHostsJob) || out != Unchanged {
			t.Fatalf("%s: another host's job of the same id: %s, %v; want ErrOtherHostsJob", name, out, err)
		}
	}
	cj := getJob(t, e.Client, ns, 4243)
	if cj.Spec.APIHost != "" || cj.Status.State != hfv1.CIJobQueued || cj.Status.LastDeliveryID != "dotcom-1" {
		t.Fatalf("GitHub.com's record after the other host's events: host %q, %+v", cj.Spec.APIHost, cj.Status)
	}
	ghes.Job.ID = "4244"
	if out, err := NewRecorder(e.Client, e.Client, nil).Apply(ctx, pool, ghes, SourceWebhook); err != nil || out != Created {
		t.Fatalf("the Enterprise Server's job: %s, %v", out, err)
	}
	if cj := getJob(t, e.Client, ns, 4244); cj.Spec.APIHost != "ghes.example.com" {
		t.Fatalf("spec.apiHost %q, want ghes.example.com", cj.Spec.APIHost)
	}
}

// TestRecorderForward records queued, then in_progress, then completed.
func TestRecorderForward(t *testing.T) {
	e := testEnv(t)
	ctx := context.Background()
	ns := newNamespace(t, e.Client)
	rec := NewRecorder(e.Client, e.Client, nil)
	pool := nn(ns, "gpu")
	for _, ev := range []workload.JobEvent{
		jobEvent(7, "queued", workload.JobQueued, "a"),
		jobEvent(7, "waiting", workload.JobQueued, "b"),
		jobEvent(7, "in_progress", workload.JobInProgress, "c"),
		jobEvent(7, "completed", workload.JobCompleted, "d"),
	} {
		if err := rec.Record(ctx, pool, ev, SourceWebhook); err != nil {
			t.Fatalf("%s: %v", ev.Action, err)
		}
		cj := getJob(t, e.Client, ns, 7)
		if want := string(ev.Job.State); string(cj.Status.State) != want || cj.Labels[hfv1.CIJobStateLabel] != want {
			t.Fatalf("after %s: state %s label %s", ev.Action, cj.Status.State, cj.Labels[hfv1.CIJobStateLabel])
		}
	}
	cj := getJob(t, e.Client, ns, 7)
	if cj.Status.LastDeliveryID != "d" || cj.Status.RunnerName == "" || cj.Status.StartedAt == nil || cj.Status.Conclusion != "success" {
		t.Fatalf("final %+v", cj.Status)
	}
}

// TestRecorderTextualJobID: the Recorder knows no platform of its own. A
// Buildkite job, whose id is a UUID, is recorded under its platform with
// the UUID in spec.jobKey and a name CIJobName gives, moves forward, and a
// GitHub job with a number for an id in the same namespace stays apart; an
// event spelling the UUID in upper case is the same job (UUIDs ignore
// case), and a record of another job under the same name is never merged
// into.
func TestRecorderTextualJobID(t *testing.T) {
	e := testEnv(t)
	ctx := context.Background()
	ns := newNamespace(t, e.Client)
	rec := NewRecorder(e.Client, e.Client, nil)
	pool := nn(ns, "linux")
	const uuid = "0190a1b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b"
	buildkite := func(id string, state workload.JobState, delivery string) workload.JobEvent {
		ev := jobEvent(1, string(state), state, delivery)
		ev.Job.ID, ev.Job.Platform = id, hfv1.WorkloadBuildkite
		return ev
	}
	if out, err := rec.Apply(ctx, pool, buildkite(uuid, workload.JobQueued, "q"), SourceWebhook); err != nil || out != Created {
		t.Fatalf("queued: %s, %v", out, err)
	}
	if out, err := rec.Apply(ctx, pool, buildkite(strings.ToUpper(uuid), workload.JobInProgress, "p"), SourceWebhook); err != nil || out != Updated {
		t.Fatalf("in_progress, id in upper case: %s, %v", out, err)
	}
	if err := rec.Record(ctx, pool, jobEvent(4242, "queued", workload.JobQueued, "gh"), SourceWebhook); err != nil {
		t.Fatal(err)
	}

	// A fresh recorder reads back what was written (no cached copy).
	var cj hfv1.CIJob
	if err := e.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "buildkite-" + uuid}, &cj); err != nil {
		t.Fatal(err)
	}
	if cj.Spec.Platform != hfv1.WorkloadBuildkite || cj.Spec.ID() != uuid || cj.Spec.JobKey != uuid || cj.Spec.JobID != 0 ||
		cj.Status.State != hfv1.CIJobInProgress || cj.Status.RunnerName != "hf-gpu-abc12" {
		t.Fatalf("Buildkite record: spec %+v, status %+v", cj.Spec, cj.Status)
	}
	gh := getJob(t, e.Client, ns, 4242)
	if gh.Spec.Platform != hfv1.WorkloadGitHubActions || gh.Spec.JobID != 4242 || gh.Spec.JobKey != "" || gh.Status.State != hfv1.CIJobQueued {
		t.Fatalf("GitHub record: spec %+v, status %+v", gh.Spec, gh.Status)
	}

	// A record under the same name holding another job (written by hand:
	// the Recorder never writes one) is refused, not merged into.
	other := cj.DeepCopy()
	other.ResourceVersion, other.Name = "", "buildkite-abc"
	other.Spec.SetID("ABC-other")
	if err := e.Client.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	err := NewRecorder(e.Client, e.Client, nil).Record(ctx, pool, buildkite("abc", workload.JobCompleted, "c"), SourceWebhook)
	if err == nil || !strings.Contains(err.Error(), "ABC-other") {
		t.Fatalf("recording job abc over the record of job ABC-other: %v; want a refusal naming both", err)
	}
}

// TestRecorderConcurrent: replicas racing on one job end with one record in
// the most advanced state.
func TestRecorderConcurrent(t *testing.T) {
	e := testEnv(t)
	ctx := context.Background()
	ns := newNamespace(t, e.Client)
	pool := nn(ns, "gpu")
	evs := []workload.JobEvent{
		jobEvent(9, "queued", workload.JobQueued, "q"),
		jobEvent(9, "in_progress", workload.JobInProgress, "p"),
		jobEvent(9, "completed", workload.JobCompleted, "c"),
	}
	var wg sync.WaitGroup
	var failures atomic.Int32
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := NewRecorder(e.Client, e.Client, nil).Record(ctx, pool, evs[i%len(evs)], SourceWebhook); err != nil {
				failures.Add(1)
				t.Errorf("record %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	cj := getJob(t, e.Client, ns, 9)
	if cj.Status.State != hfv1.CIJobCompleted || cj.Status.RunnerName == "" {
		t.Fatalf("final %+v", cj.Status)
	}
	var list hfv1.CIJobList
	if err := e.Client.List(ctx, &list, client.InNamespace(ns)); err != nil || len(list.Items) != 1 {
		t.Fatalf("list: %d items, %v", len(list.Items), err)
	}
	// Twelve replicas recorded the job; one write moved it past each state.
	checkObserved(t, ns, "hyperfleet_job_queue_seconds", 1, t1.Sub(t0))
	checkObserved(t, ns, "hyperfleet_job_run_seconds", 1, t2.Sub(t1))
}

// TestRecorderObservesEachJobOnce: a job's queue and run times are
// observed once, by the write that moves it past queued and the one that
// completes it, whether its events come by webhook or resync, repeated,
// out of order, or after a restart (a new Recorder, nothing in memory).
// A completion without the platform's time is measured to when the
// operator recorded it; a job cancelled while queued has no run time.
func TestRecorderObservesEachJobOnce(t *testing.T) {
	e := testEnv(t)
	ctx := context.Background()
	ns := newNamespace(t, e.Client)
	pool := nn(ns, "gpu")
	now := t2.Add(time.Minute)
	clk := clocktesting.NewFakePassiveClock(now)
	record := func(rec *Recorder, ev workload.JobEvent, source string) {
		t.Helper()
		if err := rec.Record(ctx, pool, ev, source); err != nil {
			t.Fatalf("%s %s: %v", source, ev.Action, err)
		}
	}
	rec := NewRecorder(e.Client, e.Client, clk)
	record(rec, jobEvent(11, "queued", workload.JobQueued, "a"), SourceWebhook)
	record(rec, jobEvent(11, "in_progress", workload.JobInProgress, ""), SourceResync)
	record(rec, jobEvent(11, "in_progress", workload.JobInProgress, "b"), SourceWebhook)
	checkObserved(t, ns, "hyperfleet_job_queue_seconds", 1, t1.Sub(t0))
	checkObserved(t, ns, "hyperfleet_job_run_seconds", 0, 0)

	restarted := NewRecorder(e.Client, e.Client, clk)
	record(restarted, jobEvent(11, "in_progress", workload.JobInProgress, "b"), SourceWebhook)
	completed := jobEvent(11, "completed", workload.JobCompleted, "c")
	completed.Job.CompletedAt = time.Time{} // the operator's time stands in
	record(restarted, completed, SourceWebhook)
	record(rec, completed, SourceResync)
	record(NewRecorder(e.Client, e.Client, clk), jobEvent(11, "completed", workload.JobCompleted, "c"), SourceWebhook)
	checkObserved(t, ns, "hyperfleet_job_queue_seconds", 1, t1.Sub(t0))
	checkObserved(t, ns, "hyperfleet_job_run_seconds", 1, now.Sub(t1))

	cancelled := jobEvent(12, "completed", workload.JobCompleted, "d")
	cancelled.Job.StartedAt, cancelled.Job.RunnerName, cancelled.Job.RunnerID = time.Time{}, "", 0
	record(rec, jobEvent(12, "queued", workload.JobQueued, "e"), SourceResync)
	record(rec, cancelled, SourceWebhook)
	checkObserved(t, ns, "hyperfleet_job_queue_seconds", 1, t1.Sub(t0))
	checkObserved(t, ns, "hyperfleet_job_run_seconds", 1, now.Sub(t1))
}

// checkObserved checks that the histogram's series of namespace ns hold
// count observations summing to sum, with the job's labels.
func checkObserved(t *testing.T, ns, name string, count uint64, sum time.Duration) {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var gotCount uint64
	var gotSum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["namespace"] != ns {
				continue
			}
			if want := map[string]string{"namespace": ns, "pool": "gpu", "platform": string(hfv1.WorkloadGitHubActions), "repository": "octo/app", "workflow": "CI"}; fmt.Sprint(labels) != fmt.Sprint(want) {
				t.Errorf("%s labels %v, want %v", name, labels, want)
			}
			gotCount += m.GetHistogram().GetSampleCount()
			gotSum += m.GetHistogram().GetSampleSum()
		}
	}
	if gotCount != count || gotSum != sum.Seconds() {
		t.Errorf("%s: %d observations summing to %vs, want %d summing to %vs", name, gotCount, gotSum, count, sum.Seconds())
	}
}

// TestRecorderRefusesIDsWithoutAName: an id that cannot be a CIJob's
// (spec.jobKey's pattern and length, hfv1.ValidateJobID) is refused with
// an error naming the platform and the id, never shortened into a name
// another job could have; nothing is written (the nil client would
// panic).
func TestRecorderRefusesIDsWithoutAName(t *testing.T) {
	rec := NewRecorder(nil, nil, nil)
	for _, id := range []string{"", "-1", "abc-", "a_b", "job/1", strings.Repeat("7a", 40)} {
		ev := jobEvent(1, "queued", workload.JobQueued, "x")
		ev.Job.ID, ev.Job.Platform = id, hfv1.WorkloadBuildkite
		err := rec.Record(context.Background(), nn("team", "linux"), ev, SourceWebhook)
		if err == nil || !strings.Contains(err.Error(), string(hfv1.WorkloadBuildkite)) || !strings.Contains(err.Error(), fmt.Sprintf("%q", id)) {
			t.Errorf("job id %q: %v; want a refusal naming buildkite and the id", id, err)
		}
	}
	ev := jobEvent(1, "queued", workload.JobQueued, "x")
	ev.Job.Platform = ""
	if err := rec.Record(context.Background(), nn("team", "linux"), ev, SourceWebhook); err == nil || !strings.Contains(err.Error(), "workload.Job.Platform") {
		t.Errorf("a job without a platform: %v; want a refusal naming workload.Job.Platform", err)
	}
}

func TestRecorderRejects(t *testing.T) {
	rec := NewRecorder(nil, nil, nil)
	for _, tc := range []struct {
		pool types.NamespacedName
		ev   workload.JobEvent
	}{
		{nn("a", "b"), workload.JobEvent{Job: workload.Job{ID: "", Platform: hfv1.WorkloadGitHubActions, State: workload.JobQueued}}},
		{nn("a", "b"), workload.JobEvent{Job: workload.Job{ID: "1", State: workload.JobQueued}}},
		{nn("", "b"), jobEvent(1, "queued", workload.JobQueued, "x")},
		{nn("a", "b"), workload.JobEvent{Job: workload.Job{ID: "1", Platform: hfv1.WorkloadGitHubActions, State: "requested"}}},
	} {
		if err := rec.Record(context.Background(), tc.pool, tc.ev, SourceWebhook); err == nil {
			t.Errorf("Record(%v, %+v) succeeded", tc.pool, tc.ev)
		}
	}
}
