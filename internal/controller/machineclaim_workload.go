package controller

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// RunnerObservation is a claim's runner as the latest runner list of its
// scope showed it.
type RunnerObservation struct {
	// Present is false when the list no longer has the runner (an
	// ephemeral runner is removed by the platform after its job).
	Present bool
	// State is the runner's state when present.
	State workload.RunnerState
	// At is when the list was read.
	At time.Time
}

// RunnerObservations hold the latest runner observation of each claim,
// by claim UID. They live in memory only: the next resync rebuilds them
// from the CI platform, and what a claim concluded from them is in its
// status (docs/architecture.md, "Demand records in the API server").
type RunnerObservations struct {
	mu sync.RWMutex
	m  map[types.UID]RunnerObservation
}

// NewRunnerObservations returns an empty store.
func NewRunnerObservations() *RunnerObservations {
	return &RunnerObservations{m: map[types.UID]RunnerObservation{}}
}

// Get returns the claim's latest observation.
func (o *RunnerObservations) Get(uid types.UID) (RunnerObservation, bool) {
	if o == nil {
		return RunnerObservation{}, false
	}
	o.mu.RLock()
	defer o.mu.RUnlock()
	v, ok := o.m[uid]
	return v, ok
}

// Set records an observation and reports whether it differs from the
// previous one in what it says (presence or state).
func (o *RunnerObservations) Set(uid types.UID, v RunnerObservation) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	old, ok := o.m[uid]
	o.m[uid] = v
	return !ok || old.Present != v.Present || old.State != v.State
}

// Forget drops a claim's observation.
func (o *RunnerObservations) Forget(uid types.UID) {
	if o == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.m, uid)
}

// observeWorkload folds what the CI platform says about the claim's runner
// into its status: the job it took (from the job's CIJob, written by the
// webhook receiver or the resync) and its state in the latest runner list.
// A runner seen online makes the claim Bootstrapped; a runner whose job
// completed ends the claim (its VM has done its one job). handled is true
// when the claim moved to Terminating.
func (r *MachineClaimReconciler) observeWorkload(ctx context.Context, s *claimScope) (ctrl.Result, bool, error) {
	claim := s.claim
	st := claim.Status.Bootstrap
	if st == nil || st.RunnerName == "" {
		return ctrl.Result{}, false, nil
	}
	now := r.Clock.Now()
	if job, err := r.jobOf(ctx, claim); err != nil {
		return ctrl.Result{}, false, err
	} else if job != nil {
		if st.JobID != job.Spec.JobID {
			st.JobID = job.Spec.JobID
			started := job.Status.StartedAt
			if started == nil {
				started = &metav1.Time{Time: now}
			}
			st.JobStartedAt = started
			r.Recorder.Eventf(claim, corev1.EventTypeNormal, "JobStarted", "Runner %s took job %d (%s / %s) of %s",
				st.RunnerName, job.Spec.JobID, job.Spec.WorkflowName, job.Spec.JobName, job.Spec.Repository)
		}
		r.markRegistered(claim, now, "took job "+fmt.Sprint(job.Spec.JobID))
		st.RunnerState = hfv1.RunnerStateBusy
		if job.Status.State == hfv1.CIJobCompleted {
			// The job's end ends the claim, whose deletion reads and stops
			// the VM itself; the VM is in transition until destroyed.
			markTransition(r.Transitions, claim, hypervisors.HintJobCompleted, now)
			st.RunnerState = ""
			st.JobConclusion = truncate(job.Status.Conclusion, 64)
			res, err := r.endAndTerminate(ctx, s, claimEnd{reason: hfv1.EndJobCompleted, code: string(hfv1.EndJobCompleted),
				message: fmt.Sprintf("job %d finished (%s)", job.Spec.JobID, orDefault(job.Status.Conclusion, "no conclusion"))})
			return res, true, err
		}
	}
	if obs, ok := r.Runners.Get(claim.UID); ok && !obs.Present && st.RegisteredAt != nil {
		// The platform removed the runner it had listed: an ephemeral
		// runner goes after its one job, so the VM is about to power off
		// even when the job's events were lost (the resync's hint).
		if markTransition(r.Transitions, claim, hypervisors.HintRunnerGone, now) == hypervisors.Marked {
			ctrl.LoggerFrom(ctx).V(1).Info("Runner gone from the CI platform; reading the VM directly for a while", "runner", st.RunnerName)
		}
	}
	if obs, ok := r.Runners.Get(claim.UID); ok && obs.Present {
		switch obs.State {
		case workload.RunnerIdle, workload.RunnerBusy:
			r.markRegistered(claim, obs.At, "is online")
			if st.JobID == 0 {
				st.RunnerState = hfv1.RunnerState(obs.State)
			}
		default:
			if st.RunnerState == "" {
				st.RunnerState = hfv1.RunnerStateOffline
			}
		}
	}
	return ctrl.Result{}, false, nil
}

// markRegistered records that the claim's runner came online.
func (r *MachineClaimReconciler) markRegistered(claim *hfv1.MachineClaim, at time.Time, how string) {
	st := claim.Status.Bootstrap
	if st.RegisteredAt == nil {
		st.RegisteredAt = &metav1.Time{Time: at}
	}
	if !hfv1.IsConditionTrue(claim.Status.Conditions, hfv1.MachineClaimBootstrappedCondition) {
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimBootstrappedCondition, metav1.ConditionTrue, hfv1.RunnerOnlineReason,
			fmt.Sprintf("Runner %s %s", st.RunnerName, how))
		r.Recorder.Eventf(claim, corev1.EventTypeNormal, string(hfv1.RunnerOnlineReason), "Runner %s %s", st.RunnerName, how)
	}
}

// jobOf is the most advanced CIJob the claim's runner took, if any.
func (r *MachineClaimReconciler) jobOf(ctx context.Context, claim *hfv1.MachineClaim) (*hfv1.CIJob, error) {
	var jobs hfv1.CIJobList
	if err := r.Client.List(ctx, &jobs, client.InNamespace(claim.Namespace), client.MatchingFields{jobRunnerIndex: claim.Status.Bootstrap.RunnerName}); err != nil {
		return nil, fmt.Errorf("list CIJobs of runner %s: %w", claim.Status.Bootstrap.RunnerName, err)
	}
	var best *hfv1.CIJob
	for i := range jobs.Items {
		j := &jobs.Items[i]
		if best == nil || hfv1.CIJobRank(j.Status.State) > hfv1.CIJobRank(best.Status.State) {
			best = j
		}
	}
	return best, nil
}

// claimsForJob wakes the claim whose runner a CIJob names.
func (r *MachineClaimReconciler) claimsForJob(ctx context.Context, o client.Object) []reconcile.Request {
	job := o.(*hfv1.CIJob)
	if job.Status.RunnerName == "" {
		return nil
	}
	var list hfv1.MachineClaimList
	if err := r.Client.List(ctx, &list, client.InNamespace(job.Namespace), client.MatchingFields{claimRunnerIndex: job.Status.RunnerName}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "List claims of runner", "runner", job.Status.RunnerName)
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return out
}

// poolOf is the claim's RunnerPool from the cache; nil for a claim made by
// hand or whose pool is gone.
func (r *MachineClaimReconciler) poolOf(ctx context.Context, claim *hfv1.MachineClaim) *hfv1.RunnerPool {
	ref := claim.Spec.RunnerPoolRef
	if ref == nil {
		return nil
	}
	var pool hfv1.RunnerPool
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: ref.Name}, &pool); err != nil {
		return nil
	}
	return &pool
}
