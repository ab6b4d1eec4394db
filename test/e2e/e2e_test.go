//go:build e2e

// Package e2e runs HyperFleet's whole loop: a real kube-apiserver and etcd,
// the operator, the Proxmox VE simulator whose guests run the real
// hyperfleet-agent binary against the NoCloud ISO the operator attached,
// and the GitHub simulator delivering webhooks. Run with `make test-e2e`.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	"github.com/hyperfleet/hyperfleet/internal/testworld/eventdump"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// agentBinary is the hyperfleet-agent built once for every scenario.
var agentBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "hyperfleet-e2e-agent-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentBinary = filepath.Join(dir, "hyperfleet-agent")
	cmd := exec.Command("go", "build", "-trimpath", "-o", agentBinary, "./cmd/hyperfleet-agent")
	cmd.Dir = testenv.RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build hyperfleet-agent: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

const (
	jobs        = 20
	maxReplicas = 5
	jobDuration = 2 * time.Second
)

// TestJobsRunOnFreshVMs: 20 jobs on a pool of min 0, max 5: every job runs
// exactly once, each on its own fresh VM, and nothing is left afterwards.
func TestJobsRunOnFreshVMs(t *testing.T) {
	w, watch := startWorld(t)
	if _, err := w.EnqueueJobs(jobs, jobDuration); err != nil {
		t.Fatal(err)
	}
	waitDone(t, w, 15*time.Minute)
	watch.stop()
	checkWorld(t, w, watch)
}

// TestJobsRunUnderFaultsAndRestart: the same with 5 % of Proxmox requests
// failing and the operator restarted while jobs run.
func TestJobsRunUnderFaultsAndRestart(t *testing.T) {
	w, watch := startWorld(t)
	faulty := proxmoxsim.FaultSpec{ErrorRate: 0.05}
	if err := w.Proxmox.SetFaults(proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{"*": faulty}}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.EnqueueJobs(jobs, jobDuration); err != nil {
		t.Fatal(err)
	}
	// Restart once a few jobs ran, so that VMs are in every state.
	eventually(t, 10*time.Minute, "5 jobs completed", func() error {
		snap, err := w.Snapshot(context.Background())
		if err != nil {
			return err
		}
		n := 0
		for _, j := range snap.Jobs {
			if j.Status == "completed" {
				n++
			}
		}
		if n < 5 {
			return fmt.Errorf("%d completed", n)
		}
		return nil
	})
	t.Log("restarting the operator")
	if err := w.StopOperator(); err != nil {
		t.Fatalf("stop operator: %v", err)
	}
	time.Sleep(2 * time.Second)
	if err := w.StartOperator(context.Background()); err != nil {
		t.Fatalf("start operator: %v", err)
	}
	waitDone(t, w, 20*time.Minute)
	watch.stop()
	checkWorld(t, w, watch)
}

// startWorld starts a world of the scenarios' shape; options adjust it.
func startWorld(t *testing.T, options ...func(*devenv.Options)) (*devenv.World, *watcher) {
	t.Helper()
	opts := devenv.Options{Dir: t.TempDir(), AgentBinary: agentBinary, MaxReplicas: maxReplicas, Progress: testWriter{t}}
	for _, o := range options {
		o(&opts)
	}
	dir := opts.Dir
	wt := &watcher{dir: dir, done: make(chan struct{}), vmNames: map[string]int{}}
	opts.OnProxmoxRequest = wt.observeClones(opts.OnProxmoxRequest)
	w, err := devenv.Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			dumpWorld(t, w, dir)
		}
		if err := w.Stop(); err != nil {
			t.Errorf("stop world: %v", err)
		}
	})
	wt.w = w
	wt.start(t)
	return w, wt
}

// watcher samples the world while it runs: the most VMs at once and
// whether the PAT ever appeared in either simulator's state or in a guest's
// files (seed ISO, cloud-init output, console log); and it records every VM
// the operator cloned, from the clone requests themselves: a sample can
// take seconds on a loaded machine, longer than a VM whose job is an echo
// lives (a rehearsal's TestBuildkitePoolRunsJobs found a job's VM in no
// sample).
type watcher struct {
	w    *devenv.World
	dir  string
	done chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	maxVMs  int
	vmNames map[string]int // VM name -> VMID, of every clone request and every VM a sample saw
	leaks   []string
	samples int
}

// observeClones is a devenv.Options.OnProxmoxRequest that records clone
// requests' VMs, then calls next (the test's own hook, when it set one).
func (wt *watcher) observeClones(next func(*http.Request)) func(*http.Request) {
	return func(r *http.Request) {
		if vmid, name, ok := proxmoxsim.CloneRequest(r); ok && name != "" {
			wt.mu.Lock()
			wt.vmNames[name] = vmid
			wt.mu.Unlock()
		}
		if next != nil {
			next(r)
		}
	}
}

func (wt *watcher) start(t *testing.T) {
	wt.wg.Add(1)
	go func() {
		defer wt.wg.Done()
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		for {
			wt.sample()
			select {
			case <-wt.done:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(wt.stop)
}

func (wt *watcher) stop() {
	select {
	case <-wt.done:
	default:
		close(wt.done)
	}
	wt.wg.Wait()
	wt.sample()
}

func (wt *watcher) sample() {
	pve := wt.w.Proxmox.State()
	gh := wt.w.GitHub.State()
	var leaks []string
	for name, v := range map[string]any{"Proxmox simulator state": pve, "GitHub simulator state": gh} {
		data, err := json.Marshal(v)
		if err == nil && containsOperatorSecret(data) {
			leaks = append(leaks, name)
		}
	}
	// Guest files: seed ISO contents, the files cloud-init wrote, console.
	_ = filepath.WalkDir(filepath.Join(wt.dir, "guests"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !d.Type().IsRegular() {
			return nil //nolint:nilerr // a guest's files vanish when its VM is deleted mid-walk: skip them, sample the rest
		}
		if data, err := os.ReadFile(path); err == nil && containsOperatorSecret(data) {
			leaks = append(leaks, path)
		}
		return nil
	})
	wt.mu.Lock()
	defer wt.mu.Unlock()
	wt.samples++
	wt.leaks = append(wt.leaks, leaks...)
	vms := 0
	for _, vm := range pve.VMs {
		if vm.Template {
			continue
		}
		vms++
		if _, ok := wt.vmNames[vm.Name]; !ok {
			wt.vmNames[vm.Name] = vm.VMID
		}
	}
	wt.maxVMs = max(wt.maxVMs, vms)
}

// containsOperatorSecret reports whether data holds one of the operator's
// long-lived platform credentials: the GitHub PAT, the Buildkite API
// token or the GitLab access token, which no VM may ever see.
func containsOperatorSecret(data []byte) bool {
	return bytes.Contains(data, []byte(devenv.PAT)) || bytes.Contains(data, []byte(devenv.BuildkiteAPIToken)) || bytes.Contains(data, []byte(devenv.GitLabToken))
}

// waitDone waits until every job completed and nothing is left.
func waitDone(t *testing.T, w *devenv.World, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, "every job ran and nothing is left", func() error {
		snap, err := w.Snapshot(context.Background())
		if err != nil {
			return err
		}
		if !snap.Done(0) {
			return fmt.Errorf("%s", summary(snap))
		}
		return nil
	})
}

// checkWorld asserts everything the end-to-end contract promises.
func checkWorld(t *testing.T, w *devenv.World, wt *watcher) {
	t.Helper()
	checkJobs(t, w, wt, jobs)
}

// checkJobs asserts the end-to-end contract for a world that ran n jobs.
func checkJobs(t *testing.T, w *devenv.World, wt *watcher, jobs int) {
	t.Helper()
	snap, err := w.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Jobs) != jobs {
		t.Fatalf("%d jobs recorded, want %d", len(snap.Jobs), jobs)
	}
	wt.mu.Lock()
	defer wt.mu.Unlock()
	// Every job ran exactly once, to success, on a runner of its own.
	runnerOf, vmOf := map[string]int64{}, map[string]int64{}
	for _, j := range snap.Jobs {
		if j.Status != "completed" || j.Conclusion != "success" {
			t.Errorf("job %d: %s/%s, want completed/success", j.ID, j.Status, j.Conclusion)
		}
		if j.RunAttempt != 1 {
			t.Errorf("job %d ran in attempt %d, want exactly one attempt", j.ID, j.RunAttempt)
		}
		if j.RunnerName == "" {
			t.Errorf("job %d has no runner", j.ID)
			continue
		}
		if other, dup := runnerOf[j.RunnerName]; dup {
			t.Errorf("runner %s ran job %d and job %d: a VM ran two jobs", j.RunnerName, other, j.ID)
		}
		runnerOf[j.RunnerName] = j.ID
		// A runner is named <claim>-<uid part>-<install mark> and its VM
		// after the claim: the job ran in a VM the operator created, which
		// ran no other job.
		vm := j.RunnerName
		for range 2 {
			vm = vm[:max(strings.LastIndex(vm, "-"), 0)]
		}
		if _, ok := wt.vmNames[vm]; !ok {
			t.Errorf("job %d ran on runner %s, whose VM %q the operator never created", j.ID, j.RunnerName, vm)
		}
		if other, dup := vmOf[vm]; dup {
			t.Errorf("VM %s ran job %d and job %d", vm, other, j.ID)
		}
		vmOf[vm] = j.ID
	}
	// No runner (removed ones included) ever took more than one job.
	for _, r := range w.GitHub.State().RemovedRunners {
		if r.JobsRun > 1 {
			t.Errorf("runner %s ran %d jobs", r.Name, r.JobsRun)
		}
	}
	// Each VM is fresh: cloned for its claim, never reused under another
	// name (VM ids may be reused by later clones, names never are).
	if wt.maxVMs > maxReplicas {
		t.Errorf("%d VMs at once, pool maximum %d", wt.maxVMs, maxReplicas)
	}
	if len(wt.vmNames) < jobs {
		t.Errorf("%d VMs created for %d jobs", len(wt.vmNames), jobs)
	}
	// Nothing left behind.
	if len(snap.VMs) != 0 || len(snap.ISOs) != 0 || len(snap.Claims) != 0 || len(snap.Runners) != 0 {
		t.Errorf("left behind: %s", summary(snap))
	}
	// The long-lived credential never left the operator.
	if wt.samples < 10 {
		t.Errorf("only %d samples of the simulators' state were taken", wt.samples)
	}
	if len(wt.leaks) > 0 {
		t.Errorf("an operator credential (GitHub PAT, Buildkite API token, GitLab access token) appeared in: %s", strings.Join(slices.Compact(slices.Sorted(slices.Values(wt.leaks))), ", "))
	}
}

func summary(s devenv.Snapshot) string {
	status := map[string]int{}
	for _, j := range s.Jobs {
		status[j.Status]++
	}
	var vms, runners, claims []string
	for _, vm := range s.VMs {
		vms = append(vms, fmt.Sprintf("%d/%s/%s", vm.VMID, vm.Name, vm.Status))
	}
	for _, r := range s.Runners {
		runners = append(runners, fmt.Sprintf("%s/%s/busy=%v", r.Name, r.Status, r.Busy))
	}
	for _, c := range s.Claims {
		claims = append(claims, fmt.Sprintf("%s/%s", c.Name, c.Status.Phase))
	}
	return fmt.Sprintf("jobs %v; VMs %v; ISOs %v; claims %v; runners %v", status, vms, s.ISOs, claims, runners)
}

// dumpWorld logs what a failed scenario left and where the logs are.
func dumpWorld(t *testing.T, w *devenv.World, dir string) {
	snap, err := w.Snapshot(context.Background())
	if err == nil {
		t.Logf("world: %s", summary(snap))
		for _, c := range snap.Claims {
			t.Logf("claim %s phase %s reason %q conditions %+v", c.Name, c.Status.Phase, c.Status.TerminationReason, c.Status.Conditions)
		}
		for _, j := range snap.Jobs {
			t.Logf("job %d %s/%s runner %s", j.ID, j.Status, j.Conclusion, j.RunnerName)
		}
	}
	t.Logf("events of namespace %s:\n%s", devenv.Namespace, eventdump.Format(context.Background(), w.API.Client, nil, devenv.Namespace, "default"))
	// Keep the logs where CI can show them.
	keep := filepath.Join(os.TempDir(), "hyperfleet-e2e-"+t.Name())
	_ = os.RemoveAll(keep)
	if err := os.CopyFS(keep, os.DirFS(dir)); err == nil {
		t.Logf("logs and guest consoles kept in %s", keep)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "operator.log")); err == nil {
		if len(data) > 6000 {
			data = data[len(data)-6000:]
		}
		t.Logf("operator log tail:\n%s", data)
	}
}

func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %s: %v", what, timeout, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// testWriter sends the world's progress messages to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
