package gitlab

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	gitlabsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/gitlab"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/workloadmetrics"
	"github.com/hyperfleet/hyperfleet/pkg/workload/workloadtest"
)

// TestOperation: every call the back-end makes has its own operation name,
// without ids or paths.
func TestOperation(t *testing.T) {
	for _, tc := range []struct{ method, path, want string }{
		{http.MethodPost, "/api/v4/user/runners", "create_runner"},
		{http.MethodGet, "/api/v4/personal_access_tokens/self", "read_token"},
		{http.MethodGet, "/api/v4/runners/all", "list_runners"},
		{http.MethodGet, "/api/v4/runners/42", "read_runner"},
		{http.MethodPut, "/api/v4/runners/42", "update_runner"},
		{http.MethodDelete, "/api/v4/runners/42", "delete_runner"},
		{http.MethodGet, "/gitlab/api/v4/projects/acme%2Fapp", "read_project"},
		{http.MethodGet, "/api/v4/groups/acme%2Fplatform", "read_group"},
		{http.MethodGet, "/api/v4/projects/acme%2Fapp/runners", "list_runners"},
		{http.MethodGet, "/api/v4/groups/7/runners", "list_runners"},
		{http.MethodGet, "/api/v4/groups/7/projects", "list_projects"},
		{http.MethodGet, "/api/v4/projects/9/jobs", "list_jobs"},
		{http.MethodGet, "/api/v4/projects/9/jobs/123", "read_job"},
		{http.MethodPost, "/api/v4/projects/9/pipelines/5/cancel", "cancel_pipeline"},
		{http.MethodPatch, "/api/v4/runners/42", "other"},
		{http.MethodGet, "/api/v4/users", "other"},
		{http.MethodGet, "/elsewhere", "other"},
	} {
		if got := operation(tc.method, tc.path); got != tc.want {
			t.Errorf("operation(%s %s) = %q, want %q", tc.method, tc.path, got, tc.want)
		}
	}
}

// TestCallsAreObserved: a Provider's calls reach the metrics with their
// operation and status, and GitLab's RateLimit-Remaining.
func TestCallsAreObserved(t *testing.T) {
	sim, err := gitlabsim.New(gitlabsim.Config{
		Projects: []gitlabsim.ProjectConfig{{Path: "acme/app"}},
		Users:    []gitlabsim.UserConfig{{Username: "m", Members: map[string]int{"acme/app": gitlabsim.Maintainer}}},
		Tokens:   []gitlabsim.TokenConfig{{Token: "glpat-metrics0000000000000", User: "m", Scopes: []string{"api"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sim)
	defer func() { srv.Close(); sim.Close() }()
	p, err := New(Config{URL: srv.URL, Token: "glpat-metrics0000000000000", Scope: workload.Scope{Owner: "acme", Repository: "app"}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := workloadmetrics.Register(reg); err != nil {
		t.Fatal(err)
	}
	call := map[string]string{"platform": "gitlab-ci", "operation": "read_token", "code": "200"}
	before := workloadtest.MetricValue(t, reg, "hyperfleet_ci_api_calls_total", call)
	if err := p.VerifyScope(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := workloadtest.MetricValue(t, reg, "hyperfleet_ci_api_calls_total", call) - before; got != 1 {
		t.Fatalf("read_token 200 counted %v times, want 1", got)
	}
	if got := workloadtest.MetricValue(t, reg, "hyperfleet_ci_ratelimit_remaining", map[string]string{"platform": "gitlab-ci", "account": srv.URL}); got <= 0 {
		t.Fatalf("rate-limit budget %v, want GitLab's RateLimit-Remaining", got)
	}
}
