package controller

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// TestPoolReasonReplacesPowerOff: a pool's termination request that arrives
// after shutdown detection ended the claim (its job cancellation powered
// the VM off) becomes the claim's reason; any other recorded reason stays.
func TestPoolReasonReplacesPowerOff(t *testing.T) {
	const poolReason = "job_timeout: job 7 ran longer than spec.lifecycle.jobTimeout (1m0s); job 7 was cancelled first"
	for _, tc := range []struct {
		phase      hfv1.MachineClaimPhase
		before     string
		conclusion string
		want       string
	}{
		{hfv1.MachineClaimTerminating, vmPoweredOffReason + ": VM 1002 powered off", "", poolReason},
		{hfv1.MachineClaimFinished, vmPoweredOffReason + ": VM 1002 powered off", "", poolReason},
		{hfv1.MachineClaimFinished, "job_completed: job 6 finished (success)", "success", "job_completed: job 6 finished (success)"},
		// The pool's own cancellation reached the claim as the job's end.
		{hfv1.MachineClaimTerminating, "job_completed: job 7 finished (cancelled)", "cancelled", poolReason},
		{hfv1.MachineClaimFailed, vmPoweredOffReason + ": VM 1002 powered off before it was ready", "", vmPoweredOffReason + ": VM 1002 powered off before it was ready"},
	} {
		claim := &hfv1.MachineClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "c", Annotations: map[string]string{hfv1.TerminationReasonAnnotation: poolReason}},
			Status:     hfv1.MachineClaimStatus{Phase: tc.phase, TerminationReason: tc.before, Bootstrap: &hfv1.BootstrapStatus{JobConclusion: tc.conclusion}},
		}
		_, handled, err := (&MachineClaimReconciler{}).requestedTermination(context.Background(), claim)
		if handled || err != nil {
			t.Errorf("%s: handled %v, err %v; a claim that is already ending needs nothing more", tc.phase, handled, err)
		}
		if claim.Status.TerminationReason != tc.want {
			t.Errorf("%s with %q: terminationReason %q, want %q", tc.phase, tc.before, claim.Status.TerminationReason, tc.want)
		}
	}
}
