// The runner service is a MachineClaim's runner on its CI platform: what
// the platform says about it (the job it took, from the CIJobs; its state in
// the latest runner list) and removing its registration when the claim
// ends, never while it runs a job (docs/architecture.md, "Teardown never
// kills a busy runner"). The platform is reached through the
// reconciler's CI platforms (Reconciler.CI); this service decides when to
// ask them and what the claim says about the answer.

package machineclaim

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/poweroff"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

const (
	// BusyRecheck is how often an ending claim whose runner runs a job
	// asks again.
	BusyRecheck = 15 * time.Second
	// releaseDeadline bounds retries to remove a runner once its VM is
	// gone: the CI platform drops offline ephemeral runners by itself
	// (GitHub after a day), so a claim never hangs on it forever.
	releaseDeadline = 10 * time.Minute
)

// runnerService is a claim's CI runner as its reconciler drives it: it
// observes the runner (online, its job, gone), stands a warm VM by for
// a job and retires its registration, seals a runner whose credential
// could serve a second job, and drains and removes it when the claim
// ends. The platforms' calls go through the scope's CI platforms.
type runnerService struct {
	// observations are the RunnerPool resync's latest runner lists; nil
	// when nothing observes runners.
	observations *RunnerObservations
	// transitions are the VMs a hint says are about to stop; a runner
	// seen gone or done marks its VM (nil: none are marked).
	transitions *hypervisors.Transitions
}

// runner is the claims' runner service.
func (r *Reconciler) runner() runnerService {
	return runnerService{observations: r.Runners, transitions: r.PowerOff.Transitions}
}

// RetryAfter is the requeue for a rate-limited workload call (at least a
// second), and whether err is one.
func RetryAfter(err error, now time.Time) (time.Duration, bool) {
	d, ok := workload.RetryAfter(err, now)
	if ok && d < time.Second {
		d = time.Second
	}
	return d, ok
}

// platformRetry is the wait after a CI platform's call failed with err:
// its rate limit's (RetryAfter), else the claim's backoff.
func (s *claimScope) platformRetry(err error) time.Duration {
	if wait, limited := RetryAfter(err, s.clock.Now()); limited {
		return wait
	}
	return s.backoff()
}

// observe folds what the CI platform says about the claim's runner into
// its status: the job it took (from the job's CIJob, written by the webhook
// receiver or the resync) and its state in the latest runner list. A
// runner seen online makes the claim Bootstrapped. A runner whose job
// completed returns why the claim ends (its VM has done its one job).
func (rs runnerService) observe(ctx context.Context, s *claimScope) (jobDone string, err error) {
	claim := s.claim
	st := claim.Status.Bootstrap
	if st == nil || st.RunnerName == "" {
		return "", nil
	}
	now := s.clock.Now()
	if job, err := rs.jobOf(ctx, s); err != nil {
		return "", err
	} else if job != nil {
		if st.Job() != job.Spec.ID() {
			st.SetJob(job.Spec.ID())
			started := job.Status.StartedAt
			if started == nil {
				started = &metav1.Time{Time: now}
			}
			st.JobStartedAt = started
			logRoutine(ctx, "JobStarted", "Runner %s took job %s (%s / %s) of %s",
				st.RunnerName, job.Spec.ID(), job.Spec.WorkflowName, job.Spec.JobName, job.Spec.Repository)
		}
		if st.JobRepository == "" {
			// Chargeback (countVMSeconds) needs it after the CIJob is
			// collected; a claim from before the field gets it here too.
			st.JobRepository = job.Spec.Repository
		}
		rs.markRegistered(ctx, s, now, "took job "+job.Spec.ID())
		st.RunnerState = hfv1.RunnerStateBusy
		if job.Status.State == hfv1.CIJobCompleted {
			// The job's end ends the claim, whose deletion reads and stops
			// the VM itself; the VM is in transition until destroyed.
			poweroff.Mark(rs.transitions, claim, hypervisors.HintJobCompleted, now)
			st.RunnerState = ""
			st.JobConclusion = conditions.Truncate(job.Status.Conclusion, 64)
			conclusion := job.Status.Conclusion
			if conclusion == "" {
				conclusion = "no conclusion"
			}
			return fmt.Sprintf("job %s finished (%s)", job.Spec.ID(), conclusion), nil
		}
	}
	obs, ok := rs.observations.Get(claim.UID)
	if ok && !obs.Present && st.RegisteredAt != nil {
		// The platform removed the runner it had listed: an ephemeral
		// runner goes after its one job, so the VM is about to power off
		// even when the job's events were lost (the resync's hint).
		if poweroff.Mark(rs.transitions, claim, hypervisors.HintRunnerGone, now) == hypervisors.Marked {
			ctrl.LoggerFrom(ctx).V(1).Info("Runner gone from the CI platform; reading the VM directly for a while", "runner", st.RunnerName)
		}
	}
	if ok && obs.Present {
		switch obs.State {
		case workload.RunnerIdle, workload.RunnerBusy:
			rs.markRegistered(ctx, s, obs.At, "is online")
			if st.Job() == "" {
				st.RunnerState = hfv1.RunnerState(obs.State)
			}
		default:
			if st.RunnerState == "" {
				st.RunnerState = hfv1.RunnerStateOffline
			}
		}
	}
	return "", nil
}

// recordLateJob records, in an ended claim's teardown, the job its runner
// took when the job's CIJob came only after the VM ended (a job shorter
// than its webhook's delivery: the VM powered off first). The claim's
// outcome is then its job's (Outcome) and the chargeback has the job's
// repository (countVMSeconds). A failed claim's end stays its failure.
func (rs runnerService) recordLateJob(ctx context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	st := claim.Status.Bootstrap
	if st == nil || st.RunnerName == "" || st.Job() != "" || claim.HasFailed() {
		return phase.Next(), nil
	}
	job, err := rs.jobOf(ctx, s)
	if err != nil {
		return phase.Stop(), err
	}
	if job == nil {
		return phase.Next(), nil
	}
	st.SetJob(job.Spec.ID())
	st.JobStartedAt = job.Status.StartedAt
	if st.JobRepository == "" {
		st.JobRepository = job.Spec.Repository
	}
	if job.Status.State == hfv1.CIJobCompleted {
		st.JobConclusion = conditions.Truncate(job.Status.Conclusion, 64)
	}
	logRoutine(ctx, "JobStarted", "Runner %s had taken job %s (%s / %s) of %s before its VM ended",
		st.RunnerName, job.Spec.ID(), job.Spec.WorkflowName, job.Spec.JobName, job.Spec.Repository)
	return phase.Next(), nil
}

// markRegistered records that the claim's runner came online.
func (rs runnerService) markRegistered(ctx context.Context, s *claimScope, at time.Time, how string) {
	claim := s.claim
	st := claim.Status.Bootstrap
	if st.RegisteredAt == nil {
		st.RegisteredAt = &metav1.Time{Time: at}
	}
	if !s.facts.isTrue(claim, hfv1.MachineClaimBootstrappedCondition) {
		s.facts.record(hfv1.MachineClaimBootstrappedCondition, metav1.ConditionTrue, hfv1.RunnerOnlineReason,
			fmt.Sprintf("Runner %s %s", st.RunnerName, how))
		logRoutine(ctx, hfv1.RunnerOnlineReason, "Runner %s %s", st.RunnerName, how)
	}
}

// jobOf is the most advanced CIJob the claim's runner took, if any.
func (rs runnerService) jobOf(ctx context.Context, s *claimScope) (*hfv1.CIJob, error) {
	claim := s.claim
	var jobs hfv1.CIJobList
	if err := s.client.List(ctx, &jobs, client.InNamespace(claim.Namespace), client.MatchingFields{fieldindex.JobRunner: claim.Status.Bootstrap.RunnerName}); err != nil {
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

// drain removes an ending claim's runner while its VM still runs. It
// reports false (with the requeue) while the runner is busy: the claim's
// Ending condition says why it waits (phase Draining) and the VM keeps
// running the job.
func (rs runnerService) drain(ctx context.Context, s *claimScope) (bool, time.Duration) {
	claim := s.claim
	if s.ci == nil || claim.Status.Bootstrap == nil || claim.Status.VMRef == nil {
		return true, 0
	}
	err := rs.releaseRegistration(ctx, s)
	switch {
	case err == nil:
		return true, 0
	case errors.Is(err, workload.ErrRunnerBusy):
		msg := fmt.Sprintf("Runner %s is running a job; the VM is deleted when the job ends", claim.Status.Bootstrap.RunnerName)
		s.facts.ending(hfv1.RunnerBusyReason, msg)
		return false, BusyRecheck
	}
	if wait, limited := RetryAfter(err, s.clock.Now()); limited {
		return false, wait
	}
	// Anything else (the template or its credentials are gone, GitHub is
	// down): the platform cannot say whether the runner is busy. A runner
	// known to have taken a job not yet recorded as finished keeps its VM
	// (docs/architecture.md: teardown never kills a busy runner) until the
	// platform answers or the job's CIJob completes (its watch wakes the
	// claim); an idle VM is not kept alive: it is destroyed, and removing
	// the runner is tried again once the VM is gone.
	if job, busy := rs.mayBeBusy(ctx, s); busy {
		msg := fmt.Sprintf("Cannot ask the CI platform whether runner %s still runs job %s (%v); the VM stays until it answers or the job is recorded as finished",
			claim.Status.Bootstrap.RunnerName, job, err)
		s.facts.ending(hfv1.RunnerStateUnknownReason, conditions.Truncate(msg, 1024))
		return false, s.backoff()
	}
	ctrl.LoggerFrom(ctx).Info("Could not remove the runner before destroying its VM; retrying after", "err", err.Error())
	return true, 0
}

// mayBeBusy reports whether the claim's runner took a job that is not
// recorded as finished (a CIJob that cannot be read counts as unfinished;
// one that is gone was a finished one collected after its retention, since
// only finished CIJobs are collected), and which job.
func (rs runnerService) mayBeBusy(ctx context.Context, s *claimScope) (string, bool) {
	claim := s.claim
	id := claim.Status.Bootstrap.Job()
	if id == "" {
		return "", false
	}
	job, err := rs.jobOf(ctx, s)
	if err != nil {
		return id, true
	}
	return id, job != nil && job.Status.State != hfv1.CIJobCompleted
}

// releaseOfGoneVM removes the claim's runner once its VM is gone. It
// reports false (with the requeue) to retry (runnerService.settleRemoval).
func (rs runnerService) releaseOfGoneVM(ctx context.Context, s *claimScope) (bool, time.Duration) {
	if !rs.registered(s) {
		return true, 0
	}
	return rs.settleRemoval(ctx, s, rs.remove(ctx, s, ""))
}

// settleRemoval decides what the answer err of a runner's removal
// means for a claim that no longer waits for its runner: done, or false
// with the requeue to retry; after releaseDeadline it gives up with a
// warning event rather than hold the claim.
func (rs runnerService) settleRemoval(_ context.Context, s *claimScope, err error) (bool, time.Duration) {
	claim := s.claim
	st := claim.Status.Bootstrap
	switch {
	case err == nil:
		return true, 0
	case errors.Is(err, errTemplateGone):
		// Retrying cannot help: whatever could remove the runner went
		// with the template. The claim does not wait for it.
		msg := fmt.Sprintf("Runner %s was not removed: %v. The orphan sweep removes it if a template or RunnerPool with credentials for its scope remains (docs/security.md, \"Orphans\"); the CI platform drops offline ephemeral runners by itself", st.RunnerName, err)
		s.recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.RunnerNotRemovedReason), conditions.Truncate(msg, 1024))
		s.facts.ending(hfv1.RunnerNotRemovedReason, conditions.Truncate(msg, 1024))
		return true, 0
	}
	since := claim.CreationTimestamp.Time
	if end := claim.Status.End; end != nil {
		since = end.StartedAt.Time
	}
	if s.clock.Since(since) > releaseDeadline {
		s.recorder.Eventf(claim, corev1.EventTypeWarning, string(hfv1.RunnerNotRemovedReason),
			"Gave up removing runner %s after %s: %v; the CI platform removes offline ephemeral runners by itself", st.RunnerName, releaseDeadline, err)
		return true, 0
	}
	s.facts.ending(hfv1.RunnerNotRemovedReason, conditions.Truncate(fmt.Sprintf("Removing runner %s: %v", st.RunnerName, err), 1024))
	return false, s.platformRetry(err)
}

// deregister removes the runner of a claim whose failed VM is kept: its
// registration must not outlive the VM's useful life. It reports false
// (with the requeue) to retry; the claim is not reported retained until
// the runner is gone. The pool's TTL bounds the retries: the claim's
// deletion then removes the runner as for any claim.
func (rs runnerService) deregister(ctx context.Context, s *claimScope) (bool, time.Duration) {
	claim := s.claim
	if !rs.registered(s) {
		return true, 0
	}
	st := claim.Status.Bootstrap
	err := rs.remove(ctx, s, "; its failed VM is kept for debugging")
	if err == nil {
		st.RunnerState = ""
		return true, 0
	}
	s.facts.ending(hfv1.RunnerNotRemovedReason, fmt.Sprintf("Removing runner %s before keeping its failed VM: %v", st.RunnerName, err))
	ctrl.LoggerFrom(ctx).Info("Could not remove the runner of a failed VM kept for debugging; retrying", "runner", st.RunnerName, "err", err.Error())
	switch wait, limited := RetryAfter(err, s.clock.Now()); {
	case limited:
		return false, wait
	case errors.Is(err, workload.ErrRunnerBusy):
		// The platform has not yet seen the stopped VM's runner go idle.
		return false, BusyRecheck
	}
	return false, s.backoff()
}

// registered reports whether the claim has a runner registration to
// runnerService.remove.
func (rs runnerService) registered(s *claimScope) bool {
	claim := s.claim
	st := claim.Status.Bootstrap
	return s.ci != nil && st != nil && (st.RunnerName != "" || st.RunnerID != 0)
}

// remove removes the claim's runner registration; once it is gone it says
// so in an event (with note) and the claim's status forgets the runner.
func (rs runnerService) remove(ctx context.Context, s *claimScope, note string) error {
	claim := s.claim
	st := claim.Status.Bootstrap
	if err := rs.releaseRegistration(ctx, s); err != nil {
		return err
	}
	s.teardownEvent(ctx, hfv1.RunnerRemovedReason, "Runner %s is no longer registered%s", st.RunnerName, note)
	st.RunnerID, st.RunnerName = 0, ""
	return nil
}

// errTemplateGone: the claim's template, whose credentials remove its
// runner, no longer exists.
var errTemplateGone = errors.New("is gone with the credentials needed to remove the runner")

// releaseRegistration asks the CI platforms to remove the claim's
// runner, with the claim's template.
func (rs runnerService) releaseRegistration(ctx context.Context, s *claimScope) error {
	claim := s.claim
	var tmpl hfv1.HypervisorMachineTemplate
	if err := s.client.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: claim.Spec.TemplateRef.Name}, &tmpl); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("HypervisorMachineTemplate %s/%s %w", claim.Namespace, claim.Spec.TemplateRef.Name, errTemplateGone)
		}
		return err
	}
	return s.ci.Release(ctx, claim, &tmpl)
}
