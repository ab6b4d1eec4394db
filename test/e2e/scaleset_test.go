//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
)

// TestScaleSetPoolRunsJobs: a RunnerPool that names a runner scale set runs
// jobs with no webhook at all: the repository has none, and the pools'
// resync waits an hour, so the scale set's listener is the only way the
// operator learns of a job. The operator creates the scale set, holds its
// message session, acquires the jobs it is offered and gives each VM a JIT
// configuration of the scale set; each job runs on its own fresh VM, whose
// runner GitHub registered in the scale set, and is recorded once, from
// the listener, under its REST job id. Then the webhook is turned on
// beside the listener: the next jobs reach the operator twice and are
// still recorded once each and run once each.
func TestScaleSetPoolRunsJobs(t *testing.T) {
	w, _ := startWorld(t, func(o *devenv.Options) { o.ResyncInterval = time.Hour })
	ctx := context.Background()
	if err := w.SetGitHubWebhook(false); err != nil {
		t.Fatal(err)
	}
	const pool, label, scaleSet = "scaleset", "scaleset", "hf-e2e"
	if err := w.AddPool(ctx, devenv.PoolSpec{Name: pool, Cluster: devenv.ClusterName, Label: label, MaxReplicas: 3, ScaleSet: scaleSet}); err != nil {
		t.Fatal(err)
	}
	waitPoolVerified(t, w, pool)
	eventually(t, 2*time.Minute, "the pool listening to its scale set", func() error {
		var p hfv1.RunnerPool
		if err := w.API.Client.Get(ctx, client.ObjectKey{Namespace: devenv.Namespace, Name: pool}, &p); err != nil {
			return err
		}
		if !hfv1.IsConditionTrue(p.Status.Conditions, hfv1.RunnerPoolListeningCondition) || p.Status.ScaleSet == nil || p.Status.ScaleSet.ID == 0 {
			return fmt.Errorf("Listening %+v, scaleSet %+v", hfv1.FindCondition(p.Status.Conditions, hfv1.RunnerPoolListeningCondition), p.Status.ScaleSet)
		}
		return nil
	})
	sets := w.GitHub.ScaleSets()
	if len(sets) != 1 || sets[0].Name != scaleSet || sets[0].Session == "" {
		t.Fatalf("scale sets on GitHub: %+v", sets)
	}

	run := func(n int, wantSource map[string]bool) []int64 {
		t.Helper()
		ids, err := w.EnqueueJobsFor(label, n, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		waitJobsEachOnItsVM(t, w, ids)
		for _, id := range ids {
			var cj hfv1.CIJob
			name := hfv1.CIJobName(hfv1.WorkloadGitHubActions, strconv.FormatInt(id, 10))
			if err := w.API.Client.Get(ctx, client.ObjectKey{Namespace: devenv.Namespace, Name: name}, &cj); err != nil {
				t.Fatalf("job %d has no demand record under its REST id: %v", id, err)
			}
			if cj.Spec.RunnerPoolRef.Name != pool || !wantSource[cj.Status.Source] {
				t.Errorf("CIJob %s: pool %s, source %q, want one of %v", name, cj.Spec.RunnerPoolRef.Name, cj.Status.Source, wantSource)
			}
		}
		return ids
	}
	records := func() int {
		t.Helper()
		var all hfv1.CIJobList
		if err := w.API.Client.List(ctx, &all, client.InNamespace(devenv.Namespace), client.MatchingLabels{hfv1.RunnerPoolLabel: pool}); err != nil {
			t.Fatal(err)
		}
		return len(all.Items)
	}

	// No webhook, no resync: the listener alone.
	first := run(3, map[string]bool{"listener": true})
	for _, d := range w.GitHub.Deliveries() {
		if slices.Contains(first, d.JobID) {
			t.Fatalf("a webhook delivery about job %d with no webhook configured: %+v", d.JobID, d)
		}
	}
	if n := records(); n != 3 {
		t.Errorf("%d demand records for 3 jobs", n)
	}
	eventually(t, 3*time.Minute, "the scale-set pool empty again", func() error { return poolLeftovers(ctx, w, pool) })

	// Both sources: each job is recorded once and runs once.
	if err := w.SetGitHubWebhook(true); err != nil {
		t.Fatal(err)
	}
	run(2, map[string]bool{"listener": true, "webhook": true})
	if n := records(); n != 5 {
		t.Errorf("%d demand records for 5 jobs through the scale set", n)
	}
	eventually(t, 3*time.Minute, "the scale-set pool empty again", func() error { return poolLeftovers(ctx, w, pool) })
	if runners := w.GitHub.Runners(); len(runners) != 0 {
		t.Errorf("runners left on GitHub: %+v", runners)
	}
}

// waitJobsEachOnItsVM waits until the GitHub jobs ids completed, each a
// success, and checks that each ran on a runner of its own (a fresh VM).
func waitJobsEachOnItsVM(t *testing.T, w *devenv.World, ids []int64) {
	t.Helper()
	runners := map[string]int64{}
	eventually(t, 6*time.Minute, fmt.Sprintf("%d scale-set jobs done", len(ids)), func() error {
		for _, id := range ids {
			j, _ := w.GitHub.Job(id)
			if j.Status != "completed" {
				return fmt.Errorf("job %d is %s", id, j.Status)
			}
			if j.Conclusion != "success" {
				t.Fatalf("job %d concluded %s", id, j.Conclusion)
			}
			runners[j.RunnerName] = id
		}
		return nil
	})
	if len(runners) != len(ids) {
		t.Fatalf("%d jobs ran on %d runners, want one fresh VM each: %v", len(ids), len(runners), runners)
	}
}
