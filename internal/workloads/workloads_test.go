package workloads

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// TestPlatformsRecoverTakenName: a JIT name held by a runner that never
// came online (registered by an attempt the operator did not get to
// record) is removed and registered again; a name held by a live runner is
// a configuration error and the live runner is left alone.
func TestPlatformsRecoverTakenName(t *testing.T) {
	gs := githubsimtest.Start(t, githubsim.Config{
		Organizations: []githubsim.OrgConfig{{Login: "octo-org"}},
		PATs:          []githubsim.PATConfig{{Token: "ghp_bootstrapTest", Login: "octocat"}},
	})
	be, ok := githubsimtest.Backends(t, gs.Transport).For(hfv1.WorkloadGitHubActions)
	if !ok {
		t.Fatal("no GitHub Actions back-end")
	}
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "t"}}
	tmpl.Spec.Bootstrap.GitHub = &hfv1.GitHubBootstrap{APIBaseURL: gs.URL + "/api/v3", Owner: "octo-org", Organization: "octo-org",
		Credentials: hfv1.GitHubCredentials{PAT: &hfv1.LocalSecretKeySelector{Name: "gh", Key: "token"}}}
	pat := func(context.Context, string, string, hfv1.LocalSecretKeySelector) ([]byte, error) {
		return []byte("ghp_bootstrapTest"), nil
	}
	ctx := context.Background()
	p, err := be.Provider(ctx, tmpl, workload.Scope{Owner: "octo-org"}, pat)
	if err != nil {
		t.Fatal(err)
	}
	spec := workload.RunnerSpec{Name: "pool-x-1a2b3c4d", Labels: []string{"self-hosted"}, Method: workload.MethodJIT}
	first, err := p.IssueCredential(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	w := &Platforms{}
	second, err := w.issue(ctx, p, spec)
	if err != nil {
		t.Fatalf("re-issue over a never-started runner: %v", err)
	}
	if second.RunnerID == first.RunnerID {
		t.Fatal("the stale registration was reused")
	}
	if r, _ := gs.Sim.RunnerByName(spec.Name); r.ID != second.RunnerID {
		t.Fatalf("registered runner %d, want %d", r.ID, second.RunnerID)
	}
	// Bring the runner online: its name is now taken for good.
	proc := githubsimtest.StartScript(t, gs.InstallRunner(t), "run.sh", "--jitconfig", second.Secret.Reveal())
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if r, _ := gs.Sim.RunnerByName(spec.Name); r.Status == "online" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("runner never came online:\n%s", proc.Output())
		}
	}
	_, err = w.issue(ctx, p, spec)
	if !errors.Is(err, errRunnerNameTaken) {
		t.Fatalf("issue over a live runner: %v, want errRunnerNameTaken", err)
	}
	if r, _ := gs.Sim.RunnerByName(spec.Name); r.ID != second.RunnerID || r.Status != "online" {
		t.Fatalf("the live runner was touched: %+v", r)
	}
	proc.Kill()
}

// TestTemplateRunnerGroupOnlyForOrganizationRunners: the template's runner
// group is the default of organization runners; a pool that narrows the
// template to a repository registers repository runners without it, while
// a group the claim (or its pool) asks for itself is passed on as asked.
func TestTemplateRunnerGroupOnlyForOrganizationRunners(t *testing.T) {
	be, ok := githubsimtest.Backends(t, nil).For(hfv1.WorkloadGitHubActions)
	if !ok {
		t.Fatal("no GitHub Actions back-end")
	}
	plain := &hfv1.MachineClaim{}
	own := &hfv1.MachineClaim{Spec: hfv1.MachineClaimSpec{WorkloadConfig: &hfv1.WorkloadConfig{
		Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubRunnerConfig{RunnerGroup: "mine"}}}}
	org, repo := workload.Scope{Owner: "octo-org"}, workload.Scope{Owner: "octo-org", Repository: "app"}
	for _, tc := range []struct {
		claim      *hfv1.MachineClaim
		scope      workload.Scope
		vars, want string
	}{
		{plain, org, "tmpl", "tmpl"},
		{plain, repo, "tmpl", ""},
		{own, org, "mine", "mine"},
		{own, repo, "mine", "mine"},
	} {
		if got := runnerGroup(be, tc.claim, tc.scope, tc.vars); got != tc.want {
			t.Errorf("claim group %q in %s: %q, want %q", be.Claim(tc.claim).Group, tc.scope, got, tc.want)
		}
	}
}
