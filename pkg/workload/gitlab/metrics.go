package gitlab

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload/workloadmetrics"
)

// metrics records GitLab's calls in the CI platform API family
// (pkg/workload/workloadmetrics), which NewBackend registers with the
// operator's registry (workload.Dependencies.Metrics); its operations are
// the ones operation names.
var metrics = workloadmetrics.New(hfv1.WorkloadGitLabCI,
	"create_runner", "read_token", "list_runners", "read_runner", "update_runner", "delete_runner",
	"read_project", "read_group", "list_projects", "list_jobs", "read_job", "cancel_pipeline")

// operation names a REST call by what it does, from a fixed set, so that
// no id or path reaches the metrics.
func operation(method, path string) string {
	_, rest, ok := strings.Cut(path, "/api/v4/")
	if !ok {
		return "other"
	}
	seg := strings.Split(strings.Trim(rest, "/"), "/")
	last := seg[len(seg)-1]
	switch {
	case method == http.MethodPost && rest == "user/runners":
		return "create_runner"
	case rest == "personal_access_tokens/self":
		return "read_token"
	case rest == "runners/all":
		return "list_runners"
	case seg[0] == "runners" && len(seg) == 2:
		if op, ok := map[string]string{http.MethodGet: "read_runner", http.MethodPut: "update_runner", http.MethodDelete: "delete_runner"}[method]; ok {
			return op
		}
	case (seg[0] == "projects" || seg[0] == "groups") && len(seg) == 2:
		return "read_" + strings.TrimSuffix(seg[0], "s")
	case (seg[0] == "projects" || seg[0] == "groups") && len(seg) == 3 && last == "runners":
		return "list_runners"
	case seg[0] == "groups" && len(seg) == 3 && last == "projects":
		return "list_projects"
	case seg[0] == "projects" && len(seg) == 3 && last == "jobs":
		return "list_jobs"
	case seg[0] == "projects" && len(seg) == 4 && seg[2] == "jobs":
		return "read_job"
	case seg[0] == "projects" && len(seg) == 5 && seg[2] == "pipelines" && last == "cancel":
		return "cancel_pipeline"
	}
	return "other"
}

// observed is a RoundTripper that records every call's operation, status,
// latency and the rate-limit budget GitLab reports.
type observed struct {
	next     http.RoundTripper
	instance string
}

func (o observed) RoundTrip(r *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := o.next.RoundTrip(r)
	op, code := operation(r.Method, r.URL.EscapedPath()), 0
	if resp != nil {
		code = resp.StatusCode
		if v, perr := strconv.Atoi(resp.Header.Get("RateLimit-Remaining")); perr == nil {
			metrics.ObserveRemaining(o.instance, v)
		}
	}
	metrics.ObserveCall(op, code, time.Since(start))
	return resp, err
}
