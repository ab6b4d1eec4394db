package platformbackend

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// testBackend is a platform's back-end as Factory builds one: its Base and
// the platform's own methods.
type testBackend struct {
	Base[workload.Provider]
}

func (*testBackend) Template(*hfv1.HypervisorMachineTemplate) (workload.Template, bool) {
	return workload.Template{}, false
}

func (*testBackend) Pool(*hfv1.RunnerPool, *hfv1.HypervisorMachineTemplate) (workload.Pool, bool) {
	return workload.Pool{}, false
}

func (*testBackend) Claim(*hfv1.MachineClaim) workload.ClaimRunner { return workload.ClaimRunner{} }

func (b *testBackend) Provider(_ context.Context, tmpl *hfv1.HypervisorMachineTemplate, scope workload.Scope, _ workload.SecretReader) (workload.Provider, error) {
	return b.CachedProvider(tmpl, scope, "fp", func() (workload.Provider, error) { return nil, errors.New("no such key") })
}

var testIdentity = Identity{Name: "Acme", TemplateField: "spec.bootstrap.acme", Webhooks: workload.WebhookFormat{Path: "/webhooks/acme"}}

// TestFactoryBuildsTheBaseIntoTheBackend: the back-end Factory returns is
// the platform's type, with its Identity's name, section and webhook
// format, its metrics registered, and a provider cache.
func TestFactoryBuildsTheBaseIntoTheBackend(t *testing.T) {
	reg := prometheus.NewRegistry()
	be, err := Factory[workload.Provider, testBackend](testIdentity)(workload.Dependencies{Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	tb, ok := be.(*testBackend)
	if !ok {
		t.Fatalf("Factory built a %T, want *testBackend", be)
	}
	if tb.Name() != "Acme" || tb.TemplateField() != "spec.bootstrap.acme" || tb.WebhookFormat().Path != "/webhooks/acme" {
		t.Fatalf("back-end is %q, %q, %+v; want the Identity's", tb.Name(), tb.TemplateField(), tb.WebhookFormat())
	}
	if tb.Metrics != reg {
		t.Fatal("the back-end does not keep the Dependencies it was built with")
	}
	if err := reg.Register(prometheus.NewCounter(prometheus.CounterOpts{Name: "hyperfleet_ci_api_calls_total"})); err == nil {
		t.Fatal("the CI platform API metrics are not registered")
	}
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: "ns"}}
	_, err = tb.Provider(context.Background(), tmpl, workload.Scope{Owner: "o"}, nil)
	if errclass.Classify(err) != errclass.ClassConfiguration || errclass.ReasonOf(err) != "AcmeCredentialsInvalid" {
		t.Fatalf("a provider that cannot be built: %v (class %v, reason %q); want a configuration error AcmeCredentialsInvalid", err, errclass.Classify(err), errclass.ReasonOf(err))
	}
}
