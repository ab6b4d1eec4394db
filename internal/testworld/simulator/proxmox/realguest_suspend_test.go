package proxmoxsim

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/qemu"
	"github.com/hyperfleet/hyperfleet/internal/testworld/tinyguest"
)

// TestRealGuestSuspendToDisk suspends a real guest to disk and resumes it,
// on tinyguest (Debian's cloud kernel and a Go /init with a QEMU guest
// agent: the cheapest real guest, about 3.5 CPU-s a boot). The suspend has
// a simulated guest's lock, keys, volume and task, and the volume's
// content is QEMU's saved state in a file; QEMU is gone while suspended.
// The resume is the same boot of the same guest (its kernel's boot id) in
// a new QEMU on the VM's own overlay, loading that file, which goes once
// loaded, with the volume. A suspended guest's destroy removes its state
// file with the volume. A pause of a real guest is still refused.
//
// Mutation: resumeRealGuestLocked without m.Incoming boots the guest
// afresh (another boot id) and fails this test; so does a launch on a new
// overlay (another inode). Leaving out freeVolumeLocked's os.Remove leaves
// the state file after the destroy and fails it. The old simulator failed
// the suspend task of every real guest.
func TestRealGuestSuspendToDisk(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a guest under TCG: make test runs it, the race run (-short) has nothing of the operator's to watch in it")
	}
	img := tinyguest.Build(t)
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(disk, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *Config) {
		c.Guest.WorkDir = filepath.Join(dir, "guests")
		c.Templates[0].GuestImage = &GuestImage{Disk: disk, Kernel: img.Kernel, Initrd: img.Initrd, Append: tinyguest.KernelCmdline}
		c.Templates[0].Cores, c.Templates[0].MemoryMiB = 1, 256
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e.wantExit(e.clone("101", nil), "OK")
	e.wantExit(e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/101/status/start", nil)), "OK")
	bootID := waitRealGuest(ctx, t, e)
	overlay := filepath.Join(dir, "guests", "vm-101", "disk-0.qcow2")
	before, err := os.Stat(overlay)
	if err != nil {
		t.Fatal(err)
	}

	pause := e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/101/status/suspend", nil))
	if exit := finished(ctx, t, e, pause); exit != errRealGuestPause.Error() {
		t.Errorf("pause of a real guest: %q, want %q", exit, errRealGuestPause)
	}

	vol := suspendRealGuest(ctx, t, e)
	const volid = "local-lvm:vm-101-state-suspend-2026-01-02"
	if vol.VolID != volid || vol.Size != (2*256+500)<<20 || vol.File == "" {
		t.Fatalf("state volume %+v, want %s of 2 x 256 + 500 MiB held in a file", vol, volid)
	}
	if fi, err := os.Stat(vol.File); err != nil || fi.Size() == 0 {
		t.Fatalf("the state volume's file: %v, %v", fi, err)
	}
	if _, err := e.sim.GuestExec(ctx, 101, bootIDCommand...); err == nil {
		t.Error("the guest still answers while suspended: QEMU did not quit")
	}

	resume := e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/101/status/resume", nil))
	if exit := finished(ctx, t, e, resume); exit != "OK" {
		t.Fatalf("resume: %q", exit)
	}
	if c := e.config("101"); c["lock"] != nil || c["vmstate"] != nil || c["runningmachine"] != nil {
		t.Errorf("config after the resume: %v", c)
	}
	if v, ok := stateVolume(e.sim, 101); ok {
		t.Errorf("the state volume outlived the resume: %+v", v)
	}
	pid := e.mustOK(e.call(http.MethodGet, "/nodes/pve1/qemu/101/status/current", nil)).dataMap(t)["pid"]
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%v/cmdline", pid))
	if err != nil || !strings.Contains(string(cmdline), "-incoming\x00exec:cat '"+vol.File+"'") {
		t.Errorf("the resumed QEMU (pid %v) does not load the state file: %q, %v", pid, cmdline, err)
	}
	if got := waitRealGuest(ctx, t, e); got != bootID {
		t.Errorf("boot id %s after the resume, want the suspended boot's %s: the guest booted anew", got, bootID)
	}
	after, err := os.Stat(overlay)
	if err != nil || !os.SameFile(before, after) {
		t.Errorf("the resumed guest's disk is not the overlay it was suspended with: %v", err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(vol.File); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the state file %s is still there a minute after the resume", vol.File)
		}
	}

	vol = suspendRealGuest(ctx, t, e)
	e.wantExit(e.upid(e.call(http.MethodDelete, "/nodes/pve1/qemu/101", nil)), "OK")
	if _, err := os.Stat(vol.File); !os.IsNotExist(err) {
		t.Errorf("the state file of a destroyed VM: %v, want it gone", err)
	}
}

// bootIDCommand prints a tinyguest's boot id: its /init is also its
// tools (cat among them).
var bootIDCommand = []string{"/init", "cat", "/proc/sys/kernel/random/boot_id"}

// waitRealGuest waits until VM 101's guest agent answers and returns its
// kernel's boot id.
func waitRealGuest(ctx context.Context, t *testing.T, e *simEnv) string {
	t.Helper()
	for {
		res, err := e.sim.GuestExec(ctx, 101, bootIDCommand...)
		var ce *qemu.CommandError
		switch {
		case err == nil && res.ExitCode == 0:
			return strings.TrimSpace(res.Stdout)
		case errors.As(err, &ce) || err == nil:
			t.Fatalf("VM 101's guest agent: %v %+v", err, res)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the guest agent of VM 101 never answered: %v %+v", err, res)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// suspendRealGuest suspends VM 101 to disk and returns its state volume.
func suspendRealGuest(ctx context.Context, t *testing.T, e *simEnv) VolumeState {
	t.Helper()
	upid := e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/101/status/suspend", form("todisk", "1")))
	if exit := finished(ctx, t, e, upid); exit != "OK" {
		t.Fatalf("suspend to disk: %q", exit)
	}
	if st := e.mustOK(e.call(http.MethodGet, "/nodes/pve1/qemu/101/status/current", nil)).dataMap(t); st["status"] != "stopped" || st["lock"] != "suspended" {
		t.Fatalf("after the suspend: %v", st)
	}
	vol, ok := stateVolume(e.sim, 101)
	if !ok {
		t.Fatal("no state volume after the suspend")
	}
	return vol
}

// finished waits for a task to stop and returns its exit status.
func finished(ctx context.Context, t *testing.T, e *simEnv, upid string) string {
	t.Helper()
	for {
		if st := e.task(upid); st["status"] == "stopped" {
			return fmt.Sprint(st["exitstatus"])
		}
		select {
		case <-ctx.Done():
			t.Fatalf("task %s still running", upid)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
