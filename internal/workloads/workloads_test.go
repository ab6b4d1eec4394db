package workloads

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/credmethods"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testobjects"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// takenNameWorld is a GitHub organization (the simulator) in which two
// tenants may register runners, each with a PAT of its own, and the
// operator's side of it: a claim's template and cluster in a fake API
// server and the Platforms that issue the claim's runner credential.
type takenNameWorld struct {
	gs        *githubsimtest.Server
	platforms *Platforms
	// other is the provider of a tenant the claims do not belong to, in
	// the same organization.
	other workload.Provider
}

const (
	takenNameOrg      = "octo-org"
	takenNameTenant   = "ghp_takenNameTenantA"
	takenNameOtherPAT = "ghp_takenNameTenantB"
)

func newTakenNameWorld(t *testing.T) *takenNameWorld {
	t.Helper()
	gs := githubsimtest.Start(t, githubsim.Config{
		Organizations: []githubsim.OrgConfig{{Login: takenNameOrg}},
		PATs:          []githubsim.PATConfig{{Token: takenNameTenant, Login: "team-a"}, {Token: takenNameOtherPAT, Login: "team-b"}},
	})
	backends := githubsimtest.Backends(t, gs.Transport)
	tmpl := testobjects.GitHubTemplate(func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Spec.HypervisorClusterRef.Name = "pve"
		tm.Spec.Bootstrap.GitHub.APIBaseURL = gs.URL + "/api/v3"
		tm.Spec.Bootstrap.GitHub.Credentials.PAT = &hfv1.LocalSecretKeySelector{Name: "github-pat", Key: "token"}
	})
	scheme := runtime.NewScheme()
	if err := hfv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(tmpl,
		&hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: "pve"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tmpl.Namespace, Name: "github-pat"}, Data: map[string][]byte{"token": []byte(takenNameTenant)}},
	).Build()
	be, ok := backends.For(hfv1.WorkloadGitHubActions)
	if !ok {
		t.Fatal("no GitHub Actions back-end")
	}
	otherTmpl := tmpl.DeepCopy()
	otherTmpl.Namespace = "team-b"
	other, err := be.Provider(context.Background(), otherTmpl, workload.Scope{Owner: takenNameOrg}, func(context.Context, string, string, hfv1.LocalSecretKeySelector) ([]byte, error) {
		return []byte(takenNameOtherPAT), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return &takenNameWorld{gs: gs, other: other,
		platforms: &Platforms{Client: kube, Backends: backends, Signer: testobjects.Signer(t)}}
}

// claim is a claim of the world's template; runnerName, when set, is the
// runner name it chooses itself (spec.workloadConfig.github.runnerName).
func (w *takenNameWorld) claim(name, runnerName string) *hfv1.MachineClaim {
	c := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: name, UID: k8stypes.UID("0b1c2d3e-" + name)}}
	c.Spec.TemplateRef.Name = "debian"
	if runnerName != "" {
		c.Spec.WorkloadConfig = &hfv1.WorkloadConfig{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubRunnerConfig{RunnerName: runnerName}}
	}
	return c
}

// runner is the organization's runner of that name; it fails the test when
// there is none.
func (w *takenNameWorld) runner(t *testing.T, name string) githubsim.Runner {
	t.Helper()
	r, ok := w.gs.Sim.RunnerByName(name)
	if !ok {
		t.Fatalf("no runner %s in the organization (runners: %+v)", name, w.gs.Sim.Runners())
	}
	return r
}

// TestRunnerNameTakenBySomeoneElse performs the attack of a tenant that
// names another tenant's runner: a tenant's claim chooses a runner name
// (spec.workloadConfig.github.runnerName) that another tenant of the same
// organization already registered, offline (a runner of its own, or one a
// job registered). Issuing the claim's credential finds the name taken;
// the operator must not take that runner for its own never-started
// registration and remove it: the claim is refused with RunnerNameTaken,
// naming the runner and the way out, and the other tenant's runner stays.
// (The version before removed it.)
func TestRunnerNameTakenBySomeoneElse(t *testing.T) {
	w := newTakenNameWorld(t)
	ctx := context.Background()
	theirs, err := w.other.IssueCredential(ctx, workload.RunnerSpec{Name: "build-box", Labels: []string{"self-hosted"}, Method: credmethods.MethodJIT})
	if err != nil {
		t.Fatal(err)
	}
	claim := w.claim("hand-made", "build-box")
	_, err = w.platforms.RunnerCredential(ctx, claim)
	var classified *errclass.Error
	if !errors.As(err, &classified) || classified.Reason != "RunnerNameTaken" || !strings.Contains(err.Error(), fmt.Sprintf("runner %d yourself", theirs.RunnerID)) ||
		!strings.Contains(err.Error(), "spec.workloadConfig") {
		t.Fatalf("issuing over another tenant's runner: %v; want RunnerNameTaken naming runner %d and spec.workloadConfig", err, theirs.RunnerID)
	}
	if r := w.runner(t, "build-box"); r.ID != theirs.RunnerID {
		t.Fatalf("runner build-box is now %d, not the other tenant's %d: it was removed", r.ID, theirs.RunnerID)
	}
	if claim.Status.Bootstrap != nil {
		t.Errorf("the refused claim recorded a runner: %+v", claim.Status.Bootstrap)
	}
}

// TestPlatformsRecoverTakenName: a name held by a runner that never came
// online and is provably the claim's own earlier registration (the
// operator restarted before delivering or recording it) is removed and
// registered again: the claim's install-marked default name, or a name the
// claim chose whose runner id its status recorded. A name held by a live
// runner is RunnerNameTaken and the live runner is left alone.
func TestPlatformsRecoverTakenName(t *testing.T) {
	w := newTakenNameWorld(t)
	ctx := context.Background()
	reissue := func(t *testing.T, claim *hfv1.MachineClaim, keepStatus bool) (first, second workload.Credential) {
		t.Helper()
		first, err := w.platforms.RunnerCredential(ctx, claim)
		if err != nil {
			t.Fatal(err)
		}
		if !keepStatus {
			// The operator stopped before the status write.
			claim.Status.Bootstrap = nil
		}
		second, err = w.platforms.RunnerCredential(ctx, claim)
		if err != nil {
			t.Fatalf("re-issue over the claim's own never-started runner: %v", err)
		}
		if second.RunnerID == first.RunnerID || second.RunnerName != first.RunnerName {
			t.Fatalf("second registration %d %s, first %d %s: want the name registered anew", second.RunnerID, second.RunnerName, first.RunnerID, first.RunnerName)
		}
		if r := w.runner(t, second.RunnerName); r.ID != second.RunnerID {
			t.Fatalf("registered runner %d, want %d", r.ID, second.RunnerID)
		}
		return first, second
	}
	t.Run("install-marked default name", func(t *testing.T) {
		claim := w.claim("pool-x", "")
		_, second := reissue(t, claim, false)
		if _, marked := w.platforms.Signer.VerifyRunnerName(second.RunnerName); !marked {
			t.Fatalf("default name %s carries no mark of the install", second.RunnerName)
		}
	})
	t.Run("chosen name with its runner id recorded", func(t *testing.T) {
		reissue(t, w.claim("chosen", "debug-box"), true)
	})
	t.Run("chosen name without a record", func(t *testing.T) {
		claim := w.claim("unrecorded", "other-box")
		first, err := w.platforms.RunnerCredential(ctx, claim)
		if err != nil {
			t.Fatal(err)
		}
		claim.Status.Bootstrap = nil
		if _, err := w.platforms.RunnerCredential(ctx, claim); !errors.Is(err, errRunnerNameTaken) {
			t.Fatalf("re-issue of a chosen name nothing proves the claim's: %v, want errRunnerNameTaken", err)
		}
		if r := w.runner(t, "other-box"); r.ID != first.RunnerID {
			t.Fatalf("runner other-box is now %d, want %d untouched", r.ID, first.RunnerID)
		}
	})
	t.Run("live runner", func(t *testing.T) {
		claim := w.claim("live", "")
		cred, err := w.platforms.RunnerCredential(ctx, claim)
		if err != nil {
			t.Fatal(err)
		}
		// Bring the runner online: its name is now taken for good.
		proc := githubsimtest.StartScript(t, w.gs.InstallRunner(t), "run.sh", "--jitconfig", cred.Secret.Reveal())
		defer proc.Kill()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if r, _ := w.gs.Sim.RunnerByName(cred.RunnerName); r.Status == "online" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("runner never came online:\n%s", proc.Output())
			}
		}
		if _, err := w.platforms.RunnerCredential(ctx, claim); !errors.Is(err, errRunnerNameTaken) {
			t.Fatalf("issue over a live runner: %v, want errRunnerNameTaken", err)
		}
		if r := w.runner(t, cred.RunnerName); r.ID != cred.RunnerID || r.Status != "online" {
			t.Fatalf("the live runner was touched: %+v", r)
		}
	})
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
