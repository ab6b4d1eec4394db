package gitlabsim

import (
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// restLocked routes an authenticated REST call. Unknown paths answer GitLab's
// 404 body.
func (s *Simulator) restLocked(q *request) {
	m, seg := q.r.Method, q.seg
	n := len(seg)
	switch {
	case m == http.MethodPost && n == 2 && seg[0] == "user" && seg[1] == "runners":
		s.createRunnerLocked(q)
	case m == http.MethodGet && n == 1 && seg[0] == "user":
		if requireScope(q, readScopes("read_user")...) {
			writeJSON(q.w, http.StatusOK, s.currentUserJSON(q.r, q.tok.user))
		}
	case m == http.MethodGet && n == 2 && seg[0] == "personal_access_tokens" && seg[1] == "self":
		// Any valid token may read itself, whatever its scopes.
		writeJSON(q.w, http.StatusOK, s.tokenJSON(q.tok))
	case m == http.MethodGet && n == 2 && seg[0] == "runners" && seg[1] == "all":
		s.listAllRunnersLocked(q)
	case n == 2 && seg[0] == "runners" && (m == http.MethodGet || m == http.MethodDelete || m == http.MethodPut):
		s.runnerByIDLocked(q)
	case n >= 2 && seg[0] == "projects":
		s.projectRoutesLocked(q)
	case n >= 2 && seg[0] == "groups":
		s.groupRoutesLocked(q)
	default:
		writeMessage(q.w, http.StatusNotFound, "404 Not Found")
	}
}

// findProjectLocked resolves :id (a number or a URL-encoded full path) to a
// project the caller can see; 404 otherwise, as GitLab hides projects a
// caller has no access to.
func (s *Simulator) findProjectLocked(q *request, ref string) *project {
	var p *project
	if id, err := strconv.ParseInt(ref, 10, 64); err == nil {
		p = s.projects[id]
	} else {
		p = s.projectByPathLocked(ref)
	}
	if p == nil || q.tok.user.projectLevel(p) < Guest {
		writeMessage(q.w, http.StatusNotFound, "404 Project Not Found")
		return nil
	}
	return p
}

func (s *Simulator) findGroupLocked(q *request, ref string) *group {
	var g *group
	if id, err := strconv.ParseInt(ref, 10, 64); err == nil {
		g = s.groups[id]
	} else {
		g = s.groupByPathLocked(ref)
	}
	if g == nil || !s.canSeeGroupLocked(q.tok.user, g) {
		writeMessage(q.w, http.StatusNotFound, "404 Group Not Found")
		return nil
	}
	return g
}

// canSeeGroupLocked: a member of g or of an ancestor, or of anything below
// g (GitLab shows a private group to members of its subgroups and
// projects).
func (s *Simulator) canSeeGroupLocked(u *user, g *group) bool {
	if u.groupLevel(g) >= Guest {
		return true
	}
	for _, sub := range s.groups {
		if sub.under(g) && u.groupLevel(sub) >= Guest {
			return true
		}
	}
	for _, p := range s.projects {
		if p.group.under(g) && u.projectLevel(p) >= Guest {
			return true
		}
	}
	return false
}

func (s *Simulator) projectRoutesLocked(q *request) {
	m, seg := q.r.Method, q.seg
	n := len(seg)
	if m == http.MethodGet && !requireScope(q, readScopes()...) || m != http.MethodGet && !requireScope(q, "api") {
		return
	}
	p := s.findProjectLocked(q, seg[1])
	if p == nil {
		return
	}
	lvl := q.tok.user.projectLevel(p)
	switch {
	case m == http.MethodGet && n == 2:
		writeJSON(q.w, http.StatusOK, s.projectWithAccessJSON(q.r, p, q.tok.user))
	case m == http.MethodGet && n == 3 && seg[2] == "runners":
		// GitLab: runners available to the project (its own, its groups',
		// and instance runners), for Maintainers.
		if lvl < Maintainer {
			writeMessage(q.w, http.StatusForbidden, "403 Forbidden")
			return
		}
		var rs []*runner
		for _, r := range s.sortedRunnersLocked() {
			if r.kind == InstanceType || r.kind == GroupType && p.group.under(r.group) || r.kind == ProjectType && slices.Contains(r.projects, p) {
				rs = append(rs, r)
			}
		}
		s.writeRunnerListLocked(q, rs)
	case m == http.MethodGet && n == 3 && seg[2] == "jobs":
		if lvl < Reporter {
			writeMessage(q.w, http.StatusForbidden, "403 Forbidden")
			return
		}
		s.listJobsLocked(q, p)
	case m == http.MethodPost && n == 5 && seg[2] == "pipelines" && seg[4] == "cancel":
		// GitLab: cancels every job of the pipeline that has not finished
		// (Developer), answering the pipeline.
		id, _ := strconv.ParseInt(seg[3], 10, 64)
		pl := s.pipes[id]
		if pl == nil || pl.project != p {
			writeMessage(q.w, http.StatusNotFound, "404 Not found")
			return
		}
		if lvl < Developer {
			writeMessage(q.w, http.StatusForbidden, "403 Forbidden")
			return
		}
		// Later stages first, so that none is skipped (rather than
		// canceled) by an earlier stage's cancellation.
		for i := len(pl.jobs) - 1; i >= 0; i-- {
			s.cancelJobLocked(pl.jobs[i])
		}
		writeJSON(q.w, http.StatusCreated, s.pipelineJSON(q.r, pl))
	case n >= 4 && seg[2] == "jobs":
		id, _ := strconv.ParseInt(seg[3], 10, 64)
		j := s.jobs[id]
		if j == nil || j.pipeline.project != p {
			writeMessage(q.w, http.StatusNotFound, "404 Not found")
			return
		}
		switch {
		case m == http.MethodGet && n == 4:
			if lvl < Reporter {
				writeMessage(q.w, http.StatusForbidden, "403 Forbidden")
				return
			}
			writeJSON(q.w, http.StatusOK, s.jobJSON(q.r, j))
		case m == http.MethodPost && n == 5 && seg[4] == "cancel":
			if lvl < Developer {
				writeMessage(q.w, http.StatusForbidden, "403 Forbidden")
				return
			}
			s.cancelJobLocked(j)
			writeJSON(q.w, http.StatusCreated, s.jobJSON(q.r, j))
		default:
			writeMessage(q.w, http.StatusNotFound, "404 Not Found")
		}
	default:
		writeMessage(q.w, http.StatusNotFound, "404 Not Found")
	}
}

func (s *Simulator) groupRoutesLocked(q *request) {
	m, seg := q.r.Method, q.seg
	n := len(seg)
	if m != http.MethodGet {
		writeMessage(q.w, http.StatusNotFound, "404 Not Found")
		return
	}
	if !requireScope(q, readScopes()...) {
		return
	}
	g := s.findGroupLocked(q, seg[1])
	if g == nil {
		return
	}
	switch {
	case n == 2:
		writeJSON(q.w, http.StatusOK, s.groupDetailJSON(q.r, g, q.tok.user))
	case n == 3 && seg[2] == "runners":
		// GitLab: the group's and its ancestors' runners and instance
		// runners, for Maintainers of the group.
		if q.tok.user.groupLevel(g) < Maintainer {
			writeMessage(q.w, http.StatusForbidden, "403 Forbidden")
			return
		}
		var rs []*runner
		for _, r := range s.sortedRunnersLocked() {
			if r.kind == InstanceType || r.kind == GroupType && g.under(r.group) {
				rs = append(rs, r)
			}
		}
		s.writeRunnerListLocked(q, rs)
	case n == 3 && seg[2] == "projects":
		sub := q.r.URL.Query().Get("include_subgroups") == "true"
		var ps []*project
		for _, p := range s.projects {
			if (p.group == g || sub && p.group.under(g)) && q.tok.user.projectLevel(p) >= Guest {
				ps = append(ps, p)
			}
		}
		// GitLab orders by created_at descending by default.
		sort.Slice(ps, func(i, k int) bool { return ps[i].id > ps[k].id })
		a, b := s.paginate(q, len(ps))
		out := make([]any, 0, b-a)
		for _, p := range ps[a:b] {
			out = append(out, s.projectJSON(q.r, p, q.tok.user, false))
		}
		writeJSON(q.w, http.StatusOK, out)
	default:
		writeMessage(q.w, http.StatusNotFound, "404 Not Found")
	}
}

// createRunnerLocked is POST /user/runners: a runner of the given type,
// owned by the caller, answered with its authentication token (glrt-).
// GitLab requires the create_runner scope (api covers it), and an
// administrator for instance runners, a group Owner for group runners and a
// project Maintainer for project runners.
func (s *Simulator) createRunnerLocked(q *request) {
	if !requireScope(q, "create_runner", "api") {
		return
	}
	u := q.tok.user
	r := &runner{kind: q.param("runner_type"), description: q.param("description"), maintenanceNote: q.param("maintenance_note"), accessLevel: accessNotProtected, managers: map[string]time.Time{}}
	if !runnerLimits(q, r) {
		return
	}
	r.runUntagged = q.param("run_untagged") != "false"
	r.locked = q.param("locked") == "true"
	r.paused = q.param("paused") == "true"
	if r.maximumTimeout > 0 && r.maximumTimeout < minMaximumTimeout {
		writeMessage(q.w, http.StatusBadRequest, `400 Bad request - {"maximum_timeout"=>["needs to be at least 10 minutes"]}`)
		return
	}
	switch v := q.body["tag_list"].(type) {
	case []any:
		for _, t := range v {
			if ts, ok := t.(string); ok && strings.TrimSpace(ts) != "" {
				r.tags = append(r.tags, strings.TrimSpace(ts))
			}
		}
	case string:
		for _, t := range strings.Split(v, ",") {
			if t = strings.TrimSpace(t); t != "" {
				r.tags = append(r.tags, t)
			}
		}
	}
	switch r.kind {
	case InstanceType:
		if !u.admin {
			writeMessage(q.w, http.StatusForbidden, "403 Forbidden")
			return
		}
	case GroupType:
		id, _ := strconv.ParseInt(q.param("group_id"), 10, 64)
		if id == 0 {
			writeError(q.w, http.StatusBadRequest, "group_id is missing")
			return
		}
		g := s.groups[id]
		if g == nil || u.groupLevel(g) < Owner {
			writeMessage(q.w, http.StatusForbidden, "403 Forbidden")
			return
		}
		r.group = g
	case ProjectType:
		id, _ := strconv.ParseInt(q.param("project_id"), 10, 64)
		if id == 0 {
			writeError(q.w, http.StatusBadRequest, "project_id is missing")
			return
		}
		p := s.projects[id]
		if p == nil || u.projectLevel(p) < Maintainer {
			writeMessage(q.w, http.StatusForbidden, "403 Forbidden")
			return
		}
		r.projects = []*project{p}
	case "":
		writeError(q.w, http.StatusBadRequest, "runner_type is missing")
		return
	default:
		writeError(q.w, http.StatusBadRequest, "runner_type does not have a valid value")
		return
	}
	if len(r.tags) == 0 && !r.runUntagged {
		// GitLab's validation: a runner must take some jobs.
		writeMessage(q.w, http.StatusBadRequest, `400 Bad request - {"tags_list"=>["can not be empty when runner is not allowed to pick untagged jobs"]}`)
		return
	}
	r.id = s.id("runner")
	r.token = "glrt-" + randomHex(12)
	r.creator = u
	r.created = s.clock.Now()
	s.runners[r.id] = r
	s.issued = append(s.issued, IssuedRunner{ID: r.id, Description: r.description, Token: r.token})
	s.queueTick++
	writeJSON(q.w, http.StatusCreated, map[string]any{"id": r.id, "token": r.token, "token_expires_at": timeJSON(r.tokenExpiresAt)})
}

// canManageRunnerLocked: admins any runner; group Owners their group's;
// project Maintainers a project runner whose owner project (the first) they
// maintain. Others get 403 (GitLab: "No access granted").
func canManageRunner(u *user, r *runner) bool {
	switch {
	case u.admin:
		return true
	case r.kind == GroupType:
		return u.groupLevel(r.group) >= Owner
	case r.kind == ProjectType:
		return len(r.projects) > 0 && u.projectLevel(r.projects[0]) >= Maintainer
	}
	return false
}

func (s *Simulator) runnerByIDLocked(q *request) {
	if q.r.Method == http.MethodGet && !requireScope(q, readScopes("manage_runner")...) || q.r.Method != http.MethodGet && !requireScope(q, "api", "manage_runner") {
		return
	}
	id, err := strconv.ParseInt(q.seg[1], 10, 64)
	r := s.runners[id]
	if err != nil || r == nil {
		writeMessage(q.w, http.StatusNotFound, "404 Runner Not Found")
		return
	}
	if !canManageRunner(q.tok.user, r) {
		writeMessage(q.w, http.StatusForbidden, "403 Forbidden - No access granted")
		return
	}
	switch q.r.Method {
	case http.MethodDelete:
		s.deleteRunnerLocked(r)
		q.w.WriteHeader(http.StatusNoContent)
		return
	case http.MethodPut:
		// GitLab's PUT /runners/:id updates the given attributes; the
		// simulator models paused (a paused runner gets no job: POST
		// /jobs/request answers 204, while a job it runs goes on),
		// access_level, maximum_timeout (for the jobs it takes from now
		// on; a running job keeps its timeout) and description.
		upd := *r
		if !runnerLimits(q, &upd) {
			return
		}
		if upd.maximumTimeout > 0 && upd.maximumTimeout < minMaximumTimeout {
			writeJSON(q.w, http.StatusBadRequest, map[string]any{"message": map[string][]string{"maximum_timeout": {"needs to be at least 10 minutes"}}})
			return
		}
		r.accessLevel, r.maximumTimeout = upd.accessLevel, upd.maximumTimeout
		if v := q.param("paused"); v != "" {
			r.paused = v == "true"
			s.queueTick++
		}
		if v := q.param("description"); v != "" {
			r.description = v
		}
	}
	writeJSON(q.w, http.StatusOK, s.runnerDetailsJSON(q.r, r))
}

// runnerLimits reads the access_level and maximum_timeout parameters of a
// runner's creation or update into r (leaving what is not given), and
// answers Grape's 400 for a value that is not one (false).
func runnerLimits(q *request, r *runner) bool {
	switch v := q.param("access_level"); v {
	case "":
	case accessNotProtected, accessRefProtected:
		r.accessLevel = v
	default:
		writeError(q.w, http.StatusBadRequest, "access_level does not have a valid value")
		return false
	}
	if v := q.param("maximum_timeout"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			writeError(q.w, http.StatusBadRequest, "maximum_timeout is invalid")
			return false
		}
		r.maximumTimeout = n
	}
	return true
}

// deleteRunnerLocked removes a runner; its token stops working at once. A
// job it was running fails (GitLab drops such jobs with
// runner_system_failure when their runner is gone).
func (s *Simulator) deleteRunnerLocked(r *runner) {
	delete(s.runners, r.id)
	for _, j := range s.jobs {
		if j.runner == r && j.status == StatusRunning {
			s.finishJobLocked(j, StatusFailed, "runner_system_failure", nil)
		}
	}
}

func (s *Simulator) listAllRunnersLocked(q *request) {
	if !requireScope(q, readScopes("manage_runner")...) {
		return
	}
	if !q.tok.user.admin {
		writeMessage(q.w, http.StatusForbidden, "403 Forbidden")
		return
	}
	s.writeRunnerListLocked(q, s.sortedRunnersLocked())
}

func (s *Simulator) sortedRunnersLocked() []*runner {
	rs := make([]*runner, 0, len(s.runners))
	for _, r := range s.runners {
		rs = append(rs, r)
	}
	sort.Slice(rs, func(i, k int) bool { return rs[i].id < rs[k].id })
	return rs
}

// writeRunnerListLocked filters by type, status, paused and tag_list and
// paginates, as GitLab's runner lists do.
func (s *Simulator) writeRunnerListLocked(q *request, rs []*runner) {
	qv := q.r.URL.Query()
	now := s.clock.Now()
	var out []*runner
	for _, r := range rs {
		if t := qv.Get("type"); t != "" && t != r.kind {
			continue
		}
		if st := qv.Get("status"); st != "" {
			if got, _ := r.status(now); got != st {
				continue
			}
		}
		if p := qv.Get("paused"); p != "" && p != strconv.FormatBool(r.paused) {
			continue
		}
		if tl := qv.Get("tag_list"); tl != "" {
			ok := true
			for _, t := range strings.Split(tl, ",") {
				ok = ok && slices.Contains(r.tags, strings.TrimSpace(t))
			}
			if !ok {
				continue
			}
		}
		out = append(out, r)
	}
	a, b := s.paginate(q, len(out))
	list := make([]any, 0, b-a)
	for _, r := range out[a:b] {
		list = append(list, s.runnerJSON(q.r, r))
	}
	writeJSON(q.w, http.StatusOK, list)
}

// listJobsLocked is GET /projects/:id/jobs, newest first, filtered by
// scope[] (or scope) statuses.
func (s *Simulator) listJobsLocked(q *request, p *project) {
	qv := q.r.URL.Query()
	scopes := append(qv["scope[]"], qv["scope"]...)
	valid := []string{StatusCreated, StatusPending, StatusRunning, StatusFailed, StatusSuccess, StatusCanceled, StatusSkipped, "waiting_for_resource", "manual", "canceling", "preparing", "scheduled"}
	for _, sc := range scopes {
		if !slices.Contains(valid, sc) {
			writeError(q.w, http.StatusBadRequest, "scope does not have a valid value")
			return
		}
	}
	var js []*job
	for i := len(s.jobOrder) - 1; i >= 0; i-- {
		j := s.jobs[s.jobOrder[i]]
		if j.pipeline.project == p && (len(scopes) == 0 || slices.Contains(scopes, j.status)) {
			js = append(js, j)
		}
	}
	a, b := s.paginate(q, len(js))
	out := make([]any, 0, b-a)
	for _, j := range js[a:b] {
		out = append(out, s.jobJSON(q.r, j))
	}
	writeJSON(q.w, http.StatusOK, out)
}
