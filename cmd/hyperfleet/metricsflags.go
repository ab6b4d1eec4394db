package main

import (
	"flag"

	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/hyperfleet/hyperfleet/internal/manager"
)

// The /metrics defaults are the Helm chart's (charts/hyperfleet/values.yaml,
// metrics.port and metrics.secure; metricsflags_test.go keeps them equal):
// HTTPS on :8443 with every scrape authenticated and authorized, so that a
// manager started without the chart tells nothing to whoever reaches its
// port. Plain HTTP needs --metrics-secure=false, said out loud.
const (
	defaultMetricsAddr   = ":8443"
	defaultMetricsSecure = true
)

// metricsFlags are the manager's flags for its /metrics endpoint.
type metricsFlags struct {
	addr, certDir *string
	secure        *bool
}

func bindMetricsFlags(fs *flag.FlagSet) *metricsFlags {
	return &metricsFlags{
		addr: fs.String("metrics-bind-address", defaultMetricsAddr, "address the /metrics endpoint binds to; 0 disables it"),
		secure: fs.Bool("metrics-secure", defaultMetricsSecure, "serve /metrics over HTTPS and let only authenticated callers allowed get on the non-resource URL /metrics scrape it "+
			"(TokenReview and SubjectAccessReview; the Helm chart's ClusterRole hyperfleet-metrics-reader grants it); false: plain HTTP that anyone who reaches the port may read"),
		certDir: fs.String("metrics-cert-dir", "", "directory with tls.crt and tls.key for --metrics-secure; empty: a self-signed certificate made at start"),
	}
}

// options are the manager's metrics server options.
func (f *metricsFlags) options() metricsserver.Options {
	return manager.MetricsOptions(*f.addr, *f.secure, *f.certDir)
}
