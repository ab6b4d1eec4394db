package machineclaim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testobjects"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// runnerStep is one call of the runner service: whether the step is done,
// the requeue it asks for, why the claim ends (observeRunner), its error
// and the VM's rendered user data (renderRunner).
type runnerStep struct {
	done     bool
	requeue  time.Duration
	ended    string
	err      error
	userData string
}

// The runner service's entry points, each as one call on a scope.
var (
	// renderRunner renders the claim's cloud-init, whose runner part the
	// CI platforms fill in (the registration's render path).
	renderRunner = func(ctx context.Context, r *Reconciler, s *claimScope) runnerStep {
		ci := &claimCloudInit{r: r, claim: s.claim, tmpl: testobjects.GitHubTemplate(nil), cluster: worldCluster()}
		out, err := ci.Render(ctx)
		return runnerStep{done: err == nil, err: err, userData: string(out.UserData)}
	}
	observeRunnerStep = func(ctx context.Context, r *Reconciler, s *claimScope) runnerStep {
		ended, err := r.runner().observe(ctx, s)
		return runnerStep{done: true, ended: ended, err: err}
	}
	drainRunnerStep = func(ctx context.Context, r *Reconciler, s *claimScope) runnerStep {
		done, requeue := r.runner().drain(ctx, s)
		return runnerStep{done: done, requeue: requeue}
	}
	releaseGoneStep = func(ctx context.Context, r *Reconciler, s *claimScope) runnerStep {
		done, requeue := r.runner().releaseOfGoneVM(ctx, s)
		return runnerStep{done: done, requeue: requeue}
	}
	deregisterKeptStep = func(ctx context.Context, r *Reconciler, s *claimScope) runnerStep {
		done, requeue := r.runner().deregister(ctx, s)
		return runnerStep{done: done, requeue: requeue}
	}
	recordLateJobStep = func(ctx context.Context, r *Reconciler, s *claimScope) runnerStep {
		res, err := r.runner().recordLateJob(ctx, s)
		return runnerStep{done: !res.Stopped(), err: err}
	}
)

// runnerJob is the CIJob of job 7 taken by the claim's runner, in state.
func runnerJob(state hfv1.CIJobState, conclusion string) *hfv1.CIJob {
	job := &hfv1.CIJob{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "job-7"}}
	job.Spec.JobID, job.Spec.Repository, job.Spec.WorkflowName, job.Spec.JobName = 7, "octo-org/app", "ci", "build"
	job.Status.State, job.Status.RunnerName, job.Status.Conclusion = state, "runner-1", conclusion
	return job
}

// TestRunnerService runs the runner service (runner_service.go, and the
// runner part of the cloud-init) at its seam: per row a claim with a
// registered runner, the objects the fake client holds (the template, the
// runner's CIJob), the latest runner list and what the CI platforms
// double answers; one call of an entry point on a fake clock; and the
// step's answer, the facts it recorded (conditions, status.bootstrap, the
// power-off hint), what the CI platforms were asked and the events.
func TestRunnerService(t *testing.T) {
	vmKey := hypervisors.VMKey{Cluster: unitCluster, VM: "proxmox://1001"}
	gone := func(c *hfv1.MachineClaim) {
		c.Status.VMRef = nil
		c.Status.End = &hfv1.MachineClaimEnd{Reason: hfv1.EndPoweredOff, StartedAt: metav1.NewTime(unitEpoch)}
	}
	kept := func(c *hfv1.MachineClaim) {
		c.Status.End = &hfv1.MachineClaimEnd{Reason: hfv1.EndFailed, Failed: true, StartedAt: metav1.NewTime(unitEpoch)}
		c.Status.Bootstrap.RunnerState = hfv1.RunnerStateOffline
	}
	tookJob := func(c *hfv1.MachineClaim) { c.Status.Bootstrap.JobID = 7 }
	rateLimited := fmt.Errorf("remove runner: %w", &workload.RateLimitError{RetryAt: unitEpoch.Add(90 * time.Second)})
	refused := fmt.Errorf("remove runner 42: %w", workload.ErrInvalidRequest)
	unreachable := fmt.Errorf("remove runner 42: %w", workload.ErrUnavailable)
	template := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "debian"}}

	for name, tc := range map[string]struct {
		call  func(context.Context, *Reconciler, *claimScope) runnerStep
		claim func(c *hfv1.MachineClaim)
		// objs are in the fake client besides the claim's template
		// (noTemplate: without it).
		objs       []client.Object
		noTemplate bool
		// ci answers for the CI platforms; nil: the reconciler has none.
		ci *ciDouble
		// listed is the runner in the latest runner list, if any.
		listed *RunnerObservation
		// after moves the clock past unitEpoch before the call.
		after time.Duration

		want    runnerStep
		wantErr error
		// wantSeed is in the rendered user data.
		wantSeed string
		// wantConds are the conditions the facts make, by reason.
		wantConds map[hfv1.ConditionType]hfv1.ConditionReason
		// wantRunner, wantState and wantJob are status.bootstrap after.
		wantRunner string
		wantState  hfv1.RunnerState
		wantJob    int64
		// wantHint: the VM is in transition (about to stop).
		wantHint bool
		// wantVars and wantReleases are the CI platforms' calls.
		wantVars, wantReleases int
		// wantEvents are the events' prefixes ("Type Reason ..."), in order.
		wantEvents []string
	}{
		// The registration's render path.
		"render: the CI platform names the runner in the VM's seed": {
			call: renderRunner, ci: &ciDouble{runnerName: "runner-named-by-the-platform"},
			want: runnerStep{done: true}, wantSeed: "runner-named-by-the-platform", wantRunner: "runner-1", wantVars: 1,
		},
		"render: the CI platform unreachable fails the render with its error": {
			call: renderRunner, ci: &ciDouble{varsErr: unreachable},
			want: runnerStep{}, wantErr: workload.ErrUnavailable, wantRunner: "runner-1", wantVars: 1,
		},

		// What the platform says about the runner.
		"observe: nothing registered yet": {
			call: observeRunnerStep, ci: &ciDouble{},
			claim: func(c *hfv1.MachineClaim) { c.Status.Bootstrap = nil },
			want:  runnerStep{done: true},
		},
		"observe: the runner listed online makes the claim Bootstrapped": {
			call: observeRunnerStep, ci: &ciDouble{},
			listed:    &RunnerObservation{Present: true, State: workload.RunnerIdle, At: unitEpoch},
			want:      runnerStep{done: true},
			wantConds: map[hfv1.ConditionType]hfv1.ConditionReason{hfv1.MachineClaimBootstrappedCondition: hfv1.RunnerOnlineReason},
			// No event: a runner coming online is a claim's routine life,
			// its Bootstrapped condition and the log say it (events.go).
			wantRunner: "runner-1", wantState: hfv1.RunnerStateIdle,
		},
		"observe: the runner took a job": {
			call: observeRunnerStep, ci: &ciDouble{}, objs: []client.Object{runnerJob(hfv1.CIJobInProgress, "")},
			want:      runnerStep{done: true},
			wantConds: map[hfv1.ConditionType]hfv1.ConditionReason{hfv1.MachineClaimBootstrappedCondition: hfv1.RunnerOnlineReason},
			// No event: which job ran where is the log's (reason
			// JobStarted) and the CIJob's (events.go).
			wantRunner: "runner-1", wantState: hfv1.RunnerStateBusy, wantJob: 7,
		},
		"observe: the runner's job completed ends the claim, its VM about to stop": {
			call: observeRunnerStep, ci: &ciDouble{}, objs: []client.Object{runnerJob(hfv1.CIJobCompleted, "success")},
			want:       runnerStep{done: true, ended: "job 7 finished (success)"},
			wantConds:  map[hfv1.ConditionType]hfv1.ConditionReason{hfv1.MachineClaimBootstrappedCondition: hfv1.RunnerOnlineReason},
			wantRunner: "runner-1", wantJob: 7, wantHint: true,
		},
		"observe: a registered runner gone from the list puts its VM in transition": {
			call: observeRunnerStep, ci: &ciDouble{},
			claim:  func(c *hfv1.MachineClaim) { c.Status.Bootstrap.RegisteredAt = &metav1.Time{Time: unitEpoch} },
			listed: &RunnerObservation{At: unitEpoch},
			want:   runnerStep{done: true}, wantRunner: "runner-1", wantHint: true,
		},

		// Release on end, the VM still running.
		"drain: the runner released": {
			call: drainRunnerStep, ci: &ciDouble{},
			want: runnerStep{done: true}, wantRunner: "runner-1", wantReleases: 1,
		},
		"drain: a busy runner keeps its VM": {
			call: drainRunnerStep, ci: &ciDouble{release: fmt.Errorf("remove runner 42: %w", workload.ErrRunnerBusy)},
			want:       runnerStep{requeue: BusyRecheck},
			wantConds:  map[hfv1.ConditionType]hfv1.ConditionReason{hfv1.MachineClaimEndingCondition: hfv1.RunnerBusyReason},
			wantRunner: "runner-1", wantReleases: 1,
		},
		"drain: rate limited, it waits for the platform's retry time": {
			call: drainRunnerStep, ci: &ciDouble{release: rateLimited},
			want: runnerStep{requeue: 90 * time.Second}, wantRunner: "runner-1", wantReleases: 1,
		},
		"drain: the platform unreachable, a runner whose job is not recorded finished keeps its VM": {
			call: drainRunnerStep, ci: &ciDouble{release: unreachable}, claim: tookJob,
			objs:       []client.Object{runnerJob(hfv1.CIJobInProgress, "")},
			want:       runnerStep{requeue: 2 * time.Second},
			wantConds:  map[hfv1.ConditionType]hfv1.ConditionReason{hfv1.MachineClaimEndingCondition: hfv1.RunnerStateUnknownReason},
			wantRunner: "runner-1", wantJob: 7, wantReleases: 1,
		},
		"drain: the platform unreachable, an idle runner does not keep its VM": {
			call: drainRunnerStep, ci: &ciDouble{release: unreachable},
			want: runnerStep{done: true}, wantRunner: "runner-1", wantReleases: 1,
		},
		"drain: the platform refuses, the runner's job recorded finished does not keep the VM": {
			call: drainRunnerStep, ci: &ciDouble{release: refused}, claim: tookJob,
			objs: []client.Object{runnerJob(hfv1.CIJobCompleted, "success")},
			want: runnerStep{done: true}, wantRunner: "runner-1", wantJob: 7, wantReleases: 1,
		},
		"drain: without CI platforms nothing is asked": {
			call: drainRunnerStep,
			want: runnerStep{done: true}, wantRunner: "runner-1",
		},

		// Release on end, the VM gone.
		"gone VM: the runner released, the status forgets it": {
			call: releaseGoneStep, ci: &ciDouble{}, claim: gone,
			// No event: a VM that powered off by itself ends routinely
			// (routineEnd); the log says it.
			want: runnerStep{done: true}, wantReleases: 1,
		},
		"gone VM of a deleted claim: the runner released, in an event": {
			call: releaseGoneStep, ci: &ciDouble{},
			claim: func(c *hfv1.MachineClaim) {
				gone(c)
				c.Status.End.Reason = hfv1.EndDeleted
			},
			want: runnerStep{done: true}, wantReleases: 1,
			wantEvents: []string{"Normal RunnerRemoved Runner runner-1 is no longer registered"},
		},

		// A job recorded only after the VM ended (a job shorter than its
		// webhook's delivery).
		"late job: the CIJob that came after the VM powered off is the claim's job": {
			call: recordLateJobStep, claim: gone, objs: []client.Object{runnerJob(hfv1.CIJobCompleted, "success")},
			want: runnerStep{done: true}, wantRunner: "runner-1", wantJob: 7,
		},
		"late job: none recorded, the claim stays without one": {
			call: recordLateJobStep, claim: gone,
			want: runnerStep{done: true}, wantRunner: "runner-1",
		},
		"late job: a failed claim keeps its failure": {
			call: recordLateJobStep, claim: kept, objs: []client.Object{runnerJob(hfv1.CIJobInProgress, "")},
			want: runnerStep{done: true}, wantRunner: "runner-1", wantState: hfv1.RunnerStateOffline,
		},
		"gone VM: already released, the platform is not asked": {
			call: releaseGoneStep, ci: &ciDouble{},
			claim: func(c *hfv1.MachineClaim) {
				gone(c)
				c.Status.Bootstrap.RunnerName, c.Status.Bootstrap.RunnerID = "", 0
			},
			want: runnerStep{done: true},
		},
		"gone VM: the platform refuses, retried with backoff": {
			call: releaseGoneStep, ci: &ciDouble{release: refused}, claim: gone,
			want:       runnerStep{requeue: 2 * time.Second},
			wantConds:  map[hfv1.ConditionType]hfv1.ConditionReason{hfv1.MachineClaimEndingCondition: hfv1.RunnerNotRemovedReason},
			wantRunner: "runner-1", wantReleases: 1,
		},
		"gone VM: rate limited, it waits for the platform's retry time": {
			call: releaseGoneStep, ci: &ciDouble{release: rateLimited}, claim: gone,
			want:       runnerStep{requeue: 90 * time.Second},
			wantConds:  map[hfv1.ConditionType]hfv1.ConditionReason{hfv1.MachineClaimEndingCondition: hfv1.RunnerNotRemovedReason},
			wantRunner: "runner-1", wantReleases: 1,
		},
		"gone VM: the platform unreachable past the deadline, given up with a warning": {
			call: releaseGoneStep, ci: &ciDouble{release: unreachable}, claim: gone, after: releaseDeadline + time.Second,
			want: runnerStep{done: true}, wantRunner: "runner-1", wantReleases: 1,
			wantEvents: []string{"Warning RunnerNotRemoved Gave up removing runner runner-1 after 10m0s"},
		},
		"gone VM: the template gone with its credentials, given up at once": {
			call: releaseGoneStep, ci: &ciDouble{}, claim: gone, noTemplate: true,
			want:       runnerStep{done: true},
			wantConds:  map[hfv1.ConditionType]hfv1.ConditionReason{hfv1.MachineClaimEndingCondition: hfv1.RunnerNotRemovedReason},
			wantRunner: "runner-1", wantEvents: []string{"Warning RunnerNotRemoved Runner runner-1 was not removed"},
		},

		// Release of a failed VM's runner before the VM is kept.
		"kept VM: the runner released before the VM is kept": {
			call: deregisterKeptStep, ci: &ciDouble{}, claim: kept,
			want: runnerStep{done: true}, wantReleases: 1,
			wantEvents: []string{"Normal RunnerRemoved Runner runner-1 is no longer registered; its failed VM is kept for debugging"},
		},
		"kept VM: busy until the platform sees the stopped runner": {
			call: deregisterKeptStep, ci: &ciDouble{release: workload.ErrRunnerBusy}, claim: kept,
			want:       runnerStep{requeue: BusyRecheck},
			wantConds:  map[hfv1.ConditionType]hfv1.ConditionReason{hfv1.MachineClaimEndingCondition: hfv1.RunnerNotRemovedReason},
			wantRunner: "runner-1", wantState: hfv1.RunnerStateOffline, wantReleases: 1,
		},
		"kept VM: the platform unreachable, retried with backoff": {
			call: deregisterKeptStep, ci: &ciDouble{release: unreachable}, claim: kept,
			want:       runnerStep{requeue: 2 * time.Second},
			wantConds:  map[hfv1.ConditionType]hfv1.ConditionReason{hfv1.MachineClaimEndingCondition: hfv1.RunnerNotRemovedReason},
			wantRunner: "runner-1", wantState: hfv1.RunnerStateOffline, wantReleases: 1,
		},
	} {
		t.Run(name, func(t *testing.T) {
			claim := unitClaim("runner-1", 0)
			claim.Spec.TemplateRef.Name = "debian"
			claim.Status.VMRef = hfv1.NewVMReference(unitCluster, "proxmox://1001", "node-1")
			claim.Status.Bootstrap = &hfv1.BootstrapStatus{RunnerName: "runner-1", RunnerID: 42}
			if tc.claim != nil {
				tc.claim(&claim)
			}
			objs := tc.objs
			if !tc.noTemplate {
				objs = append(objs, template.DeepCopy())
			}
			clk := clocktesting.NewFakeClock(unitEpoch.Add(tc.after))
			rec := record.NewFakeRecorder(16)
			r := &Reconciler{Client: claimWorld(t, objs...), Recorder: rec, Clock: clk,
				Runners: NewRunnerObservations(), PowerOff: PowerOff{Transitions: hypervisors.NewTransitions(hypervisors.TransitionOptions{})}}
			if tc.ci != nil {
				r.CI = tc.ci
			}
			if tc.listed != nil {
				r.Runners.Set(claim.UID, *tc.listed)
			}

			var got runnerStep
			inScope(r, &claim, func(s *claimScope) { got = tc.call(context.Background(), r, s) })

			if !errors.Is(got.err, tc.wantErr) || (tc.wantErr == nil) != (got.err == nil) {
				t.Errorf("error %v, want %v", got.err, tc.wantErr)
			}
			if !strings.Contains(got.userData, tc.wantSeed) {
				t.Errorf("user data does not hold %q:\n%s", tc.wantSeed, got.userData)
			}
			got.err, got.userData = nil, ""
			if got != tc.want {
				t.Errorf("step %+v, want %+v", got, tc.want)
			}
			for typ, reason := range tc.wantConds {
				if c := hfv1.FindCondition(claim.Status.Conditions, typ); c == nil || c.Reason != string(reason) {
					t.Errorf("%s = %+v, want reason %s", typ, c, reason)
				}
			}
			if len(claim.Status.Conditions) != len(tc.wantConds) {
				t.Errorf("conditions %+v, want only %v", claim.Status.Conditions, tc.wantConds)
			}
			var runner string
			var state hfv1.RunnerState
			var job int64
			if st := claim.Status.Bootstrap; st != nil {
				runner, state, job = st.RunnerName, st.RunnerState, st.JobID
			}
			if runner != tc.wantRunner || state != tc.wantState || job != tc.wantJob {
				t.Errorf("status.bootstrap runner %q, state %q, job %d; want %q, %q, %d", runner, state, job, tc.wantRunner, tc.wantState, tc.wantJob)
			}
			if _, hint := r.PowerOff.Transitions.Active(vmKey, clk.Now()); hint != tc.wantHint {
				t.Errorf("VM in transition: %v, want %v", hint, tc.wantHint)
			}
			if tc.ci != nil {
				if vars, releases := tc.ci.calls(); vars != tc.wantVars || releases != tc.wantReleases {
					t.Errorf("the CI platforms got %d BootstrapVars and %d Release calls, want %d and %d", vars, releases, tc.wantVars, tc.wantReleases)
				}
			}
			events := drainEvents(rec)
			if len(events) != len(tc.wantEvents) {
				t.Fatalf("events %q, want %d starting %q", events, len(tc.wantEvents), tc.wantEvents)
			}
			for i, want := range tc.wantEvents {
				if !strings.HasPrefix(events[i], want) {
					t.Errorf("event %d %q, want one starting %q", i, events[i], want)
				}
			}
		})
	}
}
