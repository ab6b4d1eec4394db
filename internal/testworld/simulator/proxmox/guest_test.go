package proxmoxsim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	proxmox "github.com/luthermonson/go-proxmox"
)

// TestMain lets the test binary double as the guest program: the guest
// hook re-executes it with HF_SIM_TEST_GUEST set.
func TestMain(m *testing.M) {
	if mode := os.Getenv("HF_SIM_TEST_GUEST"); mode != "" {
		os.Exit(guestMain(mode))
	}
	os.Exit(m.Run())
}

// guestMain is a tiny "agent": it reads its seed, records what it saw and
// then powers off (via the URL), exits, or hangs until killed.
func guestMain(mode string) int {
	ud, err := os.ReadFile(filepath.Join(os.Getenv(EnvSeedDir), "user-data"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "read seed:", err)
		return 1
	}
	report := fmt.Sprintf("vmid=%s node=%s ip=%s pid=%d\n%s", os.Getenv(EnvVMID), os.Getenv(EnvNode), os.Getenv(EnvIP), os.Getpid(), ud)
	if err := os.WriteFile(filepath.Join(os.Getenv(EnvVMDir), "seen"), []byte(report), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "write report:", err)
		return 1
	}
	switch mode {
	case "fork-hang", "fork-exit":
		// A job as the agent starts one: in a process group of its own,
		// deaf to SIGTERM.
		child := exec.Command("sh", "-c", "trap '' TERM INT; while :; do sleep 1; done")
		child.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := child.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "start child:", err)
			return 1
		}
		if err := os.WriteFile(filepath.Join(os.Getenv(EnvVMDir), "child"), []byte(strconv.Itoa(child.Process.Pid)), 0o600); err != nil {
			fmt.Fprintln(os.Stderr, "write child:", err)
			return 1
		}
		if mode == "fork-hang" {
			waitToBeKilled()
		}
		return 0
	case "poweroff":
		res, err := http.Post(os.Getenv(EnvPowerOffURL), "text/plain", nil)
		if err != nil {
			fmt.Fprintln(os.Stderr, "poweroff:", err)
			return 1
		}
		res.Body.Close()
		waitToBeKilled() // the simulator kills us as the VM powers off
	case "hang":
		waitToBeKilled()
	case "tpm":
		return guestTPMMain()
	}
	return 0
}

// testLogWriter writes each slog record to the test's log.
type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

// waitToBeKilled blocks until the simulator kills the guest program. Not
// with select {}: in a static build (CGO_ENABLED=0, as make test builds)
// a program whose only goroutine blocks forever, with no timer pending,
// is ended by the runtime at once ("all goroutines are asleep -
// deadlock!", exit 2), so the guest powered its VM off on its own; built
// with cgo the runtime's extra thread hid that. A sleeping goroutine is
// a pending timer, which the runtime never calls a deadlock.
func waitToBeKilled() {
	for {
		time.Sleep(time.Hour)
	}
}

// quietConsole fails the test when the guest program, or the simulator
// about it, wrote to the VM's console: the modes that wait to be killed
// write nothing, so output there is an error, or the runtime's fatal
// error of a program that ended on its own while the test believed it
// was stopped.
func quietConsole(t *testing.T, work string) {
	t.Helper()
	console, err := os.ReadFile(filepath.Join(work, "vm-150", "console.log"))
	if err != nil {
		t.Fatal(err)
	}
	if len(console) > 0 {
		t.Fatalf("the guest program was to wait until it was killed; its console:\n%s", console)
	}
}

func guestEnv(t *testing.T, mode string) (*Simulator, *proxmox.Client, string) {
	t.Helper()
	return guestEnvWith(t, mode, nil)
}

// guestEnvWith is guestEnv with the configuration changed by mutate.
func guestEnvWith(t *testing.T, mode string, mutate func(*Config)) (*Simulator, *proxmox.Client, string) {
	t.Helper()
	work := t.TempDir()
	cfg := testConfig()
	cfg.Guest.Command = []string{os.Args[0], "-test.run=^$"}
	cfg.Guest.Env = map[string]string{"HF_SIM_TEST_GUEST": mode}
	cfg.Guest.WorkDir = work
	if mutate != nil {
		mutate(&cfg)
	}
	// The simulator's log (a guest program's exit and its error among it)
	// goes to the test's, shown when it fails.
	sim, err := New(cfg, WithLogger(slog.New(slog.NewTextHandler(testLogWriter{t}, nil))))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sim)
	t.Cleanup(func() {
		srv.Close()
		if err := sim.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	proxmox.DefaultWaitInterval = 10 * time.Millisecond
	c := proxmox.NewClient(srv.URL+"/api2/json", proxmox.WithHTTPClient(srv.Client()),
		proxmox.WithAPIToken("root@pam!sim", "00000000-0000-0000-0000-000000000000"))
	return sim, c, work
}

// bootWithSeed clones the template, attaches a NoCloud ISO and starts it.
func bootWithSeed(ctx context.Context, t *testing.T, c *proxmox.Client, userData string) *proxmox.VirtualMachine {
	t.Helper()
	node, tmpl := templateOnPVE1(ctx, t, c)
	id, task, err := tmpl.Clone(ctx, &proxmox.VirtualMachineCloneOptions{NewID: 150, Name: "guest"})
	if err != nil {
		t.Fatal(err)
	}
	waitOK(ctx, t, task)
	vm, err := node.VirtualMachine(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := vm.CloudInit(ctx, "ide0", userData, "instance-id: guest\n", "", "", proxmox.WithCloudInitStorage("local")); err != nil {
		t.Fatal(err)
	}
	task, err = vm.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitOK(ctx, t, task)
	return vm
}

// eventually polls cond with bounded retries.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for i := 0; i < 500; i++ {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func vmStatus(sim *Simulator, vmid int) string {
	for _, v := range sim.VMs() {
		if v.VMID == vmid {
			return v.Status
		}
	}
	return "absent"
}

func TestGuestHookPowerOff(t *testing.T) {
	ctx := context.Background()
	sim, c, work := guestEnv(t, "poweroff")
	bootWithSeed(ctx, t, c, "#cloud-config\nrunner: token-abc\n")
	eventually(t, "guest power-off", func() bool { return vmStatus(sim, 150) == "stopped" })
	seen, err := os.ReadFile(filepath.Join(work, "vm-150", "seen"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(seen), "vmid=150 node=pve1 ip=10.99.0.10 ") || !strings.Contains(string(seen), "runner: token-abc") {
		t.Fatalf("guest saw %q", seen)
	}
	pid := guestPID(t, string(seen))
	eventually(t, "guest process gone", func() bool { return syscall.Kill(pid, 0) != nil })
}

func TestGuestHookExitAndKill(t *testing.T) {
	ctx := context.Background()
	t.Run("exit powers off", func(t *testing.T) {
		sim, c, _ := guestEnv(t, "exit")
		bootWithSeed(ctx, t, c, "#cloud-config\n")
		eventually(t, "power-off after exit", func() bool { return vmStatus(sim, 150) == "stopped" })
	})
	t.Run("stop kills the guest", func(t *testing.T) {
		sim, c, work := guestEnv(t, "hang")
		vm := bootWithSeed(ctx, t, c, "#cloud-config\n")
		var seen []byte
		eventually(t, "guest report", func() bool {
			var err error
			seen, err = os.ReadFile(filepath.Join(work, "vm-150", "seen"))
			return err == nil && len(seen) > 0
		})
		pid := guestPID(t, string(seen))
		if vmStatus(sim, 150) != "running" {
			console, _ := os.ReadFile(filepath.Join(work, "vm-150", "console.log"))
			t.Fatalf("hanging guest must keep the VM running; its console:\n%s", console)
		}
		task, err := vm.Stop(ctx)
		if err != nil {
			t.Fatal(err)
		}
		waitOK(ctx, t, task)
		eventually(t, "guest killed", func() bool { return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) })
		quietConsole(t, work)
	})
}

// TestGuestEndsItsProcesses: a VM's end ends everything its guest program
// started, a job in a process group of its own that ignores SIGTERM
// included, whether the VM is stopped or its program exits (the guest
// powered off).
func TestGuestEndsItsProcesses(t *testing.T) {
	ctx := context.Background()
	childOf := func(t *testing.T, work string) int {
		t.Helper()
		var b []byte
		eventually(t, "the guest's child", func() bool {
			var err error
			b, err = os.ReadFile(filepath.Join(work, "vm-150", "child"))
			return err == nil && len(b) > 0
		})
		pid, err := strconv.Atoi(string(b))
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	gone := func(pid int) func() bool {
		return func() bool {
			// A zombie (state Z) is gone too: only its parent's reaping is left.
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if err != nil {
				return true
			}
			st := string(b[strings.LastIndexByte(string(b), ')')+1:])
			return strings.HasPrefix(strings.TrimSpace(st), "Z")
		}
	}
	t.Run("stopped", func(t *testing.T) {
		sim, c, work := guestEnv(t, "fork-hang")
		vm := bootWithSeed(ctx, t, c, "#cloud-config\n")
		child := childOf(t, work)
		if gone(child)() {
			t.Fatal("the child is not running")
		}
		task, err := vm.Stop(ctx)
		if err != nil {
			t.Fatal(err)
		}
		waitOK(ctx, t, task)
		if vmStatus(sim, 150) != "stopped" {
			t.Fatal("the VM did not stop")
		}
		eventually(t, "the child killed with its VM", gone(child))
		quietConsole(t, work)
	})
	t.Run("program exited", func(t *testing.T) {
		sim, c, work := guestEnv(t, "fork-exit")
		bootWithSeed(ctx, t, c, "#cloud-config\n")
		child := childOf(t, work)
		eventually(t, "power-off after exit", func() bool { return vmStatus(sim, 150) == "stopped" })
		eventually(t, "the child killed as its VM powered off", gone(child))
	})
}

func TestParseProcStat(t *testing.T) {
	st, ok := parseProcStat(42, []byte("42 (a) b (c)) S 7 42 40 0 -1 4194560 150 0 0 0"))
	if !ok || st != (procStat{pid: 42, ppid: 7, pgid: 42, sid: 40}) {
		t.Fatalf("parsed %+v %v", st, ok)
	}
	if _, ok := parseProcStat(1, []byte("1 (init S 0")); ok {
		t.Fatal("a stat without the end of its name parsed")
	}
}

func guestPID(t *testing.T, seen string) int {
	t.Helper()
	i := strings.Index(seen, "pid=")
	j := strings.Index(seen[i:], "\n")
	pid, err := strconv.Atoi(seen[i+4 : i+j])
	if err != nil {
		t.Fatalf("no pid in %q", seen)
	}
	return pid
}

// TestGuestProgram: an in-process guest (GuestConfig.Program, set with
// SetGuestProgram) sees what a guest command sees, powers the VM off by
// returning, and is ended when the VM stops; nil goes back to the command.
func TestGuestProgram(t *testing.T) {
	ctx := context.Background()
	sim, c, _ := guestEnv(t, "hang")
	seen := make(chan Guest, 1)
	ended := make(chan error, 1)
	var hang atomic.Bool
	if err := sim.SetGuestProgram(func(ctx context.Context, g Guest) error {
		ud, err := os.ReadFile(filepath.Join(g.SeedDir, "user-data"))
		if err != nil {
			return fmt.Errorf("seed: %w", err)
		}
		if !strings.Contains(string(ud), "runner: token-abc") {
			return fmt.Errorf("seed user-data %q lacks the runner", ud)
		}
		fmt.Fprintln(g.Console, "in-process guest up")
		seen <- g
		if hang.Load() {
			<-ctx.Done()
			ended <- ctx.Err()
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	bootWithSeed(ctx, t, c, "#cloud-config\nrunner: token-abc\n")
	g := <-seen
	if g.VMID != 150 || g.Node != "pve1" || g.IP != "10.99.0.10" || !strings.HasPrefix(g.PowerOffURL, "http://127.0.0.1:") {
		t.Errorf("guest = %+v", g)
	}
	eventually(t, "power-off after the program returned", func() bool { return vmStatus(sim, 150) == "stopped" })
	if out, err := sim.Console(150); err != nil || !strings.Contains(string(out), "in-process guest up") {
		t.Errorf("console %q, %v", out, err)
	}

	// A program that does not return ends with the VM.
	hang.Store(true)
	n, err := c.Node(ctx, "pve1")
	if err != nil {
		t.Fatal(err)
	}
	v, err := n.VirtualMachine(ctx, 150)
	if err != nil {
		t.Fatal(err)
	}
	task, err := v.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitOK(ctx, t, task)
	<-seen
	if vmStatus(sim, 150) != "running" {
		t.Fatal("a guest program that has not returned must keep the VM running")
	}
	if task, err = v.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	waitOK(ctx, t, task)
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the program's context ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("stopping the VM did not end its guest program")
	}
	if err := sim.SetGuestProgram(nil); err != nil {
		t.Errorf("back to the command: %v", err)
	}
}
