package webhook

import (
	"os"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// lazyEnv starts the API server on first use, so the unit and fuzz tests
// run without it.
var lazyEnv testenv.Lazy

func testEnv(t *testing.T) *testenv.Environment {
	t.Helper()
	return lazyEnv.Get(t)
}

func TestMain(m *testing.M) { os.Exit(lazyEnv.Main(m)) }

// ciPlatforms are the CI platform back-ends routing is tested with: GitHub
// Actions, as the operator binary registers it.
var ciPlatforms = func() *workload.Backends {
	b, err := workload.NewBackends(map[hfv1.WorkloadType]workload.Factory{hfv1.WorkloadGitHubActions: github.NewBackend}, workload.Dependencies{})
	if err != nil {
		panic(err)
	}
	return b
}()

// scopeVerification is what the RunnerPool controller records in p's
// status once the credentials of tmpl, its template, reach its scope;
// false when the pool names no scope.
func scopeVerification(p *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate) (*hfv1.ScopeVerification, bool) {
	be, ps, ok := ciPlatforms.Pool(p, tmpl)
	if !ok || ps.Scope.IsZero() {
		return nil, false
	}
	t, _ := be.Template(tmpl)
	return &hfv1.ScopeVerification{Scope: ps.Scope.String(), Template: tmpl.Name, Credentials: t.CredentialsKey, VerifiedAt: metav1.Now()}, true
}
