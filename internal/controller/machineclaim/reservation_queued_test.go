package machineclaim

import (
	"context"
	"slices"
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestQueuedReservationIsOneWrite: a claim placed while its node's one
// clone slot is taken stores its reservation with the Queued reason its
// clone then reports (provider.EnsureResult.Waits), so that waiting costs
// no status write of its own: its stored Provisioned reasons go Queued,
// BuildingVM (its clone started), Ready, never BuildingVM before Queued.
//
// Mutation: recording BuildingVM in the reservation whatever Waits says
// (vm.go's ensureVM) fails it: the stored reasons start BuildingVM,
// Queued.
func TestQueuedReservationIsOneWrite(t *testing.T) {
	w := newSimWorld(t, simOptions{provider: func(c *provider.ClusterConfig) { c.ClonesPerNode = 1 }})
	first := w.newClaim("runner-1")
	w.runUntil(first, "its clone under way", func(c *hfv1.MachineClaim) bool {
		return c.Status.VMRef != nil && len(w.clonesSent()) == 1
	})
	second := w.newClaim("runner-2")
	var stored []string
	lastRV := ""
	for pass := 0; pass < maxPasses && !provisioned(w.claim(second)); pass++ {
		step := time.Minute
		for _, c := range []*hfv1.MachineClaim{first, second} {
			res, err := w.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(c)})
			if err != nil {
				t.Logf("pass %d of %s: %v", pass, c.Name, err)
			}
			if res.RequeueAfter > 0 {
				step = min(step, res.RequeueAfter)
			}
		}
		if got := w.claim(second); got.ResourceVersion != lastRV {
			lastRV = got.ResourceVersion
			if cond := hfv1.FindCondition(got.Status.Conditions, hfv1.MachineClaimProvisionedCondition); cond != nil && (len(stored) == 0 || stored[len(stored)-1] != cond.Reason) {
				stored = append(stored, cond.Reason)
			}
		}
		w.advance(step)
	}
	want := []string{string(hfv1.QueuedReason), string(hfv1.BuildingVMReason), string(hfv1.ReadyReason)}
	if !slices.Equal(stored, want) {
		t.Errorf("the second claim's stored Provisioned reasons: %v, want %v", stored, want)
	}
}
