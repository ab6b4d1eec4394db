package demand_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"pgregory.net/rapid"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
	"github.com/hyperfleet/hyperfleet/internal/demand"
	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/internal/webhook"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// vouched is a ScopeVerifier that vouches for every pool's scope (the
// GitHub API's answer is not what property 13 is about).
type vouched struct{}

func (vouched) VerifyPoolScope(context.Context, *hfv1.RunnerPool, *hfv1.HypervisorMachineTemplate) error {
	return nil
}

// The webhook secrets of the two GitHub owners the receiver holds secrets
// for: ours, whose pools are in the world, and another tenant's.
var (
	ourSecret   = []byte("octo-org-webhook-secret-0123456789")
	otherSecret = []byte("evil-org-webhook-secret-9876543210")
)

// poolLabels are the one label each generated pool adds to the runner's
// defaults; a job asking for it is covered by that pool only.
var poolLabels = []string{"gpu", "arm-builder", "big-disk"}

// webhookPool is a generated pool: its scope (the organization, or one
// repository of it) and its label.
type webhookPool struct {
	key   types.NamespacedName
	repo  string // "" for the organization
	label string
	// enterprise: the pool's template works against a GitHub Enterprise
	// Server (another API host than the receiver's, the public service).
	enterprise bool
}

// webhookDelivery is a generated delivery and what the design says it
// does: the pool that scales for it, if any.
type webhookDelivery struct {
	kind       string
	id         int64
	repository string
	labels     []string
	signWith   []byte
	// want is the pool the job goes to (zero: none); code the HTTP
	// status of the answer.
	want types.NamespacedName
	code int
}

// githubDelivery is a workflow_job delivery as GitHub sends it, signed with
// secret (nil: an invalid signature).
func githubDelivery(d webhookDelivery, n int) *http.Request {
	owner := strings.SplitN(d.repository, "/", 2)[0]
	body := fmt.Appendf(nil, `{"action":"queued","workflow_job":{"id":%d,"run_id":%d,"run_attempt":1,"status":"queued","labels":[%s],"runner_name":null,"created_at":"2026-03-14T09:00:00Z"},"repository":{"full_name":%q,"owner":{"login":%q}},"organization":{"login":%q}}`,
		d.id, 7000+d.id, `"`+strings.Join(d.labels, `","`)+`"`, d.repository, owner, owner)
	req := httptest.NewRequest(http.MethodPost, githubsimtest.WebhookFormat.Path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", "workflow_job")
	req.Header.Set("X-GitHub-Delivery", fmt.Sprintf("delivery-%d", n))
	sig := "sha256=" + strings.Repeat("0", 64)
	if d.signWith != nil {
		sig = githubsimtest.SignWebhook(d.signWith, body)
	}
	req.Header.Set("X-Hub-Signature-256", sig)
	return req
}

// Feature: hyperfleet-operator, Property 13: Webhook-Based Autoscaling
//
// TestWebhookScalingProperty sends generated GitHub workflow_job
// deliveries through the operator's webhook path (the receiver of
// internal/webhook with the GitHub back-end's parser holding per-owner
// secrets, demand.Router and demand.Recorder, as internal/manager wires
// them) into a world of one to three verified RunnerPools of octo-org
// (its organization or one repository, each with a label of its own), on
// controller-runtime's fake client, then runs the RunnerPool reconciler's
// pass on every pool. Some pools' templates work against a GitHub
// Enterprise Server: another API host than the receiver's (the public
// service). The deliveries are: a queued job a pool covers, signed with
// octo-org's secret; the same signed with another tenant's secret or not
// at all (forged); a job asking for a label no pool has; a job of another
// organization (signed with that organization's secret, out of every
// pool's scope); a job of a repository outside a repository-scoped pool; a
// job of the public service's octo-org that only an enterprise pool's
// labels cover (another host's pool). Then:
//   - every delivery gets the answer its signature deserves (401 for a
//     forged one, 202 otherwise);
//   - exactly the covered, correctly signed jobs are recorded as queued
//     CIJobs, each of the pool that covers it and no other;
//   - each pool then has exactly one new MachineClaim per job recorded
//     for it (up to its maxReplicas), and a pool no job went to has none:
//     forged, unmatched and out-of-scope deliveries scale nothing.
//
// Mutation: the GitHub parser (pkg/workload/github/webhook.go) not
// checking signatures (VerifySignature's and checkSignedFor's errors
// ignored) fails this test (a delivery about octo-org signed with
// evil-org's secret was accepted); the old test, over demand.Choose alone,
// passed it. (Accepting any owner's secret in VerifySignature alone is
// caught by Parse's second check, checkSignedFor: this test passes it.)
// Mutation: workload.Scope.HoldsJob (pkg/workload/workload.go) ignoring
// the API host fails this test (the public service's job scaled the
// enterprise server's pool); the old test passed it.
// Mutation: routeAndRecord (internal/webhook/receiver.go) recording a job
// no pool covers to the first unmatched pool fails this test; the old
// test passed it.
func TestWebhookScalingProperty(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		backends, err := workload.NewBackends(githubsimtest.Workloads(), workload.Dependencies{})
		if err != nil {
			t.Fatal(err)
		}
		be, _ := backends.For(hfv1.WorkloadGitHubActions)
		receiverOf, ok := be.(workload.WebhookReceiver)
		if !ok {
			t.Fatal("the GitHub back-end receives no webhooks")
		}
		seen := map[string]int{}
		proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
			webhookScalingCase(rt, backends, receiverOf, seen)
		})
		// Every kind of delivery must have been drawn (not under -short,
		// where rapid runs a fifth of the cases).
		if testing.Short() {
			return
		}
		for _, k := range []string{"covered", "forged by another tenant", "unsigned", "unmatched label", "other organization", "outside the repository", "another API host's pool"} {
			if seen[k] == 0 {
				t.Errorf("no delivery was %q (%v)", k, seen)
			}
		}
	})
}

func webhookScalingCase(rt *rapid.T, backends *workload.Backends, receiverOf workload.WebhookReceiver, seen map[string]int) {
	ctx := context.Background()
	now := time.Now()
	var pools []webhookPool
	var objs []client.Object
	for i := range rapid.IntRange(1, len(poolLabels)).Draw(rt, "pools") {
		p := webhookPool{key: types.NamespacedName{Namespace: fmt.Sprintf("team-%d", rapid.IntRange(0, 1).Draw(rt, fmt.Sprintf("pool %d namespace", i))), Name: fmt.Sprintf("pool-%d", i)},
			label: poolLabels[i]}
		if rapid.Bool().Draw(rt, fmt.Sprintf("pool %d repository-scoped", i)) {
			p.repo = "app"
		}
		p.enterprise = rapid.IntRange(0, 3).Draw(rt, fmt.Sprintf("pool %d on an enterprise server", i)) == 0
		pools = append(pools, p)
		objs = append(objs, webhookPoolObjects(p, rapid.IntRange(1, 3).Draw(rt, fmt.Sprintf("pool %d maxReplicas", i)))...)
	}
	// The hypervisor cluster of the templates, without tenancy rules: it
	// lets them use any API host.
	objs = append(objs, &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: "pve"}, Spec: hfv1.HypervisorClusterSpec{Provider: hfv1.ProviderProxmox}})
	c := webhookWorld(rt, backends, objs...)
	clk := clocktesting.NewFakeClock(now)
	pr := &controller.RunnerPoolReconciler{Client: c, Recorder: &record.FakeRecorder{}, Clock: clk, Scopes: vouched{}, Workloads: backends}
	pass := func() {
		for _, p := range pools {
			if _, err := pr.Reconcile(ctx, ctrl.Request{NamespacedName: p.key}); err != nil {
				rt.Fatalf("reconcile RunnerPool %s: %v", p.key, err)
			}
		}
	}
	pass() // verifies the pools' scopes, as the operator does before any job
	for _, p := range pools {
		// A pool that takes no job because it is not verified would make
		// the property vacuous for it.
		var pool hfv1.RunnerPool
		if err := c.Get(ctx, p.key, &pool); err != nil {
			rt.Fatalf("get RunnerPool %s: %v", p.key, err)
		}
		if cond := hfv1.FindCondition(pool.Status.Conditions, hfv1.RunnerPoolScopeVerifiedCondition); cond == nil || cond.Status != metav1.ConditionTrue {
			rt.Fatalf("RunnerPool %s (enterprise %v) is not verified: %+v", p.key, p.enterprise, cond)
		}
	}
	before := claimsByPool(rt, c)

	recv, err := webhook.NewReceiver(webhook.Options{
		Format: receiverOf.WebhookFormat(),
		Parser: receiverOf.WebhookParser(nil, map[string][]byte{"octo-org": ourSecret, "evil-org": otherSecret}),
		Router: demand.NewRouter(c, backends), Recorder: demand.NewRecorder(c, nil, clk),
	})
	if err != nil {
		rt.Fatalf("receiver: %v", err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = recv.Run(runCtx) }()

	var deliveries []webhookDelivery
	for i := range rapid.IntRange(1, 6).Draw(rt, "deliveries") {
		p := pools[rapid.IntRange(0, len(pools)-1).Draw(rt, fmt.Sprintf("delivery %d pool", i))]
		d := webhookDelivery{id: int64(100 + i), repository: "octo-org/app", labels: []string{"self-hosted", p.label}, signWith: ourSecret, code: http.StatusAccepted}
		d.kind = rapid.SampledFrom([]string{"covered", "covered", "forged by another tenant", "unsigned", "unmatched label", "other organization", "outside the repository"}).Draw(rt, fmt.Sprintf("delivery %d kind", i))
		switch d.kind {
		case "covered":
			if p.repo == "" && rapid.Bool().Draw(rt, fmt.Sprintf("delivery %d other repository", i)) {
				d.repository = "octo-org/web"
			}
			d.want = p.key
			if p.enterprise {
				// The job of the public service's octo-org is not the
				// enterprise server's octo-org's, whatever the names say.
				d.kind, d.want = "another API host's pool", types.NamespacedName{}
			}
		case "forged by another tenant":
			d.signWith, d.code = otherSecret, http.StatusUnauthorized
		case "unsigned":
			d.signWith, d.code = nil, http.StatusUnauthorized
		case "unmatched label":
			d.labels = []string{"self-hosted", "no-pool-has-this"}
		case "other organization":
			d.repository, d.signWith = "evil-org/app", otherSecret
		case "outside the repository":
			if p.repo == "" {
				// An organization pool holds every repository: this one
				// is covered after all.
				d.kind, d.repository, d.want = "covered", "octo-org/web", p.key
				if p.enterprise {
					d.kind, d.want = "another API host's pool", types.NamespacedName{}
				}
				break
			}
			d.repository = "octo-org/web"
		}
		seen[d.kind]++
		deliveries = append(deliveries, d)
		w := httptest.NewRecorder()
		recv.ServeHTTP(w, githubDelivery(d, i))
		if w.Code != d.code {
			rt.Fatalf("delivery %d (%s, job %d of %s, labels %v): answered %d %q, want %d", i, d.kind, d.id, d.repository, d.labels, w.Code, strings.TrimSpace(w.Body.String()), d.code)
		}
	}
	// Every accepted delivery is routed and recorded (or dropped) before
	// the receiver's workers block again on their empty queue.
	synctest.Wait()
	stop()
	<-done

	// The product's record of demand: the CIJobs, each in its pool's
	// namespace and labelled with its pool.
	var jobs hfv1.CIJobList
	if err := c.List(ctx, &jobs); err != nil {
		rt.Fatalf("list CIJobs: %v", err)
	}
	got := map[int64]types.NamespacedName{}
	for _, j := range jobs.Items {
		got[j.Spec.JobID] = types.NamespacedName{Namespace: j.Namespace, Name: j.Spec.RunnerPoolRef.Name}
		if j.Status.State != hfv1.CIJobQueued {
			rt.Fatalf("CIJob %s/%s is %q, want queued", j.Namespace, j.Name, j.Status.State)
		}
	}
	perPool := map[types.NamespacedName]int{}
	for _, d := range deliveries {
		pool, recorded := got[d.id]
		switch {
		case d.want == (types.NamespacedName{}) && recorded:
			rt.Fatalf("delivery of job %d (%s) was recorded for RunnerPool %s; it scales nothing", d.id, d.kind, pool)
		case d.want != (types.NamespacedName{}) && !recorded:
			rt.Fatalf("delivery of job %d (%s, %s, labels %v) was not recorded; want RunnerPool %s", d.id, d.kind, d.repository, d.labels, d.want)
		case recorded && pool != d.want:
			rt.Fatalf("job %d was recorded for RunnerPool %s, want %s", d.id, pool, d.want)
		}
		if recorded {
			perPool[pool]++
		}
	}
	if n := sum(perPool); n != len(got) {
		rt.Fatalf("%d CIJobs %v, want %d: a job no delivery asked for was recorded", len(got), got, n)
	}

	// The scaling action: the pools' next pass.
	pass()
	after := claimsByPool(rt, c)
	for _, p := range pools {
		var pool hfv1.RunnerPool
		if err := c.Get(ctx, p.key, &pool); err != nil {
			rt.Fatalf("get RunnerPool %s: %v", p.key, err)
		}
		want := min(perPool[p.key], int(pool.Spec.Scaling.MaxReplicas))
		if n := after[p.key] - before[p.key]; n != want {
			rt.Fatalf("RunnerPool %s (labels +%s, repository %q) created %d claims for %d jobs recorded for it (maxReplicas %d), want %d",
				p.key, p.label, p.repo, n, perPool[p.key], pool.Spec.Scaling.MaxReplicas, want)
		}
	}
}

func sum(m map[types.NamespacedName]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// webhookPoolObjects are a pool of octo-org (its organization, or its
// repository app) with its own template and label.
func webhookPoolObjects(p webhookPool, maxReplicas int) []client.Object {
	tmpl := &hfv1.HypervisorMachineTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.key.Namespace, Name: p.key.Name + "-debian", Generation: 1},
		Spec: hfv1.HypervisorMachineTemplateSpec{HypervisorClusterRef: hfv1.ObjectName{Name: "pve"},
			Bootstrap: hfv1.Bootstrap{GitHub: &hfv1.GitHubBootstrap{Owner: "octo-org", Organization: "octo-org",
				Credentials: hfv1.GitHubCredentials{PAT: &hfv1.LocalSecretKeySelector{Name: "github", Key: "token"}}}}},
		Status: hfv1.HypervisorMachineTemplateStatus{ObservedGeneration: 1, TemplateHash: "hash-1", Conditions: []metav1.Condition{{
			Type: string(hfv1.ReadyCondition), Status: metav1.ConditionTrue, Reason: string(hfv1.ReadyReason), LastTransitionTime: metav1.Now()}}},
	}
	if p.enterprise {
		tmpl.Spec.Bootstrap.GitHub.APIBaseURL = "https://github.example.com/api/v3"
	}
	gh := &hfv1.GitHubWorkload{Organization: "octo-org", Labels: []string{p.label}}
	if p.repo != "" {
		gh = &hfv1.GitHubWorkload{Repository: "octo-org/" + p.repo, Labels: []string{p.label}}
	}
	pool := &hfv1.RunnerPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.key.Namespace, Name: p.key.Name, UID: types.UID("uid-" + p.key.String()), Generation: 1},
		Spec: hfv1.RunnerPoolSpec{
			TemplateRef: hfv1.ObjectName{Name: tmpl.Name},
			Workload:    hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: gh},
			Scaling:     hfv1.Scaling{MaxReplicas: int32(maxReplicas)},
		},
	}
	return []client.Object{tmpl, pool}
}

// claimsByPool counts the MachineClaims of each pool.
func claimsByPool(rt *rapid.T, c client.Client) map[types.NamespacedName]int {
	var list hfv1.MachineClaimList
	if err := c.List(context.Background(), &list); err != nil {
		rt.Fatalf("list claims: %v", err)
	}
	out := map[types.NamespacedName]int{}
	for _, cl := range list.Items {
		if cl.Spec.RunnerPoolRef != nil {
			out[types.NamespacedName{Namespace: cl.Namespace, Name: cl.Spec.RunnerPoolRef.Name}]++
		}
	}
	return out
}

// webhookWorld is controller-runtime's fake client holding objs, with the
// operator's indexes; it names what the API server would name.
func webhookWorld(rt *rapid.T, backends *workload.Backends, objs ...client.Object) client.Client {
	scheme := runtime.NewScheme()
	if err := hfv1.AddToScheme(scheme); err != nil {
		rt.Fatalf("scheme: %v", err)
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		rt.Fatalf("scheme: %v", err)
	}
	b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithStatusSubresource(&hfv1.RunnerPool{}, &hfv1.MachineClaim{}, &hfv1.CIJob{}, &hfv1.HypervisorMachineTemplate{})
	for _, ix := range fieldindex.All(backends) {
		b = b.WithIndex(ix.Obj, ix.Field, ix.Extract)
	}
	var names atomic.Int64
	b = b.WithInterceptorFuncs(interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
		if o.GetName() == "" && o.GetGenerateName() != "" {
			o.SetName(o.GetGenerateName() + strconv.FormatInt(names.Add(1), 10))
		}
		return c.Create(ctx, o, opts...)
	}})
	return b.Build()
}
