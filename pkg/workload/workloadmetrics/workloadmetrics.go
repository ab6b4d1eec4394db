// Package workloadmetrics is the one family of CI platform API metrics
// every workload back-end records (docs/operations.md, "CI platform API"):
// calls by platform, operation and status code, their latency, and the
// rate-limit budget each platform reports. One family instead of one per
// platform, so that a dashboard panel or an alert covers every platform
// the operator serves, new ones included, and compares them.
//
// A back-end describes its platform once (New: the workload type and the
// bounded set of operation names its calls map to), registers the family
// with the operator's registry (Register, which platformbackend.New calls
// from its NewBackend) and records through its Platform. An operation
// outside the declared set is recorded as "other", so that no path, id or
// name reaches a label.
package workloadmetrics

import (
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// OtherOperation is the operation of a call outside a platform's declared
// set.
const OtherOperation = "other"

var (
	// apiCalls counts REST calls by platform, operation and status code
	// (0: no answer, or refused locally by a rate-limit gate).
	apiCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "hyperfleet", Name: "ci_api_calls_total",
		Help: "CI platform REST API calls, by platform (workload type), operation and HTTP status code (0 when no answer came back).",
	}, []string{"platform", "operation", "code"})

	// apiCallSeconds is their latency.
	apiCallSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "hyperfleet", Name: "ci_api_call_duration_seconds",
		Help:    "Latency of CI platform REST API calls, by platform and operation.",
		Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
	}, []string{"platform", "operation"})

	// rateRemaining is the rate-limit budget a platform last reported for
	// one account.
	rateRemaining = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "hyperfleet", Name: "ci_ratelimit_remaining",
		Help: "Requests left in the current rate-limit window the CI platform last reported, by platform and account (GitHub: the owner; GitLab: the instance URL; Buildkite: the organization).",
	}, []string{"platform", "account"})

	// secondaryActive is 1 while a platform's secondary (abuse) limit
	// holds an account's calls back; only GitHub has one.
	secondaryActive = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "hyperfleet", Name: "ci_secondary_ratelimit_active",
		Help: "1 while the CI platform's secondary rate limit holds an account's calls back (GitHub only), by platform and account.",
	}, []string{"platform", "account"})
)

// Register registers the family with reg (nil registers nothing); every
// back-end calls it, and a second registration of the same family is
// success.
func Register(reg prometheus.Registerer) error {
	return workload.RegisterCollectors(reg, apiCalls, apiCallSeconds, rateRemaining, secondaryActive)
}

// Platform records one platform's calls.
type Platform struct {
	name       string
	operations []string
}

// New describes a platform: its workload type and every operation name its
// calls are recorded under (OtherOperation is always allowed).
func New(platform hfv1.WorkloadType, operations ...string) *Platform {
	return &Platform{name: string(platform), operations: slices.Clone(operations)}
}

// Operations are the platform's declared operation names.
func (p *Platform) Operations() []string { return slices.Clone(p.operations) }

// operation is op when declared, OtherOperation otherwise.
func (p *Platform) operation(op string) string {
	if slices.Contains(p.operations, op) {
		return op
	}
	return OtherOperation
}

// ObserveCall records one call: its operation, its HTTP status code (0
// when no answer came) and how long it took.
func (p *Platform) ObserveCall(op string, code int, d time.Duration) {
	op = p.operation(op)
	apiCalls.WithLabelValues(p.name, op, strconv.Itoa(code)).Inc()
	apiCallSeconds.WithLabelValues(p.name, op).Observe(d.Seconds())
}

// ObserveRemaining records the rate-limit budget the platform reported for
// account.
func (p *Platform) ObserveRemaining(account string, remaining int) {
	rateRemaining.WithLabelValues(p.name, account).Set(float64(remaining))
}

// ObserveSecondaryLimit records whether a secondary rate limit holds
// account's calls back.
func (p *Platform) ObserveSecondaryLimit(account string, active bool) {
	v := 0.0
	if active {
		v = 1
	}
	secondaryActive.WithLabelValues(p.name, account).Set(v)
}

// Transport records every call through next with the operation opOf names
// (a route, never an id), its status code and latency.
func (p *Platform) Transport(next http.RoundTripper, opOf func(*http.Request) string) http.RoundTripper {
	return Observed(next, opOf, p.ObserveCall)
}

// Observed is next with every call shown to observe: the operation opOf
// names, the status code (0 when no answer came) and the latency.
func Observed(next http.RoundTripper, opOf func(*http.Request) string, observe func(op string, code int, d time.Duration)) http.RoundTripper {
	return observed{next: next, observe: observe, opOf: opOf}
}

type observed struct {
	next    http.RoundTripper
	observe func(op string, code int, d time.Duration)
	opOf    func(*http.Request) string
}

func (o observed) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := o.next.RoundTrip(req)
	code := 0
	if resp != nil {
		code = resp.StatusCode
	}
	o.observe(o.opOf(req), code, time.Since(start))
	return resp, err
}
