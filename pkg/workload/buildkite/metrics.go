package buildkite

import (
	"net/http"
	"strings"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload/workloadmetrics"
)

// metrics records Buildkite's calls in the CI platform API family
// (pkg/workload/workloadmetrics), which NewBackend registers with the
// operator's registry (workload.Dependencies.Metrics); its operations are
// the ones operation names, and its rate-limit account is the
// organization (Buildkite's REST budget is the organization's).
var metrics = workloadmetrics.New(hfv1.WorkloadBuildkite,
	"read_access_token", "read_organization", "read_cluster", "list_tokens", "create_token", "delete_token",
	"list_agents", "stop_agent", "list_builds", "cancel_build")

// operation names a REST call by its route, from the fixed set above, so
// that no slug or id reaches a label.
func operation(req *http.Request) string {
	_, rest, ok := strings.Cut(req.URL.Path, "/v2/")
	if !ok {
		return workloadmetrics.OtherOperation
	}
	seg := strings.Split(strings.Trim(rest, "/"), "/")
	n, last, m := len(seg), seg[len(seg)-1], req.Method
	switch {
	case rest == "access-token" && m == http.MethodGet:
		return "read_access_token"
	case seg[0] != "organizations":
	case n == 2 && m == http.MethodGet:
		return "read_organization"
	case n == 4 && seg[2] == "clusters" && m == http.MethodGet:
		return "read_cluster"
	case n == 5 && seg[2] == "clusters" && last == "tokens":
		switch m {
		case http.MethodGet:
			return "list_tokens"
		case http.MethodPost:
			return "create_token"
		}
	case n == 6 && seg[2] == "clusters" && seg[4] == "tokens" && m == http.MethodDelete:
		return "delete_token"
	case n == 3 && last == "agents" && m == http.MethodGet:
		return "list_agents"
	case n == 5 && seg[2] == "agents" && last == "stop" && m == http.MethodPut:
		return "stop_agent"
	case (n == 3 || n == 5 && seg[2] == "pipelines") && last == "builds" && m == http.MethodGet:
		return "list_builds"
	case n == 7 && seg[2] == "pipelines" && seg[4] == "builds" && last == "cancel" && m == http.MethodPut:
		return "cancel_build"
	}
	return workloadmetrics.OtherOperation
}
