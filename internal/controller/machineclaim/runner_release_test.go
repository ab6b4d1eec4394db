package machineclaim

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// TestReleaseWithoutTemplateDoesNotHoldTheClaim: a claim whose VM is gone
// and whose template was deleted (with the credentials that remove its
// runner) does not retry for ten minutes: it gives up at once, and says so
// in its Ending condition and a warning event that point to the orphan
// sweep.
func TestReleaseWithoutTemplateDoesNotHoldTheClaim(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := hfv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	claim := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "runner-1", CreationTimestamp: metav1.NewTime(now)},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: "deleted"}},
		Status: hfv1.MachineClaimStatus{
			Bootstrap: &hfv1.BootstrapStatus{RunnerName: "runner-1-abcd"},
			End:       &hfv1.MachineClaimEnd{Reason: hfv1.EndPoweredOff, StartedAt: metav1.NewTime(now)},
		},
	}
	rec := record.NewFakeRecorder(4)
	// Without its template there is nothing to release the runner with:
	// the CI platforms must not be asked.
	ci := &ciDouble{}
	r := &Reconciler{
		Client: fake.NewClientBuilder().WithScheme(scheme).Build(), CI: ci, Recorder: rec,
		Clock: clocktesting.NewFakeClock(now),
	}
	var done bool
	var requeue time.Duration
	inScope(r, claim, func(s *claimScope) { done, requeue = r.runner().releaseOfGoneVM(context.Background(), s) })
	if !done || requeue != 0 {
		t.Fatalf("Release = %v, %s; want done at once", done, requeue)
	}
	if vars, releases := ci.calls(); vars != 0 || releases != 0 {
		t.Errorf("the CI platforms were asked: %d BootstrapVars, %d Release calls; want none", vars, releases)
	}
	ending := hfv1.FindCondition(claim.Status.Conditions, hfv1.MachineClaimEndingCondition)
	if !hfv1.HasReason(ending, hfv1.RunnerNotRemovedReason) || !strings.Contains(ending.Message, "HypervisorMachineTemplate team-a/deleted") ||
		!strings.Contains(ending.Message, "orphan sweep") {
		t.Errorf("Ending = %+v", ending)
	}
	select {
	case e := <-rec.Events:
		if !strings.HasPrefix(e, "Warning "+string(hfv1.RunnerNotRemovedReason)) || !strings.Contains(e, "runner-1-abcd") {
			t.Errorf("event %q", e)
		}
	default:
		t.Error("no event")
	}
}
