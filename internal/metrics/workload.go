package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The runners of every CI platform. A platform's own metrics (its API
// calls, its rate limits) are its back-end's (pkg/workload/<platform>),
// registered through workload.Dependencies.Metrics.
var (
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
	crmetrics.Registry.MustRegister(RunnerCredentials, RunnersDeregistered)
}
