package machineclaim

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// TestPoolReasonReplacesPowerOff: a pool's hard-limit request that arrives
// after shutdown detection ended the claim (its job cancellation powered
// the VM off) becomes the claim's reason; any other recorded reason stays.
func TestPoolReasonReplacesPowerOff(t *testing.T) {
	const msg = "job 7 ran longer than spec.lifecycle.jobTimeout (1m0s); job 7 was cancelled first"
	poolReason := string(hfv1.EndJobTimeout) + ": " + msg
	poweredOff := &hfv1.MachineClaimEnd{Reason: hfv1.EndPoweredOff, Message: "VM 1002 powered off"}
	finished := func(e hfv1.MachineClaimEnd) *hfv1.MachineClaimEnd {
		e.FinishedAt = &metav1.Time{}
		return &e
	}
	for _, tc := range []struct {
		name       string
		end        *hfv1.MachineClaimEnd
		before     string
		conclusion string
		want       string
		wantReason hfv1.EndReason
	}{
		{"terminating after power-off", poweredOff, "VMPoweredOff: VM 1002 powered off", "", poolReason, hfv1.EndJobTimeout},
		{"finished after power-off", finished(*poweredOff), "VMPoweredOff: VM 1002 powered off", "", poolReason, hfv1.EndJobTimeout},
		{"finished after a successful job", finished(hfv1.MachineClaimEnd{Reason: hfv1.EndJobCompleted}), "job_completed: job 6 finished (success)", "success",
			"job_completed: job 6 finished (success)", hfv1.EndJobCompleted},
		// The pool's own cancellation reached the claim as the job's end.
		{"job cancelled by the pool", &hfv1.MachineClaimEnd{Reason: hfv1.EndJobCompleted}, "job_completed: job 7 finished (cancelled)", "cancelled", poolReason, hfv1.EndJobTimeout},
		{"failed", &hfv1.MachineClaimEnd{Reason: hfv1.EndPoweredOff, Failed: true}, "VMPoweredOff: VM 1002 powered off before it was ready", "",
			"VMPoweredOff: VM 1002 powered off before it was ready", hfv1.EndPoweredOff},
	} {
		claim := &hfv1.MachineClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "c"},
			Spec:       hfv1.MachineClaimSpec{End: &hfv1.MachineClaimEndRequest{Reason: hfv1.EndJobTimeout, Message: msg}},
			Status:     hfv1.MachineClaimStatus{End: tc.end, TerminationReason: tc.before, Bootstrap: &hfv1.BootstrapStatus{JobConclusion: tc.conclusion}},
		}
		(&Reconciler{}).replaceCause(claim)
		if claim.Status.TerminationReason != tc.want || claim.EndReason() != tc.wantReason {
			t.Errorf("%s: terminationReason %q (reason %s), want %q (%s)", tc.name, claim.Status.TerminationReason, claim.EndReason(), tc.want, tc.wantReason)
		}
	}
}
