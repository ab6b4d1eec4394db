package controller

import (
	"testing"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/poolclaims"
)

// TestDemandPendingCountsABusyRunnerOnce: a claim whose runner the runner
// list shows busy before the job's record moves to in_progress records no
// job; the job is then still a pending record, and scaling counts it once
// (busy), not twice. A busy claim that records its job takes nothing off
// the pending records (its job's record is no longer queued).
func TestDemandPendingCountsABusyRunnerOnce(t *testing.T) {
	queued := func(id string) *hfv1.CIJob {
		j := &hfv1.CIJob{Spec: hfv1.CIJobSpec{Platform: hfv1.WorkloadGitHubActions}, Status: hfv1.CIJobStatus{State: hfv1.CIJobQueued}}
		j.Spec.SetID(id)
		return j
	}
	busyFromList := &hfv1.MachineClaim{Status: hfv1.MachineClaimStatus{Bootstrap: &hfv1.BootstrapStatus{RunnerName: "a", RunnerState: hfv1.RunnerStateBusy}}}
	withJob := &hfv1.MachineClaim{Status: hfv1.MachineClaimStatus{Bootstrap: &hfv1.BootstrapStatus{RunnerName: "b"}}}
	withJob.Status.Bootstrap.SetJob("7")
	for _, c := range []*hfv1.MachineClaim{busyFromList, withJob} {
		if got := poolclaims.StateOf(c, false); got != poolclaims.Busy {
			t.Fatalf("claim of runner %s is %v, want busy", c.Status.Bootstrap.RunnerName, got)
		}
	}
	for _, tc := range []struct {
		name    string
		pending []*hfv1.CIJob
		busy    []*hfv1.MachineClaim
		want    int
	}{
		{"no claims", []*hfv1.CIJob{queued("1"), queued("2")}, nil, 2},
		{"busy from the runner list", []*hfv1.CIJob{queued("1"), queued("2")}, []*hfv1.MachineClaim{busyFromList}, 1},
		{"busy with its job recorded", []*hfv1.CIJob{queued("1"), queued("2")}, []*hfv1.MachineClaim{withJob}, 2},
		{"never below zero", nil, []*hfv1.MachineClaim{busyFromList}, 0},
	} {
		s := &poolScope{pending: tc.pending, claims: &poolclaims.Claims{Busy: tc.busy}}
		if got := s.demandPending(); got != tc.want {
			t.Errorf("%s: demandPending = %d, want %d", tc.name, got, tc.want)
		}
	}
}
