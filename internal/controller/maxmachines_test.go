package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// TestClaimsWaitForMaxMachines: with spec.limits.maxMachines 1 a second
// claim gets no VM and says why (MaxMachinesReached, naming the field);
// once the first claim's VM is deleted, the second gets its VM.
func TestClaimsWaitForMaxMachines(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, func(c *hfv1.HypervisorCluster) {
		c.Spec.Limits = &hfv1.HypervisorLimits{MaxMachines: ptr.To[int32](1)}
	})
	first := waitPhase(t, f.newClaim("first"), hfv1.MachineClaimBootstrapping, 60*time.Second)
	second := f.newClaim("second")
	eventually(t, 30*time.Second, "second claim waits for maxMachines", func() error {
		got, err := getClaim(t, second)
		if err != nil {
			return err
		}
		c := hfv1.FindCondition(got.Status.Conditions, hfv1.MachineClaimProvisionedCondition)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != string(hfv1.MaxMachinesReachedReason) || !strings.Contains(c.Message, "spec.limits.maxMachines (1)") {
			return fmt.Errorf("Provisioned = %+v", c)
		}
		if got.Status.VMRef != nil {
			return fmt.Errorf("the second claim has VM %+v", got.Status.VMRef)
		}
		return nil
	})
	if vms := operatorVMs(sim); len(vms) != 1 {
		t.Fatalf("%d operator VMs with maxMachines 1: %+v", len(vms), vms)
	}
	if err := env.Client.Delete(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, second, hfv1.MachineClaimBootstrapping, 90*time.Second)
}
