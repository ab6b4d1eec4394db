package workload

import (
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestScopeContains(t *testing.T) {
	for _, tc := range []struct {
		scope      Scope
		repository string
		want       bool
	}{
		{Scope{Owner: "octo"}, "octo/app", true},
		{Scope{Owner: "octo"}, "OCTO/App", true},
		{Scope{Owner: "octo"}, "octopus/app", false},
		{Scope{Owner: "octo"}, "octo", false},
		{Scope{Owner: "octo"}, "octo/", false},
		{Scope{Owner: "octo", Repository: "app"}, "octo/app", true},
		{Scope{Owner: "octo", Repository: "app"}, "octo/App", true},
		{Scope{Owner: "octo", Repository: "app"}, "octo/app2", false},
		{Scope{Owner: "octo", Repository: "app"}, "octo/app/x", false},
		// GitLab: groups hold their subgroups' projects; a project's scope is
		// its full path.
		{Scope{Owner: "platform"}, "platform/ci/runner", true},
		{Scope{Owner: "platform/ci"}, "platform/ci/runner", true},
		{Scope{Owner: "platform/ci"}, "platform/cd/runner", false},
		{Scope{Owner: "platform/ci"}, "platform/ci", false},
		{Scope{Owner: "platform/ci", Repository: "runner"}, "platform/ci/runner", true},
		{Scope{Owner: "platform/ci", Repository: "runner"}, "platform/runner", false},
		{Scope{}, "octo/app", false},
		// GitLab's instance runners serve every project.
		{Scope{Instance: true}, "octo/app", true},
		{Scope{Instance: true}, "platform/ci/runner", true},
		{Scope{Instance: true}, "octo", false},
		{Scope{Instance: true}, "", false},
		{Scope{Instance: true}, "octo/", false},
		// An enterprise's runners serve the organization a pool names, and
		// nothing without one.
		{Scope{Enterprise: "acme"}, "acme/app", false},
		{Scope{Enterprise: "acme", Owner: "octo"}, "octo/app", true},
		{Scope{Enterprise: "acme", Owner: "octo"}, "acme/app", false},
		{Scope{Enterprise: "acme", Owner: "octo", Repository: "app"}, "octo/app", true},
		{Scope{Enterprise: "acme", Owner: "octo", Repository: "app"}, "octo/web", false},
	} {
		if got := tc.scope.Contains(tc.repository); got != tc.want {
			t.Errorf("%q.Contains(%q) = %v, want %v", tc.scope, tc.repository, got, tc.want)
		}
	}
}

func TestInstanceScope(t *testing.T) {
	s := Scope{Instance: true}
	if s.IsZero() || !s.IsOrganization() || s.String() != InstanceScopeName {
		t.Fatalf("instance scope: IsZero %v, IsOrganization %v, String %q", s.IsZero(), s.IsOrganization(), s.String())
	}
}

// For GitHub's names (an owner and a repository name, neither with a
// slash) Contains answers as it did when scopes had one owner segment:
// the owner's repositories, or the one repository.
func TestScopeContainsGitHubNames(t *testing.T) {
	name := rapid.StringMatching(`[A-Za-z0-9][-A-Za-z0-9]{0,6}`)
	rapid.Check(t, func(t *rapid.T) {
		owner, repo := name.Draw(t, "owner"), rapid.SampledFrom([]string{"", "app", "App", "app2"}).Draw(t, "repo")
		jobOwner := rapid.SampledFrom([]string{owner, strings.ToUpper(owner), owner + "x", "other"}).Draw(t, "job owner")
		jobRepo := rapid.SampledFrom([]string{"app", "APP", "app2", "x"}).Draw(t, "job repo")
		s := Scope{Owner: owner, Repository: repo}
		want := strings.EqualFold(jobOwner, owner) && (repo == "" || strings.EqualFold(jobRepo, repo))
		if got := s.Contains(jobOwner + "/" + jobRepo); got != want {
			t.Fatalf("%q.Contains(%q) = %v, want %v", s, jobOwner+"/"+jobRepo, got, want)
		}
	})
}

func TestEnterpriseScope(t *testing.T) {
	for _, tc := range []struct {
		scope Scope
		want  string
	}{
		{Scope{Enterprise: "acme"}, "enterprises/acme"},
		{Scope{Enterprise: "acme", Owner: "octo"}, "enterprises/acme/octo"},
		{Scope{Enterprise: "acme", Owner: "octo", Repository: "app"}, "enterprises/acme/octo/app"},
	} {
		if tc.scope.IsZero() || !tc.scope.IsEnterprise() || tc.scope.String() != tc.want {
			t.Errorf("%+v: IsZero %v, IsEnterprise %v, String %q (want %q)", tc.scope, tc.scope.IsZero(), tc.scope.IsEnterprise(), tc.scope.String(), tc.want)
		}
	}
}
