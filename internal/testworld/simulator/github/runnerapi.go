package githubsim

import (
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// runnerAPIPrefix is the simulator's own runner protocol. The real
// runner's protocol with GitHub (the Actions broker) is proprietary, so
// the runner package's scripts speak this small, plain-text API instead:
// every response body is "key=value" lines, easy to read with sed.
//
//	POST   /_runner/register                    registration token -> runner config
//	POST   /_runner/runners/{id}/session        connect (runner secret)
//	DELETE /_runner/runners/{id}/session        disconnect
//	GET    /_runner/runners/{id}/message        long poll for a job (?session=&wait=s)
//	GET    /_runner/runners/{id}/jobs/{job_id}  job status (heartbeat; long poll with ?wait=s)
//	POST   /_runner/runners/{id}/jobs/{job_id}/result  the job's steps ran (conclusion, log)
const runnerAPIPrefix = "/_runner/"

// maxPollWait caps a long poll (wall clock).
const maxPollWait = 50 * time.Second

// runnerText writes a plain-text runner API answer.
func runnerText(w http.ResponseWriter, code int, kv ...string) {
	var b strings.Builder
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(&b, "%s=%s\n", kv[i], kv[i+1])
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, b.String())
}

// runnerFail writes an error message line for the scripts to print.
func runnerFail(w http.ResponseWriter, code int, format string, args ...any) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	_, _ = fmt.Fprintf(w, format+"\n", args...)
}

// credential is the secret of an Authorization header with any of the
// schemes the runner uses (RemoteAuth for registration tokens, Bearer).
func credential(r *http.Request) string {
	h := strings.TrimSpace(r.Header.Get("Authorization"))
	scheme, cred, ok := strings.Cut(h, " ")
	if !ok {
		return ""
	}
	switch strings.ToLower(scheme) {
	case "remoteauth", "bearer", "token":
		return strings.TrimSpace(cred)
	}
	return ""
}

func (s *Simulator) serveRunnerAPI(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.Trim(strings.TrimPrefix(r.URL.Path, runnerAPIPrefix), "/"), "/")
	switch {
	case r.Method == http.MethodPost && len(parts) == 1 && parts[0] == "register":
		s.runnerRegister(w, r)
	case len(parts) >= 3 && parts[0] == "runners":
		id, err := strconv.ParseInt(parts[1], 10, 64)
		if err != nil {
			runnerFail(w, http.StatusNotFound, "no runner %q", parts[1])
			return
		}
		switch {
		case len(parts) == 3 && parts[2] == "session" && r.Method == http.MethodPost:
			s.runnerConnect(w, r, id)
		case len(parts) == 3 && parts[2] == "session" && r.Method == http.MethodDelete:
			s.runnerDisconnect(w, r, id)
		case len(parts) == 3 && parts[2] == "message" && r.Method == http.MethodGet:
			s.runnerPoll(w, r, id)
		case len(parts) == 4 && parts[2] == "jobs" && r.Method == http.MethodGet:
			s.runnerJobStatus(w, r, id, parts[3])
		case len(parts) == 5 && parts[2] == "jobs" && parts[4] == "result" && r.Method == http.MethodPost:
			s.runnerJobResult(w, r, id, parts[3])
		default:
			runnerFail(w, http.StatusNotFound, "unknown runner API call %s %s", r.Method, r.URL.Path)
		}
	default:
		runnerFail(w, http.StatusNotFound, "unknown runner API call %s %s", r.Method, r.URL.Path)
	}
}

// registration is a parsed config.sh registration.
type registration struct {
	owner, repo     string
	name            string
	labels          []string
	group           string
	work            string
	ephemeral       bool
	replace         bool
	noDefaultLabels bool
	os, arch        string
	// enterprise: owner is an enterprise's slug.
	enterprise bool
}

// parseRegistration reads config.sh's form: url (https://host/owner[/repo]
// or https://host/enterprises/slug),
// name, labels (comma-separated), runnergroup, work, ephemeral, replace,
// no_default_labels, os, arch.
func parseRegistration(form url.Values) (registration, error) {
	var reg registration
	u, err := url.Parse(form.Get("url"))
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return reg, fmt.Errorf("--url %q must be https://<host>/<owner> or https://<host>/<owner>/<repo>", form.Get("url"))
	}
	segs := strings.Split(strings.Trim(u.Path, "/"), "/")
	switch {
	case len(segs) == 1 && segs[0] != "":
		reg.owner = segs[0]
	case len(segs) == 2 && segs[0] == "enterprises" && segs[1] != "":
		// GitHub reserves the name: https://<host>/enterprises/<slug> is
		// an enterprise's runners.
		reg.owner, reg.enterprise = segs[1], true
	case len(segs) == 2 && segs[0] != "" && segs[1] != "":
		reg.owner, reg.repo = segs[0], segs[1]
	default:
		return reg, fmt.Errorf("--url %q must be https://<host>/<owner> or https://<host>/<owner>/<repo>", form.Get("url"))
	}
	reg.name = form.Get("name")
	if err := validateRunnerName(reg.name); err != nil {
		return reg, fmt.Errorf("invalid runner name %q", reg.name)
	}
	for _, l := range strings.Split(form.Get("labels"), ",") {
		if l = strings.TrimSpace(l); l != "" {
			if len(l) > 256 {
				return reg, fmt.Errorf("label %q is longer than 256 characters", l[:20]+"...")
			}
			reg.labels = append(reg.labels, l)
		}
	}
	reg.group = strings.TrimSpace(form.Get("runnergroup"))
	reg.work = form.Get("work")
	if reg.work == "" {
		reg.work = "_work"
	}
	boolean := func(k string) bool { v := strings.ToLower(form.Get(k)); return v == "true" || v == "1" }
	reg.ephemeral, reg.replace, reg.noDefaultLabels = boolean("ephemeral"), boolean("replace"), boolean("no_default_labels")
	reg.os, reg.arch = form.Get("os"), form.Get("arch")
	if len(reg.labels) > 100 {
		return reg, fmt.Errorf("a runner has at most 100 labels")
	}
	return reg, nil
}

// runnerDefaultLabels are what config.sh adds unless --no-default-labels:
// self-hosted, the OS and the architecture, in GitHub's spelling.
func runnerDefaultLabels(osName, arch string) []string {
	labels := []string{"self-hosted"}
	switch strings.ToLower(osName) {
	case "darwin", "macos", "osx":
		labels = append(labels, "macOS")
	case "windows", "win":
		labels = append(labels, "Windows")
	default:
		labels = append(labels, "Linux")
	}
	switch strings.ToLower(arch) {
	case "aarch64", "arm64":
		labels = append(labels, "ARM64")
	case "armv7l", "armv6l", "arm":
		labels = append(labels, "ARM")
	default:
		labels = append(labels, "X64")
	}
	return labels
}

// runnerRegister is config.sh's registration with a registration token.
func (s *Simulator) runnerRegister(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		runnerFail(w, http.StatusBadRequest, "malformed registration request: %v", err)
		return
	}
	reg, err := parseRegistration(r.PostForm)
	if err != nil {
		runnerFail(w, http.StatusBadRequest, "%v", err)
		return
	}
	tok := credential(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		runnerFail(w, http.StatusServiceUnavailable, "simulator closed")
		return
	}
	s.lastServer = requestBase(r)
	now := s.clock.Now()
	rt := s.regTokens[tok]
	if tok == "" || rt == nil {
		runnerFail(w, http.StatusUnauthorized, "the registration token is not valid")
		return
	}
	if !now.Before(rt.expires) {
		runnerFail(w, http.StatusUnauthorized, "the registration token expired at %s", ghTime(rt.expires))
		return
	}
	o := s.owners[strings.ToLower(reg.owner)]
	var rp *repo
	if reg.enterprise {
		if o = s.enterprises[strings.ToLower(reg.owner)]; o == nil {
			runnerFail(w, http.StatusNotFound, "enterprise %s does not exist", reg.owner)
			return
		}
	} else if reg.repo != "" {
		rp = s.repos[strings.ToLower(reg.owner+"/"+reg.repo)]
		if rp == nil {
			runnerFail(w, http.StatusNotFound, "repository %s/%s does not exist", reg.owner, reg.repo)
			return
		}
	} else if o == nil || !o.org {
		runnerFail(w, http.StatusNotFound, "organization %s does not exist", reg.owner)
		return
	}
	if rt.owner != o || rt.repo != rp {
		scope := rt.owner.login
		if rt.owner.enterprise {
			scope = "enterprises/" + scope
		}
		if rt.repo != nil {
			scope = rt.repo.fullName()
		}
		runnerFail(w, http.StatusForbidden, "the registration token was issued for %s, not for %s", scope, strings.Trim(reg.owner+"/"+reg.repo, "/"))
		return
	}
	group := defaultGroup
	if rp == nil && reg.group != "" {
		if group = o.groupByName(reg.group); group == nil {
			runnerFail(w, http.StatusBadRequest, "Could not find any self-hosted runner group named %q.", reg.group)
			return
		}
	} else if rp == nil {
		group = o.group(1)
	}
	if old := s.runnerByNameLocked(o, rp, reg.name); old != nil {
		if !reg.replace {
			runnerFail(w, http.StatusConflict, "A runner exists with the same name %q (use --replace to replace it).", reg.name)
			return
		}
		if old.busy {
			runnerFail(w, http.StatusConflict, "Runner %q is still running a job and cannot be replaced.", reg.name)
			return
		}
		s.removeRunnerLocked(old)
	}
	labels := reg.labels
	if !reg.noDefaultLabels {
		labels = append(runnerDefaultLabels(reg.os, reg.arch), labels...)
	}
	if len(labels) == 0 {
		runnerFail(w, http.StatusBadRequest, "a runner needs at least one label")
		return
	}
	rn := s.newRunnerLocked(o, rp, group, reg.name, labels, reg.work, reg.ephemeral, false)
	s.log.Info("runner registered", "runner", rn.name, "id", rn.id, "scope", rn.scope())
	runnerText(w, http.StatusCreated, "runner_id", strconv.FormatInt(rn.id, 10), "runner_name", rn.name, "encoded_config", s.encodedConfigLocked(rn))
}

// authRunnerLocked finds runner id and checks the request's secret.
func (s *Simulator) authRunnerLocked(w http.ResponseWriter, r *http.Request, id int64) *runner {
	if s.closed {
		runnerFail(w, http.StatusServiceUnavailable, "simulator closed")
		return nil
	}
	rn := s.runners[id]
	if rn == nil || !secretEqual(credential(r), rn.secret) {
		runnerFail(w, http.StatusUnauthorized, "bad runner credentials")
		return nil
	}
	return rn
}

// runnerConnect starts a session: the runner becomes online (and idle).
func (s *Simulator) runnerConnect(w http.ResponseWriter, r *http.Request, id int64) {
	_ = r.ParseForm()
	s.mu.Lock()
	defer s.mu.Unlock()
	rn := s.authRunnerLocked(w, r, id)
	if rn == nil {
		return
	}
	if rn.removed {
		runnerFail(w, http.StatusNotFound, "runner %s (id %d) has been removed", rn.name, rn.id)
		return
	}
	if rn.session != "" && s.onlineLocked(rn) {
		runnerFail(w, http.StatusConflict, "A session for this runner already exists.")
		return
	}
	if rn.session != "" {
		// A stale session (heartbeat lapsed, not yet noticed by a timer).
		s.endSessionLocked(rn, "failure")
	}
	rn.session = s.newGUID()
	if !rn.busy {
		rn.idleSince = s.clock.Now()
	}
	s.stopTimer(rn.rmTimer)
	rn.rmTimer = nil
	s.touchLocked(rn)
	s.log.Info("runner connected", "runner", rn.name, "id", rn.id)
	s.scheduleLocked()
	runnerText(w, http.StatusOK, "session_id", rn.session, "runner_name", rn.name)
}

// runnerDisconnect ends the session (the runner process exits).
func (s *Simulator) runnerDisconnect(w http.ResponseWriter, r *http.Request, id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rn := s.authRunnerLocked(w, r, id)
	if rn == nil {
		return
	}
	if !rn.removed && rn.session != "" && rn.session == r.URL.Query().Get("session") {
		s.endSessionLocked(rn, "failure")
	}
	w.WriteHeader(http.StatusNoContent)
}

// runnerPoll is the long poll for a job. It answers 200 with the job, 204
// when wait elapses without one, 404 once the runner is removed and 409
// when the session is no longer valid (the runner must reconnect).
func (s *Simulator) runnerPoll(w http.ResponseWriter, r *http.Request, id int64) {
	deadline := time.NewTimer(longPollWait(r, maxPollWait))
	defer deadline.Stop()
	session := r.URL.Query().Get("session")
	s.mu.Lock()
	rn := s.authRunnerLocked(w, r, id)
	if rn == nil {
		s.mu.Unlock()
		return
	}
	defer s.holdLocked(rn)()
	for {
		switch {
		case s.closed:
			s.mu.Unlock()
			runnerFail(w, http.StatusServiceUnavailable, "simulator closed")
			return
		case rn.removed:
			s.mu.Unlock()
			runnerFail(w, http.StatusNotFound, "runner %s (id %d) has been removed", rn.name, rn.id)
			return
		case rn.session == "" || rn.session != session:
			s.mu.Unlock()
			runnerFail(w, http.StatusConflict, "the session is not valid (expired or replaced); reconnect")
			return
		}
		if j := rn.job; rn.busy && j != nil && j.status != "completed" {
			s.acquireJobLocked(j)
			s.mu.Unlock()
			kv := []string{"job_id", strconv.FormatInt(j.id, 10), "run_id", strconv.FormatInt(j.run.id, 10),
				"job_name", oneLine(j.name), "repository", j.run.repo.fullName()}
			for _, step := range j.steps {
				// One line each, whatever the step holds.
				kv = append(kv, "step", base64.StdEncoding.EncodeToString([]byte(step)))
			}
			runnerText(w, http.StatusOK, kv...)
			return
		}
		s.scheduleLocked()
		if j := rn.job; rn.busy && j != nil && j.status != "completed" {
			// Just assigned: hand it out.
			continue
		}
		// Idle, or still marked busy with a job that already ended (its
		// end is being reported): wait rather than spin with the lock.
		wake := rn.wake
		s.mu.Unlock()
		select {
		case <-wake:
		case <-deadline.C:
			w.WriteHeader(http.StatusNoContent)
			return
		case <-r.Context().Done():
			return
		}
		s.mu.Lock()
	}
}

// longPollWait is a long poll's ?wait= (seconds, at most maxPollWait), or
// def when the request has none.
func longPollWait(r *http.Request, def time.Duration) time.Duration {
	v, err := strconv.ParseFloat(r.URL.Query().Get("wait"), 64)
	if err != nil || !(v >= 0) { // NaN too
		return def
	}
	// Capped before the conversion: a huge value (or +Inf) overflows a
	// Duration into a negative one, an immediate answer.
	return time.Duration(min(v, maxPollWait.Seconds()) * float64(time.Second))
}

// holdLocked counts a long poll of the runner as open (the runner is
// online while one is) and touches it; the function it returns, called
// without the lock when the poll ends, counts it closed and touches the
// runner again.
func (s *Simulator) holdLocked(rn *runner) (release func()) {
	rn.polls++
	s.touchLocked(rn)
	return func() {
		s.mu.Lock()
		rn.polls--
		s.touchLocked(rn)
		s.mu.Unlock()
	}
}

func oneLine(v string) string { return strings.NewReplacer("\n", " ", "\r", " ").Replace(v) }

// runnerJobStatus reports a job's status to the runner running it; each
// call is a heartbeat. With ?wait=s it is a long poll: it answers as soon
// as the job has completed, else when wait elapses (at most maxPollWait),
// with the status then, and the runner counts as online while it waits.
// run.sh and JITRunner long-poll it, so a job's run costs its runner one
// request and one process, not one every 200 ms: in the reduced chaos
// run those reads were about a third of the CPU (docs/testing.md).
func (s *Simulator) runnerJobStatus(w http.ResponseWriter, r *http.Request, id int64, jobID string) {
	wait := longPollWait(r, 0)
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	s.mu.Lock()
	rn := s.authRunnerLocked(w, r, id)
	if rn == nil {
		s.mu.Unlock()
		return
	}
	jid, _ := strconv.ParseInt(jobID, 10, 64)
	j := s.jobs[jid]
	if j == nil || j.runner != rn {
		s.mu.Unlock()
		runnerFail(w, http.StatusNotFound, "job %s is not assigned to this runner", jobID)
		return
	}
	if wait > 0 {
		defer s.holdLocked(rn)()
	} else {
		s.touchLocked(rn)
	}
	// completeJobLocked and the runner's removal wake its long polls; a
	// wake for anything else re-checks and waits on.
	for wait > 0 && j.status != "completed" && !s.closed && !rn.removed {
		wake := rn.wake
		s.mu.Unlock()
		select {
		case <-wake:
		case <-deadline.C:
			wait = 0
		case <-r.Context().Done():
			return
		}
		s.mu.Lock()
	}
	status, conclusion := j.status, j.conclusion
	s.mu.Unlock()
	runnerText(w, http.StatusOK, "status", status, "conclusion", conclusion)
}

// maxJobLog bounds the steps' output a runner reports.
const maxJobLog = 64 << 10

// runnerJobResult takes the outcome of a job's steps from the runner
// running it (form: conclusion success or failure, log): the job
// completes with it. A job without steps, or not in progress on this
// runner, is refused.
func (s *Simulator) runnerJobResult(w http.ResponseWriter, r *http.Request, id int64, jobID string) {
	r.Body = http.MaxBytesReader(w, r.Body, 2*maxJobLog)
	if err := r.ParseForm(); err != nil {
		runnerFail(w, http.StatusBadRequest, "the job result is not a form: %v", err)
		return
	}
	conclusion := r.PostForm.Get("conclusion")
	if conclusion != "success" && conclusion != "failure" {
		runnerFail(w, http.StatusBadRequest, "conclusion %q: success or failure", conclusion)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rn := s.authRunnerLocked(w, r, id)
	if rn == nil {
		return
	}
	jid, _ := strconv.ParseInt(jobID, 10, 64)
	j := s.jobs[jid]
	switch {
	case j == nil || j.runner != rn:
		runnerFail(w, http.StatusNotFound, "job %s is not assigned to this runner", jobID)
		return
	case len(j.steps) == 0:
		runnerFail(w, http.StatusConflict, "job %s has no steps to report", jobID)
		return
	case j.status != "in_progress":
		runnerFail(w, http.StatusConflict, "job %s is %s", jobID, j.status)
		return
	}
	j.log = r.PostForm.Get("log")
	if len(j.log) > maxJobLog {
		j.log = j.log[len(j.log)-maxJobLog:]
	}
	s.completeJobLocked(j, conclusion)
	runnerText(w, http.StatusOK, "status", j.status, "conclusion", j.conclusion)
}
