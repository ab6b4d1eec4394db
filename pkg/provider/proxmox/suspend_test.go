package proxmox

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// writes counts the calls that change something on the cluster.
func (r *recorder) writes() int {
	return r.count(http.MethodPost, "") + r.count(http.MethodPut, "") + r.count(http.MethodDelete, "")
}

// waitTask advances the clocks until the simulator reports task done.
func (e *env) waitTask(task *provider.Task) {
	e.t.Helper()
	for range 120 {
		for _, ts := range e.state().Tasks {
			if ts.UPID == task.ID && !ts.Running {
				if ts.ExitStatus != "OK" {
					e.t.Fatalf("%s task: %s", task.Operation, ts.ExitStatus)
				}
				return
			}
		}
		e.advance(time.Second)
	}
	e.t.Fatalf("the %s task did not end in two minutes", task.Operation)
}

// power is GetVM's and ListVMs' power of the VM at ref.
func (e *env) power(ref provider.VMRef) (provider.PowerState, provider.PowerState) {
	e.t.Helper()
	vm, err := e.p.GetVM(context.Background(), ref)
	if err != nil {
		e.t.Fatal(err)
	}
	list, err := e.p.ListVMs(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	for _, s := range list {
		if s.ID == ref.ID {
			return vm.Power, s.Power
		}
	}
	e.t.Fatalf("ListVMs lacks %s", ref.ID)
	return "", ""
}

// suspendAt builds claim name's VM to phase and has SetPower suspend it
// to disk; with wait, until its task has ended.
func (e *env) suspendAt(name string, phase provider.Phase, wait bool) (*provider.VMSpec, provider.Progress) {
	e.t.Helper()
	spec := testSpec(name, "uid-"+name)
	d := e.ensure(e.p, spec, provider.Progress{}, phase, 200)
	task, err := e.p.SetPower(context.Background(), spec.Owner, d.prog.VMRef(), provider.PowerSuspend)
	if err != nil || task == nil || task.Operation != opSuspend {
		e.t.Fatalf("suspend: %+v %v", task, err)
	}
	if wait {
		e.waitTask(task)
	}
	return spec, d.prog
}

// TestSuspendLockStates: the lock of a suspend to disk decides what the
// provider reports. While the memory is saved ("lock: suspending") the VM
// still runs and EnsureVM waits; once "lock: suspended" GetVM and ListVMs
// read Suspended (the status says stopped), EnsureVM is Suspended with no
// write, and every power action but on/resume leaves it. PowerOn resumes
// (status/resume, not start); the resumed guest is the same (its file,
// its address), and the guest's memory was at rest in the state volume
// only while it was suspended.
//
// Mutation: reading only the status for the power (powerState ignoring
// the lock) fails the Suspended reads; sending status/start for PowerOn of
// a suspended VM fails the operation check.
func TestSuspendLockStates(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	spec := testSpec("runner-z", "uid-zzzz")
	d := e.ensure(e.p, spec, provider.Progress{}, provider.PhaseRunning, 200)
	// Once more: the call that follows the ISO's deletion (started with
	// its eject) reads no lock, and Running is where it leaves the VM.
	d = e.ensure(e.p, spec, d.prog, provider.PhaseRunning, 5)
	ref, vmid := d.prog.VMRef(), mustVMID(d.prog.ID)
	secret := []byte("standby-mark-0c6e")
	if err := e.p.PlaceGuestFile(ctx, spec.Owner, ref, provider.GuestFile{Path: "/run/hyperfleet/mark", Content: secret}); err != nil {
		t.Fatal(err)
	}

	task, err := e.p.SetPower(ctx, spec.Owner, ref, provider.PowerSuspend)
	if err != nil || task == nil || task.Operation != opSuspend || !strings.Contains(task.ID, ":qmsuspend:") {
		t.Fatalf("suspend: %+v %v", task, err)
	}
	// 4 GiB at the realistic preset's 1 s plus 1 s per GiB: still saving.
	e.advance(2 * time.Second)
	if got := e.vm(vmid).Lock; got != lockSuspending {
		t.Fatalf("lock while saving: %q", got)
	}
	if get, _ := e.power(ref); get != provider.PowerRunning {
		t.Errorf("GetVM power while saving: %s, want %s", get, provider.PowerRunning)
	}
	e.obs.reset()
	res, err := e.p.EnsureVM(ctx, spec, d.prog)
	if err != nil || res.Phase != provider.PhaseSuspended || res.RetryAfter == 0 || res.Progress.Task != nil || e.obs.writes() != 0 {
		t.Fatalf("EnsureVM while saving: %+v %v (%d writes)", res, err, e.obs.writes())
	}
	if task, err := e.p.SetPower(ctx, spec.Owner, ref, provider.PowerSuspend); err != nil || task != nil {
		t.Fatalf("a second suspend while saving: %+v %v", task, err)
	}
	e.waitTask(task)
	if !strings.Contains(e.stateJSON(), string(secret)) {
		t.Error("the suspended guest's memory is not at rest in its state volume")
	}
	if get, list := e.power(ref); get != provider.PowerSuspended || list != provider.PowerSuspended {
		t.Errorf("power when suspended: GetVM %s, ListVMs %s; want %s", get, list, provider.PowerSuspended)
	}
	for _, p := range []*Provider{e.p, e.newProvider(e.cfg)} {
		e.obs.reset()
		res, err := p.EnsureVM(ctx, spec, d.prog)
		if err != nil || res.Phase != provider.PhaseSuspended || res.RetryAfter != 0 || res.Progress.Task != nil || e.obs.writes() != 0 {
			t.Fatalf("EnsureVM when suspended: %+v %v (%d writes)", res, err, e.obs.writes())
		}
	}
	for _, a := range []provider.PowerAction{provider.PowerOff, provider.PowerShutdown, provider.PowerSuspend} {
		if task, err := e.p.SetPower(ctx, spec.Owner, ref, a); err != nil || task != nil {
			t.Fatalf("%s of a suspended VM: %+v %v", a, task, err)
		}
	}
	if e.vm(vmid).Lock != lockSuspended {
		t.Fatal("a power action changed the suspended VM")
	}

	task, err = e.p.SetPower(ctx, spec.Owner, ref, provider.PowerOn)
	if err != nil || task == nil || task.Operation != opResume || !strings.Contains(task.ID, ":qmresume:") {
		t.Fatalf("PowerOn of a suspended VM: %+v %v", task, err)
	}
	e.waitTask(task)
	if strings.Contains(e.stateJSON(), string(secret)) {
		t.Error("the resumed guest's memory is still on storage")
	}
	d = e.ensure(e.p, spec, d.prog, provider.PhaseRunning, 20)
	if len(d.res.Addresses) == 0 || d.res.Addresses[0] != e.vm(vmid).IPv4 {
		t.Errorf("Running after the resume at %v, the guest at %s", d.res.Addresses, e.vm(vmid).IPv4)
	}
	if got, _, err := e.sim.GuestFile(ctx, vmid, "/run/hyperfleet/mark"); err != nil || string(got) != string(secret) {
		t.Errorf("the resumed guest holds %q, %v", got, err)
	}
	if task, err := e.p.SetPower(ctx, spec.Owner, ref, provider.PowerResume); err != nil || task != nil {
		t.Fatalf("resume of a running VM: %+v %v", task, err)
	}
}

// TestSuspendedWhileBooting: a VM suspended before its guest reported an
// address is Suspended (its ISO stays: no config change reaches a
// suspended VM); resumed, it is Booting until the agent answers, then
// Running with the ISO ejected.
func TestSuspendedWhileBooting(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	spec, prog := e.suspendAt("runner-y", provider.PhaseBooting, true)
	ref, vmid := prog.VMRef(), mustVMID(prog.ID)
	res, err := e.p.EnsureVM(ctx, spec, prog)
	if err != nil || res.Phase != provider.PhaseSuspended {
		t.Fatalf("EnsureVM of a VM suspended while booting: %+v %v", res, err)
	}
	if e.vm(vmid).Config["ide2"] == "none,media=cdrom" {
		t.Fatal("the ISO of the suspended VM was ejected")
	}
	task, err := e.p.SetPower(ctx, spec.Owner, ref, provider.PowerResume)
	if err != nil || task == nil {
		t.Fatalf("resume: %+v %v", task, err)
	}
	e.waitTask(task)
	res, err = e.p.EnsureVM(ctx, spec, res.Progress)
	if err != nil || res.Phase != provider.PhaseBooting {
		t.Fatalf("EnsureVM right after the resume: %+v %v, want Booting", res, err)
	}
	d := e.ensure(e.p, spec, res.Progress, provider.PhaseRunning, 60)
	if len(d.res.Addresses) == 0 || e.vm(vmid).Config["ide2"] != "none,media=cdrom" {
		t.Fatalf("Running after the resume: %+v, ide2 %q", d.res, e.vm(vmid).Config["ide2"])
	}
}

// TestDeleteSuspendedVM: a suspended VM is deleted with one destroy (its
// lock is no obstacle to destroy_vm, which frees the saved state with the
// disks): no stop, no config write; nothing of it is left.
//
// Mutation: waiting on every lock in deleteStep (the suspended one
// included) fails the deletion.
func TestDeleteSuspendedVM(t *testing.T) {
	e := newEnv(t)
	spec, prog := e.suspendAt("runner-x", provider.PhaseRunning, true)
	vmid := mustVMID(prog.ID)
	state := ""
	for _, v := range e.state().Storages {
		for _, vol := range v.Volumes {
			if vol.VMID == vmid && strings.Contains(vol.VolID, "-state-suspend-") {
				state = vol.VolID
			}
		}
	}
	if state == "" {
		t.Fatal("no state volume for the suspended VM")
	}
	e.obs.reset()
	e.remove(e.p, spec.Owner, prog, 30)
	if n := e.obs.count(http.MethodDelete, "/nodes/{node}/qemu/{vmid}"); n != 1 {
		t.Errorf("%d destroys, want 1", n)
	}
	if n := e.obs.count(http.MethodPost, "/nodes/{node}/qemu/{vmid}/status/stop") + e.obs.count(http.MethodPut, "/nodes/{node}/qemu/{vmid}/config"); n != 0 {
		t.Errorf("%d stops and config writes for a suspended VM, want none", n)
	}
	if e.vm(vmid) != nil || e.volume(state) != nil {
		t.Fatalf("VM %d or its state volume %s outlived DeleteVM", vmid, state)
	}
}

// TestFailedSuspend: a suspend whose guest powered off during the save
// fails and leaves "lock: suspending" without a saved state. EnsureVM reads
// the VM as it is (Stopped); DeleteVM, the media removal and DisownVM wait,
// naming the admin's fix (qm unlock), and DeleteVM finishes once the lock is
// gone.
func TestFailedSuspend(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	spec, prog := e.suspendAt("runner-w", provider.PhaseRunning, false)
	ref, vmid := prog.VMRef(), mustVMID(prog.ID)
	if err := e.sim.GuestPowerOff(vmid); err != nil {
		t.Fatal(err)
	}
	e.advance(10 * time.Second)
	if v := e.vm(vmid); v.Lock != lockSuspending || v.Config["vmstate"] != "" || v.Status != "stopped" {
		t.Fatalf("after the failed suspend: lock %q, vmstate %q, %s", v.Lock, v.Config["vmstate"], v.Status)
	}
	res, err := e.p.EnsureVM(ctx, spec, prog)
	if err != nil || res.Phase != provider.PhaseStopped {
		t.Fatalf("EnsureVM after a failed suspend: %+v %v", res, err)
	}
	del, err := e.p.DeleteVM(ctx, spec.Owner, prog)
	if err != nil || del.Done || del.RetryAfter == 0 || !strings.Contains(del.Message, "qm unlock "+strconv.Itoa(vmid)) {
		t.Fatalf("DeleteVM after a failed suspend: %+v %v", del, err)
	}
	rm, err := e.p.RemoveCloudInitMedia(ctx, spec.Owner, prog)
	if err != nil || rm.Done || !strings.Contains(rm.Message, "qm unlock") {
		t.Fatalf("RemoveCloudInitMedia after a failed suspend: %+v %v", rm, err)
	}
	dis, err := e.p.DisownVM(ctx, spec.Owner, ref)
	if err != nil || dis.Done || !strings.Contains(dis.Message, "qm unlock") {
		t.Fatalf("DisownVM after a failed suspend: %+v %v", dis, err)
	}
	// The admin's qm unlock.
	if err := e.sim.Unlock(vmid); err != nil {
		t.Fatal(err)
	}
	e.remove(e.p, spec.Owner, prog, 30)
	if e.vm(vmid) != nil {
		t.Fatal("the VM outlived DeleteVM")
	}
}

// TestSuspendedMediaAndDisown: the media removal of a suspended VM that ran
// to Running deletes nothing of the VM (its ISO is ejected) and is Done;
// DisownVM refuses it, since Proxmox writes no config of a suspended VM,
// and touches nothing.
func TestSuspendedMediaAndDisown(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	spec, prog := e.suspendAt("runner-v", provider.PhaseRunning, true)
	ref, vmid := prog.VMRef(), mustVMID(prog.ID)
	for range 10 {
		res, err := e.p.RemoveCloudInitMedia(ctx, spec.Owner, prog)
		if err != nil {
			t.Fatalf("RemoveCloudInitMedia of a suspended VM: %v", err)
		}
		if res.Done {
			break
		}
		prog = res.Progress
		e.advance(res.RetryAfter)
	}
	before := e.vm(vmid)
	if before.Lock != lockSuspended {
		t.Fatalf("the media removal changed the suspended VM: lock %q", before.Lock)
	}
	if _, err := e.p.DisownVM(ctx, spec.Owner, ref); provider.ReasonOf(err) != "Suspended" || provider.Classify(err) != provider.ClassPermanent {
		t.Fatalf("DisownVM of a suspended VM: %v (%s), want a Permanent Suspended error", err, provider.ReasonOf(err))
	}
	if after := e.vm(vmid); after.Description != before.Description || after.Tags != before.Tags {
		t.Fatal("DisownVM changed the suspended VM")
	}
}

// TestPowerCallFor pins SetPower's decision for each action, lock and
// status, and the answers to a VM that changed under a request.
func TestPowerCallFor(t *testing.T) {
	running, stopped := "running", "stopped"
	susp := vmConfig{"lock": lockSuspended, "vmstate": "local-lvm:vm-1-state-suspend-2026-03-04"}
	saving := vmConfig{"lock": lockSuspending, "vmstate": "local-lvm:vm-1-state-suspend-2026-03-04"}
	failed := vmConfig{"lock": lockSuspending}
	for _, c := range []struct {
		action provider.PowerAction
		cfg    vmConfig
		status string
		op     string
		reason string
	}{
		{provider.PowerSuspend, vmConfig{}, running, opSuspend, ""},
		{provider.PowerSuspend, vmConfig{}, "paused", opSuspend, ""},
		{provider.PowerSuspend, vmConfig{}, stopped, "", "NotRunning"},
		{provider.PowerSuspend, susp, stopped, "", ""},
		{provider.PowerSuspend, saving, running, "", ""},
		{provider.PowerSuspend, failed, stopped, "", "NotRunning"},
		{provider.PowerResume, susp, stopped, opResume, ""},
		{provider.PowerResume, vmConfig{}, running, "", ""},
		{provider.PowerResume, vmConfig{}, stopped, "", "NotSuspended"},
		{provider.PowerOn, susp, stopped, opResume, ""},
		{provider.PowerOn, vmConfig{}, stopped, opStart, ""},
		{provider.PowerOff, susp, stopped, "", ""},
		{provider.PowerShutdown, susp, stopped, "", ""},
		{provider.PowerOff, saving, running, opStop, ""},
		{"hibernate", vmConfig{}, running, "", "InvalidPowerAction"},
	} {
		call, err := powerCallFor(c.action, c.cfg, c.status, 1)
		if call.op != c.op || (err == nil) != (c.reason == "") || (err != nil && (provider.ReasonOf(err) != c.reason || provider.Classify(err) != provider.ClassPermanent)) {
			t.Errorf("%s with %v, %s: op %q, error %v; want op %q, reason %q", c.action, c.cfg, c.status, call.op, err, c.op, c.reason)
		}
	}
	if call, _ := powerCallFor(provider.PowerSuspend, vmConfig{}, running, 1); call.body["todisk"] != 1 {
		t.Errorf("a suspend sends %v, want todisk", call.body)
	}
	notRunning := httpError(&exchange{code: 500, reason: "VM 7 not running"}, http.MethodPost, "/nodes/{node}/qemu/{vmid}/status/suspend")
	if got := powerRefused(opSuspend, 7, notRunning); provider.ReasonOf(got) != "NotRunning" {
		t.Errorf("a suspend refused as not running: %v", got)
	}
	if got := powerRefused(opResume, 7, notRunning); provider.ReasonOf(got) != "NotSuspended" {
		t.Errorf("a resume refused as not running: %v", got)
	}
	if got := powerRefused(opStart, 7, notRunning); got != nil {
		t.Errorf("a start: %v", got)
	}
}
