package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The job feed listeners' metrics (internal/feeds; docs/operations.md,
// "Runner scale sets"). Labelled by the pool, like the pool metrics: one
// listener per pool at most.
var (
	// FeedListening is 1 while a pool's listener holds its feed's message
	// session, 0 otherwise.
	FeedListening = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Name: "feed_listening",
		Help: "1 while the RunnerPool's listener holds its runner scale set's message session, 0 while it does not (starting, refused, failed, session conflict).",
	}, []string{"namespace", "pool"})

	// FeedEvents counts what a pool's listener heard, by the job state it
	// reported (queued, in_progress, completed, or statistics) and what
	// became of it: recorded (a new or advanced CIJob), unchanged (known
	// already, e.g. from a webhook), unresolved (its job not found through
	// the platform's REST API in time; the resync finds it) or error (the
	// demand record could not be written).
	FeedEvents = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "feed_events_total",
		Help: "Events a RunnerPool's runner scale-set listener received, by state (queued, in_progress, completed, statistics) and result (recorded, unchanged, unresolved, error).",
	}, []string{"namespace", "pool", "state", "result"})

	// FeedRestarts counts listener (re)starts after a failure, by reason.
	FeedRestarts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "feed_listener_restarts_total",
		Help: "Restarts of a RunnerPool's runner scale-set listener after it stopped, by reason (ScaleSetRefused, SessionConflict, ListenerFailed).",
	}, []string{"namespace", "pool", "reason"})
)

// ForgetFeed drops a pool's feed gauges (its listener stopped for good).
func ForgetFeed(namespace, pool string) {
	FeedListening.DeleteLabelValues(namespace, pool)
}

func init() {
	crmetrics.Registry.MustRegister(FeedListening, FeedEvents, FeedRestarts)
}
