package machineclaim

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// TestDrainRunnerWhenThePlatformCannotAnswer: while the CI platform cannot
// say whether a runner is busy, a runner that took a job not recorded as
// finished keeps its VM (Draining, RunnerStateUnknown); a runner with no
// job, or whose job is recorded as finished or collected, does not keep an
// idle VM alive.
func TestDrainRunnerWhenThePlatformCannotAnswer(t *testing.T) {
	for _, tc := range []struct {
		name     string
		jobID    string
		jobState hfv1.CIJobState // "" for no CIJob
		drained  bool
	}{
		{name: "no job taken", drained: true},
		{name: "job in progress", jobID: "7", jobState: hfv1.CIJobInProgress},
		{name: "job known by its key in progress", jobID: "0190a1b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b", jobState: hfv1.CIJobInProgress},
		{name: "job finished", jobID: "7", jobState: hfv1.CIJobCompleted, drained: true},
		{name: "finished job collected", jobID: "7", drained: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scheme := runtime.NewScheme()
			if err := hfv1.AddToScheme(scheme); err != nil {
				t.Fatal(err)
			}
			tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "tmpl"}}
			b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(tmpl).
				WithIndex(&hfv1.CIJob{}, fieldindex.JobRunner, func(o client.Object) []string { return []string{o.(*hfv1.CIJob).Status.RunnerName} })
			if tc.jobState != "" {
				job := &hfv1.CIJob{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "job-7"}}
				job.Spec.SetID(tc.jobID)
				job.Status.State, job.Status.RunnerName = tc.jobState, "runner-1"
				b = b.WithObjects(job).WithStatusSubresource(job)
			}
			r := &Reconciler{Client: b.Build(), CI: &ciDouble{varsErr: errors.New("not used"), release: workload.ErrUnavailable}, Recorder: record.NewFakeRecorder(10), Clock: clocktesting.NewFakeClock(time.Now())}
			claim := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "c", UID: "uid-1"}}
			claim.Spec.TemplateRef.Name = "tmpl"
			claim.Status.Phase = hfv1.MachineClaimReady
			claim.Status.VMRef = hfv1.NewVMReference("pve", "proxmox://1000", "pve1")
			claim.Status.Bootstrap = &hfv1.BootstrapStatus{RunnerName: "runner-1"}
			claim.Status.Bootstrap.SetJob(tc.jobID)
			var drained bool
			var wait time.Duration
			inScope(r, claim, func(s *claimScope) { drained, wait = r.runner().drain(context.Background(), s) })
			if drained != tc.drained {
				t.Fatalf("drained = %v, want %v", drained, tc.drained)
			}
			if tc.drained {
				return
			}
			SummariseReady(claim)
			ready := hfv1.FindCondition(claim.Status.Conditions, hfv1.ReadyCondition)
			if phase := PhaseOf(claim); phase != hfv1.MachineClaimDraining || ready == nil || ready.Reason != string(hfv1.RunnerStateUnknownReason) || wait <= 0 {
				t.Fatalf("phase %s, Ready %+v, requeue %s; want Draining with %s and a retry", phase, ready, wait, hfv1.RunnerStateUnknownReason)
			}
			if !strings.Contains(ready.Message, "job "+tc.jobID+" ") {
				t.Fatalf("Ready message %q does not name job %s", ready.Message, tc.jobID)
			}
		})
	}
}
