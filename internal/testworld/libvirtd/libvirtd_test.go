package libvirtd

import (
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

// TestTwoDaemonsCoexist: two daemons run side by side, each with its own
// state (a network of the same name and subnet in each), and each ends
// with its world.
func TestTwoDaemonsCoexist(t *testing.T) {
	var daemons [2]*Daemon
	var wg sync.WaitGroup
	for i := range daemons {
		wg.Add(1)
		go func() {
			defer wg.Done()
			began := time.Now()
			daemons[i] = Start(t)
			t.Logf("daemon %d started in %s", i, time.Since(began).Round(time.Millisecond))
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	subnet := netip.MustParsePrefix("192.168.77.0/24")
	for i, d := range daemons {
		d.DefineNetwork(t, "isolated", subnet)
		l := d.Dial(t)
		nets, _, err := l.ConnectListAllNetworks(1, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(nets) != 1 || nets[0].Name != "isolated" {
			t.Errorf("daemon %d lists networks %v, want only its own", i, nets)
		}
	}
	if daemons[0].SocketPath() == daemons[1].SocketPath() {
		t.Errorf("both daemons listen on %s", daemons[0].SocketPath())
	}
}

// TestRestartKeepsGuestsAndPools: after a SIGKILL and a restart the daemon
// still has its pools and networks (they are persistent definitions in
// its private state) and its URI answers again; Kill leaves it refusing.
func TestRestartKeepsGuestsAndPools(t *testing.T) {
	d := Start(t)
	d.DefinePool(t, "images", d.Dir()+"/images")
	d.DefineNetwork(t, "isolated", netip.MustParsePrefix("10.77.0.0/24"))

	d.Kill(t)
	if d.Running() {
		t.Fatal("libvirtd runs after Kill")
	}
	if _, err := d.connect(); err == nil {
		t.Fatal("a killed daemon still accepts connections")
	}
	began := time.Now()
	d.Restart(t)
	t.Logf("restart took %s", time.Since(began).Round(time.Millisecond))

	l := d.Dial(t)
	pool, err := l.StoragePoolLookupByName("images")
	if err != nil {
		t.Fatalf("pool lost across the restart: %v", err)
	}
	if state, _, _, _, err := l.StoragePoolGetInfo(pool); err != nil || libvirt.StoragePoolState(state) != libvirt.StoragePoolRunning {
		t.Errorf("pool state after restart: %d, %v; want running", state, err)
	}
	network, err := l.NetworkLookupByName("isolated")
	if err != nil {
		t.Fatalf("network lost across the restart: %v", err)
	}
	if active, err := l.NetworkIsActive(network); err != nil || active != 1 {
		t.Errorf("network active after restart: %d, %v; want 1", active, err)
	}
	d.Stop(t)
	if _, err := d.connect(); err == nil {
		t.Fatal("a stopped daemon still accepts connections")
	}
	d.Restart(t)
	if _, err := d.Dial(t).ConnectGetLibVersion(); err != nil {
		t.Fatal(err)
	}
}

// TestFreezeHangsCalls: a frozen libvirtd is a stopped process, a call
// made meanwhile gets no answer until it is thawed, and then does.
func TestFreezeHangsCalls(t *testing.T) {
	d := Start(t)
	l := d.Dial(t)
	d.Freeze(t)
	pid, err := d.findProcess("libvirtd")
	if err != nil {
		t.Fatal(err)
	}
	if state, err := procState(pid); err != nil || state != 'T' {
		t.Fatalf("frozen libvirtd is in state %c (%v), want T (stopped)", state, err)
	}
	answered := make(chan error, 1)
	go func() {
		_, err := l.ConnectGetLibVersion()
		answered <- err
	}()
	select {
	case err := <-answered:
		t.Fatalf("a stopped daemon answered: %v", err)
	default:
	}
	d.Thaw(t)
	if err := <-answered; err != nil {
		t.Fatalf("the call after thawing: %v", err)
	}
}

// TestSmallPoolIsFull: a volume that does not fit in a small pool fails
// with the kernel's ENOSPC, through libvirt.
func TestSmallPoolIsFull(t *testing.T) {
	d := Start(t)
	pool, _ := d.DefineSmallPool(t, "full", 16<<10)
	doc, err := (&libvirtxml.StorageVolume{
		Name:     "disk.qcow2",
		Capacity: &libvirtxml.StorageVolumeSize{Unit: "MiB", Value: 64},
		Target:   &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: "qcow2"}},
	}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.Dial(t).StorageVolCreateXML(pool, doc, 0)
	var lerr libvirt.Error
	if err == nil || !strings.Contains(err.Error(), "No space left on device") {
		t.Fatalf("creating a volume in a full pool: %v, want No space left on device", err)
	}
	if errors.As(err, &lerr) {
		t.Logf("libvirt error code %d: %s", lerr.Code, lerr.Message)
	}
}

// TestSweepStale: the directory of a daemon whose holder is gone is
// removed by the next Start; a live one's stays.
func TestSweepStale(t *testing.T) {
	stale, err := os.MkdirTemp("", baseDirPrefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(stale) })
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stale, holderPIDFile), []byte(strconv.Itoa(gone.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	d := Start(t)
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the stale directory %s is still there: %v", stale, err)
	}
	sweepStale()
	if _, err := os.Stat(d.Dir()); err != nil {
		t.Errorf("a live daemon's directory was swept: %v", err)
	}
}

func TestNetworkXMLRange(t *testing.T) {
	for _, tc := range []struct{ subnet, start, end string }{
		{"10.0.0.0/29", "10.0.0.2", "10.0.0.6"},
		{"192.168.5.0/24", "192.168.5.2", "192.168.5.254"},
		{"10.8.0.0/16", "10.8.0.2", "10.8.0.254"},
	} {
		doc, err := networkXML("n", netip.MustParsePrefix(tc.subnet))
		if err != nil {
			t.Fatal(err)
		}
		want := `<range start="` + tc.start + `" end="` + tc.end + `">`
		if !strings.Contains(doc, want) {
			t.Errorf("%s: %s lacks %s", tc.subnet, doc, want)
		}
	}
	if _, err := networkXML("n", netip.MustParsePrefix("10.0.0.0/30")); err == nil {
		t.Error("a /30 was accepted")
	}
}

// TestGuestSurvivesRestart: a running QEMU domain (one with nothing to
// boot: the firmware idles) with a vTPM keeps its QEMU and swtpm
// processes across a SIGKILL of libvirtd, the new daemon reports it
// running, and Cleanup's end of the namespace takes them with it.
func TestGuestSurvivesRestart(t *testing.T) {
	d := Start(t)
	doc, err := (&libvirtxml.Domain{
		Type:   "qemu",
		Name:   "idle",
		Memory: &libvirtxml.DomainMemory{Value: 32, Unit: "MiB"},
		OS:     &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Arch: "x86_64", Machine: "pc", Type: "hvm"}},
		// A vTPM: libvirt manufactures its state with swtpm_setup and runs
		// swtpm beside QEMU, all inside the daemon's namespaces.
		Devices: &libvirtxml.DomainDeviceList{TPMs: []libvirtxml.DomainTPM{{
			Model:   "tpm-crb",
			Backend: &libvirtxml.DomainTPMBackend{Emulator: &libvirtxml.DomainTPMBackendEmulator{Version: "2.0"}},
		}}},
	}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	l := d.Dial(t)
	began := time.Now()
	if _, err := l.DomainCreateXML(doc, 0); err != nil {
		t.Fatalf("starting a domain: %v\n%s", err, d.Logs())
	}
	t.Logf("domain with a vTPM started in %s (swtpm_setup manufactures its TPM first)", time.Since(began).Round(time.Millisecond))
	pid := d.DomainPID(t, "idle")

	d.Restart(t)
	l = d.Dial(t)
	dom, err := l.DomainLookupByName("idle")
	if err != nil {
		t.Fatalf("the domain is gone after the restart: %v", err)
	}
	state, _, err := l.DomainGetState(dom, 0)
	if err != nil || libvirt.DomainState(state) != libvirt.DomainRunning {
		t.Fatalf("domain state after the restart: %d, %v; want running", state, err)
	}
	if again := d.DomainPID(t, "idle"); again != pid {
		t.Errorf("QEMU PID %d after the restart, want the same process %d", again, pid)
	}
	if _, err := d.findProcess("swtpm"); err != nil {
		t.Errorf("the vTPM: %v", err)
	}
}

// TestHostNetworkSharesTheHostsNamespace: with HostNetwork, libvirtd runs
// in the test's own network namespace (where QEMU's user-mode guests
// reach the host's loopback), and in a namespace of its own without it.
func TestHostNetworkSharesTheHostsNamespace(t *testing.T) {
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		opts   []Option
		shared bool
	}{{"private", nil, false}, {"host network", []Option{HostNetwork()}, true}} {
		t.Run(c.name, func(t *testing.T) {
			d := Start(t, c.opts...)
			pid, err := d.findProcess("libvirtd")
			if err != nil {
				t.Fatal(err)
			}
			ns, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/net")
			if err != nil {
				t.Fatal(err)
			}
			if shared := ns == self; shared != c.shared {
				t.Errorf("libvirtd's network namespace %s, the test's %s: shared %v, want %v", ns, self, shared, c.shared)
			}
			d.Dial(t) // it answers
		})
	}
}
