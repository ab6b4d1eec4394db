package gitlab

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// GitLab's own metrics, registered by NewBackend with the operator's
// registry (workload.Dependencies.Metrics).
var (
	// apiCalls counts GitLab REST calls by operation and status code (0:
	// no answer).
	apiCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "hyperfleet", Name: "gitlab_api_calls_total",
		Help: "GitLab REST API calls, by operation and HTTP status code (0 when no answer came back).",
	}, []string{"operation", "code"})

	// apiCallSeconds is the latency of GitLab REST calls.
	apiCallSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "hyperfleet", Name: "gitlab_api_call_duration_seconds",
		Help:    "Latency of GitLab REST API calls, by operation.",
		Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
	}, []string{"operation"})

	// rateRemaining is the rate-limit budget GitLab last reported.
	rateRemaining = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "hyperfleet", Name: "gitlab_ratelimit_remaining",
		Help: "Requests left in the current GitLab rate-limit window (RateLimit-Remaining), by instance URL.",
	}, []string{"instance"})
)

// operation names a REST call by what it does, from a fixed set, so that
// no id or path reaches the metrics.
func operation(method, path string) string {
	_, rest, ok := strings.Cut(path, "/api/v4/")
	if !ok {
		return "other"
	}
	seg := strings.Split(strings.Trim(rest, "/"), "/")
	last := seg[len(seg)-1]
	switch {
	case method == http.MethodPost && rest == "user/runners":
		return "create_runner"
	case rest == "personal_access_tokens/self":
		return "read_token"
	case rest == "runners/all":
		return "list_runners"
	case seg[0] == "runners" && len(seg) == 2:
		if op, ok := map[string]string{http.MethodGet: "read_runner", http.MethodPut: "update_runner", http.MethodDelete: "delete_runner"}[method]; ok {
			return op
		}
	case (seg[0] == "projects" || seg[0] == "groups") && len(seg) == 2:
		return "read_" + strings.TrimSuffix(seg[0], "s")
	case (seg[0] == "projects" || seg[0] == "groups") && len(seg) == 3 && last == "runners":
		return "list_runners"
	case seg[0] == "groups" && len(seg) == 3 && last == "projects":
		return "list_projects"
	case seg[0] == "projects" && len(seg) == 3 && last == "jobs":
		return "list_jobs"
	case seg[0] == "projects" && len(seg) == 4 && seg[2] == "jobs":
		return "read_job"
	case seg[0] == "projects" && len(seg) == 5 && seg[2] == "pipelines" && last == "cancel":
		return "cancel_pipeline"
	}
	return "other"
}

// observed is a RoundTripper that records every call's operation, status,
// latency and the rate-limit budget GitLab reports.
type observed struct {
	next     http.RoundTripper
	instance string
}

func (o observed) RoundTrip(r *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := o.next.RoundTrip(r)
	op, code := operation(r.Method, r.URL.EscapedPath()), 0
	if resp != nil {
		code = resp.StatusCode
		if v, perr := strconv.Atoi(resp.Header.Get("RateLimit-Remaining")); perr == nil {
			rateRemaining.WithLabelValues(o.instance).Set(float64(v))
		}
	}
	apiCalls.WithLabelValues(op, strconv.Itoa(code)).Inc()
	apiCallSeconds.WithLabelValues(op).Observe(time.Since(start).Seconds())
	return resp, err
}
