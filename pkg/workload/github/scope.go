package github

import (
	"context"
	"fmt"

	gh "github.com/google/go-github/v88/github"

	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// VerifyScope implements workload.Provider. It lists one runner of the
// scope: GitHub answers that call only when the credentials can see the
// scope (an App installation on its account, with the repository in its
// selection; a PAT whose user can administer it) and hold the runner
// permission, and answers 404 otherwise, without telling a foreign scope
// from an absent one. That is the question routing needs answered: can
// these credentials issue a runner credential here (docs/security.md).
//
// Listing needs only read access, and issuing needs write; for an App the
// installation token's granted permissions are checked as well, so a
// read-only installation does not verify. A PAT reports no permissions
// (fine-grained tokens send no scopes header), so for a PAT the listing is
// the check.
func (p *Provider) VerifyScope(ctx context.Context) error {
	s := p.cfg.Scope
	if s.IsEnterprise() {
		// A PAT only (New refuses an App): the listing and the group are
		// the check.
		return p.verifyEnterprise(ctx)
	}
	opts := &gh.ListRunnersOptions{ListOptions: gh.ListOptions{PerPage: 1}}
	var resp *gh.Response
	var err error
	if s.IsOrganization() {
		_, resp, err = p.client.Actions.ListOrganizationRunners(ctx, s.Owner, opts)
	} else {
		_, resp, err = p.client.Actions.ListRunners(ctx, s.Owner, s.Repository, opts)
	}
	if err != nil {
		return p.mapErr("verify that the credentials manage the runners of "+s.String(), resp, err)
	}
	if p.app == nil {
		return nil
	}
	perms, err := p.app.Permissions()
	if err != nil {
		return fmt.Errorf("github: read the permissions of App installation %d: %w: %w", p.app.InstallationID(), workload.ErrUnavailable, err)
	}
	perm, name := perms.GetAdministration(), "Administration"
	if s.IsOrganization() {
		perm, name = perms.GetOrganizationSelfHostedRunners(), "Self-hosted runners (organization)"
	}
	if perm != "write" && perm != "admin" {
		return fmt.Errorf("github: App installation %d can see %s but has %s permission %q; grant it write to register runners there: %w",
			p.app.InstallationID(), s, name, perm, workload.ErrUnauthorized)
	}
	return nil
}
