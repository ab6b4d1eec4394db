package proxmox

import (
	"fmt"
	"strings"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Suspend to disk on Proxmox VE (qemu-server src/PVE/API2/Qemu.pm
// vm_suspend with todisk, src/PVE/QemuServer/RunState.pm vm_suspend): the
// task sets "lock: suspending" and writes the state volume's id into the
// config's vmstate; once the guest's memory is saved QEMU quits and the lock
// becomes "suspended", which is the one mark of a suspended VM (its status
// reads "stopped"). A failed save frees the volume, removes vmstate and
// leaves "lock: suspending" for an admin to clear (qm unlock). status/resume
// (vm_resume) starts a VM locked "suspended" from its state (vm_start),
// which then frees the volume and removes the lock (QemuServer.pm
// vm_start_nolock). A destroy ignores the "suspended" lock and frees the
// state with the disks (QemuServer.pm destroy_vm, "fix #4358"), so a
// suspended VM is deleted in one operation like a stopped one.

// The locks of a suspend to disk.
const (
	lockSuspending = "suspending"
	lockSuspended  = "suspended"
)

// Task operations of SetPower's suspend and resume (also the status/<op>
// endpoints they call).
const (
	opSuspend = "suspend"
	opResume  = "resume"
)

// suspension is where a VM stands in a suspend to disk, from its config.
type suspension int

const (
	notSuspended suspension = iota
	// suspending: the memory is being saved (lock suspending, vmstate set);
	// the guest still runs until QEMU quits.
	suspending
	// suspendFailed: a save failed; its cleanup removed vmstate and left
	// "lock: suspending", which only an admin clears (qm unlock).
	suspendFailed
	// suspended: QEMU has quit; the state waits on storage for a resume.
	suspended
)

func suspensionOf(cfg vmConfig) suspension {
	switch {
	case cfg["lock"] == lockSuspended:
		return suspended
	case cfg["lock"] == lockSuspending && cfg["vmstate"] != "":
		return suspending
	case cfg["lock"] == lockSuspending:
		return suspendFailed
	}
	return notSuspended
}

// powerState is the power a VM's status and lock say: "suspended" is a
// stopped VM whose state waits to be resumed. A VM locked "suspending"
// reads as its status does: its guest runs until the save is done, and a
// failed save leaves it running with that lock.
func powerState(status, lock string) provider.PowerState {
	if lock == lockSuspended {
		return provider.PowerSuspended
	}
	switch status {
	case "running":
		return provider.PowerRunning
	case "stopped":
		return provider.PowerStopped
	case "paused", "suspended":
		return provider.PowerPaused
	}
	return provider.PowerUnknown
}

// powerCall is what SetPower sends: the status/<op> endpoint and its
// parameters, or nothing (op empty) when the VM already is where action
// leads.
type powerCall struct {
	op   string
	body map[string]any
}

// powerCallFor decides SetPower's request for action on a VM with config
// cfg and status status (qemu-server's vmstatus: "running" also while
// paused). A suspended VM counts as not running: PowerOn and PowerResume
// resume it (status/resume, which starts it from its state), PowerOff and
// PowerShutdown and PowerSuspend leave it. A VM whose memory is being
// saved is left to its suspend.
func powerCallFor(action provider.PowerAction, cfg vmConfig, status string, vmid int) (powerCall, error) {
	s := suspensionOf(cfg)
	running := s != suspended && (status == "running" || status == "paused")
	switch action {
	case provider.PowerOn, provider.PowerResume:
		switch {
		case s == suspended:
			return powerCall{op: opResume}, nil
		case running:
			return powerCall{}, nil
		case action == provider.PowerResume:
			return powerCall{}, notSuspendedError(vmid)
		}
		return powerCall{op: opStart}, nil
	case provider.PowerOff, provider.PowerShutdown:
		if !running {
			return powerCall{}, nil
		}
		if action == provider.PowerOff {
			return powerCall{op: opStop}, nil
		}
		return powerCall{op: opShutdown}, nil
	case provider.PowerSuspend:
		switch {
		case s == suspended || s == suspending:
			return powerCall{}, nil
		case !running:
			return powerCall{}, notRunningError(vmid)
		}
		// The state storage is Proxmox's pick (find_vmstate_storage): the
		// config's vmstatestorage, else the storage of the VM's disks.
		return powerCall{op: opSuspend, body: map[string]any{"todisk": 1}}, nil
	}
	return powerCall{}, checkPowerAction(action)
}

// checkPowerAction refuses an action SetPower does not know.
func checkPowerAction(action provider.PowerAction) error {
	switch action {
	case provider.PowerOn, provider.PowerOff, provider.PowerShutdown, provider.PowerSuspend, provider.PowerResume:
		return nil
	}
	return provider.Errorf(provider.ClassPermanent, "InvalidPowerAction", "power action %q is not on, off, shutdown, suspend or resume", action)
}

func notRunningError(vmid int) error {
	return provider.Errorf(provider.ClassPermanent, "NotRunning", "VM %d does not run: it has no state to suspend", vmid)
}

func notSuspendedError(vmid int) error {
	return provider.Errorf(provider.ClassPermanent, "NotSuspended", "VM %d is stopped with no saved state (no lock suspended): there is nothing to resume, and it is not booted in its place", vmid)
}

// powerRefused maps Proxmox's "VM N not running" to a suspend or a resume
// (the VM stopped between SetPower's read and its request) to the error
// SetPower gives for that state.
func powerRefused(op string, vmid int, err error) error {
	if !strings.Contains(apiMessage(err), fmt.Sprintf("VM %d not running", vmid)) {
		return nil
	}
	switch op {
	case opSuspend:
		return notRunningError(vmid)
	case opResume:
		return notSuspendedError(vmid)
	}
	return nil
}

// suspendedResult is EnsureVM's answer for a VM in a suspend to disk, nil
// for any other. A suspended VM is left as it is, no write and no task;
// one whose memory is being saved is waited for. A failed save is nil too:
// the VM is read as what it is (it runs, or its guest powered off), with
// the lock left for an admin.
func (c *ensureCall) suspendedResult(cfg vmConfig) *provider.EnsureResult {
	switch suspensionOf(cfg) {
	case suspended:
		c.p.release(c.spec.Owner.UID, c.prog.VMID, true)
		c.prog.Task = nil
		return c.result(provider.PhaseSuspended, 0, "VM %d is suspended to disk", c.prog.VMID)
	case suspending:
		c.prog.Task = nil
		return c.result(provider.PhaseSuspended, lockedVM, "VM %d is being suspended to disk (lock suspending); waiting for its memory to be saved", c.prog.VMID)
	case suspendFailed:
		c.log.Info("A suspend to disk of the VM failed and left lock suspending; an admin clears it with qm unlock", "vmid", c.prog.VMID)
	}
	return nil
}

// suspendLockWait is the wait of DeleteVM (and the media removal) for a
// VM in a suspend: nil when its lock does not stop the operation.
func suspendLockWait(cfg vmConfig, vmid int, what string) *provider.DeleteResult {
	switch suspensionOf(cfg) {
	case suspending:
		return &provider.DeleteResult{RetryAfter: lockedVM, Message: fmt.Sprintf("VM %d is being suspended to disk; waiting to %s", vmid, what)}
	case suspendFailed:
		return &provider.DeleteResult{RetryAfter: lockedVM, Message: fmt.Sprintf(
			"VM %d is locked (suspending) by a suspend to disk that failed; waiting to %s: `qm unlock %d` on its node clears the lock", vmid, what, vmid)}
	}
	return nil
}
