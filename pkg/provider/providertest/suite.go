package providertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Run runs the contract suite; newHarness is called once per subtest.
func Run(t *testing.T, newHarness func(t testing.TB) *Harness) {
	cases := []struct {
		name string
		fn   func(t *testing.T, h *Harness)
	}{
		{"Probe", testProbe},
		{"ValidateTemplate", testValidateTemplate},
		{"ValidateTemplate/TPM", testTPMTemplate},
		{"EnsureVM/DrivesToRunning", testDrivesToRunning},
		{"EnsureVM/CloudInitDelivered", testCloudInitDelivered},
		{"EnsureVM/CloudInitRenderedOnlyForDelivery", testCloudInitRenderedLate},
		{"EnsureVM/NativeCloudInit", testNativeCloudInit},
		{"EnsureVM/AddedTPM", testAddedTPM},
		{"EnsureVM/RepeatedCallsAreIdempotent", testRepeatedCalls},
		{"EnsureVM/RestartContinuesFromProgress", testRestart},
		{"EnsureVM/VMIDReservedBeforeRestartIsReused", testVMIDReuseAfterRestart},
		{"EnsureVM/TakenVMIDIsPlacedAgain", testTakenVMID},
		{"EnsureVM/ConcurrentOwners", testConcurrentOwners},
		{"EnsureVM/CloneSlotsPerNode", testCloneSlots},
		{"EnsureVM/GuestPowerOffIsStopped", testGuestPowerOff},
		{"EnsureVM/VMIDRangeExhausted", testRangeExhausted},
		{"EnsureVM/UnconfiguredCloneIsFindable", testUnconfiguredCloneFindable},
		{"CloudInitMedia/StrayListedAndDeleted", testStrayMedia},
		{"GetVM", testGetVM},
		{"CheckRef", testCheckRef},
		{"ListVMs", testListVMs},
		{"SetPower", testSetPower},
		{"SetPower/SuspendToDiskAndResume", testSuspendResume},
		{"SetPower/SuspendRefused", testSuspendRefused},
		{"DeleteVM", testDeleteVM},
		{"DeleteVM/OtherMissingIsNotGone", testDeleteOtherMissing},
		{"RemoveCloudInitMedia", testRemoveCloudInitMedia},
		{"DisownVM", testDisownVM},
		{"NotOwned", testNotOwned},
		{"NotOwned/MarkerCopiedBetweenOwnedVMs", testCopiedMarker},
		{"PlaceGuestFile/WrittenIntoRunningGuest", testGuestFileWritten},
		{"PlaceGuestFile/GuestNotReady", testGuestFileNotReady},
		{"PlaceGuestFile/NoGuestAgent", testGuestFileNoAgent},
		{"PlaceGuestFile/NotOwned", testGuestFileNotOwned},
		{"PlaceGuestFile/RefusedFiles", testGuestFileRefused},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			checkHarness(t, h)
			c.fn(t, h)
		})
	}
}

func checkHarness(t *testing.T, h *Harness) {
	t.Helper()
	if h == nil || h.Provider == nil || h.NewProvider == nil || h.Signer == nil || h.Advance == nil || h.GuestPowerOff == nil ||
		h.CreateForeignVM == nil || h.SetDescription == nil || h.CloudInitOf == nil || h.StoredData == nil ||
		h.FailDestroysOtherMissing == nil || h.GuestFileOf == nil || h.RemoveGuestAgent == nil || h.VMID == nil || h.ID == nil || h.Source == nil {
		t.Fatal("the harness leaves a required field unset")
	}
	if h.Template.Settings == nil {
		t.Fatal("the harness names no template")
	}
}

// linked is src with Linked set to l.
func linked(src provider.TemplateSource, l bool) provider.TemplateSource {
	src.Linked = l
	return src
}

func testProbe(t *testing.T, h *Harness) {
	info, err := h.Provider.Probe(t.Context())
	if err != nil {
		t.Fatalf("Probe: %v", err)
	}
	if info.Version == "" {
		t.Error("Probe reports no version")
	}
	if len(info.Nodes) == 0 {
		t.Fatal("Probe reports no nodes")
	}
	names := map[string]bool{}
	usable := false
	for _, n := range info.Nodes {
		if n.Name == "" || names[n.Name] {
			t.Errorf("node name %q is empty or repeated", n.Name)
		}
		names[n.Name] = true
		if !n.Online {
			continue
		}
		if n.CPUs <= 0 || n.MemoryBytes <= 0 || n.MemoryUsedBytes < 0 || n.MemoryUsedBytes > n.MemoryBytes {
			t.Errorf("online node %s: implausible capacity %+v", n.Name, n)
		}
		usable = usable || n.Allowed
	}
	if !usable {
		t.Error("no node is both online and allowed")
	}

	// Placement reserves memory on the chosen node until the VM no
	// longer needs the reservation.
	s := spec(h.Template, 1)
	d := newDrive(t, h, h.Provider, s)
	placed := d.toPhase(provider.PhasePlaced)
	if got := reserved(t, h.Provider, placed.Progress.Node); got < s.MemoryHint {
		t.Errorf("node %s reserves %d bytes after placing a VM with MemoryHint %d", placed.Progress.Node, got, s.MemoryHint)
	}
	deleteUntilDone(t, h, h.Provider, s.Owner, d.prog)
	if got := reserved(t, h.Provider, placed.Progress.Node); got != 0 {
		t.Errorf("node %s still reserves %d bytes after the placement was deleted", placed.Progress.Node, got)
	}
}

func reserved(t *testing.T, p provider.Provider, node string) int64 {
	t.Helper()
	info, err := p.Probe(t.Context())
	if err != nil {
		t.Fatalf("Probe: %v", err)
	}
	for _, n := range info.Nodes {
		if n.Name == node {
			return n.ReservedMemoryBytes
		}
	}
	t.Fatalf("Probe does not list node %s", node)
	return 0
}

func testValidateTemplate(t *testing.T, h *Harness) {
	info, err := h.Provider.ValidateTemplate(t.Context(), h.Template)
	if err != nil {
		t.Fatalf("ValidateTemplate(%+v): %v", h.Template, err)
	}
	if info.ID == 0 || info.Name == "" || info.Node == "" || info.DiskBytes <= 0 || len(info.Storages) == 0 {
		t.Errorf("ValidateTemplate: incomplete info %+v", *info)
	}
	if !info.GuestFiles {
		t.Errorf("ValidateTemplate: GuestFiles false for the suite's template, whose clones take guest files")
	}
	if h.Template.Linked && !info.LinkedCloneSupported {
		t.Errorf("ValidateTemplate accepted a linked clone but reports LinkedCloneSupported false")
	}
	missing := 0
	for id := range usedIDs(t, h, h.Provider) {
		missing = max(missing, id)
	}
	missing += 1000

	cases := []struct {
		name      string
		src       provider.TemplateSource
		wantID    int
		wantErr   error
		wantClass provider.Class
	}{
		{name: "by id", src: linked(h.Source(TemplateRef{Number: info.ID}), h.Template.Linked), wantID: info.ID},
		{name: "by name", src: linked(h.Source(TemplateRef{Name: info.Name}), h.Template.Linked), wantID: info.ID},
		{name: "missing id", src: h.Source(TemplateRef{Number: missing}), wantErr: provider.ErrNotFound, wantClass: provider.ClassConfiguration},
		{name: "missing name", src: h.Source(TemplateRef{Name: "hf-contract-no-such-template"}), wantErr: provider.ErrNotFound, wantClass: provider.ClassConfiguration},
		{name: "missing full-clone storage", src: h.Source(TemplateRef{Number: info.ID, Storage: "hfcontractnostorage"}), wantClass: provider.ClassConfiguration},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := h.Provider.ValidateTemplate(t.Context(), c.src)
			if c.wantClass == "" {
				if err != nil {
					t.Fatalf("ValidateTemplate(%+v): %v", c.src, err)
				}
				if got.ID != c.wantID {
					t.Errorf("ValidateTemplate(%+v): id %d, want %d", c.src, got.ID, c.wantID)
				}
				return
			}
			if err == nil {
				t.Fatalf("ValidateTemplate(%+v) accepted it: %+v", c.src, *got)
			}
			if c.wantErr != nil && !errors.Is(err, c.wantErr) {
				t.Errorf("ValidateTemplate(%+v): %v, want %v", c.src, err, c.wantErr)
			}
			if cl := provider.Classify(err); cl != c.wantClass {
				t.Errorf("ValidateTemplate(%+v): class %s, want %s (%v)", c.src, cl, c.wantClass, err)
			}
		})
	}
}

func testDrivesToRunning(t *testing.T, h *Harness) {
	s := spec(h.Template, 1)
	d := newDrive(t, h, h.Provider, s)
	res := d.toPhase(provider.PhaseRunning)

	if first := d.results[0]; first.Phase != provider.PhasePlaced {
		t.Errorf("first call: phase %s, want %s", first.Phase, provider.PhasePlaced)
	}
	for i := 1; i < len(d.results); i++ {
		prev, cur := d.results[i-1], d.results[i]
		if phaseOrder[cur.Phase] < phaseOrder[prev.Phase] {
			t.Errorf("phase went back from %s to %s at call %d", prev.Phase, cur.Phase, i+1)
		}
		if cur.Progress.ID != prev.Progress.ID {
			t.Errorf("VM id changed from %v to %v at call %v with nobody else around", prev.Progress.ID, cur.Progress.ID, i+1)
		}
	}
	vm, err := h.Provider.GetVM(t.Context(), res.Progress.VMRef())
	if err != nil {
		t.Fatalf("GetVM of the running VM: %v", err)
	}
	if vm.Power != provider.PowerRunning {
		t.Errorf("GetVM: power %s, want %s", vm.Power, provider.PowerRunning)
	}
	if vm.Name != s.Name {
		t.Errorf("GetVM: name %q, want %q", vm.Name, s.Name)
	}

	// Once Running, further calls change nothing.
	for i := 0; i < 3; i++ {
		d.advance(max(res.RetryAfter, time.Second))
		again := d.step()
		if again.Phase != provider.PhaseRunning || again.Progress.ID != res.Progress.ID || again.Progress.Task != nil {
			t.Fatalf("EnsureVM on a running VM: %s", describe(again))
		}
	}
	expectOneVM(t, h, h.Provider, s.Owner, res.Progress.ID)
}

func testCloudInitDelivered(t *testing.T, h *Harness) {
	s := spec(h.Template, 1)
	d := newDrive(t, h, h.Provider, s)
	stored := false
	d.onStep = func(r *provider.EnsureResult) {
		if !stored && r.Phase != provider.PhaseRunning {
			stored = storedContains(t, h, token(1))
		}
	}
	res := d.toPhase(provider.PhaseRunning)
	if !stored {
		t.Error("the cloud-init payload was never seen on the backend while the VM was built; StoredData cannot detect leaks")
	}
	got := h.CloudInitOf(t, res.Progress.ID)
	want, err := s.CloudInit.Render(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		name      string
		got, want []byte
	}{
		{"user-data", got.UserData, want.UserData},
		{"meta-data", got.MetaData, want.MetaData},
		{"network-config", got.NetworkConfig, want.NetworkConfig},
	} {
		if !bytes.Equal(f.got, f.want) {
			t.Errorf("the guest read %s %q, want %q", f.name, f.got, f.want)
		}
	}
	if storedContains(t, h, token(1)) {
		t.Error("the cloud-init payload is still stored on the backend after the VM is Running")
	}
}

// countingCloudInit counts renders and can fail them.
type countingCloudInit struct {
	data provider.CloudInit
	mu   sync.Mutex
	n    int
	err  error
}

func (c *countingCloudInit) Render(context.Context) (provider.CloudInit, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	if c.err != nil {
		return provider.CloudInit{}, c.err
	}
	return c.data, nil
}

func (c *countingCloudInit) renders() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// testCloudInitRenderedLate: the cloud-init (which carries a single-use
// credential) is rendered once the clone exists, once per delivery, and a
// render error comes back unchanged and leaves nothing on storage.
func testCloudInitRenderedLate(t *testing.T, h *Harness) {
	s := spec(h.Template, 1)
	src := &countingCloudInit{data: s.CloudInit.(provider.CloudInit), err: errRenderContract}
	s.CloudInit = src
	d := newDrive(t, h, h.Provider, s)
	var failed error
	for range maxSteps {
		res, err := h.Provider.EnsureVM(t.Context(), s, d.prog)
		if err != nil {
			failed = err
			break
		}
		switch res.Phase {
		case provider.PhasePlaced, provider.PhaseQueued, provider.PhaseCloning:
			if n := src.renders(); n != 0 {
				t.Fatalf("the cloud-init was rendered %d times before the clone finished (phase %s)", n, res.Phase)
			}
		}
		d.prog = persist(t, res.Progress)
		d.advance(res.RetryAfter)
	}
	if !errors.Is(failed, errRenderContract) {
		t.Fatalf("a failing render gave %v, want an error wrapping the source's", failed)
	}
	if storedContains(t, h, token(1)) {
		t.Fatal("a failed render left cloud-init data on storage")
	}
	src.mu.Lock()
	src.err, src.n = nil, 0
	src.mu.Unlock()
	d.toPhase(provider.PhaseRunning)
	if n := src.renders(); n != 1 {
		t.Errorf("the cloud-init was rendered %d times for one delivery, want 1", n)
	}
}

var errRenderContract = errors.New("contract: render refused")

// testNativeCloudInit: a spec with Native is delivered by the hypervisor's
// own cloud-init. The provider never renders the spec's CloudInit and
// keeps no medium of its own (ListCloudInitMedia shows none for the VM,
// RemoveCloudInitMedia is Done at once and leaves the VM as it is); the VM
// runs, takes guest files, and after a restart and its guest's power-off
// is Stopped, never started again.
func testNativeCloudInit(t *testing.T, h *Harness) {
	s := spec(h.Template, 1)
	src := &countingCloudInit{data: s.CloudInit.(provider.CloudInit)}
	s.CloudInit = src
	s.Native = &provider.NativeCloudInit{IPv4: "dhcp", Nameservers: []string{"192.0.2.53"}, SearchDomains: []string{"ci.example.com"}}
	d := newDrive(t, h, h.Provider, s)
	d.onStep = func(*provider.EnsureResult) {
		if storedContains(t, h, token(1)) {
			t.Fatal("the spec's cloud-init payload is on the backend, though the spec asks for native delivery")
		}
	}
	res := d.toPhase(provider.PhaseRunning)
	if n := src.renders(); n != 0 {
		t.Errorf("the spec's CloudInit was rendered %d times under native delivery, want none", n)
	}
	if len(res.Addresses) == 0 {
		t.Errorf("Running without an address: %+v", res)
	}
	media, err := h.Provider.ListCloudInitMedia(t.Context())
	if err != nil {
		t.Fatalf("ListCloudInitMedia: %v", err)
	}
	for _, m := range media {
		if m.VM == res.Progress.ID {
			t.Errorf("a cloud-init medium %s is listed for VM %s under native delivery", m.ID, m.VM)
		}
	}
	ref := provider.VMRef{ID: res.Progress.ID, Node: res.Progress.Node}
	file := provider.GuestFile{Path: guestPath, Content: guestSecret(1, 1)}
	if err := h.Provider.PlaceGuestFile(t.Context(), s.Owner, ref, file); err != nil {
		t.Fatalf("PlaceGuestFile: %v", err)
	}
	if got, ok := h.GuestFileOf(t, res.Progress.ID, file.Path); !ok || !bytes.Equal(got, file.Content) {
		t.Errorf("the guest holds %q (%v), want %q", got, ok, file.Content)
	}
	removed := removeMediaUntilDone(t, h, s.Owner, persist(t, res.Progress))
	if vm, err := h.Provider.GetVM(t.Context(), ref); err != nil || vm.Owner == nil || vm.Power != provider.PowerRunning {
		t.Fatalf("VM after RemoveCloudInitMedia: %+v, %v; want it running and owned", vm, err)
	}
	restarted := h.NewProvider(t, nil)
	if again, err := restarted.EnsureVM(t.Context(), s, persist(t, removed.Progress)); err != nil || again.Phase != provider.PhaseRunning {
		t.Fatalf("EnsureVM after a restart: %+v, %v; want Running", again, err)
	}
	h.GuestPowerOff(t, res.Progress.ID)
	d2 := newDrive(t, h, restarted, s)
	d2.prog = persist(t, res.Progress)
	d2.prog.Task = nil
	d2.toPhase(provider.PhaseStopped)
	d2.advance(time.Minute)
	if again := d2.step(); again.Phase != provider.PhaseStopped {
		t.Errorf("EnsureVM after Stopped: %s", describe(again))
	}
	if vm, err := restarted.GetVM(t.Context(), ref); err != nil || vm.Power != provider.PowerStopped {
		t.Fatalf("VM after its power-off: %+v, %v; want it stopped, never started again", vm, err)
	}
}

func testRepeatedCalls(t *testing.T, h *Harness) {
	s := spec(h.Template, 1)
	d := newDrive(t, h, h.Provider, s)
	d.repeat = true
	res := d.toPhase(provider.PhaseRunning)
	expectOneVM(t, h, h.Provider, s.Owner, res.Progress.ID)
}

func testRestart(t *testing.T, h *Harness) {
	cases := []struct {
		name string
		at   func(*provider.EnsureResult) bool
		// loseTask drops Progress.Task, as when the operator died after
		// the hypervisor accepted an operation but before the task id
		// was persisted.
		loseTask bool
		// vmExists says the VM existed when the operator died, so the new
		// instance must continue with it, not place it again.
		vmExists bool
	}{
		{name: "after placement", at: func(r *provider.EnsureResult) bool { return r.Phase == provider.PhasePlaced }},
		{name: "while cloning", at: atPhaseInFlight(provider.PhaseCloning), vmExists: true},
		{name: "while cloning, task lost", at: atPhaseInFlight(provider.PhaseCloning), loseTask: true, vmExists: true},
		{name: "while configuring, task lost", at: atPhaseInFlight(provider.PhaseConfiguring), loseTask: true, vmExists: true},
		{name: "while starting, task lost", at: atPhaseInFlight(provider.PhaseStarting), loseTask: true, vmExists: true},
		{name: "while booting", at: func(r *provider.EnsureResult) bool { return r.Phase == provider.PhaseBooting }, vmExists: true},
		{name: "while booting, task lost", at: func(r *provider.EnsureResult) bool { return r.Phase == provider.PhaseBooting }, loseTask: true, vmExists: true},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := spec(h.Template, 10+i)
			before := newDrive(t, h, h.Provider, s)
			at, ok := before.untilOrRunning(c.at)
			if !ok {
				t.Skipf("the implementation went to Running without reporting this state (%s)", describe(at))
			}
			prog := before.prog
			if c.loseTask {
				prog.Task = nil
			}
			after := newDrive(t, h, h.NewProvider(t, nil), s)
			after.prog = prog
			res := after.toPhase(provider.PhaseRunning)
			if c.vmExists && res.Progress.ID != at.Progress.ID {
				t.Errorf("the restarted provider moved the VM from id %v to %v", at.Progress.ID, res.Progress.ID)
			}
			expectOneVM(t, h, h.Provider, s.Owner, res.Progress.ID)
		})
	}
}

// testVMIDReuseAfterRestart: an id reserved before a restart is not known
// to the new instance, which may reserve it again for another owner.
// Whoever clones first keeps it; the other must end up elsewhere.
func testVMIDReuseAfterRestart(t *testing.T, h *Harness) {
	// The rows share one backend, so each uses its own owners.
	for row, earlierFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("earlier owner first %v", earlierFirst), func(t *testing.T) {
			a := newDrive(t, h, h.Provider, spec(h.Template, 50+2*row))
			a.toPhase(provider.PhasePlaced)
			p2 := h.NewProvider(t, nil)
			a.p = p2 // the first instance is gone
			b := newDrive(t, h, p2, spec(h.Template, 51+2*row))
			b.toPhase(provider.PhasePlaced)
			if a.prog.ID == b.prog.ID {
				t.Logf("both owners hold VM id %s", a.prog.ID)
			}
			first, second := a, b
			if !earlierFirst {
				first, second = b, a
			}
			r1 := first.toPhase(provider.PhaseRunning)
			r2 := second.toPhase(provider.PhaseRunning)
			if r1.Progress.ID == r2.Progress.ID {
				t.Fatalf("both owners run on VM %v", r1.Progress.ID)
			}
			expectOneVM(t, h, p2, first.spec.Owner, r1.Progress.ID)
			expectOneVM(t, h, p2, second.spec.Owner, r2.Progress.ID)
		})
	}
}

func testTakenVMID(t *testing.T, h *Harness) {
	s := spec(h.Template, 1)
	d := newDrive(t, h, h.Provider, s)
	placed := d.toPhase(provider.PhasePlaced)
	taken := placed.Progress.ID
	const desc = "made by hand at the id HyperFleet had reserved"
	if got := h.CreateForeignVM(t, h.VMID(t, taken), desc, nil); got != taken {
		t.Fatalf("CreateForeignVM made VM %v, asked for %v", got, taken)
	}
	res := d.toPhase(provider.PhaseRunning)
	if res.Progress.ID == taken {
		t.Fatalf("EnsureVM runs on VM %v, which someone else made", taken)
	}
	vm, err := h.Provider.GetVM(t.Context(), provider.VMRef{ID: taken})
	if err != nil {
		t.Fatalf("the foreign VM %v is gone: %v", taken, err)
	}
	if vm.Owner != nil {
		t.Errorf("the foreign VM %v now verifies for %+v", taken, *vm.Owner)
	}
	expectOneVM(t, h, h.Provider, s.Owner, res.Progress.ID)
}

func testConcurrentOwners(t *testing.T, h *Harness) {
	for _, instances := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d provider instances", instances), func(t *testing.T) {
			providers := []provider.Provider{h.Provider}
			if instances == 2 {
				// Two instances at once, as during a leader handover.
				providers = append(providers, h.NewProvider(t, nil))
			}
			const n = 4
			drives := make([]*drive, n)
			for i := range drives {
				// The rows share one backend, so each uses its own owners.
				drives[i] = newDrive(t, h, providers[i%len(providers)], spec(h.Template, 10*instances+i))
			}
			done := make([]bool, n)
			transient := make([]int, n)
			for round := 0; ; round++ {
				if round > maxSteps {
					t.Fatalf("not all VMs Running after %d rounds", maxSteps)
				}
				results := make([]*provider.EnsureResult, n)
				errs := make([]error, n)
				var wg sync.WaitGroup
				for i, d := range drives {
					if done[i] {
						continue
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						results[i], errs[i] = d.p.EnsureVM(t.Context(), d.spec, d.prog)
					}()
				}
				wg.Wait()
				wait := time.Duration(0)
				for i, d := range drives {
					if done[i] {
						continue
					}
					if errs[i] != nil {
						if provider.Classify(errs[i]) != provider.ClassTransient || transient[i] >= maxTransient {
							t.Fatalf("EnsureVM(%s): %v", d.spec.Name, errs[i])
						}
						transient[i]++
						wait = max(wait, time.Second)
						continue
					}
					transient[i] = 0
					checkResult(t, d.spec, results[i])
					d.prog = persist(t, results[i].Progress)
					done[i] = results[i].Phase == provider.PhaseRunning
					wait = max(wait, results[i].RetryAfter)
				}
				if round == 0 && instances == 1 {
					ids := map[provider.ID]bool{}
					for _, d := range drives {
						if ids[d.prog.ID] {
							t.Errorf("one instance placed two owners on VM id %v", d.prog.ID)
						}
						ids[d.prog.ID] = true
					}
				}
				if !slices.Contains(done, false) {
					break
				}
				h.Advance(wait)
			}
			ids := map[provider.ID]string{}
			for _, d := range drives {
				if other, dup := ids[d.prog.ID]; dup {
					t.Fatalf("%s and %s both run on VM %v", other, d.spec.Name, d.prog.ID)
				}
				ids[d.prog.ID] = d.spec.Name
			}
			for _, d := range drives {
				expectOneVM(t, h, h.Provider, d.spec.Owner, d.prog.ID)
			}
		})
	}
}

func testCloneSlots(t *testing.T, h *Harness) {
	info, err := h.Provider.ValidateTemplate(t.Context(), h.Template)
	if err != nil {
		t.Fatalf("ValidateTemplate: %v", err)
	}
	p := h.NewProvider(t, func(c *provider.ClusterConfig) {
		c.ClonesPerNode, c.ClonesPerStorage, c.Nodes = 1, 0, []string{info.Node}
	})
	const n = 3
	drives := make([]*drive, n)
	for i := range drives {
		drives[i] = newDrive(t, h, p, spec(h.Template, 30+i))
	}
	queued, late := false, (*drive)(nil)
	for round := 0; ; round++ {
		if round > maxSteps {
			t.Fatalf("not all VMs Running after %d rounds", maxSteps)
		}
		cloning, running := 0, 0
		wait := time.Duration(0)
		for _, d := range drives {
			if d.last != nil && d.last.Phase == provider.PhaseRunning {
				running++
				continue
			}
			r := d.step()
			switch r.Phase {
			case provider.PhaseQueued:
				queued = true
			case provider.PhaseCloning:
				cloning++
			case provider.PhaseRunning:
				running++
			}
			wait = max(wait, r.RetryAfter)
		}
		if cloning > 1 {
			t.Fatalf("round %d: %d VMs report Cloning on node %s with ClonesPerNode 1", round, cloning, info.Node)
		}
		if cloning == 1 && late == nil {
			// A VM placed while the node's one clone slot is taken says
			// at its placement that its clone would wait, with the
			// message its queued clone then reports, as a wait for a slot
			// (EnsureResult.Waits: the caller records its reservation
			// with it, and shows the wait as a step of the build).
			late = newDrive(t, h, p, spec(h.Template, 30+n))
			placed := late.step()
			if placed.Phase != provider.PhasePlaced || placed.Waits == "" {
				t.Fatalf("placed while a clone runs on node %s with ClonesPerNode 1: phase %s, Waits %q; want Placed with the reason its clone would wait", info.Node, placed.Phase, placed.Waits)
			}
			if next := late.step(); next.Phase != provider.PhaseQueued || next.Message != placed.Waits || next.Waits != next.Message {
				t.Errorf("the clone after a placement that said it would wait (%q): phase %s, message %q, Waits %q; want Queued with the same message, in Waits too", placed.Waits, next.Phase, next.Message, next.Waits)
			}
			drives = append(drives, late)
		}
		if running == len(drives) {
			break
		}
		h.Advance(wait)
	}
	if !queued {
		t.Error("no VM ever waited in PhaseQueued for a clone slot")
	}
	for _, d := range drives[:1] {
		if first := d.results[0]; first.Phase != provider.PhasePlaced || first.Waits != "" {
			t.Errorf("the first VM placed, no clone in flight: phase %s, Waits %q; want Placed with no wait", first.Phase, first.Waits)
		}
	}
}

func testGuestPowerOff(t *testing.T, h *Harness) {
	s := spec(h.Template, 1)
	d := newDrive(t, h, h.Provider, s)
	running := d.toPhase(provider.PhaseRunning)
	h.GuestPowerOff(t, running.Progress.ID)
	res := d.until("after the guest powered off", func(r *provider.EnsureResult) bool { return r.Phase == provider.PhaseStopped })
	if res.Progress.ID != running.Progress.ID || res.Progress.Task != nil {
		t.Errorf("Stopped: %s", describe(res))
	}
	// Stopped is final: EnsureVM does not start the VM again.
	d.advance(time.Minute)
	if again := d.step(); again.Phase != provider.PhaseStopped {
		t.Errorf("EnsureVM after Stopped: %s", describe(again))
	}
	d.advance(time.Minute)
	vm, err := h.Provider.GetVM(t.Context(), res.Progress.VMRef())
	if err != nil {
		t.Fatalf("GetVM: %v", err)
	}
	if vm.Power != provider.PowerStopped {
		t.Errorf("power %s after the guest powered off, want %s", vm.Power, provider.PowerStopped)
	}
}

func testRangeExhausted(t *testing.T, h *Harness) {
	expectExhausted := func(t *testing.T, p provider.Provider, s *provider.VMSpec) {
		t.Helper()
		res, err := p.EnsureVM(t.Context(), s, provider.Progress{})
		if err == nil {
			t.Fatalf("EnsureVM placed %s with no free id: %s", s.Name, describe(res))
		}
		if !errors.Is(err, provider.ErrIDRangeExhausted) || provider.Classify(err) != provider.ClassResource {
			t.Fatalf("EnsureVM: %v (class %s), want ErrIDRangeExhausted of class %s", err, provider.Classify(err), provider.ClassResource)
		}
	}
	t.Run("range taken by a foreign VM", func(t *testing.T) {
		id := h.VMID(t, h.CreateForeignVM(t, 0, "", nil))
		p := h.NewProvider(t, func(c *provider.ClusterConfig) { c.VMIDStart, c.VMIDEnd = id, id })
		expectExhausted(t, p, spec(h.Template, 1))
	})
	t.Run("one id, two owners", func(t *testing.T) {
		used := usedIDs(t, h, h.Provider)
		id := 0
		p := h.NewProvider(t, func(c *provider.ClusterConfig) {
			for id = c.VMIDStart; used[id]; id++ {
			}
			c.VMIDStart, c.VMIDEnd = id, id
		})
		a := newDrive(t, h, p, spec(h.Template, 1))
		if got := a.toPhase(provider.PhasePlaced); got.Progress.ID != h.ID(id) {
			t.Fatalf("placed on %v, the only id in range is %v", got.Progress.ID, id)
		}
		b := spec(h.Template, 2)
		expectExhausted(t, p, b) // held by a's reservation
		a.toPhase(provider.PhaseRunning)
		expectExhausted(t, p, b) // held by a's VM
		deleteUntilDone(t, h, p, a.spec.Owner, a.prog)
		res, err := p.EnsureVM(t.Context(), b, provider.Progress{})
		if err != nil || res.Progress.ID != h.ID(id) {
			t.Fatalf("EnsureVM after the only id was freed: %v, %s", err, describe(res))
		}
	})
}

func testGetVM(t *testing.T, h *Harness) {
	s := spec(h.Template, 1)
	res := newDrive(t, h, h.Provider, s).toPhase(provider.PhaseRunning)
	for _, ref := range []provider.VMRef{res.Progress.VMRef(), {ID: res.Progress.ID}} {
		vm, err := h.Provider.GetVM(t.Context(), ref)
		if err != nil {
			t.Fatalf("GetVM(%+v): %v", ref, err)
		}
		if vm.Owner == nil {
			t.Fatalf("GetVM(%+v): not verified: %v", ref, vm.OwnershipError)
		}
		if vm.OwnershipError != nil {
			t.Errorf("GetVM(%+v): verified but OwnershipError %v", ref, vm.OwnershipError)
		}
		o := *vm.Owner
		if o.Namespace != s.Owner.Namespace || o.Name != s.Owner.Name || o.UID != s.Owner.UID || o.Pool != s.Owner.Pool {
			t.Errorf("GetVM(%+v): owner %+v, want %+v", ref, o, s.Owner)
		}
		if vm.CreatedAt.IsZero() || o.CreatedAt.IsZero() {
			t.Errorf("GetVM(%+v): no creation time", ref)
		}
		if vm.ID != res.Progress.ID || vm.Node != res.Progress.Node || vm.Template || !vm.OperatorTagged {
			t.Errorf("GetVM(%+v): %+v", ref, vm.VMSummary)
		}
	}

	foreign := h.CreateForeignVM(t, 0, "made by hand", nil)
	vm, err := h.Provider.GetVM(t.Context(), provider.VMRef{ID: foreign})
	if err != nil {
		t.Fatalf("GetVM of a foreign VM: %v", err)
	}
	if vm.Owner != nil || !errors.Is(vm.OwnershipError, ownership.ErrNoMarker) {
		t.Errorf("GetVM of a foreign VM: owner %v, ownership error %v; want none and %v", vm.Owner, vm.OwnershipError, ownership.ErrNoMarker)
	}

	missing := 0
	for id := range usedIDs(t, h, h.Provider) {
		missing = max(missing, id)
	}
	if _, err := h.Provider.GetVM(t.Context(), provider.VMRef{ID: h.ID(missing + 1000)}); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("GetVM of a missing VM: %v, want %v", err, provider.ErrNotFound)
	}
}

// testCheckRef: the reference of a VM the provider made passes, with its
// node or without; an ID of another scheme, an id outside the configured
// range and a node placement may not use are refused with
// ClassConfiguration, and IDs round-trip through the harness's mapping.
func testCheckRef(t *testing.T, h *Harness) {
	res := newDrive(t, h, h.Provider, spec(h.Template, 1)).toPhase(provider.PhasePlaced)
	vmid := h.VMID(t, res.Progress.ID)
	if got := h.ID(vmid); got != res.Progress.ID {
		t.Fatalf("ID(VMID(%s)) = %s", res.Progress.ID, got)
	}
	for _, ref := range []provider.VMRef{res.Progress.VMRef(), {ID: res.Progress.ID}} {
		if err := h.Provider.CheckRef(ref); err != nil {
			t.Errorf("CheckRef(%+v) of the provider's own VM: %v", ref, err)
		}
	}
	narrow := h.NewProvider(t, func(c *provider.ClusterConfig) {
		c.VMIDStart, c.VMIDEnd = vmid, vmid
		c.Nodes = []string{res.Progress.Node}
	})
	for name, ref := range map[string]provider.VMRef{
		"empty ID":           {},
		"another scheme":     {ID: "another-hypervisor://" + res.Progress.ID},
		"digits only":        {ID: provider.ID(fmt.Sprint(vmid))},
		"below the range":    {ID: h.ID(vmid - 1)},
		"above the range":    {ID: h.ID(vmid + 1)},
		"node not allowed":   {ID: res.Progress.ID, Node: res.Progress.Node + "-elsewhere"},
		"trailing garbage":   {ID: res.Progress.ID + "/x"},
		"leading whitespace": {ID: " " + res.Progress.ID},
	} {
		err := narrow.CheckRef(ref)
		if err == nil || provider.Classify(err) != provider.ClassConfiguration {
			t.Errorf("CheckRef, %s (%+v): %v (class %s), want a %s error", name, ref, err, provider.Classify(err), provider.ClassConfiguration)
		}
	}
	if err := narrow.CheckRef(res.Progress.VMRef()); err != nil {
		t.Errorf("CheckRef of the only id in range on the only node: %v", err)
	}
}

func testListVMs(t *testing.T, h *Harness) {
	info, err := h.Provider.ValidateTemplate(t.Context(), h.Template)
	if err != nil {
		t.Fatalf("ValidateTemplate: %v", err)
	}
	res := newDrive(t, h, h.Provider, spec(h.Template, 1)).toPhase(provider.PhaseRunning)
	plain := h.CreateForeignVM(t, 0, "made by hand", []string{"ci-other"})
	tagged := h.CreateForeignVM(t, 0, "tagged by hand", h.Signer.Tags())

	list, err := h.Provider.ListVMs(t.Context())
	if err != nil {
		t.Fatalf("ListVMs: %v", err)
	}
	byID := map[provider.ID]provider.VMSummary{}
	for _, s := range list {
		if _, dup := byID[s.ID]; dup {
			t.Errorf("ListVMs lists VM %v twice", s.ID)
		}
		byID[s.ID] = s
	}
	ours, ok := byID[res.Progress.ID]
	switch {
	case !ok:
		t.Errorf("ListVMs does not list VM %v", res.Progress.ID)
	case !ours.OperatorTagged || ours.Template || ours.Node != res.Progress.Node:
		t.Errorf("ListVMs: our VM is %+v", ours)
	case ours.Power != provider.PowerRunning && ours.Power != provider.PowerUnknown:
		t.Errorf("ListVMs: our running VM shows power %q", ours.Power)
	}
	for _, tag := range h.Signer.Tags() {
		if ok && !hasTag(ours.Tags, tag) {
			t.Errorf("ListVMs: our VM lacks tag %q (tags %v)", tag, ours.Tags)
		}
	}
	if s, ok := byID[plain]; !ok || s.OperatorTagged {
		t.Errorf("ListVMs: foreign VM %v: listed %v, %+v", plain, ok, s)
	}
	if s, ok := byID[tagged]; !ok || !s.OperatorTagged {
		t.Errorf("ListVMs: foreign VM %v with the operator's tags: listed %v, %+v", tagged, ok, s)
	}
	// The tag only makes a candidate; GetVM proves it is not ours.
	vm, err := h.Provider.GetVM(t.Context(), provider.VMRef{ID: tagged})
	if err != nil || vm.Owner != nil {
		t.Errorf("GetVM of a foreign VM with the operator's tags: %v, %+v", err, vm)
	}
	if s, ok := byID[h.ID(info.ID)]; !ok || !s.Template || s.OperatorTagged {
		t.Errorf("ListVMs: template %d: listed %v, %+v", info.ID, ok, s)
	}
}

func testSetPower(t *testing.T, h *Harness) {
	s := spec(h.Template, 1)
	res := newDrive(t, h, h.Provider, s).toPhase(provider.PhaseRunning)
	ref := res.Progress.VMRef()
	steps := []struct {
		action   provider.PowerAction
		wantTask bool
		then     provider.PowerState
	}{
		{provider.PowerOn, false, provider.PowerRunning},
		{provider.PowerOff, true, provider.PowerStopped},
		{provider.PowerOff, false, provider.PowerStopped},
		{provider.PowerShutdown, false, provider.PowerStopped},
		{provider.PowerOn, true, provider.PowerRunning},
		{provider.PowerShutdown, true, provider.PowerStopped},
	}
	for i, st := range steps {
		task, err := h.Provider.SetPower(t.Context(), s.Owner, ref, st.action)
		if err != nil {
			t.Fatalf("step %d: SetPower(%s): %v", i, st.action, err)
		}
		if (task != nil) != st.wantTask {
			t.Fatalf("step %d: SetPower(%s) returned task %+v; want a task: %v", i, st.action, task, st.wantTask)
		}
		if task != nil && (task.ID == "" || task.Operation == "") {
			t.Errorf("step %d: SetPower(%s): task %+v lacks an id or an operation", i, st.action, *task)
		}
		waitPower(t, h, h.Provider, ref, st.then)
	}
}

func testDeleteVM(t *testing.T, h *Harness) {
	cases := []struct {
		name     string
		at       func(*provider.EnsureResult) bool
		loseTask bool
		powerOff bool
	}{
		{name: "placed only", at: atPhase(provider.PhasePlaced)},
		{name: "while cloning", at: atPhaseInFlight(provider.PhaseCloning)},
		{name: "while cloning, task lost", at: atPhaseInFlight(provider.PhaseCloning), loseTask: true},
		{name: "while configuring", at: atPhaseInFlight(provider.PhaseConfiguring)},
		{name: "while booting", at: atPhase(provider.PhaseBooting)},
		{name: "running", at: atPhase(provider.PhaseRunning)},
		{name: "stopped by its guest", at: atPhase(provider.PhaseRunning), powerOff: true},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := spec(h.Template, 40+i)
			d := newDrive(t, h, h.Provider, s)
			at, ok := d.untilOrRunning(c.at)
			if !ok {
				t.Skipf("the implementation went to Running without reporting this state (%s)", describe(at))
			}
			if c.powerOff {
				h.GuestPowerOff(t, at.Progress.ID)
				d.until("after the guest powered off", atPhase(provider.PhaseStopped))
			}
			prev := d.prog
			if c.loseTask {
				prev.Task = nil
			}
			deleted := deleteUntilDone(t, h, h.Provider, s.Owner, prev)
			expectNoVM(t, h, h.Provider, s.Owner)
			if _, err := h.Provider.GetVM(t.Context(), provider.VMRef{ID: prev.ID}); !errors.Is(err, provider.ErrNotFound) {
				t.Errorf("GetVM(%v) after DeleteVM: %v, want %v", prev.ID, err, provider.ErrNotFound)
			}
			if storedContains(t, h, token(40+i)) {
				t.Error("the cloud-init payload is still stored on the backend after DeleteVM is Done")
			}
			if got := reserved(t, h.Provider, prev.Node); got != 0 {
				t.Errorf("node %s still reserves %d bytes after DeleteVM is Done", prev.Node, got)
			}
			expectDoneAtOnce(t, h.Provider, s.Owner, deleted.Progress, "again with its final progress")
			expectDoneAtOnce(t, h.Provider, s.Owner, prev, "again with the progress it started from")
			expectDoneAtOnce(t, h.Provider, s.Owner, provider.Progress{}, "with an empty progress")
		})
	}
}

// testDeleteOtherMissing: a destroy that fails because something other
// than the VM does not exist (a storage, a volume, an ISO) is not the VM's
// absence: DeleteVM never reports Done while the VM exists, and finishes
// once the destroy works again.
func testDeleteOtherMissing(t *testing.T, h *Harness) {
	s := spec(h.Template, 60)
	d := newDrive(t, h, h.Provider, s)
	d.toPhase(provider.PhaseRunning)
	vmid := d.prog.ID
	stop := h.FailDestroysOtherMissing(t)
	prog := persist(t, d.prog)
	failures := 0
	for i := 0; i < maxSteps && failures < 3; i++ {
		res, err := h.Provider.DeleteVM(t.Context(), s.Owner, prog)
		if err != nil {
			failures++
			h.Advance(time.Second)
			continue
		}
		if res.Done {
			t.Fatalf("DeleteVM is Done while every destroy fails (%s); VM %v still exists", res.Message, vmid)
		}
		prog = persist(t, res.Progress)
		h.Advance(max(res.RetryAfter, time.Millisecond))
	}
	if failures < 3 {
		t.Fatalf("DeleteVM reported no error in %d calls while every destroy fails", maxSteps)
	}
	if _, err := h.Provider.GetVM(t.Context(), provider.VMRef{ID: vmid}); err != nil {
		t.Fatalf("GetVM(%v) while its destroy fails: %v", vmid, err)
	}
	expectOneVM(t, h, h.Provider, s.Owner, vmid)
	stop()
	deleteUntilDone(t, h, h.Provider, s.Owner, prog)
	expectNoVM(t, h, h.Provider, s.Owner)
}

// testRemoveCloudInitMedia: a VM kept after its run (a failed VM kept
// for debugging) loses its cloud-init data, and with it the single-use
// credential, from the backend; the VM itself stays, owned and in the
// power state it had. Another owner's call touches nothing.
func testRemoveCloudInitMedia(t *testing.T, h *Harness) {
	cases := []struct {
		name     string
		at       func(*provider.EnsureResult) bool
		powerOff bool
	}{
		{name: "while configuring", at: atPhaseInFlight(provider.PhaseConfiguring)},
		{name: "while booting", at: atPhase(provider.PhaseBooting)},
		{name: "booting, then stopped", at: atPhase(provider.PhaseBooting), powerOff: true},
		{name: "running", at: atPhase(provider.PhaseRunning)},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := 60 + i
			s := spec(h.Template, n)
			d := newDrive(t, h, h.Provider, s)
			at, ok := d.untilOrRunning(c.at)
			if !ok {
				t.Skipf("the implementation went to Running without reporting this state (%s)", describe(at))
			}
			prev := d.prog
			if c.powerOff {
				if _, err := h.Provider.SetPower(t.Context(), s.Owner, prev.VMRef(), provider.PowerOff); err != nil {
					t.Fatalf("SetPower(off): %v", err)
				}
				waitPower(t, h, h.Provider, prev.VMRef(), provider.PowerStopped)
			}
			before, err := h.Provider.GetVM(t.Context(), prev.VMRef())
			if err != nil {
				t.Fatalf("GetVM before: %v", err)
			}
			removed := removeMediaUntilDone(t, h, s.Owner, prev)
			h.Advance(settleTime)
			if storedContains(t, h, token(n)) {
				t.Error("the cloud-init payload is still stored on the backend after RemoveCloudInitMedia is Done")
			}
			after, err := h.Provider.GetVM(t.Context(), prev.VMRef())
			if err != nil {
				t.Fatalf("GetVM after: %v", err)
			}
			if after.Owner == nil || after.Owner.UID != s.Owner.UID {
				t.Errorf("VM %v after RemoveCloudInitMedia: owner %+v (%v), want %s", prev.ID, after.Owner, after.OwnershipError, s.Owner.UID)
			}
			if c.powerOff && after.Power != provider.PowerStopped || !c.powerOff && before.Power == provider.PowerRunning && after.Power != provider.PowerRunning {
				t.Errorf("VM %v: power %s before RemoveCloudInitMedia, %s after; it must not change", prev.ID, before.Power, after.Power)
			}
			intruder := owner(n + 100)
			if _, err := h.Provider.RemoveCloudInitMedia(t.Context(), intruder, persist(t, removed.Progress)); !errors.Is(err, provider.ErrNotOwned) {
				t.Errorf("RemoveCloudInitMedia by another owner: %v, want %v", err, provider.ErrNotOwned)
			}
			again, err := h.Provider.RemoveCloudInitMedia(t.Context(), s.Owner, persist(t, removed.Progress))
			if err != nil || !again.Done {
				t.Errorf("RemoveCloudInitMedia again with its final progress: %+v, %v; want Done at once", again, err)
			}
			// The VM is still the owner's to destroy.
			deleteUntilDone(t, h, h.Provider, s.Owner, removed.Progress)
			expectNoVM(t, h, h.Provider, s.Owner)
		})
	}
}

// removeMediaUntilDone calls RemoveCloudInitMedia, honouring RetryAfter,
// until Done.
func removeMediaUntilDone(t *testing.T, h *Harness, o provider.Owner, prev provider.Progress) *provider.DeleteResult {
	t.Helper()
	return removalUntilDone(t, h, o, prev, "RemoveCloudInitMedia", func(prog provider.Progress) (*provider.DeleteResult, error) {
		return h.Provider.RemoveCloudInitMedia(t.Context(), o, prog)
	})
}

// testNotOwned: DeleteVM, SetPower and DisownVM refuse every VM whose
// marker does not verify for the owner they are given, and leave it as it
// was (power, owner, tags and name).
func testNotOwned(t *testing.T, h *Harness) {
	a := owner(1)
	other, err := ownership.NewSigner(h.Signer.OperatorID(), bytes.Repeat([]byte{0x5a}, ownership.MinKeyLength))
	if err != nil {
		t.Fatal(err)
	}
	other = other.ForCluster(h.Signer.Cluster())
	// The same install and key, bound to another cluster: what a block
	// copied from a VM of that cluster carries.
	otherCluster := h.Signer.Cluster()
	otherCluster.Name += "-elsewhere"
	elsewhere := h.Signer.ForCluster(otherCluster)
	cases := []struct {
		name      string
		target    func(t *testing.T) provider.ID
		wantError error // what GetVM's OwnershipError wraps, nil when the marker verifies for someone else
	}{
		{name: "foreign VM without a marker", wantError: ownership.ErrNoMarker, target: func(t *testing.T) provider.ID {
			return h.CreateForeignVM(t, 0, "made by hand", nil)
		}},
		{name: "foreign VM with the operator's tags", wantError: ownership.ErrNoMarker, target: func(t *testing.T) provider.ID {
			return h.CreateForeignVM(t, 0, "tagged by hand", h.Signer.Tags())
		}},
		{name: "marker signed with another install's key", wantError: ownership.ErrBadSignature, target: func(t *testing.T) provider.ID {
			id := h.CreateForeignVM(t, 0, "", h.Signer.Tags())
			h.SetDescription(t, id, other.Description("", record(a, h.VMID(t, id))))
			return id
		}},
		{name: "marker copied from another VM", wantError: ownership.ErrBadSignature, target: func(t *testing.T) provider.ID {
			id := h.CreateForeignVM(t, 0, "", h.Signer.Tags())
			desc := h.Signer.Description("copied", record(a, h.VMID(t, id)+1))
			if _, err := h.Signer.Verify(desc, h.VMID(t, id)+1); err != nil {
				t.Fatalf("the copied marker does not even verify for its own VM: %v", err)
			}
			h.SetDescription(t, id, desc)
			return id
		}},
		{name: "marker copied from another cluster", wantError: ownership.ErrOtherCluster, target: func(t *testing.T) provider.ID {
			id := h.CreateForeignVM(t, 0, "", h.Signer.Tags())
			h.SetDescription(t, id, elsewhere.Description("copied", record(a, h.VMID(t, id))))
			return id
		}},
		{name: "edited marker on the owner's own VM", wantError: ownership.ErrBadSignature, target: func(t *testing.T) provider.ID {
			res := newDrive(t, h, h.Provider, spec(h.Template, 1)).toPhase(provider.PhaseRunning)
			id := res.Progress.ID
			good := h.Signer.Description("", record(a, h.VMID(t, id)))
			// Control: a marker re-signed for this VM and owner verifies.
			h.SetDescription(t, id, good)
			if vm, err := h.Provider.GetVM(t.Context(), provider.VMRef{ID: id}); err != nil || vm.Owner == nil {
				t.Fatalf("a freshly signed marker does not verify: %v, %+v", err, vm)
			}
			stamp := a.CreatedAt.Format(time.RFC3339)
			edited := strings.Replace(good, stamp, a.CreatedAt.Add(time.Second).Format(time.RFC3339), 1)
			if edited == good {
				t.Fatalf("the marker has no created field %q to edit:\n%s", stamp, good)
			}
			h.SetDescription(t, id, edited)
			return id
		}},
		{name: "VM of another claim", target: func(t *testing.T) provider.ID {
			return newDrive(t, h, h.Provider, spec(h.Template, 2)).toPhase(provider.PhaseRunning).Progress.ID
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := c.target(t)
			before, err := h.Provider.GetVM(t.Context(), provider.VMRef{ID: id})
			if err != nil {
				t.Fatalf("GetVM(%v): %v", id, err)
			}
			if c.wantError != nil && (before.Owner != nil || !errors.Is(before.OwnershipError, c.wantError)) {
				t.Errorf("GetVM(%v): owner %v, ownership error %v; want %v", id, before.Owner, before.OwnershipError, c.wantError)
			}
			ref := provider.VMRef{ID: id, Node: before.Node}
			expectNotOwned := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, provider.ErrNotOwned) || provider.Classify(err) != provider.ClassPermanent {
					t.Errorf("%s: %v (class %s), want ErrNotOwned of class %s", what, err, provider.Classify(err), provider.ClassPermanent)
				}
			}
			_, err = h.Provider.DeleteVM(t.Context(), a, provider.Progress{ID: id, Node: before.Node})
			expectNotOwned("DeleteVM", err)
			_, err = h.Provider.DeleteVM(t.Context(), a, provider.Progress{ID: id})
			expectNotOwned("DeleteVM without a node", err)
			for _, action := range []provider.PowerAction{provider.PowerOff, provider.PowerShutdown, provider.PowerOn} {
				_, err = h.Provider.SetPower(t.Context(), a, ref, action)
				expectNotOwned("SetPower "+string(action), err)
			}
			_, err = h.Provider.DisownVM(t.Context(), a, ref)
			expectNotOwned("DisownVM", err)
			h.Advance(settleTime)
			after, err := h.Provider.GetVM(t.Context(), ref)
			if err != nil {
				t.Fatalf("VM %v after the refused calls: %v", id, err)
			}
			if after.Power != before.Power {
				t.Errorf("VM %v: power went from %s to %s", id, before.Power, after.Power)
			}
			if (after.Owner == nil) != (before.Owner == nil) || after.Owner != nil && *after.Owner != *before.Owner {
				t.Errorf("VM %v: owner went from %+v to %+v", id, before.Owner, after.Owner)
			}
			if !slices.Equal(after.Tags, before.Tags) || after.Name != before.Name {
				t.Errorf("VM %v: tags went from %v to %v, name from %q to %q", id, before.Tags, after.Tags, before.Name, after.Name)
			}
		})
	}
}

// testCopiedMarker: the description of VM A, written onto VM B, makes B
// nobody's: neither A's owner nor B's may touch B; A is unaffected.
func testCopiedMarker(t *testing.T, h *Harness) {
	da := newDrive(t, h, h.Provider, spec(h.Template, 1))
	db := newDrive(t, h, h.Provider, spec(h.Template, 2))
	ra := da.toPhase(provider.PhaseRunning)
	rb := db.toPhase(provider.PhaseRunning)
	a, b := da.spec.Owner, db.spec.Owner
	copied := h.Signer.Description(da.spec.Description, record(a, h.VMID(t, ra.Progress.ID)))
	h.SetDescription(t, rb.Progress.ID, copied)

	vm, err := h.Provider.GetVM(t.Context(), rb.Progress.VMRef())
	if err != nil {
		t.Fatalf("GetVM(%v): %v", rb.Progress.ID, err)
	}
	if vm.Owner != nil || !errors.Is(vm.OwnershipError, ownership.ErrBadSignature) {
		t.Errorf("GetVM of the VM with a copied marker: owner %v, error %v", vm.Owner, vm.OwnershipError)
	}
	for _, o := range []provider.Owner{a, b} {
		if _, err := h.Provider.DeleteVM(t.Context(), o, rb.Progress); !errors.Is(err, provider.ErrNotOwned) {
			t.Errorf("DeleteVM(%s) of the VM with a copied marker: %v, want %v", o.Name, err, provider.ErrNotOwned)
		}
		if _, err := h.Provider.SetPower(t.Context(), o, rb.Progress.VMRef(), provider.PowerOff); !errors.Is(err, provider.ErrNotOwned) {
			t.Errorf("SetPower(%s) of the VM with a copied marker: %v, want %v", o.Name, err, provider.ErrNotOwned)
		}
		if _, err := h.Provider.DisownVM(t.Context(), o, rb.Progress.VMRef()); !errors.Is(err, provider.ErrNotOwned) {
			t.Errorf("DisownVM(%s) of the VM with a copied marker: %v, want %v", o.Name, err, provider.ErrNotOwned)
		}
	}
	waitPower(t, h, h.Provider, rb.Progress.VMRef(), provider.PowerRunning)
	deleteUntilDone(t, h, h.Provider, a, ra.Progress)
	if _, err := h.Provider.GetVM(t.Context(), rb.Progress.VMRef()); err != nil {
		t.Errorf("deleting A's VM took B's VM with it: %v", err)
	}
	expectNoVM(t, h, h.Provider, a)
}

// testUnconfiguredCloneFindable: a clone carries the install's keyed name
// (ownership.Signer.VMName) from the moment the hypervisor names it until
// the configuration gives it its tags and its spec name, so the orphan
// sweep finds a clone whose configuration never happens.
func testUnconfiguredCloneFindable(t *testing.T, h *Harness) {
	s := spec(h.Template, 1)
	d := newDrive(t, h, h.Provider, s)
	res := d.toPhase(provider.PhaseConfiguring)
	vmid := res.Progress.ID
	vm, err := h.Provider.GetVM(t.Context(), res.Progress.VMRef())
	if err != nil {
		t.Fatalf("GetVM of the unconfigured clone: %v", err)
	}
	if vm.OperatorTagged || !vm.InstallNamed || vm.Name != h.Signer.VMName(h.VMID(t, vmid)) {
		t.Errorf("unconfigured clone: name %q, tagged %v, install-named %v; want the name %q, install-named and no tag yet",
			vm.Name, vm.OperatorTagged, vm.InstallNamed, h.Signer.VMName(h.VMID(t, vmid)))
	}
	// The batch listing of a restarted operator shows it too.
	h.Advance(settleTime)
	listed := false
	for _, v := range listVMs(t, h.NewProvider(t, nil)) {
		if v.ID == vmid {
			listed = v.InstallNamed && !v.OperatorTagged
		}
	}
	if !listed {
		t.Errorf("ListVMs does not show VM %v as install-named and untagged", vmid)
	}
	res = d.toPhase(provider.PhaseRunning)
	vm, err = h.Provider.GetVM(t.Context(), res.Progress.VMRef())
	if err != nil {
		t.Fatalf("GetVM of the running VM: %v", err)
	}
	if !vm.OperatorTagged || vm.InstallNamed || vm.Name != s.Name {
		t.Errorf("configured VM: name %q, tagged %v, install-named %v; want %q, tagged, not install-named",
			vm.Name, vm.OperatorTagged, vm.InstallNamed, s.Name)
	}
}

func listVMs(t *testing.T, p provider.Provider) []provider.VMSummary {
	t.Helper()
	vms, err := p.ListVMs(t.Context())
	if err != nil {
		t.Fatalf("ListVMs: %v", err)
	}
	return vms
}

// testStrayMedia: the install's cloud-init media are listed with the VM id
// and owner digest they were written for; one whose VM still verifies for
// its owner is in use and never deleted; once that VM no longer proves it
// (here its marker is overwritten) the medium is deleted, and reported
// Done only once it is gone. A medium named for another install is never
// touched.
func testStrayMedia(t *testing.T, h *Harness) {
	s := spec(h.Template, 1)
	d := newDrive(t, h, h.Provider, s)
	res := d.toPhase(provider.PhaseConfiguring) // the upload is under way
	vmid := res.Progress.ID
	h.Advance(settleTime) // the upload finishes; nothing attaches it
	medium := func(p provider.Provider) (provider.CloudInitMedium, bool) {
		t.Helper()
		media, err := p.ListCloudInitMedia(t.Context())
		if err != nil {
			t.Fatalf("ListCloudInitMedia: %v", err)
		}
		for _, m := range media {
			if m.VM == vmid {
				return m, true
			}
		}
		return provider.CloudInitMedium{}, false
	}
	m, ok := medium(h.NewProvider(t, nil))
	if !ok {
		t.Fatalf("ListCloudInitMedia does not list the medium of VM %v", vmid)
	}
	if m.OwnerDigest != provider.OwnerDigest(s.Owner.UID) || m.ID == "" || m.Node == "" {
		t.Errorf("medium %+v: want owner digest %s, an id and a node", m, provider.OwnerDigest(s.Owner.UID))
	}
	if _, err := h.Provider.DeleteCloudInitMedium(t.Context(), m); !errors.Is(err, provider.ErrInUse) {
		t.Fatalf("DeleteCloudInitMedium of the medium of a VM that verifies for its owner: %v, want ErrInUse", err)
	}
	// A medium's name says which install wrote it: with another install's
	// id in place of this one's, it is another install's.
	if !strings.Contains(m.ID, h.Signer.OperatorID()) {
		t.Fatalf("medium %q does not name the install %q that wrote it", m.ID, h.Signer.OperatorID())
	}
	other := m
	other.ID = strings.Replace(m.ID, h.Signer.OperatorID(), "other-install", 1)
	if _, err := h.Provider.DeleteCloudInitMedium(t.Context(), other); !errors.Is(err, provider.ErrNotOwned) {
		t.Errorf("DeleteCloudInitMedium of another install's name %q: %v, want ErrNotOwned", other.ID, err)
	}
	if _, ok := medium(h.Provider); !ok {
		t.Fatal("the medium in use is gone after a refused deletion")
	}

	h.SetDescription(t, vmid, "taken over by an admin")
	p := h.NewProvider(t, nil)
	for i := 0; ; i++ {
		if i > maxSteps {
			t.Fatal("the stray medium is never deleted")
		}
		r, err := p.DeleteCloudInitMedium(t.Context(), m)
		if err != nil {
			t.Fatalf("DeleteCloudInitMedium of a stray medium: %v", err)
		}
		_, listed := medium(p)
		if r.Done {
			if listed {
				t.Fatal("DeleteCloudInitMedium reports Done while the medium is still listed")
			}
			break
		}
		h.Advance(max(r.RetryAfter, time.Second))
	}
	if _, listed := medium(h.NewProvider(t, nil)); listed {
		t.Error("the deleted medium is still listed")
	}
}
