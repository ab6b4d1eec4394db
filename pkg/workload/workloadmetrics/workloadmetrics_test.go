package workloadmetrics_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload/workloadmetrics"
	"github.com/hyperfleet/hyperfleet/pkg/workload/workloadtest"
)

// TestOnePlatformLabelledFamily: two platforms record into one family,
// told apart by their platform label; an undeclared operation is "other";
// registering the family twice (every back-end does) is success; a
// transport records status 0 when no answer came.
func TestOnePlatformLabelledFamily(t *testing.T) {
	reg := prometheus.NewRegistry()
	for range 2 {
		if err := workloadmetrics.Register(reg); err != nil {
			t.Fatal(err)
		}
	}
	a := workloadmetrics.New(hfv1.WorkloadType("test-a"), "read")
	b := workloadmetrics.New(hfv1.WorkloadType("test-b"), "read")
	a.ObserveCall("read", 200, time.Millisecond)
	a.ObserveCall("/repos/x/y/secret-path", 404, time.Millisecond)
	b.ObserveCall("read", 200, time.Millisecond)
	b.ObserveCall("read", 200, time.Millisecond)
	a.ObserveRemaining("acme", 42)
	a.ObserveSecondaryLimit("acme", true)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"hyperfleet_ci_api_calls_total", map[string]string{"platform": "test-a", "operation": "read", "code": "200"}, 1},
		{"hyperfleet_ci_api_calls_total", map[string]string{"platform": "test-a", "operation": "other", "code": "404"}, 1},
		{"hyperfleet_ci_api_calls_total", map[string]string{"platform": "test-b", "operation": "read", "code": "200"}, 2},
		{"hyperfleet_ci_api_call_duration_seconds", map[string]string{"platform": "test-b", "operation": "read"}, 2},
		{"hyperfleet_ci_ratelimit_remaining", map[string]string{"platform": "test-a", "account": "acme"}, 42},
		{"hyperfleet_ci_secondary_ratelimit_active", map[string]string{"platform": "test-a", "account": "acme"}, 1},
	} {
		if got := workloadtest.MetricValue(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if n := workloadtest.MetricValue(t, reg, "hyperfleet_ci_api_calls_total", map[string]string{"operation": "/repos/x/y/secret-path"}); n != 0 {
		t.Errorf("an undeclared operation reached a label")
	}

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	url := srv.URL
	srv.Close()
	c := &http.Client{Transport: a.Transport(http.DefaultTransport, func(*http.Request) string { return "read" })}
	if _, err := c.Get(url); err == nil {
		t.Fatal("a closed server answered")
	}
	if got := workloadtest.MetricValue(t, reg, "hyperfleet_ci_api_calls_total", map[string]string{"platform": "test-a", "operation": "read", "code": "0"}); got != 1 {
		t.Errorf("a call without an answer counted %v times under code 0, want 1", got)
	}
}
