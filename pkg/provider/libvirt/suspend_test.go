package libvirt

import (
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestSaveIsNotAPowerOff: the stop event of a managed save leaves the
// domain not marked as having run (a guest power-off would), drops a
// shutdown kept for its agent (a resumed guest is not shut down by an
// older request) and wakes the owner building it, to see it suspended.
func TestSaveIsNotAPowerOff(t *testing.T) {
	const key = "h1/vm"
	owner := provider.Owner{Namespace: "ns", Name: "claim", UID: "u1"}
	var woken []provider.Owner
	p := testProvider(t, nil)
	p.wake = func(o provider.Owner) { woken = append(woken, o) }
	p.builders[key] = owner
	p.keepShutdown(key, true)

	p.lifecycle("h1", "vm", golibvirt.DomainEventStopped, int32(golibvirt.DomainEventStoppedSaved))
	if p.hasRun("h1", "vm") {
		t.Error("a managed save is taken for the guest powering off")
	}
	if p.agentConnected(key) {
		t.Error("a shutdown kept before the save is still due when the resumed guest's agent connects")
	}
	if len(woken) != 1 || woken[0].UID != owner.UID {
		t.Errorf("woken %+v after the save, want the owner building the VM", woken)
	}

	p.lifecycle("h1", "vm", golibvirt.DomainEventStopped, int32(golibvirt.DomainEventStoppedShutdown))
	if !p.hasRun("h1", "vm") {
		t.Error("a guest power-off after the resume is not seen")
	}
}

// suspendedDomain is a configured VM of owner, shut off with a managed
// save image, on the unit tests' host h1, which no call reaches.
func suspendedDomain(p *Provider, vmid int) *domain {
	d := &domain{host: p.hostNamed("h1"), dom: golibvirt.Domain{Name: p.signer.VMName(vmid)}, meta: vmMeta{ID: vmid, Tags: p.signer.Tags()},
		state: golibvirt.DomainShutoff, reason: int32(golibvirt.DomainShutoffSaved), saved: true}
	d.xml, _ = parseDomain("<domain><name>" + d.dom.Name + "</name><title>hf-ci-1</title></domain>")
	return d
}

// TestEnsureLeavesSuspendedVM: EnsureVM's step reports a suspended VM
// Suspended with no task and no call to libvirt (host h1's socket does
// not exist: any call would fail), also when the events saw it stop as a
// guest power-off does, and drops the owner's reservation: the VM holds
// no host memory.
func TestEnsureLeavesSuspendedVM(t *testing.T) {
	p := testProvider(t, nil)
	owner := provider.Owner{Namespace: "ns", Name: "claim", UID: "u1"}
	d := suspendedDomain(p, 120)
	p.lifecycle("h1", d.dom.Name, golibvirt.DomainEventStopped, int32(golibvirt.DomainEventStoppedShutdown))
	p.reservations[owner.UID] = &reservation{vmid: 120, host: "h1", memory: 1 << 30}
	spec := &provider.VMSpec{Owner: owner, Name: "hf-ci-1"}
	res := &provider.EnsureResult{Progress: provider.Progress{ID: FormatID(120), Node: "h1", Building: true}}
	res, err := p.step(t.Context(), spec, &TemplateRef{Domain: "template"}, d, res)
	if err != nil {
		t.Fatalf("EnsureVM of a suspended VM: %v", err)
	}
	if res.Phase != provider.PhaseSuspended || res.Progress.Task != nil || res.RetryAfter <= 0 {
		t.Errorf("EnsureVM of a suspended VM: phase %s, task %+v, retry after %s; want %s, no task, a pace", res.Phase, res.Progress.Task, res.RetryAfter, provider.PhaseSuspended)
	}
	if got := p.reservedOn("h1"); got != 0 {
		t.Errorf("%d bytes still reserved on h1 for the suspended VM", got)
	}
}

// TestSuspendedSummary: a shut-off domain with a managed save image reads
// as suspended, and as no template when it is no install's; one being
// restored (active, the image not yet deleted) reads as its state says.
func TestSuspendedSummary(t *testing.T) {
	p := testProvider(t, nil)
	d := suspendedDomain(p, 120)
	if s := p.summary(d); s.Power != provider.PowerSuspended || s.Template {
		t.Errorf("suspended VM: %+v, want power %s", s, provider.PowerSuspended)
	}
	d.meta, d.metaErr = vmMeta{}, errNoMeta
	if s := p.summary(d); s.Power != provider.PowerSuspended || s.Template {
		t.Errorf("suspended domain of no install: %+v, want power %s and no template", s, provider.PowerSuspended)
	}
	d.state = golibvirt.DomainPaused
	if s := p.summary(d); s.Power != provider.PowerPaused {
		t.Errorf("domain being restored: %+v, want power %s", s, provider.PowerPaused)
	}
	d.state, d.saved = golibvirt.DomainShutoff, false
	if s := p.summary(d); s.Power != provider.PowerStopped || !s.Template {
		t.Errorf("shut-off domain of no install without a saved state: %+v, want a stopped template", s)
	}
}

// TestPendingPower: while a save or a restore of this process runs, the
// same request again is nil (asked already), the opposite one a transient
// error, and other power actions go their way; a failed job's error is
// returned once, to the next request of its kind; a finished job is
// forgotten.
func TestPendingPower(t *testing.T) {
	failure := provider.Errorf(provider.ClassResource, "InsufficientCapacity", "no room for the image")
	cases := []struct {
		name    string
		job     provider.PowerAction
		err     error // the job's error; nil: it still runs
		ask     provider.PowerAction
		handled bool
		class   provider.Class // of the answer's error; "" for none
	}{
		{name: "suspend while saving", job: provider.PowerSuspend, ask: provider.PowerSuspend, handled: true},
		{name: "resume while saving", job: provider.PowerSuspend, ask: provider.PowerResume, handled: true, class: provider.ClassTransient},
		{name: "power on while saving", job: provider.PowerSuspend, ask: provider.PowerOn, handled: true, class: provider.ClassTransient},
		{name: "power off while saving", job: provider.PowerSuspend, ask: provider.PowerOff},
		{name: "power on while restoring", job: provider.PowerResume, ask: provider.PowerOn, handled: true},
		{name: "suspend while restoring", job: provider.PowerResume, ask: provider.PowerSuspend, handled: true, class: provider.ClassTransient},
		{name: "suspend after a failed save", job: provider.PowerSuspend, err: failure, ask: provider.PowerSuspend, handled: true, class: provider.ClassResource},
		{name: "resume after a failed save", job: provider.PowerSuspend, err: failure, ask: provider.PowerResume},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := testProvider(t, nil)
			d := suspendedDomain(p, 120)
			release := make(chan struct{})
			p.startPowerJob(d, c.job, func() error {
				<-release
				return c.err
			}, func(err error) error { return err })
			if c.err != nil {
				close(release)
				waitJob(t, p, d.key())
			}
			handled, err := p.pendingPower(d, c.ask)
			var class provider.Class
			if err != nil {
				class = provider.Classify(err)
			}
			if handled != c.handled || class != c.class {
				t.Errorf("pendingPower(%s) = %v, %v (class %s); want handled %v, class %q", c.ask, handled, err, provider.Classify(err), c.handled, c.class)
			}
			if c.err != nil {
				if handled, err := p.pendingPower(d, c.ask); handled || err != nil {
					t.Errorf("pendingPower(%s) again = %v, %v; want the failure reported once", c.ask, handled, err)
				}
				return
			}
			close(release)
			waitJob(t, p, d.key())
			if handled, err := p.pendingPower(d, c.job); handled || err != nil {
				t.Errorf("pendingPower(%s) after the job succeeded = %v, %v; want it forgotten", c.job, handled, err)
			}
		})
	}
}

// waitJob waits until the power job of key has returned.
func waitJob(t *testing.T, p *Provider, key string) {
	t.Helper()
	p.mu.Lock()
	job := p.powerJobs[key]
	p.mu.Unlock()
	if job == nil {
		return
	}
	select {
	case <-job.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the power job never returned")
	}
}

// TestSaveAndRestoreUnbounded: the watchdog leaves a managed save and a
// restore (DomainCreateWithFlags) to run as long as they take, and still
// bounds a boot (DomainCreate) and the QEMU program's calls.
func TestSaveAndRestoreUnbounded(t *testing.T) {
	for _, c := range []struct {
		call sentCall
		want bool
	}{
		{sentCall{program: remoteProgram, procedure: procDomainManagedSave}, true},
		{sentCall{program: remoteProgram, procedure: procDomainCreateWithFlags}, true},
		{sentCall{program: remoteProgram, procedure: procStorageVolCreateXMLFrom}, true},
		{sentCall{program: remoteProgram, procedure: 9}, false}, // DomainCreate
		{sentCall{program: qemuProgram, procedure: procDomainManagedSave}, false},
	} {
		if got := c.call.unbounded(); got != c.want {
			_, name := callName(c.call.program, c.call.procedure)
			t.Errorf("%s (program %#x) unbounded = %v, want %v", name, c.call.program, got, c.want)
		}
	}
}
