package github

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

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
	return p.groupServesOwner(ctx, g, workload.ErrUnauthorized)
}

// groupServesOwner checks that enterprise runner group g serves the
// scope's organization: visibility all, or the organization among the
// group's selected ones. A refusal wraps refused: ErrUnauthorized for the
// scope check (the pool is not verified), ErrInvalidRequest when issuing a
// runner (its group is misconfigured).
func (p *Provider) groupServesOwner(ctx context.Context, g *gh.EnterpriseRunnerGroup, refused error) error {
	s := p.cfg.Scope
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
				g.GetName(), s.Enterprise, s.Owner, refused)
		}
		opts.Page = resp.NextPage
	}
	return fmt.Errorf("github: runner group %q of enterprise %s allows more than %d pages of organizations: %w", g.GetName(), s.Enterprise, maxGroupPages, workload.ErrUnavailable)
}

// groupCheckTTL is how long runnerGroupID trusts an enterprise group's
// check: a pool's own runnerGroup is checked when runners are issued (the
// scope check reads the template's group), without costing two calls per
// runner.
const groupCheckTTL = 5 * time.Minute

type groupCheck struct {
	id  int64
	err error
	at  time.Time
}

// enterpriseGroupID resolves an enterprise runner group for issuing a
// runner of the scope: it must exist and serve the scope's organization,
// or the runner would never get a job. Answers (refusals included) are
// cached for groupCheckTTL; transient failures are not.
func (p *Provider) enterpriseGroupID(ctx context.Context, name string) (int64, error) {
	now := p.clock.Now()
	p.mu.Lock()
	c, ok := p.groupChecks[strings.ToLower(name)]
	p.mu.Unlock()
	if ok && now.Sub(c.at) < groupCheckTTL {
		return c.id, c.err
	}
	g, err := p.enterpriseGroup(ctx, name)
	if err == nil && p.cfg.Scope.Owner != "" {
		err = p.groupServesOwner(ctx, g, workload.ErrInvalidRequest)
	}
	if err != nil && !errors.Is(err, workload.ErrInvalidRequest) {
		return 0, err
	}
	c = groupCheck{err: err, at: now}
	if err == nil {
		c.id = g.GetID()
	}
	p.mu.Lock()
	p.groupChecks[strings.ToLower(name)] = c
	p.mu.Unlock()
	return c.id, c.err
}
