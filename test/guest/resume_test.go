//go:build guest

package guest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/qemu"
)

// resumeMachine is the machine the saved state and its clones share: a
// resumed QEMU must have the saved one's devices and settings; only the
// disk file, the sockets and the console differ.
func resumeMachine(t *testing.T, name, dir, disk string) qemu.Machine {
	t.Helper()
	sock, err := os.MkdirTemp("", "hf-qemu-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sock) })
	return qemu.Machine{
		Name: name, CPU: "kvm64", Cores: 1, MemoryMiB: 1024,
		Kernel: image.Kernel, Initrd: image.Initrd, Append: image.Append,
		Disk: disk, MAC: "bc:24:11:00:00:01", Net: qemu.DefaultUserNet,
		Console: filepath.Join(dir, "console.log"), SocketDir: sock,
		// Each machine its own generation id, as each Proxmox VM has.
		VMGenID: uuid(),
	}
}

func uuid() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// overlay creates a qcow2 overlay at path backed by base.
func overlay(t *testing.T, path, base, format string) {
	t.Helper()
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", format, "-b", base, path).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create %s: %v: %s", path, err, out)
	}
}

func startGuest(t *testing.T, m qemu.Machine) *qemu.Process {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(m.Console), 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := qemu.Start(m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Kill()
		<-p.Done()
	})
	return p
}

func guestRun(ctx context.Context, t *testing.T, p *qemu.Process, argv ...string) string {
	t.Helper()
	res, err := qemu.AgentExec(ctx, p.Machine.AgentSocket(), argv...)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("%s in the guest exited %d: %s%s", strings.Join(argv, " "), res.ExitCode, res.Stdout, res.Stderr)
	}
	return strings.TrimSpace(res.Stdout)
}

// TestResumedClonesGetTheirOwnIdentity: the image booted once to the point
// where it waits for its configuration (the guest agent answers; no seed,
// so cloud-init has nothing to do), its state saved, and two clones
// resumed from it, each on its own overlay of the saved disk: each gets
// the machine-id and host name written into it after the resume, its
// clock is stepped to the host's, and a file one clone writes is not on
// the other's disk. It logs QEMU's CPU time for the cold boot and each
// resume.
//
// Mutation: qemu.StepClock returning nil without setting the clock fails
// this test (the clone's clock a day behind); the old tests had no
// resume.
func TestResumedClonesGetTheirOwnIdentity(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir := t.TempDir()
	stateDisk := filepath.Join(dir, "state-disk.qcow2")
	overlay(t, stateDisk, image.Disk, image.Format)
	cold := startGuest(t, resumeMachine(t, "state", filepath.Join(dir, "state"), stateDisk))
	if err := qemu.WaitAgent(ctx, cold.Machine.AgentSocket(), cold.Done()); err != nil {
		t.Fatal(err)
	}
	coldCPU, err := cold.CPUTime()
	if err != nil {
		t.Fatal(err)
	}
	// A state is saved once and resumed for days: the saved guest's clock
	// is set a day back, as a resumed clone's would be a day after the save.
	guestRun(ctx, t, cold, "date", "-u", "-s", "@"+strconv.FormatInt(time.Now().Add(-24*time.Hour).Unix(), 10))
	state := filepath.Join(dir, "state.bin")
	if err := qemu.SaveState(ctx, cold, state); err != nil {
		t.Fatal(err)
	}
	t.Logf("cold boot to the guest agent: %s of QEMU CPU", coldCPU)

	type identity struct{ machineID, hostname, marker string }
	var got []identity
	for i := range 2 {
		name := fmt.Sprintf("clone-%d", i)
		cdir := filepath.Join(dir, name)
		if err := os.MkdirAll(cdir, 0o755); err != nil {
			t.Fatal(err)
		}
		disk := filepath.Join(cdir, "disk.qcow2")
		overlay(t, disk, stateDisk, "qcow2")
		m := resumeMachine(t, name, cdir, disk)
		m.Incoming = state
		p := startGuest(t, m)
		if err := qemu.Resume(ctx, p); err != nil {
			t.Fatal(err)
		}
		if err := qemu.WaitAgent(ctx, m.AgentSocket(), p.Done()); err != nil {
			t.Fatal(err)
		}
		resumedCPU, _ := p.CPUTime()
		if err := qemu.StepClock(ctx, m.AgentSocket(), time.Now()); err != nil {
			t.Fatal(err)
		}
		secs, err := strconv.ParseInt(guestRun(ctx, t, p, "date", "+%s"), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if skew := time.Since(time.Unix(secs, 0)); skew > time.Minute || skew < -time.Minute {
			t.Errorf("%s: the guest's clock is %s off the host's after the step", name, skew)
		}
		id := make([]byte, 16)
		_, _ = rand.Read(id)
		want := identity{machineID: hex.EncodeToString(id), hostname: "hf-" + name}
		if err := qemu.AgentWriteFile(ctx, m.AgentSocket(), "/etc/machine-id", []byte(want.machineID+"\n"), 0o444); err != nil {
			t.Fatal(err)
		}
		if err := qemu.AgentWriteFile(ctx, m.AgentSocket(), "/etc/hostname", []byte(want.hostname+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		guestRun(ctx, t, p, "hostname", want.hostname)
		// The other clone's marker must not be on this one's disk.
		if i > 0 {
			if out := guestRun(ctx, t, p, "sh", "-c", "cat /var/lib/hf-marker 2>/dev/null || true"); out != "" {
				t.Errorf("%s sees %q that clone-0 wrote on its own disk", name, out)
			}
		}
		guestRun(ctx, t, p, "sh", "-c", "echo "+name+" > /var/lib/hf-marker && sync")
		var host struct {
			HostName string `json:"host-name"`
		}
		if err := qemu.AgentCall(ctx, m.AgentSocket(), "guest-get-host-name", nil, &host); err != nil {
			t.Fatal(err)
		}
		g := identity{machineID: guestRun(ctx, t, p, "cat", "/etc/machine-id"), hostname: host.HostName, marker: guestRun(ctx, t, p, "cat", "/var/lib/hf-marker")}
		want.marker = name
		if g != want {
			t.Errorf("%s after the resume: %+v, want %+v", name, g, want)
		}
		got = append(got, g)
		total, _ := p.CPUTime()
		t.Logf("%s: resumed to the guest agent in %s of QEMU CPU, %s with its identity written", name, resumedCPU, total)
	}
	if got[0].machineID == got[1].machineID || got[0].hostname == got[1].hostname {
		t.Errorf("two resumed clones share an identity: %+v", got)
	}
}
