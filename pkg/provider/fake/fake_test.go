package fake_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/fake"
	"github.com/hyperfleet/hyperfleet/pkg/provider/providertest"
)

var start = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// env is one fake cluster with its clock and a provider on it.
type env struct {
	c     *fake.Cluster
	p     *fake.Provider
	clock *clocktesting.FakeClock
	cfg   provider.ClusterConfig
	deps  provider.Deps
}

func newEnv(t testing.TB, opts fake.Options, configure func(*provider.ClusterConfig)) *env {
	t.Helper()
	clk := clocktesting.NewFakeClock(start)
	c, err := fake.NewCluster(clk, opts)
	if err != nil {
		t.Fatalf("NewCluster: %v", err)
	}
	signer, err := ownership.NewSigner("contract", bytes.Repeat([]byte{7}, ownership.MinKeyLength))
	if err != nil {
		t.Fatal(err)
	}
	cfg := provider.ClusterConfig{Name: "fake", VMIDStart: 100, VMIDEnd: 199, Tags: []string{"ci"}}
	if configure != nil {
		configure(&cfg)
	}
	e := &env{c: c, clock: clk, cfg: cfg, deps: provider.Deps{Signer: signer.ForCluster(ownership.ClusterIdentity{Name: cfg.Name})}}
	e.p = e.newProvider(t, nil)
	return e
}

// newProvider connects another provider to the cluster, as after a
// restart; configure edits a copy of the configuration first.
func (e *env) newProvider(t testing.TB, configure func(*provider.ClusterConfig)) *fake.Provider {
	t.Helper()
	cfg := e.cfg
	if configure != nil {
		configure(&cfg)
	}
	p, err := e.c.NewProvider(cfg, e.deps)
	if err != nil {
		t.Fatalf("NewProvider: %v", err)
	}
	return p
}

func (e *env) harness(template provider.TemplateSource) *providertest.Harness {
	c := e.c
	must := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	return &providertest.Harness{
		Provider: e.p,
		NewProvider: func(t *testing.T, configure func(*provider.ClusterConfig)) provider.Provider {
			return e.newProvider(t, configure)
		},
		Signer:   e.deps.Signer,
		Template: template,
		Source: func(r providertest.TemplateRef) provider.TemplateSource {
			return provider.TemplateSource{Settings: fake.TemplateRef{ID: r.Number, Name: r.Name, Storage: r.Storage}}
		},
		Advance:       e.clock.Step,
		GuestPowerOff: func(t *testing.T, id provider.ID) { must(t, c.GuestPowerOff(vmidOf(t, id))) },
		CreateForeignVM: func(t *testing.T, vmid int, description string, tags []string) provider.ID {
			id, err := c.AddForeignVM(fake.ForeignVM{VMID: vmid, Description: description, Tags: tags})
			must(t, err)
			return fake.FormatID(id)
		},
		SetDescription: func(t *testing.T, id provider.ID, description string) {
			must(t, c.SetDescription(vmidOf(t, id), description))
		},
		VMID: vmidOf,
		ID:   fake.FormatID,
		CloudInitOf: func(t *testing.T, id provider.ID) provider.CloudInit {
			vmid := vmidOf(t, id)
			data, ok := c.DeliveredCloudInit(vmid)
			if !ok {
				t.Fatalf("the guest of VM %d never read its cloud-init", vmid)
			}
			return data
		},
		StoredData: func(*testing.T) []string {
			var out []string
			for _, m := range c.Media() {
				out = append(out, string(m.Data.UserData), string(m.Data.MetaData), string(m.Data.NetworkConfig))
			}
			for _, vm := range c.VMs() {
				out = append(out, vm.Description, vm.Name, strings.Join(vm.Tags, ";"))
				out = append(out, vm.SavedState...)
			}
			return out
		},
		FailDestroysOtherMissing: func(*testing.T) func() {
			return c.FailDestroys(errors.New("a disk's storage does not exist"))
		},
		GuestFileOf: func(t *testing.T, id provider.ID, path string) ([]byte, bool) {
			return c.GuestFile(vmidOf(t, id), path)
		},
		RemoveGuestAgent: func(t *testing.T, id provider.ID) { must(t, c.RemoveGuestAgent(vmidOf(t, id))) },
	}
}

// vmidOf is the fake VM id of id; the test fails for an ID the fake did
// not write.
func vmidOf(t *testing.T, id provider.ID) int {
	t.Helper()
	vmid, err := fake.ParseID(id)
	if err != nil || vmid == 0 {
		t.Fatalf("VM %q: %v", id, err)
	}
	return vmid
}

// twoNodes is the default cluster with a second, larger node.
func twoNodes() fake.Options {
	o := fake.DefaultOptions()
	o.Nodes = append(o.Nodes, provider.NodeInfo{Name: "node-2", Online: true, CPUs: 32, MemoryBytes: 128 << 30, MemoryUsedBytes: 4 << 30, StorageBytes: 2 << 40})
	return o
}

// TestContract runs the provider contract suite against the fake, on two
// nodes, with linked clones of a template named by id and full clones of
// one named by name.
func TestContract(t *testing.T) {
	for name, template := range map[string]provider.TemplateSource{"linked clones": {Linked: true, Settings: fake.TemplateRef{ID: 9000}}, "full clones": {Settings: fake.TemplateRef{Name: "ci-template"}}} {
		t.Run(name, func(t *testing.T) {
			providertest.Run(t, func(t testing.TB) *providertest.Harness {
				return newEnv(t, twoNodes(), nil).harness(template)
			})
		})
	}
}

// Feature: hyperfleet-operator, Property 24: Provider Interface Implementation
//
// TestContractProperty runs the contract's state-machine property
// (providertest.Property) against the fake on two nodes.
func TestContractProperty(t *testing.T) {
	providertest.Property(t, func(t testing.TB) *providertest.Harness {
		return newEnv(t, twoNodes(), nil).harness(provider.TemplateSource{Linked: true, Settings: fake.TemplateRef{ID: 9000}})
	})
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
	case m.kind == "done-before-media" && err == nil && res.Progress.Task != nil && res.Progress.Task.Operation == "destroy":
		res.Progress.Task, res.Done = nil, true
	case m.kind == "gone-on-any-missing" && err != nil && strings.Contains(err.Error(), "does not exist"):
		// Any "does not exist" taken for the VM's absence (docs/security.md,
		// "Absence and release").
		return &provider.DeleteResult{Progress: provider.Progress{ID: prev.ID, Node: prev.Node}, Done: true}, nil
	}
	return res, err
}

func (m mutant) RemoveCloudInitMedia(ctx context.Context, o provider.Owner, prev provider.Progress) (*provider.DeleteResult, error) {
	if m.kind == "keeps-cloud-init-media" {
		return &provider.DeleteResult{Progress: provider.Progress{ID: prev.ID, Node: prev.Node}, Done: true}, nil
	}
	return m.Provider.RemoveCloudInitMedia(ctx, o, prev)
}

func (m mutant) PlaceGuestFile(ctx context.Context, o provider.Owner, ref provider.VMRef, f provider.GuestFile) error {
	err := m.Provider.PlaceGuestFile(ctx, o, ref, f)
	if m.kind == "guest-file-ignores-ownership" && errors.Is(err, provider.ErrNotOwned) {
		return nil
	}
	return err
}

func (m mutant) DisownVM(ctx context.Context, o provider.Owner, ref provider.VMRef) (*provider.DisownResult, error) {
	if m.kind == "disown-leaves-marks" {
		return &provider.DisownResult{Done: true, Removed: []string{"the ownership block"}, Message: "released"}, nil
	}
	res, err := m.Provider.DisownVM(ctx, o, ref)
	switch {
	case m.kind == "disown-ignores-ownership" && errors.Is(err, provider.ErrNotOwned):
		return &provider.DisownResult{Done: true, Removed: []string{"the ownership block"}, Message: "released"}, nil
	case m.kind == "disown-not-idempotent" && err == nil && res.Done && len(res.Removed) == 0:
		return nil, fmt.Errorf("VM %s: %w", ref.ID, provider.ErrNotOwned)
	}
	return res, err
}

func TestMutantContract(t *testing.T) {
	kind := os.Getenv("HF_FAKE_MUTANT")
	if kind == "" {
		t.Skip("run by TestSuiteCatchesMutants")
	}
	providertest.Run(t, func(t testing.TB) *providertest.Harness {
		h := newEnv(t, fake.DefaultOptions(), nil).harness(provider.TemplateSource{Linked: true, Settings: fake.TemplateRef{ID: 9000}})
		h.Provider = mutant{Provider: h.Provider.(*fake.Provider), kind: kind}
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
		{"done-before-media", "DeleteVM", "--- FAIL: TestMutantContract/DeleteVM/while_booting"},
		{"gone-on-any-missing", "DeleteVM/OtherMissingIsNotGone", "--- FAIL: TestMutantContract/DeleteVM/OtherMissingIsNotGone"},
		{"keeps-cloud-init-media", "RemoveCloudInitMedia", "--- FAIL: TestMutantContract/RemoveCloudInitMedia/while_booting"},
		{"guest-file-ignores-ownership", "PlaceGuestFile/NotOwned", "--- FAIL: TestMutantContract/PlaceGuestFile/NotOwned"},
		{"disown-ignores-ownership", "NotOwned", "--- FAIL: TestMutantContract/NotOwned/foreign_VM_without_a_marker"},
		{"disown-leaves-marks", "DisownVM", "--- FAIL: TestMutantContract/DisownVM/running"},
		{"disown-not-idempotent", "DisownVM", "--- FAIL: TestMutantContract/DisownVM/running"},
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
				t.Errorf("the suite failed, but not in %q:\n%s", c.kind, out)
			}
		})
	}
}

func spec(i int) *provider.VMSpec {
	return &provider.VMSpec{
		Owner: provider.Owner{Namespace: "ci", Name: fmt.Sprintf("c%d", i), UID: fmt.Sprintf("u%d", i), CreatedAt: start},
		Name:  fmt.Sprintf("r%d", i), Source: provider.TemplateSource{Linked: true, Settings: fake.TemplateRef{ID: 9000}},
	}
}

// TestPlacement: a VM goes to the allowed node with the most free memory,
// counting reservations; none with room is ErrNoCapacity.
func TestPlacement(t *testing.T) {
	e := newEnv(t, twoNodes(), nil) // node-1 has 62 GiB free, node-2 124 GiB
	place := func(p provider.Provider, i int, hint int64) (provider.Progress, error) {
		s := spec(i)
		s.MemoryHint = hint
		res, err := p.EnsureVM(t.Context(), s, provider.Progress{})
		if err != nil {
			return provider.Progress{}, err
		}
		return res.Progress, nil
	}
	for i, st := range []struct {
		hint int64
		want string
	}{
		{100 << 30, "node-2"}, // only node-2 has room
		{40 << 30, "node-1"},  // node-2 has 24 GiB left
		{20 << 30, "node-2"},  // node-1 22 GiB, node-2 24 GiB
		{23 << 30, ""},        // node-1 22 GiB, node-2 4 GiB
	} {
		prog, err := place(e.p, i, st.hint)
		if st.want == "" {
			if !errors.Is(err, provider.ErrNoCapacity) || provider.Classify(err) != provider.ClassResource {
				t.Fatalf("step %d: %v, %+v; want ErrNoCapacity of class Resource", i, err, prog)
			}
			continue
		}
		if err != nil || prog.Node != st.want {
			t.Fatalf("step %d: %v, node %q; want %s", i, err, prog.Node, st.want)
		}
	}
	only1 := e.newProvider(t, func(c *provider.ClusterConfig) { c.Nodes = []string{"node-1"} })
	if prog, err := place(only1, 10, 100<<30); !errors.Is(err, provider.ErrNoCapacity) {
		t.Errorf("placement restricted to node-1 of a VM only node-2 has room for: %v, %+v", err, prog)
	}
	info, err := only1.Probe(t.Context())
	if err != nil || len(info.Nodes) != 2 || !info.Nodes[0].Allowed || info.Nodes[1].Allowed {
		t.Errorf("Probe with placement restricted to node-1: %v, %+v", err, info)
	}
}

// TestClonesPerStorage: the storage limit queues clones to one storage
// even when the node limit would let them run.
func TestClonesPerStorage(t *testing.T) {
	e := newEnv(t, fake.DefaultOptions(), func(c *provider.ClusterConfig) { c.ClonesPerStorage = 1 })
	var phases []provider.Phase
	for i := range 2 {
		placed, err := e.p.EnsureVM(t.Context(), spec(i), provider.Progress{})
		if err != nil {
			t.Fatal(err)
		}
		res, err := e.p.EnsureVM(t.Context(), spec(i), placed.Progress)
		if err != nil {
			t.Fatal(err)
		}
		phases = append(phases, res.Phase)
	}
	if want := []provider.Phase{provider.PhaseCloning, provider.PhaseQueued}; fmt.Sprint(phases) != fmt.Sprint(want) {
		t.Errorf("phases %v, want %v", phases, want)
	}
}

func TestControlsRefuse(t *testing.T) {
	e := newEnv(t, fake.DefaultOptions(), nil)
	id, err := e.c.AddForeignVM(fake.ForeignVM{Name: "by-hand"})
	if err != nil {
		t.Fatal(err)
	}
	for what, err := range map[string]error{
		"AddForeignVM at a taken id":    func() error { _, err := e.c.AddForeignVM(fake.ForeignVM{VMID: id}); return err }(),
		"AddForeignVM at a template":    func() error { _, err := e.c.AddForeignVM(fake.ForeignVM{VMID: 9000}); return err }(),
		"GuestPowerOff of a stopped":    e.c.GuestPowerOff(id),
		"SetDescription of a missing":   e.c.SetDescription(999, "x"),
		"RemoveVM of a missing":         e.c.RemoveVM(999),
		"RemoveGuestAgent of a missing": e.c.RemoveGuestAgent(999),
	} {
		if err == nil {
			t.Errorf("%s succeeded", what)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	if _, err := fake.NewCluster(nil, fake.Options{}); err == nil {
		t.Error("NewCluster without nodes succeeded")
	}
	o := fake.DefaultOptions()
	o.Templates[0].Node = "elsewhere"
	if _, err := fake.NewCluster(nil, o); err == nil {
		t.Error("NewCluster with a template on an unknown node succeeded")
	}
	e := newEnv(t, fake.DefaultOptions(), nil)
	reversed := e.cfg
	reversed.VMIDStart, reversed.VMIDEnd = 200, 150
	if _, err := e.c.NewProvider(e.cfg, provider.Deps{}); err == nil {
		t.Error("NewProvider without a signer succeeded")
	}
	if _, err := e.c.NewProvider(reversed, e.deps); provider.Classify(err) != provider.ClassConfiguration {
		t.Errorf("NewProvider with a reversed VM id range: %v, want a configuration error", err)
	}
}
