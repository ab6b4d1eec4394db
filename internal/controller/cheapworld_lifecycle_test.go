package controller_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/controller"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/testworld/credmethods"
	"github.com/hyperfleet/hyperfleet/internal/testworld/identitytest"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/internal/workloads"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	fakeprovider "github.com/hyperfleet/hyperfleet/pkg/provider/fake"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// The lifecycle properties' cheap world (properties 6, 7, 15 and 27): the
// operator's HypervisorCluster, HypervisorMachineTemplate and MachineClaim
// reconcilers, constructed directly as internal/manager wires them, on
// controller-runtime's fake client, the in-memory hypervisor of
// pkg/provider/fake and, for clusters with SPIRE, the in-memory SPIRE
// Server API of internal/testworld/identitytest, all on one fake clock. A
// deterministic driver stands in for controller-runtime's queues: it runs
// one Reconcile at a time, the earliest due first, and moves the clock to
// the next due time when nothing is due now, so a case that lives minutes
// of the operator's time runs in milliseconds, and the same draws replay
// the same run. The watches are modelled on each reconciler's
// SetupWithManager: a write to a claim, template or cluster queues it, a
// template's write queues its claims still without a VM, and the cluster
// poll's wake-ups (ClaimEvents) queue theirs.

const (
	lifeNamespace = "team-a"
	lifeCluster   = "pve"
	// lifeTrustDomain is the SPIRE trust domain of clusters with SPIRE.
	lifeTrustDomain = "example.org"
	// lifeStepLimit bounds one wait's reconciles: a world that needs more
	// is in a hot loop, which is a failure in itself.
	lifeStepLimit = 5000
)

// lifeOptions shape a lifeWorld.
type lifeOptions struct {
	// spire gives the cluster a SPIRE server (spec.spire).
	spire bool
	// pollInterval is the cluster's spec.pollInterval; zero keeps the
	// default.
	pollInterval time.Duration
	// github, when set, runs the claims' CI platforms (their runners'
	// registrations, the credentials placed in VMs) on the GitHub
	// simulator through the operator's own internal/workloads; without it
	// lifeCI stands in for them, as testBootstrap does for the envtest
	// operator.
	github *githubsimtest.Server
	// objs are more objects in the API server (Secrets).
	objs []client.Object
	// kind, when set, is the cluster's spec.provider instead of proxmox: a
	// kind registered with provider.Register, whose providers the cluster
	// reconciler builds with the registered factories, as the manager
	// does. Its factory finds the world's hypervisor in lifeHypervisors by
	// the cluster's endpoint.
	kind hfv1.HypervisorProvider
}

// lifeHypervisors are the in-memory hypervisors of the worlds whose
// cluster is of a registered test kind (lifeOptions.kind), by the
// cluster's endpoint (a *fakeprovider.Cluster).
var (
	lifeHypervisors sync.Map
	lifeWorlds      atomic.Int64
)

// lifeItem is one reconcile request of one reconciler.
type lifeItem struct {
	kind string // "cluster", "template" or "claim"
	key  types.NamespacedName
}

func (i lifeItem) String() string { return i.kind + " " + i.key.String() }

// lifeEvent is one event the operator recorded, at the fake clock's time.
type lifeEvent struct {
	at                   time.Time
	object               string
	kind, reason, detail string
}

// lifeRecorder is the reconcilers' event recorder: it keeps every event
// (record.FakeRecorder blocks once its channel is full).
type lifeRecorder struct {
	clk    *clocktesting.FakeClock
	mu     sync.Mutex
	events []lifeEvent
}

func (r *lifeRecorder) Event(obj runtime.Object, kind, reason, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	name := ""
	if o, ok := obj.(client.Object); ok {
		name = o.GetName()
	}
	r.events = append(r.events, lifeEvent{at: r.clk.Now(), object: name, kind: kind, reason: reason, detail: msg})
}

func (r *lifeRecorder) Eventf(obj runtime.Object, kind, reason, format string, args ...any) {
	r.Event(obj, kind, reason, fmt.Sprintf(format, args...))
}

func (r *lifeRecorder) AnnotatedEventf(obj runtime.Object, _ map[string]string, kind, reason, format string, args ...any) {
	r.Eventf(obj, kind, reason, format, args...)
}

// of are the events about the object named name, as "Type Reason".
func (r *lifeRecorder) of(name string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		if e.object == name {
			out = append(out, e.kind+" "+e.reason)
		}
	}
	return out
}

// lifeCI stands in for the CI platforms' accounts (as testBootstrap does
// for the envtest operator): the GitHub back-end reads the objects' runner
// settings, BootstrapVars adds nothing, and RunnerCredential hands each
// running VM a recognisable single-use credential, counted by claim.
type lifeCI struct {
	backends *workload.Backends
	clk      *clocktesting.FakeClock
	mu       sync.Mutex
	issued   map[types.UID]int
}

func (c *lifeCI) Workloads() *workload.Backends { return c.backends }

func (c *lifeCI) BootstrapVars(context.Context, *hfv1.MachineClaim, *hfv1.HypervisorMachineTemplate, *cloudinit.Vars) error {
	return nil
}

func (c *lifeCI) Release(context.Context, *hfv1.MachineClaim, *hfv1.HypervisorMachineTemplate) error {
	return nil
}

// RunnerCredential implements machineclaim.CredentialIssuer as
// testBootstrap does, on the world's clock.
func (c *lifeCI) RunnerCredential(_ context.Context, claim *hfv1.MachineClaim) (workload.Credential, error) {
	c.mu.Lock()
	c.issued[claim.UID]++
	id := int64(c.issued[claim.UID])
	c.mu.Unlock()
	now := c.clk.Now()
	cred := workload.Credential{Method: credmethods.MethodJIT, Secret: workload.NewSecret(jitSecretOf(string(claim.UID))),
		RunnerName: claim.Name, RunnerID: id, IssuedAt: now, ExpiresAt: now.Add(time.Hour)}
	st := &hfv1.BootstrapStatus{RunnerName: cred.RunnerName, RunnerID: cred.RunnerID, CredentialIssuedAt: &metav1.Time{Time: now}}
	if old := claim.Status.Bootstrap; old != nil {
		st.CredentialRequestedAt = old.CredentialRequestedAt
	}
	claim.Status.Bootstrap = st
	return cred, nil
}

// issuedFor is how many credentials were issued for the claim.
func (c *lifeCI) issuedFor(uid types.UID) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.issued[uid]
}

// lifeBroker is the credential broker's endpoint as VMs reach it; nothing
// in the cheap world calls it.
type lifeBroker struct{}

func (lifeBroker) URL() string { return "https://hyperfleet-agent.example.org:9443/broker" }
func (lifeBroker) CA() string  { return "" }

// faultClasses are the request classes a lifeProvider can fail, as the
// Proxmox simulator's fault classes name them.
var faultClasses = []string{"destroy", "power", "storage", "status"}

// lifeProvider is the operator's provider on the in-memory hypervisor,
// with a record of what the operator asked of it (the VM specs and the
// guest files placed) and faults: each call of a faulty class fails with
// a transient error at its class's rate, drawn from the world's seeded
// source, so a case replays.
type lifeProvider struct {
	provider.Provider
	w *lifeWorld
}

func (p *lifeProvider) fail(class, op string) error {
	w := p.w
	w.mu.Lock()
	defer w.mu.Unlock()
	rate := w.faults[class]
	if rate <= 0 || w.rand.Float64() >= rate {
		return nil
	}
	w.injected[class]++
	return fmt.Errorf("injected fault on %s (%s): %w", op, class, provider.ErrUnreachable)
}

func (p *lifeProvider) EnsureVM(ctx context.Context, spec *provider.VMSpec, prev provider.Progress) (*provider.EnsureResult, error) {
	p.w.mu.Lock()
	p.w.specs[spec.Owner.UID] = *spec
	p.w.mu.Unlock()
	return p.Provider.EnsureVM(ctx, spec, prev)
}

func (p *lifeProvider) DeleteVM(ctx context.Context, owner provider.Owner, prev provider.Progress) (*provider.DeleteResult, error) {
	if err := p.fail("destroy", "DeleteVM"); err != nil {
		return nil, err
	}
	return p.Provider.DeleteVM(ctx, owner, prev)
}

func (p *lifeProvider) RemoveCloudInitMedia(ctx context.Context, owner provider.Owner, prev provider.Progress) (*provider.DeleteResult, error) {
	if err := p.fail("storage", "RemoveCloudInitMedia"); err != nil {
		return nil, err
	}
	return p.Provider.RemoveCloudInitMedia(ctx, owner, prev)
}

func (p *lifeProvider) DeleteCloudInitMedium(ctx context.Context, m provider.CloudInitMedium) (*provider.DeleteResult, error) {
	if err := p.fail("storage", "DeleteCloudInitMedium"); err != nil {
		return nil, err
	}
	return p.Provider.DeleteCloudInitMedium(ctx, m)
}

func (p *lifeProvider) SetPower(ctx context.Context, owner provider.Owner, ref provider.VMRef, action provider.PowerAction) (*provider.Task, error) {
	if err := p.fail("power", "SetPower"); err != nil {
		return nil, err
	}
	return p.Provider.SetPower(ctx, owner, ref, action)
}

func (p *lifeProvider) GetVM(ctx context.Context, ref provider.VMRef) (*provider.VM, error) {
	if err := p.fail("status", "GetVM"); err != nil {
		return nil, err
	}
	return p.Provider.GetVM(ctx, ref)
}

func (p *lifeProvider) ListVMs(ctx context.Context) ([]provider.VMSummary, error) {
	if err := p.fail("status", "ListVMs"); err != nil {
		return nil, err
	}
	return p.Provider.ListVMs(ctx)
}

func (p *lifeProvider) PlaceGuestFile(ctx context.Context, owner provider.Owner, ref provider.VMRef, file provider.GuestFile) error {
	// The operator wipes the content once placed: keep a copy.
	kept := file
	kept.Content = slices.Clone(file.Content)
	err := p.Provider.PlaceGuestFile(ctx, owner, ref, file)
	if err == nil {
		p.w.mu.Lock()
		p.w.placed[ref.ID] = append(p.w.placed[ref.ID], kept)
		p.w.mu.Unlock()
	}
	return err
}

// lifeWorld is one cheap world: one cluster, one tenant namespace.
type lifeWorld struct {
	t        reporter
	ctx      context.Context
	clk      *clocktesting.FakeClock
	kube     client.WithWatch
	hv       *fakeprovider.Cluster
	registry *hypervisors.Registry
	rec      *lifeRecorder
	ci       *lifeCI
	spire    *identitytest.Server
	issuer   *identity.Issuer

	clusters  *controller.HypervisorClusterReconciler
	templates *controller.HypervisorMachineTemplateReconciler
	claims    *machineclaim.Reconciler
	events    chan event.GenericEvent

	cluster *hfv1.HypervisorCluster

	// queue holds each item's due times, failures its errors in a row
	// (controller-runtime's per-item exponential backoff).
	queue    map[lifeItem][]time.Time
	failures map[lifeItem]int
	steps    int
	// afterStep, when set, runs after every reconcile (the invariants a
	// property checks at every step).
	afterStep func(lifeItem)

	mu       sync.Mutex
	rand     *rand.Rand
	faults   map[string]float64
	injected map[string]int
	specs    map[string]provider.VMSpec
	placed   map[provider.ID][]provider.GuestFile
	n        int
}

// lifeEpoch is the worlds' start: a fixed instant, so runs replay.
var lifeEpoch = time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)

// newLifeWorld builds the world and runs it until the cluster is Ready;
// rt reports the case's failures, tb owns the world's servers.
func newLifeWorld(tb testing.TB, rt reporter, o lifeOptions) *lifeWorld {
	rt.Helper()
	t := rt
	clk := clocktesting.NewFakeClock(lifeEpoch)
	w := &lifeWorld{t: t, ctx: context.Background(), clk: clk, queue: map[lifeItem][]time.Time{}, failures: map[lifeItem]int{},
		rand: rand.New(rand.NewPCG(1, 2)), faults: map[string]float64{}, injected: map[string]int{},
		specs: map[string]provider.VMSpec{}, placed: map[provider.ID][]provider.GuestFile{}, events: make(chan event.GenericEvent, 1024)}
	hv, err := fakeprovider.NewCluster(clk, fakeprovider.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	w.hv, w.registry, w.rec = hv, hypervisors.NewRegistry(), &lifeRecorder{clk: clk}
	deps := workload.Dependencies{Clock: clk}
	if o.github != nil {
		deps = workload.Dependencies{Transport: o.github.Transport}
	}
	backends, err := workload.NewBackends(githubsimtest.Workloads(), deps)
	if err != nil {
		t.Fatal(err)
	}
	w.kube = w.newClient(backends, o.objs)
	w.ci = &lifeCI{backends: backends, clk: clk, issued: map[types.UID]int{}}
	identities := identity.NewRegistry()
	w.issuer = &identity.Issuer{Keys: testSigner, Install: testSigner.OperatorID()}
	if o.spire {
		w.spire = identitytest.NewServer(tb, lifeTrustDomain)
		w.spire.SetClock(clk.Now)
		identities.Dial = identitytest.Dialer(w.spire)
	}
	factories := map[hfv1.HypervisorProvider]provider.Factory{hfv1.ProviderProxmox: provider.FactoryFunc(
		func(cfg provider.ClusterConfig, deps provider.Deps) (provider.Provider, error) {
			p, err := hv.NewProvider(cfg, deps)
			if err != nil {
				return nil, err
			}
			return &lifeProvider{Provider: p, w: w}, nil
		})}
	endpoint := "https://pve.example.org:8006"
	if o.kind != "" {
		factories = provider.Factories(provider.Registered())
		endpoint = fmt.Sprintf("https://%s-%d.example.org", o.kind, lifeWorlds.Add(1))
		lifeHypervisors.Store(endpoint, hv)
	}
	w.clusters = &controller.HypervisorClusterReconciler{Client: w.kube, Registry: w.registry, Factories: factories, Signer: testSigner,
		Recorder: w.rec, Clock: clk, ClaimEvents: w.events, Identity: identities}
	w.templates = &controller.HypervisorMachineTemplateReconciler{Client: w.kube, Registry: w.registry, Recorder: w.rec,
		Workloads: backends, Identity: controller.IdentitySupport{Issuer: w.issuer, Broker: lifeBroker{}}}
	w.claims = &machineclaim.Reconciler{Client: w.kube, Registry: w.registry, Recorder: w.rec, Clock: clk, Signer: testSigner,
		CI: w.ci, Identity: machineclaim.IdentityService{Credentials: w.ci, Servers: identities, Issuer: w.issuer, Broker: lifeBroker{}}}
	if o.github != nil {
		platforms := newPlatforms(w.kube, backends)
		w.claims.CI, w.claims.Identity.Credentials = platforms, platforms
	}
	w.cluster = &hfv1.HypervisorCluster{
		ObjectMeta: metav1.ObjectMeta{Name: lifeCluster},
		Spec: hfv1.HypervisorClusterSpec{
			Provider: hfv1.ProviderProxmox, Endpoint: endpoint,
			Proxmox: &hfv1.ProxmoxClusterSettings{VMIDRange: &hfv1.VMIDRange{Start: 1000, End: 1999}},
		},
	}
	if o.kind != "" {
		w.cluster.Spec.Provider, w.cluster.Spec.Proxmox = o.kind, nil
	}
	if o.pollInterval > 0 {
		w.cluster.Spec.PollInterval = &metav1.Duration{Duration: o.pollInterval}
	}
	if o.spire {
		w.cluster.Spec.SPIRE = &hfv1.SPIREConfig{TrustDomain: lifeTrustDomain, ServerAddress: "spire.example.org:8081",
			ServerAPI: hfv1.SPIREServerAPI{AdminSocket: "/run/spire/api.sock"}}
	}
	w.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lifeNamespace, Labels: map[string]string{"hyperfleet.io/tenant": "yes"}}})
	w.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: lifeNamespace, Name: "github"},
		Data: map[string][]byte{"token": []byte("ghp_longLivedPATthatMustNeverLeaveTheOperator")}})
	w.create(w.cluster)
	w.runUntil("cluster "+lifeCluster+" Ready", func() error {
		c := &hfv1.HypervisorCluster{}
		if err := w.kube.Get(w.ctx, client.ObjectKey{Name: lifeCluster}, c); err != nil {
			return err
		}
		if !hfv1.IsConditionTrue(c.Status.Conditions, hfv1.ReadyCondition) {
			return fmt.Errorf("conditions %+v", c.Status.Conditions)
		}
		return nil
	})
	return w
}

// newClient is the fake API server with the manager's field indexes, the
// status subresource of every kind the operator writes, and the watches:
// every write queues what the reconcilers' watches would.
func (w *lifeWorld) newClient(backends *workload.Backends, objs []client.Object) client.WithWatch {
	scheme := runtime.NewScheme()
	if err := hfv1.AddToScheme(scheme); err != nil {
		w.t.Fatal(err)
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		w.t.Fatal(err)
	}
	b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithStatusSubresource(&hfv1.HypervisorCluster{}, &hfv1.HypervisorMachineTemplate{}, &hfv1.IPPool{}, &hfv1.RunnerPool{}, &hfv1.MachineClaim{}, &hfv1.CIJob{})
	for _, ix := range fieldindex.All(backends) {
		b = b.WithIndex(ix.Obj, ix.Field, ix.Extract)
	}
	wrote := func(o client.Object, err error) error {
		if err == nil {
			w.watched(o)
		}
		return err
	}
	return b.WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
			return wrote(o, c.Create(ctx, o, opts...))
		},
		Update: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.UpdateOption) error {
			return wrote(o, c.Update(ctx, o, opts...))
		},
		Patch: func(ctx context.Context, c client.WithWatch, o client.Object, p client.Patch, opts ...client.PatchOption) error {
			return wrote(o, c.Patch(ctx, o, p, opts...))
		},
		Delete: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.DeleteOption) error {
			return wrote(o, c.Delete(ctx, o, opts...))
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, o client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
			return wrote(o, c.SubResource(sub).Patch(ctx, o, p, opts...))
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, o client.Object, opts ...client.SubResourceUpdateOption) error {
			return wrote(o, c.SubResource(sub).Update(ctx, o, opts...))
		},
	}).Build()
}

// watched queues what the reconcilers' watches queue for a write of o.
func (w *lifeWorld) watched(o client.Object) {
	key := client.ObjectKeyFromObject(o)
	switch o := o.(type) {
	case *hfv1.MachineClaim:
		w.enqueue(lifeItem{"claim", key}, 0)
	case *hfv1.HypervisorCluster:
		w.enqueue(lifeItem{"cluster", key}, 0)
		// The template controller watches clusters.
		var list hfv1.HypervisorMachineTemplateList
		if err := w.kube.List(w.ctx, &list); err == nil {
			for i := range list.Items {
				if list.Items[i].Spec.HypervisorClusterRef.Name == o.Name {
					w.enqueue(lifeItem{"template", client.ObjectKeyFromObject(&list.Items[i])}, 0)
				}
			}
		}
	case *hfv1.HypervisorMachineTemplate:
		w.enqueue(lifeItem{"template", key}, 0)
		// The claim controller wakes the template's claims still waiting
		// for it (claimsForTemplate).
		var list hfv1.MachineClaimList
		if err := w.kube.List(w.ctx, &list, client.InNamespace(o.Namespace)); err == nil {
			for i := range list.Items {
				if c := &list.Items[i]; c.Spec.TemplateRef.Name == o.Name && c.Status.VMRef == nil {
					w.enqueue(lifeItem{"claim", client.ObjectKeyFromObject(c)}, 0)
				}
			}
		}
	}
}

// enqueue makes item due after d; an item due earlier stays due then too
// (a delaying queue keeps one timer per item, the earliest; an item added
// now runs now and its later timer still fires).
func (w *lifeWorld) enqueue(item lifeItem, d time.Duration) {
	at := w.clk.Now().Add(d)
	if !slices.ContainsFunc(w.queue[item], at.Equal) {
		w.queue[item] = append(w.queue[item], at)
	}
}

// next is the item due first (ties broken by name, for replays) and when.
func (w *lifeWorld) next() (lifeItem, time.Time, bool) {
	var best lifeItem
	var at time.Time
	found := false
	for item, times := range w.queue {
		for _, t := range times {
			if !found || t.Before(at) || t.Equal(at) && item.String() < best.String() {
				best, at, found = item, t, true
			}
		}
	}
	return best, at, found
}

// step runs the reconcile due first, moving the clock to it; false when
// nothing is queued.
func (w *lifeWorld) step() bool {
	item, at, ok := w.next()
	if !ok {
		return false
	}
	if at.After(w.clk.Now()) {
		w.clk.SetTime(at)
	}
	now := w.clk.Now()
	w.queue[item] = slices.DeleteFunc(w.queue[item], func(t time.Time) bool { return !t.After(now) })
	if len(w.queue[item]) == 0 {
		delete(w.queue, item)
	}
	w.steps++
	var r reconcile.Reconciler
	switch item.kind {
	case "cluster":
		r = w.clusters
	case "template":
		r = w.templates
	default:
		r = w.claims
	}
	res, err := r.Reconcile(w.ctx, ctrl.Request{NamespacedName: item.key})
	switch {
	case err != nil && !errors.Is(err, reconcile.TerminalError(nil)):
		// controller-runtime's per-item backoff: 5 ms doubling, capped.
		w.failures[item]++
		w.enqueue(item, min(5*time.Millisecond<<min(w.failures[item], 30), 1000*time.Second))
	case res.RequeueAfter > 0:
		delete(w.failures, item)
		w.enqueue(item, res.RequeueAfter)
	default:
		delete(w.failures, item)
	}
	for drained := false; !drained; {
		select {
		case e := <-w.events:
			w.enqueue(lifeItem{"claim", client.ObjectKeyFromObject(e.Object)}, 0)
		default:
			drained = true
		}
	}
	if w.afterStep != nil {
		w.afterStep(item)
	}
	return true
}

// runUntil steps the world until cond returns nil; a world with nothing
// left to run, or in a hot loop, fails with cond's last error.
func (w *lifeWorld) runUntil(what string, cond func() error) {
	w.t.Helper()
	for n := 0; ; n++ {
		err := cond()
		if err == nil {
			return
		}
		if n == lifeStepLimit {
			w.t.Fatalf("%s: not reached in %d reconciles (%s of the operator's time): %v", what, n, w.clk.Since(lifeEpoch), err)
		}
		if !w.step() {
			w.t.Fatalf("%s: nothing left to run: %v", what, err)
		}
	}
}

// runFor steps the world until the clock reaches d from now (the items
// due by then all run).
func (w *lifeWorld) runFor(d time.Duration) {
	w.t.Helper()
	until := w.clk.Now().Add(d)
	for n := 0; ; n++ {
		_, at, ok := w.next()
		if !ok || at.After(until) {
			break
		}
		if n == lifeStepLimit {
			w.t.Fatalf("more than %d reconciles in %s of the operator's time: a hot loop", n, d)
		}
		w.step()
	}
	if w.clk.Now().Before(until) {
		w.clk.SetTime(until)
	}
}

func (w *lifeWorld) create(o client.Object) {
	w.t.Helper()
	if err := w.kube.Create(w.ctx, o); err != nil {
		w.t.Fatalf("create %T %s: %v", o, o.GetName(), err)
	}
}

// template is a valid template on the world's cluster, as the envtest
// fixture's (newFixture): the hypervisor's template 9000, GitHub runners
// of octo-org with a PAT.
func (w *lifeWorld) template(name string) *hfv1.HypervisorMachineTemplate {
	return &hfv1.HypervisorMachineTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: lifeNamespace, Name: name},
		Spec: hfv1.HypervisorMachineTemplateSpec{
			HypervisorClusterRef: hfv1.ObjectName{Name: lifeCluster},
			Source:               hfv1.MachineSource{Proxmox: hfv1.ProxmoxSource{TemplateID: ptr.To[int32](9000)}},
			Resources:            hfv1.MachineResources{CPU: 2, Memory: resource.MustParse("2Gi")},
			Bootstrap: hfv1.Bootstrap{GitHub: &hfv1.GitHubBootstrap{
				Owner: "octo-org", Organization: "octo-org",
				Credentials: hfv1.GitHubCredentials{PAT: &hfv1.LocalSecretKeySelector{Name: "github", Key: "token"}},
			}},
		},
	}
}

// createTemplate creates tmpl and runs the world until the template
// controller found it Ready.
func (w *lifeWorld) createTemplate(tmpl *hfv1.HypervisorMachineTemplate) {
	w.t.Helper()
	w.create(tmpl)
	w.runUntil("template "+tmpl.Name+" Ready", func() error {
		got := &hfv1.HypervisorMachineTemplate{}
		if err := w.kube.Get(w.ctx, client.ObjectKeyFromObject(tmpl), got); err != nil {
			return err
		}
		if !hfv1.IsConditionTrue(got.Status.Conditions, hfv1.ReadyCondition) || got.Status.ObservedGeneration != got.Generation {
			return fmt.Errorf("conditions %+v", got.Status.Conditions)
		}
		return nil
	})
}

// newClaim creates a claim of template tmpl with a UID of its own (the
// fake API server gives none).
func (w *lifeWorld) newClaim(name, tmpl string) *hfv1.MachineClaim {
	w.t.Helper()
	w.n++
	claim := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: lifeNamespace, Name: name, UID: types.UID(fmt.Sprintf("0000%04d-c1a1-4000-8000-%012d", w.n, w.n)),
			CreationTimestamp: metav1.Time{Time: w.clk.Now()}},
		Spec: hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: tmpl}},
	}
	w.create(claim)
	return claim
}

// get reads the claim; nil when it is gone.
func (w *lifeWorld) get(claim *hfv1.MachineClaim) *hfv1.MachineClaim {
	w.t.Helper()
	got := &hfv1.MachineClaim{}
	err := w.kube.Get(w.ctx, client.ObjectKeyFromObject(claim), got)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		w.t.Fatal(err)
	}
	return got
}

// vmsOf are the hypervisor's VMs whose ownership block names the claim.
func (w *lifeWorld) vmsOf(uid types.UID) []fakeprovider.VMState {
	var out []fakeprovider.VMState
	for _, vm := range w.hv.VMs() {
		if rec, err := lifeSigner().Verify(vm.Description, vm.VMID); err == nil && rec.UID == string(uid) {
			out = append(out, vm)
		}
	}
	return out
}

// lifeSigner is the install's signer bound to the world's cluster, as the
// provider marks its VMs.
func lifeSigner() *ownership.Signer {
	return testSigner.ForCluster(ownership.ClusterIdentity{Name: lifeCluster})
}

// mediaOf are the cloud-init media written for the claim's VM.
func (w *lifeWorld) mediaOf(uid types.UID) []string {
	var out []string
	for _, m := range w.hv.Media() {
		if m.OwnerDigest == provider.OwnerDigest(string(uid)) {
			out = append(out, m.ID)
		}
	}
	return out
}

// strayVMs are the hypervisor's VMs other than templates.
func (w *lifeWorld) strayVMs() []string {
	var out []string
	for _, vm := range w.hv.VMs() {
		if !vm.Template {
			out = append(out, fmt.Sprintf("%d (%s, %q)", vm.VMID, vm.Power, vm.Name))
		}
	}
	return out
}

// setFaults makes each class fail at its rate (0 to 1) from now on; seed
// draws the failures.
func (w *lifeWorld) setFaults(rates map[string]float64, seed uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.faults, w.rand = rates, rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// specOf is the VM spec the operator last asked for the claim's VM.
func (w *lifeWorld) specOf(uid types.UID) (provider.VMSpec, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s, ok := w.specs[string(uid)]
	return s, ok
}

// placedIn are the guest files the operator placed in the VM.
func (w *lifeWorld) placedIn(vmid int) []provider.GuestFile {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.placed[fakeprovider.FormatID(vmid)])
}

// describe is a claim's state for a failure message.
func (w *lifeWorld) describe(c *hfv1.MachineClaim) string {
	if c == nil {
		return "gone"
	}
	return fmt.Sprintf("phase %s, deleting %v, end %+v, conditions %+v, events %v, VMs %v",
		c.Status.Phase, c.DeletionTimestamp != nil, c.Status.End, c.Status.Conditions, w.rec.of(c.Name), w.strayVMs())
}

// pending is a wait's error about the claim c (nil: gone): what is
// missing, then the claim's state, written only when the error is read
// (lazyError): a wait polls after every reconcile.
func (w *lifeWorld) pending(what string, c *hfv1.MachineClaim) error {
	return lazyError(func() string {
		if what == "" {
			return w.describe(c)
		}
		return what + ": " + w.describe(c) + fmt.Sprintf("; media %v", w.hv.Media())
	})
}

// phaseOrder orders a claim's phases along its life.
func phaseOrder(p hfv1.MachineClaimPhase) int {
	return cmp.Or(phaseRank[p], map[hfv1.MachineClaimPhase]int{hfv1.MachineClaimTerminating: 4, hfv1.MachineClaimFailed: 4}[p])
}

// trimmed is s cut to n bytes for a message.
func trimmed(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return strings.TrimSpace(s)
}

// newPlatforms is the operator's CI platforms (internal/workloads) on the
// fake API server, as internal/manager wires them.
func newPlatforms(kube client.Client, backends *workload.Backends) *workloads.Platforms {
	return &workloads.Platforms{Client: kube, Backends: backends, Signer: testSigner}
}

// vmidOf is the fake hypervisor's id of the claim's VM (status.vmRef's
// providerID; vmID is Proxmox's).
func (w *lifeWorld) vmidOf(c *hfv1.MachineClaim) int {
	w.t.Helper()
	if c.Status.VMRef == nil {
		w.t.Fatalf("claim %s has no VM", c.Name)
	}
	id, err := fakeprovider.ParseID(provider.ID(c.Status.VMRef.ProviderID))
	if err != nil {
		w.t.Fatalf("claim %s: %v", c.Name, err)
	}
	return id
}
