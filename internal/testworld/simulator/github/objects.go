package githubsim

import (
	"crypto/sha1"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
)

// This file renders API objects in GitHub's JSON shapes (maps, so that the
// key sets can be compared with GitHub's published examples one to one).

// nodeID renders a legacy GraphQL node id ("<len>:<Type><id>", base64),
// which is what older objects in GitHub's examples carry.
func nodeID(typ string, id int64) string {
	raw := fmt.Sprintf("0%d:%s%d", len(typ), typ, id)
	return base64.StdEncoding.EncodeToString([]byte(raw))
}

// accountJSON is a simple-user object (repository owner, sender).
func (s *Simulator) accountJSON(o *owner) map[string]any {
	api, html := s.apiBase(), s.htmlBase()
	typ, nodeType := "User", "User"
	if o.org {
		typ, nodeType = "Organization", "Organization"
	}
	u := api + "/users/" + o.login
	return map[string]any{
		"login":               o.login,
		"id":                  o.id,
		"node_id":             nodeID(nodeType, o.id),
		"avatar_url":          fmt.Sprintf("https://avatars.githubusercontent.com/u/%d?v=4", o.id),
		"gravatar_id":         "",
		"url":                 u,
		"html_url":            html + "/" + o.login,
		"followers_url":       u + "/followers",
		"following_url":       u + "/following{/other_user}",
		"gists_url":           u + "/gists{/gist_id}",
		"starred_url":         u + "/starred{/owner}{/repo}",
		"subscriptions_url":   u + "/subscriptions",
		"organizations_url":   u + "/orgs",
		"repos_url":           u + "/repos",
		"events_url":          u + "/events{/privacy}",
		"received_events_url": u + "/received_events",
		"type":                typ,
		"user_view_type":      "public",
		"site_admin":          false,
	}
}

// orgJSON is the organization object of webhook payloads.
func (s *Simulator) orgJSON(o *owner) map[string]any {
	u := s.apiBase() + "/orgs/" + o.login
	return map[string]any{
		"login":              o.login,
		"id":                 o.id,
		"node_id":            nodeID("Organization", o.id),
		"url":                u,
		"repos_url":          u + "/repos",
		"events_url":         u + "/events",
		"hooks_url":          u + "/hooks",
		"issues_url":         u + "/issues",
		"members_url":        u + "/members{/member}",
		"public_members_url": u + "/public_members{/member}",
		"avatar_url":         fmt.Sprintf("https://avatars.githubusercontent.com/u/%d?v=4", o.id),
		"description":        nil,
	}
}

// licenses are the license objects the simulator knows by SPDX id.
var licenses = map[string][2]string{
	"mit":          {"MIT", "MIT License"},
	"apache-2.0":   {"Apache-2.0", "Apache License 2.0"},
	"gpl-3.0":      {"GPL-3.0", "GNU General Public License v3.0"},
	"bsd-3-clause": {"BSD-3-Clause", `BSD 3-Clause "New" or "Revised" License`},
}

func (s *Simulator) licenseJSON(spdx string) any {
	if spdx == "" {
		return nil
	}
	key := strings.ToLower(spdx)
	names, ok := licenses[key]
	if !ok {
		names = [2]string{spdx, spdx}
	}
	return map[string]any{
		"key":     key,
		"name":    names[1],
		"spdx_id": names[0],
		"url":     s.apiBase() + "/licenses/" + key,
		"node_id": base64.StdEncoding.EncodeToString([]byte("MDc6TGljZW5zZ" + key)),
	}
}

// repoCreated is the creation time reported for every repository.
var repoCreated = time.Date(2021, 6, 11, 13, 29, 13, 0, time.UTC)

// repoJSON is a repository object. It is a superset of the REST
// minimal-repository and the webhook payloads' repository.
func (s *Simulator) repoJSON(rp *repo) map[string]any {
	api, html := s.apiBase(), s.htmlBase()
	u := api + "/repos/" + rp.fullName()
	h := html + "/" + rp.fullName()
	host := strings.TrimPrefix(strings.TrimPrefix(html, "https://"), "http://")
	visibility := "public"
	if rp.private {
		visibility = "private"
	}
	var desc any
	if rp.description != "" {
		desc = rp.description
	}
	return map[string]any{
		"id":                          rp.id,
		"node_id":                     nodeID("Repository", rp.id),
		"name":                        rp.name,
		"full_name":                   rp.fullName(),
		"private":                     rp.private,
		"owner":                       s.accountJSON(rp.owner),
		"html_url":                    h,
		"description":                 desc,
		"fork":                        false,
		"url":                         u,
		"forks_url":                   u + "/forks",
		"keys_url":                    u + "/keys{/key_id}",
		"collaborators_url":           u + "/collaborators{/collaborator}",
		"teams_url":                   u + "/teams",
		"hooks_url":                   u + "/hooks",
		"issue_events_url":            u + "/issues/events{/number}",
		"events_url":                  u + "/events",
		"assignees_url":               u + "/assignees{/user}",
		"branches_url":                u + "/branches{/branch}",
		"tags_url":                    u + "/tags",
		"blobs_url":                   u + "/git/blobs{/sha}",
		"git_tags_url":                u + "/git/tags{/sha}",
		"git_refs_url":                u + "/git/refs{/sha}",
		"trees_url":                   u + "/git/trees{/sha}",
		"statuses_url":                u + "/statuses/{sha}",
		"languages_url":               u + "/languages",
		"stargazers_url":              u + "/stargazers",
		"contributors_url":            u + "/contributors",
		"subscribers_url":             u + "/subscribers",
		"subscription_url":            u + "/subscription",
		"commits_url":                 u + "/commits{/sha}",
		"git_commits_url":             u + "/git/commits{/sha}",
		"comments_url":                u + "/comments{/number}",
		"issue_comment_url":           u + "/issues/comments{/number}",
		"contents_url":                u + "/contents/{+path}",
		"compare_url":                 u + "/compare/{base}...{head}",
		"merges_url":                  u + "/merges",
		"archive_url":                 u + "/{archive_format}{/ref}",
		"downloads_url":               u + "/downloads",
		"issues_url":                  u + "/issues{/number}",
		"pulls_url":                   u + "/pulls{/number}",
		"milestones_url":              u + "/milestones{/number}",
		"notifications_url":           u + "/notifications{?since,all,participating}",
		"labels_url":                  u + "/labels{/name}",
		"releases_url":                u + "/releases{/id}",
		"deployments_url":             u + "/deployments",
		"created_at":                  ghTime(repoCreated),
		"updated_at":                  ghTime(repoCreated.Add(4 * time.Minute)),
		"pushed_at":                   ghTime(repoCreated.Add(3 * time.Minute)),
		"git_url":                     "git://" + host + "/" + rp.fullName() + ".git",
		"ssh_url":                     "git@" + host + ":" + rp.fullName() + ".git",
		"clone_url":                   h + ".git",
		"svn_url":                     h,
		"homepage":                    nil,
		"size":                        1,
		"stargazers_count":            0,
		"watchers_count":              0,
		"language":                    nil,
		"has_issues":                  true,
		"has_projects":                true,
		"has_downloads":               true,
		"has_wiki":                    true,
		"has_pages":                   false,
		"has_discussions":             false,
		"forks_count":                 0,
		"mirror_url":                  nil,
		"archived":                    rp.archived,
		"disabled":                    false,
		"open_issues_count":           0,
		"license":                     s.licenseJSON(rp.license),
		"allow_forking":               true,
		"is_template":                 false,
		"web_commit_signoff_required": false,
		"topics":                      []string{},
		"visibility":                  visibility,
		"forks":                       0,
		"open_issues":                 0,
		"watchers":                    0,
		"default_branch":              rp.defaultBranch,
		"custom_properties":           map[string]any{},
	}
}

// runnerJSON is a runner object (REST runner schema).
func (s *Simulator) runnerJSON(r *runner) map[string]any {
	labels := make([]any, 0, len(r.labels))
	for _, l := range r.labels {
		labels = append(labels, map[string]any{"id": s.labelID(l), "name": l, "type": labelType(l)})
	}
	status := "offline"
	if s.onlineLocked(r) {
		status = "online"
	}
	return map[string]any{
		"id":              r.id,
		"name":            r.name,
		"os":              r.os,
		"status":          status,
		"busy":            r.busy,
		"ephemeral":       r.ephemeral,
		"runner_group_id": r.group.id,
		"labels":          labels,
	}
}

// labelID returns the id of a label name, allocated on first use (GitHub's
// label ids are per name, case-insensitively).
func (s *Simulator) labelID(name string) int64 {
	k := strings.ToLower(name)
	if id, ok := s.labelIDs[k]; ok {
		return id
	}
	id := int64(len(s.labelIDs) + 1)
	s.labelIDs[k] = id
	return id
}

// systemLabels are the labels a self-hosted runner gets by default; GitHub
// reports them as read-only.
var systemLabels = map[string]bool{"self-hosted": true, "linux": true, "windows": true, "macos": true, "x64": true, "arm": true, "arm64": true}

func labelType(name string) string {
	if systemLabels[strings.ToLower(name)] {
		return "read-only"
	}
	return "custom"
}

// headSHA is a stable fake commit id for a run.
func headSHA(runID int64) string {
	sum := sha1.Sum([]byte(fmt.Sprintf("run-%d", runID)))
	return hex.EncodeToString(sum[:])
}

// jobJSON is a job object: the REST job schema, which is also the
// workflow_job of webhook payloads.
func (s *Simulator) jobJSON(j *job) map[string]any {
	api, html := s.apiBase(), s.htmlBase()
	rp := j.run.repo
	u := api + "/repos/" + rp.fullName()
	var conclusion, runnerID, runnerName, groupID, groupName any
	if j.status == "completed" {
		conclusion = j.conclusion
	}
	if j.runnerID != 0 {
		runnerID, runnerName, groupID, groupName = j.runnerID, j.runnerName, j.groupID, j.groupName
	}
	started := j.startedAt
	if started.IsZero() {
		// GitHub reports started_at = created_at while a job is queued.
		started = j.createdAt
	}
	return map[string]any{
		"id":                j.id,
		"run_id":            j.run.id,
		"run_url":           fmt.Sprintf("%s/actions/runs/%d", u, j.run.id),
		"run_attempt":       1,
		"node_id":           nodeID("CheckRun", j.id),
		"head_sha":          j.run.headSHA,
		"head_branch":       j.run.headBranch,
		"url":               fmt.Sprintf("%s/actions/jobs/%d", u, j.id),
		"html_url":          fmt.Sprintf("%s/%s/actions/runs/%d/job/%d", html, rp.fullName(), j.run.id, j.id),
		"status":            j.status,
		"conclusion":        conclusion,
		"created_at":        ghTime(j.createdAt),
		"started_at":        ghTime(started),
		"completed_at":      ghTimeOrNil(j.completedAt),
		"name":              j.name,
		"steps":             s.stepsJSON(j),
		"check_run_url":     fmt.Sprintf("%s/check-runs/%d", u, j.id),
		"labels":            append([]string{}, j.labels...),
		"runner_id":         runnerID,
		"runner_name":       runnerName,
		"runner_group_id":   groupID,
		"runner_group_name": groupName,
		"workflow_name":     j.run.workflowName,
	}
}

// stepsJSON renders the job's steps: none while queued, "Set up job" once
// it runs, and set-up / run / complete once it has finished.
func (s *Simulator) stepsJSON(j *job) []any {
	step := func(n int, name, status string, conclusion any, start, end time.Time) map[string]any {
		return map[string]any{"name": name, "status": status, "conclusion": conclusion, "number": n,
			"started_at": start.UTC().Format("2006-01-02T15:04:05.000Z"), "completed_at": ghStepTime(end)}
	}
	switch j.status {
	case "in_progress":
		return []any{step(1, "Set up job", "in_progress", nil, j.startedAt, time.Time{})}
	case "completed":
		if j.startedAt.IsZero() {
			return []any{}
		}
		runConclusion := j.conclusion
		return []any{
			step(1, "Set up job", "completed", "success", j.startedAt, j.startedAt),
			step(2, "Run "+j.name, "completed", runConclusion, j.startedAt, j.completedAt),
			step(3, "Complete job", "completed", "success", j.completedAt, j.completedAt),
		}
	}
	return []any{}
}

func ghStepTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

// runJSON is a workflow-run object.
func (s *Simulator) runJSON(r *run) map[string]any {
	api, html := s.apiBase(), s.htmlBase()
	rp := r.repo
	u := fmt.Sprintf("%s/repos/%s/actions/runs/%d", api, rp.fullName(), r.id)
	var conclusion any
	if r.status == "completed" {
		conclusion = r.conclusion
	}
	sender := s.owners[strings.ToLower(s.cfg.Sender)]
	return map[string]any{
		"id":                   r.id,
		"name":                 r.workflowName,
		"node_id":              nodeID("WorkflowRun", r.id),
		"check_suite_id":       r.id + 1,
		"check_suite_node_id":  nodeID("CheckSuite", r.id+1),
		"head_branch":          r.headBranch,
		"head_sha":             r.headSHA,
		"path":                 r.path,
		"display_title":        r.workflowName,
		"run_number":           r.runNumber,
		"run_attempt":          1,
		"referenced_workflows": []any{},
		"event":                "push",
		"status":               r.status,
		"conclusion":           conclusion,
		"workflow_id":          rp.workflowID,
		"url":                  u,
		"html_url":             fmt.Sprintf("%s/%s/actions/runs/%d", html, rp.fullName(), r.id),
		"pull_requests":        []any{},
		"created_at":           ghTime(r.createdAt),
		"updated_at":           ghTime(r.updatedAt),
		"run_started_at":       ghTime(r.createdAt),
		"actor":                s.accountJSON(sender),
		"triggering_actor":     s.accountJSON(sender),
		"jobs_url":             u + "/jobs",
		"logs_url":             u + "/logs",
		"check_suite_url":      fmt.Sprintf("%s/repos/%s/check-suites/%d", api, rp.fullName(), r.id+1),
		"artifacts_url":        u + "/artifacts",
		"cancel_url":           u + "/cancel",
		"rerun_url":            u + "/rerun",
		"previous_attempt_url": nil,
		"workflow_url":         fmt.Sprintf("%s/repos/%s/actions/workflows/%d", api, rp.fullName(), rp.workflowID),
		"head_commit": map[string]any{
			"id":        r.headSHA,
			"tree_id":   headSHA(r.id + 1),
			"message":   "Simulated commit",
			"timestamp": ghTime(r.createdAt),
			"author":    map[string]any{"name": sender.login, "email": sender.login + "@users.noreply.github.com"},
			"committer": map[string]any{"name": "GitHub", "email": "noreply@github.com"},
		},
		"repository":         s.repoJSON(rp),
		"head_repository":    s.repoJSON(rp),
		"head_repository_id": rp.id,
	}
}

// runnerGroupJSON is a runner-groups-org object.
func (s *Simulator) runnerGroupJSON(o *owner, g *runnerGroup) map[string]any {
	if o.enterprise {
		return s.enterpriseGroupJSON(o, g)
	}
	return map[string]any{
		"id":                                   g.id,
		"name":                                 g.name,
		"visibility":                           g.visibility,
		"default":                              g.def,
		"runners_url":                          fmt.Sprintf("%s/orgs/%s/actions/runner-groups/%d/runners", s.apiBase(), o.login, g.id),
		"inherited":                            false,
		"allows_public_repositories":           g.allowsPublic,
		"restricted_to_workflows":              false,
		"selected_workflows":                   []string{},
		"workflow_restrictions_read_only":      false,
		"inherited_allows_public_repositories": false,
	}
}
