package workloadtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// MetricValue reads the CI platform API metrics (pkg/workload/workloadmetrics)
// back in the back-ends' tests, through a registry as Prometheus scrapes
// them: the sum, over every series of the metric name that g gathers
// and whose labels include labels, of its counter, gauge or untyped value,
// or of its histogram's sample count.
func MetricValue(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			case m.Untyped != nil:
				sum += m.GetUntyped().GetValue()
			}
		}
	}
	return sum
}
