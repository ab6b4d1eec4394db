//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/test/managerproc"
)

// Settings from the environment (the Makefile's targets set them).
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// convergenceBound is how long after the last fault the pools must be back
// to their minimum with nothing left over.
const convergenceBound = 5 * time.Minute

// jobDuration is how long each job runs on its runner.
const jobDuration = 2 * time.Second

// proxmoxFaults are the run's Proxmox faults, on every request class of
// every cluster: about 10 % of calls fail (5 % with a lock timeout or
// another handler error, 2 % dropped connections, 3 % task failures), and
// 1 % take 2 s longer.
var proxmoxFaults = proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{"*": {
	ErrorRate: 0.05, DropRate: 0.02, TaskFailRate: 0.03, SpikeRate: 0.01, SpikeLatency: proxmoxsim.Duration(2 * time.Second),
}}}

// TestChaos churns CHAOS_CLAIMS claims (150 by default, as make test-chaos-small; make test-chaos
// runs 1,000) through the pools while the schedule injects its faults,
// checks the invariants all along and at the end, and writes the report
// (into HF_CHAOS_OUT, else the test's temporary directory).
func TestChaos(t *testing.T) {
	claims := envInt("CHAOS_CLAIMS", 150)
	out := os.Getenv("HF_CHAOS_OUT")
	if out == "" {
		out = t.TempDir()
	}
	dir, err := os.MkdirTemp("", "hyperfleet-chaos-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !t.Failed() {
			_ = os.RemoveAll(dir)
		} else {
			t.Logf("the run's world is kept in %s", dir)
		}
	})
	started := time.Now()
	c := startWorld(t, dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := newRecorder()
	go rec.watchClaims(ctx, c.w)
	probe := &prober{}
	go probe.run(ctx, "https://"+c.webhook.Addr+"/webhooks/github")

	run := &churn{c: c, rec: rec, probe: probe, total: claims, started: time.Now()}
	run.plan()
	run.loop(ctx, t)
	run.finalChecks(ctx, t)
	run.checkOverflow()
	if load := envInt("CHAOS_LOAD", 0); load > 0 {
		run.load = measureLoad(ctx, t, run)
	}
	run.length = time.Since(started)
	report := run.report()
	if err := os.WriteFile(out+"/reliability.md", []byte(report), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("report written to %s/reliability.md:\n%s", out, report)
	for _, name := range invariantOrder {
		if v := rec.violations[name]; len(v) > 0 {
			t.Errorf("invariant %q failed: %v", name, v)
		}
	}
}

// churn is one run: its jobs, its schedule, what it measured.
type churn struct {
	c       *chaosWorld
	rec     *recorder
	probe   *prober
	total   int
	started time.Time

	// jobs are the queued jobs by pool name.
	jobs     map[string][]int64
	quota    map[string]int
	enqueued int
	// steps is the fault schedule, undo the pending reversals.
	steps []step
	undo  []timedAction
	// faultsOn says the background faults are on; lastFault is when the
	// last fault of any kind ended.
	faultsOn  bool
	lastFault time.Time
	// injected counts the scheduled faults by kind.
	injected map[string]int
	// failovers are the leader kills' measurements.
	failovers []failover
	// unplanned counts replicas that exited on their own (and were
	// restarted, as a kubelet does).
	unplanned  int
	converged  time.Duration
	feedLength time.Duration
	// cutAt and healedAt bound cluster B's partition (overflowPool's
	// spill and return are judged against them).
	cutAt, healedAt time.Time
	// partitioned is true from the cut until healPartition heals it.
	partitioned bool
	// githubCalls and proxmoxCalls are the calls made by the time the
	// jobs were done.
	githubCalls, proxmoxCalls int64
	length                    time.Duration
	load                      *loadFigures
}

// step is a fault the schedule injects once progress (completed jobs over
// all jobs) reaches at.
type step struct {
	at   float64
	name string
	do   func()
	done bool
}

// timedAction is a reversal due at a time.
type timedAction struct {
	at time.Time
	do func()
}

// failover is one leader kill.
type failover struct {
	killed             time.Time
	role               string
	takeover, webhooks time.Duration
	controllers        time.Duration
}

// plan sets the pools' quotas and the schedule.
func (r *churn) plan() {
	r.jobs, r.quota, r.injected = map[string][]int64{}, map[string]int{}, map[string]int{}
	sumMax := 0
	for _, p := range r.c.pools {
		sumMax += int(p.MaxReplicas)
	}
	left := r.total
	for i, p := range r.c.pools {
		q := r.total * int(p.MaxReplicas) / sumMax
		if i == len(r.c.pools)-1 {
			q = left
		}
		r.quota[p.Name], left = q, left-q
	}
	c := r.c
	r.steps = []step{
		{at: 0.03, name: "faults on", do: func() {
			c.setProxmoxFaults(proxmoxFaults)
			for _, f := range []githubsim.ErrorFault{
				{PathPrefix: "/orgs/", Status: 502, Probability: 0.03},
				{PathPrefix: "/repos/", Status: 503, Probability: 0.03},
			} {
				if err := c.w.GitHub.InjectError(f); err != nil {
					c.t.Fatal(err)
				}
			}
			c.w.GitHub.DropWebhooks(0, 0.02)
			r.faultsOn = true
		}},
		{at: 0.10, name: "kill the leader", do: func() { r.killReplica(true) }},
		{at: 0.20, name: "kill the standby", do: func() { r.killReplica(false) }},
		{at: 0.30, name: "node offline", do: func() {
			f := proxmoxFaults
			f.OfflineNodes = []string{offlineNode}
			if err := c.sims[clusterA].SetFaults(f); err != nil {
				c.t.Fatal(err)
			}
			r.injected["Proxmox node offline (30 s)"]++
			r.after(30*time.Second, func() {
				g := proxmoxsim.Faults{}
				if r.faultsOn {
					g = proxmoxFaults
				}
				_ = c.sims[clusterA].SetFaults(g)
			})
		}},
		{at: 0.40, name: "restart the API server", do: func() {
			if err := c.w.API.RestartAPIServer(context.Background(), 5*time.Second); err != nil {
				c.t.Fatal(err)
			}
			r.injected["kube-apiserver restarts (down 5 s)"]++
			r.lastFault = time.Now()
		}},
		{at: 0.50, name: "partition cluster B", do: func() {
			if err := c.link.Cut(); err != nil {
				c.t.Fatal(err)
			}
			r.cutAt, r.partitioned = time.Now(), true
			r.injected["network partitions between the manager and "+clusterB+" (25 s, longer until "+overflowPool+" spills)"]++
		}},
		{at: 0.60, name: "kill the leader", do: func() { r.killReplica(true) }},
		{at: 0.70, name: "GitHub secondary rate limits", do: func() {
			for range 2 {
				if err := c.w.GitHub.InjectSecondaryLimit(githubsim.SecondaryLimitFault{Count: 1, Status: 429, RetryAfter: githubsim.Duration(2 * time.Second)}); err != nil {
					c.t.Fatal(err)
				}
			}
		}},
		{at: 0.95, name: "faults off", do: r.faultsOff},
	}
}

// after schedules do in d.
func (r *churn) after(d time.Duration, do func()) {
	r.undo = append(r.undo, timedAction{at: time.Now().Add(d), do: func() { do(); r.lastFault = time.Now() }})
}

// shortestPartition and longestPartition bound cluster B's partition. It lasts
// shortestPartition, and then until overflowPool has built a claim from its
// overflow template: the manager marks a cluster down only after
// toleratedProbeFailures probes in a row failed, each given up at the
// cluster's spec.probeTimeout (10 s by default), so a partition is seen
// about 30 s in, and only then does the pool spill. longestPartition ends a run whose pool never
// spills (the overflow invariant then says so).
const (
	shortestPartition = 25 * time.Second
	longestPartition  = 4 * time.Minute
)

// healPartition ends cluster B's partition once it lasted shortestPartition
// and overflowPool spilled, or longestPartition.
func (r *churn) healPartition() {
	if !r.partitioned {
		return
	}
	lasted := time.Since(r.cutAt)
	if spilled, _, _ := r.overflowFigures(); lasted < shortestPartition || (spilled == 0 && lasted < longestPartition) {
		return
	}
	_ = r.c.link.Heal()
	r.partitioned, r.healedAt, r.lastFault = false, time.Now(), time.Now()
}

// faultsOff ends the background faults.
func (r *churn) faultsOff() {
	if !r.faultsOn {
		return
	}
	r.faultsOn = false
	r.c.setProxmoxFaults(proxmoxsim.Faults{})
	r.c.w.GitHub.ClearFaults()
	r.c.w.GitHub.DropWebhooks(0, 0)
	r.lastFault = time.Now()
}

// killReplica kills the leader (or the standby) with SIGKILL and measures
// the failover: how long until another replica holds the lease, the
// longest the webhook receiver did not answer, and how long until a claim
// changed again. The kubelet's restart of the killed replica follows in
// the loop.
func (r *churn) killReplica(leader bool) {
	c := r.c
	var victim *managerproc.Process
	l := c.leader()
	for _, p := range c.replicas {
		if (p == l) == leader {
			victim = p
			break
		}
	}
	if victim == nil {
		c.t.Logf("no %s replica to kill (replicas %d, leader %v)", map[bool]string{true: "leading", false: "standby"}[leader], len(c.replicas), l != nil)
		return
	}
	killed := time.Now()
	c.kill(victim)
	role := "standby"
	if leader {
		role = "leader"
		r.injected["manager leader kills (SIGKILL)"]++
	} else {
		r.injected["manager standby kills (SIGKILL)"]++
	}
	r.lastFault = time.Now()
	if !leader {
		return
	}
	f := failover{killed: killed, role: role}
	for time.Since(killed) < time.Minute {
		if c.leader() != nil {
			f.takeover = time.Since(killed)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.failovers = append(r.failovers, f)
}

// loop feeds jobs, runs the schedule, restarts dead replicas and checks
// the invariants every half second until every job completed and the
// pools converged (or the run's time is up).
func (r *churn) loop(ctx context.Context, t *testing.T) {
	c := r.c
	timeout := time.Duration(envInt("CHAOS_TIMEOUT_MINUTES", 60)) * time.Minute
	deadline := time.Now().Add(timeout)
	var busy map[int64]int64
	var feedDone time.Time
	lastLog := time.Now()
	for {
		if time.Now().After(deadline) {
			t.Errorf("the run did not finish within %s: %s", timeout, r.status(ctx))
			return
		}
		r.feed(t)
		progress := r.progress()
		for i := range r.steps {
			if s := &r.steps[i]; !s.done && progress >= s.at {
				s.done = true
				t.Logf("%s: %s (progress %.0f %%)", time.Since(r.started).Round(time.Second), s.name, progress*100)
				s.do()
			}
		}
		keep := r.undo[:0]
		for _, a := range r.undo {
			if time.Now().After(a.at) {
				a.do()
			} else {
				keep = append(keep, a)
			}
		}
		r.undo = keep
		r.healPartition()
		r.superviseReplicas(t)
		c.sampleVMs(r.rec)
		busy = c.busyRunners(r.rec, busy)
		r.checkLeaders()
		if r.enqueued == r.total && r.completed() == r.total {
			if feedDone.IsZero() {
				feedDone = time.Now()
				r.feedLength = time.Since(r.started)
				r.githubCalls, r.proxmoxCalls = c.githubCalls.Load(), c.proxmoxCalls.Load()
				r.faultsOff()
			}
			if len(r.undo) == 0 && !r.partitioned && r.settled(ctx) {
				r.converged = time.Since(r.lastFault)
				return
			}
		}
		if time.Since(lastLog) > 30*time.Second {
			lastLog = time.Now()
			t.Logf("%s: %s", time.Since(r.started).Round(time.Second), r.status(ctx))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// superviseReplicas restarts replicas that exited on their own, as the
// kubelet does, and keeps two running (a killed one is replaced 2 s after
// its death).
func (r *churn) superviseReplicas(t *testing.T) {
	c := r.c
	for _, p := range append([]*managerproc.Process(nil), c.replicas...) {
		if p.Exited() {
			r.unplanned++
			t.Logf("replica %s exited on its own (%s; its last words: %q); restarting it", p.LogFile, p.Cmd.ProcessState, lastLine(p.LogFile))
			c.bury(p)
		}
	}
	for len(c.replicas) < 2 {
		if len(c.dead) > 0 && time.Since(r.lastFault) < 2*time.Second {
			return
		}
		c.startReplica()
	}
}

// lastLine is a log file's last non-empty line: why a manager exited
// (for example "hyperfleet manager: leader election lost").
func lastLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// checkLeaders checks that at most one replica leads.
func (r *churn) checkLeaders() {
	n := 0
	for _, p := range r.c.replicas {
		if ok, err := p.IsLeader(); err == nil && ok {
			n++
		}
	}
	v := ""
	if n > 1 {
		v = fmt.Sprintf("%d replicas report leading at %s", n, time.Now().Format("15:04:05"))
	}
	r.rec.check(invLeaderUnique, v)
}

// feed keeps each pool's queue at twice its maximum (overflowPool's at
// overflowQueue) until its quota is queued.
func (r *churn) feed(t *testing.T) {
	for _, p := range r.c.pools {
		queued := 0
		for _, id := range r.jobs[p.Name] {
			if j, ok := r.c.w.GitHub.Job(id); ok && j.Status == "queued" {
				queued++
			}
		}
		depth := 2 * int(p.MaxReplicas)
		if p.Name == overflowPool {
			depth = overflowQueue
		}
		n := min(depth-queued, r.quota[p.Name]-len(r.jobs[p.Name]))
		if n <= 0 {
			continue
		}
		ids, err := r.c.w.EnqueueJobsFor(p.Label, n, jobDuration)
		if err != nil {
			t.Fatal(err)
		}
		r.jobs[p.Name] = append(r.jobs[p.Name], ids...)
		r.enqueued += len(ids)
	}
}

// completed counts the completed jobs.
func (r *churn) completed() int {
	n := 0
	for _, ids := range r.jobs {
		for _, id := range ids {
			if j, ok := r.c.w.GitHub.Job(id); ok && j.Status == "completed" {
				n++
			}
		}
	}
	return n
}

// progress is the share of all jobs completed.
func (r *churn) progress() float64 { return float64(r.completed()) / float64(r.total) }

// settled reports whether every pool is back to its minimum: as many
// claims, VMs, runners and seed ISOs as the minimums, no claim being
// deleted, and no address held beyond the static pool's claims.
func (r *churn) settled(ctx context.Context) bool {
	s, err := r.snapshot(ctx)
	return err == nil && s.settled()
}

// status is a one-line summary of the run for the log.
func (r *churn) status(ctx context.Context) string {
	s, err := r.snapshot(ctx)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%d/%d jobs queued, %d completed; %d claims, %d VMs, %d ISOs, %d runners (minimum %d); replicas %d, leader %v",
		r.enqueued, r.total, r.completed(), len(s.claims), s.vms, s.isos, s.runners, s.min, len(r.c.replicas), r.c.leader() != nil)
}

// worldState is what settled and the final checks look at.
type worldState struct {
	claims                  []string
	vms, isos, runners, min int
	deleting                int
	allocated, staticClaims int64
}

func (s worldState) settled() bool {
	return len(s.claims) == s.min && s.vms == s.min && s.runners == s.min && s.isos <= s.min && s.deleting == 0 && s.allocated == s.staticClaims
}

func (r *churn) snapshot(ctx context.Context) (worldState, error) {
	var s worldState
	for _, p := range r.c.pools {
		s.min += int(p.MinReplicas)
	}
	snap, err := r.c.w.Snapshot(ctx)
	if err != nil {
		return s, err
	}
	for _, cl := range snap.Claims {
		s.claims = append(s.claims, cl.Name)
		if cl.DeletionTimestamp != nil {
			s.deleting++
		}
		if ref := cl.Spec.RunnerPoolRef; ref != nil && ref.Name == staticPool {
			s.staticClaims++
		}
	}
	s.runners = len(snap.Runners)
	for _, sim := range r.c.sims {
		st := sim.State()
		for _, vm := range st.VMs {
			if !vm.Template {
				s.vms++
			}
		}
		for _, sto := range st.Storages {
			for _, v := range sto.Volumes {
				if v.Content == "iso" {
					s.isos++
				}
			}
		}
	}
	alloc, err := r.c.allocated(ctx)
	if err != nil {
		return s, err
	}
	s.allocated = alloc
	_ = devenv.Namespace
	return s, nil
}
