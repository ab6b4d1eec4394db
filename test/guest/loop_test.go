//go:build guest

package guest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/devenv"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/simulator/proxmox"
)

// The milestones of one VM's life, in the order they must happen.
var milestones = []string{"created", "booted", "cloud-init done", "runner online", "job started", "job completed", "powered off", "destroyed"}

// timeline records when each VM reached each milestone, sampled twice a
// second (job times are the GitHub simulator's own, a power-off missed
// between samples the start of the VM's destroy task).
type timeline struct {
	mu    sync.Mutex
	vms   map[string]map[string]time.Time // VM name -> milestone -> time
	ids   map[string]int
	addrs map[string][]string // VM name -> addresses the claim reported
	// leaks names where the GitHub PAT appeared: it must never leave the
	// operator (guests' consoles, the simulators' state).
	leaks []string
}

func (tl *timeline) mark(vm, milestone string, at time.Time) {
	if tl.vms[vm] == nil {
		tl.vms[vm] = map[string]time.Time{}
	}
	if _, seen := tl.vms[vm][milestone]; !seen {
		tl.vms[vm][milestone] = at
	}
}

func (tl *timeline) sample(w *devenv.World) {
	snap, err := w.Snapshot(context.Background())
	if err != nil {
		return
	}
	now := time.Now()
	tl.mu.Lock()
	defer tl.mu.Unlock()
	claims := map[string]bool{}
	for _, c := range snap.Claims {
		claims[c.Name] = true
	}
	present := map[string]bool{}
	for _, vm := range snap.VMs {
		// A clone carries a temporary name until the operator names it
		// after its claim.
		if !claims[vm.Name] && tl.vms[vm.Name] == nil {
			continue
		}
		present[vm.Name] = true
		tl.ids[vm.Name] = vm.VMID
		tl.mark(vm.Name, "created", now)
		if vm.Status == "running" {
			tl.mark(vm.Name, "booted", now)
			console, err := w.Proxmox.Console(vm.VMID)
			if err == nil && bytes.Contains(console, []byte("Cloud-init v.")) && bytes.Contains(console, []byte(" finished at ")) {
				tl.mark(vm.Name, "cloud-init done", now)
			}
			if bytes.Contains(console, []byte(devenv.PAT)) {
				tl.leaks = append(tl.leaks, "console of "+vm.Name)
			}
		}
		if _, booted := tl.vms[vm.Name]["booted"]; booted && vm.Status == "stopped" {
			tl.mark(vm.Name, "powered off", now)
		}
	}
	pve := w.Proxmox.State()
	for name := range tl.vms {
		if present[name] {
			continue
		}
		// A VM can power off and be destroyed between two samples; it
		// was off before its destroy task started (Proxmox refuses to
		// destroy a running VM).
		if _, off := tl.vms[name]["powered off"]; !off {
			if at, ok := destroyStart(pve, tl.ids[name]); ok {
				tl.mark(name, "powered off", at)
			}
		}
		tl.mark(name, "destroyed", now)
	}
	for _, c := range snap.Claims {
		if c.Status.Network != nil && len(c.Status.Network.Addresses) > 0 {
			tl.addrs[c.Name] = c.Status.Network.Addresses
		}
	}
	for name, state := range map[string]any{"Proxmox simulator state": pve, "GitHub simulator state": w.GitHub.State()} {
		if data, err := json.Marshal(state); err == nil && bytes.Contains(data, []byte(devenv.PAT)) {
			tl.leaks = append(tl.leaks, name)
		}
	}
	for _, r := range w.GitHub.State().Runners {
		vm := vmOfRunner(r.Name)
		if tl.vms[vm] != nil && r.Status == "online" {
			tl.mark(vm, "runner online", now)
		}
	}
	for _, j := range snap.Jobs {
		vm := vmOfRunner(j.RunnerName)
		if tl.vms[vm] == nil {
			continue
		}
		if !j.StartedAt.IsZero() {
			tl.mark(vm, "job started", j.StartedAt)
		}
		if !j.CompletedAt.IsZero() {
			tl.mark(vm, "job completed", j.CompletedAt)
		}
	}
}

// destroyStart is when the last destroy task of vmid started (a UPID's
// fifth field is its start time, hex Unix seconds).
func destroyStart(pve proxmoxsim.State, vmid int) (time.Time, bool) {
	var at time.Time
	for _, task := range pve.Tasks {
		f := strings.Split(task.UPID, ":")
		if task.Type != "qmdestroy" || task.ID != strconv.Itoa(vmid) || len(f) < 5 {
			continue
		}
		if sec, err := strconv.ParseInt(f[4], 16, 64); err == nil {
			at = time.Unix(sec, 0)
		}
	}
	return at, !at.IsZero()
}

// vmOfRunner: a runner is named <claim>-<uid part>-<install mark>, its VM
// after the claim.
func vmOfRunner(runner string) string {
	vm := runner
	for range 2 {
		vm = vm[:max(strings.LastIndex(vm, "-"), 0)]
	}
	return vm
}

// TestRunnerPoolJobsOnRealGuests: the operator, both simulators and real
// guests. A RunnerPool runs 2 jobs, each on a fresh VM that boots the
// image, applies the operator's seed with cloud-init, starts the agent
// under systemd, runs the job against the GitHub simulator over QEMU's
// network and powers itself off; the operator destroys it. Afterwards no
// VM, ISO, claim, runner or guest disk is left.
func TestRunnerPoolJobsOnRealGuests(t *testing.T) {
	img := image
	runJobs(t, 2, devenv.Options{GuestImage: &img})
}

// TestAgentFromOperatorOnRealGuests: the same with agentSource Operator on
// the image without an agent: cloud-init's runcmd downloads the agent from
// the operator's agent server (HTTPS, its CA from the seed), checks its
// SHA-256 and installs it before the unit starts it.
func TestAgentFromOperatorOnRealGuests(t *testing.T) {
	img := operatorImage
	runJobs(t, 1, devenv.Options{GuestImage: &img, AgentFromOperator: true})
}

// runJobs runs jobs jobs through a world of real guests (a pool of max
// jobs) and checks everything the loop promises.
func runJobs(t *testing.T, jobs int, opts devenv.Options) {
	dir := t.TempDir()
	opts.Dir, opts.AgentBinary, opts.MaxReplicas, opts.Progress = dir, agentBinary, int32(jobs), testWriter{t}
	w, err := devenv.Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	tl := &timeline{vms: map[string]map[string]time.Time{}, ids: map[string]int{}, addrs: map[string][]string{}}
	t.Cleanup(func() {
		if t.Failed() {
			keep := filepath.Join(os.TempDir(), "hyperfleet-guest-"+t.Name())
			_ = os.RemoveAll(keep)
			if err := os.CopyFS(keep, os.DirFS(dir)); err == nil {
				t.Logf("logs kept in %s", keep)
			}
		}
		if err := w.Stop(); err != nil {
			t.Errorf("stop world: %v", err)
		}
	})
	start := time.Now()
	if _, err := w.EnqueueJobs(jobs, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var last devenv.Snapshot
	deadline := time.Now().Add(25 * time.Minute)
	for {
		tl.sample(w)
		snap, err := w.Snapshot(context.Background())
		if err == nil && len(snap.Jobs) == jobs && snap.Done(0) {
			last = snap
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not done within 25 minutes: jobs %+v, VMs %+v, claims %d, runners %d", snap.Jobs, snap.VMs, len(snap.Claims), len(snap.Runners))
		}
		time.Sleep(500 * time.Millisecond)
	}
	tl.sample(w)
	t.Logf("%d jobs done on real guests in %s", jobs, time.Since(start).Round(time.Second))
	logTimeline(t, tl, start)

	// Every job ran once, to success, on a runner of its own VM.
	seen := map[string]bool{}
	for _, j := range last.Jobs {
		if j.Status != "completed" || j.Conclusion != "success" {
			t.Errorf("job %d: %s/%s, want completed/success", j.ID, j.Status, j.Conclusion)
		}
		vm := vmOfRunner(j.RunnerName)
		if tl.vms[vm] == nil {
			t.Errorf("job %d ran on runner %q, whose VM the operator never created", j.ID, j.RunnerName)
		}
		if seen[vm] {
			t.Errorf("VM %s ran two jobs", vm)
		}
		seen[vm] = true
	}
	// Every VM that ran a job went through every milestone, in order, and
	// its guest agent reported its address on the guests' network.
	_, guestNet, _ := net.ParseCIDR(w.Proxmox.GuestHostAddress() + "/24")
	for vm := range seen {
		var prev time.Time
		for _, m := range milestones {
			at, ok := tl.vms[vm][m]
			if !ok {
				t.Errorf("VM %s: never saw %q", vm, m)
				continue
			}
			// Sampling is per second; job times are exact.
			if at.Before(prev.Add(-2 * time.Second)) {
				t.Errorf("VM %s: %q at %s, before the previous milestone (%s)", vm, m, at.Format(time.TimeOnly), prev.Format(time.TimeOnly))
			}
			prev = at
		}
		inNet := false
		for _, a := range tl.addrs[vm] {
			inNet = inNet || guestNet.Contains(net.ParseIP(a))
		}
		if !inNet {
			t.Errorf("VM %s: the claim's addresses %v are not on the guests' network %s", vm, tl.addrs[vm], guestNet)
		}
	}
	if len(tl.leaks) > 0 {
		t.Errorf("the GitHub PAT appeared in: %v", tl.leaks)
	}
	if len(last.VMs) != 0 || len(last.ISOs) != 0 || len(last.Claims) != 0 || len(last.Runners) != 0 {
		t.Errorf("left behind: VMs %v, ISOs %v, claims %d, runners %d", last.VMs, last.ISOs, len(last.Claims), len(last.Runners))
	}
	// No guest disk, ISO or socket is left on the host.
	if entries, _ := os.ReadDir(filepath.Join(dir, "guests")); len(entries) != 0 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("left in the guests' work dir: %v", names)
	}
}

// logTimeline writes each VM's milestones, as seconds since the jobs were
// queued.
func logTimeline(t *testing.T, tl *timeline, start time.Time) {
	names := make([]string, 0, len(tl.vms))
	for n := range tl.vms {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		var parts []string
		for _, m := range milestones {
			if at, ok := tl.vms[n][m]; ok {
				parts = append(parts, fmt.Sprintf("%s +%ds", m, int(at.Sub(start).Seconds())))
			}
		}
		t.Logf("VM %d %s: %s; addresses %v", tl.ids[n], n, strings.Join(parts, " -> "), tl.addrs[n])
	}
}

// testWriter sends the world's progress messages to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
