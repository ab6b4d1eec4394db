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
func (w *multiWorld) waitAllReady(t *rapid.T) {
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
		within(t, 30*time.Second, "cluster "+f.cluster.Name+" Ready again", func() error {
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

// Feature: hyperfleet-operator, Property 2: Multi-Hypervisor Support
//
// TestMultiHypervisorProperty: with two to four HypervisorClusters, each
// its own Proxmox simulator, and a generated health per cluster (healthy,
// its clone requests failing, its writes slow, half its requests dropped,
// or down), one or two claims on each: every claim on a healthy cluster
// runs with its credential delivered as it would alone, and every VM is
// on its own claim's cluster and on no other; once the faults stop,
// every claim is removed with its VM.
func TestMultiHypervisorProperty(t *testing.T) {
	longScenario(t)
	startOperator(t, operatorOptions{maxRetryDelay: time.Second})
	w := &multiWorld{}
	for range 4 {
		sim := startSim(t, func(c *proxmoxsim.Config) {
			c.Latency = propertyLatency()
			c.RefreshInterval = proxmoxsim.Duration(100 * time.Millisecond)
		})
		w.sims = append(w.sims, sim)
		w.fs = append(w.fs, newFixture(t, sim, nil))
	}
	ctx := context.Background()
	var healthyClaims, sickClaims int
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		w.n++
		k := rapid.IntRange(2, 4).Draw(rt, "clusters")
		type placed struct {
			cluster int
			claim   *hfv1.MachineClaim
			healthy bool
		}
		var claims []placed
		defer func() {
			for i := range w.sims {
				_ = w.sims[i].SetFaults(proxmoxsim.Faults{})
			}
		}()
		for i := range k {
			h := clusterHealths[0]
			if rapid.Bool().Draw(rt, fmt.Sprintf("cluster %d sick", i)) {
				h = rapid.SampledFrom(clusterHealths[1:]).Draw(rt, fmt.Sprintf("cluster %d", i))
			}
			if err := w.sims[i].SetFaults(h.faults); err != nil {
				rt.Fatal(err)
			}
			for j := range rapid.IntRange(1, 2).Draw(rt, fmt.Sprintf("claims on cluster %d", i)) {
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
			within(rt, 60*time.Second, "claim "+c.claim.Namespace+"/"+c.claim.Name+" gone", func() error {
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
	})
	t.Logf("claims: %d on healthy clusters, %d on sick ones", healthyClaims, sickClaims)
	if total := healthyClaims + sickClaims; healthyClaims*4 < total || sickClaims*4 < total {
		t.Errorf("the generator made %d claims on healthy clusters and %d on sick ones; want a quarter of each at least", healthyClaims, sickClaims)
	}
}
