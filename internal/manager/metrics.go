package manager

import (
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// MetricsOptions serve /metrics on addr: plain HTTP, or with secure HTTPS
// where every scrape is authenticated (TokenReview) and authorized
// (SubjectAccessReview: get on the non-resource URL /metrics) against the
// API server, so that the endpoint tells nothing to whoever reaches the
// pod's port. certDir holds tls.crt and tls.key; empty makes a self-signed
// certificate at start.
func MetricsOptions(addr string, secure bool, certDir string) metricsserver.Options {
	o := metricsserver.Options{BindAddress: addr}
	if secure {
		o.SecureServing = true
		o.FilterProvider = filters.WithAuthenticationAndAuthorization
		o.CertDir = certDir
	}
	return o
}
