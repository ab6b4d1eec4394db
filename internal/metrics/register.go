package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The functions below declare a HyperFleet metric, named
// hyperfleet_<name>, and register it on controller-runtime's registry, so
// that the manager's /metrics endpoint serves it. Declared through them, a
// metric cannot be left out of the registry or named outside the
// namespace; this package's metrics and those of other packages of the
// manager (internal/webhook, internal/httpsserver) are.

// NewCounter declares and registers a counter.
func NewCounter(name, help string) prometheus.Counter {
	return register(prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}))
}

// NewCounterVec declares and registers a counter family with labels.
func NewCounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return register(prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, labels))
}

// NewGauge declares and registers a gauge.
func NewGauge(name, help string) prometheus.Gauge {
	return register(prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help}))
}

// NewGaugeVec declares and registers a gauge family with labels.
func NewGaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return register(prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help}, labels))
}

// NewHistogram declares and registers a histogram with buckets.
func NewHistogram(name, help string, buckets []float64) prometheus.Histogram {
	return register(prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: name, Help: help, Buckets: buckets}))
}

// NewHistogramVec declares and registers a histogram family with buckets
// and labels.
func NewHistogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return register(prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: name, Help: help, Buckets: buckets}, labels))
}

func register[C prometheus.Collector](c C) C {
	crmetrics.Registry.MustRegister(c)
	return c
}
