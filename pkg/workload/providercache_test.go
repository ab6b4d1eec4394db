package workload

import (
	"errors"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// countedProvider is a Provider that says which build made it.
type countedProvider struct {
	Provider
	build int
}

// TestProviderCacheKeepsAProviderWhileItsConfigurationStays: one provider
// per template and scope, built again only when its configuration's
// fingerprint changes; a failed build is not kept.
func TestProviderCacheKeepsAProviderWhileItsConfigurationStays(t *testing.T) {
	var cache ProviderCache[*countedProvider]
	builds := 0
	build := func() (*countedProvider, error) { builds++; return &countedProvider{build: builds}, nil }
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "linux"}}
	org, repo := Scope{Owner: "acme"}, Scope{Owner: "acme", Repository: "app"}

	first, _ := cache.Get(tmpl, org, "fp1", build)
	again, _ := cache.Get(tmpl, org, "fp1", build)
	other, _ := cache.Get(tmpl, repo, "fp1", build)
	if first != again || first.build != 1 || other.build != 2 {
		t.Fatalf("builds %d, %d, %d; want the first kept for its scope and another for the other scope", first.build, again.build, other.build)
	}
	changed, _ := cache.Get(tmpl, org, "fp2", build)
	if changed == first || changed.build != 3 {
		t.Fatalf("a changed configuration kept build %d", changed.build)
	}
	refused := errors.New("no client")
	if _, err := cache.Get(tmpl, org, "fp3", func() (*countedProvider, error) { return nil, refused }); !errors.Is(err, refused) {
		t.Fatalf("a failed build: %v", err)
	}
	if p, _ := cache.Get(tmpl, org, "fp3", build); p.build != 4 {
		t.Fatalf("after a failed build, build %d; want a new one", p.build)
	}
}
