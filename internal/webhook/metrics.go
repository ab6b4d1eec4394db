package webhook

import (
	"slices"

	"github.com/hyperfleet/hyperfleet/internal/metrics"
)

// Delivery results (the result label of hyperfleet_webhook_deliveries_total).
const (
	ResultAccepted             = "accepted"
	ResultDuplicate            = "duplicate"
	ResultBadSignature         = "bad_signature"
	ResultMalformed            = "malformed"
	ResultTooLarge             = "too_large"
	ResultIgnored              = "ignored"
	ResultMethodNotAllowed     = "method_not_allowed"
	ResultUnsupportedMediaType = "unsupported_media_type"
	ResultMissingDeliveryID    = "missing_delivery_id"
	ResultOverloaded           = "overloaded"
	ResultTooManyInFlight      = "too_many_in_flight"
	ResultNotConfigured        = "not_configured"
	// ResultUnknownHost: the delivery names an API host the receiver
	// holds no secrets for (workload.ErrUnknownHost).
	ResultUnknownHost = "unknown_host"
)

// Routing outcomes (the outcome label of hyperfleet_webhook_jobs_routed_total).
const (
	OutcomeMatched    = "matched"
	OutcomeUnmatched  = "unmatched"
	OutcomeOutOfScope = "out_of_scope"
	OutcomeError      = "error"
	// OutcomeAmbiguous: equally specific verified pools covered the job;
	// none scaled (see internal/demand).
	OutcomeAmbiguous = "ambiguous"
)

var (
	deliveriesTotal = metrics.NewCounterVec("webhook_deliveries_total",
		"CI platform webhook deliveries received, by platform (workload type), event type (the platform's job and ping events, else other) and result.",
		"platform", "event", "result")

	processingSeconds = metrics.NewHistogram("webhook_processing_duration_seconds",
		"Time from a workflow_job delivery being received to its job being recorded as a CIJob.",
		[]float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30})

	jobsRoutedTotal = metrics.NewCounterVec("webhook_jobs_routed_total",
		"workflow_job events routed, by outcome: matched (recorded for a pool), unmatched (pools serve the repository but none covers the job's labels), out_of_scope (no pool serves the repository) or error.",
		"outcome")

	queueDepth = metrics.NewGauge("webhook_queue_depth",
		"Accepted webhook deliveries waiting for a worker.")
)

// eventLabel bounds the event label's values to the platform's events
// (workload.WebhookFormat.Events): the header is the sender's to choose.
func eventLabel(events []string, event string) string {
	if slices.Contains(events, event) {
		return event
	}
	return "other"
}
