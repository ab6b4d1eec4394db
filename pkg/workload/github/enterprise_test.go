package github_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/credmethods"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	ghworkload "github.com/hyperfleet/hyperfleet/pkg/workload/github"
)

const testPATNoEnterprise = "ghp_providerTestPATwithoutEnterpriseScope0"

// enterpriseSimConfig: enterprise octo-ent over ent-org and outside-org;
// its runner group hyperfleet serves ent-org only, Default both.
func enterpriseSimConfig() githubsim.Config {
	return githubsim.Config{
		Organizations: []githubsim.OrgConfig{{Login: "ent-org"}, {Login: "outside-org"}},
		Repositories:  []githubsim.RepoConfig{{Name: "ent-org/app"}, {Name: "outside-org/app"}},
		Enterprises: []githubsim.EnterpriseConfig{{Slug: "octo-ent", Organizations: []string{"ent-org", "outside-org"},
			RunnerGroups: []githubsim.EnterpriseRunnerGroupConfig{{ID: 5, Name: "hyperfleet", Visibility: "selected", SelectedOrganizations: []string{"ent-org"}}}}},
		PATs: []githubsim.PATConfig{
			{Token: testPAT, Login: "octocat", Scopes: []string{"repo", "manage_runners:enterprise"}},
			{Token: testPATNoEnterprise, Login: "octocat", Scopes: []string{"repo", "admin:org"}},
		},
		HeartbeatTimeout: githubsim.Duration(30 * time.Second),
	}
}

func enterpriseProvider(t *testing.T, gs *githubsimtest.Server, scope workload.Scope, group, token string) *ghworkload.Provider {
	t.Helper()
	p, err := ghworkload.New(ghworkload.Config{BaseURL: gs.URL + "/api/v3", Scope: scope, Token: token, Transport: gs.Transport,
		RunnerGroup: group, RunnerURL: gs.URL + "/enterprises/octo-ent"})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestEnterpriseScopeVerification: an enterprise's runners verify for an
// organization their runner group serves, and not for one it does not
// serve, for a bare enterprise, or with a token without
// manage_runners:enterprise; an App is refused before any call.
func TestEnterpriseScopeVerification(t *testing.T) {
	gs := githubsimtest.Start(t, enterpriseSimConfig())
	ctx := context.Background()
	ent := func(org string) workload.Scope { return workload.Scope{Enterprise: "octo-ent", Owner: org} }
	for _, tc := range []struct {
		name, group, token string
		scope              workload.Scope
		want               error
		says               string
	}{
		{"selected organization", "hyperfleet", testPAT, ent("ent-org"), nil, ""},
		{"repository of a selected organization", "hyperfleet", testPAT, workload.Scope{Enterprise: "octo-ent", Owner: "ent-org", Repository: "app"}, nil, ""},
		{"organization the group does not serve", "hyperfleet", testPAT, ent("outside-org"), workload.ErrUnauthorized, `runner group "hyperfleet" of enterprise octo-ent does not allow organization outside-org`},
		{"Default serves every organization", "", testPAT, ent("outside-org"), nil, ""},
		{"unknown group", "nope", testPAT, ent("ent-org"), workload.ErrInvalidRequest, `enterprise octo-ent has no runner group "nope"`},
		{"bare enterprise", "", testPAT, workload.Scope{Enterprise: "octo-ent"}, workload.ErrInvalidRequest, "spec.workload.github.organization"},
		{"token without manage_runners:enterprise", "", testPATNoEnterprise, ent("ent-org"), workload.ErrUnauthorized, "manage_runners:enterprise"},
		{"unknown enterprise", "", testPAT, workload.Scope{Enterprise: "nope", Owner: "ent-org"}, workload.ErrNotFound, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := enterpriseProvider(t, gs, tc.scope, tc.group, tc.token).VerifyScope(ctx)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) || err != nil && !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("VerifyScope = %v; want %v saying %q", err, tc.want, tc.says)
			}
		})
	}
	// A runner of a group that does not serve the organization (a pool's
	// own runnerGroup, which the scope check does not read) is refused
	// when issued; Default serves it.
	outside := enterpriseProvider(t, gs, ent("outside-org"), "", testPAT)
	spec := workload.RunnerSpec{Name: "outside-1", Labels: []string{"self-hosted"}, Group: "hyperfleet", Method: credmethods.MethodJIT}
	if _, err := outside.IssueCredential(ctx, spec); !errors.Is(err, workload.ErrInvalidRequest) || !strings.Contains(err.Error(), "does not allow organization outside-org") {
		t.Fatalf("a runner of group hyperfleet for outside-org: %v", err)
	}
	if _, ok := gs.Sim.RunnerByName("outside-1"); ok {
		t.Fatal("the refused runner was registered")
	}
	spec.Group = ""
	if _, err := outside.IssueCredential(ctx, spec); err != nil {
		t.Fatalf("a runner of Default for outside-org: %v", err)
	}
	_, err := ghworkload.New(ghworkload.Config{Scope: ent("ent-org"), App: &ghworkload.AppCredentials{AppID: 1, InstallationID: 2, PrivateKey: appKey.PrivatePEM}})
	if err == nil || !strings.Contains(err.Error(), "manage_runners:enterprise") {
		t.Fatalf("an App for enterprise runners: %v", err)
	}
}

// TestEnterpriseRunnerServesItsGroupsOrganizations: a JIT runner issued
// at the enterprise in group hyperfleet runs a job of ent-org and leaves
// the older job of outside-org, which its group does not serve, queued;
// listing, lookup, removal and registration tokens (with the runner
// package's config.sh) work at the enterprise.
func TestEnterpriseRunnerServesItsGroupsOrganizations(t *testing.T) {
	gs := githubsimtest.Start(t, enterpriseSimConfig())
	ctx := context.Background()
	p := enterpriseProvider(t, gs, workload.Scope{Enterprise: "octo-ent", Owner: "ent-org"}, "hyperfleet", testPAT)
	labels := ghworkload.RunnerLabels("linux", "x64", nil)
	cred, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: "ent-1", Labels: labels, Group: "hyperfleet", Method: credmethods.MethodJIT})
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := gs.Sim.RunnerByName("ent-1"); !ok || r.Scope != "enterprises/octo-ent" {
		t.Fatalf("simulator runner = %+v, %v", r, ok)
	}
	if got, err := p.GetRunner(ctx, "ent-1"); err != nil || got.ID != cred.RunnerID {
		t.Fatalf("GetRunner = %+v, %v", got, err)
	}
	if list, err := p.ListRunners(ctx, "ent-"); err != nil || len(list) != 1 {
		t.Fatalf("ListRunners = %+v, %v", list, err)
	}
	tok, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: "ent-reg", Method: credmethods.MethodRegistrationToken})
	if err != nil || tok.Secret.Reveal() == "" || tok.RegistrationURL != gs.URL+"/enterprises/octo-ent" {
		t.Fatalf("registration token = %+v, %v", tok, err)
	}
	// The token registers a runner at the enterprise with config.sh.
	dir := gs.InstallRunner(t)
	cfgProc := githubsimtest.StartScript(t, dir, "config.sh", "--url", tok.RegistrationURL, "--token", tok.Secret.Reveal(), "--ephemeral",
		"--unattended", "--name", "ent-reg", "--runnergroup", "hyperfleet", "--work", "_work", "--disableupdate")
	if code := cfgProc.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("config.sh exited %d:\n%s", code, cfgProc.Output())
	}
	if r, ok := gs.Sim.RunnerByName("ent-reg"); !ok || r.Scope != "enterprises/octo-ent" {
		t.Fatalf("registered runner = %+v, %v", r, ok)
	}
	if err := p.DeregisterRunner(ctx, 0, "ent-reg"); err != nil {
		t.Fatal(err)
	}

	outside, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "outside-org/app", Labels: []string{"self-hosted", "linux"}, Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	inside, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "ent-org/app", Labels: []string{"self-hosted", "linux"}, Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	dir = gs.InstallRunner(t)
	proc := githubsimtest.StartScript(t, dir, "run.sh", "--jitconfig", cred.Secret.Reveal())
	if code := proc.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("run.sh exited %d:\n%s", code, proc.Output())
	}
	if j, _ := gs.Sim.Job(inside.ID); j.Status != "completed" || j.RunnerName != "ent-1" {
		t.Fatalf("ent-org's job = %+v; want it completed by ent-1", j)
	}
	if j, _ := gs.Sim.Job(outside.ID); j.Status != "queued" || j.RunnerName != "" {
		t.Fatalf("outside-org's job = %+v; want it queued (group hyperfleet does not serve outside-org)", j)
	}
	if err := p.DeregisterRunner(ctx, 0, "ent-1"); err != nil {
		t.Fatalf("removing a runner GitHub already removed: %v", err)
	}
}
