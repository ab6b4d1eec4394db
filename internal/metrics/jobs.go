package metrics

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Label values that stand for more than one value (docs/operations.md,
// "Job and chargeback metrics"). Repositories always hold a slash
// (owner/name), so neither can be a real repository.
const (
	// OtherLabel stands for the repositories and workflows of a pool beyond
	// its first --job-metrics-max-label-values.
	OtherLabel = "__other__"
	// IdleLabel is the repository of a VM that never ran a job (a warm VM
	// that idled out, was scaled down or failed): chargeback attributes its
	// time to the pool, not to a repository.
	IdleLabel = "__idle__"
	// UnknownLabel is the repository of a VM whose job's record (CIJob)
	// was gone when the VM's claim ended.
	UnknownLabel = "__unknown__"
)

// DefaultJobLabelValues is the default of --job-metrics-max-label-values:
// per pool at most this many repository and workflow pairs get series of
// their own in the job histograms, and as many repositories in the
// VM-seconds counter.
const DefaultJobLabelValues = 25

// MaxJobLabelValues bounds the flag: a pool's series grow with it, times
// the histograms' buckets.
const MaxJobLabelValues = 1000

// maxLabelValueLength bounds a repository or workflow label value in
// characters: a workflow name is free text of up to 1024 characters in a
// CIJob (api/v1alpha1/cijob_types.go).
const maxLabelValueLength = 128

// jobLabels are the job metrics' labels.
var jobLabels = []string{"namespace", "pool", "platform", "repository", "workflow"}

var (
	// JobQueueSeconds is a job's time from queued to a runner taking it,
	// by the job's pool, platform, repository and workflow (bounded, see
	// LabelLimiter). The platform's times when it reports them
	// (internal/demand, observeJob).
	JobQueueSeconds = NewHistogramVec("job_queue_seconds",
		"Time from a CI job being queued to a runner taking it, by pool, platform, repository and workflow (at most --job-metrics-max-label-values pairs per pool, the rest under __other__).",
		[]float64{0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200},
		jobLabels...)

	// JobRunSeconds is a job's time from a runner taking it to its end.
	// Run times are minutes to hours, queue times seconds to minutes: two
	// families with their own buckets rather than one with a stage label.
	JobRunSeconds = NewHistogramVec("job_run_seconds",
		"Time from a runner taking a CI job to the job's end, by pool, platform, repository and workflow (at most --job-metrics-max-label-values pairs per pool, the rest under __other__).",
		[]float64{1, 5, 10, 30, 60, 120, 300, 600, 900, 1200, 1800, 2700, 3600, 7200, 14400, 21600},
		jobLabels...)

	// VMSeconds is the chargeback counter: each VM's life, from its clone
	// request (or its claim's creation) to its destruction, added once
	// when its claim ends, to the repository of the job it ran.
	VMSeconds = NewCounterVec("vm_seconds_total",
		"Seconds of VM life (clone request to destruction) by pool and the repository of the job the VM ran (__idle__: no job; __unknown__: its job's record was gone; __other__: beyond --job-metrics-max-label-values repositories per pool), added when the VM's claim ends.",
		"namespace", "pool", "repository")
)

// JobLabels bounds the repository and workflow label values of the job
// and chargeback metrics; SetJobLabelLimit sets its limit at start.
var JobLabels = NewLabelLimiter(DefaultJobLabelValues)

// SetJobLabelLimit sets the per-pool limit of --job-metrics-max-label-values
// before anything is observed.
func SetJobLabelLimit(n int) error {
	if n < 1 || n > MaxJobLabelValues {
		return fmt.Errorf("--job-metrics-max-label-values is %d: set it from 1 to %d (%d by default); it bounds the series of the job and chargeback metrics per pool", n, MaxJobLabelValues, DefaultJobLabelValues)
	}
	JobLabels = NewLabelLimiter(n)
	return nil
}

// LabelLimiter hands out the repository and workflow label values of a
// pool: the first limit repositories seen in the pool keep their names,
// later ones are OtherLabel; likewise the first limit (repository,
// workflow) pairs, later pairs of a named repository keep the repository
// with workflow OtherLabel. So a pool has at most 2*limit+1 repository and
// workflow combinations in the job histograms and limit+3 repositories
// (with IdleLabel, UnknownLabel and OtherLabel) in VMSeconds, whatever the CI platform
// sends. Safe for concurrent use.
type LabelLimiter struct {
	limit int
	mu    sync.Mutex
	pools map[poolKey]*poolValues
}

type poolKey struct{ namespace, pool string }

type poolValues struct {
	repositories map[string]bool
	pairs        map[[2]string]bool
}

// NewLabelLimiter returns a limiter of limit values per pool.
func NewLabelLimiter(limit int) *LabelLimiter {
	return &LabelLimiter{limit: max(limit, 1), pools: map[poolKey]*poolValues{}}
}

// Limit is the limiter's per-pool limit.
func (l *LabelLimiter) Limit() int { return l.limit }

func (l *LabelLimiter) valuesOf(namespace, pool string) *poolValues {
	k := poolKey{namespace, pool}
	v := l.pools[k]
	if v == nil {
		v = &poolValues{repositories: map[string]bool{}, pairs: map[[2]string]bool{}}
		l.pools[k] = v
	}
	return v
}

func (l *LabelLimiter) repository(v *poolValues, repository string) string {
	if v.repositories[repository] {
		return repository
	}
	if len(v.repositories) < l.limit {
		v.repositories[repository] = true
		return repository
	}
	return OtherLabel
}

// Repository is the label value of repository (sanitised) in the pool.
func (l *LabelLimiter) Repository(namespace, pool, repository string) string {
	repository = SanitizeLabelValue(repository)
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.repository(l.valuesOf(namespace, pool), repository)
}

// Job is the repository and workflow label values of a job in the pool.
func (l *LabelLimiter) Job(namespace, pool, repository, workflow string) (string, string) {
	repository, workflow = SanitizeLabelValue(repository), SanitizeLabelValue(workflow)
	l.mu.Lock()
	defer l.mu.Unlock()
	v := l.valuesOf(namespace, pool)
	repository = l.repository(v, repository)
	if repository == OtherLabel {
		return OtherLabel, OtherLabel
	}
	pair := [2]string{repository, workflow}
	if v.pairs[pair] {
		return repository, workflow
	}
	if len(v.pairs) < l.limit {
		v.pairs[pair] = true
		return repository, workflow
	}
	return repository, OtherLabel
}

// Forget drops a deleted pool's values.
func (l *LabelLimiter) Forget(namespace, pool string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.pools, poolKey{namespace, pool})
}

// SanitizeLabelValue makes a value from a CI platform fit for a label:
// valid UTF-8 (the client library refuses anything else) of at most
// maxLabelValueLength characters.
func SanitizeLabelValue(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if r := []rune(s); len(r) > maxLabelValueLength {
		s = string(r[:maxLabelValueLength])
	}
	return s
}

// Job is what the job metrics know of one CI job.
type Job struct {
	Namespace, Pool, Platform, Repository, Workflow string
}

// ObserveJobQueue observes a job's queue time; d below zero (clocks of
// two sources disagreeing) is not observed.
func ObserveJobQueue(j Job, d time.Duration) {
	observeJob(JobQueueSeconds, j, d)
}

// ObserveJobRun observes a job's run time; d below zero is not observed.
func ObserveJobRun(j Job, d time.Duration) {
	observeJob(JobRunSeconds, j, d)
}

func observeJob(h *prometheus.HistogramVec, j Job, d time.Duration) {
	if d < 0 {
		return
	}
	repository, workflow := JobLabels.Job(j.Namespace, j.Pool, j.Repository, j.Workflow)
	h.WithLabelValues(j.Namespace, j.Pool, SanitizeLabelValue(j.Platform), repository, workflow).Observe(d.Seconds())
}

// AddVMSeconds adds a VM's life to its pool and repository (empty: the VM
// ran no job, IdleLabel); d at or below zero adds nothing.
func AddVMSeconds(namespace, pool, repository string, d time.Duration) {
	if d <= 0 {
		return
	}
	switch repository {
	case "":
		repository = IdleLabel
	case UnknownLabel:
	default:
		repository = JobLabels.Repository(namespace, pool, repository)
	}
	VMSeconds.WithLabelValues(namespace, pool, repository).Add(d.Seconds())
}

// forgetPoolJobs drops a deleted pool's job and chargeback series and its
// label values, so that a pool of the same name starts afresh.
func forgetPoolJobs(namespace, pool string) {
	labels := prometheus.Labels{"namespace": namespace, "pool": pool}
	JobQueueSeconds.DeletePartialMatch(labels)
	JobRunSeconds.DeletePartialMatch(labels)
	VMSeconds.DeletePartialMatch(labels)
	JobLabels.Forget(namespace, pool)
}
