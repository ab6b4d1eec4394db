//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
)

// The load figures' world: loadClusters more clusters with a pool each of
// at most loadPerPool VMs, all asked for at once.
const (
	loadClusters = 10
	loadPerPool  = 6
)

// loadFigures are the design's load figures, measured after the churn.
type loadFigures struct {
	clusters, perCycle int
	// peakClaims and peakVMs are the most claims and VMs seen at once.
	peakClaims, peakVMs int
	cycles              []loadCycle
	// replicaExits counts replicas that exited on their own during the
	// cycles (a lease lost under the load) and were restarted.
	replicaExits int
}

// loadCycle is one scale-up and scale-down.
type loadCycle struct {
	// up is from queueing the jobs until every one started; done until
	// every one completed; down until no claim of the load pools is left.
	up, done, down time.Duration
	peakClaims     int
}

// measureLoad adds the load clusters and pools and runs cycles (CHAOS_LOAD)
// of loadClusters*loadPerPool jobs queued at once, each to completion and
// back to zero claims. The replicas are supervised as during the churn: a
// replica that exits on its own (a lease it could not renew in time on a
// saturated machine) is restarted, as the kubelet does; without it, both
// replicas once exited in the third cycle and the cycle waited for nothing.
func measureLoad(ctx context.Context, t *testing.T, r *churn) *loadFigures {
	c := r.c
	exitsBefore := r.unplanned
	lf := &loadFigures{clusters: loadClusters, perCycle: loadClusters * loadPerPool}
	defer func() { lf.replicaExits = r.unplanned - exitsBefore }()
	var labels []string
	for i := range loadClusters {
		name := fmt.Sprintf("load-%02d", i)
		start := int32(4000 + 100*i)
		cl, err := c.w.AddCluster(ctx, devenv.ClusterSpec{Name: name, VMIDs: hfv1.VMIDRange{Start: start, End: start + 99}})
		if err != nil {
			t.Fatal(err)
		}
		c.sims[name] = cl.Sim
		spec := devenv.PoolSpec{Name: name, Cluster: name, Label: "chaos-" + name, MaxReplicas: loadPerPool}
		if err := c.w.AddPool(ctx, spec); err != nil {
			t.Fatal(err)
		}
		labels = append(labels, spec.Label)
	}
	for cycle := range envInt("CHAOS_LOAD", 0) {
		var cy loadCycle
		queued := time.Now()
		var ids []int64
		for _, l := range labels {
			got, err := c.w.EnqueueJobsFor(l, loadPerPool, jobDuration)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, got...)
		}
		deadline := time.Now().Add(15 * time.Minute)
		for {
			if time.Now().After(deadline) {
				t.Errorf("load cycle %d: not done within 15 minutes", cycle+1)
				return lf
			}
			started, completed := 0, 0
			for _, id := range ids {
				if j, ok := c.w.GitHub.Job(id); ok {
					if !j.StartedAt.IsZero() {
						started++
					}
					if j.Status == "completed" {
						completed++
					}
				}
			}
			r.superviseReplicas(t)
			claims, vms := c.loadClaimsAndVMs(ctx)
			cy.peakClaims = max(cy.peakClaims, claims)
			lf.peakClaims, lf.peakVMs = max(lf.peakClaims, claims), max(lf.peakVMs, vms)
			if cy.up == 0 && started == len(ids) {
				cy.up = time.Since(queued)
			}
			if cy.done == 0 && completed == len(ids) {
				cy.done = time.Since(queued)
			}
			if cy.done != 0 && claims == 0 {
				cy.down = time.Since(queued) - cy.done
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		t.Logf("load cycle %d: %d jobs on %d clusters: all started after %s, done after %s, back to zero claims %s later (peak %d claims)",
			cycle+1, len(ids), loadClusters, cy.up.Round(100*time.Millisecond), cy.done.Round(100*time.Millisecond), cy.down.Round(100*time.Millisecond), cy.peakClaims)
		lf.cycles = append(lf.cycles, cy)
	}
	return lf
}

// loadClaimsAndVMs counts the claims of the load pools and the VMs on the
// load clusters.
func (c *chaosWorld) loadClaimsAndVMs(ctx context.Context) (claims, vms int) {
	var list hfv1.MachineClaimList
	if err := c.w.API.Client.List(ctx, &list, client.InNamespace(devenv.Namespace)); err == nil {
		for _, cl := range list.Items {
			if ref := cl.Spec.RunnerPoolRef; ref != nil && strings.HasPrefix(ref.Name, "load-") {
				claims++
			}
		}
	}
	for name, sim := range c.sims {
		if !strings.HasPrefix(name, "load-") {
			continue
		}
		for _, vm := range sim.VMs() {
			if !vm.Template {
				vms++
			}
		}
	}
	return claims, vms
}
