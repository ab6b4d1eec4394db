package github

import (
	"context"
	"fmt"
	"strings"

	gh "github.com/google/go-github/v88/github"

	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// maxGroupPages bounds the pages (100 entries each) read when looking up
// an enterprise's runner group or the organizations it allows: 5,000
// entries, far above GitHub's limits per enterprise in practice, so that
// a misbehaving endpoint cannot keep a reconcile paging forever.
const maxGroupPages = 50

// enterpriseGroup finds the enterprise runner group called name (the
// empty name is the Default group), looked up by name every time: its id
// is cached for issuing runners only (runnerGroupID), its visibility and
// organizations are read fresh by VerifyScope.
func (p *Provider) enterpriseGroup(ctx context.Context, name string) (*gh.EnterpriseRunnerGroup, error) {
	s := p.cfg.Scope
	if name == "" {
		name = "Default"
	}
	opts := &gh.ListEnterpriseRunnerGroupOptions{ListOptions: gh.ListOptions{PerPage: 100}}
	for range maxGroupPages {
		groups, resp, err := p.client.Enterprise.ListRunnerGroups(ctx, s.Enterprise, opts)
		if err != nil {
			return nil, p.mapErr("list the runner groups of enterprise "+s.Enterprise, resp, err)
		}
		for _, g := range groups.RunnerGroups {
			if strings.EqualFold(g.GetName(), name) {
				return g, nil
			}
		}
		if resp.NextPage == 0 {
			return nil, fmt.Errorf("github: enterprise %s has no runner group %q; create it or fix runnerGroup: %w", s.Enterprise, name, workload.ErrInvalidRequest)
		}
		opts.Page = resp.NextPage
	}
	return nil, fmt.Errorf("github: enterprise %s has more than %d pages of runner groups: %w", s.Enterprise, maxGroupPages, workload.ErrUnavailable)
}

// verifyEnterprise is VerifyScope for an enterprise's runners: the
// credentials list the enterprise's runners (GitHub answers only a token
// with manage_runners:enterprise of an enterprise owner), the runner group
// exists, and it allows the scope's organization (visibility all, or the
// organization among its selected ones). A bare enterprise, without an
// organization, is refused: it would serve no job (workload.Scope).
func (p *Provider) verifyEnterprise(ctx context.Context) error {
	s := p.cfg.Scope
	if s.Owner == "" {
		return fmt.Errorf("github: the runners of enterprise %s serve the organizations their runner group allows; name one in %s.organization (or a repository of one in %s.repository): %w",
			s.Enterprise, poolField, poolField, workload.ErrInvalidRequest)
	}
	_, resp, err := p.client.Enterprise.ListRunners(ctx, s.Enterprise, &gh.ListRunnersOptions{ListOptions: gh.ListOptions{PerPage: 1}})
	if err != nil {
		return p.mapErr("verify that the token manages the runners of enterprise "+s.Enterprise+" (a personal access token (classic) with manage_runners:enterprise)", resp, err)
	}
	g, err := p.enterpriseGroup(ctx, p.cfg.RunnerGroup)
	if err != nil {
		return err
	}
	if g.GetVisibility() == "all" {
		return nil
	}
	opts := &gh.ListOptions{PerPage: 100}
	for range maxGroupPages {
		orgs, resp, err := p.client.Enterprise.ListOrganizationAccessRunnerGroup(ctx, s.Enterprise, g.GetID(), opts)
		if err != nil {
			return p.mapErr(fmt.Sprintf("list the organizations runner group %q of enterprise %s allows", g.GetName(), s.Enterprise), resp, err)
		}
		for _, o := range orgs.Organizations {
			if strings.EqualFold(o.GetLogin(), s.Owner) {
				return nil
			}
		}
		if resp.NextPage == 0 {
			return fmt.Errorf("github: runner group %q of enterprise %s does not allow organization %s; add it to the group's organizations or serve an organization the group allows: %w",
				g.GetName(), s.Enterprise, s.Owner, workload.ErrUnauthorized)
		}
		opts.Page = resp.NextPage
	}
	return fmt.Errorf("github: runner group %q of enterprise %s allows more than %d pages of organizations: %w", g.GetName(), s.Enterprise, maxGroupPages, workload.ErrUnavailable)
}
