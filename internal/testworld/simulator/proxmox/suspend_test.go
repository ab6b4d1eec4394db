package proxmoxsim

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// suspendLatency makes a suspend and a resume of a 2 GiB VM take 3 s each
// (1 s plus 1 s per GiB), a boot 20 s.
func suspendLatency(c *Config) {
	c.Latency = Latency{Boot: Duration(20 * time.Second),
		Suspend: Duration(time.Second), SuspendPerGiB: Duration(time.Second),
		Resume: Duration(time.Second), ResumePerGiB: Duration(time.Second)}
}

// bootVM150 clones template 9000 (2 GiB) to VM 150, starts it and waits
// for its guest agent.
func bootVM150(e *simEnv) {
	e.t.Helper()
	e.wantExit(e.clone("150", nil), "OK")
	e.wantExit(e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/150/status/start", nil)), "OK")
	e.clock.Advance(20 * time.Second)
}

// suspend150 suspends VM 150 to disk and waits for the task (3 s under
// suspendLatency).
func suspend150(e *simEnv) {
	e.t.Helper()
	upid := e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/150/status/suspend", form("todisk", "1")))
	e.clock.Advance(3 * time.Second)
	e.wantExit(upid, "OK")
}

// ipv4Of is the address the simulator gave VM vmid.
func ipv4Of(sim *Simulator, vmid int) string {
	for _, v := range sim.VMs() {
		if v.VMID == vmid {
			return v.IPv4
		}
	}
	return ""
}

func (e *simEnv) config150() map[string]any {
	e.t.Helper()
	return e.mustOK(e.call(http.MethodGet, "/nodes/pve1/qemu/150/config", nil)).dataMap(e.t)
}

func (e *simEnv) status150() map[string]any {
	e.t.Helper()
	return e.mustOK(e.call(http.MethodGet, "/nodes/pve1/qemu/150/status/current", nil)).dataMap(e.t)
}

// stateVolume is the volume of vmid whose id names a saved state, with
// its bytes, or ok false.
func stateVolume(sim *Simulator, vmid int) (VolumeState, bool) {
	for _, st := range sim.State().Storages {
		for _, v := range st.Volumes {
			if v.VMID == vmid && strings.Contains(v.VolID, "-state-") {
				return v, true
			}
		}
	}
	return VolumeState{}, false
}

// taskLog is the text of a task's log.
func (e *simEnv) taskLog(upid string) string {
	e.t.Helper()
	var lines []string
	for _, l := range e.mustOK(e.call(http.MethodGet, "/nodes/pve1/tasks/"+upid+"/log", nil)).dataList(e.t) {
		lines = append(lines, fmt.Sprint(l["t"]))
	}
	return strings.Join(lines, "\n")
}

// TestSuspendToDiskAndResume follows RunState.pm vm_suspend and
// vm_start_nolock: "lock: suspending", the state volume (twice the memory
// plus 500 MiB, listed with the VM's disks) and the config keys while the
// memory is saved; then QEMU gone, "lock: suspended", the guest's memory at
// rest in the volume and nowhere else; a resume brings the same guest back
// (its files, its address, its agent at once) and frees the volume, the
// keys and the lock. Stop leaves a suspended VM as it is; config changes
// and a second suspend are refused.
//
// Mutation: leaving out the memory image (takeMemoryLocked returning nil)
// fails the at-rest check; not freeing the volume on resume
// (resumeFromDiskLocked without dropVMStateLocked) fails the volume check.
func TestSuspendToDiskAndResume(t *testing.T) {
	e := newEnv(t, suspendLatency)
	ctx := context.Background()
	bootVM150(e)
	if r := fileWrite(e, "150", "/run/hyperfleet/token", "standby-secret-7f3a", true); r.code != 200 {
		t.Fatalf("file-write: %s", r.status)
	}
	memBefore := nodeMemUsed(t, e)
	addr := ipv4Of(e.sim, 150)

	if r := e.call(http.MethodPost, "/nodes/pve1/qemu/150/status/suspend", form("statestorage", "local")); r.code != 400 ||
		r.errors()["todisk"] != "missing property - 'statestorage' requires this property" {
		t.Fatalf("statestorage without todisk: %s %v", r.status, r.errors())
	}
	upid := e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/150/status/suspend", form("todisk", "1")))
	if !strings.Contains(upid, ":qmsuspend:150:") {
		t.Fatalf("suspend UPID %s", upid)
	}
	c := e.config150()
	if c["lock"] != "suspending" || c["vmstate"] != "local-lvm:vm-150-state-suspend-2026-01-02" || c["runningmachine"] == nil || c["runningcpu"] == nil {
		t.Fatalf("config while suspending: %v", c)
	}
	if st := e.status150(); st["status"] != "running" || st["lock"] != "suspending" {
		t.Fatalf("status while suspending: %v", st)
	}
	found := false
	for _, v := range e.mustOK(e.call(http.MethodGet, "/nodes/pve1/storage/local-lvm/content", form("vmid", "150"))).dataList(t) {
		if v["volid"] == "local-lvm:vm-150-state-suspend-2026-01-02" {
			found = v["size"] == float64((2*2048+500)<<20) && v["format"] == "raw" && v["content"] == "images"
		}
	}
	if !found {
		t.Fatal("the state volume is not listed with 2*2048+500 MiB, raw, images")
	}
	if r := e.call(http.MethodPut, "/nodes/pve1/qemu/150/config", form("cores", "4")); r.status != "500 VM is locked (suspending)" {
		t.Fatalf("config while suspending: %s", r.status)
	}
	e.clock.Advance(2 * time.Second)
	if e.task(upid)["status"] != "running" {
		t.Fatal("the suspend of 2 GiB ended before 3 s")
	}
	e.clock.Advance(time.Second)
	e.wantExit(upid, "OK")
	if !strings.Contains(e.taskLog(upid), "State saved, quitting") {
		t.Errorf("suspend log: %q", e.taskLog(upid))
	}
	if st := e.status150(); st["status"] != "stopped" || st["lock"] != "suspended" || st["pid"] != nil {
		t.Fatalf("status when suspended: %v", st)
	}
	if res := findVM(t, e, 150); res["lock"] != "suspended" {
		t.Fatalf("resources when suspended: %v", res)
	}
	if got := nodeMemUsed(t, e); got != memBefore-2048<<20 {
		t.Errorf("node memory when suspended: %d, want %d", got, memBefore-2048<<20)
	}
	if vol, ok := stateVolume(e.sim, 150); !ok || !strings.Contains(string(vol.Data), "standby-secret-7f3a") {
		t.Errorf("the suspended guest's memory is not at rest in its state volume (%v)", ok)
	}
	if _, _, err := e.sim.GuestFile(ctx, 150, "/run/hyperfleet/token"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a suspended guest still holds its file in the simulator's memory: %v", err)
	}
	if r := e.call(http.MethodGet, "/nodes/pve1/qemu/150/agent/network-get-interfaces", nil); r.status != "500 VM 150 is not running" {
		t.Errorf("agent of a suspended VM: %s", r.status)
	}

	e.wantExit(e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/150/status/stop", nil)), "OK")
	if e.config150()["lock"] != "suspended" {
		t.Fatal("a stop changed the suspended VM")
	}
	if r := e.call(http.MethodPut, "/nodes/pve1/qemu/150/config", form("cores", "4")); r.status != "500 VM is locked (suspended)" {
		t.Fatalf("config when suspended: %s", r.status)
	}
	if r := e.call(http.MethodPost, "/nodes/pve1/qemu/150/status/suspend", form("todisk", "1")); r.status != "500 VM 150 not running" {
		t.Fatalf("suspend of a suspended VM: %s", r.status)
	}

	upid = e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/150/status/resume", nil))
	if !strings.Contains(upid, ":qmresume:150:") {
		t.Fatalf("resume UPID %s", upid)
	}
	e.clock.Advance(3 * time.Second)
	e.wantExit(upid, "OK")
	if l := e.taskLog(upid); !strings.Contains(l, "Resuming suspended VM") || !strings.Contains(l, "Resumed VM, removing state") {
		t.Errorf("resume log: %q", l)
	}
	c = e.config150()
	for _, k := range []string{"lock", "vmstate", "runningmachine", "runningcpu"} {
		if c[k] != nil {
			t.Errorf("after the resume the config keeps %s: %v", k, c[k])
		}
	}
	if _, ok := stateVolume(e.sim, 150); ok {
		t.Error("the state volume outlived the resume")
	}
	if st := e.status150(); st["status"] != "running" {
		t.Fatalf("status after the resume: %v", st)
	}
	if b, _, err := e.sim.GuestFile(ctx, 150, "/run/hyperfleet/token"); err != nil || string(b) != "standby-secret-7f3a" {
		t.Errorf("the resumed guest holds %q, %v", b, err)
	}
	if got := ipv4Of(e.sim, 150); got != addr || addr == "" {
		t.Errorf("the resumed guest's address %s, was %s", got, addr)
	}
	e.mustOK(e.call(http.MethodGet, "/nodes/pve1/qemu/150/agent/network-get-interfaces", nil))
	// A running VM resumed again: nothing to do.
	e.wantExit(e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/150/status/resume", nil)), "OK")
}

// TestSuspendedVMEnds: a suspended VM is destroyed with its state volume
// (destroy_vm ignores "lock: suspended"); deleting its vmstate lifts the
// lock and frees the volume, after which a start boots afresh; a start of
// a suspended VM resumes it; a stopped VM with no saved state has nothing
// to resume.
//
// Mutation: keeping handleDestroy's lock check for "suspended" fails the
// destroy; a delete=vmstate that leaves the lock (applyConfigLocked) fails
// the start.
func TestSuspendedVMEnds(t *testing.T) {
	e := newEnv(t, suspendLatency)
	ctx := context.Background()
	bootVM150(e)
	suspend150(e)
	e.wantExit(e.upid(e.call(http.MethodDelete, "/nodes/pve1/qemu/150", form("purge", "1"))), "OK")
	for _, st := range e.sim.State().Storages {
		for _, v := range st.Volumes {
			if v.VMID == 150 {
				t.Errorf("volume %s outlived the destroy of the suspended VM", v.VolID)
			}
		}
	}

	bootVM150(e)
	if r := fileWrite(e, "150", "/run/token", "s", true); r.code != 200 {
		t.Fatalf("file-write: %s", r.status)
	}
	suspend150(e)
	upid := e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/150/status/start", nil))
	e.clock.Advance(3 * time.Second)
	e.wantExit(upid, "OK")
	if !strings.Contains(e.taskLog(upid), "Resuming suspended VM") || e.config150()["lock"] != nil {
		t.Fatalf("a start of the suspended VM did not resume it: %q", e.taskLog(upid))
	}
	if _, _, err := e.sim.GuestFile(ctx, 150, "/run/token"); err != nil {
		t.Errorf("after a start from the saved state: %v", err)
	}

	suspend150(e)
	e.mustOK(e.call(http.MethodPut, "/nodes/pve1/qemu/150/config", form("delete", "vmstate")))
	c := e.config150()
	if c["lock"] != nil || c["vmstate"] != nil || c["runningmachine"] != nil || c["runningcpu"] != nil {
		t.Fatalf("config after delete=vmstate: %v", c)
	}
	if _, ok := stateVolume(e.sim, 150); ok {
		t.Error("delete=vmstate left the state volume")
	}
	if r := e.call(http.MethodPost, "/nodes/pve1/qemu/150/status/resume", nil); r.status != "500 VM 150 not running" {
		t.Fatalf("resume of a stopped VM: %s", r.status)
	}
	upid = e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/150/status/start", nil))
	e.wantExit(upid, "OK")
	if strings.Contains(e.taskLog(upid), "Resuming") {
		t.Error("a start after delete=vmstate resumed")
	}
	if _, _, err := e.sim.GuestFile(ctx, 150, "/run/token"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a fresh boot holds the old guest's file: %v", err)
	}
	if r := e.call(http.MethodPost, "/nodes/pve1/qemu/151/status/suspend", form("todisk", "1")); r.code != 500 || !strings.Contains(r.status, "151.conf' does not exist") {
		t.Errorf("suspend of a missing VM: %s", r.status)
	}
}

// TestSuspendFailsWhenTheGuestStops: a guest that powers off while its
// memory is saved fails the suspend, which frees the volume and the keys
// and leaves "lock: suspending" (vm_suspend's cleanup).
func TestSuspendFailsWhenTheGuestStops(t *testing.T) {
	e := newEnv(t, suspendLatency)
	bootVM150(e)
	upid := e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/150/status/suspend", form("todisk", "1")))
	if err := e.sim.GuestPowerOff(150); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(3 * time.Second)
	e.wantExit(upid, "VM 150 not running")
	if c := e.config150(); c["lock"] != "suspending" || c["vmstate"] != nil || c["runningmachine"] != nil {
		t.Fatalf("config after a failed suspend: %v", c)
	}
	if _, ok := stateVolume(e.sim, 150); ok {
		t.Error("a failed suspend left its state volume")
	}
}

// TestVMStateStorage: find_vmstate_storage picks the config's
// vmstatestorage, else a shared storage of a disk, else a local one, a
// file storage first among each; CD-ROMs do not count; "local" without
// any. On a file storage the volume is a .raw file under the VM's
// directory.
func TestVMStateStorage(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.Storages = append(c.Storages,
			StorageConfig{ID: "nfs1", Type: "nfs", Content: []string{"images"}, Shared: true},
			StorageConfig{ID: "ceph", Type: "rbd", Content: []string{"images"}, Shared: true})
	})
	for _, c := range []struct {
		conf map[string]string
		want string
	}{
		{map[string]string{"scsi0": "local-lvm:vm-150-disk-0,size=32G", "ide2": "local-lvm:vm-150-cloudinit,media=cdrom"}, "local-lvm"},
		{map[string]string{"scsi0": "local-lvm:vm-150-disk-0", "scsi1": "local:150/vm-150-disk-1.qcow2"}, "local"},
		{map[string]string{"scsi0": "local-lvm:vm-150-disk-0", "scsi1": "ceph:vm-150-disk-1", "scsi2": "nfs1:150/vm-150-disk-2.qcow2"}, "nfs1"},
		{map[string]string{"scsi0": "ceph:vm-150-disk-0", "virtio0": "local:150/vm-150-disk-1.qcow2"}, "ceph"},
		{map[string]string{"ide0": "local:iso/seed.iso,media=cdrom"}, "local"},
		{map[string]string{"scsi0": "local-lvm:vm-150-disk-0", "vmstatestorage": "nfs1"}, "nfs1"},
	} {
		if got := e.sim.vmstateStorageLocked(&vm{vmid: 150, conf: c.conf}); got != c.want {
			t.Errorf("%v: %s, want %s", c.conf, got, c.want)
		}
	}
	at := time.Date(2026, 3, 4, 23, 0, 0, 0, time.UTC)
	if got := vmstateVolid(e.sim.storages["local"], 150, at); got != "local:150/vm-150-state-suspend-2026-03-04.raw" {
		t.Errorf("state volume on a dir storage: %s", got)
	}
	bootVM150(e)
	e.wantExit(e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/150/status/suspend", form("todisk", "1", "statestorage", "local"))), "OK")
	if c := e.config150(); c["vmstate"] != "local:150/vm-150-state-suspend-2026-01-02.raw" {
		t.Errorf("statestorage local: vmstate %v", c["vmstate"])
	}
}

// TestPauseAndContinue: a suspend without todisk pauses the VM (qmpause:
// qmpstatus paused, its agent silent, no shutdown) and a resume continues
// it.
func TestPauseAndContinue(t *testing.T) {
	e := newEnv(t, suspendLatency)
	bootVM150(e)
	upid := e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/150/status/suspend", nil))
	if !strings.Contains(upid, ":qmpause:150:") {
		t.Fatalf("pause UPID %s", upid)
	}
	e.wantExit(upid, "OK")
	if st := e.status150(); st["status"] != "running" || st["qmpstatus"] != "paused" {
		t.Fatalf("status when paused: %v", st)
	}
	if r := e.call(http.MethodGet, "/nodes/pve1/qemu/150/agent/network-get-interfaces", nil); r.status != "500 VM 150 qmp command 'guest-network-get-interfaces' failed - got timeout" {
		t.Errorf("agent of a paused VM: %s", r.status)
	}
	if r := e.call(http.MethodPost, "/nodes/pve1/qemu/150/status/shutdown", nil); r.status != "500 VM is paused - cannot shutdown" {
		t.Errorf("shutdown of a paused VM: %s", r.status)
	}
	e.wantExit(e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/150/status/resume", nil)), "OK")
	if st := e.status150(); st["qmpstatus"] != "running" {
		t.Fatalf("status after the resume: %v", st)
	}
	e.mustOK(e.call(http.MethodGet, "/nodes/pve1/qemu/150/agent/network-get-interfaces", nil))
}

// TestSuspendHoldsTheGuestProgram: a guest the hook runs is held where it
// is while suspended (its process stopped, the same process continued by
// the resume) and its /run is in the state volume, not on the host, until
// the resume puts it back.
//
// Mutation: killing the program at suspend (freezeLocked as killLocked)
// fails the same-process check.
func TestSuspendHoldsTheGuestProgram(t *testing.T) {
	if _, err := os.Stat("/bin/sleep"); err != nil {
		t.Skip("the guest hook needs /bin/sleep")
	}
	e := newEnv(t, func(c *Config) {
		suspendLatency(c)
		c.Guest.Command = []string{"/bin/sleep", "3600"}
		c.Guest.WorkDir = t.TempDir()
	})
	bootVM150(e)
	if err := os.Mkdir(filepath.Join(e.sim.guest.rootDir(150), "run", "hyperfleet"), 0o700); err != nil {
		t.Fatal(err)
	}
	if r := fileWrite(e, "150", "/run/hyperfleet/token", "hook-secret-91", true); r.code != 200 {
		t.Fatalf("file-write: %s", r.status)
	}
	pid := func() int {
		e.sim.mu.Lock()
		defer e.sim.mu.Unlock()
		if p := e.sim.guest.procs[150]; p != nil {
			return p.leader.Pgid()
		}
		return 0
	}
	state := func(pid int) string {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return "gone"
		}
		return strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))[0]
	}
	before := pid()
	if before == 0 {
		t.Fatal("no guest program runs")
	}
	suspend150(e)
	// A stop signal takes effect when the kernel next schedules the process.
	eventually(t, "the suspended guest's program stopped (state T)", func() bool { return state(before) == "T" })
	if _, err := os.Stat(filepath.Join(e.sim.guest.rootDir(150), "run", "hyperfleet")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the suspended guest's /run is still on the host: %v", err)
	}
	if vol, ok := stateVolume(e.sim, 150); !ok || !strings.Contains(string(vol.Data), "hook-secret-91") {
		t.Error("the state volume does not hold the guest's /run")
	}
	upid := e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/150/status/resume", nil))
	e.clock.Advance(3 * time.Second)
	e.wantExit(upid, "OK")
	if after := pid(); after != before {
		t.Errorf("after the resume the program is %d; want %d, the one suspended", after, before)
	}
	eventually(t, "the resumed guest's program running again", func() bool { s := state(before); return s != "T" && s != "gone" && s != "Z" })
	b, mode, err := e.sim.GuestFile(context.Background(), 150, "/run/hyperfleet/token")
	if err != nil || string(b) != "hook-secret-91" || mode != 0o666 {
		t.Errorf("the resumed guest's file: %q mode %o, %v", b, mode, err)
	}
	// A destroy ends the held program too.
	suspend150(e)
	e.wantExit(e.upid(e.call(http.MethodDelete, "/nodes/pve1/qemu/150", nil)), "OK")
	eventually(t, "the held program killed with its VM", func() bool { s := state(before); return s == "gone" || s == "Z" })
}
