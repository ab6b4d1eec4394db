package controller

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// TestScaleDownSparesARunnerARecordNames: a pool of two idle claims, no
// queued job, its scale-down delay (5 minutes) over and neither claim near
// its idleTimeout, whose job record says that one claim's runner took a
// job the claim has not recorded yet (the record is written first, the
// claim catches up on its next pass). That claim is busy for the pool:
// the scale-down ends the other one only, and the pool wants one VM, not
// none.
//
// Mutation: takenToBusy not moving the claim (the pool counting it idle)
// fails this test (both claims ended, desired 0); the old tests passed it.
func TestScaleDownSparesARunnerARecordNames(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pool := poolWorldPool(0, 5)
	pool.Status.LowDemandSince = &metav1.Time{Time: t0}
	online := metav1.NewTime(t0)
	working, spare := poolWorldClaim(pool, "runners-a", t0), poolWorldClaim(pool, "runners-b", t0.Add(time.Second))
	setOnline(working, online)
	setOnline(spare, online)
	job := poolWorldJob(7, hfv1.CIJobInProgress, t0)
	job.Status.RunnerName = working.Name
	w := newPoolWorld(t, t0.Add(10*time.Minute), pool, working, spare, job)
	w.pass()

	for name, c := range w.claims() {
		switch ended := c.Spec.End != nil; {
		case name == working.Name && ended:
			t.Errorf("claim %s, whose runner took job 7, was asked to end: %+v", name, c.Spec.End)
		case name == spare.Name && !ended:
			t.Errorf("idle claim %s was not scaled down", name)
		}
	}
	var got hfv1.RunnerPool
	if err := w.c.Get(w.ctx(), client.ObjectKeyFromObject(pool), &got); err != nil {
		t.Fatal(err)
	}
	if st := got.Status; st.DesiredReplicas != 1 || st.BusyReplicas != 1 || st.PendingJobs != 0 {
		t.Errorf("status: desired %d, busy %d, pending %d; want 1, 1, 0", st.DesiredReplicas, st.BusyReplicas, st.PendingJobs)
	}
}
