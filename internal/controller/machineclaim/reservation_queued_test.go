package machineclaim

import (
	"context"
	"strings"
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestQueuedReservationIsOneWrite: a claim placed while its node's one
// clone slot is taken stores its reservation with the build's one
// condition, BuildingVM, whose message says that its clone had to wait
// and why (provider.EnsureResult.Waits), so that neither the wait nor the
// clone's start after it costs a status write of its own: its stored
// Provisioned condition is that, then Ready, and nothing in between.
//
// Mutations: recording the Queued reason when the queued clone reports
// the wait its placement foresaw (vm.go's ensureVM) fails it (BuildingVM,
// Queued, BuildingVM, Ready); so does a build step that writes the plain
// building message over the one that names the wait (BuildingVM twice);
// so does a reservation whose message leaves the wait out.
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
			if cond := hfv1.FindCondition(got.Status.Conditions, hfv1.MachineClaimProvisionedCondition); cond != nil {
				if s := cond.Reason + ": " + cond.Message; len(stored) == 0 || stored[len(stored)-1] != s {
					stored = append(stored, s)
				}
			}
		}
		w.advance(step)
	}
	if len(stored) != 2 || !strings.HasPrefix(stored[0], string(hfv1.BuildingVMReason)+": ") || !strings.Contains(stored[0], queuedNote+"waiting for a clone slot") ||
		!strings.HasPrefix(stored[1], string(hfv1.ReadyReason)+": ") {
		t.Errorf("the second claim's stored Provisioned conditions:\n%s\nwant BuildingVM naming the clone's wait for a slot, then Ready", strings.Join(stored, "\n"))
	}
}
