package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// value reads one series; ok is false when it does not exist.
func value(t *testing.T, c prometheus.Collector, name string, labels map[string]string) (v float64, ok bool) {
	t.Helper()
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		match := true
		for _, l := range d.GetLabel() {
			if want, set := labels[l.GetName()]; set && want != l.GetValue() {
				match = false
			}
		}
		if !match || ok {
			continue
		}
		ok = true
		switch {
		case d.Counter != nil:
			v = d.GetCounter().GetValue()
		case d.Gauge != nil:
			v = d.GetGauge().GetValue()
		default:
			t.Fatalf("%s is neither a counter nor a gauge", name)
		}
	}
	return v, ok
}

// TestSeriesStartAtZero: the series alerts and panels compare exist, at
// zero, before anything is counted, and a count already made is kept.
func TestSeriesStartAtZero(t *testing.T) {
	OrphansFound.WithLabelValues("kept").Add(2)
	for _, cluster := range []string{"zero-a", "kept"} {
		SweepingCluster(cluster)
	}
	SweepingRunnerScope("octo-org")
	CloneQueueDepth.WithLabelValues("zero-a").Set(3)
	NewProviderObserver("zero-a").APICall("GET", "/version", 200, 0)
	for _, tc := range []struct {
		c      prometheus.Collector
		name   string
		labels map[string]string
		want   float64
	}{
		{OrphansFound, "orphan_vms_found_total", map[string]string{"hypervisor_cluster": "zero-a"}, 0},
		{OrphansFound, "orphan_vms_found_total", map[string]string{"hypervisor_cluster": "kept"}, 2},
		{OrphansRemoved, "orphan_vms_removed_total", map[string]string{"hypervisor_cluster": "zero-a"}, 0},
		{OrphanMediaFound, "orphan_isos_found_total", map[string]string{"hypervisor_cluster": "zero-a"}, 0},
		{OrphanMediaRemoved, "orphan_isos_removed_total", map[string]string{"hypervisor_cluster": "zero-a"}, 0},
		{OrphanRunnersFound, "orphan_runners_found_total", map[string]string{"scope": "octo-org"}, 0},
		{OrphanRunnersRemoved, "orphan_runners_removed_total", map[string]string{"scope": "octo-org"}, 0},
		{CloneQueueDepth, "clone_queue_depth", map[string]string{"hypervisor_cluster": "zero-a"}, 0},
	} {
		got, ok := value(t, tc.c, tc.name, tc.labels)
		if !ok || got != tc.want {
			t.Errorf("%s%v: %v (exists %v), want %v", tc.name, tc.labels, got, ok, tc.want)
		}
	}
	ForgetCluster("zero-a")
	if _, ok := value(t, OrphansFound, "orphan_vms_found_total", map[string]string{"hypervisor_cluster": "zero-a"}); ok {
		t.Error("ForgetCluster left the orphan counter of the cluster")
	}
}
