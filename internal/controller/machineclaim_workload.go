package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
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
func (r *MachineClaimReconciler) observeWorkload(ctx context.Context, claim *hfv1.MachineClaim) (ctrl.Result, bool, error) {
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
			st.RunnerState = ""
			st.JobConclusion = truncate(job.Status.Conclusion, 64)
			res, err := r.startTermination(ctx, claim, string(scaling.JobCompleted),
				fmt.Sprintf("job %d finished (%s)", job.Spec.JobID, orDefault(job.Status.Conclusion, "no conclusion")))
			return res, true, err
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
	if !meta.IsStatusConditionTrue(claim.Status.Conditions, hfv1.MachineClaimBootstrappedCondition) {
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimBootstrappedCondition, metav1.ConditionTrue, hfv1.RunnerOnlineReason,
			fmt.Sprintf("Runner %s %s", st.RunnerName, how))
		r.Recorder.Eventf(claim, corev1.EventTypeNormal, hfv1.RunnerOnlineReason, "Runner %s %s", st.RunnerName, how)
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

// requestedFailure applies the pool's request to fail the claim
// (bootstrapTimeout): true when the claim moved to Failed.
func (r *MachineClaimReconciler) requestedFailure(ctx context.Context, claim *hfv1.MachineClaim) bool {
	v := claim.Annotations[hfv1.FailReasonAnnotation]
	switch claim.Status.Phase {
	case hfv1.MachineClaimFailed, hfv1.MachineClaimTerminating, hfv1.MachineClaimFinished:
		return false
	}
	if v == "" {
		return false
	}
	code, msg := splitReason(v)
	claim.Status.TerminationReason = truncate(v, 1024)
	setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, camelReason(code), truncate(msg, 1024))
	r.enterPhase(ctx, claim, hfv1.MachineClaimFailed, camelReason(code), msg)
	return true
}

// requestedTermination ends a claim its pool asked to end (the
// termination-reason annotation): the runner is removed first, which waits
// while it runs a job unless a hard limit ends it; then the VM goes and the
// claim becomes history or is deleted. handled is true when the claim
// waits or moved to Terminating.
func (r *MachineClaimReconciler) requestedTermination(ctx context.Context, claim *hfv1.MachineClaim) (ctrl.Result, bool, error) {
	v := claim.Annotations[hfv1.TerminationReasonAnnotation]
	switch claim.Status.Phase {
	case hfv1.MachineClaimTerminating, hfv1.MachineClaimFinished:
		// A hard limit cancels the job before its pool asks the claim to
		// end; the runner's exit powers the VM off, and the cancelled
		// job's completion arrives too, so shutdown detection or the
		// job's end can be seen before the pool's request. The pool's
		// reason is the cause, so it replaces either.
		if v != "" && endedByPoolCancellation(claim) {
			claim.Status.TerminationReason = truncate(v, 1024)
		}
		return ctrl.Result{}, false, nil
	case hfv1.MachineClaimFailed:
		return ctrl.Result{}, false, nil
	}
	if v == "" {
		return ctrl.Result{}, false, nil
	}
	if !hardLimit(claim) {
		if drained, res := r.drainRunner(ctx, claim); !drained {
			return res, true, nil
		}
	}
	code, msg := splitReason(v)
	res, err := r.startTermination(ctx, claim, code, msg)
	return res, true, err
}

// retainFailedVM keeps a failed claim's VM, stopped, when its pool retains
// failed VMs for debugging (the pool deletes the claim after the TTL or
// when more than maxRetained are kept). It reports false when the VM is
// to be destroyed instead.
func (r *MachineClaimReconciler) retainFailedVM(ctx context.Context, claim *hfv1.MachineClaim) (bool, ctrl.Result) {
	pool := r.poolOf(ctx, claim)
	if pool == nil || !retainsFailed(pool) || claim.Status.VMRef == nil {
		return false, ctrl.Result{}
	}
	ref := claim.Status.VMRef
	p, _, connected := r.Registry.Provider(ref.HypervisorCluster)
	if !connected {
		return true, ctrl.Result{RequeueAfter: waitForDependency}
	}
	vm, err := p.GetVM(ctx, provider.VMRef{VMID: int(ref.VMID), Node: ref.Node})
	if err != nil {
		// Gone, or unreadable: let the normal path clean up.
		return false, ctrl.Result{}
	}
	if vm.Power != provider.PowerStopped {
		if _, err := p.SetPower(ctx, ownerOf(claim), provider.VMRef{VMID: int(ref.VMID), Node: ref.Node}, provider.PowerOff); err != nil {
			ctrl.LoggerFrom(ctx).Info("Could not stop the failed VM kept for debugging; retrying", "err", err.Error())
			return true, ctrl.Result{RequeueAfter: r.backoff(claim)}
		}
		r.Recorder.Eventf(claim, corev1.EventTypeNormal, hfv1.RetainedReason, "VM %d stopped and kept for debugging (RunnerPool %s spec.lifecycle.failedRetention)", ref.VMID, pool.Name)
	}
	// A kept VM keeps nothing that still works as a credential: its
	// cloud-init ISO (the single-use credential) leaves the storage and its
	// runner leaves the CI platform before it is reported retained
	// (docs/security.md, "Credentials after the VM").
	if done, result := r.removeRetainedMedia(ctx, claim, p); !done {
		return true, result
	}
	if done, result := r.deregisterRetainedRunner(ctx, claim); !done {
		return true, result
	}
	ttl := failedRetentionTTL(pool)
	until := claim.CreationTimestamp.Add(ttl)
	if t := claim.Status.PhaseTimes; t != nil && t.Failed != nil {
		until = t.Failed.Add(ttl)
	}
	setCondition(&claim.Status.Conditions, claim.Generation, hfv1.ReadyCondition, metav1.ConditionFalse, hfv1.RetainedReason,
		fmt.Sprintf("VM %d on %s is kept stopped for debugging until %s: %s", ref.VMID, ref.HypervisorCluster, until.UTC().Format(time.RFC3339), claim.Status.TerminationReason))
	return true, ctrl.Result{RequeueAfter: 5 * time.Minute}
}

// removeRetainedMedia advances the removal of a retained VM's cloud-init
// media by one step; done once none is left.
func (r *MachineClaimReconciler) removeRetainedMedia(ctx context.Context, claim *hfv1.MachineClaim, p provider.Provider) (bool, ctrl.Result) {
	ref := claim.Status.VMRef
	prev := progressOf(claim)
	res, err := p.RemoveCloudInitMedia(ctx, ownerOf(claim), prev)
	if err != nil {
		msg := fmt.Sprintf("VM %d is kept for debugging once its cloud-init ISO (it holds the runner credential) is removed: %v", ref.VMID, err)
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.ReadyCondition, metav1.ConditionFalse, retainingReason, truncate(msg, 1024))
		ctrl.LoggerFrom(ctx).Info("Could not remove the cloud-init ISO of the failed VM kept for debugging; retrying", "err", err.Error())
		return false, ctrl.Result{RequeueAfter: r.backoff(claim)}
	}
	r.recordProgress(ctx, claim, ref.HypervisorCluster, prev, res.Progress)
	if !res.Done {
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.ReadyCondition, metav1.ConditionFalse, retainingReason,
			orDefault(res.Message, fmt.Sprintf("Removing the cloud-init ISO of VM %d before keeping it", ref.VMID)))
		return false, ctrl.Result{RequeueAfter: max(res.RetryAfter, callAgainNow)}
	}
	return true, ctrl.Result{}
}

// deregisterRetainedRunner removes the runner of a claim whose failed VM is
// kept: its registration must not outlive the VM's useful life. It reports
// false (with the requeue) to retry; the claim is not reported retained
// until the runner is gone. The pool's TTL bounds the retries: the claim's
// deletion then removes the runner as for any claim.
func (r *MachineClaimReconciler) deregisterRetainedRunner(ctx context.Context, claim *hfv1.MachineClaim) (bool, ctrl.Result) {
	st := claim.Status.Bootstrap
	if r.Bootstrap == nil || st == nil || st.RunnerName == "" && st.RunnerID == 0 {
		return true, ctrl.Result{}
	}
	err := r.release(ctx, claim)
	if err == nil {
		r.Recorder.Eventf(claim, corev1.EventTypeNormal, runnerRemovedReason, "Runner %s is no longer registered; its failed VM is kept for debugging", st.RunnerName)
		st.RunnerID, st.RunnerName, st.RunnerState = 0, "", ""
		return true, ctrl.Result{}
	}
	msg := fmt.Sprintf("Removing runner %s before keeping its failed VM: %v", st.RunnerName, err)
	setCondition(&claim.Status.Conditions, claim.Generation, hfv1.ReadyCondition, metav1.ConditionFalse, runnerNotRemovedReason, truncate(msg, 1024))
	ctrl.LoggerFrom(ctx).Info("Could not remove the runner of a failed VM kept for debugging; retrying", "runner", st.RunnerName, "err", err.Error())
	switch wait, limited := retryAfterWorkload(err, r.Clock.Now()); {
	case limited:
		return false, ctrl.Result{RequeueAfter: wait}
	case errors.Is(err, workload.ErrRunnerBusy):
		// The platform has not yet seen the stopped VM's runner go idle.
		return false, ctrl.Result{RequeueAfter: runnerBusyRecheck}
	}
	return false, ctrl.Result{RequeueAfter: r.backoff(claim)}
}

// retainingReason: a failed VM is being made safe to keep.
const retainingReason = "Retaining"

// keepsHistory reports whether a finished claim of pool stays as history.
func keepsHistory(pool *hfv1.RunnerPool) bool {
	h := pool.Spec.Lifecycle.History
	return h != nil && h.Limit > 0
}

// retainsFailed reports whether pool keeps failed VMs.
func retainsFailed(pool *hfv1.RunnerPool) bool {
	f := pool.Spec.Lifecycle.FailedRetention
	return f != nil && f.MaxRetained > 0
}

// failedRetentionTTL is how long pool keeps a failed VM.
func failedRetentionTTL(pool *hfv1.RunnerPool) time.Duration {
	if f := pool.Spec.Lifecycle.FailedRetention; f != nil && f.TTL != nil {
		return f.TTL.Duration
	}
	return 24 * time.Hour
}

// finish ends a claim whose VM is gone: it stays as history (phase
// Finished, no finalizer) when its pool keeps history, else it is deleted.
// Either way its runner outcome is counted here, once.
func (r *MachineClaimReconciler) finish(ctx context.Context, claim *hfv1.MachineClaim) (ctrl.Result, error) {
	if pool := r.poolOf(ctx, claim); pool != nil && keepsHistory(pool) && claim.DeletionTimestamp.IsZero() {
		// The finalizer goes first: a Finished claim is never reconciled
		// again, so a removal that fails (a conflict with a newer version)
		// must leave the claim in a phase that retries it.
		if err := r.removeFinalizer(ctx, claim); err != nil {
			return ctrl.Result{}, err
		}
		r.enterPhase(ctx, claim, hfv1.MachineClaimFinished, "Finished", orDefault(claim.Status.TerminationReason, "The VM is gone"))
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.ReadyCondition, metav1.ConditionFalse, "Finished", "The VM is gone; the claim is kept as history")
		r.countOutcome(claim)
		return ctrl.Result{}, nil
	}
	if err := r.Client.Delete(ctx, claim); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	return ctrl.Result{}, nil
}

// countOutcome counts the claim's runner outcome.
func (r *MachineClaimReconciler) countOutcome(claim *hfv1.MachineClaim) {
	pool := ""
	if ref := claim.Spec.RunnerPoolRef; ref != nil {
		pool = ref.Name
	}
	metrics.RunnerOutcomes.WithLabelValues(claim.Namespace, pool, string(outcomeOf(claim))).Inc()
	r.Runners.Forget(claim.UID)
}

// outcomeOf maps a claim's termination reason to a runner outcome.
func outcomeOf(claim *hfv1.MachineClaim) scaling.Reason {
	code, _ := splitReason(claim.Status.TerminationReason)
	ranJob := claim.Status.Bootstrap != nil && claim.Status.Bootstrap.JobID != 0
	switch scaling.Reason(code) {
	case scaling.JobCompleted, scaling.IdleTimeout, scaling.MaxLifetime, scaling.JobTimeout,
		scaling.BootstrapTimeout, scaling.DriftReplaced, scaling.ScaledDown, scaling.Orphaned:
		return scaling.Reason(code)
	}
	switch {
	case claim.Status.Phase == hfv1.MachineClaimFailed || claim.Status.PhaseTimes != nil && claim.Status.PhaseTimes.Failed != nil:
		return scaling.Failed
	case ranJob:
		// Powered off or deleted after its job: the job is what it did.
		return scaling.JobCompleted
	case code == vmPoweredOffReason || code == vmGoneReason:
		return scaling.PoweredOff
	}
	return scaling.Deleted
}

// splitReason splits "code: explanation".
func splitReason(v string) (string, string) {
	code, msg, ok := strings.Cut(v, ":")
	if !ok {
		return strings.TrimSpace(v), strings.TrimSpace(v)
	}
	return strings.TrimSpace(code), strings.TrimSpace(msg)
}

// hardLimit reports whether the claim is being removed by a hard limit,
// which does not wait for a busy runner (its job was cancelled first).
// endedByPoolCancellation reports whether a claim's recorded end is what
// its pool's hard limit caused: its VM powered off, or, when the pool asked
// for a hard limit, its job finished as cancelled.
func endedByPoolCancellation(claim *hfv1.MachineClaim) bool {
	reason := claim.Status.TerminationReason
	if strings.HasPrefix(reason, vmPoweredOffReason+":") {
		return true
	}
	st := claim.Status.Bootstrap
	return hardLimit(claim) && strings.HasPrefix(reason, string(scaling.JobCompleted)+":") && st != nil && st.JobConclusion == "cancelled"
}

func hardLimit(claim *hfv1.MachineClaim) bool {
	code, _ := splitReason(claim.Annotations[hfv1.TerminationReasonAnnotation])
	return scaling.Reason(code).Hard()
}

// camelReason turns a reason code such as bootstrap_timeout into a
// condition reason such as BootstrapTimeout (letters and digits only).
func camelReason(code string) string {
	var b strings.Builder
	for _, part := range strings.Split(code, "_") {
		for i, c := range part {
			switch {
			case c >= 'a' && c <= 'z' && i == 0:
				b.WriteRune(c - 'a' + 'A')
			case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9' && b.Len() > 0:
				b.WriteRune(c)
			}
		}
	}
	if b.Len() == 0 {
		return "Failed"
	}
	out := b.String()
	return out[:min(128, len(out))]
}
