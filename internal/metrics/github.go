package metrics

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	ghworkload "github.com/hyperfleet/hyperfleet/pkg/workload/github"
)

var (
	// GitHubCalls counts GitHub REST calls by operation and status code
	// (0: no answer).
	GitHubCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "github_api_calls_total",
		Help: "GitHub REST API calls, by operation and HTTP status code (0 when no answer came back).",
	}, []string{"operation", "code"})

	// GitHubCallSeconds is the latency of GitHub REST calls.
	GitHubCallSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Name: "github_api_call_duration_seconds",
		Help:    "Latency of GitHub REST API calls, by operation.",
		Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
	}, []string{"operation"})

	// GitHubRateRemaining is the rate-limit budget GitHub last reported.
	GitHubRateRemaining = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Name: "github_ratelimit_remaining",
		Help: "Requests left in the current GitHub rate-limit window, by account (owner).",
	}, []string{"owner"})

	// GitHubRateBlocked is 1 while a secondary rate limit holds calls back.
	GitHubRateBlocked = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Name: "github_secondary_ratelimit_active",
		Help: "1 while GitHub's secondary rate limit holds calls back, by account (owner).",
	}, []string{"owner"})

	// RunnerCredentials counts single-use runner credentials issued.
	RunnerCredentials = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "runner_credentials_issued_total",
		Help: "Single-use runner credentials issued to VMs, by method (jit-config, runner-token).",
	}, []string{"method"})

	// RunnersDeregistered counts runners removed from the CI platform.
	RunnersDeregistered = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Name: "runners_deregistered_total",
		Help: "Runners removed from the CI platform when their claim went (already-gone runners included).",
	})
)

func init() {
	crmetrics.Registry.MustRegister(GitHubCalls, GitHubCallSeconds, GitHubRateRemaining, GitHubRateBlocked, RunnerCredentials, RunnersDeregistered)
}

// ObserveGitHubCall records one GitHub call.
func ObserveGitHubCall(op string, code int, d time.Duration) {
	GitHubCalls.WithLabelValues(op, strconv.Itoa(code)).Inc()
	GitHubCallSeconds.WithLabelValues(op).Observe(d.Seconds())
}

// ObserveGitHubRate returns a rate-limit observer for one account.
func ObserveGitHubRate(owner string) func(ghworkload.RateSnapshot) {
	return func(s ghworkload.RateSnapshot) {
		GitHubRateRemaining.WithLabelValues(owner).Set(float64(s.Remaining))
		blocked := 0.0
		if time.Now().Before(s.BlockedUntil) {
			blocked = 1
		}
		GitHubRateBlocked.WithLabelValues(owner).Set(blocked)
	}
}
