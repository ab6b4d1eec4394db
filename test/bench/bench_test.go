//go:build bench

// Package bench is the performance benchmark behind docs/performance.md
// (`make bench`; `make bench-small` runs every part at a toy size). It
// drives the local world of internal/testworld/devenv (the real
// kube-apiserver, the Proxmox VE and GitHub simulators, guests running the
// real agent) with the manager binary built from cmd/hyperfleet running as
// its own process, measures each figure of docs/architecture.md's
// "Performance targets" against the best that could physically be done in
// the same run, and writes the report with internal/testworld/bench. Nothing
// here asserts a speed: the report says PASS or MISS.
//
// Environment: HF_BENCH_SMALL=1 for the small run; HF_BENCH_OUT, the
// report's directory (default: a temporary one); HF_BENCH_POWEROFF, the
// output of the controller package's BenchmarkOperator1000Claims whose
// power-off figures the report includes; HF_BENCH_GUEST_TIMINGS, the
// directory of real-guest timings (make test-guest's) the report shows next
// to the simulated cold start; HF_BENCH_ONLY=churn runs the churn figure
// alone (its jobs and maxReplicas from HF_BENCH_CHURN_JOBS and
// HF_BENCH_CHURN_MAX when set), to study it without the rest, and
// HF_BENCH_ONLY=cold the cold starts alone (their ratios logged, no
// report), and HF_BENCH_ONLY=standby the standby starts alone (after one
// warm VM, whose idle cost they are shown next to; each job's stages
// logged, no report);
// HF_BENCH_GROWTH, comma-separated claim levels: only the growth curve at
// those levels (no report), each idle window's calls logged by path;
// HF_BENCH_PPROF, a directory where a CPU profile of the operator over each
// idle window (and over the churn's first 20 s) is saved; HF_BENCH_LOGS, a
// directory the manager's log is copied to at the end, written at debug
// level with nanosecond times (each webhook's receipt and record, each
// power-off notice).
package bench

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/bench"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/test/managerproc"
)

// sizes are one run's dimensions.
type sizes struct {
	cold, warm, warmMin int
	clusters            int
	levels              []int // claims over the clusters, growth curve
	main                int   // the level of the idle, overhead and churn figures
	probes              int
	idleWindow          time.Duration
	churnJobs, churnMax int
	levelDeadline       time.Duration
	// topDeadline bounds the wait for the last level, so that make bench
	// stays within its 15 minutes: the point then reports the claims that
	// ran by then.
	topDeadline time.Duration
	// standby is the standby tier's size, standbyJobs the jobs it serves.
	standby, standbyJobs int
}

var (
	full  = sizes{cold: 3, warm: 10, warmMin: 3, standby: 2, standbyJobs: 5, clusters: 10, levels: []int{250, 1000, 4000}, main: 1000, probes: 100, idleWindow: 20 * time.Second, churnJobs: 600, churnMax: 20, levelDeadline: 5 * time.Minute, topDeadline: 2 * time.Minute}
	small = sizes{cold: 1, warm: 2, warmMin: 1, standby: 1, standbyJobs: 2, clusters: 2, levels: []int{4, 8}, main: 8, probes: 4, idleWindow: 3 * time.Second, churnJobs: 3, churnMax: 2, levelDeadline: 2 * time.Minute, topDeadline: 2 * time.Minute}
)

const pollInterval = 5 * time.Second

func TestBench(t *testing.T) {
	sz := full
	isSmall := os.Getenv("HF_BENCH_SMALL") != ""
	if isSmall {
		sz = small
	}
	onlyChurn := os.Getenv("HF_BENCH_ONLY") == "churn"
	onlyCold := os.Getenv("HF_BENCH_ONLY") == "cold"
	onlyStandby := os.Getenv("HF_BENCH_ONLY") == "standby"
	for env, p := range map[string]*int{"HF_BENCH_CHURN_JOBS": &sz.churnJobs, "HF_BENCH_CHURN_MAX": &sz.churnMax} {
		if v := os.Getenv(env); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("%s: %v", env, err)
			}
			*p = n
		}
	}
	growthOnly := os.Getenv("HF_BENCH_GROWTH") != ""
	if growthOnly {
		sz.levels = nil
		for _, f := range strings.Split(os.Getenv("HF_BENCH_GROWTH"), ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil {
				t.Fatalf("HF_BENCH_GROWTH: %v", err)
			}
			sz.levels = append(sz.levels, n)
		}
		sz.main = -1
	}
	began := time.Now()
	res := bench.Results{Date: began, Small: isSmall}
	ctx := context.Background()
	dir := t.TempDir()
	logf := func(format string, args ...any) {
		t.Logf("%s "+format, append([]any{time.Since(began).Round(time.Second)}, args...)...)
	}

	agentBin := managerproc.GoBuild(t, dir, "./cmd/hyperfleet-agent")
	managerBin := managerproc.GoBuild(t, dir, "./cmd/hyperfleet")

	px, gh := newRecorder(), newRecorder()
	w, err := devenv.Start(ctx, devenv.Options{
		Dir: filepath.Join(dir, "world"), AgentBinary: agentBin, MaxReplicas: 5, ExternalOperator: true,
		OnProxmoxRequest: px.observe, OnGitHubRequest: gh.observe,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	load := startLoadWorld(t, w, sz.clusters)
	// The operator trusts both GitHub simulators' CAs.
	ca, err := os.ReadFile(filepath.Join(w.Dir(), "github-ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, append(ca, load.githubCA...), 0o644); err != nil {
		t.Fatal(err)
	}
	op := startOperator(t, w, managerBin, agentBin, caFile)
	if keep := os.Getenv("HF_BENCH_LOGS"); keep != "" {
		// The world's directory goes with the test: keep the manager's
		// log for whoever studies the run.
		t.Cleanup(func() {
			if b, err := os.ReadFile(filepath.Join(w.Dir(), "manager.log")); err == nil {
				_ = os.WriteFile(filepath.Join(keep, "manager.log"), b, 0o644)
			}
		})
	}
	if err := w.ConnectOperator(ctx, op.WebhookURL); err != nil {
		t.Fatal(err)
	}
	logf("world and manager (pid %d) up", op.Cmd.Process.Pid)
	if growthOnly {
		for _, level := range sz.levels {
			logf("growth: %+v", load.grow(t, op, level, sz.levelDeadline, sz.idleWindow))
		}
		return
	}

	if onlyStandby {
		// One warm VM, for its idle cost next to a standby VM's.
		sz.warm, sz.warmMin = 1, 1
	}
	if !onlyChurn {
		if !onlyStandby {
			res.Cold, res.Timeline = coldStarts(t, w, px, sz.cold)
			logf("cold starts: %d", len(res.Cold))
		}
		if onlyCold {
			for i, c := range res.Cold {
				logf("cold start %d: %s against %s (clone %s + configure %s + start %s + boot %s + registration %s): ratio %.3f",
					i+1, c.Total, c.Physical(), c.Clone, c.Configure, c.Start, c.Boot, c.Registration, float64(c.Total)/float64(c.Physical()))
			}
			return
		}
		var warmCost bench.IdleCost
		res.Warm, warmCost = warmPool(t, w, sz.warm, sz.warmMin)
		logf("warm pool: %+v", res.Warm)
		res.Standby = standbyStarts(t, w, px, sz.standby, sz.standbyJobs, warmCost)
		tot := res.Standby.Totals()
		med, worst := res.Standby.Ratios()
		logf("standby: %d of %d jobs, p50 %s, p95 %s, ratio %.3f (worst %.3f); idle per VM %+v, warm %+v",
			tot.N, sz.standbyJobs, tot.P50, tot.P95, med, worst, res.Standby.Idle, res.Standby.Warm)
		if isSmall && tot.N < sz.standbyJobs {
			// Not a speed: the small run's standby jobs must complete at
			// all, or the tier's suspend and resume have rotted.
			t.Errorf("standby: %d of %d jobs served by the tier", tot.N, sz.standbyJobs)
		}
		if onlyStandby {
			return
		}
	}

	// Churn before the load: a job's calls are counted without the load
	// clusters' polls, and the pool starts clean.
	res.Churn, res.Process.Churn, res.Calls = churn(t, w, op, px, gh, sz.churnJobs, sz.churnMax, nil)
	logf("churn: %+v", res.Churn)
	if isSmall && res.Churn.Jobs < sz.churnJobs {
		// Not a speed: the small run's jobs must complete at all, or its
		// guests (in-process, devenv.InProcessGuest) have rotted.
		t.Errorf("churn: %d of %d jobs completed: %s", res.Churn.Jobs, sz.churnJobs, res.Churn.Bottleneck)
	}
	if onlyChurn {
		sz.levels = nil
	}

	for i, level := range sz.levels {
		deadline := sz.levelDeadline
		if i == len(sz.levels)-1 {
			deadline = sz.topDeadline
		}
		g := load.grow(t, op, level, deadline, sz.idleWindow)
		res.Process.Growth = append(res.Process.Growth, g)
		logf("growth: %+v", g)
		if level != sz.main {
			continue
		}
		res.Process.Idle = g.Sample
		res.Overhead = load.overhead(t, sz.probes)
		logf("overhead: %+v", res.Overhead)
	}

	if f := os.Getenv("HF_BENCH_POWEROFF"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if res.PowerOff, err = bench.ParsePowerOff(b); err != nil {
			t.Fatal(err)
		}
	}
	if res.Guests, err = bench.ReadGuestTimings(os.Getenv("HF_BENCH_GUEST_TIMINGS")); err != nil {
		t.Fatal(err)
	}
	res.Machine = bench.ReadMachine()
	res.Duration = time.Since(began)
	out := os.Getenv("HF_BENCH_OUT")
	if out == "" {
		out = t.TempDir()
	}
	if err := bench.WriteReport(out, res); err != nil {
		t.Fatal(err)
	}
	raw, _ := json.MarshalIndent(res, "", "  ")
	t.Logf("report in %s\n%s", out, raw)
}

// waitFor polls cond every 50 ms until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s (last error %v)", what, d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// setPool changes the world's RunnerPool.
func setPool(t *testing.T, w *devenv.World, minR, maxR int32) {
	t.Helper()
	var pool hfv1.RunnerPool
	if err := w.API.Client.Get(context.Background(), client.ObjectKey{Namespace: devenv.Namespace, Name: devenv.PoolName}, &pool); err != nil {
		t.Fatal(err)
	}
	orig := pool.DeepCopy()
	pool.Spec.Scaling.MinReplicas, pool.Spec.Scaling.MaxReplicas = minR, maxR
	if err := w.API.Client.Patch(context.Background(), &pool, client.MergeFrom(orig)); err != nil {
		t.Fatal(err)
	}
}

func poolClaims(t *testing.T, w *devenv.World) []hfv1.MachineClaim {
	t.Helper()
	var list hfv1.MachineClaimList
	if err := w.API.Client.List(context.Background(), &list, client.InNamespace(devenv.Namespace)); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func operatorVMs(w *devenv.World) []proxmoxsim.VMState {
	var vms []proxmoxsim.VMState
	for _, vm := range w.Proxmox.VMs() {
		if !vm.Template {
			vms = append(vms, vm)
		}
	}
	return vms
}

// waitEmpty waits until the world holds no claim and no VM of the pool.
func waitEmpty(t *testing.T, w *devenv.World, d time.Duration) {
	t.Helper()
	waitFor(t, d, "pool empty", func() (bool, error) {
		return len(poolClaims(t, w)) == 0 && len(operatorVMs(w)) == 0, nil
	})
}

// coldStarts serves n jobs one at a time from an empty pool and measures
// job queued -> runner online against the simulators' clone, boot and
// registration for the same VM; the first job's trace is the timeline.
func coldStarts(t *testing.T, w *devenv.World, px *recorder, n int) ([]bench.ColdStart, bench.Trace) {
	// Cold starts run on Proxmox's own task times (the realistic preset):
	// the ratio is against what a real cluster makes a VM wait, boot
	// included, not against the toy latencies of the other parts.
	lat, restore := realisticTimings(t, w)
	defer restore()
	var out []bench.ColdStart
	var timeline bench.Trace
	for i := range n {
		waitEmpty(t, w, 2*time.Minute)
		px.resetFirst()
		var mu sync.Mutex
		seen := bench.Trace{}
		mark := func(e string, at time.Time) {
			mu.Lock()
			if seen[e].IsZero() {
				seen[e] = at
			}
			mu.Unlock()
		}
		stop := make(chan struct{})
		// Runner online and claim created are seen by polling; the 20 ms
		// period bounds how late they are seen.
		wait := every20ms(stop, func(now time.Time) {
			if runnerOnline(w) {
				mark(bench.EventRunnerUp, now)
			}
			if len(poolClaims(t, w)) > 0 {
				mark(bench.EventClaim, now)
			}
			for _, vm := range operatorVMs(w) {
				mu.Lock()
				ended := !seen[bench.EventJobEnd].IsZero()
				mu.Unlock()
				if ended && vm.Status == "stopped" {
					mark(bench.EventPowerOff, now)
				}
			}
		})
		ids, err := w.EnqueueJobs(1, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, 2*time.Minute, "cold job done", func() (bool, error) {
			j, _ := w.GitHub.Job(ids[0])
			if !j.CompletedAt.IsZero() {
				mark(bench.EventJobEnd, j.CompletedAt)
			}
			return j.Status == "completed", nil
		})
		waitEmpty(t, w, 2*time.Minute)
		close(stop)
		wait()
		j, _ := w.GitHub.Job(ids[0])
		seen[bench.EventQueued], seen[bench.EventJobStart], seen[bench.EventJobEnd] = j.CreatedAt, j.StartedAt, j.CompletedAt
		if up := seen[bench.EventRunnerUp]; !j.StartedAt.IsZero() && (up.IsZero() || up.After(j.StartedAt)) {
			// The runner was online by the time it started the job; the
			// 20 ms poll can see it later than GitHub's own start time.
			seen[bench.EventRunnerUp] = j.StartedAt
		}
		seen[bench.EventClone] = px.firstSeen("POST", "/clone")
		seen[bench.EventConfigure] = earliest(px.firstSeen("POST", "/config"), px.firstSeen("PUT", "/config"))
		seen[bench.EventBoot] = px.firstSeen("POST", "/status/start")
		// The destroy that happened: one refused because the VM still ran
		// is followed by a stop and another.
		seen[bench.EventDestroyed] = px.lastSeen("DELETE", "/qemu/{id}")
		if seen[bench.EventPowerOff].IsZero() {
			// The VM went from running to gone between two polls: the
			// operator's stop request is the power-off.
			seen[bench.EventPowerOff] = earliest(px.firstSeen("POST", "/status/stop"), px.firstSeen("POST", "/status/shutdown"))
		}
		// The simulator starts the guest program guestStart after its
		// start task ends, so registration is the guest's own time from
		// there to its runner online, or, once the operator places the
		// runner credential in the running VM, from that write on: the
		// wait for the credential is the operator's, so the ratio counts
		// it against the operator (with the agent's own start before its
		// ready hint, a few milliseconds of the VM's). The configuration
		// tasks count as the hypervisor's when the operator issued them.
		booted := seen[bench.EventBoot].Add(time.Duration(lat.Start + lat.GuestStart))
		if placed := px.firstSeen("POST", "/agent/file-write"); placed.After(booted) {
			booted = placed
		}
		var configure time.Duration
		for _, step := range []struct {
			method, suffix string
			took           proxmoxsim.Duration
		}{{"POST", "/config", lat.Config}, {"POST", "/upload", lat.Upload}, {"PUT", "/resize", lat.Resize}} {
			if !px.firstSeen(step.method, step.suffix).IsZero() {
				configure += time.Duration(step.took)
			}
		}
		c := bench.ColdStart{
			Total: seen[bench.EventRunnerUp].Sub(seen[bench.EventQueued]),
			Clone: time.Duration(lat.CloneBase), Configure: configure, Start: time.Duration(lat.Start), Boot: time.Duration(lat.GuestStart),
			Registration: max(0, seen[bench.EventRunnerUp].Sub(booted)),
		}
		out = append(out, c)
		if i == 0 {
			timeline = seen
			if _, err := bench.Phases(seen); err != nil {
				t.Logf("timeline incomplete: %v (%v)", err, seen)
			}
		}
	}
	return out, timeline
}

// realisticTimings puts the Proxmox simulator on Proxmox's own task
// times (the realistic preset) and returns them, with what restores the
// latencies it had.
func realisticTimings(t *testing.T, w *devenv.World) (proxmoxsim.Latency, func()) {
	t.Helper()
	realistic, err := proxmoxsim.Preset(proxmoxsim.PresetRealistic)
	if err != nil {
		t.Fatal(err)
	}
	saved := w.Proxmox.Latency()
	w.Proxmox.SetLatency(realistic.Latency)
	return realistic.Latency, func() { w.Proxmox.SetLatency(saved) }
}

// every20ms calls f with the time every 20 ms, on a goroutine of its own,
// until stop is closed; the returned function waits for its end.
func every20ms(stop <-chan struct{}, f func(now time.Time)) (wait func()) {
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			f(time.Now())
		}
	})
	return wg.Wait
}

// runnerOnline is whether a runner is online on the GitHub simulator.
func runnerOnline(w *devenv.World) bool {
	for _, r := range w.GitHub.Runners() {
		if r.Status == "online" && !r.Removed {
			return true
		}
	}
	return false
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// idleRunners counts online runners without a job.
func idleRunners(w *devenv.World) int {
	n := 0
	for _, r := range w.GitHub.Runners() {
		if r.Status == "online" && !r.Busy && !r.Removed {
			n++
		}
	}
	return n
}

// warmPool keeps minIdle VMs booted and measures job queued -> in
// progress, one job at a time, each once the pool is full again, and what
// a warm VM holds while it waits (read from the simulator once the pool
// is first full).
func warmPool(t *testing.T, w *devenv.World, n, minIdle int) (bench.Summary, bench.IdleCost) {
	waitEmpty(t, w, 3*time.Minute)
	base := hostMemory(w)
	setPool(t, w, int32(minIdle), 5)
	var ds []time.Duration
	var cost bench.IdleCost
	for i := range n {
		waitFor(t, 3*time.Minute, "warm pool full", func() (bool, error) { return idleRunners(w) >= minIdle, nil })
		if i == 0 {
			cost = idleCost(w, base, runningVMs(t, w))
		}
		ids, err := w.EnqueueJobs(1, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var j githubsim.Job
		waitFor(t, 2*time.Minute, "warm job started", func() (bool, error) {
			j, _ = w.GitHub.Job(ids[0])
			return !j.StartedAt.IsZero(), nil
		})
		ds = append(ds, j.StartedAt.Sub(j.CreatedAt))
	}
	setPool(t, w, 0, 5)
	waitEmpty(t, w, 3*time.Minute)
	return bench.Summarize(ds), cost
}

// churn runs jobs with no simulated latency through a pool of maxR VMs
// and measures claims per minute end to end, the operator's CPU and RSS
// meanwhile and the API calls per job. idleKube is the operator's
// Kubernetes calls per minute before the run, taken out of the count:
// they are the polls of the load clusters, not the jobs'.
func churn(t *testing.T, w *devenv.World, op *operator, px, gh *recorder, jobs, maxR int, idleKube map[string]float64) (bench.Churn, bench.Sample, []bench.Calls) {
	w.Proxmox.SetLatency(proxmoxsim.Latency{API: proxmoxsim.Duration(time.Microsecond)})
	// The churn's VMs are in-process guests (devenv.InProcessGuest): in
	// production a VM's CPU is its hypervisor node's, and a process tree
	// per VM (the agent, run.sh's shell, curl and sed calls) took 0.74 of
	// this machine's 2 cores at 300 jobs a minute, more than the API
	// server and the operator together.
	if err := w.UseInProcessGuests(true); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := w.UseInProcessGuests(false); err != nil {
			t.Error(err)
		}
	}()
	setPool(t, w, 0, int32(maxR))
	pxBefore, ghBefore := px.snapshot(), gh.snapshot()
	kubeBefore, err := op.kubeCalls()
	if err != nil {
		t.Fatal(err)
	}
	byResourceBefore, err := op.kubeCallsByResource()
	if err != nil {
		t.Fatal(err)
	}
	px.trace(true)
	if dir := os.Getenv("HF_BENCH_PPROF"); dir != "" {
		// The churn's first 20 s, for whoever studies its bottleneck.
		go func() {
			if err := op.cpuProfile(filepath.Join(dir, "cpu-churn.pprof"), 20*time.Second); err != nil {
				t.Logf("churn CPU profile: %v", err)
			}
		}()
	}
	claims := map[string]*claimTimes{}
	servers := bench.ProcessesNamed("kube-apiserver", "etcd")
	s0, m0 := serverCPU(servers), readCPUTimes(t)
	u0, start := op.usage(t), time.Now()
	statusWrites := watchStatusWrites(t, w)
	ids, err := w.EnqueueJobs(jobs, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	var inFlight, samples, most, completed int
	// Bounded, so that a stalled run still yields its report: the jobs
	// completed by then count, and the bottleneck says it stalled.
	deadline := start.Add(4 * time.Minute)
	for time.Now().Before(deadline) {
		cs := poolClaims(t, w)
		n := len(cs)
		inFlight, samples, most = inFlight+n, samples+1, max(most, n)
		seeClaims(claims, cs, time.Now())
		completed = 0
		for _, id := range ids {
			if j, _ := w.GitHub.Job(id); j.Status == "completed" {
				completed++
			}
		}
		if completed == jobs && n == 0 && len(operatorVMs(w)) == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	elapsed := time.Since(start)
	s1, m1 := serverCPU(servers), readCPUTimes(t)
	stages := churnStages(claims, px.trace(false), w, ids)
	if sum, n, err := op.histogram("hyperfleet_webhook_processing_duration_seconds"); err == nil && n > 0 {
		stages += fmt.Sprintf("; a webhook received -> recorded, mean %.3f s over %d", sum/float64(n), n)
	}
	failed := map[string]int{}
	for _, d := range w.GitHub.Deliveries() {
		if d.Error != "" {
			failed[d.Error]++
		}
	}
	if len(failed) > 0 {
		stages += fmt.Sprintf("; webhook deliveries that failed (by error): %v", failed)
	}
	t.Logf("churn stages (median, p95 over %d claims): %s", len(claims), stages)
	u1 := op.usage(t)
	kubeAfter, err := op.kubeCalls()
	if err != nil {
		t.Fatal(err)
	}
	// The same requests by resource, for whoever reads the verbs' rows
	// (which events, which objects): in the log, not the report.
	if byResource, err := op.kubeCallsByResource(); err == nil {
		var rows []string
		for k, n := range byResource {
			if d := n - byResourceBefore[k]; d > 0 && !strings.HasPrefix(k, "WATCH ") && !strings.HasPrefix(k, "LIST ") {
				rows = append(rows, fmt.Sprintf("%-50s %6.2f per job", k, d/float64(max(completed, 1))))
			}
		}
		slices.Sort(rows)
		t.Logf("churn's Kubernetes requests by resource (idle calls included):\n%s", strings.Join(rows, "\n"))
	}
	t.Logf("churn's events by object kind and reason: %s", eventsSince(t, w, start))
	t.Logf("churn's claim status writes by what they say (phase, then the Provisioned, Bootstrapped and Ending reasons), per job:\n%s", statusWrites(completed))
	avg := float64(inFlight) / float64(max(samples, 1))
	c := bench.Churn{Jobs: completed, Duration: elapsed, MaxReplicas: maxR, InFlight: avg}
	life := time.Duration(avg / float64(max(completed, 1)) * float64(elapsed))
	if completed < jobs {
		c.Bottleneck = fmt.Sprintf("the run stalled: %d of %d jobs completed within %s; ", completed, jobs, elapsed.Round(time.Second))
	}
	c.Bottleneck += fmt.Sprintf("on average %.1f of the pool's %d VMs were in flight (at most %d), each claim living %.1f s (Little's law: in flight / life); "+
		"a claim's life is its guest's: an in-process guest (devenv.InProcessGuest) reads the agent configuration the operator wrote, connects its JIT runner, runs the job, sends the power-off notice and powers off, on the same %d shared cores as the API server, the simulators, the operator (%.0f %% of one core) and the benchmark; "+
		"the machine's cores were %.0f %% busy, the API server %.0f %% and etcd %.0f %% of one core; "+
		"with the pool not kept full, the operator's steps per claim set the rate; a claim's stages (median, p95): %s", avg, maxR, most, life.Seconds(), bench.ReadMachine().NProc, 100*bench.CPUShare(u0, u1, elapsed),
		100*bench.BusyShare(m0, m1), 100*(s1["kube-apiserver"]-s0["kube-apiserver"]).Seconds()/elapsed.Seconds(), 100*(s1["etcd"]-s0["etcd"]).Seconds()/elapsed.Seconds(), stages)
	sample := bench.Sample{Window: elapsed, RSS: u1.RSS, HWM: u1.HWM, CPUShare: bench.CPUShare(u0, u1, elapsed)}

	var calls []bench.Calls
	for _, d := range diff(pxBefore, px.snapshot()) {
		calls = append(calls, callRow("Proxmox", d.key, float64(d.n)/float64(max(completed, 1))))
	}
	for _, d := range diff(ghBefore, gh.snapshot()) {
		if strings.Contains(d.key, " /api/v3/") {
			calls = append(calls, callRow("GitHub", d.key, float64(d.n)/float64(max(completed, 1))))
		}
	}
	for verb, after := range kubeAfter {
		// What the idle operator calls per minute (the load clusters'
		// polls) is not the jobs'.
		n := after - kubeBefore[verb] - idleKube[verb]*elapsed.Minutes()
		if n > 0.5 {
			calls = append(calls, callRow("Kubernetes", verb, n/float64(max(completed, 1))))
		}
	}
	slices.SortFunc(calls, func(a, b bench.Calls) int { return cmp.Or(cmp.Compare(a.API, b.API), cmp.Compare(b.PerJob, a.PerJob)) })
	return c, sample, calls
}

// watchStatusWrites watches every claim and classifies each write that
// changed its status by what the status then says: its phase and the
// reasons of its Provisioned, Bootstrapped and Ending conditions. It
// returns the classes' counts per job, for whoever reads the churn's
// PATCH row (which step of a claim costs a write).
func watchStatusWrites(t *testing.T, w *devenv.World) func(jobs int) string {
	t.Helper()
	wi := w.API.Watch(t, &hfv1.MachineClaimList{})
	var mu sync.Mutex
	counts := map[string]int{}
	last := map[types.UID]string{}
	go func() {
		for ev := range wi.ResultChan() {
			claim, ok := ev.Object.(*hfv1.MachineClaim)
			if !ok || ev.Type != watch.Modified {
				continue
			}
			b, _ := json.Marshal(claim.Status)
			mu.Lock()
			if prev, seen := last[claim.UID]; !seen || prev != string(b) {
				if seen || claim.Status.Phase != "" {
					reason := func(typ hfv1.ConditionType) string {
						if cond := hfv1.FindCondition(claim.Status.Conditions, typ); cond != nil {
							return cond.Reason
						}
						return "-"
					}
					counts[fmt.Sprintf("%s %s/%s/%s", claim.Status.Phase, reason(hfv1.MachineClaimProvisionedCondition),
						reason(hfv1.MachineClaimBootstrappedCondition), reason(hfv1.MachineClaimEndingCondition))]++
				}
				last[claim.UID] = string(b)
			}
			mu.Unlock()
		}
	}()
	return func(jobs int) string {
		mu.Lock()
		defer mu.Unlock()
		var rows []string
		for k, n := range counts {
			rows = append(rows, fmt.Sprintf("%-90s %6.2f", k, float64(n)/float64(max(jobs, 1))))
		}
		slices.Sort(rows)
		return strings.Join(rows, "\n")
	}
}

// eventsSince counts the events recorded since start in every namespace
// by involved object kind and reason (a repeated event counts its repeats),
// for whoever reads the churn's POST row.
func eventsSince(t *testing.T, w *devenv.World, start time.Time) string {
	t.Helper()
	var list corev1.EventList
	if err := w.API.Client.List(context.Background(), &list); err != nil {
		return err.Error()
	}
	n := map[string]int32{}
	for _, e := range list.Items {
		if e.LastTimestamp.Time.Before(start.Truncate(time.Second)) && e.EventTime.Time.Before(start) {
			continue
		}
		n[e.InvolvedObject.Kind+"/"+e.Reason] += max(e.Count, 1)
	}
	var out []string
	for k, c := range n {
		out = append(out, fmt.Sprintf("%s %d", k, c))
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// serverCPU is the CPU time used so far by the processes of pids, by name
// (processes gone since count nothing).
func serverCPU(pids map[string][]int) map[string]time.Duration {
	out := map[string]time.Duration{}
	for name, list := range pids {
		for _, pid := range list {
			if u, err := bench.ReadUsage(pid); err == nil {
				out[name] += u.CPU
			}
		}
	}
	return out
}

func readCPUTimes(t *testing.T) bench.CPUTimes {
	t.Helper()
	c, err := bench.ReadCPUTimes()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// claimTimes are when the benchmark saw one claim appear and go, and its
// VM and runner.
type claimTimes struct {
	seen, gone time.Time
	vmid       string
	runner     string
}

func seeClaims(m map[string]*claimTimes, cs []hfv1.MachineClaim, now time.Time) {
	present := map[string]bool{}
	for i := range cs {
		c := &cs[i]
		present[c.Name] = true
		ct := m[c.Name]
		if ct == nil {
			ct = &claimTimes{seen: now}
			m[c.Name] = ct
		}
		if ref := c.Status.VMRef; ref != nil {
			ct.vmid = fmt.Sprint(ref.VMID)
		}
		if st := c.Status.Bootstrap; st != nil && st.RunnerName != "" {
			ct.runner = st.RunnerName
		}
	}
	for name, ct := range m {
		if !present[name] && ct.gone.IsZero() {
			ct.gone = now
		}
	}
}

// churnStages cuts the claims' lives into stages, from what the benchmark
// saw (claims, 100 ms polls), the Proxmox requests (vms) and the GitHub
// simulator's jobs: the operator's (claim -> first request naming its VM,
// the configuration, as the clone names the template -> start request; job end -> destroy request -> claim gone) and the guest's
// (start request -> job started), with the job itself between.
func churnStages(claims map[string]*claimTimes, vms map[string]*vmTimes, w *devenv.World, ids []int64) string {
	jobOf := map[string]githubsim.Job{}
	for _, id := range ids {
		if j, ok := w.GitHub.Job(id); ok && j.RunnerName != "" {
			jobOf[j.RunnerName] = j
		}
	}
	// The webhook of a job's start, delivered (the simulator's log) after
	// the job started: until the operator records it, a VM that ran its
	// job and powered off cannot be told from one that failed.
	delivered := map[int64]time.Time{}
	for _, d := range w.GitHub.Deliveries() {
		if d.Action == "in_progress" && !d.DeliveredAt.IsZero() {
			delivered[d.JobID] = d.DeliveredAt
		}
	}
	stages := []string{"claim seen -> first request naming the VM (clone and upload done)", "that -> start request", "start -> job started (guest)", "job started -> ended",
		"job ended -> destroy request", "destroy -> claim gone", "claim seen -> claim gone", "job started -> its in_progress webhook delivered"}
	ds := make([][]time.Duration, len(stages))
	add := func(i int, from, to time.Time) {
		if !from.IsZero() && !to.IsZero() {
			ds[i] = append(ds[i], to.Sub(from))
		}
	}
	for _, c := range claims {
		vm := vms[c.vmid]
		if vm == nil {
			vm = &vmTimes{}
		}
		j := jobOf[c.runner]
		add(0, c.seen, vm.first)
		add(1, vm.first, vm.start)
		add(2, vm.start, j.StartedAt)
		add(3, j.StartedAt, j.CompletedAt)
		add(4, j.CompletedAt, vm.destroy)
		add(5, vm.destroy, c.gone)
		add(6, c.seen, c.gone)
		add(7, j.StartedAt, delivered[j.ID])
	}
	parts := make([]string, len(stages))
	for i, name := range stages {
		s := bench.Summarize(ds[i])
		parts[i] = fmt.Sprintf("%s %.2f s, %.2f s (%d)", name, s.P50.Seconds(), s.P95.Seconds(), len(ds[i]))
	}
	return strings.Join(parts, "; ")
}

type delta struct {
	key string
	n   int
}

func diff(before, after map[string]int) []delta {
	var out []delta
	for k, v := range after {
		if n := v - before[k]; n > 0 {
			out = append(out, delta{k, n})
		}
	}
	return out
}

// loadWorld is the load: clusters of their own simulators (no guests: a
// VM runs without a program) and a GitHub simulator for their runners.
type loadWorld struct {
	w        *devenv.World
	sims     []*proxmoxsim.Simulator
	recs     []*recorder
	urls     []string
	githubCA []byte
	created  int
	// idleKube is the idle operator's Kubernetes calls per minute, by
	// verb, at the last level measured.
	idleKube map[string]float64
}

func startLoadWorld(t *testing.T, w *devenv.World, clusters int) *loadWorld {
	ctx := context.Background()
	l := &loadWorld{w: w}
	cert, caPEM, err := githubsim.SelfSignedCertificate("127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	gs, err := githubsim.New(githubsim.Config{
		Organizations: []githubsim.OrgConfig{{Login: devenv.Organization}},
		Repositories:  []githubsim.RepoConfig{{Name: devenv.Repository}},
		PATs:          []githubsim.PATConfig{{Token: devenv.PAT, Login: "octocat"}},
		// The load's runners never come online; thousands of JIT
		// configurations must fit in the hour's budget.
		RateLimit: 1 << 30,
	}, githubsim.WithCACertificate(caPEM))
	if err != nil {
		t.Fatal(err)
	}
	ghSrv := httptest.NewUnstartedServer(gs)
	ghSrv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	ghSrv.StartTLS()
	t.Cleanup(ghSrv.Close)
	t.Cleanup(func() { _ = gs.Close() })
	gs.SetServerURL(ghSrv.URL)
	l.githubCA = caPEM

	mustCreate := func(o client.Object) {
		if err := w.API.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	for i := range clusters {
		cfg := proxmoxsim.DefaultConfig()
		cfg.Nodes[0].Memory, cfg.Nodes[0].CPUs = 1<<44, 1<<16
		cfg.Storages[1].Capacity = 1 << 50
		cfg.Latency = proxmoxsim.Latency{API: proxmoxsim.Duration(time.Microsecond)}
		cfg.Guest.AddressRange, cfg.Guest.Prefix = "10.99.0.1-10.99.15.250", 20
		sim, err := proxmoxsim.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		rec := newRecorder()
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { rec.observe(r); sim.ServeHTTP(rw, r) }))
		srv.StartTLS()
		t.Cleanup(srv.Close)
		t.Cleanup(func() { _ = sim.Close() })
		sum := sha256.Sum256(srv.Certificate().Raw)
		fp := make([]string, len(sum))
		for i, b := range sum {
			fp[i] = fmt.Sprintf("%02X", b)
		}
		l.sims, l.recs, l.urls = append(l.sims, sim), append(l.recs, rec), append(l.urls, srv.URL)
		name := fmt.Sprintf("load-%d", i)
		mustCreate(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: devenv.SystemNamespace, Name: name}, StringData: map[string]string{"id": "root@pam!sim", "secret": "00000000-0000-0000-0000-000000000000"}})
		mustCreate(&hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: hfv1.HypervisorClusterSpec{
			Provider: hfv1.ProviderProxmox, Endpoint: srv.URL + "/api2/json",
			Credentials: hfv1.HypervisorCredentials{
				TokenID:     &hfv1.SecretKeySelector{Namespace: devenv.SystemNamespace, Name: name, Key: "id"},
				TokenSecret: &hfv1.SecretKeySelector{Namespace: devenv.SystemNamespace, Name: name, Key: "secret"},
			},
			TLS: &hfv1.HypervisorTLS{FingerprintSHA256: strings.Join(fp, ":")}, Proxmox: &hfv1.ProxmoxClusterSettings{VMIDRange: &hfv1.VMIDRange{Start: 1000, End: 9999}},
			PollInterval: &metav1.Duration{Duration: pollInterval},
		}})
		mustCreate(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
		mustCreate(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: name, Name: "github"}, StringData: map[string]string{"token": devenv.PAT}})
		mustCreate(&hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: name, Name: "runner"}, Spec: hfv1.HypervisorMachineTemplateSpec{
			HypervisorClusterRef: hfv1.ObjectName{Name: name},
			Source:               hfv1.MachineSource{Proxmox: hfv1.ProxmoxSource{TemplateID: ptr.To[int32](9000)}},
			Resources:            hfv1.MachineResources{CPU: 2, Memory: resource.MustParse("2Gi")},
			Bootstrap: hfv1.Bootstrap{GitHub: &hfv1.GitHubBootstrap{Owner: devenv.Organization, Organization: devenv.Organization,
				APIBaseURL: ghSrv.URL + "/api/v3", Credentials: hfv1.GitHubCredentials{PAT: &hfv1.LocalSecretKeySelector{Name: "github", Key: "token"}}}},
		}})
	}
	// The bare client's claims live where no template exists: the
	// operator reads them but never clones for them.
	mustCreate(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bare"}})
	return l
}

// newClaim creates a claim of template in ns. The operator's claims are
// created as a RunnerPool creates its claims, with the claim controller's
// finalizer and labels (each load namespace's template is on the cluster
// of the same name): the claim controller's one write before the clone
// request is then the reservation's status write, as in production. A
// claim made by hand without them costs a metadata write first.
func (l *loadWorld) newClaim(t *testing.T, ns, name, template string) {
	t.Helper()
	c := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: template}},
	}
	if ns != "bare" {
		c.Finalizers = []string{hfv1.MachineClaimFinalizer}
		c.Labels = map[string]string{hfv1.ManagedByLabel: hfv1.ManagedByValue, hfv1.MachineTemplateLabel: template, hfv1.HypervisorClusterLabel: ns}
	}
	if err := l.w.API.Client.Create(context.Background(), c); err != nil {
		t.Fatal(err)
	}
}

// running counts the load claims whose VM runs.
func (l *loadWorld) running(t *testing.T) int {
	n := 0
	for i := range l.sims {
		var list hfv1.MachineClaimList
		if err := l.w.API.Client.List(context.Background(), &list, client.InNamespace(fmt.Sprintf("load-%d", i))); err != nil {
			t.Fatal(err)
		}
		for _, c := range list.Items {
			if c.Status.Phase == hfv1.MachineClaimBootstrapping || c.Status.Phase == hfv1.MachineClaimReady {
				n++
			}
		}
	}
	return n
}

// proxmoxByPath sums the load clusters' Proxmox calls by method and path
// pattern.
func (l *loadWorld) proxmoxByPath() map[string]int {
	out := map[string]int{}
	for _, r := range l.recs {
		for k, v := range r.snapshot() {
			out[k] += v
		}
	}
	return out
}

// logCallsPerMinute logs the calls of an idle window by path, most
// frequent first.
func logCallsPerMinute(t *testing.T, level int, before, after map[string]float64, elapsed time.Duration) {
	type rate struct {
		key string
		v   float64
	}
	var rates []rate
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			rates = append(rates, rate{k, d / elapsed.Minutes()})
		}
	}
	slices.SortFunc(rates, func(a, b rate) int { return cmp.Compare(b.v, a.v) })
	var b strings.Builder
	for _, r := range rates {
		fmt.Fprintf(&b, "\n  %8.1f/min  %s", r.v, r.key)
	}
	t.Logf("idle calls at %d claims (Kubernetes by resource, Proxmox by path):%s", level, b.String())
}

func (l *loadWorld) proxmoxCalls() int {
	n := 0
	for _, r := range l.recs {
		for _, v := range r.snapshot() {
			n += v
		}
	}
	return n
}

// grow brings the load to level claims, waits until their VMs run (or
// the deadline passes: the point then says how many ran) and measures
// the idle operator over window.
func (l *loadWorld) grow(t *testing.T, op *operator, level int, deadline, window time.Duration) bench.GrowthPoint {
	for ; l.created < level; l.created++ {
		i := l.created % len(l.sims)
		l.newClaim(t, fmt.Sprintf("load-%d", i), fmt.Sprintf("load-%05d", l.created), "runner")
	}
	end := time.Now().Add(deadline)
	n := 0
	for time.Now().Before(end) {
		if n = l.running(t); n >= level {
			break
		}
		time.Sleep(time.Second)
	}
	if n < level {
		t.Logf("growth: %d of %d claims running after %s", n, level, deadline)
	}
	// Let the last reconciles settle before the idle window.
	time.Sleep(pollInterval)
	k0, err := op.kubeCalls()
	if err != nil {
		t.Fatal(err)
	}
	r0, err := op.kubeCallsByResource()
	if err != nil {
		t.Fatal(err)
	}
	px0 := l.proxmoxByPath()
	var profiled chan error
	if dir := os.Getenv("HF_BENCH_PPROF"); dir != "" {
		profiled = make(chan error, 1)
		go func() { profiled <- op.cpuProfile(filepath.Join(dir, fmt.Sprintf("cpu-%d.pprof", level)), window) }()
	}
	p0, u0, start := l.proxmoxCalls(), op.usage(t), time.Now()
	time.Sleep(window)
	elapsed := time.Since(start)
	u1 := op.usage(t)
	k1, err := op.kubeCalls()
	if err != nil {
		t.Fatal(err)
	}
	p1 := l.proxmoxCalls()
	r1, err := op.kubeCallsByResource()
	if err != nil {
		t.Fatal(err)
	}
	px1 := l.proxmoxByPath()
	for k, v := range px1 {
		r1["Proxmox "+k] = float64(v)
	}
	for k, v := range px0 {
		r0["Proxmox "+k] = float64(v)
	}
	logCallsPerMinute(t, level, r0, r1, elapsed)
	if profiled != nil {
		if err := <-profiled; err != nil {
			t.Error(err)
		}
	}
	l.idleKube = map[string]float64{}
	for verb, v := range k1 {
		l.idleKube[verb] = (v - k0[verb]) / elapsed.Minutes()
	}
	polls := max(1, int(float64(len(l.sims))*elapsed.Seconds()/pollInterval.Seconds()))
	return bench.GrowthPoint{
		Sample:   bench.Sample{Claims: n, Window: elapsed, RSS: u1.RSS, HWM: u1.HWM, CPUShare: bench.CPUShare(u0, u1, elapsed)},
		Clusters: len(l.sims), Polls: polls, CPUPerPoll: (u1.CPU - u0.CPU) / time.Duration(polls),
		KubeCallsPerMin: (sum(k1) - sum(k0)) / elapsed.Minutes(), ProxmoxCallsPerMin: float64(p1-p0) / elapsed.Minutes(),
	}
}

// overhead measures claim created -> clone request for the operator and
// for the bare minimum, alternating, on the load clusters in turn.
func (l *loadWorld) overhead(t *testing.T, probes int) bench.Overhead {
	ctx := context.Background()
	wc, err := client.NewWithWatch(l.w.API.Config, client.Options{Scheme: l.w.API.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	watcher, err := wc.Watch(ctx, &hfv1.MachineClaimList{}, client.InNamespace("bare"))
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Stop()
	// The bare client keeps its connections, as the operator does.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the simulators' throwaway certificates; the operator pins them
	auth := "PVEAPIToken=root@pam!sim=00000000-0000-0000-0000-000000000000"
	for _, u := range l.urls {
		req, _ := http.NewRequest(http.MethodGet, u+"/api2/json/version", nil)
		req.Header.Set("Authorization", auth)
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
		}
	}
	bareNext := make(chan int, 1)
	go func() {
		// The bare minimum: the claim seen through a watch, one write to
		// it, the clone request.
		vmid := 20000
		for ev := range watcher.ResultChan() {
			c, ok := ev.Object.(*hfv1.MachineClaim)
			if ev.Type != watch.Added || !ok {
				continue
			}
			i := <-bareNext
			patch := []byte(`{"metadata":{"annotations":{"bench.hyperfleet.io/vm":"` + fmt.Sprint(vmid) + `"}}}`)
			if err := wc.Patch(ctx, c, client.RawPatch(types.MergePatchType, patch)); err != nil {
				t.Error(err)
			}
			form := url.Values{"newid": {fmt.Sprint(vmid)}, "name": {c.Name}}
			req, _ := http.NewRequest(http.MethodPost, l.urls[i]+"/api2/json/nodes/pve1/qemu/9000/clone", strings.NewReader(form.Encode()))
			req.Header.Set("Authorization", auth)
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			if resp, err := hc.Do(req); err == nil {
				resp.Body.Close()
			}
			vmid++
		}
	}()
	var opDs, bareDs []time.Duration
	for k := range probes {
		for _, bare := range []bool{false, true} {
			i := k % len(l.sims)
			cloned := make(chan time.Time, 1)
			l.recs[i].setOnClone(func(at time.Time) {
				select {
				case cloned <- at:
				default:
				}
			})
			var start time.Time
			if bare {
				bareNext <- i
				l.newClaim(t, "bare", fmt.Sprintf("bare-%d", k), "none")
			} else {
				l.newClaim(t, fmt.Sprintf("load-%d", i), fmt.Sprintf("probe-%d", k), "runner")
			}
			// Created is when Create returns: the API server's own write
			// is not the operator's overhead.
			start = time.Now()
			select {
			case at := <-cloned:
				if bare {
					bareDs = append(bareDs, at.Sub(start))
				} else {
					opDs = append(opDs, at.Sub(start))
				}
			case <-time.After(time.Minute):
				t.Fatalf("no clone request within a minute (bare %v, probe %d)", bare, k)
			}
			l.recs[i].setOnClone(nil)
		}
	}
	return bench.Overhead{Claims: l.created, Clusters: len(l.sims), Operator: bench.Summarize(opDs), Bare: bench.Summarize(bareDs)}
}
