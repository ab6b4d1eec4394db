package workloads

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
)

// TestRunnerNameMarkedUnlessClaimNamesIt: a claim's default runner name is
// marked as this install's, keeps the claim's UID part within the
// platform's length limit, and a name the claim sets is left as it is, so
// the orphan sweep never removes that runner.
func TestRunnerNameMarkedUnlessClaimNamesIt(t *testing.T) {
	ciPlatforms := githubsimtest.Backends(t, nil)
	signer, err := ownership.NewSigner("prod", bytes.Repeat([]byte{5}, ownership.MinKeyLength))
	if err != nil {
		t.Fatal(err)
	}
	w := &Platforms{Signer: signer, Backends: ciPlatforms}
	be, _ := ciPlatforms.For(hfv1.WorkloadGitHubActions)
	claim := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", UID: types.UID("6f1c9a2e-0000-4000-8000-000000000001")}}
	for _, host := range []string{"runner-abc", strings.Repeat("h", 63)} {
		def := vmspec.DefaultRunnerName(claim, host)
		name := w.runnerName(be, claim, def)
		base, ok := signer.VerifyRunnerName(name)
		if !ok || base != def || len(name) > ownership.MaxRunnerNameLength || !strings.HasSuffix(base, "-6f1c9a2e") {
			t.Errorf("host %d characters: name %q (base %q, verified %v), want the default %q marked, at most %d characters",
				len(host), name, base, ok, def, ownership.MaxRunnerNameLength)
		}
	}
	named := claim.DeepCopy()
	named.Spec.WorkloadConfig = &hfv1.WorkloadConfig{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubRunnerConfig{RunnerName: "my-runner"}}
	if got := w.runnerName(be, named, "my-runner"); got != "my-runner" {
		t.Errorf("a name the claim sets became %q", got)
	}
	if got := (&Platforms{Backends: ciPlatforms}).runnerName(be, claim, "x-6f1c9a2e"); got != "x-6f1c9a2e" {
		t.Errorf("without a signer the name became %q", got)
	}
}

// TestRunnerScopes: every scope a template or pool names is swept once per
// GitHub host (the CI platform's endpoint), a pool's event object is the pool, and a scope whose
// credentials cannot be read is skipped.
func TestRunnerScopes(t *testing.T) {
	ciPlatforms := githubsimtest.Backends(t, nil)
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := hfv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	pat := &hfv1.LocalSecretKeySelector{Name: "gh", Key: "token"}
	tmpl := func(name, owner, repo, org, api string, creds *hfv1.LocalSecretKeySelector) *hfv1.HypervisorMachineTemplate {
		t := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: name}}
		t.Spec.Bootstrap.GitHub = &hfv1.GitHubBootstrap{Owner: owner, Repository: repo, Organization: org, APIBaseURL: api,
			Credentials: hfv1.GitHubCredentials{PAT: creds}}
		return t
	}
	pool := &hfv1.RunnerPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "org-pool"}}
	pool.Spec.TemplateRef.Name = "app"
	pool.Spec.Workload = hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{Organization: "octo-org"}}
	samePool := pool.DeepCopy()
	samePool.Name = "org-pool-2"
	kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "gh"}, Data: map[string][]byte{"token": []byte("ghp_x")}},
		tmpl("app", "octo", "app", "", "", pat),
		tmpl("app-again", "octo", "app", "", "", pat),
		tmpl("ghes", "octo", "app", "", "https://ghes.example.com/api/v3", pat),
		tmpl("no-secret", "octo", "other", "", "", &hfv1.LocalSecretKeySelector{Name: "missing", Key: "token"}),
		pool, samePool,
	).Build()
	w := &Platforms{Client: kube, Backends: ciPlatforms}
	scopes, err := w.RunnerScopes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, s := range scopes {
		keys = append(keys, s.Key+" <- "+s.EventObject.GetName())
		if s.Provider == nil {
			t.Errorf("scope %s has no provider", s.Key)
		}
	}
	slices.Sort(keys)
	want := []string{"https://ghes.example.com/api/v3 octo/app <- ghes", "octo-org <- org-pool", "octo/app <- app"}
	if !slices.Equal(keys, want) {
		t.Errorf("scopes %v, want %v", keys, want)
	}
}
