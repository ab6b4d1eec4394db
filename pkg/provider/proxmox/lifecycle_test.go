package proxmox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestLifecycle drives one VM from nothing to Running and back to nothing,
// checking the hypervisor's state at each landmark and counting API calls.
func TestLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	spec := testSpec("runner-a", "uid-aaaa")

	info, err := e.p.Probe(ctx)
	if err != nil {
		t.Fatalf("Probe: %v", err)
	}
	if info.Version != "9.0.11" || len(info.Nodes) != 1 || !info.Nodes[0].Online || !info.Nodes[0].Allowed || info.InsecureTLS {
		t.Fatalf("Probe: %+v", info)
	}
	if n := info.Nodes[0]; n.MemoryBytes != 64<<30 || n.MemoryUsedBytes != 2<<30 || n.CPUs != 16 || n.StorageBytes == 0 {
		t.Fatalf("node: %+v", n)
	}
	ti, err := e.p.ValidateTemplate(ctx, spec.Source)
	if err != nil {
		t.Fatalf("ValidateTemplate: %v", err)
	}
	if ti.ID != 9000 || ti.Name != "debian-12-ci" || ti.Node != "pve1" || !ti.LinkedCloneSupported || ti.DiskBytes != 32<<30 {
		t.Fatalf("template: %+v", ti)
	}

	e.obs.reset()
	// Placement: nothing is written, the id is handed out first.
	res, err := e.p.EnsureVM(ctx, spec, provider.Progress{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Phase != provider.PhasePlaced || mustVMID(res.Progress.ID) != 1000 || res.Progress.Node != "pve1" || res.Progress.Task != nil {
		t.Fatalf("placement: %+v", res)
	}
	if e.nonTemplateVMs() != 0 {
		t.Fatal("placement must not create anything")
	}
	// The same call again returns the same placement.
	again, err := e.p.EnsureVM(ctx, spec, provider.Progress{})
	if err != nil || again.Progress != res.Progress {
		t.Fatalf("second placement: %+v %v", again, err)
	}
	vmid := mustVMID(res.Progress.ID)

	// Until the guest boots, the ISO is on storage and attached.
	d := e.ensure(e.p, spec, res.Progress, provider.PhaseBooting, 50)
	isoVolid := e.p.isoVolid(vmid, "uid-aaaa")
	if !strings.HasPrefix(isoVolid, "local:iso/hf-test-1000-") || !strings.HasSuffix(isoVolid, ".iso") {
		t.Fatalf("ISO volume id %q", isoVolid)
	}
	iso := e.volume(isoVolid)
	if iso == nil {
		t.Fatal("the cloud-init ISO is not on storage while booting")
	}
	ci := spec.CloudInit.(provider.CloudInit)
	if iso.Files["user-data"] != string(ci.UserData) || iso.Files["meta-data"] != string(ci.MetaData) ||
		iso.Files["network-config"] != string(ci.NetworkConfig) {
		t.Fatalf("ISO files: %v", iso.Files)
	}
	v := e.vm(vmid)
	if v == nil || v.Status != "running" {
		t.Fatalf("VM while booting: %+v", v)
	}
	if v.Config["ide2"] != isoVolid+",media=cdrom" {
		t.Fatalf("ide2 = %q (the template's cloud-init drive must be replaced by the ISO)", v.Config["ide2"])
	}
	if v.Config["cores"] != "4" || v.Config["memory"] != "4096" || v.Tags != "ci;hf-test;hyperfleet;linux;x64" || v.Name != "runner-a" {
		t.Fatalf("config: cores %s memory %s tags %q name %q", v.Config["cores"], v.Config["memory"], v.Tags, v.Name)
	}
	if want := "virtio=" + strings.ToUpper(macFor("uid-aaaa")) + ",bridge=vmbr0,tag=20"; v.Config["net0"] != want {
		t.Fatalf("net0 = %q, want %q", v.Config["net0"], want)
	}
	if !strings.Contains(v.Config["scsi0"], "size=40G") {
		t.Fatalf("scsi0 = %q, want the disk grown to 40G", v.Config["scsi0"])
	}
	rec, err := e.signer.Verify(v.Description, vmid)
	if err != nil || rec.UID != "uid-aaaa" || rec.Namespace != "ci" || rec.Name != "runner-a" || rec.Pool != "linux" {
		t.Fatalf("marker: %+v %v", rec, err)
	}
	if !strings.HasPrefix(v.Description, "HyperFleet runner runner-a") {
		t.Fatalf("description: %q", v.Description)
	}

	d = e.ensure(e.p, spec, d.prog, provider.PhaseRunning, 200)
	if got := d.res.Addresses; len(got) != 1 || got[0] != "10.99.0.10" {
		t.Fatalf("addresses: %v", got)
	}
	if d.res.MACAddress != macFor("uid-aaaa") {
		t.Fatalf("MAC %q, want %q", d.res.MACAddress, macFor("uid-aaaa"))
	}
	if d.res.Progress.Task != nil {
		t.Fatalf("running with a task: %+v", d.res.Progress)
	}
	if e.volume(isoVolid) != nil {
		t.Fatal("the ISO must be deleted once the guest is up")
	}
	if got := e.vm(vmid).Config["ide2"]; got != "none,media=cdrom" {
		t.Fatalf("ide2 after boot = %q", got)
	}
	if e.nonTemplateVMs() != 1 {
		t.Fatalf("%d VMs", e.nonTemplateVMs())
	}
	// The VM's secrets (its runner credential, or its join token) reach
	// the running VM through its guest agent: part of every lifecycle.
	if err := e.p.PlaceGuestFile(ctx, spec.Owner, provider.VMRef{ID: FormatID(vmid), Node: "pve1"},
		provider.GuestFile{Path: "/run/hyperfleet/secrets.json", Content: []byte(`{"jitConfig":"eyJh"}`)}); err != nil {
		t.Fatalf("PlaceGuestFile: %v", err)
	}
	creation := e.obs.snapshot()

	// Running is stable: another call changes nothing.
	again, err = e.p.EnsureVM(ctx, spec, d.prog)
	if err != nil || again.Phase != provider.PhaseRunning || again.Progress != d.prog {
		t.Fatalf("EnsureVM on a running VM: %+v %v", again, err)
	}

	// Read paths.
	vms, err := e.p.ListVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var listed *provider.VMSummary
	for i := range vms {
		if mustVMID(vms[i].ID) == vmid {
			listed = &vms[i]
		}
	}
	if listed == nil || !listed.OperatorTagged || listed.Template || listed.Node != "pve1" {
		t.Fatalf("listing: %+v", vms)
	}
	got, err := e.p.GetVM(ctx, provider.VMRef{ID: FormatID(vmid)})
	if err != nil || got.Owner == nil || got.Owner.UID != "uid-aaaa" || got.Power != provider.PowerRunning || got.OwnershipError != nil {
		t.Fatalf("GetVM: %+v %v", got, err)
	}
	if _, err := e.p.GetVM(ctx, provider.VMRef{ID: FormatID(1999), Node: "pve1"}); !errors.Is(err, provider.ErrNotFound) {
		t.Fatalf("GetVM of a missing VM: %v", err)
	}

	// The guest powers off: the VM is Stopped, and stays so.
	if err := e.sim.GuestPowerOff(vmid); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		st, err := e.p.EnsureVM(ctx, spec, d.prog)
		if err != nil || st.Phase != provider.PhaseStopped {
			t.Fatalf("EnsureVM after power-off: %+v %v", st, err)
		}
		d.prog = st.Progress
	}
	if e.vm(vmid).Status != "stopped" {
		t.Fatal("EnsureVM must not start a VM that has run")
	}

	e.obs.reset()
	e.remove(e.p, spec.Owner, d.prog, 30)
	if e.vm(vmid) != nil || e.nonTemplateVMs() != 0 {
		t.Fatal("the VM survived DeleteVM")
	}
	for _, s := range e.state().Storages {
		for _, vol := range s.Volumes {
			if vol.VMID == vmid || strings.Contains(vol.VolID, "hf-test-") {
				t.Fatalf("volume left behind: %+v", vol)
			}
		}
	}
	deletion := e.obs.snapshot()
	// Deleting again is Done at once.
	if res, err := e.p.DeleteVM(ctx, spec.Owner, d.prog); err != nil || !res.Done {
		t.Fatalf("second DeleteVM: %+v %v", res, err)
	}

	// The steps that need no answer in between share a call, and nothing
	// is read back that this process just did (the package documentation):
	// the clone goes out without a read of its id, the config is read
	// once before the configuration, once before the eject and once before
	// the guest file's write (each verifies the ownership marker), and the
	// power state is never read while creating.
	if c := creation[0]; c.method != "POST" || c.endpoint != "/nodes/{node}/qemu/{vmid}/clone" {
		t.Errorf("first call of the creation: %s %s, want the clone", c.method, c.endpoint)
	}
	reads := map[string]int{}
	for _, c := range creation {
		if c.method == "GET" {
			reads[c.endpoint]++
		}
	}
	if n := reads["/nodes/{node}/qemu/{vmid}/config"]; n != 3 {
		t.Errorf("%d config reads while creating, want 3 (before configuring, before ejecting, before writing into the guest)", n)
	}
	if n := reads["/nodes/{node}/qemu/{vmid}/status/current"] + reads["/nodes/{node}/storage/{storage}/content/{volume}"]; n != 0 {
		t.Errorf("%d status or ISO reads while creating, want none", n)
	}
	mut, poll := countCalls(creation)
	dmut, dpoll := countCalls(deletion)
	t.Logf("creation: %d mutating calls, %d reads; deletion: %d mutating, %d reads; total mutating %d", mut, poll, dmut, dpoll, mut+dmut)
	for _, c := range creation {
		t.Logf("  %s %s %d", c.method, c.endpoint, c.code)
	}
	if mut+dmut > 10 {
		t.Fatalf("%d mutating API calls per lifecycle, target is at most 10", mut+dmut)
	}
}

// countCalls splits calls into writes (POST, PUT, DELETE) and reads.
func countCalls(calls []apiCall) (mutating, reads int) {
	for _, c := range calls {
		if c.method == "GET" {
			reads++
		} else {
			mutating++
		}
	}
	return
}

// TestEndpointsAreTemplated checks that the Observer never sees an id, a
// node name or a UPID.
func TestEndpointsAreTemplated(t *testing.T) {
	e := newEnv(t)
	spec := testSpec("runner-b", "uid-bbbb")
	d := e.ensure(e.p, spec, provider.Progress{}, provider.PhaseRunning, 200)
	e.remove(e.p, spec.Owner, d.prog, 30)
	seen := map[string]bool{}
	for _, c := range e.obs.snapshot() {
		seen[c.method+" "+c.endpoint] = true
		for _, bad := range []string{"UPID", "pve1", "1000", "9000", "hf-test", opTokenSecret} {
			if strings.Contains(c.endpoint, bad) {
				t.Errorf("endpoint %q contains %q", c.endpoint, bad)
			}
		}
	}
	for _, want := range []string{
		"POST /nodes/{node}/qemu/{vmid}/clone", "GET /nodes/{node}/tasks/{upid}/status", "POST /nodes/{node}/storage/{storage}/upload",
		"PUT /nodes/{node}/qemu/{vmid}/config", "POST /nodes/{node}/qemu/{vmid}/status/start",
		"GET /nodes/{node}/qemu/{vmid}/agent/network-get-interfaces", "DELETE /nodes/{node}/storage/{storage}/content/{volume}",
		"DELETE /nodes/{node}/qemu/{vmid}", "GET /cluster/resources",
	} {
		if !seen[want] {
			t.Errorf("no %s reported; saw %v", want, seen)
		}
	}
}

func TestEndpointTemplate(t *testing.T) {
	for in, want := range map[string]string{
		"/api2/json/nodes/pve1/qemu/123/clone": "/nodes/{node}/qemu/{vmid}/clone",
		"/api2/json/nodes/pve1/tasks/UPID:pve1:00000FA1:0083E62B:6B00DF40:qmclone:9000:root@pam!sim:/status": "/nodes/{node}/tasks/{upid}/status",
		"/api2/json/nodes/pve1/storage/local/content/local:iso/hf-x-1-cloudinit.iso":                         "/nodes/{node}/storage/{storage}/content/{volume}",
		"/api2/json/cluster/resources": "/cluster/resources",
		"/api2/json/nodes":             "/nodes",
		"/api2/json/access/ticket":     "/access/ticket",
		"/api2/json/pools/ci":          "/pools/{poolid}",
		"/api2/json/nodes/pve1/qemu/7/agent/network-get-interfaces": "/nodes/{node}/qemu/{vmid}/agent/network-get-interfaces",
		// pve-firewall's: a group name, a rule position, an IPSet and its
		// entry never reach a metric label.
		"/api2/json/cluster/firewall/groups":                                 "/cluster/firewall/groups",
		"/api2/json/cluster/firewall/groups/hf9f86d09dcc7655ea":              "/cluster/firewall/groups/{group}",
		"/api2/json/cluster/firewall/groups/hf9f86d09dcc7655ea/0":            "/cluster/firewall/groups/{group}/{pos}",
		"/api2/json/nodes/pve1/qemu/7/firewall/rules/3":                      "/nodes/{node}/qemu/{vmid}/firewall/rules/{pos}",
		"/api2/json/nodes/pve1/qemu/7/firewall/ipset/ipfilter-net0":          "/nodes/{node}/qemu/{vmid}/firewall/ipset/{name}",
		"/api2/json/nodes/pve1/qemu/7/firewall/ipset/ipfilter-net0/10.0.0.5": "/nodes/{node}/qemu/{vmid}/firewall/ipset/{name}/{cidr}",
	} {
		if got := endpointTemplate("/api2/json", in); got != want {
			t.Errorf("endpointTemplate(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestSetPower: SetPower on an owned VM, and EnsureVM on a VM a
// caller powered off.
func TestSetPower(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	spec := testSpec("runner-p", "uid-pppp")
	d := e.ensure(e.p, spec, provider.Progress{}, provider.PhaseRunning, 200)
	ref := d.prog.VMRef()
	if task, err := e.p.SetPower(ctx, spec.Owner, ref, provider.PowerOn); err != nil || task != nil {
		t.Fatalf("PowerOn on a running VM: %+v %v", task, err)
	}
	task, err := e.p.SetPower(ctx, spec.Owner, ref, provider.PowerShutdown)
	if err != nil || task == nil || task.Operation != "shutdown" || !strings.HasPrefix(task.ID, "UPID:pve1:") {
		t.Fatalf("shutdown: %+v %v", task, err)
	}
	e.advance(10 * time.Second)
	if e.vm(mustVMID(ref.ID)).Status != "stopped" {
		t.Fatal("shutdown did not stop the VM")
	}
	if task, err := e.p.SetPower(ctx, spec.Owner, ref, provider.PowerOff); err != nil || task != nil {
		t.Fatalf("PowerOff on a stopped VM: %+v %v", task, err)
	}
	res, err := e.p.EnsureVM(ctx, spec, d.prog)
	if err != nil || res.Phase != provider.PhaseStopped {
		t.Fatalf("EnsureVM on a stopped VM: %+v %v", res, err)
	}
	task, err = e.p.SetPower(ctx, spec.Owner, provider.VMRef{ID: FormatID(mustVMID(ref.ID))}, provider.PowerOn)
	if err != nil || task == nil || task.Operation != "start" {
		t.Fatalf("PowerOn: %+v %v", task, err)
	}
}

// TestStoppedBeforeBoot: a guest that powers off before it reported an
// address ends Stopped, is not started again, and loses its ISO on delete.
func TestStoppedBeforeBoot(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	spec := testSpec("runner-s", "uid-ssss")
	d := e.ensure(e.p, spec, provider.Progress{}, provider.PhaseBooting, 60)
	if d.prog.Task == nil || d.prog.Task.Operation != opBoot {
		t.Fatalf("booting progress: %+v", d.prog)
	}
	if err := e.sim.GuestPowerOff(mustVMID(d.prog.ID)); err != nil {
		t.Fatal(err)
	}
	// One call: the ISO is ejected and its deletion started.
	res, err := e.p.EnsureVM(ctx, spec, d.prog)
	if err != nil || res.Phase != provider.PhaseStopped || res.RetryAfter != 0 || res.Progress.Task != nil {
		t.Fatalf("after an early power-off: %+v %v", res, err)
	}
	if got := e.vm(mustVMID(d.prog.ID)).Config["ide2"]; got != "none,media=cdrom" {
		t.Fatalf("ide2 of the stopped VM = %q, want the ISO ejected", got)
	}
	if e.volume(e.p.isoVolid(mustVMID(d.prog.ID), "uid-ssss")) != nil {
		t.Fatalf("final Stopped %+v with the ISO still present", res)
	}
	// Even a new provider with a Progress that lost the boot marker sees a
	// VM that has run.
	fresh := e.newProvider(e.cfg)
	res, err = fresh.EnsureVM(ctx, spec, provider.Progress{ID: FormatID(mustVMID(d.prog.ID)), Node: d.prog.Node})
	for err == nil && res.Phase != provider.PhaseStopped && res.Progress.Task != nil {
		e.advance(res.RetryAfter)
		res, err = fresh.EnsureVM(ctx, spec, res.Progress)
	}
	if err != nil || res.Phase != provider.PhaseStopped {
		t.Fatalf("restart after an early power-off: %+v %v", res, err)
	}
	if e.vm(mustVMID(d.prog.ID)).Status != "stopped" {
		t.Fatal("the VM was started again")
	}
	e.remove(fresh, spec.Owner, res.Progress, 30)
	if e.volume(e.p.isoVolid(mustVMID(d.prog.ID), "uid-ssss")) != nil || e.nonTemplateVMs() != 0 {
		t.Fatal("VM or ISO left behind")
	}
}
