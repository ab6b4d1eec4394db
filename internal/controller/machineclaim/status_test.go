package machineclaim

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
)

// TestReadyAndPhase: Ready and the phase follow from the facts alone, in
// the order a claim records them.
func TestReadyAndPhase(t *testing.T) {
	set := func(c *hfv1.MachineClaim, typ hfv1.ConditionType, status metav1.ConditionStatus, reason hfv1.ConditionReason) {
		conditions.Set(&c.Status.Conditions, c.Generation, typ, status, reason, string(reason))
	}
	tests := []struct {
		name       string
		facts      func(c *hfv1.MachineClaim)
		wantPhase  hfv1.MachineClaimPhase
		wantReady  metav1.ConditionStatus
		wantReason hfv1.ConditionReason
	}{
		{"new", func(*hfv1.MachineClaim) {}, hfv1.MachineClaimPending, metav1.ConditionFalse, hfv1.ReconcilingReason},
		{"cloning", func(c *hfv1.MachineClaim) {
			c.Status.VMRef = &hfv1.VMReference{VMID: 100}
			set(c, hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.CloningReason)
		}, hfv1.MachineClaimProvisioning, metav1.ConditionFalse, hfv1.CloningReason},
		{"up, runner not yet online", func(c *hfv1.MachineClaim) {
			set(c, hfv1.MachineClaimProvisionedCondition, metav1.ConditionTrue, hfv1.ReadyReason)
		}, hfv1.MachineClaimBootstrapping, metav1.ConditionFalse, hfv1.WaitingForRunnerReason},
		{"up, not attested", func(c *hfv1.MachineClaim) {
			set(c, hfv1.MachineClaimProvisionedCondition, metav1.ConditionTrue, hfv1.ReadyReason)
			set(c, hfv1.MachineClaimAttestedCondition, metav1.ConditionFalse, hfv1.AttestationPendingReason)
		}, hfv1.MachineClaimBootstrapping, metav1.ConditionFalse, hfv1.AttestationPendingReason},
		{"runner online", func(c *hfv1.MachineClaim) {
			set(c, hfv1.MachineClaimProvisionedCondition, metav1.ConditionTrue, hfv1.ReadyReason)
			set(c, hfv1.MachineClaimBootstrappedCondition, metav1.ConditionTrue, hfv1.RunnerOnlineReason)
		}, hfv1.MachineClaimReady, metav1.ConditionTrue, hfv1.ReadyReason},
		{"draining", func(c *hfv1.MachineClaim) {
			set(c, hfv1.MachineClaimProvisionedCondition, metav1.ConditionTrue, hfv1.ReadyReason)
			set(c, hfv1.MachineClaimBootstrappedCondition, metav1.ConditionTrue, hfv1.RunnerOnlineReason)
			SetEnding(c, hfv1.RunnerBusyReason, "busy")
		}, hfv1.MachineClaimDraining, metav1.ConditionFalse, hfv1.RunnerBusyReason},
		{"failed", func(c *hfv1.MachineClaim) {
			c.Status.End = &hfv1.MachineClaimEnd{Reason: hfv1.EndFailed, Failed: true}
			SetEnding(c, hfv1.ProvisioningFailedReason, "failed")
		}, hfv1.MachineClaimFailed, metav1.ConditionFalse, hfv1.ProvisioningFailedReason},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &hfv1.MachineClaim{}
			tc.facts(c)
			SummariseReady(c)
			ready := hfv1.FindCondition(c.Status.Conditions, hfv1.ReadyCondition)
			if got := PhaseOf(c); got != tc.wantPhase || ready == nil || ready.Status != tc.wantReady || ready.Reason != string(tc.wantReason) {
				t.Fatalf("phase %s, Ready %+v; want %s, Ready=%s %s", got, ready, tc.wantPhase, tc.wantReady, tc.wantReason)
			}
		})
	}
}
