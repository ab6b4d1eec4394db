package githubsim

import (
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
)

// newRepo is the repository r configures under ow.
func newRepo(ow *owner, name string, id, workflowID int64, r RepoConfig) *repo {
	private := true
	if r.Private != nil {
		private = *r.Private
	}
	branch := r.DefaultBranch
	if branch == "" {
		branch = "main"
	}
	return &repo{owner: ow, name: name, id: id, private: private, defaultBranch: branch,
		license: r.License, description: r.Description, archived: r.Archived, workflowID: workflowID}
}

// AddRepository creates a repository while the simulator runs, as someone
// creating one in an organization (or their account) does: r.Name is
// owner/name of an existing owner; without r.ID it gets the next id.
func (s *Simulator) AddRepository(r RepoConfig) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("simulator closed")
	}
	login, name, ok := strings.Cut(r.Name, "/")
	if !ok || login == "" || name == "" || strings.Contains(name, "/") {
		return fmt.Errorf("repository %q must be owner/name", r.Name)
	}
	ow := s.owners[strings.ToLower(login)]
	if ow == nil {
		return fmt.Errorf("repository %q: owner %q does not exist", r.Name, login)
	}
	if s.repos[strings.ToLower(r.Name)] != nil {
		return fmt.Errorf("repository %q already exists", r.Name)
	}
	var last int64
	for _, rp := range s.repos {
		last = max(last, rp.id, rp.workflowID)
	}
	id := r.ID
	if id == 0 {
		id = last + 1
	}
	s.repos[strings.ToLower(r.Name)] = newRepo(ow, name, id, max(last, id)+1, r)
	return nil
}

// handleListOrgRepos is GET /orgs/{org}/repos: the organization's
// repositories the caller can see, newest first (GitHub's default: sort
// created, descending). type public or private filters by visibility;
// forks are not modelled, so forks lists none and sources, member and all
// list every one.
func (s *Simulator) handleListOrgRepos(q *request) (int, any, error) {
	typ := q.query.Get("type")
	var list []*repo
	for _, rp := range s.repos {
		if rp.owner != q.owner || !q.id.canSee(rp.owner, rp) {
			continue
		}
		switch {
		case typ == "forks",
			typ == "public" && rp.private,
			typ == "private" && !rp.private:
			continue
		}
		list = append(list, rp)
	}
	sort.Slice(list, func(a, b int) bool { return list[a].id > list[b].id })
	start, end := q.paginate(len(list))
	out := make([]any, 0, end-start)
	for _, rp := range list[start:end] {
		out = append(out, s.repoJSON(rp))
	}
	return http.StatusOK, out, nil
}

// handleListInstallationRepos is GET /installation/repositories: the
// repositories an installation access token may use (the installation's
// selection, or the token's own restriction), in creation order. Any other
// credential is refused with 403, as on GitHub.
func (s *Simulator) handleListInstallationRepos(q *request) (int, any, error) {
	if q.id.kind != "installation" {
		return 0, nil, &apiError{code: http.StatusForbidden,
			msg: "You must authenticate with an installation access token in order to list repositories for an installation."}
	}
	in := q.id.token.inst
	var list []*repo
	for _, rp := range s.repos {
		if rp.owner == in.account && q.id.canSee(rp.owner, rp) {
			list = append(list, rp)
		}
	}
	sort.Slice(list, func(a, b int) bool { return list[a].id < list[b].id })
	start, end := q.paginate(len(list))
	out := make([]any, 0, end-start)
	for _, rp := range list[start:end] {
		out = append(out, s.repoJSON(rp))
	}
	return http.StatusOK, map[string]any{"total_count": len(list), "repository_selection": in.selection, "repositories": out}, nil
}
