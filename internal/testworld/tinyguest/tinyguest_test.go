package tinyguest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	"github.com/hyperfleet/hyperfleet/internal/testworld/libvirtd"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/qemu"
)

// TestGuestThroughLibvirt boots a linked clone of the template (a qcow2
// overlay on the template's disk) with a NoCloud ISO through a real
// libvirtd and checks, through libvirt only: the agent answers; libvirt's
// agent-sourced interface addresses include the DHCP address; a file
// written through the agent reads back; the guest read the seed it was
// given; guest-shutdown leads to a shut-off domain, seen as a lifecycle
// event.
func TestGuestThroughLibvirt(t *testing.T) {
	skipUnderShort(t)
	began := time.Now()
	img := Build(t)
	t.Logf("image built in %s: %s, %s", time.Since(began).Round(time.Millisecond), img.Kernel, img.Initrd)

	d := libvirtd.Start(t)
	subnet := netip.MustParsePrefix("10.99.0.0/24")
	d.DefineNetwork(t, "tiny", subnet)
	pool := d.DefinePool(t, "images", filepath.Join(d.Dir(), "images"))
	conn := d.Dial(t)

	base := filepath.Join(d.Dir(), "images", "template.qcow2")
	clone := filepath.Join(d.Dir(), "images", "clone.qcow2")
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", base, "64M")
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", base, clone)
	if err := conn.StoragePoolRefresh(pool, 0); err != nil {
		t.Fatal(err)
	}
	tmpl := Template(Options{Name: "template", Image: img, Disk: base, Network: "tiny"})
	tmplXML, err := tmpl.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.DomainDefineXML(tmplXML); err != nil {
		t.Fatalf("defining the template: %v", err)
	}

	seed := map[string][]byte{
		"meta-data":      []byte("instance-id: clone-1\nlocal-hostname: clone-1\n"),
		"user-data":      []byte("#cloud-config\nruncmd: [echo hello]\n"),
		"network-config": []byte("version: 2\nethernets:\n  eth0:\n    dhcp4: true\n"),
	}
	iso := filepath.Join(d.Dir(), "clone-1-seed.iso")
	if err := qemu.WriteNoCloudISO(iso, seed); err != nil {
		t.Fatal(err)
	}
	console := filepath.Join(d.Dir(), "clone-1.console")
	cloneXML, err := Template(Options{Name: "clone-1", Image: img, Disk: clone, SeedISO: iso, Network: "tiny", ConsoleLog: console}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			raw, _ := os.ReadFile(console)
			t.Logf("clone-1 console:\n%s", raw)
		}
	})

	dom, err := conn.DomainDefineXML(cloneXML)
	if err != nil {
		t.Fatal(err)
	}
	booted := time.Now()
	if err := conn.DomainCreate(dom); err != nil {
		t.Fatalf("starting clone-1: %v\n%s", err, d.Logs())
	}
	pid := d.DomainPID(t, "clone-1")
	if err := WaitAgent(conn, dom, 120*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("boot to agent ready: %s wall, %.2f QEMU CPU-s", time.Since(booted).Round(time.Millisecond), cpuSeconds(t, pid))

	addr := waitAgentAddress(t, conn, dom, subnet)
	t.Logf("agent reports %s", addr)

	content := []byte("written through the agent\n")
	if err := WriteGuestFile(conn, dom, "/tmp/probe", content); err != nil {
		t.Fatal(err)
	}
	if got, ok := GuestFile(conn, dom, "/tmp/probe"); !ok || !bytes.Equal(got, content) {
		t.Errorf("read back %q (%v), want %q", got, ok, content)
	}
	if _, ok := GuestFile(conn, dom, "/tmp/absent"); ok {
		t.Error("a missing file reads as present")
	}

	seen := SeenCloudInit(conn, dom)
	for name, got := range map[string][]byte{"meta-data": seen.MetaData, "user-data": seen.UserData, "network-config": seen.NetworkConfig} {
		if !bytes.Equal(got, seed[name]) {
			t.Errorf("the guest read %s %q, want %q", name, got, seed[name])
		}
	}

	var host struct {
		Name string `json:"host-name"`
	}
	ret, err := AgentCommand(conn, dom, `{"execute":"guest-get-host-name"}`)
	if err != nil || json.Unmarshal(ret, &host) != nil || host.Name != "clone-1" {
		t.Errorf("guest-get-host-name: %s, %v; want clone-1 from meta-data", ret, err)
	}

	out, code := guestExec(t, conn, dom, "echo", "from", "guest-exec")
	if out != "from guest-exec\n" || code != 0 {
		t.Errorf("guest-exec: %q, exit code %d", out, code)
	}

	// The daemon dies and comes back: the guest runs on, and the new
	// daemon reconnects to its agent.
	d.Restart(t)
	conn = d.Dial(t)
	if again := d.DomainPID(t, "clone-1"); again != pid {
		t.Errorf("QEMU PID %d after the daemon's restart, want %d", again, pid)
	}
	if err := WaitAgent(conn, dom, 60*time.Second); err != nil {
		t.Fatalf("after the daemon's restart: %v", err)
	}

	events, err := conn.LifecycleEvents(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cpu := cpuSeconds(t, pid)
	if err := PowerOffFromInside(conn, dom); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, events, "clone-1")
	state, _, err := conn.DomainGetState(dom, 0)
	if err != nil || libvirt.DomainState(state) != libvirt.DomainShutoff {
		t.Errorf("clone-1 state %d, %v; want shut off", state, err)
	}
	t.Logf("whole boot to power-off: %s wall, %.2f QEMU CPU-s", time.Since(booted).Round(time.Millisecond), cpu)
}

// TestStaticAddressFromNetworkConfig: a network-config with a static
// address for the NIC's MAC gives the guest that address, and no DHCP
// lease.
func TestStaticAddressFromNetworkConfig(t *testing.T) {
	skipUnderShort(t)
	img := Build(t)
	d := libvirtd.Start(t)
	subnet := netip.MustParsePrefix("10.98.0.0/24")
	d.DefineNetwork(t, "tiny", subnet)
	conn := d.Dial(t)
	disk := filepath.Join(d.Dir(), "disk.qcow2")
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", disk, "16M")
	const mac = "52:54:00:12:34:56"
	iso := filepath.Join(d.Dir(), "seed.iso")
	if err := qemu.WriteNoCloudISO(iso, map[string][]byte{
		"meta-data":      []byte("instance-id: static-1\n"),
		"user-data":      []byte("#cloud-config\n"),
		"network-config": []byte("version: 2\nethernets:\n  id0:\n    match:\n      macaddress: '" + mac + "'\n    set-name: eth0\n    addresses: [10.98.0.200/24]\n    gateway4: 10.98.0.1\n"),
	}); err != nil {
		t.Fatal(err)
	}
	doc, err := Template(Options{Name: "static-1", Image: img, Disk: disk, SeedISO: iso, Network: "tiny", MAC: mac}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	dom, err := conn.DomainCreateXML(doc, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := WaitAgent(conn, dom, 120*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := waitAgentAddress(t, conn, dom, subnet); got != netip.MustParseAddr("10.98.0.200") {
		t.Errorf("address %s, want the static 10.98.0.200", got)
	}

	// A graceful shutdown through ACPI (as libvirt does without an
	// agent) powers the guest off too.
	events, err := conn.LifecycleEvents(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.DomainShutdownFlags(dom, libvirt.DomainShutdownAcpiPowerBtn); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, events, "static-1")
}

// guestExec runs /init's tool args in the guest and waits for its end;
// it returns its standard output and exit code.
func guestExec(t *testing.T, conn *libvirt.Libvirt, dom libvirt.Domain, args ...string) (string, int) {
	t.Helper()
	res, err := Exec(conn, dom, args...)
	if err != nil {
		t.Fatal(err)
	}
	return res.Stdout, res.ExitCode
}

// waitAgentAddress fails the test unless the agent reports an address
// in subnet.
func waitAgentAddress(t *testing.T, conn *libvirt.Libvirt, dom libvirt.Domain, subnet netip.Prefix) netip.Addr {
	t.Helper()
	addr, err := WaitAgentAddress(conn, dom, subnet, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// waitStopped waits for name's Stopped lifecycle event.
func waitStopped(t *testing.T, events <-chan libvirt.DomainEventLifecycleMsg, name string) {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("the lifecycle event stream ended")
			}
			if ev.Dom.Name == name && libvirt.DomainEventType(ev.Event) == libvirt.DomainEventStopped {
				return
			}
		case <-timeout:
			t.Fatalf("%s never stopped", name)
		}
	}
}

// cpuSeconds is a process's user+system CPU time from /proc/<pid>/stat.
func cpuSeconds(t *testing.T, pid int) float64 {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the parenthesised command name; utime and stime are
	// the 14th and 15th fields overall.
	fields := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// skipUnderShort leaves a guest's boot out of the race run (-short): what
// runs there is QEMU and the guest's /init, no code of the operator's for
// the race detector to watch; make test boots it.
func skipUnderShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("boots a guest under TCG: make test runs it, the race run (-short) has nothing of the operator's to watch in it")
	}
}
