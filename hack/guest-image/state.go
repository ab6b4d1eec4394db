package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/qemu"
)

// stateMachine is the machine the saved state is made on, which every
// clone that resumes it must have (the Proxmox simulator boots the others
// cold): the real-guest templates' one core and 1 GiB
// (internal/testworld/devenv/objects.go), and kvm64, qemu-server's CPU
// type without a cpu option (cpuModel in
// internal/testworld/simulator/proxmox/realguest.go).
var stateMachine = struct {
	Cores, MemoryMiB int
	CPU              string
}{1, 1024, "kvm64"}

// guestState is the Proxmox simulator's GuestState.
type guestState struct {
	File      string `json:"file"`
	Disk      string `json:"disk"`
	Cores     int    `json:"cores"`
	MemoryMiB int    `json:"memoryMiB"`
	CPU       string `json:"cpu"`
}

// stateKey names the saved state of img: the image (its directory's name
// is the hash of everything in it), the kernel command line, the machine
// and QEMU's version (a state loads only into the QEMU that wrote it,
// or one that reads its format).
func stateKey(img image) (string, error) {
	out, err := exec.Command("qemu-system-x86_64", "--version").Output()
	if err != nil {
		return "", fmt.Errorf("QEMU's version: %w", err)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	m := fmt.Sprintf("%d %d %s %d", stateMachine.Cores, stateMachine.MemoryMiB, stateMachine.CPU, stateFormat)
	return "state-" + hash([]byte(img.Disk), []byte(img.Kernel), []byte(img.Initrd), []byte(img.Append), []byte(first), []byte(m)), nil
}

// stateFormat changes when the saved machine's devices do (2: vmgenid),
// so that no state of another machine is resumed.
const stateFormat = 2

// stateTimeout bounds the boot to the guest agent and the save; the boot
// takes 20 to 25 CPU-seconds under TCG (no seed, so no cloud-init).
const stateTimeout = 10 * time.Minute

// buildState boots img without a seed, waits until the guest agent
// answers and systemd has finished starting the system, and saves the
// state (qemu.SaveState) with the disk it belongs to: a qcow2 overlay of
// img's disk, which clones' overlays are backed by.
func buildState(ctx context.Context, out string, img image) error {
	ctx, cancel := context.WithTimeout(ctx, stateTimeout)
	defer cancel()
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "guest-state-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	disk := filepath.Join(out, "disk.qcow2")
	if err := run("qemu-img", "create", "-q", "-f", "qcow2", "-F", img.Format, "-b", img.Disk, disk); err != nil {
		return err
	}
	m := qemu.Machine{Name: "guest-state", Cores: stateMachine.Cores, MemoryMiB: stateMachine.MemoryMiB, CPU: stateMachine.CPU,
		Kernel: img.Kernel, Initrd: img.Initrd, Append: img.Append, Disk: disk, MAC: "bc:24:11:00:00:01",
		Net: qemu.DefaultUserNet, Console: filepath.Join(work, "console.log"), SocketDir: work,
		// Every clone resumes with its own generation id: the change
		// makes its kernel reseed its random number generator.
		VMGenID: "00000000-0000-4000-8000-000000000001"}
	progress("booting %s to save its state (QEMU, console %s)", img.Disk, m.Console)
	p, err := qemu.Start(m)
	if err != nil {
		return err
	}
	defer p.Kill()
	if err := qemu.WaitAgent(ctx, m.AgentSocket(), p.Done()); err != nil {
		return err
	}
	// What starts at boot is done before the save, not after each resume.
	res, err := qemu.AgentExec(ctx, m.AgentSocket(), "systemctl", "is-system-running", "--wait")
	if err != nil {
		return err
	}
	if st := strings.TrimSpace(res.Stdout); st != "running" && st != "degraded" {
		return fmt.Errorf("the guest's systemd is %q after its boot: %s", st, res.Stderr)
	}
	cpu, _ := p.CPUTime()
	if err := qemu.SaveState(ctx, p, filepath.Join(out, "state")); err != nil {
		return err
	}
	progress("state saved after %s of QEMU CPU", cpu)
	return nil
}

// withState adds img's saved state to img, building it when not cached.
func withState(ctx context.Context, dir string, img *image) error {
	key, err := stateKey(*img)
	if err != nil {
		return err
	}
	out := filepath.Join(dir, key)
	if err := cached(out, func(tmp string) error { return buildState(ctx, tmp, *img) }); err != nil {
		return fmt.Errorf("saved state of %s: %w", img.Disk, err)
	}
	img.State = &guestState{File: filepath.Join(out, "state"), Disk: filepath.Join(out, "disk.qcow2"),
		Cores: stateMachine.Cores, MemoryMiB: stateMachine.MemoryMiB, CPU: stateMachine.CPU}
	return nil
}
