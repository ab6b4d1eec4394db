package github_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	ghworkload "github.com/hyperfleet/hyperfleet/pkg/workload/github"
)

// Installations of the scope test's App besides testInstallOrg.
const (
	installSelected = 5151 // octo-org, repository selection: app only
	installReadOnly = 5252 // victim-org, Administration and runners: read
	installVictim   = 5353 // victim-org, default permissions
)

func scopeSimConfig() githubsim.Config {
	cfg := simConfig()
	cfg.Organizations = append(cfg.Organizations, githubsim.OrgConfig{Login: "victim-org"})
	cfg.Repositories = append(cfg.Repositories, githubsim.RepoConfig{Name: "victim-org/secret"})
	// A PAT whose user manages only octo-org (the other's is unrestricted).
	cfg.PATs = append(cfg.PATs, githubsim.PATConfig{Token: "ghp_scopeTestTenantTokenOnlyForOctoOrg000", Login: "tenant", Owners: []string{"octo-org"}})
	cfg.Apps[0].Installations = append(cfg.Apps[0].Installations,
		githubsim.InstallationConfig{ID: installSelected, Account: "octo-org", RepositorySelection: "selected", Repositories: []string{"app"}},
		githubsim.InstallationConfig{ID: installReadOnly, Account: "victim-org", Permissions: map[string]string{
			"administration": "read", "organization_self_hosted_runners": "read", "actions": "read", "metadata": "read"}},
		githubsim.InstallationConfig{ID: installVictim, Account: "victim-org"},
	)
	return cfg
}

func TestVerifyScope(t *testing.T) {
	gs := githubsimtest.Start(t, scopeSimConfig())
	app := func(inst int64) func(*ghworkload.Config) {
		return func(c *ghworkload.Config) {
			c.Token = ""
			c.App = &ghworkload.AppCredentials{AppID: testAppID, InstallationID: inst, PrivateKey: appKey.PrivatePEM}
		}
	}
	pat := func(tok string) func(*ghworkload.Config) { return func(c *ghworkload.Config) { c.Token = tok } }
	org := func(o string) workload.Scope { return workload.Scope{Owner: o} }
	repo := func(o, r string) workload.Scope { return workload.Scope{Owner: o, Repository: r} }
	tests := []struct {
		name  string
		creds func(*ghworkload.Config)
		scope workload.Scope
		want  error // nil: verified
	}{
		{"App on its own organization", app(testInstallOrg), org("octo-org"), nil},
		{"App on a repository of its account", app(testInstallOrg), repo("octo-org", "app"), nil},
		{"App claiming another organization", app(testInstallOrg), org("victim-org"), workload.ErrNotFound},
		{"App claiming another organization's repository", app(testInstallOrg), repo("victim-org", "secret"), workload.ErrNotFound},
		{"App with selected repositories, a listed one", app(installSelected), repo("octo-org", "app"), nil},
		{"App with selected repositories, an unlisted one", app(installSelected), repo("octo-org", "other"), workload.ErrNotFound},
		{"App with read-only runner permissions, organization", app(installReadOnly), org("victim-org"), workload.ErrUnauthorized},
		{"App with read-only runner permissions, repository", app(installReadOnly), repo("victim-org", "secret"), workload.ErrUnauthorized},
		{"App installed on the organization", app(installVictim), org("victim-org"), nil},
		{"unrestricted PAT", pat(testPAT), org("victim-org"), nil},
		{"PAT of one organization on it", pat("ghp_scopeTestTenantTokenOnlyForOctoOrg000"), repo("octo-org", "app"), nil},
		{"PAT of one organization claiming another", pat("ghp_scopeTestTenantTokenOnlyForOctoOrg000"), org("victim-org"), workload.ErrNotFound},
		{"unknown PAT", pat("ghp_unknownTokenNeverConfigured000000000"), org("octo-org"), workload.ErrUnauthorized},
		{"organization that does not exist", app(testInstallOrg), org("no-such-org"), workload.ErrNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newProvider(t, gs.Sim, gs.URL, gs.Transport, func(c *ghworkload.Config) {
				c.Scope = tc.scope
				tc.creds(c)
			})
			err := p.VerifyScope(context.Background())
			switch {
			case tc.want == nil && err != nil:
				t.Fatalf("VerifyScope(%s) = %v, want verified", tc.scope, err)
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("VerifyScope(%s) = %v, want %v", tc.scope, err, tc.want)
			}
		})
	}
}

// readOnlyGrant rewrites the permissions of installation token responses to
// read-only runner permissions. GitHub answers the runner listing with read
// access alone, while the simulator asks for write there; this shows the
// check an App provider adds for that case: the installation token must
// grant write, as issuing a runner credential needs.
type readOnlyGrant struct{ next http.RoundTripper }

func (g readOnlyGrant) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := g.next.RoundTrip(r)
	if err != nil || !strings.HasSuffix(r.URL.Path, "/access_tokens") {
		return resp, err
	}
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	body["permissions"] = map[string]string{"administration": "read", "organization_self_hosted_runners": "read", "metadata": "read"}
	raw, _ := json.Marshal(body)
	resp.Body = io.NopCloser(bytes.NewReader(raw))
	resp.ContentLength = int64(len(raw))
	resp.Header.Del("Content-Length")
	return resp, nil
}

func TestVerifyScopeNeedsAnInstallationTokenThatMayRegisterRunners(t *testing.T) {
	gs := githubsimtest.Start(t, scopeSimConfig())
	for _, scope := range []workload.Scope{{Owner: "octo-org"}, {Owner: "octo-org", Repository: "app"}} {
		p := newProvider(t, gs.Sim, gs.URL, readOnlyGrant{next: gs.Transport}, func(c *ghworkload.Config) {
			c.Token = ""
			c.App = &ghworkload.AppCredentials{AppID: testAppID, InstallationID: testInstallOrg, PrivateKey: appKey.PrivatePEM}
			c.Scope = scope
		})
		if err := p.VerifyScope(context.Background()); !errors.Is(err, workload.ErrUnauthorized) || !strings.Contains(err.Error(), "grant it write") {
			t.Errorf("VerifyScope(%s) with a read-only installation token = %v, want ErrUnauthorized naming the permission", scope, err)
		}
	}
}
