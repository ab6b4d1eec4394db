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
	secondWaitsForFirst(t, func(c *hfv1.HypervisorCluster) {
		c.Spec.Limits = &hfv1.HypervisorLimits{MaxMachines: ptr.To[int32](1)}
	}, hfv1.MaxMachinesReachedReason, "spec.limits.maxMachines (1)")
}

// TestClaimsWaitForNamespaceQuota: with spec.tenancy[0].limits.machines 1
// a second claim of the namespace gets no VM and says why (QuotaExceeded,
// naming the limit); deleting the first claim wakes it through the watch
// on its namespace's claims, well before its 5-minute recheck.
func TestClaimsWaitForNamespaceQuota(t *testing.T) {
	secondWaitsForFirst(t, func(c *hfv1.HypervisorCluster) {
		c.Spec.AllowedNamespaces = tenantSelector.DeepCopy()
		c.Spec.Tenancy = []hfv1.TenancyRule{{
			NamespaceSelector: *tenantSelector.DeepCopy(),
			Templates:         []hfv1.AllowedTemplate{{ID: ptr.To[int32](9000)}},
			Bridges:           []string{"vmbr0"},
			Storages:          []string{"local-lvm"},
			Limits:            &hfv1.TenantLimits{Machines: ptr.To[int32](1)},
		}}
	}, hfv1.QuotaExceededReason, "spec.tenancy[0].limits.machines of HypervisorCluster")
}

// secondWaitsForFirst runs two claims on a cluster mutate limits to one
// VM: the second gets no VM and waits with reason, its message holding
// fragment; once the first claim is deleted, the second gets its VM.
func secondWaitsForFirst(t *testing.T, mutate func(*hfv1.HypervisorCluster), reason hfv1.ConditionReason, fragment string) {
	t.Helper()
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, mutate)
	first := waitPhase(t, f.newClaim("first"), hfv1.MachineClaimBootstrapping, 60*time.Second)
	second := f.newClaim("second")
	eventually(t, 30*time.Second, "second claim waits: "+string(reason), func() error {
		got, err := getClaim(t, second)
		if err != nil {
			return err
		}
		c := hfv1.FindCondition(got.Status.Conditions, hfv1.MachineClaimProvisionedCondition)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != string(reason) || !strings.Contains(c.Message, fragment) {
			return fmt.Errorf("Provisioned = %+v", c)
		}
		if got.Status.VMRef != nil {
			return fmt.Errorf("the second claim has VM %+v", got.Status.VMRef)
		}
		return nil
	})
	if vms := operatorVMs(sim); len(vms) != 1 {
		t.Fatalf("%d operator VMs under a limit of one: %+v", len(vms), vms)
	}
	if err := env.Client.Delete(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, second, hfv1.MachineClaimBootstrapping, 90*time.Second)
}
