package fake_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/hyperfleet/hyperfleet/internal/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/fake"
	"github.com/hyperfleet/hyperfleet/pkg/provider/providertest"
)

var start = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func testSigner(t *testing.T) *ownership.Signer {
	t.Helper()
	s, err := ownership.NewSigner("contract", bytes.Repeat([]byte{7}, ownership.MinKeyLength))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func baseConfig() provider.ClusterConfig {
	return provider.ClusterConfig{
		Name: "fake", VMIDStart: 100, VMIDEnd: 199, ISOStorage: "local", DefaultBridge: "vmbr0", Tags: []string{"ci"},
	}
}

// env is one fake cluster with its clock, for the fake's own tests and for
// the contract harness.
type env struct {
	p     *fake.Provider
	clock *clocktesting.FakeClock
	cfg   provider.ClusterConfig
	deps  provider.Deps
}

func newEnv(t *testing.T, cfg provider.ClusterConfig, opts fake.Options, obs provider.Observer) *env {
	t.Helper()
	clk := clocktesting.NewFakeClock(start)
	deps := provider.Deps{Signer: testSigner(t).ForCluster(ownership.ClusterIdentity{Name: cfg.Name}), Clock: clk, Observer: obs}
	p, err := fake.New(cfg, deps, opts)
	if err != nil {
		t.Fatalf("fake.New: %v", err)
	}
	return &env{p: p, clock: clk, cfg: cfg, deps: deps}
}

func (e *env) harness(template provider.TemplateSource) *providertest.Harness {
	p := e.p
	return &providertest.Harness{
		Provider: p,
		NewProvider: func(t *testing.T, configure func(*provider.ClusterConfig)) provider.Provider {
			c := e.cfg
			if configure != nil {
				configure(&c)
			}
			np, err := p.Connect(c, e.deps)
			if err != nil {
				t.Fatalf("Connect: %v", err)
			}
			return np
		},
		Signer:   e.deps.Signer,
		Template: template,
		Advance:  e.clock.Step,
		GuestPowerOff: func(t *testing.T, vmid int) {
			if err := p.GuestPowerOff(vmid); err != nil {
				t.Fatal(err)
			}
		},
		CreateForeignVM: func(t *testing.T, vmid int, description string, tags []string) int {
			id, err := p.AddForeignVM(fake.ForeignVM{VMID: vmid, Description: description, Tags: tags})
			if err != nil {
				t.Fatal(err)
			}
			return id
		},
		SetDescription: func(t *testing.T, vmid int, description string) {
			if err := p.SetDescription(vmid, description); err != nil {
				t.Fatal(err)
			}
		},
		CloudInitOf: func(t *testing.T, vmid int) provider.CloudInit {
			c, ok := p.DeliveredCloudInit(vmid)
			if !ok {
				t.Fatalf("the guest of VM %d never read a cloud-init ISO", vmid)
			}
			return c
		},
		FailDestroysOtherMissing: func(t *testing.T) func() {
			// As Proxmox answers a destroy whose disk's storage or volume
			// is gone.
			p.FailNextOpWith(fake.OpDestroy, 1000, 500, "storage 'local-lvm' does not exist")
			return p.ClearFailures
		},
		StoredData: func(t *testing.T) []string {
			var out []string
			for _, s := range p.StoredCloudInit() {
				out = append(out, string(s.Payload.UserData), string(s.Payload.MetaData), string(s.Payload.NetworkConfig))
			}
			for _, vm := range p.VMs() {
				out = append(out, vm.Description, vm.Name, strings.Join(vm.Tags, ";"))
			}
			return out
		},
	}
}

// TestContract runs the provider contract suite against the fake, on the
// default cluster (one node, linked clones) and on a two-node cluster with a
// shared storage, full clones and a live status listing.
func TestContract(t *testing.T) {
	t.Run("default cluster, linked clones", func(t *testing.T) {
		providertest.Run(t, func(t *testing.T) *providertest.Harness {
			return newEnv(t, baseConfig(), fake.DefaultOptions(), nil).harness(provider.TemplateSource{ID: 9000, Linked: true})
		})
	})
	t.Run("two nodes, shared storage, full clones", func(t *testing.T) {
		providertest.Run(t, func(t *testing.T) *providertest.Harness {
			return newEnv(t, sharedConfig(), sharedOptions(), nil).harness(provider.TemplateSource{Name: "debian-13-ci"})
		})
	})
}

func sharedConfig() provider.ClusterConfig {
	c := baseConfig()
	c.ISOStorage, c.DefaultStorage = "cephfs", "ceph"
	return c
}

func sharedOptions() fake.Options {
	o := fake.DefaultOptions()
	o.Nodes = []fake.Node{
		{Name: "pve1", CPUs: 16, MemoryBytes: 16 << 30, BaseMemoryUsedBytes: 2 << 30},
		{Name: "pve2", CPUs: 32, MemoryBytes: 32 << 30, BaseMemoryUsedBytes: 2 << 30},
	}
	o.Storages = append(o.Storages,
		fake.Storage{ID: "ceph", Type: "rbd", Content: []string{"images"}, Shared: true, CapacityBytes: 4 << 40},
		fake.Storage{ID: "cephfs", Type: "cephfs", Content: []string{"iso"}, Shared: true, CapacityBytes: 1 << 40})
	o.Templates = []fake.Template{{VMID: 9100, Node: "pve1", Name: "debian-13-ci", Storage: "ceph", DiskBytes: 16 << 30, Cores: 2, MemoryBytes: 4 << 30}}
	o.RefreshInterval = 0
	return o
}

// lifecycle drives one VM to Running with the fake directly.
func runVM(t *testing.T, e *env, p provider.Provider, i int) (*provider.VMSpec, *provider.EnsureResult) {
	t.Helper()
	s := &provider.VMSpec{
		Owner: provider.Owner{Namespace: "ci", Name: fmt.Sprintf("claim-%d", i), UID: fmt.Sprintf("uid-%d", i), CreatedAt: start},
		Name:  fmt.Sprintf("runner-%d", i), Source: provider.TemplateSource{ID: 9000, Linked: true},
		CloudInit: provider.CloudInit{UserData: []byte(fmt.Sprintf("#cloud-config\n# secret-%d\n", i))},
	}
	var prog provider.Progress
	for n := 0; n < 200; n++ {
		res, err := p.EnsureVM(context.Background(), s, prog)
		if err != nil {
			t.Fatalf("EnsureVM: %v", err)
		}
		if res.Phase == provider.PhaseRunning {
			return s, res
		}
		prog = res.Progress
		e.clock.Step(res.RetryAfter)
	}
	t.Fatal("VM not Running after 200 calls")
	return nil, nil
}

func TestGuestPowerOffControl(t *testing.T) {
	e := newEnv(t, baseConfig(), fake.DefaultOptions(), nil)
	if err := e.p.GuestPowerOff(100); err == nil {
		t.Error("GuestPowerOff of a missing VM succeeded")
	}
	_, res := runVM(t, e, e.p, 1)
	id := res.Progress.VMID
	if err := e.p.GuestPowerOff(id); err != nil {
		t.Fatalf("GuestPowerOff: %v", err)
	}
	if vm, _ := e.p.VM(id); vm.Power != provider.PowerStopped || vm.AgentUp {
		t.Errorf("after GuestPowerOff: %+v", vm)
	}
	if err := e.p.GuestPowerOff(id); err == nil {
		t.Error("GuestPowerOff of a stopped VM succeeded")
	}
}

func TestAddForeignVMAndSampledListing(t *testing.T) {
	e := newEnv(t, baseConfig(), fake.DefaultOptions(), nil)
	ctx := context.Background()
	id, err := e.p.AddForeignVM(fake.ForeignVM{Name: "by-hand", Description: "hand made", Tags: []string{"Team-A", "team-a"}, Running: true})
	if err != nil {
		t.Fatal(err)
	}
	if id != 100 {
		t.Errorf("first free id is %d, want 100", id)
	}
	if _, err := e.p.AddForeignVM(fake.ForeignVM{VMID: id}); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("AddForeignVM at a taken id: %v", err)
	}
	if _, err := e.p.AddForeignVM(fake.ForeignVM{Tags: []string{"hyperfleet.io/managed-by=x"}}); err == nil {
		t.Error("AddForeignVM accepted a tag Proxmox rejects")
	}
	find := func() provider.VMSummary {
		list, err := e.p.ListVMs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range list {
			if s.VMID == id {
				return s
			}
		}
		t.Fatalf("ListVMs does not list VM %d", id)
		return provider.VMSummary{}
	}
	// Membership and tags are live; power and name wait for the sample.
	s := find()
	if s.Power != provider.PowerUnknown || s.Name != "" || strings.Join(s.Tags, ",") != "team-a" || s.OperatorTagged {
		t.Errorf("before the next sample: %+v", s)
	}
	e.clock.Step(10 * time.Second)
	if s := find(); s.Power != provider.PowerRunning || s.Name != "by-hand" || s.Uptime != 10*time.Second {
		t.Errorf("after the sample: %+v", s)
	}
	if err := e.p.GuestPowerOff(id); err != nil {
		t.Fatal(err)
	}
	if s := find(); s.Power != provider.PowerRunning {
		t.Errorf("the listing must stay stale until the next sample, got %s", s.Power)
	}
	e.p.RefreshResources()
	if s := find(); s.Power != provider.PowerStopped || s.Uptime != 0 {
		t.Errorf("after RefreshResources: %+v", s)
	}
	vm, err := e.p.GetVM(ctx, provider.VMRef{VMID: id})
	if err != nil || vm.Owner != nil || !errors.Is(vm.OwnershipError, ownership.ErrNoMarker) {
		t.Errorf("GetVM of a foreign VM: %v, %+v", err, vm)
	}
}

func TestSetDescriptionAndTagsControls(t *testing.T) {
	e := newEnv(t, baseConfig(), fake.DefaultOptions(), nil)
	ctx := context.Background()
	s, res := runVM(t, e, e.p, 1)
	id := res.Progress.VMID
	vm, _ := e.p.VM(id)
	if _, err := e.deps.Signer.Verify(vm.Description, id); err != nil {
		t.Fatalf("the VM's marker does not verify: %v\n%s", err, vm.Description)
	}
	if err := e.p.SetDescription(id, strings.Replace(vm.Description, "claim-1", "claim-2", 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.DeleteVM(ctx, s.Owner, res.Progress); !errors.Is(err, provider.ErrNotOwned) {
		t.Errorf("DeleteVM after the marker was edited: %v", err)
	}
	if err := e.p.SetDescription(id, vm.Description); err != nil {
		t.Fatal(err)
	}
	if err := e.p.SetTags(id, []string{"other"}); err != nil {
		t.Fatal(err)
	}
	got, err := e.p.GetVM(ctx, res.Progress.VMRef())
	if err != nil || got.Owner == nil || got.OperatorTagged {
		t.Errorf("restored marker, tags removed: %v, %+v", err, got)
	}
	if err := e.p.SetDescription(999, "x"); err == nil {
		t.Error("SetDescription of a missing VM succeeded")
	}
	if err := e.p.SetDescription(id, strings.Repeat("x", 8193)); err == nil {
		t.Error("SetDescription accepted more than 8192 characters")
	}
}

func TestAddTemplateControl(t *testing.T) {
	e := newEnv(t, baseConfig(), fake.DefaultOptions(), nil)
	ctx := context.Background()
	tmpl := fake.Template{VMID: 9001, Node: "pve1", Name: "ubuntu-ci", Storage: "local-lvm", DiskBytes: 20 << 30, Cores: 4, MemoryBytes: 4 << 30}
	if err := e.p.AddTemplate(tmpl); err != nil {
		t.Fatal(err)
	}
	info, err := e.p.ValidateTemplate(ctx, provider.TemplateSource{Name: "ubuntu-ci", Linked: true})
	if err != nil {
		t.Fatalf("ValidateTemplate of the added template: %v", err)
	}
	if info.ID != 9001 || info.DiskBytes != 20<<30 || !info.LinkedCloneSupported || info.Storages[0] != "local-lvm" {
		t.Errorf("template info %+v", *info)
	}
	if err := e.p.AddTemplate(tmpl); err == nil {
		t.Error("AddTemplate of a taken id succeeded")
	}
	tmpl.VMID, tmpl.Storage = 9002, "local" // a storage without images
	if err := e.p.AddTemplate(tmpl); err == nil {
		t.Error("AddTemplate on a storage without images succeeded")
	}
}

func TestValidateTemplateRules(t *testing.T) {
	o := fake.DefaultOptions()
	o.Storages = append(o.Storages, fake.Storage{ID: "thick", Type: "lvm", Content: []string{"images"}})
	o.Templates = append(o.Templates, fake.Template{VMID: 9003, Node: "pve1", Name: "thick-ci", Storage: "thick", DiskBytes: 8 << 30})
	o.Pools = []string{"ci"}
	e := newEnv(t, baseConfig(), o, nil)
	if err := e.p.SetDescription(9000, "still a template"); err != nil {
		t.Fatal(err)
	}
	id, err := e.p.AddForeignVM(fake.ForeignVM{Name: "not-a-template"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		src    provider.TemplateSource
		reason string
	}{
		{"linked clone on thick LVM", provider.TemplateSource{ID: 9003, Linked: true}, "LinkedCloneUnsupported"},
		{"full clone on thick LVM", provider.TemplateSource{ID: 9003}, ""},
		{"full clone to a storage without images", provider.TemplateSource{ID: 9000, Storage: "local"}, "StorageNoImages"},
		{"bad format", provider.TemplateSource{ID: 9000, Format: "vhd"}, "InvalidFormat"},
		{"missing pool", provider.TemplateSource{ID: 9000, Linked: true, ResourcePool: "nope"}, "PoolNotFound"},
		{"existing pool", provider.TemplateSource{ID: 9000, Linked: true, ResourcePool: "ci"}, ""},
		{"not a template", provider.TemplateSource{ID: id}, "NotATemplate"},
		{"nothing named", provider.TemplateSource{}, "TemplateUnset"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := e.p.ValidateTemplate(context.Background(), c.src)
			if c.reason == "" {
				if err != nil {
					t.Fatalf("ValidateTemplate: %v", err)
				}
				return
			}
			if provider.ReasonOf(err) != c.reason || provider.Classify(err) != provider.ClassConfiguration {
				t.Errorf("ValidateTemplate: %v (reason %s, class %s), want reason %s", err, provider.ReasonOf(err), provider.Classify(err), c.reason)
			}
		})
	}
}

func TestNodeOffline(t *testing.T) {
	e := newEnv(t, baseConfig(), fake.DefaultOptions(), nil)
	ctx := context.Background()
	s, res := runVM(t, e, e.p, 1)
	if err := e.p.SetNodeOnline("pve1", false); err != nil {
		t.Fatal(err)
	}
	info, err := e.p.Probe(ctx)
	if err != nil || info.Nodes[0].Online {
		t.Fatalf("Probe with the node offline: %v, %+v", err, info)
	}
	if _, err := e.p.GetVM(ctx, res.Progress.VMRef()); !errors.Is(err, provider.ErrUnreachable) || provider.Classify(err) != provider.ClassTransient {
		t.Errorf("GetVM on an offline node: %v", err)
	}
	list, err := e.p.ListVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range list {
		if v.Power != provider.PowerUnknown {
			t.Errorf("VM %d on an offline node lists as %s", v.VMID, v.Power)
		}
	}
	other := *s
	other.Owner.UID, other.Name = "uid-2", "runner-2"
	// The template lives on the offline node: like Proxmox's 595, transient.
	if _, err := e.p.EnsureVM(ctx, &other, provider.Progress{}); !errors.Is(err, provider.ErrUnreachable) || provider.Classify(err) != provider.ClassTransient {
		t.Errorf("placement with the template's node offline: %v", err)
	}
	if err := e.p.SetNodeOnline("pve1", true); err != nil {
		t.Fatal(err)
	}
	if vm, err := e.p.GetVM(ctx, res.Progress.VMRef()); err != nil || vm.Power != provider.PowerRunning {
		t.Errorf("GetVM back online: %v, %+v", err, vm)
	}
	other.MemoryHint = 1 << 40
	if _, err := e.p.EnsureVM(ctx, &other, provider.Progress{}); !errors.Is(err, provider.ErrNoCapacity) || provider.Classify(err) != provider.ClassResource {
		t.Errorf("placement of a VM no node has room for: %v", err)
	}
	if err := e.p.SetNodeOnline("pve9", true); err == nil {
		t.Error("SetNodeOnline of an unknown node succeeded")
	}
}

func TestFailNext(t *testing.T) {
	e := newEnv(t, baseConfig(), fake.DefaultOptions(), nil)
	ctx := context.Background()
	s := &provider.VMSpec{
		Owner: provider.Owner{Namespace: "ci", Name: "c", UID: "u"}, Name: "runner",
		Source: provider.TemplateSource{ID: 9000, Linked: true},
	}
	e.p.FailNext(fake.MethodEnsureVM, 2, provider.ClassTransient)
	e.p.FailNext(fake.MethodProbe, 1, provider.ClassConfiguration)
	for i := 0; i < 2; i++ {
		if _, err := e.p.EnsureVM(ctx, s, provider.Progress{}); provider.Classify(err) != provider.ClassTransient || provider.ReasonOf(err) != "Injected" {
			t.Fatalf("call %d: %v, want an injected transient error", i, err)
		}
	}
	if got := e.p.Calls(fake.MethodEnsureVM); got != 0 {
		t.Errorf("injected method failures made %d API-like calls", got)
	}
	if _, err := e.p.Probe(ctx); !errors.Is(err, provider.ErrUnauthorized) || provider.Classify(err) != provider.ClassConfiguration {
		t.Errorf("Probe: %v, want an injected configuration error", err)
	}
	placed, err := e.p.EnsureVM(ctx, s, provider.Progress{})
	if err != nil {
		t.Fatalf("EnsureVM after the injected failures: %v", err)
	}

	// A failed clone call leaves nothing behind; the next call clones.
	e.p.FailNextOp(fake.OpClone, 1, provider.ClassTransient)
	if _, err := e.p.EnsureVM(ctx, s, placed.Progress); !errors.Is(err, provider.ErrUnreachable) {
		t.Fatalf("EnsureVM with a failing clone call: %v", err)
	}
	if _, ok := e.p.VM(placed.Progress.VMID); ok {
		t.Fatal("a failed clone call created the VM")
	}
	res, err := e.p.EnsureVM(ctx, s, placed.Progress)
	if err != nil || res.Phase != provider.PhaseCloning {
		t.Fatalf("EnsureVM after the failed clone call: %v, %+v", err, res)
	}
	if got := e.p.OpCalls(fake.OpClone); got != 2 {
		t.Errorf("%d clone calls, want 2 (one failed)", got)
	}
}

// recorder is a provider.Observer that keeps what it is told.
type recorder struct {
	mu    sync.Mutex
	calls map[string]int
	queue []int
}

func (r *recorder) APICall(method, endpoint string, code int, _ time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls[fmt.Sprintf("%s %s %d", method, endpoint, code)]++
}

func (r *recorder) CloneQueue(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queue = append(r.queue, n)
}

func TestCallCountsAndObserver(t *testing.T) {
	rec := &recorder{calls: map[string]int{}}
	e := newEnv(t, baseConfig(), fake.DefaultOptions(), rec)
	ctx := context.Background()
	s, res := runVM(t, e, e.p, 1)
	for op, want := range map[fake.Op]int{fake.OpClone: 1, fake.OpUpload: 1, fake.OpStart: 1, fake.OpDeleteVolume: 1, fake.OpResize: 0} {
		if got := e.p.OpCalls(op); got != want {
			t.Errorf("%s calls: %d, want %d", op, got, want)
		}
	}
	if got := rec.calls["POST /nodes/{node}/qemu/{vmid}/clone 200"]; got != 1 {
		t.Errorf("observer saw %d clone calls, want 1: %v", got, rec.calls)
	}
	ensure := e.p.Calls(fake.MethodEnsureVM)
	if ensure == 0 {
		t.Fatal("EnsureVM made no counted calls")
	}
	t.Logf("EnsureVM made %d API-like calls to reach Running", ensure)

	e.p.ResetCalls()
	prog := res.Progress
	for n := 0; ; n++ {
		d, err := e.p.DeleteVM(ctx, s.Owner, prog)
		if err != nil {
			t.Fatal(err)
		}
		if d.Done {
			break
		}
		if n > 50 {
			t.Fatal("DeleteVM not Done")
		}
		prog = d.Progress
		e.clock.Step(d.RetryAfter)
	}
	if e.p.Calls(fake.MethodEnsureVM) != 0 || e.p.Calls(fake.MethodDeleteVM) == 0 || e.p.OpCalls(fake.OpStop) != 1 || e.p.OpCalls(fake.OpDestroy) != 1 {
		t.Errorf("after ResetCalls and a delete: EnsureVM %d, DeleteVM %d, stop %d, destroy %d", e.p.Calls(fake.MethodEnsureVM),
			e.p.Calls(fake.MethodDeleteVM), e.p.OpCalls(fake.OpStop), e.p.OpCalls(fake.OpDestroy))
	}
}

func TestCloneQueueObserved(t *testing.T) {
	rec := &recorder{calls: map[string]int{}}
	cfg := baseConfig()
	cfg.ClonesPerNode = 1
	e := newEnv(t, cfg, fake.DefaultOptions(), rec)
	ctx := context.Background()
	var specs []*provider.VMSpec
	var progs []provider.Progress
	for i := 0; i < 3; i++ {
		s := &provider.VMSpec{
			Owner: provider.Owner{Namespace: "ci", Name: fmt.Sprintf("c%d", i), UID: fmt.Sprintf("u%d", i)}, Name: fmt.Sprintf("r%d", i),
			Source: provider.TemplateSource{ID: 9000, Linked: true},
		}
		res, err := e.p.EnsureVM(ctx, s, provider.Progress{})
		if err != nil {
			t.Fatal(err)
		}
		specs, progs = append(specs, s), append(progs, res.Progress)
	}
	var phases []provider.Phase
	for i, s := range specs {
		res, err := e.p.EnsureVM(ctx, s, progs[i])
		if err != nil {
			t.Fatal(err)
		}
		phases = append(phases, res.Phase)
	}
	want := []provider.Phase{provider.PhaseCloning, provider.PhaseQueued, provider.PhaseQueued}
	if fmt.Sprint(phases) != fmt.Sprint(want) {
		t.Errorf("phases %v, want %v", phases, want)
	}
	if fmt.Sprint(rec.queue) != "[0 1 2]" {
		t.Errorf("clone queue reports %v, want [0 1 2]", rec.queue)
	}
}

func TestStoredCloudInitLifetime(t *testing.T) {
	e := newEnv(t, baseConfig(), fake.DefaultOptions(), nil)
	ctx := context.Background()
	s := &provider.VMSpec{
		Owner: provider.Owner{Namespace: "ci", Name: "c", UID: "6f1c9a2e-0000-4000-8000-000000000001"}, Name: "runner",
		Source: provider.TemplateSource{ID: 9000, Linked: true}, CloudInit: provider.CloudInit{UserData: []byte("jit-config-secret")},
	}
	var prog provider.Progress
	maxStored := 0
	for n := 0; ; n++ {
		res, err := e.p.EnsureVM(ctx, s, prog)
		if err != nil {
			t.Fatal(err)
		}
		stored := e.p.StoredCloudInit()
		maxStored = max(maxStored, len(stored))
		for _, st := range stored {
			if string(st.Payload.UserData) != "jit-config-secret" || !strings.Contains(st.VolID, s.Owner.UID) || st.Storage != "local" || st.Node != "pve1" {
				t.Errorf("stored ISO %+v", st)
			}
		}
		if res.Phase == provider.PhaseRunning {
			if len(stored) != 0 {
				t.Errorf("Running with %d ISOs still stored", len(stored))
			}
			if vm, _ := e.p.VM(res.Progress.VMID); vm.CDROM != "none" {
				t.Errorf("Running with the ISO drive at %q", vm.CDROM)
			}
			break
		}
		if n > 100 {
			t.Fatal("not Running")
		}
		prog = res.Progress
		e.clock.Step(res.RetryAfter)
	}
	if maxStored != 1 {
		t.Errorf("at most %d ISOs were stored, want 1", maxStored)
	}
}

// TestTasksTakeTheirTimeOnTheClock checks that a clone lasts exactly its
// configured duration on the injected clock.
func TestTasksTakeTheirTimeOnTheClock(t *testing.T) {
	o := fake.DefaultOptions()
	o.Durations.Clone = 7 * time.Second
	e := newEnv(t, baseConfig(), o, nil)
	ctx := context.Background()
	s := &provider.VMSpec{Owner: provider.Owner{Namespace: "ci", Name: "c", UID: "u"}, Name: "runner", Source: provider.TemplateSource{ID: 9000, Linked: true}}
	res, err := e.p.EnsureVM(ctx, s, provider.Progress{})
	if err != nil {
		t.Fatal(err)
	}
	res, err = e.p.EnsureVM(ctx, s, res.Progress)
	if err != nil || res.Phase != provider.PhaseCloning {
		t.Fatalf("clone: %v, %+v", err, res)
	}
	cloning := res.Progress
	e.clock.Step(7*time.Second - time.Millisecond)
	if res, err = e.p.EnsureVM(ctx, s, cloning); err != nil || res.Phase != provider.PhaseCloning {
		t.Fatalf("1ms before the clone ends: %v, %+v", err, res)
	}
	if vm, _ := e.p.VM(cloning.VMID); vm.Lock != "clone" || vm.Description != "" {
		t.Errorf("the placeholder during the clone: %+v", vm)
	}
	e.clock.Step(time.Millisecond)
	if res, err = e.p.EnsureVM(ctx, s, cloning); err != nil || res.Phase != provider.PhaseConfiguring {
		t.Fatalf("when the clone ends: %v, %+v", err, res)
	}
	vm, _ := e.p.VM(cloning.VMID)
	if vm.Lock != "" || !strings.Contains(vm.Description, "BEGIN HYPERFLEET OWNERSHIP") || strings.Join(vm.Tags, ";") != "template" {
		t.Errorf("after the clone the VM carries the marker and still the template's tags: %+v", vm)
	}
}

// TestRestartHandsOutAReservedID documents a Proxmox semantic the fake
// mirrors: reservations live in-process, so a restarted instance may place
// another owner on an id reserved before the restart.
func TestRestartHandsOutAReservedID(t *testing.T) {
	e := newEnv(t, baseConfig(), fake.DefaultOptions(), nil)
	ctx := context.Background()
	spec := func(i int) *provider.VMSpec {
		return &provider.VMSpec{Owner: provider.Owner{Namespace: "ci", Name: fmt.Sprintf("c%d", i), UID: fmt.Sprintf("u%d", i)},
			Name: fmt.Sprintf("r%d", i), Source: provider.TemplateSource{ID: 9000, Linked: true}}
	}
	a, err := e.p.EnsureVM(ctx, spec(1), provider.Progress{})
	if err != nil {
		t.Fatal(err)
	}
	same, err := e.p.EnsureVM(ctx, spec(2), provider.Progress{})
	if err != nil || same.Progress.VMID == a.Progress.VMID {
		t.Fatalf("one instance gave id %d twice: %v", a.Progress.VMID, err)
	}
	restarted := e.p.Restart()
	b, err := restarted.EnsureVM(ctx, spec(3), provider.Progress{})
	if err != nil {
		t.Fatal(err)
	}
	if b.Progress.VMID != a.Progress.VMID {
		t.Errorf("the restarted instance placed on %d, want the lost reservation %d", b.Progress.VMID, a.Progress.VMID)
	}
}

func TestSpecValidation(t *testing.T) {
	e := newEnv(t, baseConfig(), fake.DefaultOptions(), nil)
	good := provider.VMSpec{Owner: provider.Owner{Namespace: "ci", Name: "c", UID: "u"}, Name: "runner", Source: provider.TemplateSource{ID: 9000, Linked: true}}
	cases := []struct {
		name   string
		modify func(*provider.VMSpec)
	}{
		{"no owner UID", func(s *provider.VMSpec) { s.Owner.UID = "" }},
		{"name with underscore", func(s *provider.VMSpec) { s.Name = "bad_name" }},
		{"name with a dot", func(s *provider.VMSpec) { s.Name = "a.b" }},
		{"illegal tag", func(s *provider.VMSpec) { s.Tags = []string{"hyperfleet.io/pool=x"} }},
		{"bad MAC", func(s *provider.VMSpec) { s.Network.MACAddress = "02-00-00-00-00-01" }},
		{"VLAN too big", func(s *provider.VMSpec) { s.Network.VLAN = 4095 }},
		{"negative memory", func(s *provider.VMSpec) { s.MemoryBytes = -1 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := good
			c.modify(&s)
			if _, err := e.p.EnsureVM(context.Background(), &s, provider.Progress{}); provider.Classify(err) != provider.ClassConfiguration {
				t.Errorf("EnsureVM: %v, want a configuration error", err)
			}
		})
	}
	if _, err := e.p.EnsureVM(context.Background(), &good, provider.Progress{}); err != nil {
		t.Errorf("the valid spec: %v", err)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	signer := testSigner(t)
	for _, c := range []struct {
		name string
		cfg  provider.ClusterConfig
		deps provider.Deps
	}{
		{"no signer", baseConfig(), provider.Deps{}},
		{"range below 100", provider.ClusterConfig{VMIDStart: 50, VMIDEnd: 150}, provider.Deps{Signer: signer}},
		{"range reversed", provider.ClusterConfig{VMIDStart: 200, VMIDEnd: 150}, provider.Deps{Signer: signer}},
	} {
		if _, err := fake.New(c.cfg, c.deps, fake.DefaultOptions()); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
}

// The mutants below are providers with one contract violation each. The
// suite must fail against every one of them; TestSuiteCatchesMutants runs
// them in a child process and checks that it does.

// mutant wraps the fake and breaks one rule.
type mutant struct {
	*fake.Provider
	kind string
}

func (m mutant) EnsureVM(ctx context.Context, s *provider.VMSpec, prev provider.Progress) (*provider.EnsureResult, error) {
	res, err := m.Provider.EnsureVM(ctx, s, prev)
	if m.kind == "running-too-early" && err == nil && res.Phase == provider.PhaseBooting {
		res.Phase = provider.PhaseRunning
	}
	return res, err
}

func (m mutant) DeleteVM(ctx context.Context, o provider.Owner, prev provider.Progress) (*provider.DeleteResult, error) {
	res, err := m.Provider.DeleteVM(ctx, o, prev)
	switch {
	case m.kind == "ignores-ownership" && errors.Is(err, provider.ErrNotOwned):
		return &provider.DeleteResult{Progress: prev, Done: true}, nil
	case m.kind == "done-before-iso" && err == nil && res.Progress.Task != nil && res.Progress.Task.Operation == "destroy":
		res.Progress.Task, res.Done = nil, true
	case m.kind == "gone-on-any-missing" && err != nil && strings.Contains(err.Error(), "does not exist"):
		// The bug of docs/security.md "Absence and release": any
		// "does not exist" taken for the VM's absence.
		return &provider.DeleteResult{Progress: provider.Progress{VMID: prev.VMID, Node: prev.Node}, Done: true}, nil
	}
	return res, err
}

func (m mutant) RemoveCloudInitMedia(ctx context.Context, o provider.Owner, prev provider.Progress) (*provider.DeleteResult, error) {
	if m.kind == "keeps-cloud-init-media" {
		return &provider.DeleteResult{Progress: provider.Progress{VMID: prev.VMID, Node: prev.Node}, Done: true}, nil
	}
	return m.Provider.RemoveCloudInitMedia(ctx, o, prev)
}

func TestMutantContract(t *testing.T) {
	kind := os.Getenv("HF_FAKE_MUTANT")
	if kind == "" {
		t.Skip("run by TestSuiteCatchesMutants")
	}
	providertest.Run(t, func(t *testing.T) *providertest.Harness {
		e := newEnv(t, baseConfig(), fake.DefaultOptions(), nil)
		h := e.harness(provider.TemplateSource{ID: 9000, Linked: true})
		h.Provider = mutant{Provider: e.p, kind: kind}
		return h
	})
}

func TestSuiteCatchesMutants(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the suite in child processes")
	}
	cases := []struct {
		kind, run, wantFail string
	}{
		{"ignores-ownership", "NotOwned", "--- FAIL: TestMutantContract/NotOwned/foreign_VM_without_a_marker"},
		{"running-too-early", "EnsureVM/CloudInitDelivered", "--- FAIL: TestMutantContract/EnsureVM/CloudInitDelivered"},
		{"done-before-iso", "DeleteVM", "--- FAIL: TestMutantContract/DeleteVM/while_booting"},
		{"gone-on-any-missing", "DeleteVM/OtherMissingIsNotGone", "--- FAIL: TestMutantContract/DeleteVM/OtherMissingIsNotGone"},
		{"keeps-cloud-init-media", "RemoveCloudInitMedia", "--- FAIL: TestMutantContract/RemoveCloudInitMedia/while_booting"},
	}
	for _, c := range cases {
		t.Run(c.kind, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run", "^TestMutantContract$/^"+c.run+"$", "-test.v")
			cmd.Env = append(os.Environ(), "HF_FAKE_MUTANT="+c.kind)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed against a provider that %s:\n%s", c.kind, out)
			}
			if !strings.Contains(string(out), c.wantFail) {
				t.Errorf("the suite failed, but not in %q:\n%s", c.wantFail, out)
			}
		})
	}
}

// step drives s with p until done holds, failing after 200 calls.
func step(t *testing.T, e *env, s *provider.VMSpec, prog provider.Progress, done func(*provider.EnsureResult) bool) *provider.EnsureResult {
	t.Helper()
	for n := 0; n < 200; n++ {
		res, err := e.p.EnsureVM(context.Background(), s, prog)
		if err != nil {
			t.Fatalf("EnsureVM: %v", err)
		}
		if done(res) {
			return res
		}
		prog = res.Progress
		e.clock.Step(res.RetryAfter)
	}
	t.Fatal("condition not reached after 200 calls")
	return nil
}

func phaseIs(ph provider.Phase) func(*provider.EnsureResult) bool {
	return func(r *provider.EnsureResult) bool { return r.Phase == ph }
}

func simpleSpec(i int) *provider.VMSpec {
	return &provider.VMSpec{
		Owner: provider.Owner{Namespace: "ci", Name: fmt.Sprintf("c%d", i), UID: fmt.Sprintf("u%d", i)},
		Name:  fmt.Sprintf("r%d", i), Source: provider.TemplateSource{ID: 9000, Linked: true},
	}
}

func TestHardwareApplied(t *testing.T) {
	e := newEnv(t, baseConfig(), fake.DefaultOptions(), nil)
	s := simpleSpec(1)
	s.CPUCores, s.MemoryBytes, s.DiskBytes = 4, 3<<30+1, 40<<30
	s.Network = provider.NetworkSpec{Bridge: "vmbr1", VLAN: 42, Model: "e1000", MACAddress: "02:00:00:aa:bb:cc"}
	s.Tags = []string{"Team-X"}
	res := step(t, e, s, provider.Progress{}, phaseIs(provider.PhaseRunning))
	vm, _ := e.p.VM(res.Progress.VMID)
	want := fake.VMState{
		VMID: res.Progress.VMID, Node: "pve1", Name: "r1", Cores: 4, MemoryBytes: 3<<30 + 1<<20, DiskBytes: 40 << 30,
		Storage: "local-lvm", Linked: true, NetModel: "e1000", MACAddress: "02:00:00:aa:bb:cc", Bridge: "vmbr1", VLAN: 42,
		CDROM: "none", Power: provider.PowerRunning, AgentUp: true, Address: res.Addresses[0],
		Tags: []string{"ci", "hf-contract", "hyperfleet", "team-x"}, Description: vm.Description,
	}
	if fmt.Sprintf("%+v", vm) != fmt.Sprintf("%+v", want) {
		t.Errorf("VM\n got %+v\nwant %+v", vm, want)
	}
	if res.MACAddress != "02:00:00:aa:bb:cc" {
		t.Errorf("MAC %q", res.MACAddress)
	}
	if e.p.OpCalls(fake.OpResize) != 1 {
		t.Errorf("%d resize calls, want 1", e.p.OpCalls(fake.OpResize))
	}
}

func TestCloneAnsweredAlreadyExists(t *testing.T) {
	e := newEnv(t, baseConfig(), fake.DefaultOptions(), nil)
	ctx := context.Background()
	s := simpleSpec(1)
	placed, err := e.p.EnsureVM(ctx, s, provider.Progress{})
	if err != nil {
		t.Fatal(err)
	}
	e.p.FailNextOpWith(fake.OpClone, 1, 500, fmt.Sprintf("unable to create VM %d: config file already exists", placed.Progress.VMID))
	res, err := e.p.EnsureVM(ctx, s, placed.Progress)
	if err != nil || res.Phase != provider.PhasePlaced || res.RetryAfter != 0 || res.Progress.Task != nil {
		t.Fatalf("clone answered 'already exists': %v, %+v", err, res)
	}
	if res, err = e.p.EnsureVM(ctx, s, res.Progress); err != nil || res.Phase != provider.PhaseCloning || res.Progress.VMID != placed.Progress.VMID {
		t.Fatalf("the id turned out free: %v, %+v", err, res)
	}
}

func TestLockedVMIsTransient(t *testing.T) {
	e := newEnv(t, baseConfig(), fake.DefaultOptions(), nil)
	s := simpleSpec(1)
	res := step(t, e, s, provider.Progress{}, func(r *provider.EnsureResult) bool {
		return r.Phase == provider.PhaseConfiguring && r.Progress.Task != nil && r.Progress.Task.Operation == "upload"
	})
	e.clock.Step(time.Second)
	e.p.FailNextOpWith(fake.OpUpdateConfig, 1, 500, "VM is locked (backup)")
	_, err := e.p.EnsureVM(context.Background(), s, res.Progress)
	if provider.Classify(err) != provider.ClassTransient || provider.ReasonOf(err) != "Locked" {
		t.Fatalf("config call on a locked VM: %v (class %s, reason %s)", err, provider.Classify(err), provider.ReasonOf(err))
	}
	step(t, e, s, res.Progress, phaseIs(provider.PhaseRunning))
}

// TestOtherMissingIsNotNotFound: a read that fails because a storage (not
// the VM) does not exist is a transient error, never ErrNotFound.
func TestOtherMissingIsNotNotFound(t *testing.T) {
	e := newEnv(t, baseConfig(), fake.DefaultOptions(), nil)
	s := simpleSpec(1)
	res := step(t, e, s, provider.Progress{}, phaseIs(provider.PhaseRunning))
	e.p.FailNextOpWith(fake.OpStatus, 1, 500, "storage 'local-lvm' does not exist")
	_, err := e.p.GetVM(context.Background(), res.Progress.VMRef())
	if err == nil || errors.Is(err, provider.ErrNotFound) || provider.Classify(err) != provider.ClassTransient {
		t.Fatalf("GetVM with a failing status read: %v (class %s), want a transient error that is not ErrNotFound", err, provider.Classify(err))
	}
	if _, err := e.p.GetVM(context.Background(), res.Progress.VMRef()); err != nil {
		t.Fatalf("GetVM once the fault is gone: %v", err)
	}
}

func TestFailedTasks(t *testing.T) {
	o := fake.DefaultOptions()
	e := newEnv(t, baseConfig(), o, nil)
	ctx := context.Background()

	t.Run("clone lock timeout is retried", func(t *testing.T) {
		e.p.ResetCalls()
		e.p.FailNextTasks(fake.OpClone, 1, "clone failed: can't lock file '/var/lock/pve-manager/pve-storage-local-lvm' - got timeout")
		s := simpleSpec(1)
		var retried *provider.EnsureResult
		res := step(t, e, s, provider.Progress{}, func(r *provider.EnsureResult) bool {
			if r.RetryAfter == o.RetryBackoff && strings.Contains(r.Message, "retrying") {
				retried = r
			}
			return r.Phase == provider.PhaseRunning
		})
		if retried == nil || retried.Phase != provider.PhasePlaced || retried.Progress.Task != nil {
			t.Errorf("the failed clone was not reported as a retry: %+v", retried)
		}
		if got := e.p.OpCalls(fake.OpClone); got != 2 {
			t.Errorf("%d clone calls, want 2", got)
		}
		if _, ok := e.p.VM(res.Progress.VMID); !ok {
			t.Error("no VM after the retried clone")
		}
	})

	t.Run("failed start is permanent", func(t *testing.T) {
		e.p.FailNextTasks(fake.OpStart, 1, "start failed: QEMU exited with code 1")
		s := simpleSpec(2)
		starting := step(t, e, s, provider.Progress{}, phaseIs(provider.PhaseStarting))
		e.clock.Step(time.Minute)
		for i := 0; i < 2; i++ { // the same prev gives the same answer
			_, err := e.p.EnsureVM(ctx, s, starting.Progress)
			if !errors.Is(err, provider.ErrTaskFailed) || provider.Classify(err) != provider.ClassPermanent {
				t.Fatalf("call %d after a failed start: %v", i, err)
			}
		}
		if vm, _ := e.p.VM(starting.Progress.VMID); vm.Power != provider.PowerStopped {
			t.Errorf("power %s after a failed start", vm.Power)
		}
	})

	t.Run("failed destroy is retried", func(t *testing.T) {
		s, res := runVM(t, e, e.p, 3)
		e.p.FailNextTasks(fake.OpDestroy, 1, "can't lock file '/var/lock/qemu-server/lock-102.conf' - got timeout")
		prog, retries := res.Progress, 0
		for n := 0; ; n++ {
			d, err := e.p.DeleteVM(ctx, s.Owner, prog)
			if err != nil {
				t.Fatal(err)
			}
			if d.Done {
				break
			}
			if strings.Contains(d.Message, "retrying") {
				retries++
			}
			if n > 50 {
				t.Fatal("DeleteVM not Done")
			}
			prog = d.Progress
			e.clock.Step(d.RetryAfter)
		}
		if retries != 1 || e.p.OpCalls(fake.OpDestroy) != 2 {
			t.Errorf("%d retries, %d destroy calls; want 1 and 2", retries, e.p.OpCalls(fake.OpDestroy))
		}
		if _, ok := e.p.VM(res.Progress.VMID); ok {
			t.Error("the VM survived")
		}
	})
}

func TestPlacementByFreeMemoryMinusReservations(t *testing.T) {
	ctx := context.Background()
	place := func(t *testing.T, p provider.Provider, i int, hint int64) (provider.Progress, error) {
		t.Helper()
		s := simpleSpec(i)
		s.Source = provider.TemplateSource{Name: "debian-13-ci"}
		s.MemoryHint = hint
		res, err := p.EnsureVM(ctx, s, provider.Progress{})
		if err != nil {
			return provider.Progress{}, err
		}
		return res.Progress, nil
	}
	// pve1 has 14 GiB free, pve2 30 GiB.
	e := newEnv(t, sharedConfig(), sharedOptions(), nil)
	steps := []struct {
		hint int64
		want string
	}{
		{20 << 30, "pve2"}, // only pve2 has room
		{12 << 30, "pve1"}, // pve2 has 10 GiB left after the reservation
		{8 << 30, "pve2"},  // pve1 2 GiB, pve2 10 GiB
		{4 << 30, ""},      // nothing left with 4 GiB
	}
	for i, st := range steps {
		prog, err := place(t, e.p, i, st.hint)
		if st.want == "" {
			if !errors.Is(err, provider.ErrNoCapacity) {
				t.Fatalf("step %d: %v, %+v; want ErrNoCapacity", i, err, prog)
			}
			continue
		}
		if err != nil || prog.Node != st.want {
			t.Fatalf("step %d: %v, node %q; want %s", i, err, prog.Node, st.want)
		}
	}
	info, err := e.p.Probe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range info.Nodes {
		want := map[string]int64{"pve1": 12 << 30, "pve2": 28 << 30}[n.Name]
		if n.ReservedMemoryBytes != want || !n.Allowed || !n.Online {
			t.Errorf("node %s: %+v; want %d bytes reserved", n.Name, n, want)
		}
	}

	cfg := sharedConfig()
	cfg.Nodes = []string{"pve1"}
	only1, err := e.p.Connect(cfg, e.deps)
	if err != nil {
		t.Fatal(err)
	}
	if prog, err := place(t, only1, 10, 1<<30); err != nil || prog.Node != "pve1" {
		t.Errorf("with placement restricted to pve1: %v, %+v", err, prog)
	}
	info, _ = only1.Probe(ctx)
	if info.Nodes[1].Allowed {
		t.Error("Probe reports pve2 allowed outside the placement list")
	}
}
