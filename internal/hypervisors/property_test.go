package hypervisors_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"pgregory.net/rapid"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testobjects"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	fakeprovider "github.com/hyperfleet/hyperfleet/pkg/provider/fake"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox"
)

// builtProvider is only compared by identity; Registry never calls it.
type builtProvider struct {
	provider.Provider
	id int
}

// configs draws the ClusterConfig a HypervisorCluster resolves to, from a
// small set of values per field so that sequences repeat configurations
// as often as they change them: endpoint, token (a rotated Secret), TLS
// pinning, nodes, storages, bridge and VM id range.
var configs = rapid.Custom(func(t *rapid.T) provider.ClusterConfig {
	pick := func(label string, values ...string) string { return rapid.SampledFrom(values).Draw(t, label) }
	cfg := provider.ClusterConfig{
		Endpoint:       pick("endpoint", "https://pve-a:8006/api2/json", "https://pve-b:8006/api2/json"),
		TokenID:        "root@pam!hyperfleet",
		TokenSecret:    pick("token", "s1", "s2"),
		Settings:       pick("settings", "kind part a", "kind part b"), // the kind's own part, opaque here
		DefaultStorage: pick("defaultStorage", "", "local-lvm"),
		DefaultBridge:  pick("bridge", "vmbr0", "vmbr1"),
		VMIDStart:      rapid.SampledFrom([]int{1000, 2000}).Draw(t, "vmidStart"),
	}
	cfg.VMIDEnd = cfg.VMIDStart + 999
	switch rapid.IntRange(0, 2).Draw(t, "tls") {
	case 0:
		cfg.FingerprintSHA256 = pick("fingerprint", "aa:bb", "cc:dd")
	case 1:
		cfg.CABundle = []byte(pick("ca", "ca-1", "ca-2"))
	}
	if rapid.Bool().Draw(t, "nodes") {
		cfg.Nodes = rapid.SliceOfNDistinct(rapid.SampledFrom([]string{"pve1", "pve2", "pve3"}), 1, 3, rapid.ID[string]).Draw(t, "node list")
	}
	return cfg
})

// Feature: hyperfleet-operator, Property 25: Provider Selection and Configuration
//
// TestProviderConfigurationProperty: over generated sequences of
// connections of up to three HypervisorClusters, each with a generated
// configuration (a changed spec, a rotated Secret, the same again), builds
// that fail (a bad CA), and removals, the registry hands every cluster the
// provider built from its current configuration: a new provider exactly
// when the configuration changed since the last one built, the same one
// otherwise, never another cluster's; a failed build keeps the last good
// provider (the reconciler reports the failure in the cluster's
// conditions); a removed cluster has none until it connects again.
func TestProviderConfigurationProperty(t *testing.T) {
	proptest.Check(t, 300, func(t *rapid.T) {
		r := hypervisors.NewRegistry()
		type built struct {
			cluster string
			cfg     provider.ClusterConfig
		}
		var builds []built
		// model: the provider each cluster has (index into builds) and
		// the configuration it was built from.
		model := map[string]int{}
		names := []string{"pve-a", "pve-b", "pve-c"}
		for step := range rapid.IntRange(1, 40).Draw(t, "steps") {
			name := rapid.SampledFrom(names).Draw(t, "cluster")
			if rapid.IntRange(0, 9).Draw(t, "remove") == 0 {
				r.Remove(name)
				delete(model, name)
				if _, _, ok := r.Provider(name); ok {
					t.Fatalf("step %d: removed cluster %s still has a provider", step, name)
				}
				continue
			}
			cfg := configs.Draw(t, "config")
			cfg.Name = name
			fail := rapid.IntRange(0, 7).Draw(t, "build fails") == 0
			calls := 0
			p, err := r.Connect(name, cfg, func() (provider.Provider, error) {
				calls++
				if fail {
					return nil, errors.New("spec.tls: the CA bundle holds no certificate")
				}
				builds = append(builds, built{name, cfg})
				return &builtProvider{id: len(builds) - 1}, nil
			})
			prev, had := model[name]
			unchanged := had && hypervisors.ConfigHash(builds[prev].cfg) == hypervisors.ConfigHash(cfg)
			switch {
			case unchanged:
				if calls != 0 || err != nil || p.(*builtProvider).id != prev {
					t.Fatalf("step %d: %s reconnected with its configuration unchanged: %d builds, provider %v, %v", step, name, calls, p, err)
				}
			case calls != 1:
				t.Fatalf("step %d: %s's configuration changed but %d builds ran", step, name, calls)
			case fail:
				if err == nil || p != nil {
					t.Fatalf("step %d: a failed build returned provider %v, error %v", step, p, err)
				}
			default:
				if err != nil || p.(*builtProvider).id != len(builds)-1 {
					t.Fatalf("step %d: %s: provider %v, error %v; want the one just built", step, name, p, err)
				}
				model[name] = len(builds) - 1
			}
			// Every cluster has the provider of its own last good build.
			for _, n := range names {
				got, _, ok := r.Provider(n)
				want, has := model[n]
				if ok != has {
					t.Fatalf("step %d: %s connected %v, want %v", step, n, ok, has)
				}
				if !has {
					continue
				}
				if id := got.(*builtProvider).id; id != want || builds[id].cluster != n {
					t.Fatalf("step %d: %s has provider %d (built for %s), want %d", step, n, id, builds[id].cluster, want)
				}
			}
		}
		if len(r.Names()) != len(model) {
			t.Fatalf("registry names %v, model %v", r.Names(), fmt.Sprint(model))
		}
	})
}

// The provider kinds of TestProviderSelectionProperty: the built-in one,
// a second one the test registers (an operator build with two hypervisor
// implementations; kinds_test.go), and names no implementation is
// registered for.
const (
	kindStub    hfv1.HypervisorProvider = "stubvisor"
	kindMissing hfv1.HypervisorProvider = "vsphere"
)

// kindProvider is a provider one kind's factory built, for one cluster
// from one configuration; it works on an in-memory hypervisor so that the
// reconciler's probe and VM listing succeed.
type kindProvider struct {
	provider.Provider
	kind hfv1.HypervisorProvider
	cfg  provider.ClusterConfig
}

// kindFactories are the factories of the registered kinds, recording
// every build by kind. The stub kind refuses a configuration without a
// default bridge, as an implementation refuses settings it cannot use.
type kindFactories struct {
	mu     sync.Mutex
	hv     *fakeprovider.Cluster
	builds []*kindProvider
}

func (f *kindFactories) factories() map[hfv1.HypervisorProvider]provider.Factory {
	build := func(kind hfv1.HypervisorProvider) provider.Factory {
		return provider.FactoryFunc(func(cfg provider.ClusterConfig, deps provider.Deps) (provider.Provider, error) {
			if kind == kindStub && cfg.DefaultBridge == "" {
				return nil, provider.Errorf(provider.ClassConfiguration, "BridgeRequired", "stubvisor needs spec.defaultBridge")
			}
			p, err := f.hv.NewProvider(cfg, deps)
			if err != nil {
				return nil, err
			}
			kp := &kindProvider{Provider: p, kind: kind, cfg: cfg}
			f.mu.Lock()
			f.builds = append(f.builds, kp)
			f.mu.Unlock()
			return kp, nil
		})
	}
	return map[hfv1.HypervisorProvider]provider.Factory{hfv1.ProviderProxmox: build(hfv1.ProviderProxmox), kindStub: build(kindStub)}
}

// generatedCluster is a HypervisorCluster of the property and its token.
type generatedCluster struct {
	obj   *hfv1.HypervisorCluster
	token string
}

// drawCluster draws a HypervisorCluster naming kind, with its settings and
// its API token in a Secret of its own.
func drawCluster(t *rapid.T, name string, kind hfv1.HypervisorProvider) (generatedCluster, *corev1.Secret) {
	pick := func(label string, values ...string) string { return rapid.SampledFrom(values).Draw(t, name+" "+label) }
	token := pick("token", "s1", "s2", "s3")
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "hyperfleet-system", Name: name + "-token"},
		Data: map[string][]byte{"id": []byte("hyperfleet@pve!" + name), "secret": []byte(token)}}
	c := &hfv1.HypervisorCluster{
		ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1, UID: k8stypes.UID("uid-" + name)},
		Spec: hfv1.HypervisorClusterSpec{
			Provider: kind,
			Endpoint: pick("endpoint", "https://"+name+".example:8006", "https://"+name+"-2.example:8443"),
			Credentials: hfv1.HypervisorCredentials{
				TokenID:     &hfv1.SecretKeySelector{Namespace: sec.Namespace, Name: sec.Name, Key: "id"},
				TokenSecret: &hfv1.SecretKeySelector{Namespace: sec.Namespace, Name: sec.Name, Key: "secret"},
			},
			DefaultStorage: pick("defaultStorage", "", "local-lvm", "ceph"),
			DefaultBridge:  pick("defaultBridge", "", "vmbr0", "vmbr1"),
		},
	}
	if rapid.Bool().Draw(t, name+" nodes") {
		c.Spec.Nodes = []string{"node-1"}
	}
	if rapid.Bool().Draw(t, name+" vmidRange") {
		start := int32(rapid.SampledFrom([]int{1000, 5000}).Draw(t, name+" vmidStart"))
		c.Spec.VMIDRange = &hfv1.VMIDRange{Start: start, End: start + 999} //nolint:staticcheck // a cluster may still set it
	}
	return generatedCluster{obj: c, token: token}, sec
}

// Feature: hyperfleet-operator, Property 25: Provider Selection and Configuration
//
// TestProviderSelectionProperty drives the HypervisorCluster reconciler
// (internal/controller, its whole pass on controller-runtime's fake
// client) in an operator build with two hypervisor implementations
// registered by kind: the built-in proxmox and a test kind, stubvisor.
// One to four generated HypervisorClusters each name proxmox, stubvisor or
// a kind no implementation is registered for, with their own endpoint,
// API token (in a Secret), storage, bridge, nodes and VM id range. After
// each cluster's passes:
//   - a cluster of a registered kind is connected with that kind's
//     implementation and no other (one build, of its kind, for it), and
//     the configuration the implementation was built with is the cluster's
//     own: its name, endpoint, token read from its Secret, storage, bridge,
//     nodes, and the VM id range and settings its registered kind read
//     (Kind.ReadCluster); the registry hands that provider out for the
//     cluster; the cluster is Ready;
//   - a cluster naming an unregistered kind is refused: no implementation
//     is built, the registry has no provider for it, the pass ends in a
//     terminal error and Ready is False, its message naming spec.provider
//     and the kind;
//   - a configuration its implementation refuses (stubvisor without a
//     bridge) leaves no provider and Ready False, naming the refusal.
//
// Mutation: connectProvider (internal/controller/hypervisorcluster_phases.go)
// taking the factory of hfv1.ProviderProxmox whatever spec.provider names
// fails this test (a cluster naming an unregistered kind was connected with
// proxmox's implementation); the old test, over the registry's caching
// alone, passed it.
// Mutation: clusterconfig.Resolve dropping the default bridge (the
// configuration passed on without spec.defaultBridge) fails this test; the
// old test passed it.
func TestProviderSelectionProperty(t *testing.T) {
	seen := map[string]int{}
	signer := testobjects.Signer(t)
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		ctx := context.Background()
		clk := clocktesting.NewFakeClock(time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC))
		hv, err := fakeprovider.NewCluster(clk, fakeprovider.DefaultOptions())
		if err != nil {
			rt.Fatalf("fake hypervisor: %v", err)
		}
		kinds := &kindFactories{hv: hv}
		var clusters []generatedCluster
		var objs []client.Object
		for i := range rapid.IntRange(1, 4).Draw(rt, "clusters") {
			kind := rapid.SampledFrom([]hfv1.HypervisorProvider{hfv1.ProviderProxmox, kindStub, kindMissing}).Draw(rt, fmt.Sprintf("kind %d", i))
			gc, sec := drawCluster(rt, fmt.Sprintf("hv-%d", i), kind)
			clusters = append(clusters, gc)
			objs = append(objs, gc.obj, sec)
		}
		c := clusterWorld(rt, objs...)
		reg := hypervisors.NewRegistry()
		r := &controller.HypervisorClusterReconciler{Client: c, Registry: reg, Factories: kinds.factories(),
			Signer: signer, Recorder: &record.FakeRecorder{}, Clock: clk}
		for _, gc := range clusters {
			name, kind := gc.obj.Name, gc.obj.Spec.Provider
			before := len(kinds.builds)
			var res ctrl.Result
			var err error
			// The first pass adds the finalizer; the second connects.
			for range 2 {
				res, err = r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(gc.obj)})
			}
			_ = res
			got := &hfv1.HypervisorCluster{}
			if gerr := c.Get(ctx, client.ObjectKeyFromObject(gc.obj), got); gerr != nil {
				rt.Fatalf("get cluster %s: %v", name, gerr)
			}
			ready := hfv1.FindCondition(got.Status.Conditions, hfv1.ReadyCondition)
			builds := kinds.builds[before:]
			p, _, connected := reg.Provider(name)
			refusesConfig := kind == kindStub && gc.obj.Spec.DefaultBridge == ""
			switch {
			case kind == kindMissing:
				seen["unregistered"]++
				if len(builds) != 0 || connected {
					rt.Fatalf("cluster %s names unregistered kind %q: %d implementations built, registry connected %v", name, kind, len(builds), connected)
				}
				if !errors.Is(err, reconcile.TerminalError(nil)) {
					rt.Fatalf("cluster %s names unregistered kind %q: the pass returned %v, want a terminal error", name, kind, err)
				}
				if ready == nil || ready.Status != metav1.ConditionFalse || !strings.Contains(ready.Message, "spec.provider") || !strings.Contains(ready.Message, string(kind)) {
					rt.Fatalf("cluster %s names unregistered kind %q: Ready %+v, want False naming spec.provider and the kind", name, kind, ready)
				}
			case refusesConfig:
				seen["refused configuration"]++
				if len(builds) != 0 || connected {
					rt.Fatalf("cluster %s: its implementation refused the configuration, yet %d built and registry connected %v", name, len(builds), connected)
				}
				if ready == nil || ready.Status != metav1.ConditionFalse || !strings.Contains(ready.Message, "spec.defaultBridge") {
					rt.Fatalf("cluster %s: its implementation refused the configuration: Ready %+v, want False naming the refusal", name, ready)
				}
			default:
				seen[string(kind)]++
				if err != nil {
					rt.Fatalf("cluster %s (%s): pass: %v", name, kind, err)
				}
				if len(builds) != 1 || builds[0].kind != kind {
					rt.Fatalf("cluster %s names %q; the implementations built for it: %v", name, kind, buildKinds(builds))
				}
				b := builds[0]
				if !connected || p != provider.Provider(b) {
					rt.Fatalf("cluster %s: the registry hands out %v, want the %s provider just built", name, p, kind)
				}
				if msg := configMismatch(gc, b.cfg); msg != "" {
					rt.Fatalf("cluster %s (%s) built with the wrong configuration: %s", name, kind, msg)
				}
				if ready == nil || ready.Status != metav1.ConditionTrue {
					rt.Fatalf("cluster %s (%s) connected but Ready is %+v", name, kind, ready)
				}
			}
		}
	})
	// Every kind of cluster must have been drawn (not under -short, where
	// rapid runs a fifth of the cases).
	if testing.Short() {
		return
	}
	for _, k := range []string{string(hfv1.ProviderProxmox), string(kindStub), "unregistered", "refused configuration"} {
		if seen[k] == 0 {
			t.Errorf("no generated cluster was %s (%v)", k, seen)
		}
	}
}

// configMismatch says how the configuration an implementation was built
// with differs from its cluster's spec and Secret ("" when it does not).
func configMismatch(gc generatedCluster, cfg provider.ClusterConfig) string {
	s := gc.obj.Spec
	// Each kind reads its own range: proxmox the generated spec.vmidRange
	// (else every id it allows), stubvisor its fixed one.
	start, end := 100, 999999999
	if rg := s.VMIDRange; rg != nil { //nolint:staticcheck // the field the generator sets
		start, end = int(rg.Start), int(rg.End)
	}
	var settings any = proxmox.ClusterSettings{ISOStorage: hfv1.DefaultISOStorage}
	if s.Provider == kindStub {
		start, end = stubRange[0], stubRange[1]
		settings = stubSettings{Cluster: gc.obj.Name}
	}
	var diffs []string
	for _, d := range []struct {
		field     string
		got, want any
	}{
		{"name", cfg.Name, gc.obj.Name},
		{"endpoint", cfg.Endpoint, s.Endpoint},
		{"token id", cfg.TokenID, "hyperfleet@pve!" + gc.obj.Name},
		{"token secret", cfg.TokenSecret, gc.token},
		{"default storage", cfg.DefaultStorage, s.DefaultStorage},
		{"default bridge", cfg.DefaultBridge, s.DefaultBridge},
		{"nodes", fmt.Sprint(cfg.Nodes), fmt.Sprint(s.Nodes)},
		{"VM id range", fmt.Sprint(cfg.VMIDStart, "-", cfg.VMIDEnd), fmt.Sprint(start, "-", end)},
		{"the kind's own settings", cfg.Settings, settings},
	} {
		if d.got != d.want {
			diffs = append(diffs, fmt.Sprintf("%s %v, want %v", d.field, d.got, d.want))
		}
	}
	return strings.Join(diffs, "; ")
}

func buildKinds(builds []*kindProvider) []string {
	out := make([]string, 0, len(builds))
	for _, b := range builds {
		out = append(out, fmt.Sprintf("%s for %s", b.kind, b.cfg.Name))
	}
	slices.Sort(out)
	return out
}

// clusterWorld is controller-runtime's fake client holding objs, with the
// indexes the operator's manager registers.
func clusterWorld(t *rapid.T, objs ...client.Object) client.Client {
	scheme := runtime.NewScheme()
	if err := hfv1.AddToScheme(scheme); err != nil {
		t.Fatalf("scheme: %v", err)
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatalf("scheme: %v", err)
	}
	b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithStatusSubresource(&hfv1.HypervisorCluster{})
	for _, ix := range fieldindex.All(nil) {
		b = b.WithIndex(ix.Obj, ix.Field, ix.Extract)
	}
	return b.Build()
}
