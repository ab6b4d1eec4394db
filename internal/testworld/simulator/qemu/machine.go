// Package qemu runs real Linux guests for HyperFleet's tests: a QEMU
// process per VM, its QMP monitor and its QEMU guest agent, spoken to over
// unix sockets with their JSON protocols. The Proxmox simulator boots
// templates marked as real guests with it, and hack/guest-image prepares
// the guest image with it. Nothing in the operator imports it.
package qemu

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/hyperfleet/hyperfleet/internal/procgroup"
)

// Machine is what one QEMU process emulates. The kernel and initramfs are
// booted directly (-kernel/-initrd/-append): no firmware and no boot
// loader to run under emulation, and no partition table or boot loader in
// the image.
type Machine struct {
	// Binary is the emulator; empty means qemu-system-x86_64 on PATH.
	Binary string
	// Accel is QEMU's accelerator, "tcg" when empty (KVM is often present
	// on CI machines without being usable: nested virtualisation).
	Accel string
	// Name is shown in process lists.
	Name string
	// CPU is the emulated CPU model (-cpu), QEMU's default when empty.
	CPU       string
	Cores     int
	MemoryMiB int
	// Kernel, Initrd and Append boot the guest.
	Kernel, Initrd, Append string
	// Disk is the boot disk (the VM's linked clone: a qcow2 overlay) and
	// DiskFormat its format ("qcow2" when empty). It is attached as
	// Proxmox attaches scsi0: a SCSI disk on virtio-scsi.
	Disk, DiskFormat string
	// CDROM is an ISO attached as a SCSI CD-ROM (the NoCloud seed); empty
	// for none. CDROMID is its device id (the Proxmox config key, such as
	// ide2), which QMP's eject names. A CDROMID without CDROM is the drive
	// with no medium: what a machine that ejected its ISO has, and what a
	// QEMU resuming its saved state must have too.
	CDROM, CDROMID string
	// MAC is the virtio NIC's address (net0's macaddr).
	MAC string
	// Net is the NIC's user-mode network, unless Tap is set.
	Net UserNet
	// Tap, when its Netns is set, attaches the NIC to a bridge in a network
	// namespace instead of a user-mode network: QEMU runs in that
	// namespace (ip netns exec) and creates the tap device.
	Tap Tap
	// Console receives the serial console (appended).
	Console string
	// SocketDir holds the QMP and guest agent sockets. Unix socket paths
	// are limited to 107 bytes: keep it short.
	SocketDir string
	// TPMCtrl, when set, is the control socket of a running swtpm (swtpm
	// socket --ctrl type=unixio,path=...), attached as Proxmox attaches
	// tpmstate0: a TPM TIS device on QEMU's emulator backend
	// (add_tpm_device in qemu-server's src/PVE/QemuServer.pm). QEMU hands
	// swtpm the data channel over that socket.
	TPMCtrl string
	// VMGenID, when set, is the VM generation id (Proxmox's vmgenid, a
	// UUID), exposed as qemu-server does (-device vmgenid). A guest
	// resumed with another id than the saved one's sees the change and
	// reseeds its kernel's random number generator (Linux's vmgenid
	// driver): without it, clones resumed from one state would draw the
	// same random numbers until the next reseed.
	VMGenID string
	// Incoming, when set, is a saved state (SaveState) that QEMU loads
	// instead of booting: the guest goes on where the saved one stopped.
	// Every device of the saved machine must be here with the same
	// settings (memory, cores, CPU, kernel, disks, NIC); the NIC's
	// network back end and the disks' files may differ.
	Incoming string
}

// UserNet is a user-mode (slirp) network: the guest gets Guest by DHCP in
// Net, reaches the host's loopback at Host and a DNS forwarder at DNS;
// everything else it connects to is connected to from the host.
type UserNet struct {
	Net, Host, DNS, Guest string
}

// Tap is a NIC's tap device in a network namespace: Name (at most 15
// bytes) is created by QEMU when it starts and goes away when it exits;
// Script, an executable QEMU runs with the device's name as its argument
// (QEMU's script=), plugs it into the namespace's bridge.
type Tap struct {
	Netns, Name, Script string
}

// DefaultUserNet is QEMU's own: the guest is 10.0.2.15 and reaches the
// host's loopback at 10.0.2.2.
var DefaultUserNet = UserNet{Net: "10.0.2.0/24", Host: "10.0.2.2", DNS: "10.0.2.3", Guest: "10.0.2.15"}

// QMPSocket is the path of the QMP monitor's socket.
func (m Machine) QMPSocket() string { return filepath.Join(m.SocketDir, "qmp.sock") }

// AgentSocket is the path of the guest agent's socket.
func (m Machine) AgentSocket() string { return filepath.Join(m.SocketDir, "qga.sock") }

// Args is QEMU's command line.
func (m Machine) Args() []string {
	accel := m.Accel
	if accel == "" {
		accel = "tcg"
	}
	format := m.DiskFormat
	if format == "" {
		format = "qcow2"
	}
	netdev := "user,id=net0"
	switch {
	case m.Tap.Netns != "":
		netdev = "tap,id=net0,ifname=" + m.Tap.Name + ",script=" + m.Tap.Script + ",downscript=no"
	case m.Net != (UserNet{}):
		netdev += ",net=" + m.Net.Net + ",host=" + m.Net.Host + ",dns=" + m.Net.DNS + ",dhcpstart=" + m.Net.Guest
	}
	args := []string{
		"-name", "guest=" + m.Name + ",debug-threads=on",
		"-machine", "pc,accel=" + accel,
		"-smp", strconv.Itoa(max(m.Cores, 1)), "-m", strconv.Itoa(max(m.MemoryMiB, 256)),
		"-nodefaults", "-no-user-config", "-display", "none", "-vga", "none",
		"-kernel", m.Kernel, "-initrd", m.Initrd, "-append", m.Append,
		"-device", "virtio-scsi-pci,id=scsihw0",
		"-drive", "file=" + m.Disk + ",if=none,id=drive-scsi0,format=" + format + ",cache=unsafe,discard=unmap",
		"-device", "scsi-hd,bus=scsihw0.0,drive=drive-scsi0,id=scsi0,bootindex=100",
		"-netdev", netdev,
		"-device", "virtio-net-pci,netdev=net0,id=net0,mac=" + m.MAC,
		// Entropy for the guest's first TLS connections, without waiting.
		"-object", "rng-random,id=rng0,filename=/dev/urandom", "-device", "virtio-rng-pci,rng=rng0",
		"-chardev", "socket,id=qga0,path=" + m.AgentSocket() + ",server=on,wait=off",
		"-device", "virtio-serial-pci,id=vserial0",
		"-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
		"-chardev", "socket,id=qmp,path=" + m.QMPSocket() + ",server=on,wait=off",
		"-mon", "chardev=qmp,mode=control",
		"-chardev", "file,id=serial0,path=" + m.Console + ",append=on",
		"-serial", "chardev:serial0",
	}
	if m.CPU != "" {
		args = append(args, "-cpu", m.CPU)
	}
	if m.TPMCtrl != "" {
		args = append(args,
			"-chardev", "socket,id=tpmchar,path="+m.TPMCtrl,
			"-tpmdev", "emulator,id=tpmdev,chardev=tpmchar",
			"-device", "tpm-tis,tpmdev=tpmdev")
	}
	if m.CDROM != "" || m.CDROMID != "" {
		id := cmp.Or(m.CDROMID, "cdrom0")
		drive := "if=none,id=drive-" + id + ",media=cdrom,readonly=on"
		if m.CDROM != "" {
			drive = "file=" + m.CDROM + "," + drive
		}
		args = append(args,
			"-drive", drive,
			"-device", "scsi-cd,bus=scsihw0.0,drive=drive-"+id+",id="+id)
	}
	if m.VMGenID != "" {
		args = append(args, "-device", "vmgenid,guid="+m.VMGenID)
	}
	if m.Incoming != "" {
		args = append(args, "-incoming", "exec:cat "+shellQuote(m.Incoming))
	}
	return args
}

// Process is a running QEMU.
type Process struct {
	Machine Machine
	cmd     *exec.Cmd
	leader  *procgroup.Leader // QEMU leads its group; signalled only unreaped
	done    chan struct{}
	err     error
}

// Start starts QEMU. Its own output (not the guest's console) goes to
// Machine.Console's directory as qemu.log.
func Start(m Machine) (*Process, error) {
	bin := m.Binary
	if bin == "" {
		bin = "qemu-system-x86_64"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("QEMU %s is not installed (hack/test-deps.sh --guest installs Debian's qemu-system-x86): %w", bin, err)
	}
	for _, f := range []string{m.Kernel, m.Initrd, m.Disk} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("guest file: %w", err)
		}
	}
	if len(m.QMPSocket()) > 100 || len(m.AgentSocket()) > 100 {
		return nil, fmt.Errorf("socket directory %s is too long for unix socket paths", m.SocketDir)
	}
	log, err := os.OpenFile(filepath.Join(filepath.Dir(m.Console), "qemu.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("QEMU log: %w", err)
	}
	cmd := exec.Command(path, m.Args()...)
	if m.Tap.Netns != "" {
		// ip execs QEMU in the namespace: the process (group) is QEMU's.
		cmd = exec.Command("ip", append([]string{"netns", "exec", m.Tap.Netns, path}, m.Args()...)...)
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	p := &Process{Machine: m, cmd: cmd, leader: procgroup.New(cmd), done: make(chan struct{})}
	go func() {
		p.err = p.leader.Wait(procgroup.KillGroup)
		_ = log.Close()
		logCPU(p)
		close(p.done)
	}()
	return p, nil
}

// EnvCPULog names a file to which every QEMU that exits appends a line:
// its name, whether it resumed a saved state, and its CPU time in
// seconds (user and system). make test-guest sets it to measure what the
// guests cost (docs/guest-snapshots.md).
const EnvCPULog = "HF_QEMU_CPU_LOG"

func logCPU(p *Process) {
	path := os.Getenv(EnvCPULog)
	if path == "" || p.cmd.ProcessState == nil {
		return
	}
	ps := p.cmd.ProcessState
	kind := "boot"
	if p.Machine.Incoming != "" {
		kind = "resume"
	}
	line := fmt.Sprintf("%s %s %.2f\n", p.Machine.Name, kind, (ps.UserTime() + ps.SystemTime()).Seconds())
	if f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
		_, _ = f.WriteString(line)
		_ = f.Close()
	}
}

// Pid is QEMU's process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when QEMU has exited: the guest powered off, or it was
// killed.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is QEMU's exit error, once Done is closed (nil after a guest
// power-off).
func (p *Process) Err() error { return p.err }

// Kill ends QEMU at once, like pulling the power cord. A QEMU that has
// exited is left alone: its group's id may be another's by now.
func (p *Process) Kill() {
	_ = p.leader.Signal(syscall.SIGKILL)
}

// ErrNotRunning is returned for calls on a QEMU that has exited.
var ErrNotRunning = errors.New("QEMU is not running")

// dialUnix connects to a socket QEMU serves.
func dialUnix(path string) (net.Conn, error) {
	c, err := net.Dial("unix", path)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", path, err)
	}
	return c, nil
}

// KernelArgs is the kernel command line for an image made by
// hack/guest-image: the root file system found by label, the console on
// the first serial port, quiet (the kernel's and systemd's boot messages
// left off the console: a serial console is written a byte at a time,
// the kernel polling the UART between bytes, all of it emulated; a boot
// to the end of cloud-init took 62 to 69 CPU-seconds of QEMU with quiet
// against 80 to 82 without, alone on the idle CI machine. What the tests
// read there, cloud-init's output and the guests' own messages, is
// written to the console either way), and mitigations=off: the guests run under TCG,
// which emulates every instruction and no speculation, so the kernel's
// side-channel mitigations (retpolines, buffer clears on every kernel exit)
// only cost time (3 to 11 s of a 60 to 80 s boot to the end of cloud-init
// in paired boots on the idle CI machine, too little to see under CI's
// load; docs/testing.md, "CI timings"), and no_timer_check: early in its
// boot the kernel checks that the timer interrupt arrives through the
// IO-APIC within a few emulated ticks, and on a loaded host TCG can miss
// them; the kernel then panics ("IO-APIC + timer doesn't work!") and the
// panicked guest spins a core until its caller gives up (a state build,
// hack/guest-image/state.go, spun for 10 minutes). QEMU's emulated timer
// is wired right, so the check only adds that risk (cloud images boot VMs
// with it for the same reason). Proxmox boots a template's own boot
// loader and command line; the simulator boots the kernel directly, so
// the command line is the test world's choice.
func KernelArgs(extra ...string) string {
	return strings.Join(append([]string{"root=LABEL=hyperfleet-root", "ro", "console=ttyS0,115200", "quiet", "net.ifnames=0", "mitigations=off", "no_timer_check"}, extra...), " ")
}
