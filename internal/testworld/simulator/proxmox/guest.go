package proxmoxsim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/procgroup"
)

// GuestConfig configures what runs "inside" a simulated VM.
type GuestConfig struct {
	// Command is the program (and arguments) started when a VM boots.
	// Empty disables the guest hook; VMs then only have a simulated agent.
	Command []string `json:"command,omitempty"`
	// Env adds environment variables for the program.
	Env map[string]string `json:"env,omitempty"`
	// WorkDir holds one directory per VM (seed files, console log). A
	// temporary directory, removed on Close, is used when empty.
	WorkDir string `json:"workDir,omitempty"`
	// AddressRange is "first-last" IPv4 the guest agent reports for net0
	// when ipconfig0 does not set a static address.
	AddressRange string `json:"addressRange,omitempty"`
	// Prefix is the prefix length reported with those addresses.
	Prefix int `json:"prefix,omitempty"`
	// QEMU configures the real guests of templates with a GuestImage.
	QEMU QEMUConfig `json:"qemu,omitempty"`
	// KeepDisks, when set, is a directory into which destroying a real
	// guest moves its disk overlay (as vm-<id>.qcow2) instead of deleting
	// it: tests read what the guest left on its disk after it powered
	// off, which Proxmox's destroy would erase.
	KeepDisks string `json:"keepDisks,omitempty"`
	// WriteFiles applies the seed user-data's write_files (as cloud-init
	// would in the guest) under <VM dir>/root before the program starts,
	// and passes that directory as HF_SIM_ROOT: the program then finds the
	// files cloud-init would have written, such as the agent's config.
	WriteFiles bool `json:"writeFiles,omitempty"`
	// Program, when set, runs in place of Command: the guest is a
	// goroutine of the simulator instead of a process, and returning from
	// it powers the VM off, as Command's exit does. Set only in process
	// (Simulator.SetGuestProgram or the Config of New), never in a config
	// file. The churn benchmark's VMs use it: their guest costs the
	// machine the protocol it speaks, not a process tree per VM
	// (docs/performance.md, churn).
	Program GuestProgram `json:"-"`
}

// GuestProgram is a guest run in process. It must return when ctx ends
// (the VM was stopped or destroyed).
type GuestProgram func(ctx context.Context, g Guest) error

// Guest is what an in-process guest program is given: what Command
// receives in its environment (Env*), and its console.
type Guest struct {
	VMID       int
	Node, Name string
	// Dir is the VM's directory, SeedDir the files of its NoCloud ISO,
	// Root (with WriteFiles) where its user-data's write_files are.
	Dir, SeedDir, Root string
	IP, MAC            string
	// PowerOffURL powers this boot of the VM off (POST).
	PowerOffURL string
	// Console is the VM's console log.
	Console io.Writer
}

// Environment variables a guest program receives.
const (
	EnvVMID        = "HF_SIM_VMID"
	EnvNode        = "HF_SIM_NODE"
	EnvName        = "HF_SIM_NAME"
	EnvSeedDir     = "HF_SIM_SEED_DIR"
	EnvPowerOffURL = "HF_SIM_POWEROFF_URL"
	EnvIP          = "HF_SIM_IP"
	EnvMAC         = "HF_SIM_MAC"
	EnvVMDir       = "HF_SIM_VM_DIR"
)

// guestRunner starts and reaps guest programs. Its maps are guarded by the
// simulator's mutex; waiter goroutines take that mutex when a program exits.
type guestRunner struct {
	s       *Simulator
	cfg     GuestConfig
	baseDir string
	ownsDir bool
	srv     *http.Server
	baseURL string
	procs   map[int]*guestProc
	wg      sync.WaitGroup
}

type guestProc struct {
	// leader is the program, leader of its own session and group; it
	// ends them only while its exit is unreaped (internal/procgroup).
	leader *procgroup.Leader
	gen    int
	token  string
	log    *os.File
	// cancel ends an in-process guest (GuestConfig.Program).
	cancel context.CancelFunc
	// tpm is the boot's TPM (guesttpm.go), nil without tpmstate0.
	tpm *guestTPM
	// frozen: the program's processes are stopped (freezeLocked).
	frozen bool
}

func newGuestRunner(s *Simulator, cfg GuestConfig) (*guestRunner, error) {
	if cfg.Program == nil && (len(cfg.Command) == 0 || cfg.Command[0] == "") {
		return nil, errors.New("guest.command needs a program")
	}
	g := &guestRunner{s: s, cfg: cfg, procs: map[int]*guestProc{}}
	var err error
	if g.baseDir, g.ownsDir, err = guestWorkDir(cfg.WorkDir, "proxmox-sim-guests-"); err != nil {
		return nil, err
	}
	// Guests call back on a private loopback listener, so power-off works
	// whether or not the API is served over TLS and whether or not the
	// admin API is enabled.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen for guest callbacks: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/poweroff", g.handlePowerOff)
	g.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	g.baseURL = "http://" + ln.Addr().String()
	go func() { _ = g.srv.Serve(ln) }()
	return g, nil
}

// startLocked boots the guest program for v's current boot generation.
func (g *guestRunner) startLocked(v *vm, gen int) {
	g.killLocked(v.vmid)
	dir := filepath.Join(g.baseDir, fmt.Sprintf("vm-%d", v.vmid))
	seed := filepath.Join(dir, "seed")
	if err := os.RemoveAll(seed); err != nil {
		g.s.log.Error("Guest hook: cannot clear seed dir", "vmid", v.vmid, "err", err)
		return
	}
	if err := os.MkdirAll(seed, 0o700); err != nil {
		g.s.log.Error("Guest hook: cannot create seed dir", "vmid", v.vmid, "err", err)
		return
	}
	logf, err := os.OpenFile(filepath.Join(dir, "console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		g.s.log.Error("Guest hook: cannot open console log", "vmid", v.vmid, "err", err)
		return
	}
	if err := g.s.writeSeedLocked(v, seed); err != nil {
		// A real guest would boot without its seed; keep going and leave
		// the reason where a test can see it.
		fmt.Fprintf(logf, "proxmox-sim: no seed: %v\n", err)
	}
	root := g.rootDir(v.vmid)
	if g.cfg.WriteFiles {
		if err := os.RemoveAll(root); err != nil {
			fmt.Fprintf(logf, "proxmox-sim: clear root: %v\n", err)
		}
	}
	// Every boot has an empty /run (a tmpfs), before cloud-init writes
	// anything and before the guest agent takes a file.
	if err := g.resetRun(v.vmid); err != nil {
		fmt.Fprintf(logf, "proxmox-sim: /run: %v\n", err)
	}
	if g.cfg.WriteFiles {
		if userData, err := os.ReadFile(filepath.Join(seed, "user-data")); err == nil {
			if err := applyWriteFiles(userData, root); err != nil {
				// cloud-init logs the failure and boots on.
				fmt.Fprintf(logf, "proxmox-sim: write_files: %v\n", err)
			}
		}
	}
	g.launchLocked(v, gen, dir, seed, root, logf)
}

// launchLocked starts the program of boot gen in the VM's directory dir,
// its console going to logf, after the boot's TPM.
func (g *guestRunner) launchLocked(v *vm, gen int, dir, seed, root string, logf *os.File) {
	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	p := &guestProc{gen: gen, token: hex.EncodeToString(tok), log: logf}
	// The TPM is there before the program, as the device is at boot; a
	// TPM that cannot start leaves the guest without one, as a VM whose
	// swtpm failed would find no device.
	var err error
	if p.tpm, err = g.s.startGuestTPMLocked(v, dir, root); err != nil {
		fmt.Fprintf(logf, "proxmox-sim: TPM: %v\n", err)
		g.s.log.Error("Guest hook: the VM's TPM did not start", "vmid", v.vmid, "err", err)
	}
	powerOff := fmt.Sprintf("%s/poweroff?vmid=%d&token=%s", g.baseURL, v.vmid, p.token)
	if prog := g.cfg.Program; prog != nil {
		ctx, cancel := context.WithCancel(context.Background())
		p.cancel = cancel
		guest := Guest{VMID: v.vmid, Node: v.node, Name: v.conf["name"], Dir: dir, SeedDir: seed, IP: v.ipv4,
			MAC: strings.ToLower(macOf(v.conf["net0"])), PowerOffURL: powerOff, Console: logf}
		if g.cfg.WriteFiles {
			guest.Root = root
		}
		g.procs[v.vmid] = p
		g.wg.Add(1)
		go func() {
			err := prog(ctx, guest)
			cancel()
			g.exited(v.vmid, p, err)
		}()
		return
	}
	cmd := exec.Command(g.cfg.Command[0], g.cfg.Command[1:]...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// A session of its own: what the program starts stays in it, even
	// reparented, and ends with the VM (guestprocs.go).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Env = append(os.Environ(),
		EnvVMID+"="+strconv.Itoa(v.vmid), EnvNode+"="+v.node, EnvName+"="+v.conf["name"],
		EnvSeedDir+"="+seed, EnvVMDir+"="+dir, EnvIP+"="+v.ipv4, EnvMAC+"="+strings.ToLower(macOf(v.conf["net0"])),
		EnvPowerOffURL+"="+powerOff,
	)
	if g.cfg.WriteFiles {
		cmd.Env = append(cmd.Env, EnvRoot+"="+root)
	}
	for k, val := range g.cfg.Env {
		cmd.Env = append(cmd.Env, k+"="+val)
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(logf, "proxmox-sim: start guest program: %v\n", err)
		_ = logf.Close()
		g.s.stopGuestTPMLocked(p.tpm)
		g.s.log.Error("Guest hook: start failed", "vmid", v.vmid, "err", err)
		return
	}
	p.leader = procgroup.New(cmd)
	g.procs[v.vmid] = p
	g.wg.Add(1)
	go g.wait(v.vmid, p)
}

// freezeLocked holds the program of vmid where it is, for a pause or a
// suspend: every process of its session is stopped (SIGSTOP). An
// in-process program (GuestConfig.Program) cannot be held: it is ended,
// and resumeLocked starts it again. It reports whether a program ran.
func (g *guestRunner) freezeLocked(vmid int) bool {
	p := g.procs[vmid]
	if p == nil {
		return false
	}
	if p.cancel != nil {
		g.killLocked(vmid)
		return true
	}
	if p.leader.Do(freezeGuest) {
		p.frozen = true
	}
	return true
}

// thawLocked continues a program freezeLocked held (SIGCONT), as part of
// boot gen; it reports whether there was one.
func (g *guestRunner) thawLocked(vmid, gen int) bool {
	p := g.procs[vmid]
	if p == nil || !p.frozen {
		return false
	}
	p.frozen, p.gen = false, gen
	p.leader.Do(thawGuest)
	return true
}

// resumeLocked brings back, as part of boot gen, the program that ran
// when v was suspended: a held one continues where it stopped; an
// in-process one, which the suspend ended, starts again over the guest's
// files as they were (no boot: the seed and /run stay).
func (g *guestRunner) resumeLocked(v *vm, gen int) {
	if g.thawLocked(v.vmid, gen) {
		return
	}
	if g.cfg.Program == nil {
		// The held process is gone (killed outside the simulator): the
		// guest resumes without it.
		return
	}
	dir := filepath.Join(g.baseDir, fmt.Sprintf("vm-%d", v.vmid))
	logf, err := os.OpenFile(filepath.Join(dir, "console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		g.s.log.Error("Guest hook: cannot open console log", "vmid", v.vmid, "err", err)
		return
	}
	g.launchLocked(v, gen, dir, filepath.Join(dir, "seed"), g.rootDir(v.vmid), logf)
}

// wait reaps the program; an exit while the VM still runs this boot is a
// guest-initiated power-off.
func (g *guestRunner) wait(vmid int, p *guestProc) {
	// What the program left running ends with it, as with a VM that
	// powers off.
	err := p.leader.Wait(sweepGuest)
	g.exited(vmid, p, err)
}

// exited handles the end of a guest program: an end while the VM still
// runs this boot is a guest-initiated power-off.
func (g *guestRunner) exited(vmid int, p *guestProc, err error) {
	defer g.wg.Done()
	_ = p.log.Close()
	s := g.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if g.procs[vmid] == p {
		delete(g.procs, vmid)
	}
	// The TPM goes with the program that powered the VM off (killLocked
	// no longer finds this boot).
	s.stopGuestTPMLocked(p.tpm)
	if s.closed {
		return
	}
	s.log.Info("Guest program exited", "vmid", vmid, "err", err)
	if v := s.vms[vmid]; v != nil && v.running && v.bootGen == p.gen {
		s.powerOffLocked(v)
	}
}

func (g *guestRunner) killLocked(vmid int) {
	p := g.procs[vmid]
	if p == nil {
		return
	}
	delete(g.procs, vmid)
	// The TPM after the program: it must not see its device vanish first.
	defer g.s.stopGuestTPMLocked(p.tpm)
	if p.cancel != nil {
		p.cancel()
		return
	}
	// Every process of the VM: guest programs fork, and put their jobs in
	// process groups of their own. Nothing when the program has exited:
	// its wait sweeps the session then.
	p.leader.Do(killGuest)
}

// stopLocked kills the program of a VM that stopped.
func (g *guestRunner) stopLocked(vmid int) { g.killLocked(vmid) }

// forgetLocked kills the program and removes the VM's directory.
func (g *guestRunner) forgetLocked(vmid int) {
	g.killLocked(vmid)
	_ = os.RemoveAll(filepath.Join(g.baseDir, fmt.Sprintf("vm-%d", vmid)))
}

func (g *guestRunner) handlePowerOff(w http.ResponseWriter, r *http.Request) {
	vmid, _ := strconv.Atoi(r.URL.Query().Get("vmid"))
	tok := r.URL.Query().Get("token")
	s := g.s
	s.mu.Lock()
	p := g.procs[vmid]
	v := s.vms[vmid]
	ok := p != nil && tok != "" && tok == p.token && v != nil && v.running && v.bootGen == p.gen
	if ok {
		s.powerOffLocked(v)
	}
	s.mu.Unlock()
	if !ok {
		http.Error(w, "no such running guest", http.StatusNotFound)
		return
	}
	_, _ = io.WriteString(w, "powering off\n")
}

// close kills every program, waits for them and removes owned directories.
func (g *guestRunner) close() error {
	g.s.mu.Lock()
	for id := range g.procs {
		g.killLocked(id)
	}
	g.s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := g.srv.Shutdown(ctx)
	g.wg.Wait()
	if g.ownsDir {
		if rerr := os.RemoveAll(g.baseDir); rerr != nil && err == nil {
			err = fmt.Errorf("remove guest work dir: %w", rerr)
		}
	}
	return err
}

// writeSeedLocked fills seed with the files of the first attached ISO
// (a NoCloud "cidata" image), or, without one, with files rendered from
// Proxmox's own cloud-init options.
func (s *Simulator) writeSeedLocked(v *vm, seed string) error {
	for _, k := range driveKeys(v.conf) {
		d := parseDrive(v.conf[k])
		if !d.isCDROM() || !strings.Contains(d.file, ":iso/") {
			continue
		}
		_, vol := s.findVolumeLocked(d.file, v.node)
		if vol == nil {
			return fmt.Errorf("attached ISO %s not found", d.file)
		}
		return extractISO(vol.data, seed)
	}
	if cloudInitDriveKey(v) == "" {
		return errors.New("no ISO or cloud-init drive attached")
	}
	files, err := s.nativeCloudInitLocked(v)
	if err != nil {
		return err
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(seed, name), content, 0o600); err != nil {
			return fmt.Errorf("write seed file %s: %w", name, err)
		}
	}
	return nil
}

// extractISO copies the root files of an ISO9660 image into dst.
func extractISO(data []byte, dst string) error {
	files, err := readISOFiles(data)
	if err != nil {
		return err
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dst, filepath.Base(name)), content, 0o600); err != nil {
			return fmt.Errorf("write seed file %s: %w", name, err)
		}
	}
	return nil
}

// guestWorkDir is dir, created if missing, or a new temporary directory
// named after pattern when dir is empty (owned is then true: the caller
// removes it on Close).
func guestWorkDir(dir, pattern string) (path string, owned bool, err error) {
	if dir == "" {
		d, err := os.MkdirTemp("", pattern)
		if err != nil {
			return "", false, fmt.Errorf("create guest work dir: %w", err)
		}
		return d, true, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", false, fmt.Errorf("create guest work dir %s: %w", dir, err)
	}
	return dir, false, nil
}
