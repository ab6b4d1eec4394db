package demand

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// DefaultMaxEventAge is how old a webhook event may be before it is
// confirmed with the CI platform. A signature covers the body, not the
// delivery id, so a captured delivery can be replayed under a fresh id;
// its event time cannot be changed without breaking the signature.
const DefaultMaxEventAge = 10 * time.Minute

// JobReaders give the CI platform's view of jobs with the credentials of
// the pool a job was routed to (controller.PoolJobReaders).
type JobReaders interface {
	JobReaderFor(ctx context.Context, pool types.NamespacedName) (workload.JobReader, error)
}

// ConfirmWebhookEvents makes the Recorder confirm, before it records them,
// the webhook events (SourceWebhook) it cannot take as delivered: a
// completed event for a job not recorded as in progress (it would end the
// job's demand), and any event whose platform time (workload.EventTime)
// is older than maxEventAge (default DefaultMaxEventAge) or unknown. What
// the platform's API says replaces the event; a job it does not know is
// not recorded. It returns r.
func (r *Recorder) ConfirmWebhookEvents(readers JobReaders, maxEventAge time.Duration) *Recorder {
	if maxEventAge <= 0 {
		maxEventAge = DefaultMaxEventAge
	}
	r.readers, r.maxEventAge = readers, maxEventAge
	return r
}

// confirm returns the event to record for a webhook event: ev itself when
// it can be taken as delivered, else the job as the platform's API reports
// it; keep is false when the platform does not know the job.
func (r *Recorder) confirm(ctx context.Context, pool types.NamespacedName, ev workload.JobEvent) (_ workload.JobEvent, keep bool, _ error) {
	reason, err := r.untrustedBecause(ctx, pool, ev)
	if err != nil || reason == "" {
		return ev, err == nil, err
	}
	log := ctrl.LoggerFrom(ctx).WithValues("job", ev.Job.ID, "repository", ev.Job.Repository, "pool", pool.String(),
		"delivery", ev.DeliveryID, "eventState", ev.Job.State, "reason", reason)
	reader, err := r.readers.JobReaderFor(ctx, pool)
	if err != nil {
		return ev, false, fmt.Errorf("confirming job %d of %s with the CI platform (%s): %w", ev.Job.ID, ev.Job.Repository, reason, err)
	}
	job, err := reader.GetJob(ctx, ev.Job.Repository, ev.Job.ID)
	if errors.Is(err, workload.ErrNotFound) {
		log.Info("webhook event not recorded: the CI platform does not know the job")
		return ev, false, nil
	}
	if err != nil {
		return ev, false, fmt.Errorf("confirming job %d of %s with the CI platform (%s): %w", ev.Job.ID, ev.Job.Repository, reason, err)
	}
	log.V(1).Info("webhook event confirmed with the CI platform", "platformState", job.State)
	return workload.JobEvent{DeliveryID: ev.DeliveryID, Action: string(job.State), Job: job}, true, nil
}

// untrustedBecause says why ev must be confirmed; empty when it need not.
func (r *Recorder) untrustedBecause(ctx context.Context, pool types.NamespacedName, ev workload.JobEvent) (string, error) {
	at := workload.EventTime(ev.Job)
	if at.IsZero() {
		return "the event has no time", nil
	}
	if age := r.clock.Since(at); age > r.maxEventAge {
		return fmt.Sprintf("the event is %s old, more than %s", age.Round(time.Second), r.maxEventAge), nil
	}
	if ev.Job.State != workload.JobCompleted {
		return "", nil
	}
	key := types.NamespacedName{Namespace: pool.Namespace, Name: hfv1.CIJobName(hfv1.WorkloadGitHubActions, ev.Job.ID)}
	if cur, ok := r.written.get(key); ok && hfv1.CIJobRank(cur.Status.State) >= hfv1.CIJobRank(hfv1.CIJobInProgress) {
		// Recorded in progress by this Recorder; a state only moves
		// forward, so no one can have moved it back since.
		return "", nil
	}
	var cur hfv1.CIJob
	switch err := r.reader.Get(ctx, key, &cur); {
	case apierrors.IsNotFound(err):
		return "completed for a job not recorded", nil
	case err != nil:
		return "", fmt.Errorf("reading CIJob %s: %w", key, err)
	}
	if hfv1.CIJobRank(cur.Status.State) < hfv1.CIJobRank(hfv1.CIJobInProgress) {
		return fmt.Sprintf("completed for a job recorded as %s", cur.Status.State), nil
	}
	return "", nil
}
