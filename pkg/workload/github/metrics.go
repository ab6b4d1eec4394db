package github

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// GitHub's own metrics, registered by NewBackend with the operator's
// registry (workload.Dependencies.Metrics).
var (
	// apiCalls counts GitHub REST calls by operation and status code (0:
	// no answer).
	apiCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "hyperfleet", Name: "github_api_calls_total",
		Help: "GitHub REST API calls, by operation and HTTP status code (0 when no answer came back).",
	}, []string{"operation", "code"})

	// apiCallSeconds is the latency of GitHub REST calls.
	apiCallSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "hyperfleet", Name: "github_api_call_duration_seconds",
		Help:    "Latency of GitHub REST API calls, by operation.",
		Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
	}, []string{"operation"})

	// rateRemaining is the rate-limit budget GitHub last reported.
	rateRemaining = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "hyperfleet", Name: "github_ratelimit_remaining",
		Help: "Requests left in the current GitHub rate-limit window, by account (owner).",
	}, []string{"owner"})

	// rateBlocked is 1 while a secondary rate limit holds calls back.
	rateBlocked = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "hyperfleet", Name: "github_secondary_ratelimit_active",
		Help: "1 while GitHub's secondary rate limit holds calls back, by account (owner).",
	}, []string{"owner"})
)

// observeCall records one GitHub call (Config.ObserveCall).
func observeCall(op string, code int, d time.Duration) {
	apiCalls.WithLabelValues(op, strconv.Itoa(code)).Inc()
	apiCallSeconds.WithLabelValues(op).Observe(d.Seconds())
}

// observeRate returns the rate-limit observer of one account
// (Config.ObserveRate).
func observeRate(owner string) func(RateSnapshot) {
	return func(s RateSnapshot) {
		rateRemaining.WithLabelValues(owner).Set(float64(s.Remaining))
		blocked := 0.0
		if time.Now().Before(s.BlockedUntil) {
			blocked = 1
		}
		rateBlocked.WithLabelValues(owner).Set(blocked)
	}
}
