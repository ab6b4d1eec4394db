package controller_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// TestRunnerPoolScaleSet: a pool naming a runner scale set gets its jobs
// from the scale set's listener alone (no webhook, no resync within the
// test): Listening turns True with the scale set's id, each job is
// recorded from the listener under its REST job id and runs on a VM of
// its own registered in the scale set, and the pool drains afterwards. A
// second pool naming the same scale set is refused (ScaleSetInUse) and
// builds no VM.
func TestRunnerPoolScaleSet(t *testing.T) {
	w := startPoolWorld(t, poolWorldOptions{resyncInterval: time.Hour})
	for _, h := range w.gs.Sim.Webhooks() {
		w.gs.Sim.RemoveWebhook(h.ID)
	}
	scaleSet := &hfv1.GitHubScaleSet{Name: "hf-envtest"}
	pool := w.newPool("scaleset", func(p *hfv1.RunnerPool) { p.Spec.Workload.GitHub.ScaleSet = scaleSet })
	listening := w.waitPool(pool, "the pool listening to its scale set", time.Minute, func(p *hfv1.RunnerPool) error {
		c := hfv1.FindCondition(p.Status.Conditions, hfv1.RunnerPoolListeningCondition)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != string(hfv1.ListeningReason) || p.Status.ScaleSet == nil || p.Status.ScaleSet.ID == 0 ||
			p.Status.ScaleSet.ListeningSince == nil {
			return fmt.Errorf("Listening %+v, scaleSet %+v", c, p.Status.ScaleSet)
		}
		return nil
	})
	sets := w.gs.Sim.ScaleSets()
	if len(sets) != 1 || sets[0].ID != listening.Status.ScaleSet.ID || sets[0].Name != scaleSet.Name || sets[0].Session == "" {
		t.Fatalf("scale sets on GitHub: %+v (pool status %+v)", sets, listening.Status.ScaleSet)
	}

	ids := w.enqueue("scaleset", 2, time.Second)
	jobs := w.waitJobs(ids, 3*time.Minute)
	runners := map[string]bool{}
	for _, j := range jobs {
		runners[j.RunnerName] = true
	}
	if len(runners) != len(ids) {
		t.Fatalf("%d jobs ran on runners %v: want one fresh VM each", len(ids), runners)
	}
	// The job's completion reaches the CIJob through the listener's next
	// message (JobCompleted), which may come after GitHub shows the job
	// completed and after its VM is gone: wait for it.
	for _, id := range ids {
		key := client.ObjectKey{Namespace: pool.Namespace, Name: hfv1.CIJobName(hfv1.WorkloadGitHubActions, strconv.FormatInt(id, 10))}
		eventually(t, time.Minute, "CIJob "+key.Name+" completed from the listener", func() error {
			var cj hfv1.CIJob
			if err := env.Client.Get(context.Background(), key, &cj); err != nil {
				return fmt.Errorf("job %d: no CIJob under its REST id: %w", id, err)
			}
			if cj.Status.Source != "listener" || cj.Spec.RunnerPoolRef.Name != pool.Name || cj.Status.State != hfv1.CIJobCompleted {
				return fmt.Errorf("CIJob %s: source %q, pool %s, state %s", key.Name, cj.Status.Source, cj.Spec.RunnerPoolRef.Name, cj.Status.State)
			}
			return nil
		})
	}
	w.assertDrained(pool, 2*time.Minute)

	// minReplicas 1: an ordinary pool would build a VM at once.
	twin := w.newPool("twin", func(p *hfv1.RunnerPool) {
		p.Spec.Workload.GitHub.ScaleSet, p.Spec.Scaling.MinReplicas = scaleSet.DeepCopy(), 1
	})
	w.waitPool(twin, "the younger pool refused", time.Minute, func(p *hfv1.RunnerPool) error {
		l := hfv1.FindCondition(p.Status.Conditions, hfv1.RunnerPoolListeningCondition)
		c := hfv1.FindCondition(p.Status.Conditions, hfv1.RunnerPoolCapacityCondition)
		if l == nil || l.Reason != string(hfv1.ScaleSetInUseReason) || c == nil || c.Status != metav1.ConditionFalse || c.Reason != string(hfv1.ScaleSetInUseReason) {
			return fmt.Errorf("Listening %+v, CapacityAvailable %+v", l, c)
		}
		return nil
	})
	if c := hfv1.FindCondition(w.pool(pool).Status.Conditions, hfv1.RunnerPoolListeningCondition); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("the older pool stopped listening: %+v", c)
	}
	if n := len(w.claims(twin)); n != 0 {
		t.Errorf("the refused pool made %d claims", n)
	}
}
