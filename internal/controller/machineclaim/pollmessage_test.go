package machineclaim

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestPollMessageKeepsTheTaskStartMessage: a pass that only polls the task
// the claim records keeps the message that task's start wrote (no status
// write of its own); a new task, a new reason or a new VM takes the
// provider's message.
//
// Mutation: pollMessage returning msg always (the provider's "waiting for
// the clone task") fails this test; the old tests passed it, and the claim
// wrote its status once more per Proxmox task.
func TestPollMessageKeepsTheTaskStartMessage(t *testing.T) {
	claim := &hfv1.MachineClaim{}
	claim.Status.Conditions = []metav1.Condition{{Type: string(hfv1.MachineClaimProvisionedCondition), Status: metav1.ConditionFalse,
		Reason: string(hfv1.CloningReason), Message: "cloning debian to VM 1000 on node pve1"}}
	clone := provider.Progress{ID: "1000", Task: &provider.Task{ID: "UPID:clone", Operation: "clone"}}
	upload := provider.Progress{ID: "1000", Task: &provider.Task{ID: "UPID:upload", Operation: "upload"}}
	other := provider.Progress{ID: "1001", Task: &provider.Task{ID: "UPID:clone", Operation: "clone"}}
	const polled = "waiting for the clone task"
	for name, tc := range map[string]struct {
		reason     hfv1.ConditionReason
		prev, next provider.Progress
		want       string
	}{
		"a poll of the same task": {hfv1.CloningReason, clone, clone, "cloning debian to VM 1000 on node pve1"},
		"the next task":           {hfv1.CloningReason, clone, upload, polled},
		"another reason":          {hfv1.ConfiguringReason, clone, clone, polled},
		"another VM":              {hfv1.CloningReason, clone, other, polled},
		"no task recorded before": {hfv1.CloningReason, provider.Progress{ID: "1000"}, clone, polled},
		"no task after this pass": {hfv1.CloningReason, clone, provider.Progress{ID: "1000"}, polled},
	} {
		t.Run(name, func(t *testing.T) {
			if got := pollMessage(claim, hfv1.MachineClaimProvisionedCondition, tc.reason, tc.prev, tc.next, polled); got != tc.want {
				t.Errorf("message %q, want %q", got, tc.want)
			}
		})
	}
}
