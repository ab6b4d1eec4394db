package github

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

func TestRegistrationURL(t *testing.T) {
	cases := []struct {
		gh   hfv1.GitHubBootstrap
		want string
	}{
		{hfv1.GitHubBootstrap{Owner: "octo", Repository: "app"}, "https://github.com/octo/app"},
		{hfv1.GitHubBootstrap{Owner: "octo", Organization: "octo", APIBaseURL: "https://api.github.com"}, "https://github.com/octo"},
		{hfv1.GitHubBootstrap{Owner: "octo", Repository: "app", APIBaseURL: "https://ghes.example.com/api/v3"}, "https://ghes.example.com/octo/app"},
		{hfv1.GitHubBootstrap{Owner: "octo", Repository: "app", RunnerURLs: &hfv1.ScopedURLs{Repository: "https://gh.internal/{owner}/{repo}"}}, "https://gh.internal/octo/app"},
		{hfv1.GitHubBootstrap{Enterprise: "acme"}, "https://github.com/enterprises/acme"},
		{hfv1.GitHubBootstrap{Enterprise: "acme", Owner: "octo", APIBaseURL: "https://ghes.example.com/api/v3"}, "https://ghes.example.com/enterprises/acme"},
	}
	for _, tc := range cases {
		if got := registrationURL(&tc.gh); got != tc.want {
			t.Errorf("registrationURL(%+v) = %q, want %q", tc.gh, got, tc.want)
		}
	}
}

func TestPoolScope(t *testing.T) {
	repoTmpl := &hfv1.GitHubBootstrap{Owner: "octo", Repository: "app"}
	orgTmpl := &hfv1.GitHubBootstrap{Owner: "octo", Organization: "octo"}
	entTmpl := &hfv1.GitHubBootstrap{Enterprise: "acme"}
	tests := []struct {
		name   string
		w      *hfv1.GitHubWorkload
		b      *hfv1.GitHubBootstrap
		want   workload.Scope
		wantOK bool
	}{
		{"template repository", &hfv1.GitHubWorkload{}, repoTmpl, workload.Scope{Owner: "octo", Repository: "app"}, true},
		{"template organization", &hfv1.GitHubWorkload{}, orgTmpl, workload.Scope{Owner: "octo"}, true},
		{"pool repository narrows an organization template", &hfv1.GitHubWorkload{Repository: "octo/web"}, orgTmpl, workload.Scope{Owner: "octo", Repository: "web"}, true},
		{"pool organization", &hfv1.GitHubWorkload{Organization: "other"}, repoTmpl, workload.Scope{Owner: "other"}, true},
		{"pool repository without a slash", &hfv1.GitHubWorkload{Repository: "web"}, orgTmpl, workload.Scope{}, false},
		{"template with neither", &hfv1.GitHubWorkload{}, &hfv1.GitHubBootstrap{Owner: "octo"}, workload.Scope{}, false},
		{"no template", &hfv1.GitHubWorkload{}, nil, workload.Scope{}, false},
		{"enterprise template alone", &hfv1.GitHubWorkload{}, entTmpl, workload.Scope{Enterprise: "acme"}, true},
		{"organization of an enterprise", &hfv1.GitHubWorkload{Organization: "octo"}, entTmpl, workload.Scope{Enterprise: "acme", Owner: "octo"}, true},
		{"repository of an enterprise", &hfv1.GitHubWorkload{Repository: "octo/web"}, entTmpl, workload.Scope{Enterprise: "acme", Owner: "octo", Repository: "web"}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := poolScope(tc.w, tc.b)
			if got != tc.want || ok != tc.wantOK {
				t.Fatalf("poolScope = %+v, %v; want %+v, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

// TestCredentialsKeyIsStable: the key RunnerPools record in
// status.scopeVerification is computed as earlier versions computed it, so
// that an upgrade keeps every pool routed.
func TestCredentialsKeyIsStable(t *testing.T) {
	gh := hfv1.GitHubBootstrap{Owner: "octo", Organization: "octo", APIBaseURL: "https://ghes.example.com/api/v3",
		RegistrationURLs: &hfv1.ScopedURLs{Organization: "https://ghes.example.com/api/v3/orgs/{owner}/actions/runners/registration-token"},
		Credentials: hfv1.GitHubCredentials{App: &hfv1.GitHubAppCredentials{AppID: hfv1.LocalSecretKeySelector{Name: "app", Key: "id"},
			PrivateKey: hfv1.LocalSecretKeySelector{Name: "app", Key: "key"}, InstallationID: hfv1.LocalSecretKeySelector{Name: "app", Key: "inst"}}}}
	for _, tc := range []struct {
		gh   hfv1.GitHubBootstrap
		want string
	}{
		{gh, "52ab0a87cedc23a05a31752d1779589097d258b7a7b06b103f5598f30de9155a"},
		{hfv1.GitHubBootstrap{}, "4b90fb53f1f3673b952a5db13ac2098355e34461e31c3b7c5c514c9594b45580"},
	} {
		if got := credentialsKey(&tc.gh); got != tc.want {
			t.Errorf("credentialsKey(%+v) = %s, want %s", tc.gh, got, tc.want)
		}
	}
}

// TestBackendReadsTheAPI: what the back-end reads from a template, a pool
// and a claim, defaults and resolved release included.
func TestBackendReadsTheAPI(t *testing.T) {
	be, err := NewBackend(workload.Dependencies{})
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "t"}}
	tmpl.Spec.Bootstrap.GitHub = &hfv1.GitHubBootstrap{Owner: "octo", Organization: "octo", APIBaseURL: "https://ghes.example.com/api/v3", RunnerGroup: "big",
		Credentials: hfv1.GitHubCredentials{PAT: &hfv1.LocalSecretKeySelector{Name: "gh", Key: "token"}},
		Runner:      &hfv1.RunnerSoftware{Version: "latest", Arch: "arm64", DownloadURL: "https://example.com/{os}-{arch}.tgz"}}
	tmpl.Status.Runner = &hfv1.ResolvedRunner{Version: "2.329.0", DownloadURL: "https://example.com/resolved.tgz", DownloadSHA256: "ab"}
	tt, ok := be.Template(tmpl)
	if !ok {
		t.Fatal("the template was not read")
	}
	wantRunner := workload.RunnerSoftware{OS: "linux", Arch: "arm64", Version: "latest", DownloadURL: "https://example.com/resolved.tgz", DownloadSHA256: "ab",
		InstallPath: "/opt/actions-runner", WorkDir: "/var/lib/hyperfleet/work", ConfigScript: "config.sh", RunScript: "run.sh"}
	if tt.Runner != wantRunner || tt.Scope != (workload.Scope{Host: "ghes.example.com", Owner: "octo"}) || tt.ScopeField != "spec.bootstrap.github.organization" ||
		tt.Endpoint != "https://ghes.example.com/api/v3" || tt.RunnerGroup != "big" || tt.RegistrationURL != "https://ghes.example.com/octo" ||
		!slices.Equal(tt.DefaultLabels, []string{"Linux", "ARM64"}) || len(tt.Secrets) != 1 || tt.Secrets["spec.bootstrap.github.credentials.pat"].Name != "gh" ||
		!slices.Equal(tt.APIHosts, []workload.APIHost{{Field: "spec.bootstrap.github.apiBaseURL", Host: "ghes.example.com"}}) {
		t.Errorf("Template = %+v", tt)
	}

	pool := &hfv1.RunnerPool{Spec: hfv1.RunnerPoolSpec{Workload: hfv1.Workload{Type: hfv1.WorkloadGitHubActions,
		GitHub: &hfv1.GitHubWorkload{Repository: "octo/app", Labels: []string{"gpu"}, RunnerGroup: "g"}}}}
	p, ok := be.Pool(pool, tmpl)
	if !ok || p.Scope != (workload.Scope{Host: "ghes.example.com", Owner: "octo", Repository: "app"}) || !p.OwnScope || p.ScopeField != "spec.workload.github.repository" ||
		!slices.Equal(p.Labels, []string{"gpu"}) || p.Claim == nil || p.Claim.GitHub == nil || p.Claim.GitHub.RunnerGroup != "g" {
		t.Errorf("Pool = %+v", p)
	}
	p.Claim.GitHub.Labels[0] = "changed"
	if pool.Spec.Workload.GitHub.Labels[0] != "gpu" {
		t.Error("the claims' labels share the pool's")
	}
	plain := &hfv1.RunnerPool{Spec: hfv1.RunnerPoolSpec{Workload: hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{}}}}
	if p, _ := be.Pool(plain, tmpl); p.OwnScope || p.Scope != tt.Scope {
		t.Errorf("a pool naming no scope: %+v, want the template's scope", p)
	}
	if _, ok := be.Pool(&hfv1.RunnerPool{Spec: hfv1.RunnerPoolSpec{Workload: hfv1.Workload{Type: hfv1.WorkloadGitLabCI}}}, tmpl); ok {
		t.Error("a GitLab pool was read")
	}

	claim := &hfv1.MachineClaim{Spec: hfv1.MachineClaimSpec{WorkloadConfig: &hfv1.WorkloadConfig{Type: hfv1.WorkloadGitHubActions,
		GitHub: &hfv1.GitHubRunnerConfig{RunnerName: "mine", Labels: []string{"x"}, RunnerGroup: "g2"}}}}
	if got := be.Claim(claim); got.Name != "mine" || !slices.Equal(got.Labels, []string{"x"}) || got.Group != "g2" {
		t.Errorf("Claim = %+v", got)
	}
	if got := be.Claim(&hfv1.MachineClaim{}); got.Name != "" || got.Labels != nil {
		t.Errorf("Claim of a claim without workloadConfig = %+v", got)
	}
}

// TestBackendReadsTheScaleSet: a pool's scaleSet is its feed, with the
// pool's full runner labels and the runner group that applies to its
// scope; a template whose runners could not be the scale set's is a
// refusal of the feed, naming the field and the fix.
func TestBackendReadsTheScaleSet(t *testing.T) {
	be, err := NewBackend(workload.Dependencies{})
	if err != nil {
		t.Fatal(err)
	}
	tmpl := func(mut func(*hfv1.HypervisorMachineTemplate)) *hfv1.HypervisorMachineTemplate {
		tm := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "t"}}
		tm.Spec.Bootstrap.Method = hfv1.BootstrapJITConfig
		tm.Spec.Bootstrap.GitHub = &hfv1.GitHubBootstrap{Owner: "octo", Organization: "octo", RunnerGroup: "big",
			Credentials: hfv1.GitHubCredentials{PAT: &hfv1.LocalSecretKeySelector{Name: "gh", Key: "token"}}}
		if mut != nil {
			mut(tm)
		}
		return tm
	}
	pool := func(mut func(*hfv1.GitHubWorkload)) *hfv1.RunnerPool {
		w := &hfv1.GitHubWorkload{Labels: []string{"gpu"}, ScaleSet: &hfv1.GitHubScaleSet{Name: "hf-gpu"}}
		if mut != nil {
			mut(w)
		}
		return &hfv1.RunnerPool{Spec: hfv1.RunnerPoolSpec{Workload: hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: w}}}
	}
	for _, tc := range []struct {
		name    string
		pool    *hfv1.RunnerPool
		tmpl    *hfv1.HypervisorMachineTemplate
		group   string
		refusal string // a substring of FeedRefusal; empty for none
	}{
		{name: "the template's group", pool: pool(nil), tmpl: tmpl(nil), group: "big"},
		{name: "the pool's group", pool: pool(func(w *hfv1.GitHubWorkload) { w.RunnerGroup = "mine" }), tmpl: tmpl(nil), group: "mine"},
		{name: "a repository's scale set is in its Default group", pool: pool(func(w *hfv1.GitHubWorkload) { w.Repository = "octo/app" }), tmpl: tmpl(nil)},
		{name: "registration tokens", pool: pool(nil), tmpl: tmpl(func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Bootstrap.Method = hfv1.BootstrapRunnerToken }),
			group: "big", refusal: "set it to jit-config or remove scaleSet"},
		{name: "enterprise runners", pool: pool(func(w *hfv1.GitHubWorkload) { w.Organization = "octo" }), tmpl: tmpl(func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Bootstrap.GitHub.Organization, tm.Spec.Bootstrap.GitHub.Enterprise = "", "acme"
		}), group: "big", refusal: "enterprise runners"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, ok := be.Pool(tc.pool, tc.tmpl)
			if !ok || p.Feed == nil || p.Feed.Name != "hf-gpu" || p.Feed.Group != tc.group || p.FeedField != "spec.workload.github.scaleSet" ||
				!slices.Equal(p.Feed.Labels, []string{"self-hosted", "Linux", "X64", "hyperfleet", "gpu"}) {
				t.Fatalf("Pool = %+v, feed %+v", p, p.Feed)
			}
			if (tc.refusal == "") != (p.FeedRefusal == "") || !strings.Contains(p.FeedRefusal, tc.refusal) {
				t.Errorf("FeedRefusal = %q, want one with %q", p.FeedRefusal, tc.refusal)
			}
		})
	}
	if p, _ := be.Pool(pool(func(w *hfv1.GitHubWorkload) { w.ScaleSet = nil }), tmpl(nil)); p.Feed != nil || p.FeedField != "" {
		t.Errorf("a pool without a scale set has feed %+v", p.Feed)
	}
}

// TestBackendProvider: providers are kept while the credentials stay the
// same, and credentials that cannot make a client are a configuration
// error naming the field.
func TestBackendProvider(t *testing.T) {
	be, err := NewBackend(workload.Dependencies{})
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "t"}}
	tmpl.Spec.Bootstrap.GitHub = &hfv1.GitHubBootstrap{Owner: "octo", Organization: "octo",
		Credentials: hfv1.GitHubCredentials{PAT: &hfv1.LocalSecretKeySelector{Name: "gh", Key: "token"}}}
	token := "ghp_one"
	secrets := func(_ context.Context, field, namespace string, ref hfv1.LocalSecretKeySelector) ([]byte, error) {
		if field != "spec.bootstrap.github.credentials.pat" || namespace != "ci" || ref.Name != "gh" {
			t.Errorf("read %s %s/%s", field, namespace, ref.Name)
		}
		return []byte(token), nil
	}
	ctx := context.Background()
	octo := workload.Scope{Owner: "octo"}
	first, err := be.Provider(ctx, tmpl, octo, secrets)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := be.Provider(ctx, tmpl, octo, secrets); again != first {
		t.Error("a provider of unchanged credentials was built again")
	}
	token = "ghp_two"
	if rotated, _ := be.Provider(ctx, tmpl, octo, secrets); rotated == first {
		t.Error("a rotated token kept the old provider")
	}
	missing := errors.New("secret missing")
	if _, err := be.Provider(ctx, tmpl, octo, func(context.Context, string, string, hfv1.LocalSecretKeySelector) ([]byte, error) {
		return nil, missing
	}); !errors.Is(err, missing) {
		t.Errorf("a Secret that cannot be read: %v", err)
	}
	bad := tmpl.DeepCopy()
	bad.Spec.Bootstrap.GitHub.Credentials = hfv1.GitHubCredentials{App: &hfv1.GitHubAppCredentials{}}
	_, err = be.Provider(ctx, bad, octo, func(context.Context, string, string, hfv1.LocalSecretKeySelector) ([]byte, error) {
		return []byte("not-a-number"), nil
	})
	if errclass.Classify(err) != errclass.ClassConfiguration || errclass.ReasonOf(err) != "GitHubCredentialsInvalid" {
		t.Errorf("an App id that is not a number: %v (class %s, reason %s)", err, errclass.Classify(err), errclass.ReasonOf(err))
	}
}
