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
	"github.com/hyperfleet/hyperfleet/internal/metrics"
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

// Why a webhook event is confirmed: the reason label of
// hyperfleet_webhook_event_confirmations_total.
const (
	confirmNoTime       = "no_time"
	confirmTooOld       = "too_old"
	confirmOutOfOrder   = "out_of_order"
	confirmSharedSecret = "shared_secret"
)

// ConfirmWebhookEvents makes the Recorder confirm, before it records them,
// the webhook events (SourceWebhook) it cannot take as delivered:
//
//   - any event whose platform time (workload.EventTime) is older than
//     maxEventAge (default DefaultMaxEventAge) or unknown: a replay keeps
//     its original time;
//   - a completed event for a job not recorded as in progress (it would
//     end the job's demand out of order);
//   - an in_progress or completed event not signed with its owner's own
//     secret (workload.JobEvent.OwnerSigned false: the shared fallback,
//     which every owner whose webhook uses it holds) that would take a job
//     out of pending demand (not recorded, or recorded queued) or name the
//     runner of a job recorded without one (the claim of that runner would
//     take the job as its own).
//
// Fresh events in order, signed with the owner's own secret, cost no API
// call; with the shared secret a job costs one, when it starts
// (docs/security.md, "Webhook intake"). What the platform's API says
// replaces the event; a job it does not know is not recorded. It returns r.
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
	reason, why, err := r.untrustedBecause(ctx, pool, ev)
	if err != nil || reason == "" {
		return ev, err == nil, err
	}
	metrics.WebhookConfirmations.WithLabelValues(reason).Inc()
	log := ctrl.LoggerFrom(ctx).WithValues("job", ev.Job.ID, "repository", ev.Job.Repository, "pool", pool.String(),
		"delivery", ev.DeliveryID, "eventState", ev.Job.State, "reason", why)
	reader, err := r.readers.JobReaderFor(ctx, pool)
	if err != nil {
		return ev, false, fmt.Errorf("confirming job %s of %s with the CI platform (%s): %w", ev.Job.ID, ev.Job.Repository, why, err)
	}
	job, err := reader.GetJob(ctx, ev.Job.Repository, ev.Job.ID)
	if errors.Is(err, workload.ErrNotFound) {
		log.Info("Webhook event not recorded: the CI platform does not know the job")
		return ev, false, nil
	}
	if err != nil {
		return ev, false, fmt.Errorf("confirming job %s of %s with the CI platform (%s): %w", ev.Job.ID, ev.Job.Repository, why, err)
	}
	// The record stays the job's the event named (its platform, host and
	// id as checked), whatever spelling the platform's answer uses: the
	// pool's account reads its own host's job.
	job.Platform, job.Host, job.ID = ev.Job.Platform, ev.Job.Host, ev.Job.ID
	if job.State != ev.Job.State || job.RunnerName != ev.Job.RunnerName {
		// A forgery, a replay, or an API a moment behind its webhooks:
		// what the API says is recorded, and the resync moves the record
		// on should the API have been behind.
		log.Info("Webhook event differs from the CI platform's view of the job; recording the platform's",
			"platformState", job.State, "eventRunner", ev.Job.RunnerName, "platformRunner", job.RunnerName)
	} else {
		log.V(1).Info("Webhook event confirmed with the CI platform", "platformState", job.State)
	}
	return workload.JobEvent{DeliveryID: ev.DeliveryID, Action: string(job.State), Job: job, OwnerSigned: ev.OwnerSigned}, true, nil
}

// untrustedBecause says why ev must be confirmed (the metric's reason and
// a sentence for the log); empty when it need not.
func (r *Recorder) untrustedBecause(ctx context.Context, pool types.NamespacedName, ev workload.JobEvent) (reason, why string, _ error) {
	at := workload.EventTime(ev.Job)
	if at.IsZero() {
		return confirmNoTime, "the event has no time", nil
	}
	if age := r.clock.Since(at); age > r.maxEventAge {
		return confirmTooOld, fmt.Sprintf("the event is %s old, more than %s", age.Round(time.Second), r.maxEventAge), nil
	}
	switch {
	case ev.Job.State == workload.JobQueued:
		// Adds demand at most: a forged one costs a VM that idles, it
		// never takes a job's VM away.
		return "", "", nil
	case ev.Job.State == workload.JobInProgress && ev.OwnerSigned:
		// Only the job's owner could have signed it: no read needed.
		return "", "", nil
	}
	cur, err := r.recorded(ctx, pool, ev.Job)
	if err != nil {
		return "", "", err
	}
	started := cur != nil && hfv1.CIJobRank(cur.Status.State) >= hfv1.CIJobRank(hfv1.CIJobInProgress)
	recorded := "not recorded"
	if cur != nil {
		recorded = "recorded as " + string(cur.Status.State)
	}
	switch {
	case ev.Job.State == workload.JobCompleted && !started:
		return confirmOutOfOrder, fmt.Sprintf("completed for a job %s", recorded), nil
	case ev.OwnerSigned:
		return "", "", nil
	case !started:
		return confirmSharedSecret, fmt.Sprintf("%s for a job %s, signed with the shared webhook secret", ev.Job.State, recorded), nil
	case ev.Job.RunnerName != "" && cur.Status.RunnerName == "":
		return confirmSharedSecret, fmt.Sprintf("%s names runner %q for a job recorded without one, signed with the shared webhook secret", ev.Job.State, ev.Job.RunnerName), nil
	}
	return "", "", nil
}

// recorded is the job's CIJob in pool's namespace, nil when there is none.
// The copy this Recorder wrote last is enough when it shows the job
// started (a state only moves forward, so no one can have moved it back);
// otherwise the record is read from the API server, which may know more.
func (r *Recorder) recorded(ctx context.Context, pool types.NamespacedName, job workload.Job) (*hfv1.CIJob, error) {
	key := types.NamespacedName{Namespace: pool.Namespace, Name: hfv1.CIJobName(job.Platform, job.ID)}
	if cur, ok := r.written.get(key); ok && hfv1.CIJobRank(cur.Status.State) >= hfv1.CIJobRank(hfv1.CIJobInProgress) && cur.Status.RunnerName != "" {
		return cur, nil
	}
	var cur hfv1.CIJob
	switch err := r.reader.Get(ctx, key, &cur); {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading CIJob %s: %w", key, err)
	}
	return &cur, nil
}
