package gitlab_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	glworkload "github.com/hyperfleet/hyperfleet/pkg/workload/gitlab"
)

func gitlabTemplate(g *hfv1.GitLabBootstrap) *hfv1.HypervisorMachineTemplate {
	return &hfv1.HypervisorMachineTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "tpl", Namespace: "ci"},
		Spec:       hfv1.HypervisorMachineTemplateSpec{Bootstrap: hfv1.Bootstrap{GitLab: g}},
	}
}

// TestBackendReadsTheAPI: the template's, pool's and claim's sections in
// neutral terms, with the defaults applied.
func TestBackendReadsTheAPI(t *testing.T) {
	be, err := glworkload.NewBackend(workload.Dependencies{})
	if err != nil {
		t.Fatal(err)
	}
	token := hfv1.LocalSecretKeySelector{Name: "gl", Key: "token"}
	if _, ok := be.Template(&hfv1.HypervisorMachineTemplate{}); ok {
		t.Fatal("a template without bootstrap.gitlab was read")
	}
	for _, tc := range []struct {
		g     hfv1.GitLabBootstrap
		scope workload.Scope
		field string
	}{
		{hfv1.GitLabBootstrap{Project: "acme/platform/app"}, workload.Scope{Owner: "acme/platform", Repository: "app"}, "spec.bootstrap.gitlab.project"},
		{hfv1.GitLabBootstrap{Group: "acme/platform"}, workload.Scope{Owner: "acme/platform"}, "spec.bootstrap.gitlab.group"},
		{hfv1.GitLabBootstrap{Instance: true}, workload.Scope{Instance: true}, "spec.bootstrap.gitlab.instance"},
	} {
		tc.g.Credentials.Token = token
		tt, ok := be.Template(gitlabTemplate(&tc.g))
		if !ok || tt.Scope != tc.scope || tt.ScopeField != tc.field || tt.Endpoint != "" || tt.RegistrationURL != "https://gitlab.com" ||
			tt.Secrets["spec.bootstrap.gitlab.credentials.token"] != token || tt.CredentialsKey == "" || len(tt.DefaultLabels) != 0 {
			t.Fatalf("template %+v: %+v", tc.g, tt)
		}
		if r := tt.Runner; r.InstallPath != "/usr/local/bin" || r.RunScript != "gitlab-runner" || r.WorkDir != "/var/lib/hyperfleet/builds" || r.OS != "linux" || r.Arch != "amd64" || r.DownloadURL != "" {
			t.Fatalf("runner defaults: %+v", r)
		}
	}
	self := gitlabTemplate(&hfv1.GitLabBootstrap{URL: "https://gitlab.example.com", Group: "acme", Credentials: hfv1.GitLabCredentials{Token: token},
		Runner: &hfv1.GitLabRunnerSoftware{DownloadURL: "https://dl.example.com/gitlab-runner-{os}-{arch}", DownloadSHA256: "ab", Arch: "arm64", BuildsDir: "/srv/builds"}})
	tt, _ := be.Template(self)
	if tt.Endpoint != "https://gitlab.example.com" || tt.Runner.DownloadURL != "https://dl.example.com/gitlab-runner-linux-arm64" || tt.Runner.WorkDir != "/srv/builds" ||
		tt.Runner.InstallPath != "/opt/gitlab-runner" || tt.Runner.RunScript != "gitlab-runner" || tt.AgentPlatform != "gitlab-ci" || tt.BootstrapMethod != "runner-auth-token" {
		t.Fatalf("self-managed template: %+v", tt)
	}
	other := self.DeepCopy()
	other.Spec.Bootstrap.GitLab.Credentials.Token.Key = "other"
	if t2, _ := be.Template(other); t2.CredentialsKey == tt.CredentialsKey {
		t.Fatal("another token key has the same credentials key")
	}

	pool := &hfv1.RunnerPool{Spec: hfv1.RunnerPoolSpec{Workload: hfv1.Workload{Type: hfv1.WorkloadGitLabCI, GitLab: &hfv1.GitLabWorkload{Tags: []string{"linux"}, RunUntagged: ptr.To(true)}}}}
	p, ok := be.Pool(pool, self)
	if !ok || p.Scope != (workload.Scope{Host: "gitlab.example.com", Owner: "acme"}) || p.OwnScope || !slices.Equal(p.Labels, []string{"linux"}) ||
		p.Claim.Type != hfv1.WorkloadGitLabCI || !slices.Equal(p.Claim.GitLab.Tags, []string{"linux"}) || !*p.Claim.GitLab.RunUntagged {
		t.Fatalf("pool: %+v", p)
	}
	pool.Spec.Workload.GitLab.Project = "acme/platform/app"
	if p, _ := be.Pool(pool, self); p.Scope != (workload.Scope{Host: "gitlab.example.com", Owner: "acme/platform", Repository: "app"}) || !p.OwnScope || p.ScopeField != "spec.workload.gitlab.project" {
		t.Fatalf("narrowed pool: %+v", p)
	}
	if _, ok := be.Pool(&hfv1.RunnerPool{Spec: hfv1.RunnerPoolSpec{Workload: hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{}}}}, self); ok {
		t.Fatal("a GitHub pool was read")
	}
	claim := &hfv1.MachineClaim{Spec: hfv1.MachineClaimSpec{WorkloadConfig: &hfv1.WorkloadConfig{Type: hfv1.WorkloadGitLabCI, GitLab: &hfv1.GitLabRunnerConfig{Tags: []string{"gpu"}, RunUntagged: ptr.To(false)}}}}
	if c := be.Claim(claim); !slices.Equal(c.Labels, []string{"gpu"}) || c.RunUntagged == nil || *c.RunUntagged {
		t.Fatalf("claim: %+v", c)
	}
}

// TestBackendProvider builds a Provider from a template and its Secret,
// keeps it while nothing changes, and reads a rotated token.
func TestBackendProvider(t *testing.T) {
	w := newWorld(t, nil)
	ctx := context.Background()
	be, _ := glworkload.NewBackend(workload.Dependencies{})
	tmpl := gitlabTemplate(&hfv1.GitLabBootstrap{URL: w.srv.URL, Project: "acme/platform/app", Credentials: hfv1.GitLabCredentials{Token: hfv1.LocalSecretKeySelector{Name: "gl", Key: "token"}}})
	value := maintPAT + "\n"
	secrets := func(_ context.Context, field, ns string, ref hfv1.LocalSecretKeySelector) ([]byte, error) {
		if field != "spec.bootstrap.gitlab.credentials.token" || ns != "ci" || ref.Name != "gl" {
			return nil, errors.New("unexpected secret read")
		}
		return []byte(value), nil
	}
	tt, _ := be.Template(tmpl)
	p1, err := be.Provider(ctx, tmpl, tt.Scope, secrets)
	if err != nil {
		t.Fatal(err)
	}
	if err := p1.VerifyScope(ctx); err != nil {
		t.Fatalf("VerifyScope with the template's token: %v", err)
	}
	if p2, _ := be.Provider(ctx, tmpl, tt.Scope, secrets); p2 != p1 {
		t.Fatal("the provider was rebuilt with nothing changed")
	}
	value = devPAT
	p3, _ := be.Provider(ctx, tmpl, tt.Scope, secrets)
	if p3 == p1 {
		t.Fatal("a rotated token kept the old provider")
	}
	err = p3.VerifyScope(ctx)
	if !errors.Is(err, workload.ErrUnauthorized) {
		t.Fatalf("VerifyScope as a developer: %v", err)
	}
	if c := workload.Classified(be.Name(), err); errclass.Classify(c) != errclass.ClassConfiguration || errclass.ReasonOf(c) != "GitLabUnauthorized" {
		t.Fatalf("classified as %v, reason %q; want a configuration error, reason GitLabUnauthorized", errclass.Classify(c), errclass.ReasonOf(c))
	}
}
