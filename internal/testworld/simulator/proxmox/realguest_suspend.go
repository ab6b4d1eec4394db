package proxmoxsim

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/qemu"
)

// A real guest's suspend to disk is QEMU's own: its state migrated to a
// file (qemu.SaveState: the guest stopped, its RAM and device state
// written, QEMU ended), which is the content of the VM's state volume, as
// savevm-start writes Proxmox's. The volume, its size, the lock, the
// config keys and the task are a simulated guest's (suspend.go); only the
// save itself takes the time QEMU takes, not a modelled one. The resume
// starts QEMU with the machine it saved (its own overlay disk, its MAC and
// network, its CD-ROM drive, its TPM) and the file as its incoming state
// (qemu.Resume): the same guest goes on where it stopped, its clock where
// it stood at the save. Neither Proxmox nor the simulator sets a resumed
// guest's clock; HyperFleet's agent steps it (internal/agent, freshen).

// realSuspendTimeout bounds a real guest's save: its RAM (zero pages cost
// next to nothing) written to the host's disk.
const realSuspendTimeout = 5 * time.Minute

// stateFile is where VM vmid's state volume volid keeps its content on
// the host: in the VM's directory, named after the volume.
func (r *realGuests) stateFile(vmid int, volid string) string {
	_, name, _ := strings.Cut(volid, ":")
	return filepath.Join(r.vmDir(vmid), filepath.Base(name))
}

// suspendRealGuestLocked saves v's running QEMU into its state volume
// volid (allocated by beginSuspendLocked) and finishes t when the save is
// over (endRealSuspendLocked). The save runs outside the lock; until it
// ends, QEMU's exit is the save's (realGuest.saving), not a power-off.
func (s *Simulator) suspendRealGuestLocked(v *vm, volid string, t *task) {
	r := s.real
	var g *realGuest
	if r != nil {
		g = r.vms[v.vmid]
	}
	if g == nil || g.gen != v.bootGen {
		// QEMU ended just before: as a VM that stopped under the save.
		s.failSuspendLocked(v, volid)
		t.finish(s.clock.Now(), fmt.Errorf("VM %d not running", v.vmid))
		return
	}
	g.saving = true
	file := r.stateFile(v.vmid, volid)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), realSuspendTimeout)
		err := qemu.SaveState(ctx, g.proc, file)
		cancel()
		if err != nil && !exited(g.proc) {
			// SaveState stops the guest before it writes: one whose save
			// failed runs on, as after a failed savevm-start.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if _, cerr := qemu.QMP(ctx, g.proc.Machine.QMPSocket(), "cont", nil); cerr != nil {
				s.log.Warn("Cannot continue a real guest after its failed save", "vmid", v.vmid, "err", cerr)
			}
			cancel()
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		g.saving = false
		if s.closed {
			_ = os.Remove(file)
			return
		}
		t.finish(s.clock.Now(), s.endRealSuspendLocked(v, g, volid, file, err))
	}()
}

// endRealSuspendLocked is vm_suspend's end for a real guest whose save
// ended with saveErr (nil: the state is in file and QEMU has quit). As
// for a simulated guest: the lock becomes "suspended" and the volume
// holds the state (the file, from now on freed with it); a save that
// failed, or a guest that powered off under it, frees the volume and the
// keys and leaves "lock: suspending".
func (s *Simulator) endRealSuspendLocked(v *vm, g *realGuest, volid, file string, saveErr error) error {
	r := s.real
	ended := exited(g.proc)
	ours := s.vms[v.vmid] == v && v.running && v.bootGen == g.gen
	if ended && r.vms[v.vmid] == g {
		// What waitExit does for a QEMU that exited, at once: a resume
		// that follows must find the TPM state back in its volume.
		delete(r.vms, v.vmid)
		r.stopTPMLocked(g.tpm, g.node)
	}
	if ended && ours && saveErr != nil {
		// The guest powered off under the save, whose end waitExit left
		// to this.
		s.powerOffLocked(v)
	}
	_, vol := s.findVolumeLocked(volid, v.node)
	saved := saveErr == nil && ours && vol != nil
	if !saved {
		_ = os.Remove(file)
	}
	m := g.proc.Machine
	if s.vms[v.vmid] != v || v.conf["lock"] != lockSuspending {
		if saved {
			// Proxmox checks the lock before QEMU's quit; here QEMU has
			// quit with the state saved: the VM stops with its state,
			// which its next start resumes (vm_start resumes whenever
			// vmstate is set).
			vol.file = file
			s.quitSavedLocked(v, &savedGuest{machine: &m})
		}
		return fmt.Errorf("lock changed unexpectedly")
	}
	switch {
	case saveErr != nil && v.running:
		s.failSuspendLocked(v, volid)
		return fmt.Errorf("query-savevm failed with error '%w'", saveErr)
	case !saved:
		s.failSuspendLocked(v, volid)
		return fmt.Errorf("VM %d not running", v.vmid)
	}
	vol.file = file
	s.quitSavedLocked(v, &savedGuest{machine: &m})
	v.conf["lock"] = lockSuspended
	return nil
}

// resumeRealGuestLocked starts v's QEMU from the state saved in vol: the
// machine it saved, with the state as its incoming migration. The volume
// is freed by the caller at once, as vm_start frees it; the file, which
// QEMU reads as it starts, is removed once QEMU has loaded it
// (loadOwnState).
func (s *Simulator) resumeRealGuestLocked(v *vm, vol *volume, at time.Time) error {
	if v.saved == nil || v.saved.machine == nil || vol.file == "" {
		// A state this simulator did not save: -loadstate fails.
		return fmt.Errorf("start failed: QEMU exited with code 1")
	}
	r, err := s.realGuestsLocked()
	if err != nil {
		return fmt.Errorf("start failed: %w", err)
	}
	m := *v.saved.machine
	m.Incoming = vol.file
	if m.CDROM != "" {
		if _, err := os.Stat(m.CDROM); err != nil {
			// The ISO was ejected (ejectLocked removes its file): the
			// drive stays, with no medium, as it was saved.
			m.CDROM = ""
		}
	}
	gen := v.bootGen + 1
	if err := r.launchLocked(v, m, &realGuest{gen: gen, ownState: vol.file}); err != nil {
		return err
	}
	vol.file = ""
	v.saved = nil
	v.running, v.startedAt, v.pid, v.agentUp = true, at, r.vms[v.vmid].proc.Pid(), false
	v.bootGen = gen
	return nil
}

// loadOwnState lets a QEMU that resumes the VM's own saved state run and
// removes the state's file once QEMU has loaded it. A state that does not
// load ends QEMU: the VM stops, as a VM whose start failed.
func (r *realGuests) loadOwnState(ctx context.Context, vmid int, g *realGuest) bool {
	err := qemu.Resume(ctx, g.proc)
	_ = os.Remove(g.ownState)
	if err != nil {
		if ctx.Err() == nil {
			r.s.log.Error("Cannot resume a real guest from its saved state", "vmid", vmid, "err", err)
			g.proc.Kill()
		}
		return false
	}
	return true
}

// exited reports whether p has ended.
func exited(p *qemu.Process) bool {
	select {
	case <-p.Done():
		return true
	default:
		return false
	}
}
