package controller_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/ipam"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// The cheap world of the controller suite's property tests: the operator's
// reconcilers built as internal/manager/manager.go's Setup builds them, on
// controller-runtime's fake client (the status subresources and the field
// indexes the manager registers), the real Proxmox provider against the
// in-process Proxmox simulator, and one fake clock for both. A driver
// stands in for the manager's queues: a change of an object wakes it and
// the objects whose watches map to it (woken: over-approximated, since the
// reconcilers are level-based and an extra pass must change nothing), and
// each object runs again when the RequeueAfter it asked for falls due, the
// clocks moved straight there. Nothing sleeps; a claim's whole life
// costs some tens of milliseconds of CPU (TestCheapWorldRunsAClaim).
//
// What the world adds to the fake client, as the API server would: UIDs,
// names for a generateName, creation times, generations that move with the
// spec, and Secrets' stringData folded into data. What it cannot decide
// stays with the real API server's scenario tests: the CRDs' validation
// (CEL rules, bounds), garbage collection, watch timing and the manager's
// wiring. Because the driver wakes more than the watches do, a missing
// watch or a requeue that is too late may go unnoticed here; a requeue that
// is too early does not (the backoff of property 8 is measured on the fake
// clock, exactly).

// cheapEpoch is where the cheap world's clocks start.
var cheapEpoch = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// cheapSim is one Proxmox simulator on loopback TLS whose tasks run on the
// world's fake time.
type cheapSim struct {
	*proxmoxsim.Simulator
	clock       *proxmoxsim.FakeClock
	url         string
	fingerprint string
	// onRequest, when set, sees every request before the simulator (at
	// the simulator's fake time); onResponse sees it with the status code
	// answered (0 when the simulator took the connection over: its
	// hand-written errors and dropped connections).
	onRequest  atomic.Pointer[func(*http.Request, time.Time)]
	onResponse atomic.Pointer[func(*http.Request, int)]
}

// cheapEvent is one event a reconciler recorded.
type cheapEvent struct {
	UID                   types.UID
	Kind, Namespace, Name string
	Type, Reason, Message string
	At                    time.Time
}

// cheapEventLog is the reconcilers' record.EventRecorder: every event, in order,
// with the object it is about.
type cheapEventLog struct {
	clock  *clocktesting.FakeClock
	mu     sync.Mutex
	events []cheapEvent
}

func (l *cheapEventLog) Event(obj runtime.Object, eventtype, reason, message string) {
	e := cheapEvent{Type: eventtype, Reason: reason, Message: message, At: l.clock.Now()}
	if o, ok := obj.(client.Object); ok {
		e.UID, e.Namespace, e.Name = o.GetUID(), o.GetNamespace(), o.GetName()
		e.Kind = reflect.TypeOf(obj).Elem().Name()
	}
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func (l *cheapEventLog) Eventf(obj runtime.Object, eventtype, reason, messageFmt string, args ...any) {
	l.Event(obj, eventtype, reason, fmt.Sprintf(messageFmt, args...))
}

func (l *cheapEventLog) AnnotatedEventf(obj runtime.Object, _ map[string]string, eventtype, reason, messageFmt string, args ...any) {
	l.Eventf(obj, eventtype, reason, messageFmt, args...)
}

// of counts the events about the object with uid, by reason.
func (l *cheapEventLog) of(uid types.UID) map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for _, e := range l.events {
		if e.UID == uid {
			out[e.Reason]++
		}
	}
	return out
}

// cheapKey names one object the driver reconciles.
type cheapKey struct {
	kind string
	key  types.NamespacedName
}

// cheapWorld is the operator's reconcilers on a fake API server and fake
// time. Tests read and write Kube as a user would, then call run.
type cheapWorld struct {
	// t reports failures: the test, or the rapid case running (Case).
	t      cheapT
	tb     testing.TB
	ctx    context.Context
	Kube   client.WithWatch
	Clock  *clocktesting.FakeClock
	Events *cheapEventLog
	sims   []*cheapSim

	Registry  *hypervisors.Registry
	Clusters  *controller.HypervisorClusterReconciler
	Templates *controller.HypervisorMachineTemplateReconciler
	IPPools   *controller.IPPoolReconciler
	Claims    *machineclaim.Reconciler
	Pools     *controller.RunnerPoolReconciler

	// due is when each object asked to be reconciled again; failures
	// counts each object's errors in a row (the workqueue's backoff).
	due      map[cheapKey]time.Time
	failures map[cheapKey]int
	// errs are the objects' last errors, for failure messages.
	errs map[cheapKey]error
	// versions is the world as the last round found it when it began
	// (kind/key -> resourceVersion): a difference is a watch event.
	versions map[string]string
	objs     map[string]client.Object
	// writes counts the successful writes (wrote): atomic, since a pool
	// creates its claims from several goroutines at once.
	writes atomic.Int64
	// Reconciles counts the passes run, for the tests' reports.
	Reconciles int
	names      atomic.Int64
}

// cheapT is what the world reports failures to: a *testing.T or a
// *rapid.T.
type cheapT interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
}

// Case makes the world report to the rapid case t until the returned
// func is called: a failure then fails the case, which rapid shrinks.
func (w *cheapWorld) Case(t cheapT) func() {
	w.t = t
	return func() { w.t = w.tb }
}

// cheapOptions shape a cheapWorld.
type cheapOptions struct {
	// minRetryDelay and maxRetryDelay are the claims' backoff (the
	// manager's --claim-*-retry-delay; zero: the defaults).
	minRetryDelay, maxRetryDelay time.Duration
}

// cheapScheme holds the kinds the reconcilers read and write.
func cheapScheme(t testing.TB) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := hfv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := corev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

// cheapBackends are the CI platform back-ends the operator binary
// registers, as the manager builds them.
func cheapBackends(t testing.TB) *workload.Backends {
	t.Helper()
	b, err := workload.NewBackends(githubsimtest.Workloads(), workload.Dependencies{})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// cheapCI is the claims' CI platforms with testBootstrap standing in for
// the accounts, as manager.Setup wires them for the envtest operator.
type cheapCI struct {
	testBootstrap
	backends *workload.Backends
}

func (c cheapCI) Workloads() *workload.Backends { return c.backends }

// newCheapWorld builds the reconcilers as internal/manager's Setup does,
// with what the envtest operator of startOperator runs (testBootstrap for
// the CI accounts, testSigner), on a fake API server holding a namespace
// for the tests' objects and the clusters' Secret namespace.
func newCheapWorld(t testing.TB, o cheapOptions) *cheapWorld {
	t.Helper()
	w := &cheapWorld{t: t, tb: t, ctx: context.Background(), Clock: clocktesting.NewFakeClock(cheapEpoch),
		due: map[cheapKey]time.Time{}, failures: map[cheapKey]int{}, errs: map[cheapKey]error{}, versions: map[string]string{}}
	w.Events = &cheapEventLog{clock: w.Clock}
	backends := cheapBackends(t)
	b := fake.NewClientBuilder().WithScheme(cheapScheme(t)).
		WithStatusSubresource(&hfv1.HypervisorCluster{}, &hfv1.HypervisorMachineTemplate{}, &hfv1.IPPool{}, &hfv1.RunnerPool{}, &hfv1.MachineClaim{}, &hfv1.CIJob{})
	for _, ix := range fieldindex.All(backends) {
		b = b.WithIndex(ix.Obj, ix.Field, ix.Extract)
	}
	w.Kube = b.WithInterceptorFuncs(interceptor.Funcs{Create: w.create, Update: w.update, Patch: w.patch,
		Delete: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.DeleteOption) error {
			return w.wrote(c.Delete(ctx, o, opts...))
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, o client.Object, opts ...client.SubResourceUpdateOption) error {
			return w.wrote(c.SubResource(sub).Update(ctx, o, opts...))
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, o client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
			return w.wrote(c.SubResource(sub).Patch(ctx, o, p, opts...))
		},
	}).Build()
	w.Registry = hypervisors.NewRegistry()
	addresses := ipam.NewManager()
	w.Clusters = &controller.HypervisorClusterReconciler{
		Client: w.Kube, Registry: w.Registry, Factories: provider.Factories(provider.Registered()), Signer: testSigner,
		Recorder: w.Events, Clock: w.Clock,
	}
	w.Templates = &controller.HypervisorMachineTemplateReconciler{Client: w.Kube, Registry: w.Registry, Recorder: w.Events, Workloads: backends}
	w.IPPools = &controller.IPPoolReconciler{Client: w.Kube, IPAM: addresses, Recorder: w.Events}
	w.Claims = &machineclaim.Reconciler{
		Client: w.Kube, Registry: w.Registry, IPAM: addresses, Signer: testSigner, Recorder: w.Events, Clock: w.Clock,
		CI: cheapCI{backends: backends}, Identity: machineclaim.IdentityService{Credentials: testBootstrap{}}, Runners: machineclaim.NewRunnerObservations(),
		Retry:    machineclaim.RetryDelays{First: o.minRetryDelay, Max: o.maxRetryDelay},
		PowerOff: machineclaim.PowerOff{Transitions: hypervisors.NewTransitions(hypervisors.TransitionOptions{})},
	}
	w.Pools = &controller.RunnerPoolReconciler{Client: w.Kube, Recorder: w.Events, Clock: w.Clock, Scopes: testBootstrap{}, Workloads: backends}
	w.Create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cheapNamespace, Labels: map[string]string{"hyperfleet.io/tenant": "yes"}}})
	w.Create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: secretNamespace}})
	return w
}

// cheapNamespace holds the tests' templates, claims and pools.
const cheapNamespace = "team-a"

// create gives a new object what the API server would: a name for a
// generateName, a UID, generation 1 and its creation time.
func (w *cheapWorld) create(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
	if o.GetName() == "" && o.GetGenerateName() != "" {
		o.SetName(fmt.Sprintf("%s%05d", o.GetGenerateName(), w.names.Add(1)))
	}
	if o.GetUID() == "" {
		o.SetUID(types.UID(fmt.Sprintf("00000000-0000-4000-8000-%012d", w.names.Add(1))))
	}
	o.SetGeneration(1)
	o.SetCreationTimestamp(metav1.NewTime(w.Clock.Now()))
	foldStringData(o)
	return w.wrote(c.Create(ctx, o, opts...))
}

// wrote counts a successful write: a round that made none leaves the
// world as it found it.
func (w *cheapWorld) wrote(err error) error {
	if err == nil {
		w.writes.Add(1)
	}
	return err
}

// foldStringData writes a Secret's stringData into its data, as the API
// server does (the fake client stores stringData as it is).
func foldStringData(o client.Object) {
	s, ok := o.(*corev1.Secret)
	if !ok || len(s.StringData) == 0 {
		return
	}
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	for k, v := range s.StringData {
		s.Data[k] = []byte(v)
	}
	s.StringData = nil
}

// specOf is an object's spec, nil for a kind without one.
func cheapSpecOf(o client.Object) any {
	v := reflect.ValueOf(o)
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return nil
	}
	if f := v.FieldByName("Spec"); f.IsValid() {
		return f.Interface()
	}
	return nil
}

// update moves the generation when the spec changes, as the API server
// does for the kinds with a status subresource (the fake client never
// does).
func (w *cheapWorld) update(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.UpdateOption) error {
	foldStringData(o)
	old := o.DeepCopyObject().(client.Object)
	if err := c.Get(ctx, client.ObjectKeyFromObject(o), old); err == nil {
		o.SetGeneration(old.GetGeneration())
		if !equality.Semantic.DeepEqual(cheapSpecOf(old), cheapSpecOf(o)) {
			o.SetGeneration(old.GetGeneration() + 1)
		}
	}
	return w.wrote(c.Update(ctx, o, opts...))
}

// patch applies the patch, then moves the generation if the spec changed.
func (w *cheapWorld) patch(ctx context.Context, c client.WithWatch, o client.Object, p client.Patch, opts ...client.PatchOption) error {
	old := o.DeepCopyObject().(client.Object)
	if err := c.Get(ctx, client.ObjectKeyFromObject(o), old); err != nil {
		return w.wrote(c.Patch(ctx, o, p, opts...))
	}
	if err := w.wrote(c.Patch(ctx, o, p, opts...)); err != nil {
		return err
	}
	if cheapSpecOf(old) == nil || equality.Semantic.DeepEqual(cheapSpecOf(old), cheapSpecOf(o)) {
		return nil
	}
	o.SetGeneration(old.GetGeneration() + 1)
	return c.Update(ctx, o)
}

// Create creates obj as a user would; a failure fails the test.
func (w *cheapWorld) Create(obj client.Object) {
	w.t.Helper()
	if err := w.Kube.Create(w.ctx, obj); err != nil {
		w.t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

// Edit reads obj, changes it with mutate and writes it back, as a user
// would (nothing else writes in between: the driver runs only in run).
func cheapEdit[O client.Object](w *cheapWorld, obj O, mutate func(O)) {
	w.t.Helper()
	if err := w.Kube.Get(w.ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		w.t.Fatalf("edit %T %s: %v", obj, obj.GetName(), err)
	}
	mutate(obj)
	if err := w.Kube.Update(w.ctx, obj); err != nil {
		w.t.Fatalf("edit %T %s: %v", obj, obj.GetName(), err)
	}
}

// Get reads obj back; ok is false when it is gone.
func (w *cheapWorld) Get(obj client.Object) bool {
	w.t.Helper()
	err := w.Kube.Get(w.ctx, client.ObjectKeyFromObject(obj), obj)
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		w.t.Fatal(err)
	}
	return true
}

// Delete deletes obj (its finalizers keep it until the reconcilers let go).
func (w *cheapWorld) Delete(obj client.Object) {
	w.t.Helper()
	if err := w.Kube.Delete(w.ctx, obj); err != nil && !apierrors.IsNotFound(err) {
		w.t.Fatalf("delete %T %s: %v", obj, obj.GetName(), err)
	}
}

// StartSim starts a Proxmox simulator on the world's fake time, mutated by
// mutate.
func (w *cheapWorld) StartSim(mutate func(*proxmoxsim.Config)) *cheapSim {
	w.t.Helper()
	cfg := proxmoxsim.DefaultConfig()
	cfg.AuthFailureDelay = 0
	cfg.RefreshInterval = proxmoxsim.Duration(100 * time.Millisecond)
	// Every step a real task of a few milliseconds: the time is fake, but
	// each poll of a task still costs a pass.
	ms := func(n int) proxmoxsim.Duration { return proxmoxsim.Duration(time.Duration(n) * time.Millisecond) }
	cfg.Latency = proxmoxsim.Latency{CloneBase: ms(20), Config: ms(5), Resize: ms(5), Start: ms(5), Boot: ms(30),
		Stop: ms(5), Shutdown: ms(10), Destroy: ms(10), Upload: ms(5)}
	if mutate != nil {
		mutate(&cfg)
	}
	s := &cheapSim{clock: proxmoxsim.NewFakeClock(w.Clock.Now())}
	sim, err := proxmoxsim.New(cfg, proxmoxsim.WithClock(s.clock), proxmoxsim.WithAdmin(true))
	if err != nil {
		w.t.Fatalf("simulator: %v", err)
	}
	s.Simulator = sim
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if hook := s.onRequest.Load(); hook != nil {
			(*hook)(r, s.clock.Now())
		}
		if hook := s.onResponse.Load(); hook != nil {
			serveRecorded(sim, rw, r, *hook)
			return
		}
		sim.ServeHTTP(rw, r)
	}))
	srv.StartTLS()
	w.tb.Cleanup(func() {
		srv.Close()
		_ = sim.Close()
	})
	s.url = srv.URL + "/api2/json"
	s.fingerprint = proxmoxsim.FormatFingerprint(sha256.Sum256(srv.Certificate().Raw))
	w.sims = append(w.sims, s)
	return s
}

// Advance moves every clock of the world by d: the simulators' tasks fall
// due, and so do the reconcilers' requeues.
func (w *cheapWorld) Advance(d time.Duration) {
	if d <= 0 {
		return
	}
	w.Clock.Step(d)
	for _, s := range w.sims {
		s.clock.Advance(d)
	}
}

// cheapCluster is a HypervisorCluster of sim (its token Secret created
// unless the caller wants it missing), as newFixture makes it.
func cheapCluster(name string, sim *cheapSim) (*hfv1.HypervisorCluster, *corev1.Secret) {
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: secretNamespace, Name: name},
		Data:       map[string][]byte{"id": []byte(simTokenID), "secret": []byte(simTokenSecret)},
	}
	cluster := &hfv1.HypervisorCluster{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: hfv1.HypervisorClusterSpec{
			Provider: hfv1.ProviderProxmox,
			Endpoint: sim.url,
			Credentials: hfv1.HypervisorCredentials{
				TokenID:     &hfv1.SecretKeySelector{Namespace: secretNamespace, Name: name, Key: "id"},
				TokenSecret: &hfv1.SecretKeySelector{Namespace: secretNamespace, Name: name, Key: "secret"},
			},
			TLS:          &hfv1.HypervisorTLS{FingerprintSHA256: sim.fingerprint},
			Proxmox:      &hfv1.ProxmoxClusterSettings{VMIDRange: &hfv1.VMIDRange{Start: 1000, End: 1999}},
			PollInterval: &metav1.Duration{Duration: 5 * time.Second},
		},
	}
	return cluster, secret
}

// cheapTemplate is a template of cluster cloning template 9000, with the
// GitHub bootstrap of newFixture's template (its PAT Secret is created
// with the world: see AddCluster).
func cheapTemplate(name, cluster string) *hfv1.HypervisorMachineTemplate {
	return &hfv1.HypervisorMachineTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: cheapNamespace, Name: name},
		Spec: hfv1.HypervisorMachineTemplateSpec{
			HypervisorClusterRef: hfv1.ObjectName{Name: cluster},
			Source:               hfv1.MachineSource{Proxmox: hfv1.ProxmoxSource{TemplateID: ptr.To[int32](9000)}},
			Resources:            hfv1.MachineResources{CPU: 2, Memory: resource.MustParse("2Gi")},
			Bootstrap: hfv1.Bootstrap{GitHub: &hfv1.GitHubBootstrap{
				Owner:        "octo-org",
				Organization: "octo-org",
				Credentials:  hfv1.GitHubCredentials{PAT: &hfv1.LocalSecretKeySelector{Name: "github", Key: "token"}},
			}},
		},
	}
}

// cheapClaim is a claim of the template.
func cheapClaim(name, template string) *hfv1.MachineClaim {
	return &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: cheapNamespace, Name: name},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: template}},
	}
}

// AddCluster creates a connected-to-be cluster of sim, its Secret, and the
// GitHub PAT Secret the templates name, and returns the cluster.
func (w *cheapWorld) AddCluster(name string, sim *cheapSim) *hfv1.HypervisorCluster {
	w.t.Helper()
	cluster, secret := cheapCluster(name, sim)
	w.Create(secret)
	w.Create(cluster)
	w.ensurePATSecret()
	return cluster
}

func (w *cheapWorld) ensurePATSecret() {
	w.t.Helper()
	pat := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: cheapNamespace, Name: "github"},
		Data: map[string][]byte{"token": []byte("ghp_longLivedPATthatMustNeverLeaveTheOperator")}}
	if err := w.Kube.Create(w.ctx, pat); err != nil && !apierrors.IsAlreadyExists(err) {
		w.t.Fatal(err)
	}
}

// cheapKinds are the kinds the driver reconciles, in the order a round
// visits them (what others depend on first).
var cheapKinds = []string{"HypervisorCluster", "HypervisorMachineTemplate", "IPPool", "RunnerPool", "MachineClaim"}

// keys lists the objects of every kind, and the world's resource versions
// (objects of every kind the reconcilers read, Secrets included).
func (w *cheapWorld) keys() ([]cheapKey, map[string]string, map[string]client.Object) {
	w.t.Helper()
	var out []cheapKey
	versions := map[string]string{}
	objs := map[string]client.Object{}
	add := func(kind string, items []client.Object) {
		for _, o := range items {
			k := cheapKey{kind: kind, key: client.ObjectKeyFromObject(o)}
			if slices.Contains(cheapKinds, kind) {
				out = append(out, k)
			}
			versions[kind+"/"+k.key.String()] = o.GetResourceVersion()
			objs[kind+"/"+k.key.String()] = o
		}
	}
	lists := []struct {
		kind string
		list client.ObjectList
	}{
		{"HypervisorCluster", &hfv1.HypervisorClusterList{}},
		{"HypervisorMachineTemplate", &hfv1.HypervisorMachineTemplateList{}},
		{"IPPool", &hfv1.IPPoolList{}},
		{"RunnerPool", &hfv1.RunnerPoolList{}},
		{"MachineClaim", &hfv1.MachineClaimList{}},
		{"CIJob", &hfv1.CIJobList{}},
		{"Secret", &corev1.SecretList{}},
	}
	for _, l := range lists {
		if err := w.Kube.List(w.ctx, l.list); err != nil {
			w.t.Fatalf("list %s: %v", l.kind, err)
		}
		items, err := meta.ExtractList(l.list)
		if err != nil {
			w.t.Fatal(err)
		}
		var objs []client.Object
		for _, it := range items {
			objs = append(objs, it.(client.Object))
		}
		add(l.kind, objs)
	}
	return out, versions, objs
}

// woken are the objects the watches of the manager wake for a change of
// obj (of kind): the object itself and, as internal/controller's
// SetupWithManager functions map them, a claim's pool, a pool's claims, a
// template's claims and pools, and for a cluster, an IPPool, a Secret or a
// CIJob everything that may read it.
func woken(kind string, obj client.Object, all map[string]client.Object) map[cheapKey]bool {
	out := map[cheapKey]bool{}
	if slices.Contains(cheapKinds, kind) {
		out[cheapKey{kind: kind, key: client.ObjectKeyFromObject(obj)}] = true
	}
	for id, o := range all {
		okind, _, _ := strings.Cut(id, "/")
		k := cheapKey{kind: okind, key: client.ObjectKeyFromObject(o)}
		switch {
		case !slices.Contains(cheapKinds, okind):
		case kind == "MachineClaim":
			if okind == "RunnerPool" && o.GetNamespace() == obj.GetNamespace() && o.GetName() == obj.GetLabels()[hfv1.RunnerPoolLabel] {
				out[k] = true
			}
		case kind == "RunnerPool":
			if okind == "MachineClaim" && o.GetNamespace() == obj.GetNamespace() && o.GetLabels()[hfv1.RunnerPoolLabel] == obj.GetName() {
				out[k] = true
			}
		case kind == "HypervisorMachineTemplate":
			switch c := o.(type) {
			case *hfv1.MachineClaim:
				out[k] = out[k] || c.Namespace == obj.GetNamespace() && c.Spec.TemplateRef.Name == obj.GetName()
			case *hfv1.RunnerPool:
				out[k] = out[k] || c.Namespace == obj.GetNamespace() && c.Spec.TemplateRef.Name == obj.GetName()
			}
		default:
			if okind != kind {
				out[k] = true
			}
		}
	}
	for k, v := range out {
		if !v {
			delete(out, k)
		}
	}
	return out
}

func (w *cheapWorld) reconcile(k cheapKey) (ctrl.Result, error) {
	req := ctrl.Request{NamespacedName: k.key}
	w.Reconciles++
	switch k.kind {
	case "HypervisorCluster":
		return w.Clusters.Reconcile(w.ctx, req)
	case "HypervisorMachineTemplate":
		return w.Templates.Reconcile(w.ctx, req)
	case "IPPool":
		return w.IPPools.Reconcile(w.ctx, req)
	case "RunnerPool":
		return w.Pools.Reconcile(w.ctx, req)
	case "MachineClaim":
		return w.Claims.Reconcile(w.ctx, req)
	}
	return ctrl.Result{}, fmt.Errorf("no reconciler for %s", k.kind)
}

// record schedules k's next pass from its result, as controller-runtime's
// queue does: an error backs off (5 ms doubling, the queue's default), a
// terminal error and a plain success ask nothing, RequeueAfter adds the
// pass at that time (the queue keeps the earliest one pending).
func (w *cheapWorld) record(k cheapKey, res ctrl.Result, err error) {
	now := w.Clock.Now()
	var at time.Time
	switch {
	case err != nil && !cheapIsTerminal(err):
		w.failures[k]++
		at = now.Add(min(5*time.Millisecond<<min(w.failures[k]-1, 30), 1000*time.Second))
	case err != nil:
		delete(w.failures, k)
	case res.RequeueAfter > 0:
		delete(w.failures, k)
		at = now.Add(res.RequeueAfter)
	case res.Requeue: //nolint:staticcheck // the queue still honours it
		w.failures[k]++
		at = now.Add(5 * time.Millisecond << min(w.failures[k]-1, 30))
	default:
		delete(w.failures, k)
	}
	if at.IsZero() {
		return
	}
	if old, ok := w.due[k]; !ok || !old.After(now) || at.Before(old) {
		w.due[k] = at
	}
}

// cheapIsTerminal reports a reconcile.TerminalError, which the queue
// does not retry.
func cheapIsTerminal(err error) bool {
	return errors.Is(err, reconcile.TerminalError(nil))
}

// round runs one round at the current time: every object when the world
// changed since the last round, otherwise the objects whose pass is due.
// It reports whether the world changed.
func (w *cheapWorld) round() bool {
	w.t.Helper()
	keys, versions, objs := w.keys()
	writes := w.writes.Load()
	// What changed since the last round began (a watch event each) wakes
	// what the watches would.
	wake := map[cheapKey]bool{}
	for id, v := range versions {
		if w.versions[id] != v {
			kind, _, _ := strings.Cut(id, "/")
			maps.Copy(wake, woken(kind, objs[id], objs))
		}
	}
	for id := range w.versions {
		if _, ok := versions[id]; !ok && w.objs[id] != nil {
			kind, _, _ := strings.Cut(id, "/")
			maps.Copy(wake, woken(kind, w.objs[id], objs))
		}
	}
	now := w.Clock.Now()
	// A gone object's pending pass finds nothing; the queue would run it
	// once and forget it.
	for k := range w.due {
		if !slices.Contains(keys, k) {
			delete(w.due, k)
			delete(w.failures, k)
			delete(w.errs, k)
		}
	}
	for _, k := range keys {
		at, due := w.due[k]
		if !wake[k] && (!due || at.After(now)) {
			continue
		}
		if due && !at.After(now) {
			delete(w.due, k)
		}
		res, err := w.reconcile(k)
		if err != nil {
			w.errs[k] = err
		} else {
			delete(w.errs, k)
		}
		w.record(k, res, err)
	}
	// The next round compares with this round's start, so that what the
	// passes of this round wrote wakes what it concerns, as the watches
	// would.
	w.versions, w.objs = versions, objs
	return w.writes.Load() != writes
}

// next is the earliest pass that falls due after now.
func (w *cheapWorld) next() (time.Time, bool) {
	var out time.Time
	for _, at := range w.due {
		if out.IsZero() || at.Before(out) {
			out = at
		}
	}
	return out, !out.IsZero()
}

// maxRoundsAtOnce bounds the rounds the driver runs without moving the
// clock: a world that still changes after that many is writing in a loop.
const maxRoundsAtOnce = 50

// RunUntil runs the operator until done holds, moving the fake time from
// one requeue to the next, for at most limit of fake time; the test fails
// if done never holds. done is checked after every round.
func (w *cheapWorld) RunUntil(limit time.Duration, what string, done func() error) {
	w.t.Helper()
	if err := w.run(limit, done); err != nil {
		w.t.Fatalf("%s: not reached within %s of fake time: %v%s", what, limit, err, w.errorsNow())
	}
}

// RunFor runs the operator for d of fake time (a claim that must not move
// is checked over a stretch of time: check runs after every round and
// fails the test with its error).
func (w *cheapWorld) RunFor(d time.Duration, what string, check func() error) {
	w.t.Helper()
	end := w.Clock.Now().Add(d)
	err := w.run(d, func() error {
		if check != nil {
			if err := check(); err != nil {
				w.t.Fatalf("%s, %s into the run: %v", what, w.Clock.Now().Sub(end.Add(-d)), err)
			}
		}
		return errCheapNotYet
	})
	if err != nil && !errors.Is(err, errCheapNotYet) {
		w.t.Fatalf("%s: %v", what, err)
	}
}

// errorsNow lists the reconcilers' last errors, for a failure message.
func (w *cheapWorld) errorsNow() string {
	var b strings.Builder
	for k, err := range w.errs {
		fmt.Fprintf(&b, "\n  %s %s: %v", k.kind, k.key, err)
	}
	return b.String()
}

var errCheapNotYet = errors.New("not yet")

func (w *cheapWorld) run(limit time.Duration, done func() error) error {
	end := w.Clock.Now().Add(limit)
	rounds := 0
	for {
		changed := w.round()
		err := done()
		if err == nil {
			return nil
		}
		rounds++
		if changed && rounds < maxRoundsAtOnce {
			continue
		}
		if changed {
			return fmt.Errorf("the world still changes after %d rounds at %s: a reconciler writes in a loop (%w)", rounds, w.Clock.Now().Format(time.RFC3339Nano), err)
		}
		rounds = 0
		at, ok := w.next()
		now := w.Clock.Now()
		if !ok || at.After(end) {
			// Nothing asked for a pass before the end: time passes.
			if now.Before(end) {
				w.Advance(end.Sub(now))
				continue
			}
			return err
		}
		// A pass due now that changed nothing still moves time on by a
		// millisecond, so that a reconciler asking for "again now" cannot
		// stall the run.
		w.Advance(max(at.Sub(now), time.Millisecond))
	}
}

// cheapVMsOf are the simulator's VMs whose ownership block names uid.
func cheapVMsOf(sim *proxmoxsim.Simulator, uid string) []proxmoxsim.VMState {
	var out []proxmoxsim.VMState
	for _, vm := range sim.VMs() {
		if strings.Contains(vm.Description, "uid: "+uid) {
			out = append(out, vm)
		}
	}
	return out
}

// hasVM checks that the claim has its VM on sim.
func (w *cheapWorld) hasVM(sim *cheapSim, claim *hfv1.MachineClaim) error {
	if !w.Get(claim) {
		return errors.New("claim gone")
	}
	if len(cheapVMsOf(sim.Simulator, string(claim.UID))) == 0 {
		return fmt.Errorf("no VM: phase %s, conditions %v", claim.Status.Phase, claim.Status.Conditions)
	}
	return nil
}

// removeAll deletes the objects, waits until they are gone and checks
// that no VM of the claims is left on sim: the claim's finalizer held it
// until its VM was destroyed.
func (w *cheapWorld) removeAll(sim *cheapSim, objs ...client.Object) {
	w.t.Helper()
	var claims []*hfv1.MachineClaim
	for _, o := range objs {
		if c, ok := o.(*hfv1.MachineClaim); ok && w.Get(c) {
			claims = append(claims, c)
		}
		w.Delete(o)
	}
	w.RunUntil(10*time.Minute, "the case's objects gone", func() error {
		for _, o := range objs {
			if w.Get(o.DeepCopyObject().(client.Object)) {
				return fmt.Errorf("%T %s still there", o, o.GetName())
			}
		}
		return nil
	})
	for _, c := range claims {
		if vms := cheapVMsOf(sim.Simulator, string(c.UID)); len(vms) > 0 {
			w.t.Fatalf("claim %s is gone but its VM %d is on the cluster", c.Name, vms[0].VMID)
		}
	}
}

// TestCheapWorldRunsAClaim checks the harness itself: a cluster connects, a
// template validates, and a claim of it gets a running VM with its runner
// credential delivered, then goes with its VM when deleted.
func TestCheapWorldRunsAClaim(t *testing.T) {
	w := newCheapWorld(t, cheapOptions{})
	sim := w.StartSim(nil)
	cluster := w.AddCluster("pve", sim)
	w.Create(cheapTemplate("debian", cluster.Name))
	claim := cheapClaim("c1", "debian")
	w.Create(claim)
	w.RunUntil(5*time.Minute, "claim running", func() error {
		if !w.Get(claim) {
			return errors.New("gone")
		}
		if b := claim.Status.Bootstrap; claim.Status.Phase != hfv1.MachineClaimBootstrapping || b == nil || b.CredentialDeliveredAt == nil {
			return fmt.Errorf("phase %s, conditions %v", claim.Status.Phase, claim.Status.Conditions)
		}
		return nil
	})
	t.Logf("running after %s of fake time, %d passes", w.Clock.Now().Sub(cheapEpoch), w.Reconciles)
	w.Delete(claim)
	w.RunUntil(5*time.Minute, "claim gone", func() error {
		if w.Get(claim) {
			return fmt.Errorf("still there: %s", claim.Status.Phase)
		}
		return nil
	})
	for _, vm := range sim.VMs() {
		if !vm.Template {
			t.Errorf("VM %d left", vm.VMID)
		}
	}
	t.Logf("%d passes, events %v", w.Reconciles, w.Events.of(claim.UID))
}
