package gitlabsim

import (
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The REST answers, one function per GitLab API entity. Their property
// names and JSON types are those of GitLab's published OpenAPI
// description (doc/api/openapi/openapi_v2.yaml), which description_test.go
// transcribes and checks every answer against; a property is left out
// only where GitLab itself sends it conditionally (a query parameter, a
// fork, an EE feature) or the simulator does not model what it describes,
// each listed there with its reason. Values are those of a fresh private
// project or group on a GitLab Free instance.

// userBasicJSON is GitLab's UserBasic entity (a runner's created_by, a
// pipeline's user).
func (s *Simulator) userBasicJSON(r *http.Request, u *user) map[string]any {
	return map[string]any{
		"id": u.id, "username": u.username, "public_email": "", "name": u.name, "state": "active", "locked": false,
		"avatar_url": nil, "web_url": s.baseURL(r) + "/" + u.username,
	}
}

// userJSON is GitLab's User entity (a job's user): UserBasic and the
// profile fields, empty as a new account's are.
func (s *Simulator) userJSON(r *http.Request, u *user) map[string]any {
	m := s.userBasicJSON(r, u)
	for k, v := range map[string]any{
		"created_at": timeJSON(u.created), "bio": "", "location": "", "linkedin": "", "twitter": "", "discord": "",
		"website_url": "", "github": "", "job_title": "", "pronouns": nil, "organization": "", "bot": u.bot,
		"work_information": nil, "followers": 0, "following": 0, "is_followed": false, "local_time": nil,
	} {
		m[k] = v
	}
	return m
}

// currentUserJSON is GET /user (which GitLab's description does not
// document): the User entity with the fields GitLab adds for the caller
// itself.
func (s *Simulator) currentUserJSON(r *http.Request, u *user) map[string]any {
	m := s.userJSON(r, u)
	m["is_admin"] = u.admin
	m["email"] = u.username + "@example.com"
	return m
}

// tokenJSON is GitLab's PersonalAccessTokenWithLastUsedIps entity (GET
// /personal_access_tokens/self).
func (s *Simulator) tokenJSON(t *accessToken) map[string]any {
	var exp, last any
	if !t.expiresAt.IsZero() {
		exp = t.expiresAt.UTC().Format("2006-01-02")
	}
	if !t.lastUsed.IsZero() {
		last = timeJSON(t.lastUsed)
	}
	now := s.clock.Now()
	return map[string]any{
		"id": t.id, "name": t.name, "revoked": t.revoked, "created_at": timeJSON(t.created), "description": "",
		"scopes": t.scopes, "user_id": t.user.id, "last_used_at": last,
		"active": !t.revoked && (t.expiresAt.IsZero() || now.Before(t.expiresAt)), "expires_at": exp,
		// GitLab lists the addresses the token was last used from; the
		// simulator does not record them.
		"last_used_ips": []string{},
	}
}

// namespaceJSON is GitLab's NamespaceBasic entity (a project's namespace).
func (s *Simulator) namespaceJSON(r *http.Request, g *group) map[string]any {
	var parent any
	if g.parent != nil {
		parent = g.parent.id
	}
	return map[string]any{"id": g.id, "name": g.name, "path": g.path, "kind": "group", "full_path": g.fullPath, "parent_id": parent, "avatar_url": nil, "web_url": s.baseURL(r) + "/groups/" + g.fullPath}
}

// projectBasicJSON is GitLab's BasicProjectDetails entity (a runner's
// projects), which the Project entity extends.
func (s *Simulator) projectBasicJSON(r *http.Request, p *project) map[string]any {
	base := s.baseURL(r)
	full := p.fullPath()
	return map[string]any{
		"id": p.id, "description": "", "name": p.name, "name_with_namespace": strings.ReplaceAll(p.group.fullPath, "/", " / ") + " / " + p.name,
		"path": p.path, "path_with_namespace": full, "created_at": timeJSON(p.created), "default_branch": p.defaultBranch,
		"tag_list": []string{}, "topics": []string{}, "ssh_url_to_repo": "git@" + strings.TrimPrefix(strings.TrimPrefix(base, "https://"), "http://") + ":" + full + ".git",
		"http_url_to_repo": base + "/" + full + ".git", "web_url": base + "/" + full,
		"readme_url": nil, "forks_count": 0, "avatar_url": nil, "star_count": 0, "last_activity_at": timeJSON(p.created),
		"visibility": "private", "namespace": s.namespaceJSON(r, p.group),
	}
}

// projectJSON is GitLab's Project entity (GET /groups/:id/projects, a
// group's projects): the settings of a new private project. GitLab adds
// the fields for project administrators (import_url, import_error,
// build_git_strategy) only when one project is read (GET /projects/:id),
// which single says.
func (s *Simulator) projectJSON(r *http.Request, p *project, caller *user, single bool) map[string]any {
	m := s.projectBasicJSON(r, p)
	api := fmt.Sprintf("%s%s/projects/%d", s.baseURL(r), APIPrefix, p.id)
	level := caller.projectLevel(p)
	for k, v := range map[string]any{
		"_links": map[string]any{
			"self": api, "issues": api + "/issues", "merge_requests": api + "/merge_requests", "repo_branches": api + "/repository/branches",
			"labels": api + "/labels", "events": api + "/events", "members": api + "/members", "cluster_agents": api + "/cluster_agents",
		},
		"marked_for_deletion_at": nil, "marked_for_deletion_on": nil, "packages_enabled": true,
		// The simulator's pipelines run on commits, so the repository is not
		// empty.
		"empty_repo": false, "archived": false, "resolve_outdated_diff_discussions": false, "repository_object_format": "sha1",
		"issues_enabled": true, "merge_requests_enabled": true, "wiki_enabled": true, "jobs_enabled": true, "snippets_enabled": true,
		// No container registry is simulated.
		"container_registry_enabled": false, "service_desk_enabled": false, "service_desk_address": nil,
		"can_create_merge_request_in": level >= Developer, "issues_access_level": "enabled", "repository_access_level": "enabled",
		"merge_requests_access_level": "enabled", "forking_access_level": "enabled", "wiki_access_level": "enabled", "builds_access_level": "enabled", "snippets_access_level": "enabled",
		"pages_access_level": "private", "analytics_access_level": "enabled", "container_registry_access_level": "disabled",
		"security_and_compliance_access_level": "private", "releases_access_level": "enabled", "environments_access_level": "enabled",
		"feature_flags_access_level": "enabled", "infrastructure_access_level": "enabled", "monitor_access_level": "enabled",
		"model_experiments_access_level": "enabled", "model_registry_access_level": "enabled", "package_registry_access_level": "enabled",
		"emails_disabled": false, "emails_enabled": true, "show_diff_preview_in_email": true, "shared_runners_enabled": true,
		"lfs_enabled": true, "creator_id": s.creatorIDLocked(), "import_type": nil, "import_status": "none", "open_issues_count": 0,
		"description_html": "", "updated_at": timeJSON(p.created),
		"ci_default_git_depth": 20, "ci_delete_pipelines_in_seconds": nil, "ci_forward_deployment_enabled": true,
		"ci_forward_deployment_rollback_allowed": true, "ci_job_token_scope_enabled": false, "ci_separated_caches": true,
		"ci_allow_fork_pipelines_to_run_in_parent_project": true, "ci_id_token_sub_claim_components": []string{"project_path", "ref_type", "ref"},
		"keep_latest_artifact": true, "restrict_user_defined_variables": true, "ci_pipeline_variables_minimum_override_role": "no_one_allowed",
		"runner_token_expiration_interval": nil, "group_runners_enabled": true, "resource_group_default_process_mode": "unordered",
		"auto_cancel_pending_pipelines": "enabled", "build_timeout": 3600, "auto_devops_enabled": false,
		"auto_devops_deploy_strategy": "continuous", "ci_push_repository_for_job_token_allowed": false, "ci_config_path": nil,
		"public_jobs": true, "shared_with_groups": []any{}, "only_allow_merge_if_pipeline_succeeds": false,
		"allow_merge_on_skipped_pipeline": false, "request_access_enabled": true, "only_allow_merge_if_all_discussions_are_resolved": false,
		"remove_source_branch_after_merge": true, "printing_merge_request_link_enabled": true, "merge_method": "merge",
		"merge_request_title_regex": nil, "merge_request_title_regex_description": nil, "squash_option": "default_off",
		"enforce_auth_checks_on_uploads": true, "suggestion_commit_message": nil, "merge_commit_template": nil,
		"squash_commit_template": nil, "issue_branch_template": nil, "warn_about_potentially_unwanted_characters": true,
		"autoclose_referenced_issues": true, "max_artifacts_size": nil,
	} {
		m[k] = v
	}
	if single && level >= Maintainer {
		m["import_url"] = nil
		m["import_error"] = nil
		m["build_git_strategy"] = "fetch"
	}
	return m
}

// projectWithAccessJSON is GitLab's ProjectWithAccess entity (GET
// /projects/:id): the Project and the caller's direct membership of the
// project and of its group (null where it has none; notification level 3,
// global, a new member's).
func (s *Simulator) projectWithAccessJSON(r *http.Request, p *project, caller *user) map[string]any {
	m := s.projectJSON(r, p, caller, true)
	access := func(level int) any {
		if level == 0 {
			return nil
		}
		return map[string]any{"access_level": level, "notification_level": 3}
	}
	groupLevel := 0
	for g := p.group; g != nil; g = g.parent {
		groupLevel = max(groupLevel, caller.access[fmt.Sprintf("g%d", g.id)])
	}
	m["permissions"] = map[string]any{"project_access": access(caller.access[fmt.Sprintf("p%d", p.id)]), "group_access": access(groupLevel)}
	return m
}

// creatorIDLocked stands for the user who created the configured projects
// and groups: the first administrator (or user) configured.
func (s *Simulator) creatorIDLocked() int64 {
	var id int64
	for _, u := range s.users {
		if u.bot {
			continue
		}
		better := id == 0 || u.admin && !s.users[id].admin || u.admin == s.users[id].admin && u.id < id
		if better {
			id = u.id
		}
	}
	return id
}

// groupDetailJSON is GitLab's GroupDetail entity (GET /groups/:id): the
// settings of a new private group, and the group's own projects the
// caller can see (GitLab's with_projects, on by default).
func (s *Simulator) groupDetailJSON(r *http.Request, g *group, caller *user) map[string]any {
	var parent any
	if g.parent != nil {
		parent = g.parent.id
	}
	var ps []*project
	for _, p := range s.projects {
		if p.group == g && caller.projectLevel(p) >= Guest {
			ps = append(ps, p)
		}
	}
	sort.Slice(ps, func(i, k int) bool { return ps[i].id < ps[k].id })
	projects := make([]any, 0, len(ps))
	for _, p := range ps {
		projects = append(projects, s.projectJSON(r, p, caller, false))
	}
	// GitLab's default branch protection: Maintainers push and merge,
	// no force push, developers cannot push the initial commit.
	maintainers := []any{map[string]any{"access_level": Maintainer}}
	protection := map[string]any{"allowed_to_push": maintainers, "allow_force_push": false, "allowed_to_merge": maintainers, "developer_can_initial_push": false}
	return map[string]any{
		"id": g.id, "web_url": s.baseURL(r) + "/groups/" + g.fullPath, "name": g.name, "path": g.path, "description": "",
		"visibility": "private", "share_with_group_lock": false, "require_two_factor_authentication": false,
		"two_factor_grace_period": 48, "project_creation_level": "developer", "auto_devops_enabled": nil,
		"subgroup_creation_level": "maintainer", "emails_disabled": false, "emails_enabled": true,
		"show_diff_preview_in_email": true, "mentions_disabled": nil, "lfs_enabled": true, "archived": false,
		"math_rendering_limits_enabled": true, "lock_math_rendering_limits_enabled": false, "default_branch": nil,
		"default_branch_protection": 2, "default_branch_protection_defaults": protection, "avatar_url": nil, "request_access_enabled": true, "full_name": strings.ReplaceAll(g.fullPath, "/", " / "),
		"full_path": g.fullPath, "created_at": timeJSON(g.created), "parent_id": parent, "organization_id": 1,
		"shared_runners_setting": "enabled", "max_artifacts_size": nil, "marked_for_deletion_on": nil,
		"shared_with_groups": []any{}, "prevent_sharing_groups_outside_hierarchy": false,
		"projects": projects, "shared_projects": []any{},
	}
}

// runnerJSON is GitLab's Runner entity (the runner lists, a job's runner).
func (s *Simulator) runnerJSON(req *http.Request, r *runner) map[string]any {
	st, online := r.status(s.clock.Now())
	return map[string]any{
		"id": r.id, "description": r.description, "ip_address": "", "active": !r.paused, "paused": r.paused,
		"is_shared": r.kind == InstanceType, "runner_type": r.kind, "name": "gitlab-runner", "online": online, "status": st,
		"created_at": timeJSON(r.created), "created_by": s.userBasicJSON(req, r.creator),
		"job_execution_status": s.jobExecutionStatusLocked(r),
	}
}

// jobExecutionStatusLocked is the runner's job_execution_status (GitLab
// 17+): active while it runs a job, idle otherwise.
func (s *Simulator) jobExecutionStatusLocked(r *runner) string {
	for _, j := range s.jobs {
		if j.runner == r && j.status == StatusRunning {
			return "active"
		}
	}
	return "idle"
}

// runnerDetailsJSON is GitLab's RunnerDetails entity (GET and PUT
// /runners/:id); its projects are BasicProjectDetails, its groups
// BasicGroupDetails.
func (s *Simulator) runnerDetailsJSON(req *http.Request, r *runner) map[string]any {
	m := s.runnerJSON(req, r)
	var contacted any
	if !r.contacted.IsZero() {
		contacted = timeJSON(r.contacted)
	}
	projects := []any{}
	for _, p := range r.projects {
		projects = append(projects, s.projectBasicJSON(req, p))
	}
	groups := []any{}
	if r.group != nil {
		groups = append(groups, map[string]any{"id": r.group.id, "name": r.group.name, "web_url": s.baseURL(req) + "/groups/" + r.group.fullPath})
	}
	tags := r.tags
	if tags == nil {
		tags = []string{}
	}
	var maxTimeout any
	if r.maximumTimeout > 0 {
		maxTimeout = r.maximumTimeout
	}
	for k, v := range map[string]any{
		"tag_list": tags, "run_untagged": r.runUntagged, "locked": r.locked, "access_level": r.accessLevel,
		"maximum_timeout": maxTimeout, "maintenance_note": r.maintenanceNote, "contacted_at": contacted,
		"projects": projects, "groups": groups, "architecture": nil, "platform": nil, "revision": nil, "version": nil,
	} {
		m[k] = v
	}
	return m
}

// jobJSON is GitLab's Job entity (GET /projects/:id/jobs, one job, its
// cancellation).
func (s *Simulator) jobJSON(r *http.Request, j *job) map[string]any {
	p := j.pipeline
	base := s.baseURL(r)
	var dur, queued, runnerJ any
	if !j.started.IsZero() {
		end := j.finished
		if end.IsZero() {
			end = s.clock.Now()
		}
		dur = end.Sub(j.started).Seconds()
		queued = j.started.Sub(j.queued).Seconds()
	} else if !j.queued.IsZero() {
		queued = s.clock.Now().Sub(j.queued).Seconds()
	}
	if j.runner != nil {
		runnerJ = s.runnerJSON(r, j.runner)
	}
	tags := j.tags
	if tags == nil {
		tags = []string{}
	}
	m := map[string]any{
		"id": j.id, "name": j.name, "stage": j.stage, "status": j.status, "ref": p.ref, "tag": false,
		"allow_failure": j.allowFailure, "created_at": timeJSON(j.created), "started_at": timeJSON(j.started),
		"finished_at": timeJSON(j.finished), "erased_at": nil, "duration": dur, "queued_duration": queued,
		"coverage": nil, "tag_list": tags, "web_url": fmt.Sprintf("%s/%s/-/jobs/%d", base, p.project.fullPath(), j.id),
		"user": s.userJSON(r, p.user), "pipeline": s.pipelineBasicJSON(r, p), "commit": s.commitJSON(r, p),
		"project": map[string]any{"ci_job_token_scope_enabled": false}, "runner": runnerJ, "artifacts": []any{}, "artifacts_expire_at": nil, "archived": false,
	}
	// GitLab sends failure_reason for failed jobs only.
	if j.status == StatusFailed {
		m["failure_reason"] = j.failureReason
	}
	return m
}

// commitJSON is GitLab's Commit entity for a pipeline's commit (the
// simulator serves no repository: one commit without parents, by the
// pipeline's user).
func (s *Simulator) commitJSON(r *http.Request, pl *pipeline) map[string]any {
	at := timeJSON(pl.created)
	return map[string]any{
		"id": pl.sha, "short_id": pl.sha[:8], "created_at": at, "parent_ids": []string{}, "title": "Simulated commit",
		"message": "Simulated commit\n", "author_name": pl.user.name, "author_email": pl.user.username + "@example.com",
		"authored_date": at, "committer_name": pl.user.name, "committer_email": pl.user.username + "@example.com",
		"committed_date": at, "trailers": map[string]any{}, "extended_trailers": map[string]any{},
		"web_url": s.baseURL(r) + "/" + pl.project.fullPath() + "/-/commit/" + pl.sha,
	}
}

// pipelineTimes are a pipeline's start (its first job's), end (its last
// job's, once the pipeline finished) and last change.
func pipelineTimes(pl *pipeline) (started, finished, updated time.Time) {
	updated = pl.created
	for _, j := range pl.jobs {
		if !j.started.IsZero() && (started.IsZero() || j.started.Before(started)) {
			started = j.started
		}
		for _, t := range []time.Time{j.queued, j.started, j.finished} {
			if t.After(updated) {
				updated = t
			}
		}
		if j.finished.After(finished) {
			finished = j.finished
		}
	}
	switch pl.status {
	case StatusSuccess, StatusFailed, StatusCanceled, StatusSkipped:
	default:
		finished = time.Time{}
	}
	return started, finished, updated
}

// pipelineBasicJSON is GitLab's PipelineBasic entity (a job's pipeline).
func (s *Simulator) pipelineBasicJSON(r *http.Request, pl *pipeline) map[string]any {
	_, _, updated := pipelineTimes(pl)
	return map[string]any{
		"id": pl.id, "iid": pl.iid, "project_id": pl.project.id, "sha": pl.sha, "ref": pl.ref, "status": pl.status,
		"source": "push", "created_at": timeJSON(pl.created), "updated_at": timeJSON(updated),
		"web_url": s.baseURL(r) + "/" + pl.project.fullPath() + "/-/pipelines/" + strconv.FormatInt(pl.id, 10),
	}
}

// pipelineJSON is GitLab's Pipeline entity (POST
// /projects/:id/pipelines/:pipeline_id/cancel): durations in whole
// seconds, a push to a branch (no before_sha: the zero SHA).
func (s *Simulator) pipelineJSON(r *http.Request, pl *pipeline) map[string]any {
	m := s.pipelineBasicJSON(r, pl)
	started, finished, _ := pipelineTimes(pl)
	var dur, queued any
	if !started.IsZero() {
		queued = int64(started.Sub(pl.created).Seconds())
		if !finished.IsZero() {
			dur = int64(finished.Sub(started).Seconds())
		}
	}
	for k, v := range map[string]any{
		"before_sha": strings.Repeat("0", 40), "tag": false, "yaml_errors": nil, "user": s.userBasicJSON(r, pl.user),
		"started_at": timeJSON(started), "finished_at": timeJSON(finished), "committed_at": nil, "duration": dur,
		"queued_duration": queued, "coverage": nil, "archived": false,
		"detailed_status": detailedStatusJSON(pl.status, "/"+pl.project.fullPath()+"/-/pipelines/"+strconv.FormatInt(pl.id, 10)),
	} {
		m[k] = v
	}
	return m
}

// detailedStatusJSON is GitLab's DetailedStatusEntity for a status: GitLab
// shows success as "passed"; the simulator's statuses have no action and
// no illustration.
func detailedStatusJSON(status, path string) map[string]any {
	label := status
	if status == StatusSuccess {
		label = "passed"
	}
	text := strings.ToUpper(label[:1]) + label[1:]
	return map[string]any{
		"icon": "status_" + status, "text": text, "label": label, "group": status, "tooltip": label,
		"has_details": true, "details_path": path, "illustration": nil,
		"favicon": "/assets/ci_favicons/favicon_status_" + status + ".png",
	}
}
