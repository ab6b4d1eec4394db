package proxmox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestInjectedErrorsConverge: handler errors (500s with lock timeouts and
// connection failures) and dropped connections on every endpoint class;
// EnsureVM and DeleteVM still converge with exactly one VM and no leftovers,
// and every error they returned was transient.
func TestInjectedErrorsConverge(t *testing.T) {
	for _, seed := range []int64{1, 2, 3} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			e := newEnv(t, func(sim *proxmoxsim.Config, _ *provider.ClusterConfig) { sim.Seed = seed })
			if err := e.sim.SetFaults(proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{
				"*":     {ErrorRate: 0.15, DropRate: 0.05},
				"clone": {ErrorRate: 0.3, Errors: []string{"VM is locked (clone)", "can't lock file '/var/lock/qemu-server/lock-{vmid}.conf' - got timeout"}},
				"auth":  {},
			}}); err != nil {
				t.Fatal(err)
			}
			spec := testSpec("runner-f", "uid-ffff")
			d := e.ensure(e.p, spec, provider.Progress{}, provider.PhaseRunning, 400)
			if len(d.errs) == 0 {
				t.Fatal("no fault reached the provider; the test proves nothing")
			}
			for _, err := range d.errs {
				if r := provider.ReasonOf(err); r != "LockTimeout" && r != "Unreachable" && r != "APIError" {
					t.Errorf("unexpected reason %s: %v", r, err)
				}
			}
			if e.nonTemplateVMs() != 1 {
				t.Fatalf("%d VMs after faults, want 1", e.nonTemplateVMs())
			}
			e.remove(e.p, spec.Owner, d.prog, 200)
			if err := e.sim.SetFaults(proxmoxsim.Faults{}); err != nil {
				t.Fatal(err)
			}
			if e.nonTemplateVMs() != 0 || e.volume(e.p.isoVolid(mustVMID(d.prog.ID), spec.Owner.UID)) != nil {
				t.Fatal("VM or ISO left behind")
			}
		})
	}
}

// TestLatencySpikes: requests parked on the simulator's clock. A driver
// advances the clocks while a call is blocked, as time passes for a real
// cluster; the provider converges.
func TestLatencySpikes(t *testing.T) {
	e := newEnv(t)
	if err := e.sim.SetFaults(proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{
		"*": {SpikeRate: 0.3, SpikeLatency: proxmoxsim.Duration(3 * time.Second)},
	}}); err != nil {
		t.Fatal(err)
	}
	spec := testSpec("runner-l", "uid-llll")
	prog := provider.Progress{}
	spikes := 0
	for i := 0; ; i++ {
		if i > 300 {
			t.Fatal("no convergence under latency spikes")
		}
		type answer struct {
			res *provider.EnsureResult
			err error
		}
		done := make(chan answer, 1)
		go func() {
			res, err := e.p.EnsureVM(context.Background(), spec, prog)
			done <- answer{res, err}
		}()
		var a answer
	wait:
		for {
			select {
			case a = <-done:
				break wait
			case <-time.After(5 * time.Millisecond):
				// The call is parked on a spike: let simulated time pass.
				spikes++
				e.advance(500 * time.Millisecond)
			}
		}
		if a.err != nil {
			if provider.Classify(a.err) != provider.ClassTransient {
				t.Fatal(a.err)
			}
			continue
		}
		prog = a.res.Progress
		if a.res.Phase == provider.PhaseRunning {
			break
		}
		e.advance(a.res.RetryAfter)
	}
	if spikes == 0 {
		t.Fatal("no call was delayed; the test proves nothing")
	}
	if e.nonTemplateVMs() != 1 {
		t.Fatalf("%d VMs", e.nonTemplateVMs())
	}
}

// TestParallelClonesOnOneStorage: more concurrent clones than a storage
// serves within its lock timeout; clones that fail on the storage lock back
// off and retry until every VM runs.
func TestParallelClonesOnOneStorage(t *testing.T) {
	e := newEnv(t, func(sim *proxmoxsim.Config, cfg *provider.ClusterConfig) {
		sim.StorageLockTimeout = proxmoxsim.Duration(2 * time.Second)
		cfg.ClonesPerNode, cfg.ClonesPerStorage = 4, 4
	})
	ctx := context.Background()
	const n = 4
	specs := make([]*provider.VMSpec, n)
	progs := make([]provider.Progress, n)
	running := make([]bool, n)
	lockFailures := 0
	for i := range specs {
		specs[i] = testSpec(fmt.Sprintf("runner-%d", i), fmt.Sprintf("uid-par-%d", i))
	}
	for round := 0; ; round++ {
		if round > 300 {
			t.Fatalf("parallel clones did not converge: %+v", progs)
		}
		next := time.Duration(0)
		all := true
		for i := range specs {
			if running[i] {
				continue
			}
			all = false
			res, err := e.p.EnsureVM(ctx, specs[i], progs[i])
			if err != nil {
				t.Fatalf("VM %d: %v", i, err)
			}
			if res.Phase == provider.PhaseQueued && res.RetryAfter >= backoffBase {
				lockFailures++
			}
			progs[i] = res.Progress
			running[i] = res.Phase == provider.PhaseRunning
			if !running[i] && (next == 0 || res.RetryAfter < next) {
				next = res.RetryAfter
			}
		}
		if all {
			break
		}
		e.advance(max(next, 100*time.Millisecond))
	}
	if lockFailures == 0 {
		t.Fatal("no clone hit the storage lock timeout; the test proves nothing")
	}
	failed := 0
	for _, task := range e.state().Tasks {
		if task.Type == "qmclone" && task.ExitStatus != "OK" {
			failed++
		}
	}
	if failed == 0 || e.nonTemplateVMs() != n {
		t.Fatalf("%d failed clone tasks, %d VMs", failed, e.nonTemplateVMs())
	}
	t.Logf("%d clones failed on the storage lock and were retried", failed)
}

// TestCloneSlotsQueue: with one clone per storage, the second VM queues
// (reported to the Observer) until the first clone ends.
func TestCloneSlotsQueue(t *testing.T) {
	e := newEnv(t, func(_ *proxmoxsim.Config, cfg *provider.ClusterConfig) { cfg.ClonesPerStorage = 1 })
	ctx := context.Background()
	a, b := testSpec("runner-qa", "uid-qa"), testSpec("runner-qb", "uid-qb")
	pa := e.ensure(e.p, a, provider.Progress{}, provider.PhaseCloning, 5).prog
	pb := e.ensure(e.p, b, provider.Progress{}, provider.PhasePlaced, 1).prog
	res, err := e.p.EnsureVM(ctx, b, pb)
	if err != nil || res.Phase != provider.PhaseQueued || res.RetryAfter <= 0 {
		t.Fatalf("second clone: %+v %v", res, err)
	}
	e.obs.mu.Lock()
	queues := append([]int(nil), e.obs.queues...)
	e.obs.mu.Unlock()
	if len(queues) == 0 || queues[len(queues)-1] != 1 {
		t.Fatalf("clone queue reports %v, want last 1", queues)
	}
	e.ensure(e.p, a, pa, provider.PhaseConfiguring, 40)
	d := e.ensure(e.p, b, res.Progress, provider.PhaseCloning, 5)
	if d.prog.Task == nil {
		t.Fatal("the queued VM did not start its clone once the slot was free")
	}
	e.obs.mu.Lock()
	last := e.obs.queues[len(e.obs.queues)-1]
	e.obs.mu.Unlock()
	if last != 0 {
		t.Fatalf("clone queue %d after the slot was taken, want 0", last)
	}
}

// TestNodeOffline: the VM's node goes away mid-creation; calls fail with a
// transient NodeOffline error and resume once it is back.
func TestNodeOffline(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	spec := testSpec("runner-o", "uid-oooo")
	d := e.ensure(e.p, spec, provider.Progress{}, provider.PhaseCloning, 5)
	if err := e.sim.SetNodeOnline("pve1", false); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		e.advance(2 * time.Second)
		_, err := e.p.EnsureVM(ctx, spec, d.prog)
		if provider.ReasonOf(err) != "NodeOffline" || provider.Classify(err) != provider.ClassTransient || !errors.Is(err, provider.ErrUnreachable) {
			t.Fatalf("with the node offline: %s/%s %v", provider.Classify(err), provider.ReasonOf(err), err)
		}
	}
	if _, err := e.p.DeleteVM(ctx, spec.Owner, d.prog); provider.ReasonOf(err) != "NodeOffline" {
		t.Fatalf("DeleteVM with the node offline: %v", err)
	}
	info, err := e.p.Probe(ctx)
	if err != nil || info.Nodes[0].Online {
		t.Fatalf("Probe with the node offline: %+v %v", info, err)
	}
	if err := e.sim.SetNodeOnline("pve1", true); err != nil {
		t.Fatal(err)
	}
	e.ensure(e.p, spec, d.prog, provider.PhaseRunning, 200)
	if e.nonTemplateVMs() != 1 {
		t.Fatalf("%d VMs", e.nonTemplateVMs())
	}
}

// TestPlacementCapacity: no node with room is a Resource error; a full id
// range is ErrIDRangeExhausted.
func TestPlacementCapacity(t *testing.T) {
	e := newEnv(t, func(_ *proxmoxsim.Config, cfg *provider.ClusterConfig) { cfg.VMIDStart, cfg.VMIDEnd = 1000, 1001 })
	ctx := context.Background()
	big := testSpec("runner-big", "uid-big")
	big.MemoryBytes, big.MemoryHint = 100<<30, 100<<30
	_, err := e.p.EnsureVM(ctx, big, provider.Progress{})
	if !errors.Is(err, provider.ErrNoCapacity) || provider.Classify(err) != provider.ClassResource {
		t.Fatalf("oversized VM: %v", err)
	}
	// Reservations count: 40 GiB twice does not fit into 62 GiB free.
	half := func(i int) *provider.VMSpec {
		s := testSpec(fmt.Sprintf("runner-h%d", i), fmt.Sprintf("uid-h%d", i))
		s.MemoryHint = 40 << 30
		return s
	}
	if _, err := e.p.EnsureVM(ctx, half(0), provider.Progress{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.EnsureVM(ctx, half(1), provider.Progress{}); !errors.Is(err, provider.ErrNoCapacity) {
		t.Fatalf("second 40 GiB VM: %v", err)
	}
	info, err := e.p.Probe(ctx)
	if err != nil || info.Nodes[0].ReservedMemoryBytes != 40<<30 {
		t.Fatalf("Probe reservations: %+v %v", info, err)
	}
	small := func(i int) *provider.VMSpec { return testSpec(fmt.Sprintf("runner-s%d", i), fmt.Sprintf("uid-s%d", i)) }
	if _, err := e.p.EnsureVM(ctx, small(0), provider.Progress{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.EnsureVM(ctx, small(1), provider.Progress{}); !errors.Is(err, provider.ErrIDRangeExhausted) || provider.Classify(err) != provider.ClassResource {
		t.Fatalf("third VM in a two-id range: %v", err)
	}
	// Deleting a placed-only claim frees its id.
	if res, err := e.p.DeleteVM(ctx, half(0).Owner, provider.Progress{ID: FormatID(1000), Node: "pve1"}); err != nil || !res.Done {
		t.Fatalf("DeleteVM of a placement: %+v %v", res, err)
	}
	if _, err := e.p.EnsureVM(ctx, small(1), provider.Progress{}); err != nil {
		t.Fatalf("after freeing an id: %v", err)
	}
}

// TestTwoNodesPlacement: VMs of a template on shared storage spread over
// the nodes by free memory; nodes outside the list get none.
func TestTwoNodesPlacement(t *testing.T) {
	e := newEnv(t, func(sim *proxmoxsim.Config, cfg *provider.ClusterConfig) {
		sim.Nodes = append(sim.Nodes,
			proxmoxsim.NodeConfig{Name: "pve2", CPUs: 16, Memory: 64 << 30, MemoryUsed: 1 << 30},
			proxmoxsim.NodeConfig{Name: "pve3", CPUs: 16, Memory: 256 << 30, MemoryUsed: 1 << 30})
		sim.Storages = append(sim.Storages, proxmoxsim.StorageConfig{ID: "ceph", Type: "rbd", Content: []string{"images"}, Shared: true, Capacity: 1 << 40})
		// The template lives on a node VMs may not use: every clone
		// crosses nodes.
		sim.Templates[0].Node, sim.Templates[0].Storage, sim.Templates[0].CloudInitStorage = "pve3", "ceph", "ceph"
		cfg.Nodes = []string{"pve1", "pve2"}
	})
	ctx := context.Background()
	nodes := map[string]int{}
	for i := 0; i < 4; i++ {
		s := testSpec(fmt.Sprintf("runner-n%d", i), fmt.Sprintf("uid-n%d", i))
		s.MemoryHint = 8 << 30
		res, err := e.p.EnsureVM(ctx, s, provider.Progress{})
		if err != nil {
			t.Fatal(err)
		}
		nodes[res.Progress.Node]++
	}
	if nodes["pve3"] != 0 || nodes["pve1"] != 2 || nodes["pve2"] != 2 {
		t.Fatalf("placement %v, want 2 on pve1 and 2 on pve2 (pve3 is not allowed)", nodes)
	}
	s := testSpec("runner-x", "uid-x")
	d := e.ensure(e.p, s, provider.Progress{}, provider.PhaseRunning, 200)
	if v := e.vm(mustVMID(d.prog.ID)); v == nil || v.Node != d.prog.Node || v.Node == "pve3" {
		t.Fatalf("VM %+v, progress %+v", v, d.prog)
	}
}

// TestMigratedVMIsDeleted: an admin moved the VM to another node behind the
// operator's back; DeleteVM finds it there instead of calling it gone.
func TestMigratedVMIsDeleted(t *testing.T) {
	e := newEnv(t, func(sim *proxmoxsim.Config, _ *provider.ClusterConfig) {
		sim.Nodes = append(sim.Nodes, proxmoxsim.NodeConfig{Name: "pve2", CPUs: 16, Memory: 64 << 30})
		sim.Storages = append(sim.Storages, proxmoxsim.StorageConfig{ID: "ceph", Type: "rbd", Content: []string{"images"}, Shared: true})
		sim.Templates[0].Storage, sim.Templates[0].CloudInitStorage = "ceph", "ceph"
	})
	spec := testSpec("runner-m", "uid-mmmm")
	spec.MemoryHint = 63 << 30 // only pve2 has room: the VM lands there
	d := e.ensure(e.p, spec, provider.Progress{}, provider.PhaseRunning, 200)
	if d.prog.Node != "pve2" {
		t.Fatalf("placed on %s", d.prog.Node)
	}
	// The simulator has no migrate call; a Progress naming the old node is
	// exactly what the provider sees after a migration.
	stale := provider.Progress{ID: FormatID(mustVMID(d.prog.ID)), Node: "pve1"}
	e.remove(e.p, spec.Owner, stale, 40)
	if e.vm(mustVMID(d.prog.ID)) != nil {
		t.Fatal("DeleteVM with a stale node reported Done and left the VM")
	}
}

// TestCloneBackoffKeepsItsCause: while a clone refused on a lock waits for
// its retry, every call says why, not only the one that failed: the
// claim's condition is the message of the latest call (found by property
// 8's test, TestRetryAndErrorHandlingProperty in internal/controller).
func TestCloneBackoffKeepsItsCause(t *testing.T) {
	e := newEnv(t)
	if err := e.sim.SetFaults(proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{
		"clone": {ErrorRate: 1, Errors: []string{"VM is locked (clone)"}},
	}}); err != nil {
		t.Fatal(err)
	}
	spec := testSpec("runner-b", "uid-bbbb")
	prog := provider.Progress{}
	var msgs []string
	for i := 0; i < 4; i++ {
		res, err := e.p.EnsureVM(context.Background(), spec, prog)
		if err != nil {
			t.Fatal(err)
		}
		prog = res.Progress
		msgs = append(msgs, res.Message)
	}
	refused := 0
	for _, m := range msgs {
		if strings.Contains(m, "retrying the clone at") && !strings.Contains(m, "VM is locked (clone)") {
			t.Fatalf("a call waiting for its retry does not say why: %q (all: %q)", m, msgs)
		}
		if strings.Contains(m, "VM is locked (clone)") {
			refused++
		}
	}
	if refused < 2 {
		t.Fatalf("want the refusal and at least one call waiting after it, got %q", msgs)
	}
}

// TestStartWaitsOutItsBackoff: a start refused on a lock is not tried
// again before its backoff is over, however often the provider is called
// (every call of a claim woken early would otherwise double the wait: a
// lock of 0.7 s was seen cost a minute in property 8's test), and every
// call in between says why it waits.
func TestStartWaitsOutItsBackoff(t *testing.T) {
	e := newEnv(t)
	if err := e.sim.SetFaults(proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{
		"power": {ErrorRate: 1, Errors: []string{"can't lock file '/var/lock/qemu-server/lock-{vmid}.conf' - got timeout"}},
	}}); err != nil {
		t.Fatal(err)
	}
	spec := testSpec("runner-s", "uid-ssss")
	prog := provider.Progress{}
	refused := -1
	var msgs []string
	for i := 0; i < 100 && (refused < 0 || i < refused+4); i++ {
		res, err := e.p.EnsureVM(context.Background(), spec, prog)
		if err != nil {
			t.Fatal(err)
		}
		prog = res.Progress
		msgs = append(msgs, res.Message)
		if refused < 0 && strings.Contains(res.Message, "is locked; retrying the start") {
			refused = i
		}
		if res.RetryAfter > 0 && refused < 0 {
			e.advance(res.RetryAfter)
		}
	}
	if refused < 0 {
		t.Fatalf("the start was never refused: %q", msgs)
	}
	for _, m := range msgs[refused+1:] {
		if !strings.Contains(m, "retrying the start at") || !strings.Contains(m, "is locked") {
			t.Fatalf("a call during the start's backoff: %q, want it to wait, saying why (all: %q)", m, msgs)
		}
	}
}
