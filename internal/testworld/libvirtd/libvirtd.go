// Package libvirtd runs a private, real libvirtd (with its virtlogd) for a
// test: the libvirt provider's contract suite and fault tests talk to it
// over its unix socket exactly as the operator talks to a libvirt host.
//
// A root libvirtd keeps its QEMU driver state at fixed paths (/run/libvirt,
// /var/lib/libvirt, /var/cache/libvirt, /var/log/libvirt, /etc/libvirt), so
// two of them cannot share one mount namespace. Start therefore gives each
// daemon namespaces of its own: a holder process (bash as PID 1 of a new
// mount, PID and network namespace) bind-mounts a per-daemon state
// directory over those paths, and virtlogd and libvirtd are started inside
// with nsenter. What follows from that:
//   - any number of daemons coexist, in one test binary or in several;
//   - the daemon's networks (bridges, dnsmasq, iptables rules) live in its
//     private network namespace: subnets never collide with another test's,
//     and nothing is left on the host; the host cannot reach guest
//     addresses (tests talk to guests through the QEMU guest agent);
//     HostNetwork leaves the daemon in the host's network namespace
//     instead, for guests on QEMU's user-mode network that must reach
//     the host's loopback servers;
//   - killing the holder ends every process of the daemon's world (QEMU,
//     swtpm, dnsmasq, virtlogd, libvirtd): Cleanup does that, and the kernel
//     does it too if the test binary dies (the holder has a parent-death
//     signal).
//
// The faults a provider must survive are methods: Restart (SIGKILL and a
// new libvirtd on the same state, guests running on), Kill and Stop (the
// daemon down: the host is unreachable), Freeze and Thaw (a hung daemon),
// DefineSmallPool (a storage pool that is full).
//
// Paths outside the overmounted directories, such as Dir, are the same
// inside and outside, so storage pools and files the test writes there are
// seen by libvirtd and QEMU at the same path.
//
// It needs root, Debian's libvirt-daemon-system (libvirtd, virtlogd),
// libvirt-daemon-driver-qemu, qemu-system-x86 and dnsmasq-base, and
// util-linux's nsenter; /dev/kvm is not used (domains are type='qemu').
// libvirt's own network filters (clean-traffic and the filters it
// references, from libvirt-daemon-config-nwfilter, which
// libvirt-daemon-system depends on) are copied into every daemon's
// /etc/libvirt/nwfilter; its nwfilter driver (in libvirt-daemon on
// Debian 12) writes their ebtables and iptables rules into the daemon's
// network namespace (iptables' ebtables-nft and iptables-nft).
// Cost, measured on the project's 2-core machine (shared, load 10-15):
// Start takes 0.1 to 0.3 s wall; a daemon's whole life without guests
// about 0.1 CPU-s, 0.2 with an isolated network (its dnsmasq); Restart
// 0.3 to 0.4 s. libvirt probes QEMU's capabilities when a daemon first
// needs them (about 0.4 s wall, 0.3 CPU-s); the result is kept under
// ~/.cache/hyperfleet/libvirtd and copied into every later daemon. When
// the test ends, the log says what the daemon's world used in all,
// guests included.
package libvirtd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"
)

// installHint is what a machine without libvirt needs.
const installHint = "apt-get install -y --no-install-recommends libvirt-daemon-system libvirt-daemon-driver-qemu " +
	"libvirt-clients qemu-utils qemu-system-x86 dnsmasq-base genisoimage"

// stateMounts maps each fixed libvirt path to the subdirectory of the
// daemon's state directory bind-mounted over it. /var/lib/swtpm-localca is
// the CA libvirt's swtpm_setup signs vTPM certificates with, and
// /var/log/swtpm where libvirt has swtpm log.
var stateMounts = [][2]string{
	{"/run/libvirt", "run"},
	{"/var/lib/libvirt", "lib"},
	{"/var/cache/libvirt", "cache"},
	{"/var/log/libvirt", "log"},
	{"/etc/libvirt", "etc"},
	{"/var/lib/swtpm-localca", "swtpm-localca"},
	{"/var/log/swtpm", "swtpm-log"},
}

// baseDirPrefix names each daemon's directory in the temporary directory,
// and holderPIDFile, in it, the PID of its namespaces' holder.
const (
	baseDirPrefix = "hf-lvd-"
	holderPIDFile = "holder.pid"
)

// staleAfter is how old a daemon directory without a holder must be to be
// taken for the leftover of a test binary that died while starting one.
const staleAfter = 10 * time.Minute

// sweepStale removes the directories of daemons whose test binary died
// without its cleanup (killed by a timeout, say): their holder, and so
// their whole world, died with it (parent-death signal), only the files
// remain.
func sweepStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), baseDirPrefix+"*"))
	for _, dir := range dirs {
		raw, err := os.ReadFile(filepath.Join(dir, holderPIDFile))
		if err != nil {
			if st, serr := os.Stat(dir); serr == nil && time.Since(st.ModTime()) > staleAfter {
				_ = os.RemoveAll(dir)
			}
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
		if err == nil && errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			_ = os.RemoveAll(dir)
		}
	}
}

// Daemon is one private libvirtd with its namespaces. Its methods fail
// the test on error.
type Daemon struct {
	base   string // short temporary directory (unix socket paths are at most 107 bytes)
	holder *exec.Cmd
	// holderExited is closed once the holder has been waited for.
	holderExited chan struct{}
	started      time.Time
	// hostNetwork: the daemon shares the host's network namespace
	// (HostNetwork).
	hostNetwork bool
}

// Option configures Start.
type Option func(*Daemon)

// HostNetwork keeps the daemon, and so its QEMU guests, in the host's
// network namespace: a guest on QEMU's user-mode network (an interface of
// type user) then reaches the host's loopback servers at its network's
// host address, as the Proxmox simulator's real guests do. In a private
// namespace that address would be the namespace's own loopback, where
// nothing listens. Such a daemon must define no libvirt network: its
// bridge, dnsmasq and firewall rules would be the host's.
func HostNetwork() Option { return func(d *Daemon) { d.hostNetwork = true } }

// Start runs a private libvirtd until the test ends. A machine without
// libvirt fails the test with the packages to install.
func Start(t testing.TB, opts ...Option) *Daemon {
	t.Helper()
	for _, tool := range []string{"libvirtd", "virtlogd", "nsenter", "bash", "qemu-system-x86_64"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("libvirtd: %s is not installed: %s", tool, installHint)
		}
	}
	if os.Geteuid() != 0 {
		t.Fatal("libvirtd: a private libvirtd needs root (mount and network namespaces, bind mounts over /run/libvirt and /var/lib/libvirt)")
	}
	sweepStale()
	base, err := os.MkdirTemp("", baseDirPrefix)
	if err != nil {
		t.Fatal(err)
	}
	d := &Daemon{base: base, holderExited: make(chan struct{}), started: time.Now()}
	for _, o := range opts {
		o(d)
	}
	t.Cleanup(func() { d.cleanup(t) })
	if err := d.prepare(); err != nil {
		t.Fatal(err)
	}
	if err := d.startHolder(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, holderPIDFile), []byte(strconv.Itoa(d.holder.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.launch(); err != nil {
		t.Fatalf("%v\n%s", err, d.Logs())
	}
	return d
}

// URI is the daemon's connection URI for virsh and libvirt clients.
func (d *Daemon) URI() string { return "qemu:///system?socket=" + d.SocketPath() }

// SocketPath is the daemon's read-write unix socket.
func (d *Daemon) SocketPath() string { return filepath.Join(d.state("run"), "libvirt-sock") }

// Dir is a scratch directory for the test's storage pools and images,
// seen at the same path by the daemon and its QEMU processes.
func (d *Daemon) Dir() string { return filepath.Join(d.base, "scratch") }

// SaveDir is where the daemon keeps managed save images (its
// /var/lib/libvirt/qemu/save), at its path outside the daemon's
// namespaces: a suspended guest's memory at rest.
func (d *Daemon) SaveDir() string { return filepath.Join(d.state("lib"), "qemu", "save") }

// Dial opens an admin connection closed when the test ends. A connection
// made before Restart or Kill is dead afterwards: dial again.
func (d *Daemon) Dial(t testing.TB) *libvirt.Libvirt {
	t.Helper()
	l, err := d.connect()
	if err != nil {
		t.Fatalf("libvirtd: connecting to %s: %v", d.URI(), err)
	}
	t.Cleanup(func() { _ = l.Disconnect() })
	return l
}

// Restart kills libvirtd with SIGKILL, if it runs, and starts it again on
// the same state, as after a crash on a real host: running QEMU guests
// survive, and the new daemon reconnects to them.
func (d *Daemon) Restart(t testing.TB) {
	t.Helper()
	if err := d.kill(); err != nil {
		t.Fatal(err)
	}
	if err := d.launch(); err != nil {
		t.Fatalf("%v\n%s", err, d.Logs())
	}
}

// Kill ends libvirtd with SIGKILL and leaves it down, as a host whose
// daemon died: connections break, the socket refuses new ones, guests keep
// running. Restart brings it back.
func (d *Daemon) Kill(t testing.TB) {
	t.Helper()
	if err := d.kill(); err != nil {
		t.Fatal(err)
	}
}

// Stop ends libvirtd gracefully (SIGTERM) and waits for it; guests keep
// running. Restart brings it back.
func (d *Daemon) Stop(t testing.TB) {
	t.Helper()
	if err := d.signalLibvirtd(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
}

// Freeze stops libvirtd with SIGSTOP and waits until it is stopped:
// connections stay open and the kernel accepts new ones, but nothing
// answers, as with a hung host or one behind a network partition. Thaw
// resumes it; so does the end of the test (before its connections close,
// which would wait on a stopped daemon).
func (d *Daemon) Freeze(t testing.TB) {
	t.Helper()
	pid, err := d.findProcess("libvirtd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("libvirtd: freezing libvirtd (PID %d): %v", pid, err)
	}
	if err := waitState(pid, 'T', 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

// Thaw resumes a frozen libvirtd (SIGCONT).
func (d *Daemon) Thaw(t testing.TB) {
	t.Helper()
	pid, err := d.findProcess("libvirtd")
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatalf("libvirtd: thawing libvirtd (PID %d): %v", pid, err)
	}
}

// DomainPID is the host PID of a running domain's QEMU process (for
// measuring its CPU time in /proc/<pid>/stat).
func (d *Daemon) DomainPID(t testing.TB, domain string) int {
	t.Helper()
	pid, err := d.domainPID(domain)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// DomainCPU is the CPU time a running domain's QEMU has used so far
// (/proc/<pid>/stat); false once the domain is not running, which a test
// that samples a guest until it powers off expects.
func (d *Daemon) DomainCPU(domain string) (time.Duration, bool) {
	pid, err := d.domainPID(domain)
	if err != nil {
		return 0, false
	}
	ticks := cpuTicks(pid)
	if ticks == 0 {
		return 0, false
	}
	return time.Duration(ticks) * time.Second / 100, true // USER_HZ
}

// domainPID reads a running domain's QEMU PID file and maps the PID to
// the host's.
func (d *Daemon) domainPID(domain string) (int, error) {
	raw, err := os.ReadFile(filepath.Join(d.state("run"), "qemu", domain+".pid"))
	if err != nil {
		return 0, fmt.Errorf("libvirtd: domain %s has no QEMU PID file (is it running?): %w", domain, err)
	}
	nsPID, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		return 0, fmt.Errorf("libvirtd: domain %s: PID file: %w", domain, err)
	}
	return d.hostPID(nsPID)
}

// Logs returns the tails of libvirtd's and virtlogd's logs, for a failure
// message.
func (d *Daemon) Logs() string {
	var b strings.Builder
	for _, name := range []string{"libvirtd.log", "virtlogd.log"} {
		raw, _ := os.ReadFile(filepath.Join(d.state("log"), name))
		if len(raw) > 8192 {
			raw = raw[len(raw)-8192:]
		}
		fmt.Fprintf(&b, "--- %s ---\n%s", name, raw)
	}
	return b.String()
}

// state is the host path of one state subdirectory.
func (d *Daemon) state(sub string) string { return filepath.Join(d.base, "state", sub) }

// prepare makes the state directories and writes the configuration.
func (d *Daemon) prepare() error {
	for _, m := range stateMounts {
		if err := os.MkdirAll(d.state(m[1]), 0o755); err != nil {
			return fmt.Errorf("libvirtd: state directory: %w", err)
		}
	}
	for _, dir := range []string{d.Dir(), filepath.Join(d.state("etc"), "qemu", "networks"), filepath.Join(d.state("etc"), "storage")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("libvirtd: state directory: %w", err)
		}
	}
	for name, content := range configFiles {
		if err := os.WriteFile(filepath.Join(d.state("etc"), name), []byte(content), 0o644); err != nil {
			return fmt.Errorf("libvirtd: writing %s: %w", name, err)
		}
	}
	if err := seedFilters(d.state("etc")); err != nil {
		return err
	}
	return seedCapabilities(d.state("cache"))
}

// holderScript runs as PID 1 of the daemon's namespaces: it makes its
// mounts private, mounts /proc (and, in a private network namespace
// (first argument private-net), /sys and brings up lo) and the state, says "ready" and then only reaps
// the orphans (libvirtd, virtlogd and QEMU daemonise and land under it;
// bash's wait reaps any child, so none lingers as a zombie that libvirt
// would take for a live QEMU).
const holderScript = `set -e
mount --make-rprivate /
mount -t proc proc /proc
if [ "$1" = private-net ]; then
	mount -t sysfs sysfs /sys
	ip link set lo up
fi
shift
while [ $# -gt 0 ]; do
	mkdir -p "$2"
	mount --bind "$1" "$2"
	shift 2
done
echo ready
exec >/dev/null 2>&1 </dev/null
set +e
while :; do sleep 86400 & wait; done
`

// startHolder starts the namespaces' PID 1 and waits for its "ready".
func (d *Daemon) startHolder() error {
	// A new sysfs shows the namespace's own network devices, and the
	// kernel mounts one only in a network namespace of our own: with
	// HostNetwork the host's /sys is the right one already.
	netMode := "private-net"
	if d.hostNetwork {
		netMode = "host-net"
	}
	args := []string{"-c", holderScript, "holder", netMode}
	for _, m := range stateMounts {
		args = append(args, d.state(m[1]), m[0])
	}
	cmd := exec.Command("bash", args...)
	flags := uintptr(syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNET)
	if d.hostNetwork {
		flags &^= syscall.CLONE_NEWNET
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("libvirtd: holder: %w", err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := startOnOwnThread(cmd, d.holderExited); err != nil {
		return fmt.Errorf("libvirtd: starting the namespace holder: %w", err)
	}
	d.holder = cmd
	line := make([]byte, len("ready\n"))
	_, rerr := io.ReadFull(out, line)
	if rerr != nil || string(line) != "ready\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		close(d.holderExited)
		return fmt.Errorf("libvirtd: setting up the daemon's namespaces failed: %s", strings.TrimSpace(stderr.String()))
	}
	go func() {
		_ = cmd.Wait()
		close(d.holderExited)
	}()
	return nil
}

// startOnOwnThread starts cmd from an OS thread locked to a goroutine
// that lives until done is closed. The parent-death signal fires when the
// thread that forked the child ends, and the Go runtime ends a thread when
// a goroutine that locked it returns without unlocking (as some test
// helpers do on error paths): on a shared thread the holder, and the
// daemon's whole world, could die mid-test.
func startOnOwnThread(cmd *exec.Cmd, done <-chan struct{}) error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		err := cmd.Start()
		started <- err
		if err == nil {
			<-done
		}
	}()
	return <-started
}

// inside runs a command in the daemon's namespaces and returns its output.
func (d *Daemon) inside(args ...string) ([]byte, error) {
	full := append([]string{"-t", strconv.Itoa(d.holder.Process.Pid), "-m", "-n", "-p", "--"}, args...)
	out, err := exec.Command("nsenter", full...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("libvirtd: %s (in the daemon's namespaces): %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// launch starts virtlogd (unless it runs) and libvirtd, and waits until
// libvirtd answers. "libvirtd -d" returns once the daemon has forked and
// bound its sockets; connecting then waits for its drivers.
func (d *Daemon) launch() error {
	if _, err := d.findProcess("virtlogd"); err != nil {
		if _, err := d.inside("virtlogd", "-d", "-p", "/run/libvirt/virtlogd.pid"); err != nil {
			return err
		}
	}
	if _, err := d.inside("libvirtd", "-d", "-p", "/run/libvirt/libvirtd.pid"); err != nil {
		return err
	}
	l, err := d.connect()
	if err != nil {
		return fmt.Errorf("libvirtd: started, but %s does not answer: %w", d.URI(), err)
	}
	return l.Disconnect()
}

// connect dials the socket and opens the QEMU driver.
func (d *Daemon) connect() (*libvirt.Libvirt, error) {
	l := libvirt.NewWithDialer(dialers.NewLocal(dialers.WithSocket(d.SocketPath()), dialers.WithLocalTimeout(30*time.Second)))
	if err := l.ConnectToURI(libvirt.QEMUSystem); err != nil {
		return nil, err
	}
	return l, nil
}

// kill ends libvirtd with SIGKILL and waits until it is gone.
func (d *Daemon) kill() error {
	return d.signalLibvirtd(syscall.SIGKILL)
}

// signalLibvirtd sends sig to libvirtd, if it runs, and waits until the
// holder has reaped it. The process is looked up by name in the daemon's
// PID namespace each time: a libvirtd that crashed by itself leaves no
// PID to be reused by another process.
func (d *Daemon) signalLibvirtd(sig syscall.Signal) error {
	if !d.Running() {
		return nil
	}
	pid, err := d.findProcess("libvirtd")
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("libvirtd: signalling libvirtd (PID %d): %w", pid, err)
	}
	return waitGone(pid, 60*time.Second)
}

// Running tells whether libvirtd runs (it may have crashed, as libvirt
// 9.0 does on some malformed disk definitions).
func (d *Daemon) Running() bool {
	_, err := d.findProcess("libvirtd")
	return err == nil
}

// cleanup kills the holder, and with it every process in the daemon's
// PID namespace, then removes the state, logging what the daemon's world
// cost.
func (d *Daemon) cleanup(t testing.TB) {
	if d.holder != nil && d.holder.Process != nil {
		if t.Failed() {
			if !d.Running() {
				// A crash leaves no line in libvirtd's own log; the
				// kernel's (dmesg) has the segfault.
				t.Logf("libvirtd is not running: it exited or crashed during the test (a crash is in the kernel log, dmesg)")
			}
			t.Logf("libvirtd logs:\n%s", d.Logs())
		}
		// libvirt probes QEMU when a domain first needs it: keep what
		// this daemon learnt for the next ones.
		saveCapabilities(d.state("cache"))
		cpu := d.worldCPU()
		_ = d.holder.Process.Kill()
		<-d.holderExited
		t.Logf("libvirtd world (libvirtd, virtlogd, QEMU, dnsmasq, swtpm) ran %s and used %.2f CPU-s",
			time.Since(d.started).Round(time.Millisecond), cpu.Seconds())
	}
	if err := os.RemoveAll(d.base); err != nil {
		t.Errorf("libvirtd: removing %s: %v", d.base, err)
	}
}
