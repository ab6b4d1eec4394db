package github

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"time"

	gh "github.com/google/go-github/v88/github"

	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

const (
	// repositoriesRefresh is how long an organization's repository list
	// is used before it is listed again. The listing is conditional, so an
	// unchanged list costs no rate-limit budget; a new repository is
	// scanned within this time.
	repositoriesRefresh = 5 * time.Minute
	// maxRepositoryPages bounds the listing: 10 pages of 100, the first
	// 1,000 repositories (GitHub lists an organization's by creation, the
	// newest first; an installation's in its own order).
	maxRepositoryPages = 10
)

// listedRepositories is the scope's repository list as last read.
type listedRepositories struct {
	at    time.Time
	names []string
}

// Repositories implements workload.Provider: a repository scope's one
// repository, or an organization's repositories (archived ones, which run
// no workflows, left out): for a GitHub App the installation's
// repositories (GET /installation/repositories: an App installed on
// selected repositories sees only those), for a personal access token the
// organization's (GET /orgs/{org}/repos). The list is refreshed at most
// every repositoriesRefresh, with conditional requests, and bounded to
// maxRepositoryPages pages.
func (p *Provider) Repositories(ctx context.Context) ([]string, error) {
	scope := p.cfg.Scope
	if !scope.IsOrganization() {
		return []string{scope.Owner + "/" + scope.Repository}, nil
	}
	if scope.Owner == "" {
		return nil, fmt.Errorf("github: the runners of enterprise %s have no organization to read repositories of; name one in %s.organization: %w", scope.Enterprise, poolField, workload.ErrInvalidRequest)
	}
	now := p.clock.Now()
	p.mu.Lock()
	if last := p.repositories; !last.at.IsZero() && now.Sub(last.at) < repositoriesRefresh {
		p.mu.Unlock()
		return slices.Clone(last.names), nil
	}
	p.mu.Unlock()
	path, what := fmt.Sprintf("orgs/%s/repos?type=all&per_page=100", url.PathEscape(scope.Owner)), "list the repositories of "+scope.Owner
	decode := func(body []byte) ([]string, error) {
		var repos []*gh.Repository
		err := json.Unmarshal(body, &repos)
		return repositoryNames(repos), err
	}
	if p.app != nil {
		path, what = "installation/repositories?per_page=100", "list the repositories of the GitHub App installation on "+scope.Owner
		decode = func(body []byte) ([]string, error) {
			var list gh.ListRepositories
			err := json.Unmarshal(body, &list)
			return repositoryNames(list.Repositories), err
		}
	}
	got, err := conditionalPages(ctx, p, what, maxRepositoryPages, func(page int) string { return fmt.Sprintf("%s&page=%d", path, page) }, decode)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, n := range got {
		// An installation may be on another account than the scope's.
		if scope.Contains(n) {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	p.mu.Lock()
	p.repositories = listedRepositories{at: now, names: names}
	p.mu.Unlock()
	return slices.Clone(names), nil
}

// repositoryNames are the full names of repos that can run workflows.
func repositoryNames(repos []*gh.Repository) []string {
	out := make([]string, 0, len(repos))
	for _, r := range repos {
		if r.GetFullName() != "" && !r.GetArchived() {
			out = append(out, r.GetFullName())
		}
	}
	return out
}
