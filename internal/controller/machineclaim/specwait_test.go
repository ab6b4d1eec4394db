package machineclaim

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestNewVMsWaitForTheClusterSpec: a claim still to be placed does not
// use a provider connected from an earlier generation of its cluster's
// spec (a lowered spec.limits.maxMachines, a node removed from the
// allowed nodes): it waits, saying so, until the cluster's controller has
// applied the change (status.observedGeneration caught up); a claim whose
// VM runs goes on, and so does a cluster never reconciled (it is not
// connected, which loadProvider says first).
func TestNewVMsWaitForTheClusterSpec(t *testing.T) {
	const name = "pve-a"
	reg := hypervisors.NewRegistry()
	connected := struct{ provider.Provider }{}
	if _, err := reg.Connect(name, provider.ClusterConfig{Name: name}, func() (provider.Provider, error) { return connected, nil }); err != nil {
		t.Fatal(err)
	}
	reg.SetHealth(name, hypervisors.Health{Ready: true}, time.Now())
	r := &Reconciler{Registry: reg}
	for _, tc := range []struct {
		name             string
		generation, seen int64
		placed           bool
		wantWait         bool
	}{
		{name: "a spec change not applied yet holds a new VM", generation: 3, seen: 2, wantWait: true},
		{name: "an applied spec lets it through", generation: 3, seen: 3},
		{name: "a running VM goes on", generation: 3, seen: 2, placed: true},
		{name: "a cluster never reconciled is judged by its connection", generation: 1, seen: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claim := unitClaim("c", time.Minute)
			if tc.placed {
				claim.Status.VMRef = hfv1.NewVMReference(name, "100", "pve1")
			}
			cluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Generation: tc.generation},
				Status: hfv1.HypervisorClusterStatus{ObservedGeneration: tc.seen}}
			var res phase.Result
			inScope(r, &claim, func(s *claimScope) {
				s.cluster = cluster
				var err error
				if res, err = r.loadProvider(context.Background(), s); err != nil {
					t.Fatal(err)
				}
				if got := s.provider != nil; got == tc.wantWait {
					t.Errorf("provider loaded %v, want %v", got, !tc.wantWait)
				}
			})
			c := hfv1.FindCondition(claim.Status.Conditions, hfv1.MachineClaimProvisionedCondition)
			if !tc.wantWait {
				if res.Stopped() {
					t.Errorf("the pass stopped: %+v", res)
				}
				if c != nil && c.Reason == string(hfv1.ClusterUnavailableReason) {
					t.Errorf("Provisioned %s: %s", c.Reason, c.Message)
				}
				return
			}
			if !res.Stopped() || res.After() != specCatchUp {
				t.Errorf("result %+v, want a stop and a look again in %s", res, specCatchUp)
			}
			if c == nil || c.Status != metav1.ConditionFalse || c.Reason != string(hfv1.ClusterUnavailableReason) ||
				!strings.Contains(c.Message, "generation 3") || !strings.Contains(c.Message, "status.observedGeneration 2") {
				t.Errorf("Provisioned %+v", c)
			}
		})
	}
}
