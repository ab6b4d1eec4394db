package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
	"github.com/hyperfleet/hyperfleet/internal/poolclaims"
)

// The pool world: one RunnerPool's reconciler on controller-runtime's fake
// client with a fake clock, the cheapest world that decides what the pool
// does with its MachineClaims (properties 9 and 10). The fake client has
// no cache lag, and nothing but the test runs the claims: the test plays
// the MachineClaim controller (a claim asked to end is destroyed and
// deleted, a starting claim's runner comes online, a runner takes a job).

// fatalfer is what the pool world reports a broken world to (a *rapid.T
// or a *testing.T).
type fatalfer interface {
	Helper()
	Fatalf(format string, args ...any)
}

// poolWorld is one pool's reconciler and the objects it reads.
type poolWorld struct {
	t   fatalfer
	c   client.WithWatch
	clk *clocktesting.FakeClock
	r   *RunnerPoolReconciler
	key types.NamespacedName
	// jobs records the job cancellations the reconciler asked for.
	jobs *recordingCanceller
}

// recordingCanceller is a CI platform whose job cancellations always
// succeed; it records the ids of the jobs cancelled.
type recordingCanceller struct {
	mu        sync.Mutex
	cancelled []string
}

func (j *recordingCanceller) CancelJob(_ context.Context, _ *hfv1.RunnerPool, _ *hfv1.HypervisorMachineTemplate, job *hfv1.CIJob) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.cancelled = append(j.cancelled, job.Spec.ID())
	return nil
}

// takeCancelled returns the jobs cancelled since the last call.
func (j *recordingCanceller) takeCancelled() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := j.cancelled
	j.cancelled = nil
	return out
}

const poolWorldNamespace = "team"

// poolWorldTemplate is a ready template of the GitHub Actions pools of the
// pool world.
func poolWorldTemplate() *hfv1.HypervisorMachineTemplate {
	return &hfv1.HypervisorMachineTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: poolWorldNamespace, Name: "debian", Generation: 1},
		Spec: hfv1.HypervisorMachineTemplateSpec{Bootstrap: hfv1.Bootstrap{GitHub: &hfv1.GitHubBootstrap{Owner: "octo-org", Organization: "octo-org",
			Credentials: hfv1.GitHubCredentials{PAT: &hfv1.LocalSecretKeySelector{Name: "github", Key: "token"}}}}},
		Status: hfv1.HypervisorMachineTemplateStatus{ObservedGeneration: 1, TemplateHash: "hash-1", Conditions: []metav1.Condition{{
			Type: string(hfv1.ReadyCondition), Status: metav1.ConditionTrue, Reason: string(hfv1.ReadyReason), LastTransitionTime: metav1.Time{Time: unitEpoch}}}},
	}
}

// poolWorldPool is a GitHub Actions pool of the template with the bounds.
func poolWorldPool(minReplicas, maxReplicas int32) *hfv1.RunnerPool {
	return &hfv1.RunnerPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: poolWorldNamespace, Name: "runners", UID: "pool-uid", Generation: 1},
		Spec: hfv1.RunnerPoolSpec{
			TemplateRef: hfv1.ObjectName{Name: "debian"},
			Workload:    hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{Organization: "octo-org"}},
			Scaling:     hfv1.Scaling{MinReplicas: minReplicas, MaxReplicas: maxReplicas},
		},
	}
}

// newPoolWorld builds the world around pool at now, with the template and
// objs. The reconciler has no replacement backoff (runnerpool_backoff.go
// has its own tests): every claim it ends here ends for a limit or for
// scaling, not for a broken image.
func newPoolWorld(t fatalfer, now time.Time, pool *hfv1.RunnerPool, objs ...client.Object) *poolWorld {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := hfv1.AddToScheme(scheme); err != nil {
		t.Fatalf("scheme: %v", err)
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatalf("scheme: %v", err)
	}
	b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(append(objs, pool, poolWorldTemplate())...).
		WithStatusSubresource(&hfv1.RunnerPool{}, &hfv1.MachineClaim{}, &hfv1.CIJob{}, &hfv1.HypervisorMachineTemplate{})
	for _, ix := range fieldindex.All(ciPlatforms) {
		b = b.WithIndex(ix.Obj, ix.Field, ix.Extract)
	}
	// The fake client neither generates names nor sets creation times.
	var names atomic.Int64
	clk := clocktesting.NewFakeClock(now)
	b = b.WithInterceptorFuncs(interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
		if o.GetName() == "" && o.GetGenerateName() != "" {
			o.SetName(fmt.Sprintf("%s%05d", o.GetGenerateName(), names.Add(1)))
		}
		if ts := o.GetCreationTimestamp(); ts.IsZero() {
			o.SetCreationTimestamp(metav1.NewTime(clk.Now()))
		}
		if o.GetUID() == "" {
			o.SetUID(types.UID("uid-" + o.GetName()))
		}
		return c.Create(ctx, o, opts...)
	}})
	jobs := &recordingCanceller{}
	w := &poolWorld{t: t, c: b.Build(), clk: clk, key: client.ObjectKeyFromObject(pool), jobs: jobs}
	w.r = &RunnerPoolReconciler{Client: w.c, Recorder: &record.FakeRecorder{}, Clock: clk, Scopes: scopesVouched{}, Workloads: ciPlatforms, Jobs: jobs}
	return w
}

// pass runs one reconcile of the pool, as the manager would after a
// claim or job event or the pass's requeue.
func (w *poolWorld) pass() ctrl.Result {
	w.t.Helper()
	res, err := w.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: w.key})
	if err != nil {
		w.t.Fatalf("reconcile RunnerPool %s at %s: %v", w.key, w.clk.Now().Format(time.TimeOnly), err)
	}
	return res
}

// pool reads the pool.
func (w *poolWorld) pool() *hfv1.RunnerPool {
	w.t.Helper()
	p := &hfv1.RunnerPool{}
	if err := w.c.Get(context.Background(), w.key, p); err != nil {
		w.t.Fatalf("get RunnerPool: %v", err)
	}
	return p
}

// editPool changes the pool's spec.
func (w *poolWorld) editPool(edit func(*hfv1.RunnerPool)) {
	w.t.Helper()
	p := w.pool()
	edit(p)
	p.Generation++
	if err := w.c.Update(context.Background(), p); err != nil {
		w.t.Fatalf("update RunnerPool: %v", err)
	}
}

// claims lists the pool's claims, by name.
func (w *poolWorld) claims() map[string]*hfv1.MachineClaim {
	w.t.Helper()
	var list hfv1.MachineClaimList
	if err := w.c.List(context.Background(), &list, client.InNamespace(w.key.Namespace)); err != nil {
		w.t.Fatalf("list claims: %v", err)
	}
	out := make(map[string]*hfv1.MachineClaim, len(list.Items))
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out
}

// sortedClaims lists the pool's claims by name (the test's choices among
// them must not depend on map order: rapid replays a case by its draws).
func (w *poolWorld) sortedClaims() []*hfv1.MachineClaim {
	w.t.Helper()
	m := w.claims()
	out := make([]*hfv1.MachineClaim, 0, len(m))
	for _, c := range m {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *hfv1.MachineClaim) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func (w *poolWorld) ctx() context.Context { return context.Background() }

// jobList lists the pool's CIJobs.
func (w *poolWorld) jobList() []hfv1.CIJob {
	w.t.Helper()
	var list hfv1.CIJobList
	if err := w.c.List(context.Background(), &list, client.InNamespace(w.key.Namespace)); err != nil {
		w.t.Fatalf("list CIJobs: %v", err)
	}
	return list.Items
}

// stateOf is a claim's state as the pool counts it.
func stateOf(c *hfv1.MachineClaim) poolclaims.State { return poolclaims.StateOf(c, false) }

// isLive reports whether a claim is, or will be, a runner (starting, idle
// or busy: not asked to end).
func isLive(c *hfv1.MachineClaim) bool {
	s := stateOf(c)
	return s == poolclaims.Starting || s == poolclaims.Idle || s == poolclaims.Busy
}

// endClaims plays the claim controller on the claims asked to end: their
// VM is destroyed and the claim deleted. It returns the names ended with
// their spec.end.
func (w *poolWorld) endClaims() map[string]*hfv1.MachineClaimEndRequest {
	w.t.Helper()
	out := map[string]*hfv1.MachineClaimEndRequest{}
	for name, c := range w.claims() {
		if c.Spec.End == nil {
			continue
		}
		out[name] = c.Spec.End
		w.destroy(c)
	}
	return out
}

// destroy plays the claim controller on a claim whose VM is gone: its
// finalizer (which its pool wrote in its creation) goes, and so does the
// claim.
func (w *poolWorld) destroy(c *hfv1.MachineClaim) {
	w.t.Helper()
	if controllerutil.RemoveFinalizer(c, hfv1.MachineClaimFinalizer) {
		if err := w.c.Update(context.Background(), c); err != nil {
			w.t.Fatalf("remove the finalizer of claim %s: %v", c.Name, err)
		}
	}
	if err := w.c.Delete(context.Background(), c); err != nil {
		w.t.Fatalf("delete claim %s: %v", c.Name, err)
	}
}

// updateClaimStatus writes a claim's status as the claim controller would.
func (w *poolWorld) updateClaimStatus(c *hfv1.MachineClaim) {
	w.t.Helper()
	if err := w.c.Status().Update(context.Background(), c); err != nil {
		w.t.Fatalf("update claim %s status: %v", c.Name, err)
	}
}

// comeOnline plays a starting claim's runner registering now: the claim
// becomes idle.
func (w *poolWorld) comeOnline(c *hfv1.MachineClaim) {
	w.t.Helper()
	now := metav1.NewTime(w.clk.Now())
	setOnline(c, now)
	w.updateClaimStatus(c)
}

// setOnline marks a claim's runner online (idle) since at.
func setOnline(c *hfv1.MachineClaim, at metav1.Time) {
	if c.Status.Bootstrap == nil {
		c.Status.Bootstrap = &hfv1.BootstrapStatus{RunnerName: c.Name}
	}
	c.Status.Bootstrap.RegisteredAt = &at
	c.Status.Conditions = append(c.Status.Conditions, metav1.Condition{
		Type: string(hfv1.MachineClaimBootstrappedCondition), Status: metav1.ConditionTrue, Reason: string(hfv1.RunnerOnlineReason),
		LastTransitionTime: at,
	})
}

// setBusy marks a claim's runner running job id since at.
func setBusy(c *hfv1.MachineClaim, id int64, at metav1.Time) {
	if c.Status.Bootstrap == nil {
		c.Status.Bootstrap = &hfv1.BootstrapStatus{RunnerName: c.Name}
	}
	c.Status.Bootstrap.JobID = id
	c.Status.Bootstrap.JobStartedAt = &at
	c.Status.Bootstrap.RunnerState = hfv1.RunnerStateBusy
}

// poolWorldJob is a CIJob of the pool in state, queued at at.
func poolWorldJob(id int64, state hfv1.CIJobState, at time.Time) *hfv1.CIJob {
	return &hfv1.CIJob{
		ObjectMeta: metav1.ObjectMeta{Namespace: poolWorldNamespace, Name: fmt.Sprintf("github-actions-%d", id),
			Labels: map[string]string{hfv1.RunnerPoolLabel: "runners"}, CreationTimestamp: metav1.NewTime(at)},
		Spec:   hfv1.CIJobSpec{JobID: id, Platform: hfv1.WorkloadGitHubActions, RunnerPoolRef: hfv1.ObjectName{Name: "runners"}},
		Status: hfv1.CIJobStatus{State: state},
	}
}

// poolWorldClaim is a claim of pool created at created, with the
// controller reference the pool gives its own.
func poolWorldClaim(pool *hfv1.RunnerPool, name string, created time.Time) *hfv1.MachineClaim {
	return &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: pool.Namespace, Name: name, UID: types.UID("uid-" + name),
			CreationTimestamp: metav1.NewTime(created),
			Labels:            map[string]string{hfv1.RunnerPoolLabel: pool.Name},
			OwnerReferences:   []metav1.OwnerReference{*metav1.NewControllerRef(pool, hfv1.GroupVersion.WithKind("RunnerPool"))}},
		Spec:   hfv1.MachineClaimSpec{TemplateRef: pool.Spec.TemplateRef, RunnerPoolRef: &hfv1.ObjectName{Name: pool.Name}},
		Status: hfv1.MachineClaimStatus{TemplateHash: "hash-1"},
	}
}
