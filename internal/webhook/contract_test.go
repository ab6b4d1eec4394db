package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/demand"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testdeps"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github"
)

// octokitJob is what the contract test reads from one of GitHub's
// published workflow_job examples.
type octokitJob struct {
	Action      string `json:"action"`
	WorkflowJob struct {
		ID         int64    `json:"id"`
		Labels     []string `json:"labels"`
		RunnerName *string  `json:"runner_name"`
		Conclusion *string  `json:"conclusion"`
	} `json:"workflow_job"`
	Repository struct {
		FullName string `json:"full_name"`
	} `json:"repository"`
}

// recordingParser wraps the real parser and keeps what it decoded, so the
// test can check the parse of each example.
type recordingParser struct {
	github.WebhookParser
	last chan workload.JobEvent
}

func (p recordingParser) Parse(h http.Header, body []byte) (workload.JobEvent, error) {
	ev, err := p.WebhookParser.Parse(h, body)
	if err == nil {
		p.last <- ev
	}
	return ev, err
}

// TestContractOctokitExamples sends every workflow_job example GitHub
// publishes, signed, through the real Receiver over HTTP, with the real
// Router (on a controller-runtime cache) and Recorder against a real API
// server. For each example, pools are set up to match it: the most
// specific covering pool gets the CIJob, in the right state; then, with
// the covering pools gone, a queued job leaves a NoMatchingRunnerPool
// warning on the pool in scope that lacks its labels (and a job in any
// other state leaves none).
func TestContractOctokitExamples(t *testing.T) {
	examples := testdeps.WebhookExamples(t, "workflow_job")
	e := testEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	informers, err := cache.New(e.Config, cache.Options{Scheme: e.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	// The router reads pools and templates; start their informers now.
	for _, obj := range []client.Object{&hfv1.RunnerPool{}, &hfv1.HypervisorMachineTemplate{}} {
		if _, err := informers.GetInformer(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	go func() { _ = informers.Start(ctx) }()
	if !informers.WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}

	clientset, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	broadcaster := record.NewBroadcaster()
	defer broadcaster.Shutdown()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: clientset.CoreV1().Events("")})
	events := broadcaster.NewRecorder(e.Scheme, corev1.EventSource{Component: "hyperfleet-webhook"})

	router := demand.NewRouter(informers, ciPlatforms)
	parsed := make(chan workload.JobEvent, 1)
	recv, err := NewReceiver(Options{
		Format:   github.WebhookFormat,
		Parser:   recordingParser{WebhookParser: github.WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: testSecret}}, last: parsed},
		Router:   router,
		Recorder: demand.NewRecorder(e.Client, e.Client, nil),
		Events:   events,
	})
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = recv.Run(ctx) }()
	defer func() { cancel(); <-runDone }()
	srv := httptest.NewServer(recv)
	defer srv.Close()

	for i, raw := range examples {
		var ex octokitJob
		if err := json.Unmarshal(raw, &ex); err != nil {
			t.Fatalf("example %d: %v", i, err)
		}
		t.Run(fmt.Sprintf("%d_%s_%d", i, ex.Action, ex.WorkflowJob.ID), func(t *testing.T) {
			c := contract{t: t, ctx: ctx, c: e.Client, router: router, url: srv.URL + github.WebhookFormat.Path, parsed: parsed, ex: ex, raw: raw}
			c.run(i)
		})
	}
}

type contract struct {
	t      *testing.T
	ctx    context.Context
	c      client.Client
	router *demand.Router
	url    string
	parsed chan workload.JobEvent
	ex     octokitJob
	raw    []byte
}

func (c *contract) run(i int) {
	t, ctx, ex := c.t, c.ctx, c.ex
	owner, repo, ok := strings.Cut(ex.Repository.FullName, "/")
	if !ok {
		t.Fatalf("example repository %q", ex.Repository.FullName)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "contract-"}}
	c.create(ns)
	tmpl := &hfv1.HypervisorMachineTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "runner"},
		Spec: hfv1.HypervisorMachineTemplateSpec{
			HypervisorClusterRef: hfv1.ObjectName{Name: "pve"},
			Source:               hfv1.MachineSource{Proxmox: hfv1.ProxmoxSource{TemplateID: ptr.To[int32](9000)}},
			Resources:            hfv1.MachineResources{CPU: 2, Memory: resource.MustParse("2Gi")},
			Bootstrap: hfv1.Bootstrap{GitHub: &hfv1.GitHubBootstrap{
				Owner: owner, Repository: repo,
				Credentials: hfv1.GitHubCredentials{PAT: &hfv1.LocalSecretKeySelector{Name: "github", Key: "token"}},
			}},
		},
	}
	c.create(tmpl)
	pool := func(name string, w hfv1.GitHubWorkload) *hfv1.RunnerPool {
		p := &hfv1.RunnerPool{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: name},
			Spec: hfv1.RunnerPoolSpec{
				TemplateRef: hfv1.ObjectName{Name: tmpl.Name},
				Workload:    hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &w},
				Scaling:     hfv1.Scaling{MaxReplicas: 5},
			},
		}
		c.create(p)
		c.markScopeVerified(p, tmpl)
		return p
	}
	jobLabels := ex.WorkflowJob.Labels
	// exact serves the template's repository with exactly the job's labels.
	exact := pool("exact", hfv1.GitHubWorkload{Labels: jobLabels})
	// wider covers the job too, for the whole organization, with one more
	// label: less specific, not chosen.
	wider := pool("wider", hfv1.GitHubWorkload{Organization: owner, Labels: append(slices.Clone(jobLabels), "extra")})
	// lacking serves the repository but not the job's labels.
	lacking := pool("lacking", hfv1.GitHubWorkload{Repository: ex.Repository.FullName, Labels: []string{"nothing-the-job-wants"}})
	// elsewhere covers the labels but serves another repository.
	elsewhere := pool("elsewhere", hfv1.GitHubWorkload{Repository: owner + "/not-" + repo, Labels: jobLabels})
	c.waitCandidates(ns.Name, "elsewhere", "exact", "lacking", "wider")

	// 1. The job is routed to exact and recorded there.
	c.send(fmt.Sprintf("contract-%d-a", i))
	cj := c.waitJob(ns.Name)
	wantState := map[string]hfv1.CIJobState{"queued": "queued", "waiting": "queued", "in_progress": "in_progress", "completed": "completed"}[ex.Action]
	if cj.Spec.RunnerPoolRef.Name != exact.Name || cj.Status.State != wantState || cj.Labels[hfv1.CIJobStateLabel] != string(wantState) ||
		cj.Labels[hfv1.RunnerPoolLabel] != exact.Name || cj.Spec.Repository != ex.Repository.FullName ||
		!slices.Equal(cj.Spec.Labels, jobLabels) || cj.Status.Source != "webhook" || cj.Status.LastDeliveryID != fmt.Sprintf("contract-%d-a", i) {
		t.Fatalf("CIJob %s: spec %+v status %+v labels %v", cj.Name, cj.Spec, cj.Status, cj.Labels)
	}
	if wantState != hfv1.CIJobQueued && ex.WorkflowJob.RunnerName != nil && cj.Status.RunnerName != *ex.WorkflowJob.RunnerName {
		t.Fatalf("CIJob runner %q, want %q", cj.Status.RunnerName, *ex.WorkflowJob.RunnerName)
	}
	if wantState == hfv1.CIJobCompleted && ex.WorkflowJob.Conclusion != nil && cj.Status.Conclusion != *ex.WorkflowJob.Conclusion {
		t.Fatalf("CIJob conclusion %q, want %q", cj.Status.Conclusion, *ex.WorkflowJob.Conclusion)
	}
	var all hfv1.CIJobList
	if err := c.c.List(ctx, &all, client.InNamespace(ns.Name)); err != nil {
		t.Fatal(err)
	}
	if len(all.Items) != 1 {
		t.Fatalf("%d CIJobs in %s, want 1", len(all.Items), ns.Name)
	}

	// 2. Without the covering pools, the job matches none: a queued job
	// leaves a warning on lacking (in scope), none on elsewhere.
	c.delete(exact)
	c.delete(wider)
	c.waitCandidates(ns.Name, "elsewhere", "lacking")
	c.send(fmt.Sprintf("contract-%d-b", i))
	if wantState == hfv1.CIJobQueued {
		ev := c.waitEvent(ns.Name, lacking.Name)
		missing := demand.MissingLabels(github.RunnerLabels("", "", lacking.Spec.Workload.GitHub.Labels), jobLabels)
		for _, want := range []string{fmt.Sprint(ex.WorkflowJob.ID), ex.Repository.FullName, "lack: " + strings.Join(missing, ", ")} {
			if !strings.Contains(ev.Message, want) {
				t.Fatalf("event message %q does not say %q", ev.Message, want)
			}
		}
		if ev.Type != corev1.EventTypeWarning || ev.InvolvedObject.UID != lacking.UID || ev.InvolvedObject.Kind != "RunnerPool" {
			t.Fatalf("event %+v", ev)
		}
	}
	// Whatever the state, elsewhere (out of scope) gets no event; in_progress
	// and completed jobs leave none at all. Events are written
	// asynchronously: give them a moment.
	time.Sleep(300 * time.Millisecond)
	for _, name := range []string{elsewhere.Name, lacking.Name} {
		n := len(c.events(ns.Name, name))
		want := 0
		if name == lacking.Name && wantState == hfv1.CIJobQueued {
			want = 1
		}
		if n != want {
			t.Fatalf("pool %s has %d NoMatchingRunnerPool events, want %d", name, n, want)
		}
	}
	c.delete(lacking)
	c.delete(elsewhere)
	c.waitCandidates(ns.Name)
}

func (c *contract) create(obj client.Object) {
	c.t.Helper()
	if err := c.c.Create(c.ctx, obj); err != nil {
		c.t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

func (c *contract) delete(obj client.Object) {
	c.t.Helper()
	if err := c.c.Delete(c.ctx, obj); err != nil && !apierrors.IsNotFound(err) {
		c.t.Fatalf("delete %T %s: %v", obj, obj.GetName(), err)
	}
}

// send delivers the example, signed, and checks the answer and the parse.
func (c *contract) send(deliveryID string) {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.url, bytes.NewReader(c.raw))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "GitHub-Hookshot/test")
	req.Header.Set("X-GitHub-Event", "workflow_job")
	req.Header.Set("X-GitHub-Delivery", deliveryID)
	req.Header.Set("X-GitHub-Hook-ID", "1")
	req.Header.Set("X-Hub-Signature-256", github.SignWebhook(testSecret, c.raw))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		c.t.Fatalf("delivery %s: status %d: %s", deliveryID, resp.StatusCode, body)
	}
	var ev workload.JobEvent
	select {
	case ev = <-c.parsed:
	case <-time.After(5 * time.Second):
		c.t.Fatal("nothing parsed")
	}
	wj := c.ex.WorkflowJob
	if ev.Action != c.ex.Action || ev.Job.ID != strconv.FormatInt(wj.ID, 10) || ev.Job.Platform != hfv1.WorkloadGitHubActions || !slices.Equal(ev.Job.Labels, wj.Labels) ||
		ev.Job.Repository != c.ex.Repository.FullName || ev.DeliveryID != deliveryID {
		c.t.Fatalf("parsed %+v from example %+v", ev, c.ex)
	}
	if wj.RunnerName != nil && ev.Job.RunnerName != *wj.RunnerName {
		c.t.Fatalf("parsed runner %q, want %q", ev.Job.RunnerName, *wj.RunnerName)
	}
}

// markScopeVerified records in p's status what the RunnerPool controller
// records once its template's credentials reach its scope: routing only
// considers such pools.
func (c *contract) markScopeVerified(p *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate) {
	c.t.Helper()
	sv, ok := scopeVerification(p, tmpl)
	if !ok {
		c.t.Fatalf("pool %s has no scope", p.Name)
	}
	p.Status.ScopeVerification = sv
	meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{Type: string(hfv1.RunnerPoolScopeVerifiedCondition), Status: metav1.ConditionTrue,
		Reason: string(hfv1.ScopeVerifiedReason), Message: "test", ObservedGeneration: p.Generation})
	if err := c.c.Status().Update(c.ctx, p); err != nil {
		c.t.Fatalf("mark RunnerPool %s verified: %v", p.Name, err)
	}
}

// waitCandidates waits until the router (on the cache) sees exactly the
// named pools of ns, verified.
func (c *contract) waitCandidates(ns string, names ...string) {
	c.t.Helper()
	var got []string
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		cands, err := c.router.Candidates(c.ctx)
		if err != nil {
			c.t.Fatal(err)
		}
		got = got[:0]
		for _, cand := range cands {
			if cand.Pool.Namespace == ns && cand.Verified {
				got = append(got, cand.Pool.Name)
			}
		}
		if slices.Equal(got, names) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.t.Fatalf("router sees pools %v in %s, want %v", got, ns, names)
}

func (c *contract) waitJob(ns string) *hfv1.CIJob {
	c.t.Helper()
	key := types.NamespacedName{Namespace: ns, Name: hfv1.CIJobName(hfv1.WorkloadGitHubActions, strconv.FormatInt(c.ex.WorkflowJob.ID, 10))}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var cj hfv1.CIJob
		err := c.c.Get(c.ctx, key, &cj)
		if err == nil {
			return &cj
		}
		if !apierrors.IsNotFound(err) || time.Now().After(deadline) {
			c.t.Fatalf("CIJob %s: %v", key, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (c *contract) events(ns, pool string) []corev1.Event {
	c.t.Helper()
	var list corev1.EventList
	if err := c.c.List(c.ctx, &list, client.InNamespace(ns)); err != nil {
		c.t.Fatal(err)
	}
	var out []corev1.Event
	for _, ev := range list.Items {
		if ev.InvolvedObject.Name == pool && ev.Reason == ReasonNoMatchingRunnerPool {
			out = append(out, ev)
		}
	}
	return out
}

func (c *contract) waitEvent(ns, pool string) corev1.Event {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if evs := c.events(ns, pool); len(evs) > 0 {
			return evs[0]
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("no %s event on RunnerPool %s/%s", ReasonNoMatchingRunnerPool, ns, pool)
	return corev1.Event{}
}
