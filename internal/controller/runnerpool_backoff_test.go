package controller_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
)

// TestRunnerPoolReplacementBackoff: a pool whose VMs power off before their
// runner comes online (a broken image) stops replacing them after the
// third failure in a row: ReplacementBackoff is True and names the last
// failure and the next attempt, status.replacementBackoff records it, and
// no fourth claim is created before that time. (The wait is an hour here,
// so nothing about the assertion depends on how fast the machine is; the
// schedule itself is tested on a fake clock in internal/scaling.)
func TestRunnerPoolReplacementBackoff(t *testing.T) {
	w := startPoolWorld(t, poolWorldOptions{backoff: &scaling.Backoff{Threshold: 3, Base: time.Hour, Cap: 2 * time.Hour}})
	pool := w.newPool("crash", func(p *hfv1.RunnerPool) {
		p.Spec.Scaling.MinReplicas = 1
		p.Spec.Lifecycle.History = &hfv1.ClaimHistory{Limit: 20, TTL: &metav1.Duration{Duration: time.Hour}}
	})
	got := w.waitPool(pool, "the pool backing off", 3*time.Minute, func(p *hfv1.RunnerPool) error {
		c := hfv1.FindCondition(p.Status.Conditions, hfv1.RunnerPoolReplacementBackoffCondition)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != string(hfv1.ConsecutiveFailuresReason) {
			return fmt.Errorf("ReplacementBackoff %+v", c)
		}
		return nil
	})
	rb := got.Status.ReplacementBackoff
	if rb == nil || rb.ConsecutiveFailures != 3 || rb.LastFailureTime == nil || rb.NextAttemptTime == nil ||
		!rb.NextAttemptTime.Equal(&metav1.Time{Time: rb.LastFailureTime.Add(time.Hour)}) || !strings.Contains(rb.LastFailure, "VMPoweredOff") {
		t.Fatalf("status.replacementBackoff = %+v", rb)
	}
	c := hfv1.FindCondition(got.Status.Conditions, hfv1.RunnerPoolReplacementBackoffCondition)
	for _, want := range []string{"3 claims in a row", "VMPoweredOff", "Next replacement at " + rb.NextAttemptTime.UTC().Format(time.RFC3339)} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("condition message %q lacks %q", c.Message, want)
		}
	}
	if capc := hfv1.FindCondition(got.Status.Conditions, hfv1.RunnerPoolCapacityCondition); capc == nil || capc.Status != metav1.ConditionFalse ||
		capc.Reason != string(hfv1.ConsecutiveFailuresReason) {
		t.Errorf("CapacityAvailable %+v, want False ConsecutiveFailures", capc)
	}
	// The three failed claims are all there is: none was created after them.
	claims := w.claims(pool)
	if len(claims) != 3 {
		t.Fatalf("%d claims (%s), want the 3 that failed", len(claims), w.claimSummary())
	}
	for _, cl := range claims {
		if cl.Status.PhaseTimes == nil || cl.Status.PhaseTimes.Ready != nil || !strings.HasPrefix(cl.Status.TerminationReason, "VMPoweredOff") {
			t.Errorf("claim %s: phase %s, reason %q", cl.Name, cl.Status.Phase, cl.Status.TerminationReason)
		}
	}
	if reasons := poolEventReasons(t, pool); reasons[string(hfv1.RunnerPoolReplacementBackoffCondition)] == 0 {
		t.Errorf("no ReplacementBackoff event on the pool: %v", reasons)
	}
}
