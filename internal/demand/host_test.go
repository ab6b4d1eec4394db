package demand

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/gitlab/gitlabsimtest"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// verifiedPool is a pool of template tmpl (its section w) whose scope
// check passed, as the pool controller records it once the template's
// credentials answered for the scope: the attack needs nothing more, since
// a server the tenant runs answers for any scope.
func verifiedPool(t *testing.T, be workload.Backend, tmpl *hfv1.HypervisorMachineTemplate, ns, name string, w hfv1.Workload) *hfv1.RunnerPool {
	t.Helper()
	p := &hfv1.RunnerPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: hfv1.RunnerPoolSpec{
		TemplateRef: hfv1.ObjectName{Name: tmpl.Name}, Workload: w}}
	wp, ok := be.Pool(p, tmpl)
	tt, _ := be.Template(tmpl)
	if !ok {
		t.Fatalf("pool %s/%s has no %s section", ns, name, be.Name())
	}
	p.Status.Conditions = []metav1.Condition{{Type: string(hfv1.RunnerPoolScopeVerifiedCondition), Status: metav1.ConditionTrue,
		Reason: string(hfv1.ScopeVerifiedReason), LastTransitionTime: metav1.Now()}}
	p.Status.ScopeVerification = &hfv1.ScopeVerification{Scope: wp.Scope.String(), Template: tmpl.Name, Credentials: tt.CredentialsKey}
	return p
}

// TestRouteTwoHostsNamingOneOrganization performs the attack of a tenant
// whose template names an API host it runs (a server that answers 200 for
// any organization's runner list, so its pool's scope "verifies"), for a
// repository of the victim's organization on GitHub.com. Routing compared
// owners and repositories only: the tenant's repository pool was more
// specific than the victim's organization pool, won the victim's jobs and
// recorded them in the tenant's namespace, and the victim's pool never
// scaled. Now a job routes only to pools of the host it came from.
func TestRouteTwoHostsNamingOneOrganization(t *testing.T) {
	be, _ := ciPlatforms.For(hfv1.WorkloadGitHubActions)
	pat := hfv1.GitHubCredentials{PAT: &hfv1.LocalSecretKeySelector{Name: "gh", Key: "token"}}
	victimTmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "victim", Name: "gh"},
		Spec: hfv1.HypervisorMachineTemplateSpec{Bootstrap: hfv1.Bootstrap{GitHub: &hfv1.GitHubBootstrap{Organization: "victim-org", Credentials: pat}}}}
	tenantTmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "gh"},
		Spec: hfv1.HypervisorMachineTemplateSpec{Bootstrap: hfv1.Bootstrap{GitHub: &hfv1.GitHubBootstrap{Organization: "victim-org", Credentials: pat,
			APIBaseURL: "https://evil.example.net/api/v3"}}}}
	victim := verifiedPool(t, be, victimTmpl, "victim", "runners", hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{}})
	// The tenant's pool is the more specific one: a repository scope.
	tenant := verifiedPool(t, be, tenantTmpl, "tenant", "runners", hfv1.Workload{Type: hfv1.WorkloadGitHubActions,
		GitHub: &hfv1.GitHubWorkload{Repository: "victim-org/app"}})
	router := NewRouter(routerWorld(t, victimTmpl, tenantTmpl, victim, tenant), ciPlatforms)

	job := workload.Job{ID: "4242", Platform: hfv1.WorkloadGitHubActions, Repository: "victim-org/app", Labels: []string{"self-hosted"}, State: workload.JobQueued}
	for _, tc := range []struct {
		name, host string
		want       types.NamespacedName
	}{
		// GitHub.com's delivery (verified with GitHub.com's webhook
		// secret): the victim's pool, not the tenant's.
		{"a job of GitHub.com", "", nn("victim", "runners")},
		// A job the tenant's own server reports (its resync, its
		// webhook) stays the tenant's.
		{"a job of the tenant's host", "evil.example.net", nn("tenant", "runners")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := job
			j.Host = tc.host
			d, err := router.Route(context.Background(), j)
			if err != nil {
				t.Fatal(err)
			}
			if d.Pool == nil || d.Pool.Pool != tc.want || len(d.Ambiguous) > 0 {
				t.Fatalf("job of host %q routed to %+v (ambiguous %v); want %s alone", tc.host, d.Pool, d.Ambiguous, tc.want)
			}
		})
	}
	t.Run("a third host", func(t *testing.T) {
		j := job
		j.Host = "ghes.example.com"
		if d, _ := router.Route(context.Background(), j); d.Pool != nil || d.InScope() {
			t.Fatalf("a job of a host no pool is on was routed: %+v", d)
		}
	})
}

// TestRouteGitLabInstanceScopeOnAForeignHost performs the attack of a
// tenant whose template makes instance runners (scope: every project) on a
// GitLab it runs: a Job Hook does not carry the job's tags, so routing
// reads the job with the account of a verified pool whose scope holds the
// job, and that was the tenant's first (its namespace sorts first): its
// server learnt every hook's project and job id and chose the labels that
// routed the job, here to the tenant's pool. Now only pools of the hook's
// host read it: the tenant's server is never asked.
func TestRouteGitLabInstanceScopeOnAForeignHost(t *testing.T) {
	backends, err := workload.NewBackends(gitlabsimtest.Workloads(), workload.Dependencies{})
	if err != nil {
		t.Fatal(err)
	}
	be, _ := backends.For(hfv1.WorkloadGitLabCI)
	token := hfv1.GitLabCredentials{Token: hfv1.LocalSecretKeySelector{Name: "gl", Key: "token"}}
	victimTmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "victim", Name: "gl"},
		Spec: hfv1.HypervisorMachineTemplateSpec{Bootstrap: hfv1.Bootstrap{GitLab: &hfv1.GitLabBootstrap{Group: "acme", Credentials: token}}}}
	tenantTmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "a-tenant", Name: "gl"},
		Spec: hfv1.HypervisorMachineTemplateSpec{Bootstrap: hfv1.Bootstrap{GitLab: &hfv1.GitLabBootstrap{Instance: true, Credentials: token,
			URL: "https://evil.example.net"}}}}
	victim := verifiedPool(t, be, victimTmpl, "victim", "linux", hfv1.Workload{Type: hfv1.WorkloadGitLabCI, GitLab: &hfv1.GitLabWorkload{Tags: []string{"linux"}}})
	tenant := verifiedPool(t, be, tenantTmpl, "a-tenant", "all", hfv1.Workload{Type: hfv1.WorkloadGitLabCI, GitLab: &hfv1.GitLabWorkload{Tags: []string{"stolen"}}})
	readers := hostReaders{
		nn("victim", "linux"): {labels: []string{"linux"}},
		nn("a-tenant", "all"): {labels: []string{"stolen"}},
	}
	router := NewRouter(routerWorld(t, victimTmpl, tenantTmpl, victim, tenant), backends).ReadJobsWith(readers)

	// A Job Hook from GitLab.com: its tags unknown until read.
	hook := workload.Job{ID: "9000001", Platform: hfv1.WorkloadGitLabCI, Repository: "acme/platform/app", LabelsUnknown: true, State: workload.JobQueued}
	d, err := router.Route(context.Background(), hook)
	if err != nil {
		t.Fatal(err)
	}
	if n := readers[nn("a-tenant", "all")].asked; n != 0 {
		t.Errorf("the tenant's GitLab was asked %d times about a GitLab.com job (its project and id)", n)
	}
	if d.Pool == nil || d.Pool.Pool != nn("victim", "linux") {
		t.Fatalf("GitLab.com's job routed to %+v with labels %v; want victim/linux", d.Pool, d.Job.Labels)
	}
}

// routerWorld is a fake API server holding objs, as the router reads them
// from the manager's cache.
func routerWorld(t *testing.T, objs ...client.Object) client.Client {
	t.Helper()
	scheme, err := testenv.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
}

// hostReaders read every job with the labels their pool's platform
// "reports", counting what each pool's account was asked.
type hostReaders map[types.NamespacedName]*hostReader

type hostReader struct {
	labels []string
	asked  int
}

func (r hostReaders) JobReaderFor(_ context.Context, pool types.NamespacedName) (workload.JobReader, error) {
	return r[pool], nil
}

func (r *hostReader) GetJob(_ context.Context, repository, id string) (workload.Job, error) {
	r.asked++
	return workload.Job{ID: id, Repository: repository, Labels: r.labels, State: workload.JobQueued}, nil
}
