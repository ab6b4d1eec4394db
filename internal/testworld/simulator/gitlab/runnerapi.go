package gitlabsim

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// maxTraceChunk bounds one PATCH /jobs/:id/trace body, and maxTrace a
// job's whole log (GitLab's own limit, ci_jobs_trace_size_limit, is 100 MB
// by default; the simulator keeps traces in memory).
const (
	maxTraceChunk = 1 << 20
	maxTrace      = 8 << 20
)

// runnerRequest is the JSON body the runner API reads: the union of the
// fields of gitlab-runner's VerifyRunnerRequest, JobRequest,
// UpdateJobRequest and UnregisterRunnerManagerRequest that the simulator
// acts on (runner_api_test.go checks these names against structs that
// mirror gitlab-runner's own).
type runnerRequest struct {
	Token         string `json:"token"`
	SystemID      string `json:"system_id"`
	LastUpdate    string `json:"last_update"`
	State         string `json:"state"`
	FailureReason string `json:"failure_reason"`
	ExitCode      *int   `json:"exit_code"`
	Output        struct {
		Bytesize *int `json:"bytesize"`
	} `json:"output"`
	Info struct {
		Name         string `json:"name"`
		Version      string `json:"version"`
		Platform     string `json:"platform"`
		Architecture string `json:"architecture"`
		Executor     string `json:"executor"`
	} `json:"info"`
}

// serveRunnerAPI answers the calls gitlab-runner makes (lib/api/ci/runner.rb
// in GitLab); it returns false for any other path.
func (s *Simulator) serveRunnerAPI(q *request) bool {
	m, seg := q.r.Method, q.seg
	n := len(seg)
	switch {
	case m == http.MethodPost && n == 2 && seg[0] == "runners" && seg[1] == "verify",
		m == http.MethodDelete && n == 1 && seg[0] == "runners",
		m == http.MethodDelete && n == 2 && seg[0] == "runners" && seg[1] == "managers",
		m == http.MethodPost && n == 2 && seg[0] == "jobs" && seg[1] == "request",
		m == http.MethodPut && n == 2 && seg[0] == "jobs",
		m == http.MethodPatch && n == 3 && seg[0] == "jobs" && seg[2] == "trace":
	default:
		return false
	}
	if m == http.MethodPatch {
		s.patchTrace(q)
		return true
	}
	var body runnerRequest
	raw, err := io.ReadAll(io.LimitReader(q.r.Body, maxBody+1))
	if err != nil || len(raw) > maxBody {
		writeMessage(q.w, http.StatusBadRequest, "400 Bad request - body unreadable or too large")
		return true
	}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &body); err != nil {
			writeMessage(q.w, http.StatusBadRequest, "400 Bad request - "+err.Error())
			return true
		}
	}
	// Grape takes parameters from the query string as well as the body, and
	// GitLab's OpenAPI description gives DELETE /runners and DELETE
	// /runners/managers their token and system_id there.
	qv := q.r.URL.Query()
	if body.Token == "" {
		body.Token = qv.Get("token")
	}
	if body.SystemID == "" {
		body.SystemID = qv.Get("system_id")
	}
	// gitlab-runner 18 sends the token in a header as well as in the body
	// (RUNNER-TOKEN, JOB-TOKEN: common/consts.go); either is accepted.
	if body.Token == "" {
		if seg[0] == "jobs" && seg[1] != "request" {
			body.Token = q.r.Header.Get("Job-Token")
		} else {
			body.Token = q.r.Header.Get("Runner-Token")
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case seg[0] == "jobs" && seg[1] == "request":
		s.requestJobLocked(q, body)
	case seg[0] == "jobs":
		s.updateJobLocked(q, body)
	default:
		if body.Token == "" {
			writeError(q.w, http.StatusBadRequest, "token is missing")
			return true
		}
		r := s.runnerByTokenLocked(body.Token)
		if r == nil {
			writeMessage(q.w, http.StatusForbidden, "403 Forbidden")
			return true
		}
		switch {
		case m == http.MethodPost: // verify
			if body.SystemID != "" {
				r.managers[body.SystemID] = s.clock.Now()
			}
			r.contacted = s.clock.Now()
			writeJSON(q.w, http.StatusOK, map[string]any{"id": r.id, "token": r.token, "token_expires_at": timeJSON(r.tokenExpiresAt)})
		case n == 1: // unregister: the runner itself
			s.deleteRunnerLocked(r)
			q.w.WriteHeader(http.StatusNoContent)
		default: // unregister one manager (what `gitlab-runner unregister` does with a glrt- token)
			if body.SystemID == "" {
				writeError(q.w, http.StatusBadRequest, "system_id is missing")
				return true
			}
			if _, ok := r.managers[body.SystemID]; !ok {
				writeMessage(q.w, http.StatusNotFound, "404 Not Found")
				return true
			}
			delete(r.managers, body.SystemID)
			q.w.WriteHeader(http.StatusNoContent)
		}
	}
	return true
}

func (s *Simulator) runnerByTokenLocked(tok string) *runner {
	if tok == "" {
		return nil
	}
	for _, r := range s.runners {
		if r.token == tok {
			return r
		}
	}
	return nil
}

// requestJobLocked is POST /jobs/request: 201 with the oldest pending job
// the runner may run, now running on it; 204 with X-GitLab-Last-Update when
// there is none, at once when the runner's last_update is current.
func (s *Simulator) requestJobLocked(q *request, body runnerRequest) {
	r := s.runnerByTokenLocked(body.Token)
	if r == nil {
		writeMessage(q.w, http.StatusForbidden, "403 Forbidden")
		return
	}
	now := s.clock.Now()
	r.contacted = now
	if body.SystemID != "" {
		r.managers[body.SystemID] = now
	}
	tick := strconv.FormatInt(s.queueTick, 16)
	if r.paused || body.LastUpdate == tick {
		q.w.Header().Set("X-GitLab-Last-Update", tick)
		q.w.WriteHeader(http.StatusNoContent)
		return
	}
	var pick *job
	for _, id := range s.jobOrder {
		if j := s.jobs[id]; j.status == StatusPending && r.canRun(j) {
			pick = j
			break
		}
	}
	if pick == nil {
		q.w.Header().Set("X-GitLab-Last-Update", tick)
		q.w.WriteHeader(http.StatusNoContent)
		return
	}
	pick.status = StatusRunning
	pick.runner = r
	pick.started = now
	if r.maximumTimeout > 0 && int64(pick.timeout) > r.maximumTimeout {
		// GitLab fixes a job's timeout when a runner takes it: the job's
		// (or its project's), capped by the runner's maximum_timeout.
		pick.timeout = int(r.maximumTimeout)
	}
	// GitLab's CI job tokens carry the glcbt- prefix.
	pick.token = "glcbt-" + randomHex(16)
	s.jobEventLocked(pick)
	pick.pipeline.status = pipelineStatus(pick.pipeline)
	writeJSON(q.w, http.StatusCreated, s.jobPayloadLocked(q.r, pick))
}

// jobPayloadLocked is the job a runner gets (GitLab's
// Entities::Ci::JobRequest::Response; the fields gitlab-runner's
// common.JobResponse reads).
func (s *Simulator) jobPayloadLocked(r *http.Request, j *job) map[string]any {
	p := j.pipeline.project
	base := s.baseURL(r)
	host := strings.TrimPrefix(strings.TrimPrefix(base, "https://"), "http://")
	repoURL := fmt.Sprintf("%s://gitlab-ci-token:%s@%s/%s.git", strings.SplitN(base, ":", 2)[0], j.token, host, p.fullPath())
	type v = map[string]any
	root := p.group
	for root.parent != nil {
		root = root.parent
	}
	queued := 0
	for _, o := range s.jobs {
		if o.status == StatusPending {
			queued++
		}
	}
	vars := []any{
		v{"key": "CI", "value": "true", "public": true, "masked": false},
		v{"key": "GITLAB_CI", "value": "true", "public": true, "masked": false},
		v{"key": "CI_SERVER_URL", "value": base, "public": true, "masked": false},
		v{"key": "CI_SERVER_HOST", "value": host, "public": true, "masked": false},
		v{"key": "CI_JOB_ID", "value": strconv.FormatInt(j.id, 10), "public": true, "masked": false},
		v{"key": "CI_JOB_NAME", "value": j.name, "public": true, "masked": false},
		v{"key": "CI_JOB_STAGE", "value": j.stage, "public": true, "masked": false},
		v{"key": "CI_JOB_TOKEN", "value": j.token, "public": false, "masked": true},
		v{"key": "CI_JOB_URL", "value": fmt.Sprintf("%s/%s/-/jobs/%d", base, p.fullPath(), j.id), "public": true, "masked": false},
		v{"key": "CI_PIPELINE_ID", "value": strconv.FormatInt(j.pipeline.id, 10), "public": true, "masked": false},
		v{"key": "CI_PROJECT_ID", "value": strconv.FormatInt(p.id, 10), "public": true, "masked": false},
		v{"key": "CI_PROJECT_PATH", "value": p.fullPath(), "public": true, "masked": false},
		v{"key": "CI_COMMIT_SHA", "value": j.pipeline.sha, "public": true, "masked": false},
		v{"key": "CI_COMMIT_REF_NAME", "value": j.pipeline.ref, "public": true, "masked": false},
		v{"key": "CI_RUNNER_ID", "value": strconv.FormatInt(j.runner.id, 10), "public": true, "masked": false},
		v{"key": "CI_RUNNER_TAGS", "value": mustJSON(j.runner.tags), "public": true, "masked": false},
	}
	keys := make([]string, 0, len(j.variables))
	for k := range j.variables {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		vars = append(vars, v{"key": k, "value": j.variables[k], "public": false, "masked": false})
	}
	return map[string]any{
		"id":              j.id,
		"token":           j.token,
		"allow_git_fetch": true,
		"job_info": v{"id": j.id, "name": j.name, "stage": j.stage, "pipeline_id": j.pipeline.id, "project_id": p.id, "project_name": p.name,
			"project_full_path": p.fullPath(), "namespace_id": p.group.id, "root_namespace_id": root.id, "organization_id": 1,
			"instance_id": "", "instance_uuid": instanceUUID, "user_id": j.pipeline.user.id, "queue_size": queued, "queue_depth": queued,
			"time_in_queue_seconds": j.started.Sub(j.queued).Seconds(), "project_jobs_running_on_instance_runners_count": "0"},
		"git_info": v{"repo_url": repoURL, "repo_object_format": "sha1", "ref": j.pipeline.ref, "sha": j.pipeline.sha,
			"before_sha": strings.Repeat("0", 40), "ref_type": "branch",
			"refspecs": []string{"+refs/pipelines/" + strconv.FormatInt(j.pipeline.id, 10) + ":refs/pipelines/" + strconv.FormatInt(j.pipeline.id, 10), "+refs/heads/" + j.pipeline.ref + ":refs/remotes/origin/" + j.pipeline.ref},
			"depth":    20, "protected": j.pipeline.protected},
		"runner_info":  v{"uuid": runnerUUID(j.runner), "timeout": j.timeout, "runner_session_url": nil},
		"variables":    vars,
		"steps":        []any{v{"name": "script", "script": j.script, "timeout": j.timeout, "when": "on_success", "allow_failure": j.allowFailure}},
		"image":        nil,
		"services":     []any{},
		"artifacts":    nil,
		"cache":        []any{},
		"credentials":  []any{v{"type": "registry", "url": host, "username": "gitlab-ci-token", "password": j.token}},
		"dependencies": []any{},
		"features": v{"trace_sections": true, "token_mask_prefixes": []string{"glpat-", "glrt-", "glcbt-"},
			"failure_reasons": []string{"unknown_failure", "script_failure", "api_failure", "stuck_or_timeout_failure", "runner_system_failure", "job_execution_timeout"}},
	}
}

// runnerUUID is the runner's UUID in job payloads (gitlab-runner prints it
// in the job log, "not supported with this GitLab version" without one):
// stable per runner.
func runnerUUID(r *runner) string {
	return fmt.Sprintf("5b0b7e2c-7d1c-4c8a-9a43-%012x", r.id)
}

// instanceUUID stands for the GitLab instance's UUID in job payloads.
const instanceUUID = "5b0b7e2c-7d1c-4c8a-9a43-6b1e0c0f5e11"

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// jobForTokenLocked authenticates a job call: the job must exist, its token
// match and it must be running; GitLab answers 403 in every other case (not
// 404, so a proxy's 404 is never taken for "job gone") with Job-Status when
// the job exists.
func (s *Simulator) jobForTokenLocked(q *request, token string) *job {
	id, _ := strconv.ParseInt(q.seg[1], 10, 64)
	j := s.jobs[id]
	if j == nil || token == "" || j.token != token {
		writeMessage(q.w, http.StatusForbidden, "403 Forbidden")
		return nil
	}
	if j.status != StatusRunning {
		q.w.Header().Set("Job-Status", j.status)
		writeMessage(q.w, http.StatusForbidden, "403 Forbidden - Job is not processing on runner")
		return nil
	}
	j.runner.contacted = s.clock.Now()
	return j
}

// updateJobLocked is PUT /jobs/:id: state running is a heartbeat; success
// or failed ends the job (failed with failure_reason and exit_code). When
// output.bytesize says the runner sent more log than arrived, the answer is
// 202 and the job stays running, as GitLab asks the runner to retry until
// the log is complete.
func (s *Simulator) updateJobLocked(q *request, body runnerRequest) {
	j := s.jobForTokenLocked(q, body.Token)
	if j == nil {
		return
	}
	h := q.w.Header()
	h.Set("X-GitLab-Trace-Update-Interval", strconv.Itoa(s.cfg.TraceUpdateInterval))
	switch body.State {
	case "", StatusRunning, StatusPending:
	case StatusSuccess, StatusFailed:
		if body.Output.Bytesize != nil && *body.Output.Bytesize != len(j.trace) {
			h.Set("Job-Status", j.status)
			q.w.WriteHeader(http.StatusAccepted)
			_, _ = io.WriteString(q.w, "202")
			return
		}
		reason := ""
		if body.State == StatusFailed {
			reason = body.FailureReason
			if reason == "" {
				reason = "unknown_failure"
			}
		}
		s.finishJobLocked(j, body.State, reason, body.ExitCode)
	default:
		writeError(q.w, http.StatusBadRequest, "state does not have a valid value")
		return
	}
	h.Set("Job-Status", j.status)
	q.w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(q.w, "200")
}

// contentRangeRE is the Content-Range gitlab-runner sends: "start-end",
// both inclusive byte offsets, without a unit.
var contentRangeRE = regexp.MustCompile(`^(\d+)-(\d+)$`)

// patchTrace is PATCH /jobs/:id/trace: the chunk must start where the
// stored log ends (416 with Range otherwise); 202 with Job-Status, Range
// and X-GitLab-Trace-Update-Interval.
func (s *Simulator) patchTrace(q *request) {
	token := q.r.Header.Get("Job-Token")
	if token == "" {
		token = q.r.URL.Query().Get("token")
	}
	chunk, err := io.ReadAll(io.LimitReader(q.r.Body, maxTraceChunk+1))
	if err != nil || len(chunk) > maxTraceChunk {
		writeMessage(q.w, http.StatusRequestEntityTooLarge, "413 Request Entity Too Large")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	j := s.jobForTokenLocked(q, token)
	if j == nil {
		return
	}
	cr := q.r.Header.Get("Content-Range")
	if cr == "" {
		writeMessage(q.w, http.StatusBadRequest, "400 Missing header Content-Range")
		return
	}
	m := contentRangeRE.FindStringSubmatch(cr)
	start, _ := strconv.Atoi(m1(m))
	if m == nil || start != len(j.trace) || len(j.trace)+len(chunk) > maxTrace {
		q.w.Header().Set("Range", fmt.Sprintf("0-%d", len(j.trace)))
		writeMessage(q.w, http.StatusRequestedRangeNotSatisfiable, "416 Range Not Satisfiable")
		return
	}
	j.trace = append(j.trace, chunk...)
	h := q.w.Header()
	h.Set("Job-Status", j.status)
	h.Set("Range", fmt.Sprintf("0-%d", len(j.trace)))
	h.Set("X-GitLab-Trace-Update-Interval", strconv.Itoa(s.cfg.TraceUpdateInterval))
	q.w.WriteHeader(http.StatusAccepted)
}

func m1(m []string) string {
	if len(m) < 2 {
		return ""
	}
	return m[1]
}

// TouchRunner marks a runner as contacted now (tests of status filters).
func (s *Simulator) TouchRunner(id int64, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.runners[id]; r != nil {
		r.contacted = at
	}
}
