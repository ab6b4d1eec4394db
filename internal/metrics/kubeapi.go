package metrics

import (
	"net/http"
	"strings"

	"k8s.io/client-go/rest"
)

// KubeAPIRequests counts the manager's requests to the Kubernetes API by
// verb and resource: client-go's own rest_client_requests_total has no
// path, so it cannot tell a status write from an event or a lease renewal.
var KubeAPIRequests = NewCounterVec("kube_api_requests_total",
	"Requests of the manager to the Kubernetes API, by verb (WATCH and LIST apart from GET), resource and subresource.",
	"verb", "resource", "subresource")

// CountKubeAPIRequests wraps cfg's transport so that every request is
// counted in KubeAPIRequests.
func CountKubeAPIRequests(cfg *rest.Config) {
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return kubeCounter{rt}
	})
}

type kubeCounter struct{ next http.RoundTripper }

func (k kubeCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	verb, resource, sub := KubeRequestLabels(r)
	KubeAPIRequests.WithLabelValues(verb, resource, sub).Inc()
	return k.next.RoundTrip(r)
}

// KubeRequestLabels names a Kubernetes API request: its verb (GET on a
// collection is LIST, with watch=true WATCH), its resource (group/resource
// for named groups) and subresource. Paths outside /api and /apis are
// "other".
func KubeRequestLabels(r *http.Request) (verb, resource, subresource string) {
	verb = r.Method
	segs := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	var group string
	switch {
	case len(segs) >= 2 && segs[0] == "api":
		segs = segs[2:]
	case len(segs) >= 3 && segs[0] == "apis":
		group, segs = segs[1], segs[3:]
	case segs[0] == "api" || segs[0] == "apis":
		return verb, "discovery", ""
	default:
		return verb, "other", ""
	}
	if len(segs) >= 3 && segs[0] == "namespaces" {
		segs = segs[2:]
	}
	if len(segs) == 0 {
		return verb, "discovery", ""
	}
	resource = segs[0]
	if group != "" {
		resource = group + "/" + resource
	}
	if len(segs) >= 3 {
		subresource = segs[2]
	}
	if verb == http.MethodGet && len(segs) == 1 {
		verb = "LIST"
		if r.URL.Query().Get("watch") == "true" {
			verb = "WATCH"
		}
	}
	return verb, resource, subresource
}
