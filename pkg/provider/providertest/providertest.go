// Package providertest is the contract test suite of provider.Provider,
// which every implementation runs: the in-memory fake (pkg/provider/fake)
// and the real providers against their simulators alike.
//
//	func TestContract(t *testing.T) {
//		providertest.Run(t, func(t *testing.T) *providertest.Harness { ... })
//	}
//
// The suite speaks the neutral contract only: phases, Progress, sentinel
// errors and classes, the ownership marker of pkg/ownership. It never
// names a hypervisor's endpoints, task types, storages or lock names, and it
// never sleeps: hypervisor time moves only through Harness.Advance.
//
// # What a Harness must provide
//
// Run calls newHarness once per subtest; each call builds a fresh, private
// backend (a simulator instance, a fake cluster) and a Provider on it:
//
//   - Provider: the implementation under test. Its ClusterConfig has a VM id
//     range with at least 16 ids no VM uses, no clone limits (ClonesPerNode
//     and ClonesPerStorage zero or at least 4), whatever its cloud-init
//     media need and room on its nodes for at least four VMs of Template.
//   - NewProvider: another instance on the same backend, with the same
//     signer and clock and none of any earlier instance's in-process state,
//     as after an operator restart. configure, when not nil, edits a copy of
//     the ClusterConfig first (the suite narrows the VM id range, the
//     nodes, the clone limits).
//   - Signer: the signer every instance writes and verifies markers with,
//     bound (ownership.Signer.ForCluster) to the cluster the provider binds
//     it to, so blocks the suite writes by hand verify there.
//   - Template: a template whose clones boot to a guest that reports an
//     address, takes guest files (TemplateInfo.GuestFiles) and stays up
//     until powered off. It has no TPM (TemplateInfo.TPM false).
//   - Source: the implementation's own naming (TemplateSource.Settings) of
//     a template by its number (TemplateInfo.ID) or, with the number
//     zero, by its name, with a full clone's target storage (empty: the
//     cluster's default), whether or not such a template exists.
//   - Advance: moves the backend's clock, and the provider's if it keeps its
//     own, forward; when it returns, whatever fell due has happened.
//   - GuestPowerOff: the guest of a running VM powers it off from inside.
//   - CreateForeignVM: creates a VM outside the provider (as an admin
//     would) with exactly the given description and tags, at vmid or, when
//     vmid is zero, at any free id, and returns its id once the VM exists.
//     It may be stopped, and the hook may advance the clock to finish it.
//   - SetDescription: overwrites a VM's description outside the provider.
//   - CloudInitOf: the cloud-init data the guest of vmid read at its last
//     boot (for the fake the data of the medium attached when it started;
//     for a simulator what its guest hook found on the attached medium).
//   - StoredData: every piece of data at rest on the backend that a VM's
//     payload could end up in: the contents of stored volumes, uploaded
//     files and cloud-init media (files inside images as text), VM
//     descriptions and configs. The
//     suite looks for a unique token it put in the user-data to check that
//     the cloud-init payload is on the backend while the VM is being built
//     and gone once it runs or is deleted.
//   - GuestFileOf: the file at path in the running guest of vmid, as
//     PlaceGuestFile (or the guest) left it; ok false when there is none.
//   - RemoveGuestAgent: takes the guest channel away from VM vmid (for
//     Proxmox agent: 0 in its config), as an admin would.
//   - FailDestroysOtherMissing: from now until the returned func is called,
//     every request to destroy a VM fails the way the backend answers when
//     something other than the VM itself does not exist (a storage, a
//     volume, a cloud-init medium); the VM stays as it was.
//
// Every hook fails the test (t.Fatal) when it cannot do its job.
package providertest

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Harness connects the suite to one implementation and its backend. See
// the package documentation for what each field must do.
type Harness struct {
	Provider         provider.Provider
	NewProvider      func(t *testing.T, configure func(*provider.ClusterConfig)) provider.Provider
	Signer           *ownership.Signer
	Template         provider.TemplateSource
	Source           func(ref TemplateRef) provider.TemplateSource
	Advance          func(d time.Duration)
	GuestPowerOff    func(t *testing.T, vm provider.ID)
	CreateForeignVM  func(t *testing.T, vmid int, description string, tags []string) provider.ID
	SetDescription   func(t *testing.T, vm provider.ID, description string)
	CloudInitOf      func(t *testing.T, vm provider.ID) provider.CloudInit
	StoredData       func(t *testing.T) []string
	GuestFileOf      func(t *testing.T, vm provider.ID, path string) (content []byte, ok bool)
	RemoveGuestAgent func(t *testing.T, vm provider.ID)
	// VMID is the integer VM id in the provider's ClusterConfig range
	// (VMIDStart..VMIDEnd) that an ID of the provider names; it fails the
	// test for an ID that names none.
	VMID func(t *testing.T, vm provider.ID) int
	// ID is the provider's ID of the integer VM id vmid (the inverse of
	// VMID), whether or not a VM exists there.
	ID func(vmid int) provider.ID

	FailDestroysOtherMissing func(t *testing.T) (stop func())
}

// TemplateRef names a template for Harness.Source: by its number, or
// with Number zero by its name, with a full clone's target storage.
type TemplateRef struct {
	Number        int
	Name, Storage string
}

const (
	// maxSteps bounds the calls one drive may take.
	maxSteps = 400
	// maxSimulated bounds the hypervisor time one drive may take.
	maxSimulated = 2 * time.Hour
	// maxTransient is how many transient errors in a row one step
	// tolerates (the contract says: retry them with backoff).
	maxTransient = 3
	// settleTime is how long the suite lets the backend run before it
	// counts VMs, so that a stray operation would have shown its effect.
	settleTime = 2 * time.Minute
)

// created is every Owner's CreatedAt: a fixed, second-precision time.
var created = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// phaseOrder is the order of the creation phases; PhaseStopped comes after
// a run and is not part of it.
var phaseOrder = map[provider.Phase]int{
	provider.PhasePlaced: 0, provider.PhaseQueued: 1, provider.PhaseCloning: 2, provider.PhaseConfiguring: 3,
	provider.PhaseStarting: 4, provider.PhaseBooting: 5, provider.PhaseRunning: 6, provider.PhaseStopped: 7,
}

func owner(i int) provider.Owner {
	return provider.Owner{
		Namespace: "contract", Name: fmt.Sprintf("claim-%d", i),
		UID: fmt.Sprintf("6f1c9a2e-0000-4000-8000-%012d", i), Pool: "contract-pool", CreatedAt: created,
	}
}

// token is the secret-like string in owner i's user-data.
func token(i int) string { return fmt.Sprintf("hf-contract-secret-%d-e1b0c442", i) }

// mac is the MAC the suite asks for owner i (locally administered).
func mac(i int) string { return fmt.Sprintf("02:48:46:00:%02x:%02x", i>>8&0xff, i&0xff) }

// spec builds owner i's VM spec on template.
func spec(template provider.TemplateSource, i int) *provider.VMSpec {
	o := owner(i)
	name := fmt.Sprintf("hf-contract-%d", i)
	return &provider.VMSpec{
		Owner: o, Name: name, Description: "HyperFleet contract test VM", Source: template,
		// MemoryHint is MemoryBytes, as the contract asks; the suite cannot
		// know the template's memory.
		MemoryBytes: 1 << 30, MemoryHint: 1 << 30,
		Network: provider.NetworkSpec{MACAddress: mac(i)},
		CloudInit: provider.CloudInit{
			UserData: []byte(fmt.Sprintf("#cloud-config\nwrite_files:\n  - path: /etc/hyperfleet/token\n    content: %s\n", token(i))),
			MetaData: []byte(fmt.Sprintf("instance-id: %s\nlocal-hostname: %s\n", o.UID, name)),
			NetworkConfig: []byte(fmt.Sprintf("version: 2\nethernets:\n  eth0:\n    match:\n      macaddress: %q\n    dhcp4: true\n",
				mac(i))),
		},
		Tags: []string{"contract-test"},
	}
}

// record is what an ownership block for owner on vmid states.
func record(o provider.Owner, vmid int) ownership.Record {
	return ownership.Record{Namespace: o.Namespace, Name: o.Name, UID: o.UID, Pool: o.Pool, VMID: vmid, CreatedAt: o.CreatedAt}
}

// persist round-trips a Progress through JSON, as storing it in a status
// does: whatever does not survive that must not be needed.
func persist(t *testing.T, p provider.Progress) provider.Progress {
	t.Helper()
	raw, err := json.Marshal(p)
	if err != nil {
		t.Fatalf("Progress does not marshal: %v", err)
	}
	var out provider.Progress
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("Progress does not unmarshal: %v", err)
	}
	return out
}

// drive is one owner's sequence of EnsureVM calls, each continuing from the
// persisted Progress of the one before.
type drive struct {
	t    *testing.T
	h    *Harness
	p    provider.Provider
	spec *provider.VMSpec
	prog provider.Progress
	last *provider.EnsureResult
	// results are every result so far, in order.
	results []*provider.EnsureResult
	// repeat makes every step call EnsureVM twice with the same prev and
	// continue from the second result, as when a caller failed to persist.
	repeat bool
	// onStep, when set, runs after every step.
	onStep  func(res *provider.EnsureResult)
	elapsed time.Duration
}

func newDrive(t *testing.T, h *Harness, p provider.Provider, s *provider.VMSpec) *drive {
	return &drive{t: t, h: h, p: p, spec: s}
}

// call is one EnsureVM call; transient errors are retried a few times after
// a second of hypervisor time, anything else fails the test.
func (d *drive) call() *provider.EnsureResult {
	d.t.Helper()
	for n := 0; ; n++ {
		res, err := d.p.EnsureVM(d.t.Context(), d.spec, d.prog)
		if err == nil {
			if res == nil {
				d.t.Fatalf("EnsureVM(%s, %+v) returned neither a result nor an error", d.spec.Name, d.prog)
			}
			// Running, Stopped and Suspended are resting states: nothing
			// may be left in flight for the caller to persist and poll.
			if (res.Phase == provider.PhaseRunning || res.Phase == provider.PhaseStopped || res.Phase == provider.PhaseSuspended) &&
				res.RetryAfter == 0 && res.Progress.Task != nil {
				d.t.Fatalf("EnsureVM(%s) reported %s with task %+v still in its progress", d.spec.Name, res.Phase, res.Progress.Task)
			}
			return res
		}
		if provider.Classify(err) != provider.ClassTransient || n >= maxTransient {
			d.t.Fatalf("EnsureVM(%s, %+v): %v (class %s, reason %s)", d.spec.Name, d.prog, err, provider.Classify(err), provider.ReasonOf(err))
		}
		d.t.Logf("EnsureVM(%s): transient error, retrying: %v", d.spec.Name, err)
		d.advance(time.Second)
	}
}

func (d *drive) advance(by time.Duration) {
	d.h.Advance(by)
	d.elapsed += by
}

// step makes one call (two with repeat), checks the result's invariants
// and persists its Progress.
func (d *drive) step() *provider.EnsureResult {
	d.t.Helper()
	res := d.call()
	if d.repeat {
		res = d.call()
	}
	checkResult(d.t, d.spec, res)
	d.prog = persist(d.t, res.Progress)
	d.last = res
	d.results = append(d.results, res)
	if d.onStep != nil {
		d.onStep(res)
	}
	return res
}

// until steps, honouring RetryAfter, until done holds for a result, which it
// returns. It fails the test when the VM reaches PhaseRunning first (unless
// done accepts it) or the bounds are exceeded; reached is false only then.
func (d *drive) until(what string, done func(*provider.EnsureResult) bool) *provider.EnsureResult {
	d.t.Helper()
	res, ok := d.untilOrRunning(done)
	if !ok {
		d.t.Fatalf("%s: VM %v reached %s first", what, res.Progress.ID, res.Phase)
	}
	return res
}

// untilOrRunning is until, but reports false instead of failing when the
// VM is Running before done held.
func (d *drive) untilOrRunning(done func(*provider.EnsureResult) bool) (*provider.EnsureResult, bool) {
	d.t.Helper()
	for i := 0; i < maxSteps && d.elapsed <= maxSimulated; i++ {
		res := d.step()
		if done(res) {
			return res, true
		}
		if res.Phase == provider.PhaseRunning {
			return res, false
		}
		d.advance(res.RetryAfter)
	}
	d.t.Fatalf("VM of %s: no end after %d calls and %s of hypervisor time; last result %s", d.spec.Name, len(d.results), d.elapsed, describe(d.last))
	return nil, false
}

func (d *drive) toPhase(ph provider.Phase) *provider.EnsureResult {
	d.t.Helper()
	return d.until("drive to "+string(ph), func(r *provider.EnsureResult) bool { return r.Phase == ph })
}

func describe(r *provider.EnsureResult) string {
	if r == nil {
		return "none"
	}
	task := "none"
	if r.Progress.Task != nil {
		task = r.Progress.Task.Operation + " " + r.Progress.Task.ID
	}
	return fmt.Sprintf("phase %s, VM %v on %q, task %s, retry after %s: %s", r.Phase, r.Progress.ID, r.Progress.Node, task, r.RetryAfter, r.Message)
}

// checkResult checks what holds for every EnsureVM result.
func checkResult(t *testing.T, s *provider.VMSpec, r *provider.EnsureResult) {
	t.Helper()
	if _, ok := phaseOrder[r.Phase]; !ok {
		t.Fatalf("EnsureVM(%s): unknown phase %q", s.Name, r.Phase)
	}
	if r.RetryAfter < 0 {
		t.Errorf("EnsureVM(%s): negative RetryAfter %s", s.Name, r.RetryAfter)
	}
	if r.Progress.ID == "" || r.Progress.Node == "" {
		t.Fatalf("EnsureVM(%s): progress %+v does not locate the VM or its reservation (%s)", s.Name, r.Progress, describe(r))
	}
	if tk := r.Progress.Task; tk != nil && (tk.ID == "" || tk.Operation == "") {
		t.Errorf("EnsureVM(%s): task %+v lacks an id or an operation", s.Name, *tk)
	}
	if r.Phase != provider.PhaseRunning {
		return
	}
	if r.Progress.Task != nil {
		t.Errorf("EnsureVM(%s): Running with a task in flight: %+v", s.Name, *r.Progress.Task)
	}
	if len(r.Addresses) == 0 {
		t.Errorf("EnsureVM(%s): Running without addresses", s.Name)
	}
	for _, a := range r.Addresses {
		ip, err := netip.ParseAddr(a)
		if err != nil || ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsUnspecified() {
			t.Errorf("EnsureVM(%s): address %q is not a usable IP address", s.Name, a)
		}
	}
	if r.MACAddress == "" {
		t.Errorf("EnsureVM(%s): Running without a MAC address", s.Name)
	}
	if want := strings.ToLower(s.Network.MACAddress); want != "" && r.MACAddress != want {
		t.Errorf("EnsureVM(%s): MAC %q, want the requested %q", s.Name, r.MACAddress, want)
	}
}

// ownedBy returns every VM whose marker verifies for o, looking at every
// listed VM (not only tagged ones: a stray clone may not be tagged yet).
func ownedBy(t *testing.T, p provider.Provider, o provider.Owner) []*provider.VM {
	t.Helper()
	list, err := p.ListVMs(t.Context())
	if err != nil {
		t.Fatalf("ListVMs: %v", err)
	}
	var out []*provider.VM
	for _, s := range list {
		if s.Template {
			continue
		}
		vm, err := p.GetVM(t.Context(), provider.VMRef{ID: s.ID, Node: s.Node})
		if errors.Is(err, provider.ErrNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("GetVM(%v): %v", s.ID, err)
		}
		if vm.Owner != nil && vm.Owner.UID == o.UID {
			out = append(out, vm)
		}
	}
	return out
}

// expectOneVM lets the backend settle, then checks that o owns exactly one
// VM, vmid, and that it carries the operator's tag.
func expectOneVM(t *testing.T, h *Harness, p provider.Provider, o provider.Owner, vmid provider.ID) {
	t.Helper()
	h.Advance(settleTime)
	vms := ownedBy(t, p, o)
	var ids []provider.ID
	for _, vm := range vms {
		ids = append(ids, vm.ID)
	}
	if len(vms) != 1 || vms[0].ID != vmid {
		t.Fatalf("claim %s/%s owns VMs %v, want exactly [%s]", o.Namespace, o.Name, ids, vmid)
	}
	if !vms[0].OperatorTagged {
		t.Errorf("VM %s of %s/%s does not carry the operator tag %q (tags %v)", vmid, o.Namespace, o.Name, h.Signer.OperatorTag(), vms[0].Tags)
	}
}

// expectNoVM lets the backend settle, then checks that o owns no VM.
func expectNoVM(t *testing.T, h *Harness, p provider.Provider, o provider.Owner) {
	t.Helper()
	h.Advance(settleTime)
	if vms := ownedBy(t, p, o); len(vms) != 0 {
		t.Fatalf("claim %s/%s still owns VM %v", o.Namespace, o.Name, vms[0].ID)
	}
}

// storedContains says whether any data at rest on the backend contains s.
func storedContains(t *testing.T, h *Harness, s string) bool {
	t.Helper()
	for _, d := range h.StoredData(t) {
		if strings.Contains(d, s) {
			return true
		}
	}
	return false
}

// atPhase is a drive's stop condition: the VM has reached phase ph.
func atPhase(ph provider.Phase) func(*provider.EnsureResult) bool {
	return func(r *provider.EnsureResult) bool { return r.Phase == ph }
}

// atPhaseInFlight is a drive's stop condition: the VM is in phase ph with
// a task of it in flight.
func atPhaseInFlight(ph provider.Phase) func(*provider.EnsureResult) bool {
	return func(r *provider.EnsureResult) bool { return r.Phase == ph && r.Progress.Task != nil }
}

// transientRetries is how a loop of calls the suite drives answers an
// error: the contract lets a backend fail transiently, so such an error is
// retried after a simulated second, up to maxTransient in a row; any other
// error ends the test.
type transientRetries struct{ inARow int }

// retry reports whether the call (described by call) that returned err is
// to be made again, having moved h's clock and *elapsed on by a second. A
// nil err resets the count and is not retried.
func (r *transientRetries) retry(t *testing.T, h *Harness, elapsed *time.Duration, err error, call string) bool {
	t.Helper()
	if err == nil {
		r.inARow = 0
		return false
	}
	if provider.Classify(err) != provider.ClassTransient || r.inARow >= maxTransient {
		t.Fatalf("%s: %v (class %s)", call, err, provider.Classify(err))
	}
	r.inARow++
	h.Advance(time.Second)
	*elapsed += time.Second
	return true
}

// deleteUntilDone calls DeleteVM, honouring RetryAfter, until Done.
func deleteUntilDone(t *testing.T, h *Harness, p provider.Provider, o provider.Owner, prev provider.Progress) *provider.DeleteResult {
	t.Helper()
	return removalUntilDone(t, h, o, prev, "DeleteVM", func(prog provider.Progress) (*provider.DeleteResult, error) {
		return p.DeleteVM(t.Context(), o, prog)
	})
}

// removalUntilDone calls remove (the call named name: DeleteVM or
// RemoveCloudInitMedia, which both answer a DeleteResult) with the
// persisted progress, honouring RetryAfter, until Done.
func removalUntilDone(t *testing.T, h *Harness, o provider.Owner, prev provider.Progress, name string, remove func(provider.Progress) (*provider.DeleteResult, error)) *provider.DeleteResult {
	t.Helper()
	prog := persist(t, prev)
	var elapsed time.Duration
	var retries transientRetries
	for i := 0; i < maxSteps && elapsed <= maxSimulated; i++ {
		res, err := remove(prog)
		if retries.retry(t, h, &elapsed, err, fmt.Sprintf("%s(%s/%s, %+v)", name, o.Namespace, o.Name, prog)) {
			continue
		}
		if res == nil {
			t.Fatalf("%s(%s/%s, %+v) returned neither a result nor an error", name, o.Namespace, o.Name, prog)
		}
		if res.RetryAfter < 0 {
			t.Errorf("%s: negative RetryAfter %s", name, res.RetryAfter)
		}
		if res.Done {
			if res.Progress.Task != nil {
				t.Errorf("%s: Done with a task in flight: %+v", name, *res.Progress.Task)
			}
			return res
		}
		prog = persist(t, res.Progress)
		h.Advance(res.RetryAfter)
		elapsed += res.RetryAfter
	}
	t.Fatalf("%s(%s/%s): not Done after %d calls and %s", name, o.Namespace, o.Name, maxSteps, elapsed)
	return nil
}

// expectDoneAtOnce checks that DeleteVM reports Done on its first call.
func expectDoneAtOnce(t *testing.T, p provider.Provider, o provider.Owner, prev provider.Progress, what string) {
	t.Helper()
	res, err := p.DeleteVM(t.Context(), o, persist(t, prev))
	if err != nil {
		t.Fatalf("DeleteVM %s: %v", what, err)
	}
	if !res.Done {
		t.Fatalf("DeleteVM %s: not Done (%s)", what, res.Message)
	}
}

// waitPower advances time until GetVM reports want, bounded.
func waitPower(t *testing.T, h *Harness, p provider.Provider, ref provider.VMRef, want provider.PowerState) {
	t.Helper()
	var got provider.PowerState
	for i := 0; i < 600; i++ {
		vm, err := p.GetVM(t.Context(), ref)
		if err != nil {
			t.Fatalf("GetVM(%v): %v", ref.ID, err)
		}
		if got = vm.Power; got == want {
			return
		}
		h.Advance(time.Second)
	}
	t.Fatalf("VM %v: power %s after 10 minutes, want %s", ref.ID, got, want)
}

// freeIDs returns the set of VM ids the backend uses.
func usedIDs(t *testing.T, h *Harness, p provider.Provider) map[int]bool {
	t.Helper()
	list, err := p.ListVMs(t.Context())
	if err != nil {
		t.Fatalf("ListVMs: %v", err)
	}
	used := map[int]bool{}
	for _, s := range list {
		used[h.VMID(t, s.ID)] = true
	}
	return used
}

func hasTag(tags []string, want string) bool {
	return slices.ContainsFunc(tags, func(t string) bool { return strings.EqualFold(strings.TrimSpace(t), want) })
}
