package buildkite

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	bksim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/workloadmetrics"
	"github.com/hyperfleet/hyperfleet/pkg/workload/workloadtest"
)

// TestOperation: every call the back-end makes has its own operation name,
// declared in the platform's set, without slugs or ids.
func TestOperation(t *testing.T) {
	for _, tc := range []struct{ method, path, want string }{
		{http.MethodGet, "/v2/access-token", "read_access_token"},
		{http.MethodGet, "/v2/organizations/acme", "read_organization"},
		{http.MethodGet, "/v2/organizations/acme/clusters/c1", "read_cluster"},
		{http.MethodGet, "/v2/organizations/acme/clusters/c1/tokens", "list_tokens"},
		{http.MethodPost, "/v2/organizations/acme/clusters/c1/tokens", "create_token"},
		{http.MethodDelete, "/v2/organizations/acme/clusters/c1/tokens/t1", "delete_token"},
		{http.MethodGet, "/v2/organizations/acme/agents", "list_agents"},
		{http.MethodPut, "/v2/organizations/acme/agents/a1/stop", "stop_agent"},
		{http.MethodGet, "/v2/organizations/acme/builds", "list_builds"},
		{http.MethodGet, "/proxy/v2/organizations/acme/pipelines/app/builds", "list_builds"},
		{http.MethodPut, "/v2/organizations/acme/pipelines/app/builds/7/cancel", "cancel_build"},
		{http.MethodDelete, "/v2/organizations/acme", "other"},
		{http.MethodGet, "/v2/organizations/acme/pipelines/app", "other"},
		{http.MethodGet, "/v2/user", "other"},
		{http.MethodGet, "/elsewhere", "other"},
	} {
		req := httptest.NewRequest(tc.method, tc.path, nil)
		got := operation(req)
		if got != tc.want {
			t.Errorf("operation(%s %s) = %q, want %q", tc.method, tc.path, got, tc.want)
		}
		if got != workloadmetrics.OtherOperation && !slices.Contains(metrics.Operations(), got) {
			t.Errorf("operation %q is not in the platform's declared set", got)
		}
	}
}

// TestCallsAreObserved: a Provider's calls reach the CI platform API
// metrics under platform buildkite, with Buildkite's RateLimit-Remaining
// for the organization.
func TestCallsAreObserved(t *testing.T) {
	sim := bksim.New(bksim.Config{APITokens: []bksim.APIToken{{Token: "bkua_metrics", Scopes: bksim.Scopes()}}})
	srv := httptest.NewServer(sim)
	defer func() { srv.Close(); sim.Close() }()
	c := sim.CreateCluster("linux")
	p, err := New(Config{APIURL: srv.URL, Organization: "acme", Cluster: c.ID, Scope: workload.Scope{Owner: "acme"}, Token: "bkua_metrics"})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := workloadmetrics.Register(reg); err != nil {
		t.Fatal(err)
	}
	calls := func(op, code string) float64 {
		return workloadtest.MetricValue(t, reg, "hyperfleet_ci_api_calls_total", map[string]string{"platform": "buildkite", "operation": op, "code": code})
	}
	before := map[string]float64{"read_access_token": calls("read_access_token", "200"), "read_cluster": calls("read_cluster", "200")}
	if err := p.VerifyScope(context.Background()); err != nil {
		t.Fatal(err)
	}
	for op, was := range before {
		if got := calls(op, "200") - was; got != 1 {
			t.Errorf("%s 200 counted %v times, want 1", op, got)
		}
	}
	if got := workloadtest.MetricValue(t, reg, "hyperfleet_ci_ratelimit_remaining", map[string]string{"platform": "buildkite", "account": "acme"}); got <= 0 {
		t.Errorf("rate-limit budget %v, want Buildkite's RateLimit-Remaining", got)
	}
}
