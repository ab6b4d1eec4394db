package machineclaim

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testobjects"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox"
)

// The simulator world of this package's tests: the claim's reconciler on
// controller-runtime's fake client, driving the real Proxmox provider
// against the Proxmox VE simulator, both on fake clocks, one Reconcile at a
// time, so that a test acts between two passes exactly where it means to
// (a template edited after the pass that placed the VM, before the one
// that configures it).
const (
	simCluster   = "pve"
	simNamespace = "team-a"
	simNode      = "pve1"
)

// The values the cluster's tenancy gives namespace team-a, which its
// template uses and its VM must keep, and those it refuses, which the
// tenant writes into the template once its claim is placed.
const (
	authorizedTemplate, refusedTemplate             = 9000, 9001
	authorizedStorage, refusedStorage               = "local-lvm", "team-b-lvm"
	authorizedPool, refusedPool                     = "ci", "infra"
	authorizedBridge, refusedBridge                 = "vmbr0", "vmbr9"
	authorizedVendorSnippet, refusedVendor          = "local:snippets/kit.yaml", "local:snippets/team-b-kit.yaml"
	authorizedUserSnippet, refusedUserSnippet       = "local:snippets/team-a.yaml", "local:snippets/team-b.yaml"
	authorizedDNSDomain, refusedDNSDomain           = "team-a.ci.example.com", "team-b.ci.example.com"
	authorizedVLAN, refusedVLAN               int32 = 100, 4000
)

// simWorld is one simulated cluster with one tenant namespace.
type simWorld struct {
	t     *testing.T
	sim   *proxmoxsim.Simulator
	clock *proxmoxsim.FakeClock
	kube  client.Client
	r     *Reconciler
	// advance moves the simulator's clock and the operator's together.
	advance func(time.Duration)
	// drop, when set, sees every request before the simulator; true drops
	// it (the connection closes without an answer, as when the operator
	// stopped right after sending it).
	drop func(*http.Request) bool

	mu sync.Mutex
	// clones are the parameters of every clone request the simulator
	// received, with the source template as "source"; configs those of
	// every configuration update.
	clones, configs []map[string]string
}

// simOptions shape a simWorld.
type simOptions struct {
	// sim changes the simulator's configuration.
	sim func(*proxmoxsim.Config)
	// cluster changes the HypervisorCluster.
	cluster func(*hfv1.HypervisorCluster)
	// provider changes the provider's configuration (what the cluster
	// controller derives from the HypervisorCluster).
	provider func(*provider.ClusterConfig)
}

var (
	simClonePath  = regexp.MustCompile(`/nodes/[^/]+/qemu/(\d+)/clone$`)
	simConfigPath = regexp.MustCompile(`/nodes/[^/]+/qemu/\d+/config$`)
)

func newSimWorld(t *testing.T, opts simOptions) *simWorld {
	t.Helper()
	w := &simWorld{t: t, clock: proxmoxsim.NewFakeClock(unitEpoch)}
	cfg := proxmoxsim.DefaultConfig()
	cfg.AuthFailureDelay, cfg.RefreshInterval = 0, 0
	ms := func(n int) proxmoxsim.Duration { return proxmoxsim.Duration(time.Duration(n) * time.Millisecond) }
	cfg.Latency = proxmoxsim.Latency{CloneBase: ms(2000), Config: ms(20), Resize: ms(50), Start: ms(50), Boot: ms(300),
		Stop: ms(50), Shutdown: ms(100), Destroy: ms(100), Upload: ms(20)}
	cfg.Storages = append(cfg.Storages, proxmoxsim.StorageConfig{ID: refusedStorage, Type: "lvmthin", Content: []string{"images", "rootdir"}, Capacity: 500 << 30})
	cfg.Pools = []proxmoxsim.PoolConfig{{ID: authorizedPool}, {ID: refusedPool}}
	// No cloud-init drive of their own: the VM's drive goes where the
	// claim's driveStorage says.
	cfg.Templates = []proxmoxsim.TemplateConfig{
		{VMID: authorizedTemplate, Node: simNode, Name: "debian-12-ci", Storage: authorizedStorage, DiskSize: 32 << 30, Cores: 1, MemoryMiB: 1024, Agent: true, Tags: "template"},
		{VMID: refusedTemplate, Node: simNode, Name: "admin-only", Storage: authorizedStorage, DiskSize: 32 << 30, Cores: 1, MemoryMiB: 1024, Agent: true, Tags: "template"},
	}
	if opts.sim != nil {
		opts.sim(&cfg)
	}
	sim, err := proxmoxsim.New(cfg, proxmoxsim.WithClock(w.clock), proxmoxsim.WithAdmin(true))
	if err != nil {
		t.Fatal(err)
	}
	w.sim = sim
	for _, name := range []string{"kit.yaml", "team-a.yaml", "team-b-kit.yaml", "team-b.yaml"} {
		if _, err := sim.PutSnippet("local", simNode, name, []byte("#cloud-config\n")); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(w.serve))
	srv.StartTLS()
	t.Cleanup(func() {
		srv.Close()
		_ = sim.Close()
	})

	signer := testobjects.Signer(t)
	kclock := clocktesting.NewFakeClock(unitEpoch)
	pcfg := provider.ClusterConfig{
		Name: simCluster, Endpoint: srv.URL + "/api2/json", TokenID: "root@pam!sim", TokenSecret: "00000000-0000-0000-0000-000000000000",
		FingerprintSHA256: proxmoxsim.FormatFingerprint(sha256.Sum256(srv.Certificate().Raw)),
		DefaultBridge:     authorizedBridge, VMIDStart: 1000, VMIDEnd: 1999, Nodes: []string{simNode}, RequestTimeout: 10 * time.Second,
	}
	if opts.provider != nil {
		opts.provider(&pcfg)
	}
	reg := hypervisors.NewRegistry()
	if _, err := reg.Connect(simCluster, pcfg, func() (provider.Provider, error) {
		return proxmox.New(pcfg, provider.Deps{Signer: signer, Clock: kclock})
	}); err != nil {
		t.Fatal(err)
	}
	reg.SetHealth(simCluster, hypervisors.Health{Ready: true}, unitEpoch)

	cluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: simCluster}}
	cluster.Spec.DefaultBridge = authorizedBridge
	tenants := &metav1.LabelSelector{MatchLabels: map[string]string{"tenant": "a"}}
	cluster.Spec.AllowedNamespaces = tenants
	cluster.Spec.Tenancy = []hfv1.TenancyRule{{
		NamespaceSelector: *tenants,
		Templates:         []hfv1.AllowedTemplate{{ID: ptr.To[int32](authorizedTemplate)}},
		Bridges:           []string{authorizedBridge},
		VLANs:             []hfv1.VLANRange{{Start: authorizedVLAN, End: authorizedVLAN + 99}},
		Storages:          []string{authorizedStorage},
		ResourcePools:     []string{authorizedPool},
		Snippets:          []string{authorizedVendorSnippet, authorizedUserSnippet},
		DNSDomains:        []string{authorizedDNSDomain},
	}}
	if opts.cluster != nil {
		opts.cluster(cluster)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: simNamespace, Labels: map[string]string{"tenant": "a"}}}
	w.kube = claimWorld(t, ns, cluster, authorizedTemplateObject())
	w.r = &Reconciler{Client: w.kube, Registry: reg, Signer: signer, Recorder: record.NewFakeRecorder(4096), Clock: kclock, CI: &ciDouble{}}
	w.advance = func(d time.Duration) {
		w.clock.Advance(d)
		kclock.Step(d)
	}
	return w
}

// authorizedTemplateObject is team-a's template, validated and Ready, as
// its cluster's tenancy allows it: template 9000 fully cloned to local-lvm
// (raw) into pool ci, bridge vmbr0 VLAN 100 (virtio), 2 cores, 2 GiB and a
// 40 GiB disk, Proxmox's own cloud-init drive on local-lvm with the kit
// and team-a's user-data as snippets, and the domain team-a.ci.example.com.
func authorizedTemplateObject() *hfv1.HypervisorMachineTemplate {
	tmpl := testobjects.GitHubTemplate(func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Namespace, tm.Name, tm.Generation = simNamespace, "debian", 1
		tm.Spec.HypervisorClusterRef.Name = simCluster
		tm.Spec.Source.Proxmox = hfv1.ProxmoxSource{TemplateID: ptr.To[int32](authorizedTemplate), CloneMode: hfv1.CloneModeFull,
			Storage: authorizedStorage, Format: "raw", Pool: authorizedPool}
		tm.Spec.Resources = hfv1.MachineResources{CPU: 2, Memory: resource.MustParse("2Gi"), Disk: ptr.To(resource.MustParse("40Gi"))}
		tm.Spec.Network.Bridge, tm.Spec.Network.VLAN, tm.Spec.Network.Model = authorizedBridge, ptr.To(authorizedVLAN), "virtio"
		tm.Spec.Network.DNS = &hfv1.DNSSettings{Domain: authorizedDNSDomain}
		tm.Spec.CloudInit = &hfv1.CloudInit{Delivery: hfv1.CloudInitDeliveryProxmox, Proxmox: &hfv1.ProxmoxCloudInit{
			VendorSnippet: authorizedVendorSnippet, UserSnippet: authorizedUserSnippet, DriveStorage: authorizedStorage}}
		tm.Status.ObservedGeneration = 1
		tm.Status.Conditions = []metav1.Condition{{Type: string(hfv1.ReadyCondition), Status: metav1.ConditionTrue, Reason: string(hfv1.ReadyReason), LastTransitionTime: metav1.NewTime(unitEpoch)}}
	})
	return tmpl
}

// serve records clone requests and configuration updates and passes every
// request on to the simulator, or drops it.
func (w *simWorld) serve(rw http.ResponseWriter, r *http.Request) {
	if w.drop != nil && w.drop(r) {
		panic(http.ErrAbortHandler)
	}
	if m := simClonePath.FindStringSubmatch(r.URL.Path); m != nil && r.Method == http.MethodPost {
		params := requestParams(r)
		params["source"] = m[1]
		w.mu.Lock()
		w.clones = append(w.clones, params)
		w.mu.Unlock()
	}
	if simConfigPath.MatchString(r.URL.Path) && (r.Method == http.MethodPut || r.Method == http.MethodPost) {
		params := requestParams(r)
		w.mu.Lock()
		w.configs = append(w.configs, params)
		w.mu.Unlock()
	}
	w.sim.ServeHTTP(rw, r)
}

// requestParams reads a request's parameters (a JSON or form body) and
// leaves the body to be read again.
func requestParams(r *http.Request) map[string]string {
	raw, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(raw))
	params := map[string]string{}
	var body map[string]any
	if json.Unmarshal(raw, &body) == nil {
		for k, v := range body {
			params[k] = fmt.Sprint(v)
		}
	} else if form, err := url.ParseQuery(string(raw)); err == nil {
		for k := range form {
			params[k] = form.Get(k)
		}
	}
	return params
}

// clonesSent and configsSent return the clone requests and configuration
// updates so far.
func (w *simWorld) clonesSent() []map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]map[string]string(nil), w.clones...)
}

func (w *simWorld) configsSent() []map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]map[string]string(nil), w.configs...)
}

// newClaim creates a claim of the world's template.
func (w *simWorld) newClaim(name string) *hfv1.MachineClaim {
	w.t.Helper()
	// The fake client gives no UID; the API server would.
	c := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: simNamespace, Name: name, UID: types.UID("3f2a9c4e-" + name)}}
	c.Spec.TemplateRef.Name = "debian"
	if err := w.kube.Create(context.Background(), c); err != nil {
		w.t.Fatal(err)
	}
	return c
}

// claim reads the claim back.
func (w *simWorld) claim(c *hfv1.MachineClaim) *hfv1.MachineClaim {
	w.t.Helper()
	got := &hfv1.MachineClaim{}
	if err := w.kube.Get(context.Background(), client.ObjectKeyFromObject(c), got); err != nil {
		w.t.Fatal(err)
	}
	return got
}

// editTemplate changes the template as its tenant would.
func (w *simWorld) editTemplate(mutate func(*hfv1.HypervisorMachineTemplate)) {
	w.t.Helper()
	tmpl := &hfv1.HypervisorMachineTemplate{}
	if err := w.kube.Get(context.Background(), client.ObjectKey{Namespace: simNamespace, Name: "debian"}, tmpl); err != nil {
		w.t.Fatal(err)
	}
	mutate(tmpl)
	if err := w.kube.Update(context.Background(), tmpl); err != nil {
		w.t.Fatal(err)
	}
}

// maxPasses bounds runUntil: a claim takes a few dozen passes from
// creation to a running VM.
const maxPasses = 200

// runUntil reconciles the claim pass by pass, the clocks advanced by what
// each pass asked for, until done says the claim got where the test wants
// it; it fails the test when the claim never does.
func (w *simWorld) runUntil(c *hfv1.MachineClaim, what string, done func(*hfv1.MachineClaim) bool) *hfv1.MachineClaim {
	w.t.Helper()
	for range maxPasses {
		res, err := w.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(c)})
		if err != nil {
			w.t.Logf("pass: %v", err)
		}
		got := w.claim(c)
		if done(got) {
			return got
		}
		step := res.RequeueAfter
		if step <= 0 || step > time.Minute {
			step = time.Second
		}
		w.advance(step)
	}
	got := w.claim(c)
	w.t.Fatalf("claim %s never got %s in %d passes; status %+v", c.Name, what, maxPasses, got.Status)
	return nil
}

// provisioned reports whether the claim's VM runs.
func provisioned(c *hfv1.MachineClaim) bool {
	cond := hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimProvisionedCondition)
	return cond != nil && cond.Status == metav1.ConditionTrue
}

// vmOf is the claim's VM as the simulator holds it.
func (w *simWorld) vmOf(c *hfv1.MachineClaim) proxmoxsim.VMState {
	w.t.Helper()
	for _, vm := range w.sim.VMs() {
		if c.Status.VMRef != nil && vm.VMID == int(c.Status.VMRef.VMID) {
			return vm
		}
	}
	w.t.Fatalf("the claim's VM %+v does not exist", c.Status.VMRef)
	return proxmoxsim.VMState{}
}
