package proxmoxsim

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/qemu"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox/privileges"
)

// Suspend to disk and resume, as qemu-server 9.2 does them (the API in
// src/PVE/API2/Qemu.pm vm_suspend and vm_resume, the work in
// src/PVE/QemuServer/RunState.pm vm_suspend and src/PVE/QemuServer.pm
// vm_start_nolock, the state volume in src/PVE/QemuConfig.pm
// __snapshot_save_vmstate and find_vmstate_storage):
//
//   - suspend with todisk: the task sets "lock: suspending", allocates the
//     state volume vm-<vmid>-state-suspend-<YYYY-MM-DD> (".raw" on file
//     storages) of twice the memory plus 500 MiB, and writes vmstate,
//     runningmachine and runningcpu into the config; once the memory is
//     saved QEMU quits and the lock becomes "suspended". A failure frees
//     the volume and the keys and leaves "lock: suspending".
//   - resume (or start) of a VM locked "suspended": QEMU starts from the
//     saved state, then the volume is freed and lock, vmstate,
//     runningmachine, runningcpu and running-nets-host-mtu are removed.
//   - a suspend without todisk pauses the VM (qmpause); resume continues
//     it (QMP cont).
//
// The simulated guest's memory is what it keeps in RAM: the files of a
// guest that runs no program, the /run tmpfs of one the guest hook runs.
// A suspend moves it into the state volume (memoryImage) and a resume puts
// it back, so that while the VM is suspended it is at rest on storage
// (State shows it), as a real guest's memory is. The guest program is
// stopped where it is and continued by the resume (see savedGuest). A
// real (QEMU) guest's memory is QEMU's own saved state, in a file that is
// the state volume's content (realguest_suspend.go).

// The locks of a suspend to disk (RunState.pm vm_suspend).
const (
	lockSuspending = "suspending"
	lockSuspended  = "suspended"
)

// vmstateDriverMiB is what __snapshot_save_vmstate reserves beyond twice
// the memory: "assume 500MB is enough to safe all driver state".
const vmstateDriverMiB = 500

var (
	suspendSchema = sch(nodeP, vmidP,
		param{name: "skiplock", kind: kBool, optional: true},
		param{name: "todisk", kind: kBool, optional: true},
		param{name: "statestorage", kind: kString, optional: true, format: verifyStorageID, requires: "todisk"},
	)
	resumeSchema = sch(nodeP, vmidP,
		param{name: "skiplock", kind: kBool, optional: true},
		param{name: "nocheck", kind: kBool, optional: true},
	)
)

// errRealGuestPause fails the task of a pause (a suspend without todisk)
// of a real guest: not modelled (README.md, "Known approximations").
var errRealGuestPause = errors.New("proxmox-sim: pausing a real (QEMU) guest is not modelled")

// savedGuest is what a suspend to disk (or a pause) keeps of the simulated
// guest beside its memory: whether its agent answered and whether its
// program ran (a process program is stopped, SIGSTOP, and continued at
// resume; an in-process one is ended and started again over the restored
// files). Of a real guest it keeps the machine QEMU ran, which the QEMU
// that resumes its state must be.
type savedGuest struct {
	agentUp    bool
	programRan bool
	machine    *qemu.Machine
}

// handleSuspend is POST .../status/suspend: synchronously what vm_suspend
// checks before its worker (skiplock, "VM N not running", passed-through
// PCI devices with todisk, the state storage), then the qmsuspend task
// (todisk) or qmpause.
func (s *Simulator) handleSuspend(q *apiRequest) (any, error) {
	if err := checkSkiplock(q); err != nil {
		return nil, err
	}
	v, err := s.vmOnNodeLocked(q)
	if err != nil {
		return nil, err
	}
	if !v.running {
		return nil, serverError("VM %d not running", v.vmid)
	}
	skiplock := q.boolean("skiplock", false)
	if !q.boolean("todisk", false) {
		t := s.newTaskLocked(v.node, "qmpause", strconv.Itoa(v.vmid), q.auth)
		s.afterLocked(0, func(at time.Time) { t.finish(at, s.pauseLocked(v, skiplock)) })
		return t.upid, nil
	}
	for k := range v.conf {
		if strings.HasPrefix(k, "hostpci") {
			return nil, serverError("cannot suspend VM to disk due to passed-through PCI device(s), which lack the possibility to save/restore their internal state")
		}
	}
	sid := cmp.Or(q.str("statestorage"), s.vmstateStorageLocked(v))
	st, err := s.storageOnNodeLocked(sid, v.node)
	if err != nil {
		return nil, err
	}
	t := s.newTaskLocked(v.node, "qmsuspend", strconv.Itoa(v.vmid), q.auth)
	s.afterLocked(0, func(at time.Time) {
		volid, err := s.beginSuspendLocked(v, st, skiplock, at)
		if err != nil {
			t.finish(at, err)
			return
		}
		if v.image != nil {
			// QEMU writes a real guest's memory in its own time: no
			// modelled duration.
			s.suspendRealGuestLocked(v, volid, t)
			return
		}
		gib := float64(v.memoryBytes()) / (1 << 30)
		d := s.cfg.Latency.Suspend.D() + time.Duration(gib*float64(s.cfg.Latency.SuspendPerGiB.D()))
		s.afterLocked(d, func(at time.Time) {
			if err := s.endSuspendLocked(v, volid); err != nil {
				t.finish(at, err)
				return
			}
			t.logf("State saved, quitting")
			t.finish(at, nil)
		})
	})
	return t.upid, nil
}

// pauseLocked is vm_suspend without its state: QMP stop.
func (s *Simulator) pauseLocked(v *vm, skiplock bool) error {
	if err := s.taskFaultLocked(classPower, strconv.Itoa(v.vmid), ""); err != nil {
		return err
	}
	if s.vms[v.vmid] != v {
		return fmt.Errorf("Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist", v.node, v.vmid) //nolint:staticcheck,revive // ST1005/error-strings: Proxmox's own message, verbatim on the wire
	}
	if !skiplock {
		if err := checkLock(v); err != nil {
			return err
		}
	}
	if !v.running {
		return fmt.Errorf("VM %d not running", v.vmid)
	}
	if v.image != nil {
		return errRealGuestPause
	}
	if v.paused {
		return nil
	}
	v.paused, v.saved = true, &savedGuest{agentUp: v.agentUp}
	if s.guest != nil {
		v.saved.programRan = s.guest.freezeLocked(v.vmid)
	}
	return nil
}

// beginSuspendLocked is the first lock_config block of vm_suspend with
// todisk: the lock, the state volume and the config keys, written before
// the memory is saved. It returns the volume.
func (s *Simulator) beginSuspendLocked(v *vm, st *storage, skiplock bool, at time.Time) (string, error) {
	if err := s.taskFaultLocked(classPower, strconv.Itoa(v.vmid), ""); err != nil {
		return "", err
	}
	if s.vms[v.vmid] != v {
		return "", fmt.Errorf("Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist", v.node, v.vmid) //nolint:staticcheck,revive // ST1005/error-strings: Proxmox's own message, verbatim on the wire
	}
	if !skiplock {
		if err := checkLock(v); err != nil {
			return "", err
		}
	}
	if !v.running {
		return "", fmt.Errorf("VM %d not running", v.vmid)
	}
	volid := vmstateVolid(st, v.vmid, at)
	scope := st.scope(v.node)
	if st.volumes[volumeKey(scope, volid)] != nil {
		return "", fmt.Errorf("unable to create volume '%s' - volume already exists", volid)
	}
	size := (2*v.memoryMiB() + vmstateDriverMiB) << 20
	s.addVolumeLocked(st, scope, &volume{volid: volid, content: "images", format: "raw", size: size, vmid: v.vmid})
	v.conf["lock"] = lockSuspending
	v.conf["vmstate"] = volid
	v.conf["runningmachine"] = "pc-i440fx-9.2+pve1"
	v.conf["runningcpu"] = cmp.Or(strings.Split(v.conf["cpu"], ",")[0], "kvm64") + ",enforce,+kvm_pv_eoi,+kvm_pv_unhalt"
	return volid, nil
}

// endSuspendLocked is vm_suspend's end: with the memory saved QEMU quits
// and the lock becomes "suspended". A VM that stopped meanwhile (its guest
// powered off) fails the save, which frees the volume and the keys and
// leaves "lock: suspending", as vm_suspend's cleanup does.
func (s *Simulator) endSuspendLocked(v *vm, volid string) error {
	if s.vms[v.vmid] != v || v.conf["lock"] != lockSuspending {
		return fmt.Errorf("lock changed unexpectedly")
	}
	_, vol := s.findVolumeLocked(volid, v.node)
	if !v.running || vol == nil {
		s.failSuspendLocked(v, volid)
		return fmt.Errorf("VM %d not running", v.vmid)
	}
	image, err := s.takeMemoryLocked(v)
	if err != nil {
		return fmt.Errorf("query-savevm failed with error '%w'", err)
	}
	vol.data = image
	// A paused VM's program is held already (an in-process one ended).
	paused := v.saved
	saved := &savedGuest{agentUp: v.agentUp, programRan: paused != nil && paused.programRan}
	if s.guest != nil && s.guest.freezeLocked(v.vmid) {
		saved.programRan = true
	}
	s.quitSavedLocked(v, saved)
	v.conf["lock"] = lockSuspended
	return nil
}

// failSuspendLocked is vm_suspend's cleanup after a failed save: the
// state volume is freed and its keys removed; "lock: suspending" stays.
func (s *Simulator) failSuspendLocked(v *vm, volid string) {
	if st, vol := s.findVolumeLocked(volid, v.node); vol != nil {
		s.freeVolumeLocked(st, vol)
	}
	for _, k := range []string{"vmstate", "runningmachine", "runningcpu"} {
		delete(v.conf, k)
	}
}

// quitSavedLocked is QEMU's quit once the guest's state is saved: the VM
// holds no process and no host memory, events of this boot (the agent
// coming up) are void, and saved is what its resume takes up.
func (s *Simulator) quitSavedLocked(v *vm, saved *savedGuest) {
	v.saved = saved
	v.running, v.agentUp, v.pid, v.paused = false, false, 0, false
	v.bootGen++
}

// handleResume is POST .../status/resume: a VM locked "suspended" is
// started from its saved state (vm_start), a running one continued (QMP
// cont; nothing when it runs already); any other is "VM N not running".
func (s *Simulator) handleResume(q *apiRequest) (any, error) {
	if err := checkSkiplock(q); err != nil {
		return nil, err
	}
	if q.boolean("nocheck", false) && (q.auth == nil || q.auth.userString() != "root@pam") {
		return nil, paramError(map[string]string{"nocheck": "Only root may use this option."})
	}
	v, err := s.vmOnNodeLocked(q)
	if err != nil {
		return nil, err
	}
	suspended := v.conf["lock"] == lockSuspended
	if !suspended && !v.running {
		return nil, serverError("VM %d not running", v.vmid)
	}
	d := time.Duration(0)
	if suspended {
		gib := float64(v.memoryBytes()) / (1 << 30)
		d = s.cfg.Latency.Resume.D() + time.Duration(gib*float64(s.cfg.Latency.ResumePerGiB.D()))
	}
	return s.schedulePowerTaskLocked(q, "qmresume", d, func(v *vm, skiplock bool, t *task, at time.Time) {
		if suspended {
			t.finish(at, s.startLocked(v, skiplock, t, at))
			return
		}
		t.finish(at, s.continueLocked(v, skiplock))
	})
}

// continueLocked is RunState.pm vm_resume: nothing for a VM that runs, the
// lock check, then QMP cont.
func (s *Simulator) continueLocked(v *vm, skiplock bool) error {
	if s.vms[v.vmid] != v {
		return fmt.Errorf("Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist", v.node, v.vmid) //nolint:staticcheck,revive // ST1005/error-strings: Proxmox's own message, verbatim on the wire
	}
	if !v.running {
		return fmt.Errorf("VM %d not running", v.vmid)
	}
	if v.isTemplate() {
		return fmt.Errorf("VM %d is a template and cannot be resumed!", v.vmid) //nolint:staticcheck,revive // ST1005/error-strings: Proxmox's own message, verbatim on the wire
	}
	if !v.paused {
		return nil
	}
	if !skiplock {
		if err := checkLock(v); err != nil {
			return err
		}
	}
	saved := v.saved
	v.paused, v.saved = false, nil
	if s.guest != nil && saved != nil && saved.programRan {
		s.guest.resumeLocked(v, v.bootGen)
	}
	return nil
}

// resumeFromDiskLocked is vm_start of a VM locked "suspended" (from
// status/resume or status/start): QEMU starts from the saved state, the
// guest is back as it was, then the state volume is freed and the keys
// and the lock are removed (vm_start_nolock). The caller checked the
// template, the lock and the node's memory.
func (s *Simulator) resumeFromDiskLocked(v *vm, t *task, at time.Time) error {
	_, vol := s.findVolumeLocked(v.conf["vmstate"], v.node)
	if vol == nil {
		// -loadstate of a file that is not there.
		return fmt.Errorf("start failed: QEMU exited with code 1")
	}
	t.logf("Resuming suspended VM")
	resume := s.resumeSimulatedGuestLocked
	if v.image != nil {
		resume = s.resumeRealGuestLocked
	}
	if err := resume(v, vol, at); err != nil {
		return err
	}
	t.logf("Resumed VM, removing state")
	s.dropVMStateLocked(v)
	delete(v.conf, "lock")
	return nil
}

// resumeSimulatedGuestLocked puts a simulated guest back as it was saved
// in vol: its memory, its agent, its program continued (or started, if
// the suspend came before it).
func (s *Simulator) resumeSimulatedGuestLocked(v *vm, vol *volume, at time.Time) error {
	if err := s.restoreMemoryLocked(v, vol.data); err != nil {
		return fmt.Errorf("start failed: QEMU exited with code 1: %w", err)
	}
	saved := v.saved
	if saved == nil {
		// Suspended by another simulator run's state: a guest with
		// nothing but its memory.
		saved = &savedGuest{}
	}
	v.saved = nil
	s.lastPID++
	v.running, v.startedAt, v.pid, v.agentUp = true, at, s.lastPID, saved.agentUp
	v.bootGen++
	gen := v.bootGen
	switch {
	case s.guest != nil && saved.programRan:
		s.guest.resumeLocked(v, gen)
	case s.guest != nil:
		// Suspended before its program started: it starts as in a boot.
		s.scheduleGuestProgramLocked(v, gen, at)
	}
	if !saved.agentUp {
		s.scheduleAgentLocked(v, gen, at)
	}
	return nil
}

// dropVMStateLocked frees a VM's state volume and removes the keys that
// went with it, as vm_start_nolock after a resume and update_vm's
// delete=vmstate do. A guest program a suspend stopped ends with it.
func (s *Simulator) dropVMStateLocked(v *vm) {
	if volid := v.conf["vmstate"]; volid != "" && privileges.OwnedBy(volid, strconv.Itoa(v.vmid)) {
		if st, vol := s.findVolumeLocked(volid, v.node); vol != nil {
			s.freeVolumeLocked(st, vol)
		}
	}
	for _, k := range []string{"vmstate", "running-nets-host-mtu", "runningmachine", "runningcpu"} {
		delete(v.conf, k)
	}
	if v.saved != nil && !v.running {
		if v.saved.programRan && s.guest != nil {
			s.guest.stopLocked(v.vmid)
		}
		v.saved = nil
	}
}

// vmstateStorageLocked is find_vmstate_storage: the config's
// vmstatestorage, else a shared storage holding one of the VM's disks,
// else a local one (each preferring a file storage, by id), else "local".
func (s *Simulator) vmstateStorageLocked(v *vm) string {
	if sid := v.conf["vmstatestorage"]; sid != "" {
		return sid
	}
	var sids []string
	for _, k := range driveKeys(v.conf) {
		d := parseDrive(v.conf[k])
		sid, _, ok := strings.Cut(d.file, ":")
		if d.isCDROM() || !ok || slices.Contains(sids, sid) {
			continue
		}
		sids = append(sids, sid)
	}
	slices.Sort(sids)
	var shared, local string
	for _, sid := range sids {
		st := s.storages[sid]
		if st == nil {
			continue
		}
		dst := &local
		if st.shared {
			dst = &shared
		}
		if *dst == "" || st.fileBased() {
			*dst = sid
		}
	}
	return cmp.Or(shared, local, "local")
}

// vmstateVolid names the state volume of a suspend on day at:
// __snapshot_save_vmstate's vm-<vmid>-state-suspend-<date>, with ".raw"
// on a file storage, where it lies under the VM's directory.
func vmstateVolid(st *storage, vmid int, at time.Time) string {
	name := fmt.Sprintf("vm-%d-state-suspend-%s", vmid, at.Format("2006-01-02"))
	if st.fileBased() {
		return fmt.Sprintf("%s:%d/%s.raw", st.id, vmid, name)
	}
	return st.id + ":" + name
}
