package controller_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/demandtest"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
)

// The demand contract (internal/testworld/demandtest) for each way a
// GitHub pool learns of jobs, in a world whose resync waits an hour, so
// that the source under test is the only one.

// TestDemandContractWebhook: workflow_job webhooks.
func TestDemandContractWebhook(t *testing.T) {
	w := startPoolWorld(t, poolWorldOptions{resyncInterval: time.Hour})
	pool := w.newPool("hooked", nil)
	demandtest.Run(t, demandHarness(w, pool, []string{"webhook"}, func(t *testing.T, id string) {
		n, _ := strconv.ParseInt(id, 10, 64)
		var last string
		for _, d := range w.gs.Sim.Deliveries() {
			if d.JobID == n && !d.Redelivery {
				last = d.ID
			}
		}
		if last == "" {
			t.Fatalf("job %s had no webhook delivery", id)
		}
		if _, err := w.gs.Sim.Redeliver(last); err != nil {
			t.Fatal(err)
		}
	}))
}

// TestDemandContractListener: a runner scale set's listener, with no
// webhook.
func TestDemandContractListener(t *testing.T) {
	w := startPoolWorld(t, poolWorldOptions{resyncInterval: time.Hour})
	for _, h := range w.gs.Sim.Webhooks() {
		w.gs.Sim.RemoveWebhook(h.ID)
	}
	pool := w.newPool("listened", func(p *hfv1.RunnerPool) { p.Spec.Workload.GitHub.ScaleSet = &hfv1.GitHubScaleSet{Name: "hf-contract"} })
	w.waitPool(pool, "the pool listening", time.Minute, func(p *hfv1.RunnerPool) error {
		if c := hfv1.FindCondition(p.Status.Conditions, hfv1.RunnerPoolListeningCondition); c == nil || c.Status != "True" {
			return fmt.Errorf("Listening %+v", c)
		}
		return nil
	})
	demandtest.Run(t, demandHarness(w, pool, []string{"listener"}, func(t *testing.T, id string) {
		n, _ := strconv.ParseInt(id, 10, 64)
		if err := w.gs.Sim.RepeatScaleSetMessages(n); err != nil {
			t.Fatal(err)
		}
	}))
}

// demandHarness is the contract's harness for pool in w: jobs carrying the
// pool's label, which its VMs run.
func demandHarness(w *poolWorld, pool *hfv1.RunnerPool, sources []string, repeat func(*testing.T, string)) demandtest.Harness {
	queue := func(t *testing.T, label string) string {
		t.Helper()
		j, err := w.gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted", label}, Duration: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return strconv.FormatInt(j.ID, 10)
	}
	return demandtest.Harness{
		Reader:        env.Client,
		Pool:          types.NamespacedName{Namespace: pool.Namespace, Name: pool.Name},
		Platform:      hfv1.WorkloadGitHubActions,
		Sources:       sources,
		Queue:         func(t *testing.T) string { return queue(t, pool.Name) },
		QueueUnserved: func(t *testing.T) string { return queue(t, "no-pool-has-this-label") },
		Repeat:        repeat,
	}
}
