package metrics

import (
	"net/http"
	"testing"
)

func TestKubeRequestLabels(t *testing.T) {
	for _, c := range []struct {
		method, url, verb, resource, sub string
	}{
		{"GET", "/api/v1/namespaces/a/secrets/s", "GET", "secrets", ""},
		{"GET", "/api/v1/namespaces/a/secrets", "LIST", "secrets", ""},
		{"GET", "/api/v1/namespaces", "LIST", "namespaces", ""},
		{"GET", "/api/v1/namespaces/a", "GET", "namespaces", ""},
		{"GET", "/apis/hyperfleet.io/v1alpha1/machineclaims?watch=true", "WATCH", "hyperfleet.io/machineclaims", ""},
		{"PATCH", "/apis/hyperfleet.io/v1alpha1/namespaces/a/machineclaims/c/status", "PATCH", "hyperfleet.io/machineclaims", "status"},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/a/leases/l", "PUT", "coordination.k8s.io/leases", ""},
		{"POST", "/api/v1/namespaces/a/events", "POST", "events", ""},
		{"GET", "/apis", "GET", "discovery", ""},
		{"GET", "/healthz", "GET", "other", ""},
	} {
		r, err := http.NewRequest(c.method, "https://k"+c.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		v, res, sub := KubeRequestLabels(r)
		if v != c.verb || res != c.resource || sub != c.sub {
			t.Errorf("%s %s: got %s %s %s, want %s %s %s", c.method, c.url, v, res, sub, c.verb, c.resource, c.sub)
		}
	}
}
