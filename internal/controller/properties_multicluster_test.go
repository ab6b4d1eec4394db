package controller_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// clusterHealth is what a case does to one cluster's simulator.
type clusterHealth struct {
	name   string
	faults proxmoxsim.Faults
}

var clusterHealths = []clusterHealth{
	{name: "healthy"},
	{name: "clone requests fail", faults: proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{
		"clone": {ErrorRate: 1, ErrorCode: 503}}}},
	{name: "every write is slow", faults: proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{
		"clone":  {SpikeRate: 1, SpikeLatency: proxmoxsim.Duration(800 * time.Millisecond)},
		"config": {SpikeRate: 1, SpikeLatency: proxmoxsim.Duration(800 * time.Millisecond)},
		"power":  {SpikeRate: 1, SpikeLatency: proxmoxsim.Duration(800 * time.Millisecond)}}}},
	{name: "half the requests are dropped", faults: proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{
		"*": {DropRate: 0.5}, "auth": {}}}},
	{name: "down", faults: proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{
		"*": {ErrorRate: 1, ErrorCode: 503}}}},
}

// cheapHealths are property 2's cluster healths in the cheap world: the
// envtest's, with slow writes as long tasks (the simulator's latencies on
// the fake clock) instead of delayed answers, which would hold a pass.
var cheapHealths = []struct {
	name    string
	faults  proxmoxsim.Faults
	latency func(*proxmoxsim.Latency)
}{
	{name: "healthy"},
	{name: "clone requests fail", faults: clusterHealths[1].faults},
	{name: "every write is slow", latency: func(l *proxmoxsim.Latency) {
		// A hundred times the others' (each poll of a task costs a pass).
		l.CloneBase, l.Config, l.Start, l.Boot = 100*l.CloneBase, 100*l.Config, 100*l.Start, 100*l.Boot
	}},
	{name: "half the requests are dropped", faults: clusterHealths[3].faults},
	{name: "down", faults: clusterHealths[4].faults},
}

// Feature: hyperfleet-operator, Property 2: Multi-Hypervisor Support
//
// TestMultiHypervisorProperty, in the cheap world (cheapworld_test.go):
// with two to four HypervisorClusters, each its own Proxmox simulator, and
// a generated health per cluster (healthy, its clone requests failing, its
// writes slow, half its requests dropped, or down), one or two claims on
// each: every claim on a healthy cluster runs with its credential
// delivered, as it would alone; at every round of the operator, every VM
// is on its own claim's cluster and on no other, at most one per claim,
// and every claim's recorded VM names its own cluster; once the faults
// stop, every cluster is Ready again and every claim is removed with its
// VM.
//
// Mutation: the registry failing a cluster that is not Ready over to
// another Ready cluster's provider (internal/hypervisors/registry.go's
// Provider) fails this test within three cases: a claim of a sick cluster
// gets its VM on another cluster, caught at the round it appears. The
// envtest test looked once after the healthy claims ran and once at
// deletion, and would have caught a VM still there then.
func TestMultiHypervisorProperty(t *testing.T) {
	w := newCheapWorld(t, cheapOptions{maxRetryDelay: time.Second})
	var sims []*cheapSim
	var clusters []*hfv1.HypervisorCluster
	for i := range 4 {
		sim := w.StartSim(nil)
		sims = append(sims, sim)
		clusters = append(clusters, w.AddCluster(fmt.Sprintf("pve-%d", i), sim))
		w.Create(cheapTemplate(fmt.Sprintf("debian-%d", i), clusters[i].Name))
	}
	base := sims[0].Latency()
	var healthyClaims, sickClaims, n int
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		defer w.Case(rt)()
		n++
		type placed struct {
			cluster int
			claim   *hfv1.MachineClaim
			healthy bool
		}
		var claims []placed
		heal := func() {
			for _, s := range sims {
				_ = s.SetFaults(proxmoxsim.Faults{})
				s.SetLatency(base)
			}
		}
		defer heal()
		for i := range rapid.IntRange(2, 4).Draw(rt, "clusters") {
			h := cheapHealths[0]
			if rapid.Bool().Draw(rt, fmt.Sprintf("cluster %d sick", i)) {
				h = rapid.SampledFrom(cheapHealths[1:]).Draw(rt, fmt.Sprintf("cluster %d", i))
			}
			if err := sims[i].SetFaults(h.faults); err != nil {
				rt.Fatal(err)
			}
			if h.latency != nil {
				l := base
				h.latency(&l)
				sims[i].SetLatency(l)
			}
			for j := range rapid.IntRange(1, 2).Draw(rt, fmt.Sprintf("claims on cluster %d", i)) {
				c := cheapClaim(fmt.Sprintf("p2-%d-%d-%d", n, i, j), fmt.Sprintf("debian-%d", i))
				w.Create(c)
				claims = append(claims, placed{cluster: i, claim: c, healthy: h.name == "healthy"})
				if h.name == "healthy" {
					healthyClaims++
				} else {
					sickClaims++
				}
			}
		}
		// Every VM on its own claim's cluster only, at every round.
		isolated := func() error {
			for _, c := range claims {
				if !w.Get(c.claim) {
					continue
				}
				if ref := c.claim.Status.VMRef; ref != nil && ref.HypervisorCluster != clusters[c.cluster].Name {
					return fmt.Errorf("claim %s of cluster %s records its VM on %s", c.claim.Name, clusters[c.cluster].Name, ref.HypervisorCluster)
				}
				for i, s := range sims {
					if vms := cheapVMsOf(s.Simulator, string(c.claim.UID)); i != c.cluster && len(vms) > 0 {
						return fmt.Errorf("claim %s of cluster %d has VM %d on cluster %d", c.claim.Name, c.cluster, vms[0].VMID, i)
					} else if i == c.cluster && len(vms) > 1 {
						return fmt.Errorf("claim %s has %d VMs on its cluster", c.claim.Name, len(vms))
					}
				}
			}
			return nil
		}
		w.RunUntil(10*time.Minute, "the healthy clusters' claims running", func() error {
			if err := isolated(); err != nil {
				rt.Fatal(err)
			}
			for _, c := range claims {
				if !c.healthy {
					continue
				}
				if b := c.claim.Status.Bootstrap; c.claim.Status.Phase != hfv1.MachineClaimBootstrapping || b == nil || b.CredentialDeliveredAt == nil {
					return fmt.Errorf("claim %s on healthy cluster %d: phase %s, conditions %v", c.claim.Name, c.cluster, c.claim.Status.Phase, c.claim.Status.Conditions)
				}
			}
			return nil
		})
		heal()
		w.RunUntil(30*time.Minute, "every cluster Ready again", func() error {
			if err := isolated(); err != nil {
				rt.Fatal(err)
			}
			for _, c := range clusters {
				if !w.Get(c) || !meta.IsStatusConditionTrue(c.Status.Conditions, string(hfv1.ReadyCondition)) {
					return fmt.Errorf("cluster %s: %v", c.Name, c.Status.Conditions)
				}
			}
			return nil
		})
		for _, c := range claims {
			w.Delete(c.claim)
		}
		w.RunUntil(30*time.Minute, "every claim gone", func() error {
			if err := isolated(); err != nil {
				rt.Fatal(err)
			}
			for _, c := range claims {
				if w.Get(c.claim) {
					return fmt.Errorf("claim %s still there: phase %s, conditions %v", c.claim.Name, c.claim.Status.Phase, c.claim.Status.Conditions)
				}
			}
			return nil
		})
		for _, c := range claims {
			for i, s := range sims {
				if vms := cheapVMsOf(s.Simulator, string(c.claim.UID)); len(vms) > 0 {
					rt.Fatalf("claim %s is gone but its VM %d is on cluster %d", c.claim.Name, vms[0].VMID, i)
				}
			}
		}
	})
	t.Logf("claims: %d on healthy clusters, %d on sick ones; %d reconciles", healthyClaims, sickClaims, w.Reconciles)
	// The shares need the full count of cases: under -short (the race run)
	// rapid runs a fifth of them, which need not draw every kind.
	if total := healthyClaims + sickClaims; !testing.Short() && (healthyClaims*4 < total || sickClaims*4 < total) {
		t.Errorf("the generator made %d claims on healthy clusters and %d on sick ones; want a quarter of each at least", healthyClaims, sickClaims)
	}
}

// multiWorld is one operator and four clusters, each its own simulator,
// with a fixture (namespace, cluster, template) each.
type multiWorld struct {
	sims []*simulator
	fs   []*fixture
	n    int
}

// vmsOf are the VMs of the claim with uid on simulator i.
func (w *multiWorld) vmsOf(i int, uid string) []proxmoxsim.VMState {
	var out []proxmoxsim.VMState
	for _, vm := range w.sims[i].VMs() {
		if strings.Contains(vm.Description, "uid: "+uid) {
			out = append(out, vm)
		}
	}
	return out
}

// waitAllReady brings every cluster back to Ready once its faults are
// gone, so that the next case starts from healthy clusters: one marked
// down probes again only after its backoff (5 s, doubling), so its spec is
// touched (the poll interval), which the operator reconciles at once.
func (w *multiWorld) waitAllReady(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	for _, f := range w.fs {
		ready := func() (bool, error) {
			var c hfv1.HypervisorCluster
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(f.cluster), &c); err != nil {
				return false, err
			}
			return c.Status.ObservedGeneration == c.Generation && meta.IsStatusConditionTrue(c.Status.Conditions, string(hfv1.ReadyCondition)), nil
		}
		if ok, err := ready(); err != nil {
			t.Fatal(err)
		} else if ok {
			continue
		}
		if err := retry.RetryOnConflict(conflictRetry, func() error {
			var c hfv1.HypervisorCluster
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(f.cluster), &c); err != nil {
				return err
			}
			d := time.Second
			if c.Spec.PollInterval != nil && c.Spec.PollInterval.Duration == d {
				d = 1100 * time.Millisecond
			}
			c.Spec.PollInterval = &metav1.Duration{Duration: d}
			return env.Client.Update(ctx, &c)
		}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "cluster "+f.cluster.Name+" Ready again", func() error {
			ok, err := ready()
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("not ready")
			}
			return nil
		})
	}
}

// TestMultiHypervisorScenarios drives property 2 through the whole
// operator against the real API server: four clusters, each its own
// simulator, in two fixed mixes of health (healthy beside clone requests
// failing and beside half the requests dropped; healthy beside slow writes
// and a cluster down), a claim on each cluster: every claim on a healthy
// cluster runs with its credential delivered, every VM is on its own
// claim's cluster and on no other, and once the faults stop every claim is
// removed with its VM. The property itself is TestMultiHypervisorProperty.
func TestMultiHypervisorScenarios(t *testing.T) {
	longScenario(t)
	startOperator(t, operatorOptions{maxRetryDelay: time.Second})
	w := &multiWorld{}
	for range 3 {
		sim := startSim(t, func(c *proxmoxsim.Config) {
			c.Latency = propertyLatency()
			c.RefreshInterval = proxmoxsim.Duration(100 * time.Millisecond)
		})
		w.sims = append(w.sims, sim)
		w.fs = append(w.fs, newFixture(t, sim, nil))
	}
	ctx := context.Background()
	var healthyClaims, sickClaims int
	for _, mix := range [][]int{{0, 1, 3}, {0, 2, 4}} {
		rt := t
		w.n++
		k := len(mix)
		type placed struct {
			cluster int
			claim   *hfv1.MachineClaim
			healthy bool
		}
		var claims []placed
		for i := range k {
			h := clusterHealths[mix[i]]
			if err := w.sims[i].SetFaults(h.faults); err != nil {
				rt.Fatal(err)
			}
			for j := range 1 {
				claims = append(claims, placed{cluster: i, healthy: h.name == "healthy",
					claim: w.fs[i].newClaim(fmt.Sprintf("p2-%d-%d", w.n, j))})
			}
		}
		// The healthy clusters' claims run, in parallel, as they would
		// alone.
		var wg sync.WaitGroup
		errs := make(chan error, len(claims))
		for _, c := range claims {
			if !c.healthy {
				sickClaims++
				continue
			}
			healthyClaims++
			wg.Add(1)
			go func() {
				defer wg.Done()
				// A bound on a hang, not a timing assertion. One CI run
				// under make test's load failed a case whose replay then
				// passed, its message lost (proptest now repeats it last);
				// the bounds here and in waitAllReady were doubled since.
				deadline := time.Now().Add(45 * time.Second)
				for {
					got, err := getClaim(w.fs[c.cluster].t, c.claim)
					if err == nil {
						if b := got.Status.Bootstrap; got.Status.Phase == hfv1.MachineClaimBootstrapping && b != nil && b.CredentialDeliveredAt != nil {
							return
						}
					}
					if time.Now().After(deadline) {
						errs <- fmt.Errorf("claim %s/%s on healthy cluster %d not running with its credential after 45 s: %w %+v",
							c.claim.Namespace, c.claim.Name, c.cluster, err, got.Status.Conditions)
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			rt.Fatal(err)
		}
		// Every VM on its own claim's cluster only.
		check := func() {
			for _, c := range claims {
				got, err := getClaim(w.fs[c.cluster].t, c.claim)
				if err != nil {
					rt.Fatal(err)
				}
				if ref := got.Status.VMRef; ref != nil && ref.HypervisorCluster != w.fs[c.cluster].cluster.Name {
					rt.Fatalf("claim %s/%s of cluster %s records its VM on %s", got.Namespace, got.Name, w.fs[c.cluster].cluster.Name, ref.HypervisorCluster)
				}
				for i := range w.sims {
					if vms := w.vmsOf(i, string(got.UID)); i != c.cluster && len(vms) > 0 {
						rt.Fatalf("claim %s/%s of cluster %d has VM %d on cluster %d", got.Namespace, got.Name, c.cluster, vms[0].VMID, i)
					} else if i == c.cluster && len(vms) > 1 {
						rt.Fatalf("claim %s/%s has %d VMs on its cluster", got.Namespace, got.Name, len(vms))
					}
				}
			}
		}
		check()
		for i := range w.sims {
			if err := w.sims[i].SetFaults(proxmoxsim.Faults{}); err != nil {
				rt.Fatal(err)
			}
		}
		w.waitAllReady(rt)
		// Removed: every claim, with its VM, whatever its cluster went
		// through.
		for _, c := range claims {
			if err := env.Client.Delete(ctx, c.claim); err != nil && !apierrors.IsNotFound(err) {
				rt.Fatal(err)
			}
		}
		for _, c := range claims {
			eventually(rt, 60*time.Second, "claim "+c.claim.Namespace+"/"+c.claim.Name+" gone", func() error {
				got, err := getClaim(w.fs[c.cluster].t, c.claim)
				if apierrors.IsNotFound(err) {
					return nil
				}
				return fmt.Errorf("still there: phase %s, conditions %v (%w)", got.Status.Phase, got.Status.Conditions, err)
			})
			for i := range w.sims {
				if vms := w.vmsOf(i, string(c.claim.UID)); len(vms) > 0 {
					rt.Fatalf("claim %s/%s is gone but its VM %d is on cluster %d", c.claim.Namespace, c.claim.Name, vms[0].VMID, i)
				}
			}
		}
		for i := range w.sims {
			_ = w.sims[i].SetFaults(proxmoxsim.Faults{})
		}
	}
	t.Logf("claims: %d on healthy clusters, %d on sick ones", healthyClaims, sickClaims)
}
