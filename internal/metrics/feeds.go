package metrics

// The job feed listeners' metrics (internal/feeds; docs/operations.md,
// "Runner scale sets"). Labelled by the pool, like the pool metrics: one
// listener per pool at most.
var (
	// FeedListening is 1 while a pool's listener holds its feed's message
	// session, 0 otherwise.
	FeedListening = NewGaugeVec("feed_listening",
		"1 while the RunnerPool's listener holds its runner scale set's message session, 0 while it does not (starting, refused, failed, session conflict).",
		"namespace", "pool")

	// FeedEvents counts what a pool's listener heard, by the job state it
	// reported (queued, in_progress, completed, or statistics) and what
	// became of it: recorded (a new or advanced CIJob), unchanged (known
	// already, e.g. from a webhook), unresolved (its job not found through
	// the platform's REST API in time; the resync finds it) or error (the
	// demand record could not be written).
	FeedEvents = NewCounterVec("feed_events_total",
		"Events a RunnerPool's runner scale-set listener received, by state (queued, in_progress, completed, statistics) and result (recorded, unchanged, unresolved, error).",
		"namespace", "pool", "state", "result")

	// FeedRestarts counts listener (re)starts after a failure, by reason.
	FeedRestarts = NewCounterVec("feed_listener_restarts_total",
		"Restarts of a RunnerPool's runner scale-set listener after it stopped, by reason (ScaleSetRefused, SessionConflict, ListenerFailed).",
		"namespace", "pool", "reason")
)

// ForgetFeed drops a pool's feed gauges (its listener stopped for good).
func ForgetFeed(namespace, pool string) {
	FeedListening.DeleteLabelValues(namespace, pool)
}
