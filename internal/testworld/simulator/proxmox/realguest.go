package proxmoxsim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/qemu"
	"github.com/hyperfleet/hyperfleet/internal/testworld/swtpm"
)

// GuestImage marks a template as a real guest: starting it, or any clone
// of it, boots QEMU with a copy-on-write overlay of Disk (the linked
// clone), the VM's NoCloud ISO as a CD-ROM, its cores, memory and net0 MAC,
// instead of running the guest hook. hack/guest-image builds such images.
type GuestImage struct {
	// Disk is the template's disk image, never written to.
	Disk string `json:"disk"`
	// Format is the disk's format, raw or qcow2 (raw when empty).
	Format string `json:"format,omitempty"`
	// Kernel and Initrd are booted directly, Append is the kernel command
	// line (the root file system by label, the serial console, when empty).
	Kernel string `json:"kernel"`
	Initrd string `json:"initrd"`
	Append string `json:"append,omitempty"`
	// State, when set, is this image saved at the point where it waits
	// for its configuration: clones that can resume it do
	// (realguest_resume.go).
	State *GuestState `json:"state,omitempty"`
}

func (g *GuestImage) validate() error {
	if g.Disk == "" || g.Kernel == "" || g.Initrd == "" {
		return errors.New("guestImage needs disk, kernel and initrd")
	}
	if g.Format != "" && g.Format != "raw" && g.Format != "qcow2" {
		return fmt.Errorf("guestImage format %q: use raw or qcow2", g.Format)
	}
	if st := g.State; st != nil && (st.File == "" || st.Disk == "" || st.Cores < 1 || st.MemoryMiB < 1 || st.CPU == "") {
		return errors.New("guestImage state needs file, disk, cores, memoryMiB and cpu (hack/guest-image --state prints them)")
	}
	return nil
}

// QEMUConfig configures how real guests run.
type QEMUConfig struct {
	// Binary is the emulator (qemu-system-x86_64 on PATH when empty).
	Binary string `json:"binary,omitempty"`
	// Img is qemu-img (on PATH when empty); it creates the overlays.
	Img string `json:"img,omitempty"`
	// Accel is QEMU's accelerator: tcg (the default) or kvm.
	Accel string `json:"accel,omitempty"`
	// Network, when set, puts the guests' NICs on a bridge in a network
	// namespace instead of QEMU's user-mode network.
	Network *TapNetwork `json:"network,omitempty"`
}

// TapNetwork is a bridge in a network namespace that the caller made and
// serves: its DHCP server leases the guests their addresses, and the
// servers guests use listen (or are forwarded to) at HostAddress. Each
// guest's QEMU runs in the namespace with a tap device (hf<vmid>) that
// it plugs into Bridge; the device goes when QEMU exits.
type TapNetwork struct {
	Netns  string `json:"netns"`
	Bridge string `json:"bridge"`
	// HostAddress is GuestHostAddress: the bridge's own address, say.
	HostAddress string `json:"hostAddress"`
}

// realGuests runs the QEMU processes of VMs cloned from templates with a
// GuestImage. Its map is guarded by the simulator's mutex; every wait on
// QEMU or on a socket happens outside it.
type realGuests struct {
	s       *Simulator
	cfg     QEMUConfig
	baseDir string
	ownsDir bool
	vms     map[int]*realGuest
	wg      sync.WaitGroup
	// tpmCA manufactures the guests' TPMs (realtpm.go), nil until one
	// starts.
	tpmCA *swtpm.LocalCA
}

// realGuest is one boot of one VM.
type realGuest struct {
	proc    *qemu.Process
	gen     int
	sockDir string
	stop    context.CancelFunc
	// tpm is its swtpm, nil without tpmstate0; node is where its volume is.
	tpm  *realTPM
	node string
	// seed is what a guest resumed from a saved state is given after the
	// resume, nil for a guest that boots; addr is the address its lease
	// must give it.
	seed *seedDoc
	addr string
	// ownState is the VM's own saved state this QEMU loads (a resume from
	// its suspend to disk, suspend.go), removed once loaded; empty for
	// any other start.
	ownState string
	// saving: the guest's state is being saved (suspendRealLocked), and
	// QEMU's exit is the save's to handle, not a power-off.
	saving bool
}

// realGuestsLocked returns the runner, creating it (and its work
// directory) on first use.
func (s *Simulator) realGuestsLocked() (*realGuests, error) {
	if s.real != nil {
		return s.real, nil
	}
	r := &realGuests{s: s, cfg: s.cfg.Guest.QEMU, vms: map[int]*realGuest{}}
	var err error
	if r.baseDir, r.ownsDir, err = guestWorkDir(s.cfg.Guest.WorkDir, "proxmox-sim-qemu-"); err != nil {
		return nil, err
	}
	s.real = r
	return r, nil
}

func (r *realGuests) vmDir(vmid int) string {
	return filepath.Join(r.baseDir, fmt.Sprintf("vm-%d", vmid))
}

// startLocked boots v's QEMU for boot generation gen. An error fails the
// start task, as a QEMU that does not start fails qm start.
func (r *realGuests) startLocked(v *vm, gen int) error {
	img := v.image
	dir := r.vmDir(v.vmid)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("start failed: %w", err)
	}
	overlay := filepath.Join(dir, "disk-0.qcow2")
	var state *GuestState
	var seed *seedDoc
	if _, err := os.Stat(overlay); os.IsNotExist(err) {
		// Only a first start resumes: afterwards the VM's disk is no
		// longer the one the saved state belongs to.
		var why string
		if state, seed, why = r.resumeLocked(v); why != "" {
			r.s.log.Warn("Booting a real guest cold instead of resuming its template's saved state", "vmid", v.vmid, "reason", why)
		}
		base := img
		if state != nil {
			base = &GuestImage{Disk: state.Disk, Format: "qcow2"}
		}
		if err := r.createOverlay(overlay, base, v.bootDiskSize()); err != nil {
			return fmt.Errorf("start failed: %w", err)
		}
	}
	var iso, isoKey string
	if state == nil {
		// A resumed guest is given its seed's content through the guest
		// agent: the saved machine had no CD-ROM.
		var err error
		if iso, isoKey, err = r.s.writeISOLocked(v, dir); err != nil {
			return fmt.Errorf("start failed: %w", err)
		}
	}
	m := qemu.Machine{
		Binary: r.cfg.Binary, Accel: r.cfg.Accel, Name: fmt.Sprintf("%d-%s", v.vmid, v.conf["name"]),
		CPU: cpuModel(v.conf["cpu"]), Cores: v.cores(), MemoryMiB: int(v.memoryMiB()),
		Kernel: img.Kernel, Initrd: img.Initrd, Append: img.Append,
		Disk: overlay, CDROM: iso, CDROMID: isoKey, MAC: strings.ToLower(macOf(v.conf["net0"])),
		Net: r.s.userNet(v.ipv4), Console: filepath.Join(dir, "console.log"),
		VMGenID: v.conf["vmgenid"],
	}
	if m.Append == "" {
		m.Append = qemu.KernelArgs()
	}
	addr := m.Net.Guest
	if state != nil {
		m.Incoming = state.File
		// The user network's lease table is part of the saved state
		// (libslirp saves its BOOTP clients): the first address of the
		// saved machine's DHCP range is leased to the saved guest's MAC,
		// and the VM's MAC would get the next one. One address lower,
		// that first one is the saved lease and the next the VM's own
		// (resumeGuest checks that it is).
		m.Net.Guest = previousIPv4(m.Net.Guest)
	}
	if tn := r.cfg.Network; tn != nil {
		var err error
		if m.Tap, err = tapOf(tn, v.vmid, dir); err != nil {
			return fmt.Errorf("start failed: %w", err)
		}
	}
	return r.launchLocked(v, m, &realGuest{gen: gen, seed: seed, addr: addr})
}

// launchLocked starts m as v's QEMU for g (its boot generation and what
// follows the start filled in): the machine's sockets in a directory of
// their own, its swtpm when v has a TPM, then QEMU, watched until it
// exits and until its guest agent answers.
func (r *realGuests) launchLocked(v *vm, m qemu.Machine, g *realGuest) error {
	sockDir, err := os.MkdirTemp("", "hf-qemu-")
	if err != nil {
		return fmt.Errorf("start failed: %w", err)
	}
	m.SocketDir = sockDir
	tpm, err := r.startTPMLocked(v, r.vmDir(v.vmid), sockDir)
	if err != nil {
		_ = os.RemoveAll(sockDir)
		return fmt.Errorf("start failed: %w", err)
	}
	if tpm != nil {
		m.TPMCtrl = tpm.tpm.Ctrl
	}
	p, err := qemu.Start(m)
	if err != nil {
		r.stopTPMLocked(tpm, v.node)
		_ = os.RemoveAll(sockDir)
		return fmt.Errorf("start failed: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g.proc, g.sockDir, g.stop, g.tpm, g.node = p, sockDir, cancel, tpm, v.node
	r.vms[v.vmid] = g
	r.wg.Add(2)
	go r.waitExit(v.vmid, g)
	go r.waitAgent(ctx, v.vmid, g)
	return nil
}

// cpuModel is the QEMU CPU model of a VM's cpu option ("[cputype=]<type>[,
// flags...]"): its type, or kvm64 without one, qemu-server's default
// (PVE::QemuServer::CPUConfig). QEMU's own default, qemu64, advertises
// AMD's SVM, so a guest's udev loads kvm and kvm_amd at boot, seconds
// under TCG that a Proxmox VM of the default type does not spend (4 to 6 s
// of a 64 to 78 s boot to the end of cloud-init, two pairs side by side on
// the idle CI machine). A type QEMU does not know, such as Proxmox's own
// x86-64-v2-AES, fails the start with QEMU's message.
func cpuModel(option string) string {
	typ, _, _ := strings.Cut(option, ",")
	typ = strings.TrimPrefix(typ, "cputype=")
	if typ == "" {
		return "kvm64"
	}
	return typ
}

// tapOf is VM vmid's tap device on tn, with the script (in the VM's
// directory) that plugs it into tn's bridge.
func tapOf(tn *TapNetwork, vmid int, dir string) (qemu.Tap, error) {
	if tn.Netns == "" || tn.Bridge == "" || tn.HostAddress == "" {
		return qemu.Tap{}, errors.New("guest.qemu.network needs netns, bridge and hostAddress")
	}
	script := filepath.Join(dir, "ifup")
	body := fmt.Sprintf("#!/bin/sh\nexec ip link set dev \"$1\" master %s up\n", tn.Bridge)
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		return qemu.Tap{}, fmt.Errorf("tap script: %w", err)
	}
	return qemu.Tap{Netns: tn.Netns, Name: fmt.Sprintf("hf%d", vmid), Script: script}, nil
}

// createOverlay makes the VM's linked clone: a qcow2 overlay whose
// backing file is the template's image, as large as the VM's disk.
func (r *realGuests) createOverlay(path string, img *GuestImage, size int64) error {
	bin := r.cfg.Img
	if bin == "" {
		bin = "qemu-img"
	}
	format := img.Format
	if format == "" {
		format = "raw"
	}
	base, err := filepath.Abs(img.Disk)
	if err != nil {
		return fmt.Errorf("guest image: %w", err)
	}
	args := []string{"create", "-q", "-f", "qcow2", "-F", format, "-b", base, path}
	// A smaller size than the image's would cut the file system off.
	if fi, err := os.Stat(base); err == nil && format == "raw" && size > fi.Size() {
		args = append(args, strconv.FormatInt(size, 10))
	}
	if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("create the linked clone of %s with %s: %w: %s", base, bin, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// writeISOLocked writes the first attached ISO CD-ROM (the NoCloud seed),
// or else the content of the VM's Proxmox cloud-init drive, next to the
// VM's disk and returns its path and config key ("" without either). ISOs
// of earlier boots are removed.
func (s *Simulator) writeISOLocked(v *vm, dir string) (string, string, error) {
	if old, err := filepath.Glob(filepath.Join(dir, "*.iso")); err == nil {
		for _, f := range old {
			_ = os.Remove(f)
		}
	}
	for _, k := range driveKeys(v.conf) {
		d := parseDrive(v.conf[k])
		if !d.isCDROM() || !strings.Contains(d.file, ":iso/") {
			continue
		}
		_, vol := s.findVolumeLocked(d.file, v.node)
		if vol == nil {
			return "", "", fmt.Errorf("attached ISO %s not found", d.file)
		}
		path := filepath.Join(dir, k+".iso")
		if err := os.WriteFile(path, vol.data, 0o600); err != nil {
			return "", "", fmt.Errorf("write ISO %s: %w", d.file, err)
		}
		return path, k, nil
	}
	if k := cloudInitDriveKey(v); k != "" {
		// No ISO: the drive qemu-server generates from the VM's ci* fields
		// and cicustom snippets, regenerated at every start.
		files, err := s.nativeCloudInitLocked(v)
		if err != nil {
			return "", "", err
		}
		path := filepath.Join(dir, k+".iso")
		if err := qemu.WriteNoCloudISO(path, files); err != nil {
			return "", "", fmt.Errorf("cloud-init drive %s: %w", k, err)
		}
		return path, k, nil
	}
	return "", "", nil
}

// userNet is the user-mode network of a guest leased addr: the network of
// the simulator's address range, the host's loopback at its .2 address,
// DNS at .3. Without an address, QEMU's default network.
func (s *Simulator) userNet(addr string) qemu.UserNet {
	ip := net.ParseIP(addr).To4()
	if ip == nil {
		return qemu.DefaultUserNet
	}
	mask := net.CIDRMask(s.addrs.prefix, 32)
	network := ip.Mask(mask)
	at := func(n uint32) string {
		b := make(net.IP, 4)
		binary.BigEndian.PutUint32(b, binary.BigEndian.Uint32(network)+n)
		return b.String()
	}
	return qemu.UserNet{Net: fmt.Sprintf("%s/%d", network, s.addrs.prefix), Host: at(2), DNS: at(3), Guest: ip.String()}
}

// previousIPv4 is the IPv4 address one below addr (addr itself when it
// is none).
func previousIPv4(addr string) string {
	ip := net.ParseIP(addr).To4()
	if ip == nil {
		return addr
	}
	b := make(net.IP, 4)
	binary.BigEndian.PutUint32(b, binary.BigEndian.Uint32(ip)-1)
	return b.String()
}

// GuestHostAddress is the address at which real guests reach the host's
// loopback (QEMU's user-mode network forwards it to 127.0.0.1): the .2
// address of the network of guest.addressRange, 10.99.0.2 by default;
// guest.qemu.network's hostAddress with that network.
// URLs that real guests use must name it, and certificates must list it.
func (s *Simulator) GuestHostAddress() string {
	if tn := s.cfg.Guest.QEMU.Network; tn != nil {
		return tn.HostAddress
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.userNet(uint32IP(s.addrs.first)).Host
}

// waitExit reaps QEMU. An exit while the VM still runs this boot is the
// guest powering itself off: the VM stops, with no task, as on Proxmox.
func (r *realGuests) waitExit(vmid int, g *realGuest) {
	defer r.wg.Done()
	<-g.proc.Done()
	g.stop()
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	// The TPM goes with QEMU, as swtpm --terminate does under Proxmox.
	r.stopTPMLocked(g.tpm, g.node)
	_ = os.RemoveAll(g.sockDir)
	if r.vms[vmid] == g {
		delete(r.vms, vmid)
	}
	if s.closed {
		return
	}
	s.log.Info("QEMU exited", "vmid", vmid, "err", g.proc.Err())
	if v := s.vms[vmid]; v != nil && v.running && v.bootGen == g.gen && !g.saving {
		s.powerOffLocked(v)
	}
}

// waitAgent marks the guest agent up once it answers guest-ping; a
// resumed guest's once it has been made its VM (resumeGuest). A resumed
// guest that cannot be is killed: the VM stops, as a VM whose boot failed
// is powered off by its agent, and the operator replaces it.
func (r *realGuests) waitAgent(ctx context.Context, vmid int, g *realGuest) {
	defer r.wg.Done()
	if g.seed != nil {
		start := time.Now()
		if err := resumeGuest(ctx, g.proc, g.seed, g.proc.Machine.MAC, g.addr); err != nil {
			if ctx.Err() == nil {
				r.s.log.Error("Cannot resume a real guest from its template's saved state", "vmid", vmid, "err", err)
				g.proc.Kill()
			}
			return
		}
		r.s.log.Info("Real guest resumed and configured", "vmid", vmid, "took", time.Since(start).Round(time.Millisecond))
	} else {
		if g.ownState != "" && !r.loadOwnState(ctx, vmid, g) {
			return
		}
		if err := qemu.WaitAgent(ctx, g.proc.Machine.AgentSocket(), g.proc.Done()); err != nil {
			return
		}
	}
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := s.vms[vmid]; v != nil && v.running && v.bootGen == g.gen {
		v.agentUp = true
		s.log.Info("Guest agent answers", "vmid", vmid)
	}
}

// stopLocked pulls the plug of a VM's QEMU (qm stop).
func (r *realGuests) stopLocked(vmid int) {
	if g := r.vms[vmid]; g != nil {
		delete(r.vms, vmid)
		g.proc.Kill()
		// At once, not when waitExit runs: a start that follows must
		// find the state back in the volume and no swtpm on its file.
		r.stopTPMLocked(g.tpm, g.node)
	}
}

// forgetLocked stops the VM and removes its disk, ISO and console
// (the disk moved to Guest.KeepDisks when that is set).
func (r *realGuests) forgetLocked(vmid int) {
	r.stopLocked(vmid)
	if keep := r.s.cfg.Guest.KeepDisks; keep != "" {
		overlay := filepath.Join(r.vmDir(vmid), "disk-0.qcow2")
		if err := os.MkdirAll(keep, 0o755); err == nil {
			if err := os.Rename(overlay, filepath.Join(keep, fmt.Sprintf("vm-%d.qcow2", vmid))); err != nil && !os.IsNotExist(err) {
				r.s.log.Warn("Cannot keep the disk of a destroyed guest", "vmid", vmid, "err", err)
			}
		}
	}
	_ = os.RemoveAll(r.vmDir(vmid))
}

// shutdownLocked presses the power button (QMP system_powerdown) and
// finishes t when the guest has powered off, or when timeout passed: then
// with forceStop the VM is stopped and the task succeeds, otherwise the
// task fails as qm shutdown does.
func (r *realGuests) shutdownLocked(v *vm, t *task, timeout time.Duration, forceStop bool) bool {
	g := r.vms[v.vmid]
	if g == nil {
		return false
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := qemu.QMP(ctx, g.proc.Machine.QMPSocket(), "system_powerdown", nil)
		cancel()
		var result error
		select {
		case <-g.proc.Done():
		case <-time.After(timeout):
			result = fmt.Errorf("VM quit/powerdown failed - got timeout")
			if err != nil {
				result = fmt.Errorf("VM %d qmp command 'system_powerdown' failed - %w", v.vmid, err)
			}
		}
		s := r.s
		s.mu.Lock()
		defer s.mu.Unlock()
		switch {
		case result == nil && v.running && v.bootGen == g.gen:
			// QEMU has exited; the task ends with the VM stopped, whether
			// or not waitExit has run yet.
			s.powerOffLocked(v)
		case result != nil && forceStop:
			t.logf("VM still running - terminating now with SIGTERM")
			s.powerOffLocked(v)
			result = nil
		}
		t.finish(s.clock.Now(), result)
	}()
	return true
}

// ejectLocked takes the medium out of a running guest's CD-ROM drive key,
// as Proxmox does when a CD-ROM's ISO is replaced in the config.
func (r *realGuests) ejectLocked(vmid int, key string) {
	g := r.vms[vmid]
	if g == nil || g.proc.Machine.CDROMID != key {
		return
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := qemu.QMP(ctx, g.proc.Machine.QMPSocket(), "eject", map[string]any{"id": key, "force": true}); err != nil {
			r.s.log.Warn("QEMU eject failed", "vmid", vmid, "drive", key, "err", err)
			return
		}
		// The seed holds single-use credentials: gone with the medium.
		_ = os.Remove(g.proc.Machine.CDROM)
	}()
}

// agentSocketLocked is the guest agent socket of a running real guest,
// "" for other VMs.
func (r *realGuests) agentSocketLocked(vmid int) string {
	if r == nil || r.vms[vmid] == nil {
		return ""
	}
	return r.vms[vmid].proc.Machine.AgentSocket()
}

// close kills every QEMU, waits for them and removes an owned work dir.
func (r *realGuests) close() error {
	r.s.mu.Lock()
	for id := range r.vms {
		r.stopLocked(id)
	}
	r.s.mu.Unlock()
	r.wg.Wait()
	if r.ownsDir {
		if err := os.RemoveAll(r.baseDir); err != nil {
			return fmt.Errorf("remove guest work dir: %w", err)
		}
	}
	return nil
}

// GuestAgentCall sends cmd to a running real guest's QEMU guest agent
// and decodes its return value into out, for tests that read the
// guest's own view.
func (s *Simulator) GuestAgentCall(ctx context.Context, vmid int, cmd string, out any) error {
	socket, err := s.agentSocket(vmid)
	if err != nil {
		return err
	}
	if err := qemu.AgentCall(ctx, socket, cmd, nil, out); err != nil {
		return fmt.Errorf("VM %d: %s: %w", vmid, cmd, err)
	}
	return nil
}

// GuestExec runs argv in a running real guest through its guest agent
// (guest-exec), as qm guest exec does.
func (s *Simulator) GuestExec(ctx context.Context, vmid int, argv ...string) (qemu.ExecResult, error) {
	socket, err := s.agentSocket(vmid)
	if err != nil {
		return qemu.ExecResult{}, err
	}
	res, err := qemu.AgentExec(ctx, socket, argv...)
	if err != nil {
		return res, fmt.Errorf("VM %d: %w", vmid, err)
	}
	return res, nil
}

// GuestStart starts argv in the running real guest of vmid through its
// QEMU guest agent and returns its PID there, without waiting for it.
func (s *Simulator) GuestStart(ctx context.Context, vmid int, argv ...string) (int, error) {
	socket, err := s.agentSocket(vmid)
	if err != nil {
		return 0, err
	}
	pid, err := qemu.AgentStart(ctx, socket, argv...)
	if err != nil {
		return 0, fmt.Errorf("VM %d: %w", vmid, err)
	}
	return pid, nil
}

func (s *Simulator) agentSocket(vmid int) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if socket := s.real.agentSocketLocked(vmid); socket != "" {
		return socket, nil
	}
	return "", fmt.Errorf("VM %d is not a running real guest", vmid)
}

// liveAnswer is a handler result computed once the state lock is
// released: a real guest agent answers over a socket, in its own time.
type liveAnswer func(ctx context.Context) (any, error)

// agentCommand asks a real guest's agent. Errors read as qemu-server's.
func agentCommand(vmid int, socket, cmd string) liveAnswer {
	return func(ctx context.Context) (any, error) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		var res any
		err := qemu.AgentCall(ctx, socket, cmd, nil, &res)
		var ce *qemu.CommandError
		switch {
		case err == nil:
			return map[string]any{"result": res}, nil
		case errors.As(err, &ce):
			return nil, serverError("VM %d qmp command '%s' failed - %s", vmid, cmd, ce.Desc)
		case qemu.IsTimeout(err):
			return nil, serverError("VM %d qmp command '%s' failed - got timeout", vmid, cmd)
		default:
			// The socket is gone: QEMU exited under the request.
			return nil, serverError("VM %d is not running", vmid)
		}
	}
}
