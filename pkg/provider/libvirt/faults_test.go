package libvirt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/tinyguest"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// faultOwner is the owner of a fault test's VM.
var faultOwner = provider.Owner{Namespace: "faults", Name: "claim", UID: "7d0f5b0e-0000-4000-8000-000000000001",
	CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}

// faultSpec is a small VM of the world's template.
func (w *world) faultSpec() *provider.VMSpec {
	return &provider.VMSpec{Owner: faultOwner, Name: "hf-fault", Source: w.source, MemoryBytes: 256 << 20,
		Network:   provider.NetworkSpec{MACAddress: "02:48:46:ff:00:01"},
		CloudInit: provider.CloudInit{UserData: []byte("#cloud-config\n{}\n")}}
}

// drive calls EnsureVM until done holds for a result, honouring
// RetryAfter (in slices: the backend's time is real) and retrying
// transient errors; it returns the last result and the first
// non-transient error.
func drive(t *testing.T, p provider.Provider, spec *provider.VMSpec, prog *provider.Progress, done func(*provider.EnsureResult) bool) (*provider.EnsureResult, error) {
	t.Helper()
	transient := 0
	for i := 0; i < 400; i++ {
		res, err := p.EnsureVM(t.Context(), spec, *prog)
		if err != nil {
			if provider.Classify(err) != provider.ClassTransient || transient >= 5 {
				return nil, err
			}
			transient++
			t.Logf("transient: %v", err)
			time.Sleep(advanceSlice)
			continue
		}
		transient = 0
		*prog = res.Progress
		if done(res) {
			return res, nil
		}
		time.Sleep(min(res.RetryAfter, advanceSlice))
	}
	t.Fatalf("EnsureVM(%s) never got there; progress %+v", spec.Name, *prog)
	return nil, nil
}

func phaseIs(ph provider.Phase) func(*provider.EnsureResult) bool {
	return func(r *provider.EnsureResult) bool { return r.Phase == ph }
}

// deleted drives DeleteVM of owner's VM until it is Done.
func deleted(t *testing.T, p provider.Provider, owner provider.Owner, prog provider.Progress) {
	t.Helper()
	for i := 0; ; i++ {
		res, err := p.DeleteVM(t.Context(), owner, prog)
		if err != nil {
			t.Fatalf("DeleteVM: %v", err)
		}
		if res.Done {
			return
		}
		if i > 20 {
			t.Fatal("DeleteVM never Done")
		}
		prog = res.Progress
	}
}

// ownedVMs counts the VMs whose marker verifies for o.
func ownedVMs(t *testing.T, p provider.Provider, o provider.Owner) int {
	t.Helper()
	list, err := p.ListVMs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range list {
		vm, err := p.GetVM(t.Context(), provider.VMRef{ID: s.ID, Node: s.Node})
		if err == nil && vm.Owner != nil && vm.Owner.UID == o.UID {
			n++
		}
	}
	return n
}

// TestLibvirtdRestartMidClone: libvirtd dies (SIGKILL) and comes back
// while a VM is being cloned and again while it boots; the provider's
// connection breaks, the calls in between fail transiently, and the VM
// still ends up Running, once, at the id it was cloned to.
func TestLibvirtdRestartMidClone(t *testing.T) {
	w := newWorld(t)
	p := w.provider(t, w.cfg)
	spec := w.faultSpec()
	var prog provider.Progress
	cloning, err := drive(t, p, spec, &prog, phaseIs(provider.PhaseCloning))
	if err != nil {
		t.Fatal(err)
	}
	w.d.Restart(t)
	w.conn = w.d.Dial(t)
	booting, err := drive(t, p, spec, &prog, phaseIs(provider.PhaseBooting))
	if err != nil {
		t.Fatalf("after the restart mid-clone: %v", err)
	}
	w.d.Restart(t)
	running, err := drive(t, p, spec, &prog, phaseIs(provider.PhaseRunning))
	if err != nil {
		t.Fatalf("after the restart while booting: %v", err)
	}
	if running.Progress.ID != cloning.Progress.ID || booting.Progress.ID != cloning.Progress.ID {
		t.Errorf("the VM moved: cloned at %s, booted at %s, running at %s", cloning.Progress.ID, booting.Progress.ID, running.Progress.ID)
	}
	if n := ownedVMs(t, p, faultOwner); n != 1 {
		t.Errorf("the owner has %d VMs, want 1", n)
	}
}

// TestUnreachableHost: a second host whose libvirtd socket is dead is
// reported offline by Probe and skipped by placement; the VM runs on the
// live host and the listing still works.
func TestUnreachableHost(t *testing.T) {
	w := newWorld(t)
	cfg := w.cfg
	s := *cfg.Settings.(*ClusterSettings)
	s.Hosts = []Host{{Name: "dead", URI: "qemu:///system?socket=" + filepath.Join(w.d.Dir(), "no-such-daemon.sock")}, s.Hosts[0]}
	cfg.Settings = &s
	p := w.provider(t, cfg)
	info, err := p.Probe(t.Context())
	if err != nil {
		t.Fatalf("Probe with one host down: %v", err)
	}
	online := map[string]bool{}
	for _, n := range info.Nodes {
		online[n.Name] = n.Online
		if n.Name == worldHost && (n.CPUs <= 0 || n.MemoryBytes <= 0) {
			t.Errorf("live host: %+v", n)
		}
	}
	if len(online) != 2 || online["dead"] || !online[worldHost] {
		t.Errorf("Probe nodes %+v: want dead offline and %s online", info.Nodes, worldHost)
	}
	spec := w.faultSpec()
	var prog provider.Progress
	res, err := drive(t, p, spec, &prog, phaseIs(provider.PhaseRunning))
	if err != nil {
		t.Fatal(err)
	}
	if res.Progress.Node != worldHost {
		t.Errorf("placed on %s, want the live host %s", res.Progress.Node, worldHost)
	}
	if n := ownedVMs(t, p, faultOwner); n != 1 {
		t.Errorf("ListVMs/GetVM with a host down: the owner has %d VMs, want 1", n)
	}

	// With no host answering, placement knows nothing of capacity: the
	// claim waits for a host (transient, unreachable), it is not told the
	// cluster is full.
	s.Hosts = s.Hosts[:1]
	alone := w.provider(t, cfg)
	other := w.faultSpec()
	other.Owner.UID, other.Name = "7d0f5b0e-0000-4000-8000-000000000002", "hf-fault-2"
	_, err = alone.EnsureVM(t.Context(), other, provider.Progress{})
	if provider.Classify(err) != provider.ClassTransient || !errors.Is(err, provider.ErrUnreachable) || errors.Is(err, provider.ErrNoCapacity) {
		t.Errorf("EnsureVM with no host answering: %v (class %s), want a transient %v", err, provider.Classify(err), provider.ErrUnreachable)
	}
}

// TestStoragePoolFull: a clone into a pool with no room is refused with a
// capacity error naming the pool, and the VM's domain is deleted cleanly.
func TestStoragePoolFull(t *testing.T) {
	w := newWorld(t)
	w.d.DefineSmallPool(t, "small", 1<<20)
	cfg := w.cfg
	s := *cfg.Settings.(*ClusterSettings)
	s.VolumePool = "small"
	cfg.Settings = &s
	p := w.provider(t, cfg)
	spec := w.faultSpec()
	var prog provider.Progress
	_, err := drive(t, p, spec, &prog, phaseIs(provider.PhaseConfiguring))
	if err == nil {
		t.Fatal("the clone went on into a full pool")
	}
	if provider.Classify(err) != provider.ClassResource || !errors.Is(err, provider.ErrNoCapacity) || !strings.Contains(err.Error(), "small") {
		t.Fatalf("clone into a full pool: %v (class %s), want a capacity error naming pool small", err, provider.Classify(err))
	}
	deleted(t, p, faultOwner, prog)
	if n := ownedVMs(t, p, faultOwner); n != 0 {
		t.Errorf("the owner still has %d VMs", n)
	}
}

// TestLifecycleEventsWakeOwner: a VM being built that stops (here its
// guest powers off while it boots) wakes its owner through Deps.Wake,
// from the host's lifecycle events.
func TestLifecycleEventsWakeOwner(t *testing.T) {
	w := newWorld(t)
	woken := make(chan provider.Owner, 4)
	p, err := New(w.cfg, provider.Deps{Signer: w.signer, Wake: func(o provider.Owner) { woken <- o }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	spec := w.faultSpec()
	var prog provider.Progress
	if _, err := drive(t, p, spec, &prog, phaseIs(provider.PhaseBooting)); err != nil {
		t.Fatal(err)
	}
	dom := w.domainOf(t, prog.ID)
	if err := w.conn.DomainDestroy(dom); err != nil {
		t.Fatal(err)
	}
	select {
	case o := <-woken:
		if o.UID != faultOwner.UID {
			t.Errorf("woke %+v", o)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no wake after the VM being built stopped")
	}
	if !p.hasRun(worldHost, dom.Name) {
		t.Error("the provider's view does not show the domain stopped")
	}
}

// TestHungLibvirtdCallsTimeOut: a libvirtd that stops answering (SIGSTOP:
// its connections stay open, as behind a partition) fails the calls made
// to it once RequestTimeout passes, as unreachable, instead of holding
// them for ever; once it answers again the provider connects anew. The
// calls are measured as the hypervisor API metrics count them: answered
// (200), answered with an error (500), or never (0).
func TestHungLibvirtdCallsTimeOut(t *testing.T) {
	w := newWorld(t)
	cfg := w.cfg
	cfg.RequestTimeout = time.Second
	obs := &recordingObserver{}
	p, err := New(cfg, provider.Deps{Signer: w.signer, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if _, err := p.ListVMs(t.Context()); err != nil {
		t.Fatalf("ListVMs before the hang: %v", err)
	}
	if _, err := p.GetVM(t.Context(), provider.VMRef{ID: FormatID(150), Node: worldHost}); !errors.Is(err, provider.ErrNotFound) {
		t.Fatalf("GetVM of a VM that is not there: %v, want not found", err)
	}
	w.d.Freeze(t)
	_, err = p.ListVMs(t.Context())
	if err == nil || provider.Classify(err) != provider.ClassTransient || !errors.Is(err, provider.ErrUnreachable) {
		t.Fatalf("ListVMs from a hung libvirtd: %v, want a transient unreachable error", err)
	}
	if _, err := p.Probe(t.Context()); !errors.Is(err, provider.ErrUnreachable) {
		t.Fatalf("Probe with the only host hung: %v, want it unreachable", err)
	}
	w.d.Thaw(t)
	if _, err := p.ListVMs(t.Context()); err != nil {
		t.Fatalf("ListVMs once libvirtd answers again: %v", err)
	}
	for _, want := range []string{"remote ConnectOpen 200", "remote ConnectListAllDomains 200", "remote ConnectListAllDomains 0"} {
		if !obs.saw(want) {
			t.Errorf("the observer saw no call %q; it saw %v", want, obs.calls())
		}
	}
	if !obs.sawCode(500) {
		t.Errorf("the observer saw no error reply; it saw %v", obs.calls())
	}
}

// TestProbeGivesUpAtItsDeadline: a probe of a libvirtd that stops
// answering ends when its context does (the HypervisorCluster's
// spec.probeTimeout), with the host offline and unreachable, although
// the connection's own request timeout is far away: go-libvirt takes no
// context, so the call goes on in the background, and is answered once
// the daemon is thawed.
func TestProbeGivesUpAtItsDeadline(t *testing.T) {
	w := newWorld(t)
	cfg := w.cfg
	cfg.RequestTimeout = time.Hour
	p, err := New(cfg, provider.Deps{Signer: w.signer})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if _, err := p.Probe(t.Context()); err != nil {
		t.Fatalf("Probe before the hang: %v", err)
	}
	w.d.Freeze(t)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err = p.Probe(ctx)
	w.d.Thaw(t)
	if !errors.Is(err, provider.ErrUnreachable) || !strings.Contains(err.Error(), "did not answer the probe in time") {
		t.Fatalf("Probe of a hung libvirtd: %v, want its host unreachable at the probe's deadline", err)
	}
	if _, err := p.Probe(t.Context()); err != nil {
		t.Fatalf("Probe once libvirtd answers again: %v", err)
	}
}

// TestClosedProviderStaysClosed: a provider the registry closed (its
// cluster's configuration changed, or the cluster was deleted) fails the
// calls that still come, as a transient unreachable error the caller
// retries with the cluster's current provider, instead of connecting
// again: a connection opened then would never be closed, and its event
// subscriptions would follow the host for good.
func TestClosedProviderStaysClosed(t *testing.T) {
	w := newWorld(t)
	obs := &recordingObserver{}
	p, err := New(w.cfg, provider.Deps{Signer: w.signer, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.ListVMs(t.Context()); err != nil {
		t.Fatalf("ListVMs before the close: %v", err)
	}
	p.Close()
	opens := obs.count("remote ConnectOpen 200")
	_, err = p.ListVMs(t.Context())
	if !errors.Is(err, provider.ErrUnreachable) || provider.Classify(err) != provider.ClassTransient || !strings.Contains(err.Error(), "was closed") {
		t.Fatalf("ListVMs on a closed provider: %v, want a transient error saying it was closed", err)
	}
	if _, err := p.Probe(t.Context()); err == nil {
		t.Fatal("Probe on a closed provider succeeded")
	}
	if n := obs.count("remote ConnectOpen 200"); n != opens {
		t.Fatalf("the closed provider connected again (%d opens, %d before)", n, opens)
	}
}

// TestCloseDoesNotCrashLibvirtd: a provider that closes its connection
// (a HypervisorCluster edited or deleted, the operator stopping) must not
// take the host's libvirtd down. libvirtd 9.0 crashes when a client's
// event callback deregistration is still being handled as its close is
// (host.go, hangUp), which the provider caused by stopping its event
// subscriptions before it closed: under load, a few thousand closes
// crashed the daemon within seconds. Closed in the right order, no
// deregistration reaches the daemon at all, which the calls the provider
// reports show deterministically; the daemon is alive after the closes.
func TestCloseDoesNotCrashLibvirtd(t *testing.T) {
	w := newWorld(t)
	obs := &recordingObserver{}
	for i := range 40 {
		p, err := New(w.cfg, provider.Deps{Signer: w.signer, Observer: obs})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Probe(t.Context()); err != nil {
			t.Fatalf("Probe %d: %v", i, err)
		}
		p.Close()
	}
	for _, c := range obs.calls() {
		if strings.Contains(c, "ConnectDomainEventCallbackDeregisterAny") {
			t.Fatalf("closing the provider sent %q: the deregistration races libvirtd's own cleanup of the closed client", c)
		}
	}
	if !obs.saw("remote ConnectClose 200") {
		t.Errorf("the provider never closed its connection: it reported %v", obs.calls())
	}
	if !w.d.Running() {
		t.Fatal("libvirtd is not running after the provider's closes")
	}
}

// recordingObserver keeps the calls a provider reports, as
// "method endpoint code".
type recordingObserver struct {
	mu  sync.Mutex
	got []string
}

func (o *recordingObserver) APICall(method, endpoint string, code int, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got = append(o.got, fmt.Sprintf("%s %s %d", method, endpoint, code))
}

func (o *recordingObserver) CloneQueue(int) {}

func (o *recordingObserver) calls() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.got)
}

func (o *recordingObserver) saw(call string) bool { return slices.Contains(o.calls(), call) }

func (o *recordingObserver) count(call string) int {
	n := 0
	for _, c := range o.calls() {
		if c == call {
			n++
		}
	}
	return n
}

func (o *recordingObserver) sawCode(code int) bool {
	return slices.ContainsFunc(o.calls(), func(c string) bool { return strings.HasSuffix(c, " "+strconv.Itoa(code)) })
}

// TestFullCopyInterruptedByRestart: the operator restarts while libvirt
// writes a full copy of the template's disk. libvirt creates the volume
// before it writes it, so the restarted provider finds the disk: it must
// wait for the copy to end (the pool refuses to refresh while a volume is
// being written) instead of booting a half-written disk. The copy, the
// qemu-img that libvirtd runs, is held stopped while the new provider
// looks.
func TestFullCopyInterruptedByRestart(t *testing.T) {
	w := newWorld(t)
	// A template whose disk holds 256 MiB of data, so that qemu-img
	// copies for a while (zeros it would skip).
	raw := filepath.Join(w.d.Dir(), "big.raw")
	f, err := os.Create(raw)
	if err != nil {
		t.Fatal(err)
	}
	block := bytes.Repeat([]byte{1}, 1<<20)
	for range 256 {
		if _, err := f.Write(block); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(w.d.Dir(), worldImages, "big.qcow2")
	if out, err := exec.Command("qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", raw, disk).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v: %s", err, out)
	}
	images, err := w.conn.StoragePoolLookupByName(worldImages)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.conn.StoragePoolRefresh(images, 0); err != nil {
		t.Fatal(err)
	}
	doc, err := tinyguest.Template(tinyguest.Options{Name: "big", Image: guestImage.img, Disk: disk, Network: worldNetwork}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.conn.DomainDefineXML(doc); err != nil {
		t.Fatal(err)
	}
	cfg := w.cfg
	s := *cfg.Settings.(*ClusterSettings)
	s.FullCopies = true
	cfg.Settings = &s
	spec := w.faultSpec()
	spec.Source = provider.TemplateSource{Linked: true, Settings: &TemplateRef{Domain: "big"}}

	before := w.provider(t, cfg)
	caught := w.d.StopNext(t, "qemu-img", time.Minute)
	var prog provider.Progress
	if _, err := drive(t, before, spec, &prog, func(r *provider.EnsureResult) bool { return strings.Contains(r.Message, "copying") }); err != nil {
		t.Fatal(err)
	}
	resume := caught()

	// The restart: a new provider, with nothing of the first one's memory.
	after := w.provider(t, cfg)
	for range 3 {
		res, err := after.EnsureVM(t.Context(), spec, prog)
		if err != nil {
			t.Fatalf("EnsureVM after the restart, the copy held: %v", err)
		}
		if res.Phase != provider.PhaseCloning || !strings.Contains(res.Message, "began before a restart") {
			t.Fatalf("EnsureVM after the restart, the copy held: phase %s (%s), want it waiting for the copy", res.Phase, res.Message)
		}
		prog = res.Progress
	}
	resume()
	res, err := drive(t, after, spec, &prog, phaseIs(provider.PhaseRunning))
	if err != nil {
		t.Fatalf("after the copy ended: %v", err)
	}
	vol, err := w.conn.StorageVolLookupByName(images, diskVolume(t, w, res.Progress.ID))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, allocation, err := w.conn.StorageVolGetInfo(vol); err != nil || allocation < 256<<20 {
		t.Errorf("the VM's disk holds %d bytes (%v), want the template's 256 MiB copied", allocation, err)
	}
}

// diskVolume is the volume name of VM id's disk, from its definition.
func diskVolume(t *testing.T, w *world, id provider.ID) string {
	t.Helper()
	doc, err := w.conn.DomainGetXMLDesc(w.domainOf(t, id), 0)
	if err != nil {
		t.Fatal(err)
	}
	x, err := parseDomain(doc)
	if err != nil {
		t.Fatal(err)
	}
	disk, err := bootDisk(x)
	if err != nil || disk.Source == nil || disk.Source.Volume == nil {
		t.Fatalf("VM %s has no volume disk: %v", id, err)
	}
	return disk.Source.Volume.Volume
}
