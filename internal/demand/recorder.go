package demand

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// Sources of a record (CIJob status.source).
const (
	SourceWebhook = "webhook"
	SourceResync  = "resync"
	// SourceListener: a platform's job feed that the leader listens to
	// (workload.Feed: a GitHub runner scale set's message queue).
	SourceListener = "listener"
)

// Outcome is what Record did.
type Outcome string

const (
	// Created: the job was new in the namespace.
	Created Outcome = "created"
	// Updated: the event moved the job forward or added information.
	Updated Outcome = "updated"
	// Unchanged: an older or repeated event; nothing was written.
	Unchanged Outcome = "unchanged"
)

// Recorder writes job events as CIJobs, the demand records the leader's
// controllers scale from. Safe for concurrent use; several manager
// replicas may record the same job: the API server arbitrates (one create
// wins, updates are optimistic and retried on conflict) and a job's state
// only moves forward.
type Recorder struct {
	client client.Client
	reader client.Reader
	clock  clock.PassiveClock
	// readers, when set, confirm untrusted webhook events
	// (ConfirmWebhookEvents).
	readers     JobReaders
	maxEventAge time.Duration
	// written holds the records this Recorder wrote last, so that a job's
	// next event is one write (written.go).
	written *written
}

// NewRecorder returns a Recorder that writes through c and reads an
// existing CIJob back through reader. Pass the manager's API reader
// (mgr.GetAPIReader()): reading the record just written from a cache that
// may lag would turn into conflicts. A nil reader reads through c; a nil
// clk is the real clock.
func NewRecorder(c client.Client, reader client.Reader, clk clock.PassiveClock) *Recorder {
	if reader == nil {
		reader = c
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Recorder{client: c, reader: reader, clock: clk, written: newWritten()}
}

// Record records ev as the CIJob of its job in pool's namespace, routed to
// pool. A new job is created in one write, labels, spec and status
// together, whatever its state (an in_progress or completed event for a job
// never seen queued still creates it). An existing one is updated only when
// the event moves its state forward (hfv1.CIJobRank) or adds information it
// lacks (the runner's name, a time); an older or repeated event writes
// nothing. source is SourceWebhook or SourceResync. Webhook events the
// Recorder cannot take as delivered are confirmed with the CI platform
// first (ConfirmWebhookEvents).
func (r *Recorder) Record(ctx context.Context, pool types.NamespacedName, ev workload.JobEvent, source string) error {
	_, err := r.Apply(ctx, pool, ev, source)
	return err
}

// Apply is Record, also saying what it did.
func (r *Recorder) Apply(ctx context.Context, pool types.NamespacedName, ev workload.JobEvent, source string) (Outcome, error) {
	if err := checkJob(ev.Job); err != nil {
		return Unchanged, err
	}
	if pool.Namespace == "" || pool.Name == "" {
		return Unchanged, fmt.Errorf("recording job %s of %s: no RunnerPool given", ev.Job.ID, ev.Job.Platform)
	}
	if _, ok := stateOf(ev.Job.State); !ok {
		return Unchanged, fmt.Errorf("recording job %s of %s: unknown job state %q", ev.Job.ID, ev.Job.Platform, ev.Job.State)
	}
	if source == SourceWebhook && r.readers != nil {
		confirmed, keep, err := r.confirm(ctx, pool, ev)
		if err != nil || !keep {
			return Unchanged, err
		}
		ev = confirmed
	}
	job := NewCIJob(pool, ev, source, r.clock.Now())
	key := client.ObjectKeyFromObject(job)
	if cur, ok := r.written.get(key); ok {
		// This Recorder wrote the record last: one update, unless the copy
		// is stale (then read it from the API server, below).
		outcome, err := r.merge(ctx, pool, cur, ev, source)
		switch {
		case err == nil:
			return outcome, nil
		case !apierrors.IsConflict(err) && !apierrors.IsNotFound(err):
			return Unchanged, fmt.Errorf("updating CIJob %s: %w", key, err)
		}
		r.written.forget(key)
	}
	err := r.client.Create(ctx, job)
	if err == nil {
		r.written.put(job)
		observeJob(pool, job, "", r.clock.Now())
		return Created, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return Unchanged, fmt.Errorf("creating CIJob %s/%s: %w", job.Namespace, job.Name, err)
	}
	outcome := Unchanged
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur hfv1.CIJob
		if err := r.reader.Get(ctx, key, &cur); err != nil {
			return err
		}
		var err error
		outcome, err = r.merge(ctx, pool, &cur, ev, source)
		return err
	})
	if err != nil {
		return Unchanged, fmt.Errorf("updating CIJob %s: %w", key, err)
	}
	return outcome, nil
}

// checkJob refuses a job the Recorder cannot name a CIJob after: one
// without a platform, or whose id the API cannot hold or would not make a
// valid object name of (hfv1.ValidateJobID). Such an id is refused, never
// shortened: a shortened id could name another job's record.
func checkJob(j workload.Job) error {
	if j.Platform == "" {
		return fmt.Errorf("recording job %q: the job names no CI platform (workload.Job.Platform); its back-end must set it", clipString(j.ID, maxQuotedIDLength))
	}
	if err := hfv1.ValidateJobID(j.ID); err != nil {
		return fmt.Errorf("recording job %q of %s: %w", clipString(j.ID, maxQuotedIDLength), j.Platform, err)
	}
	return nil
}

// ErrOtherHostsJob: an event about a job whose id is recorded, in the
// pool's namespace, for a job of another API host.
var ErrOtherHostsJob = errors.New("a job of that id from another API host is recorded here")

// hostName prints an API host (workload.Scope.Host) for messages.
func hostName(host string) string {
	if host == "" {
		return "the public service"
	}
	return host
}

// merge applies ev to cur and writes it when that changed anything,
// remembering what it wrote (or read, when nothing changed). A record of
// another job under the same name (ids that differ only in case, see
// hfv1.CIJobName) is refused rather than merged into.
func (r *Recorder) merge(ctx context.Context, pool types.NamespacedName, cur *hfv1.CIJob, ev workload.JobEvent, source string) (Outcome, error) {
	if cur.Spec.Platform != ev.Job.Platform || !strings.EqualFold(cur.Spec.ID(), ev.Job.ID) {
		return Unchanged, fmt.Errorf("CIJob %s/%s records job %s of %s, not job %s of %s: two jobs whose ids differ only in case cannot both be recorded",
			cur.Namespace, cur.Name, cur.Spec.ID(), cur.Spec.Platform, ev.Job.ID, ev.Job.Platform)
	}
	if cur.Spec.APIHost != ev.Job.Host {
		// The same id on two instances of a platform is two jobs; one
		// namespace holds the record of the first seen (CIJobName names no
		// host), and the other's events never change it.
		return Unchanged, fmt.Errorf("CIJob %s/%s records job %s of %s, not the job of that id from %s: %w",
			cur.Namespace, cur.Name, cur.Spec.ID(), hostName(cur.Spec.APIHost), hostName(ev.Job.Host), ErrOtherHostsJob)
	}
	was := cur.Status.State
	if !MergeEvent(cur, ev, source) {
		return Unchanged, nil
	}
	if err := r.client.Update(ctx, cur); err != nil {
		return Unchanged, err
	}
	r.written.put(cur)
	observeJob(pool, cur, was, r.clock.Now())
	return Updated, nil
}

// observeJob measures a job's queue time (queued to started) when this
// write is the one that moved it past queued, and its run time (started to
// completed) when this write is the one that moved it to completed; was is
// the state before the write ("" for a create). The API server lets one
// write move a record past a state (a create wins once, updates are
// optimistic) and the state is stored, so each job is observed once
// however many replicas record it, by webhook or resync, across restarts.
// The times are the platform's when it reported them (NewCIJob, fillEvent);
// a completion without one is now, when the operator learned of it. A job
// whose start is unknown when it is recorded completed (cancelled while
// queued) has no run time.
func observeJob(pool types.NamespacedName, cj *hfv1.CIJob, was hfv1.CIJobState, now time.Time) {
	st := &cj.Status
	j := metrics.Job{
		Namespace: pool.Namespace, Pool: pool.Name, Platform: string(cj.Spec.Platform),
		Repository: cj.Spec.Repository, Workflow: cj.Spec.WorkflowName,
	}
	if st.StartedAt == nil {
		return
	}
	crossed := func(s hfv1.CIJobState) bool {
		return hfv1.CIJobRank(was) < hfv1.CIJobRank(s) && hfv1.CIJobRank(st.State) >= hfv1.CIJobRank(s)
	}
	if crossed(hfv1.CIJobInProgress) && st.QueuedAt != nil && !st.StartedAt.Before(st.QueuedAt) {
		d := st.StartedAt.Sub(st.QueuedAt.Time)
		metrics.ObserveJobQueue(j, d)
	}
	if crossed(hfv1.CIJobCompleted) {
		end := now
		if st.CompletedAt != nil {
			end = st.CompletedAt.Time
		}
		metrics.ObserveJobRun(j, end.Sub(st.StartedAt.Time))
	}
}

// NewCIJob is the CIJob a first event about a job creates in pool's
// namespace; now stands in for the queue time when the platform gave none.
// The job's platform and id must pass checkJob (Apply checks them).
func NewCIJob(pool types.NamespacedName, ev workload.JobEvent, source string, now time.Time) *hfv1.CIJob {
	j := ev.Job
	state, _ := stateOf(j.State)
	labels := clip(j.Labels, maxJobLabels)
	for i := range labels {
		labels[i] = clipString(labels[i], maxLabelLength)
	}
	queuedAt := j.CreatedAt
	if queuedAt.IsZero() {
		queuedAt = now
	}
	cj := &hfv1.CIJob{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: pool.Namespace,
			Name:      hfv1.CIJobName(j.Platform, j.ID),
			Labels: map[string]string{
				hfv1.ManagedByLabel:  hfv1.ManagedByValue,
				hfv1.RunnerPoolLabel: pool.Name,
				hfv1.CIJobStateLabel: string(state),
			},
		},
		Spec: hfv1.CIJobSpec{
			Platform:      j.Platform,
			APIHost:       j.Host,
			RunID:         max(j.RunID, 0),
			RunAttempt:    max(j.RunAttempt, 0),
			Repository:    clipString(j.Repository, maxRepositoryLength),
			Labels:        labels,
			WorkflowName:  clipString(j.WorkflowName, maxNameLength),
			JobName:       clipString(j.Name, maxNameLength),
			RunnerPoolRef: hfv1.ObjectName{Name: pool.Name},
		},
		Status: hfv1.CIJobStatus{
			State:    state,
			QueuedAt: &metav1.Time{Time: queuedAt},
		},
	}
	cj.Spec.SetID(j.ID)
	applyEvent(&cj.Status, ev, source, state)
	return cj
}

// MergeEvent applies ev to an existing CIJob and reports whether anything
// changed. The state moves only forward; an event at or behind the
// current state can only fill in what is missing (a runner name, a time, a
// conclusion); a repeated event changes nothing. The spec is never
// touched (it is immutable).
func MergeEvent(cj *hfv1.CIJob, ev workload.JobEvent, source string) bool {
	state, ok := stateOf(ev.Job.State)
	if !ok {
		return false
	}
	before := cj.Status.DeepCopy()
	beforeLabel := cj.Labels[hfv1.CIJobStateLabel]
	st := &cj.Status
	if hfv1.CIJobRank(state) > hfv1.CIJobRank(st.State) {
		st.State = state
	}
	if st.QueuedAt == nil && !ev.Job.CreatedAt.IsZero() {
		st.QueuedAt = &metav1.Time{Time: ev.Job.CreatedAt}
	}
	fillEvent(st, ev, state)
	if cj.Labels == nil {
		cj.Labels = map[string]string{}
	}
	cj.Labels[hfv1.CIJobStateLabel] = string(st.State)
	changed := !statusEqual(before, st) || beforeLabel != string(st.State)
	if changed {
		st.Source = source
		st.LastDeliveryID = clipString(ev.DeliveryID, maxDeliveryIDLength)
	}
	return changed
}

// applyEvent sets a new record's status from its first event.
func applyEvent(st *hfv1.CIJobStatus, ev workload.JobEvent, source string, state hfv1.CIJobState) {
	fillEvent(st, ev, state)
	st.Source = source
	st.LastDeliveryID = clipString(ev.DeliveryID, maxDeliveryIDLength)
}

// fillEvent fills the status fields ev knows and st lacks. Runner fields
// count only from in_progress and completed events (a queued job has no
// runner, whatever a payload says), the conclusion only from a completed
// one.
func fillEvent(st *hfv1.CIJobStatus, ev workload.JobEvent, state hfv1.CIJobState) {
	j := ev.Job
	rank := hfv1.CIJobRank(state)
	if rank >= hfv1.CIJobRank(hfv1.CIJobInProgress) {
		if st.StartedAt == nil && !j.StartedAt.IsZero() {
			st.StartedAt = &metav1.Time{Time: j.StartedAt}
		}
		if st.RunnerName == "" && j.RunnerName != "" {
			st.RunnerName = clipString(j.RunnerName, maxRunnerNameLength)
		}
		if st.RunnerID == 0 && j.RunnerID > 0 {
			st.RunnerID = j.RunnerID
		}
	}
	if state == hfv1.CIJobCompleted {
		if st.CompletedAt == nil && !j.CompletedAt.IsZero() {
			st.CompletedAt = &metav1.Time{Time: j.CompletedAt}
		}
		if st.Conclusion == "" && j.Conclusion != "" {
			st.Conclusion = clipString(j.Conclusion, maxConclusionLength)
		}
	}
}

func statusEqual(a, b *hfv1.CIJobStatus) bool {
	timeEq := func(x, y *metav1.Time) bool {
		if x == nil || y == nil {
			return x == y
		}
		return x.Equal(y)
	}
	return a.State == b.State && timeEq(a.QueuedAt, b.QueuedAt) && timeEq(a.StartedAt, b.StartedAt) &&
		timeEq(a.CompletedAt, b.CompletedAt) && a.Conclusion == b.Conclusion &&
		a.RunnerName == b.RunnerName && a.RunnerID == b.RunnerID
}

// stateOf maps a neutral job state to the CIJob's.
func stateOf(s workload.JobState) (hfv1.CIJobState, bool) {
	switch s {
	case workload.JobQueued:
		return hfv1.CIJobQueued, true
	case workload.JobInProgress:
		return hfv1.CIJobInProgress, true
	case workload.JobCompleted:
		return hfv1.CIJobCompleted, true
	}
	return "", false
}

// Limits of the CIJob schema: values from the platform are clipped to
// them so that a long name never makes the API server refuse a record.
const (
	maxJobLabels        = 100
	maxLabelLength      = 256
	maxRepositoryLength = 140
	maxNameLength       = 1024
	maxConclusionLength = 64
	maxRunnerNameLength = 256
	maxDeliveryIDLength = 128
	// maxQuotedIDLength bounds a refused job id quoted in an error.
	maxQuotedIDLength = 80
)

// clipString shortens s to at most n characters (the schema counts
// characters, not bytes).
func clipString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n])
}

// clip copies at most n elements of s.
func clip(s []string, n int) []string {
	if len(s) == 0 {
		return nil
	}
	return append([]string(nil), s[:min(len(s), n)]...)
}
