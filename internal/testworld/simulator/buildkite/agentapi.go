package buildkitesim

import (
	"compress/gzip"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path"
	"strconv"
	"strings"
)

// The agent API (base https://agent.buildkite.com/v3), as the real agent's
// api package (github.com/buildkite/agent/v3/api, v3.138.1) calls it: every
// request carries "Authorization: Token <token>", the registration token
// for register and the agent's access token for the rest.

func bearerToken(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if t, ok := strings.CutPrefix(h, "Token "); ok {
		return strings.TrimSpace(t)
	}
	if t, ok := strings.CutPrefix(h, "Bearer "); ok {
		return strings.TrimSpace(t)
	}
	return ""
}

func (s *Simulator) serveAgentAPI(w http.ResponseWriter, r *http.Request, p string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.faultLocked("agent", r.Method, "/v3/"+p); err != nil {
		writeErr(w, err)
		return
	}
	if r.Method == http.MethodPost && p == "register" {
		v, err := s.registerLocked(r)
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, v)
		return
	}
	if sp, ok := strings.CutPrefix(p, "stacks/"); ok {
		code, v, err := s.serveStacksLocked(r, sp)
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, code, v)
		return
	}
	a := s.agentByTokenLocked(bearerToken(r))
	if a == nil {
		// A job's own access token acts for the job's agent on that job's
		// endpoints alone.
		if j := s.jobByAccessTokenLocked(bearerToken(r)); j != nil && jobScoped(r.Method, p, j.id) {
			a = j.agent
		}
	}
	if a == nil {
		writeMessage(w, http.StatusUnauthorized, "Invalid access token")
		return
	}
	a.lastSeen = s.clock.Now()
	var (
		code = http.StatusOK
		v    any
		err  error
	)
	switch seg := strings.Split(p, "/"); {
	case r.Method == http.MethodPost && p == "connect":
		a.state = "connected"
		v = s.agentJSONLocked(a)
	case r.Method == http.MethodPost && p == "disconnect":
		a.state = "disconnected"
		v = s.agentJSONLocked(a)
	case r.Method == http.MethodPost && p == "heartbeat":
		var hb struct {
			SentAt string `json:"sent_at"`
		}
		if err = decodeBody(r, &hb); err == nil {
			v = map[string]any{"sent_at": hb.SentAt, "received_at": bkTime(s.clock.Now())}
		}
	case r.Method == http.MethodGet && p == "ping":
		v = s.pingLocked(a)
	case len(seg) == 2 && seg[0] == "jobs" && r.Method == http.MethodGet:
		var j *job
		if j, err = s.agentJobLocked(a, seg[1], false); err == nil {
			v = map[string]string{"state": j.state}
		}
	case len(seg) == 3 && seg[0] == "jobs":
		v, err = s.jobActionLocked(r, a, seg[1], seg[2])
	default:
		err = errf(http.StatusNotFound, "Not Found")
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, code, v)
}

// registerLocked checks the registration (cluster agent) token and creates
// the agent: a token that was deleted, has expired or does not allow the
// caller's address registers nothing (401).
func (s *Simulator) registerLocked(r *http.Request) (any, error) {
	secret := bearerToken(r)
	tok := s.clusterTokenLocked(secret)
	var jat *jobToken
	if strings.HasPrefix(secret, jatPrefix) {
		// A job acquisition token registers an agent for its job only,
		// under the agent token that issued it (whose IP rules apply).
		if jat = s.jobTokenLocked(secret); jat != nil {
			tok = jat.issuer
		}
	}
	if tok == nil {
		return nil, errf(http.StatusUnauthorized, "Invalid token")
	}
	if !ipAllowed(tok.allowedIPs, r.RemoteAddr) {
		return nil, errf(http.StatusUnauthorized, "Invalid token: the agent's IP address is not allowed")
	}
	var req struct {
		Name               string   `json:"name"`
		Hostname           string   `json:"hostname"`
		Version            string   `json:"version"`
		Tags               []string `json:"meta_data"`
		IgnoreInDispatches bool     `json:"ignore_in_dispatches"`
	}
	if err := decodeBody(r, &req); err != nil {
		return nil, err
	}
	c := tok.cluster
	// In a cluster, an agent's queue tag must name one of its queues; an
	// agent without one serves the default queue.
	if q := tagValue(req.Tags, "queue"); q != "" && c.queueByKey(q) == nil {
		return nil, errf(http.StatusUnprocessableEntity, "The queue %q does not exist in cluster %q", q, c.name)
	}
	name := req.Name
	if name == "" {
		name = req.Hostname
	}
	a := &agent{
		id: newUUID(), name: name, accessToken: randomToken(24), token: tok, cluster: c,
		tags: req.Tags, hostname: req.Hostname, version: req.Version,
		ipAddress: remoteIP(r.RemoteAddr), userAgent: r.UserAgent(),
		ignoreInDispatches: req.IgnoreInDispatches, state: "disconnected",
		createdAt: s.clock.Now(), lastSeen: s.clock.Now(), jat: jat,
	}
	if jat != nil {
		jat.used = true
	}
	s.agents[a.id] = a
	return map[string]any{
		"id": a.id, "name": a.name, "access_token": a.accessToken,
		"endpoint":            "", // the agent keeps the endpoint it registered with
		"ping_interval":       s.cfg.PingInterval,
		"job_status_interval": s.cfg.JobStatusInterval,
		"heartbeat_interval":  s.cfg.HeartbeatInterval,
		"meta_data":           a.tags,
	}, nil
}

func (s *Simulator) clusterTokenLocked(secret string) *clusterToken {
	if secret == "" {
		return nil
	}
	now := s.clock.Now()
	for _, c := range s.clusters {
		for _, t := range c.tokens {
			if t.token == secret && !t.deleted && (t.expiresAt.IsZero() || now.Before(t.expiresAt)) {
				return t
			}
		}
	}
	return nil
}

func (s *Simulator) agentByTokenLocked(secret string) *agent {
	if secret == "" {
		return nil
	}
	for _, a := range s.agents {
		if a.accessToken == secret && a.state != "stopped" {
			return a
		}
	}
	return nil
}

// jobByAccessTokenLocked is the unfinished job whose own access token is
// secret, with the agent that holds it.
func (s *Simulator) jobByAccessTokenLocked(secret string) *job {
	if secret == "" {
		return nil
	}
	for _, j := range s.jobs {
		if j.accessToken == secret && j.agent != nil && !j.finished() {
			return j
		}
	}
	return nil
}

// jobScoped reports whether the agent-API request method p is one of job
// id's own calls, the ones the real agent's job runner makes with the
// job's token (agent.JobRunner: start, log chunks, header times, state,
// finish). Ping, heartbeat, acquire, accept, register and the Stacks API
// are the agent's, not the job's.
func jobScoped(method, p, id string) bool {
	seg := strings.Split(p, "/")
	switch {
	case len(seg) < 2 || seg[0] != "jobs" || seg[1] != id:
		return false
	case len(seg) == 2:
		return method == http.MethodGet
	case len(seg) == 3:
		switch seg[2] {
		case "start", "finish":
			return method == http.MethodPut
		case "chunks", "header_times":
			return method == http.MethodPost
		}
	}
	return false
}

// handOutLocked gives job j to agent a (assigned by ping, or acquired),
// with the job's own access token.
func (s *Simulator) handOutLocked(j *job, a *agent, state string) {
	j.state, j.agent, a.job = state, a, j
	j.accessToken = randomToken(24)
}

// ipAllowed applies a token's allowed_ip_addresses: space-separated CIDRs,
// empty allowing every address.
func ipAllowed(allowed, remote string) bool {
	if strings.TrimSpace(allowed) == "" {
		return true
	}
	ip, err := netip.ParseAddr(remoteIP(remote))
	if err != nil {
		return false
	}
	for _, c := range strings.Fields(allowed) {
		if p, err := netip.ParsePrefix(c); err == nil && p.Contains(ip.Unmap()) {
			return true
		}
	}
	return false
}

func remoteIP(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// pingLocked answers a ping: disconnect when the agent was asked to stop,
// else the oldest scheduled job it matches (assigned to it), else nothing.
func (s *Simulator) pingLocked(a *agent) any {
	if a.stopRequested && a.job == nil {
		return map[string]any{"action": "disconnect", "message": "The agent was stopped"}
	}
	if a.job != nil || a.ignoreInDispatches || a.jat != nil {
		// An agent of a job acquisition token acquires its job; it is
		// offered none.
		return map[string]any{}
	}
	for _, b := range s.builds {
		for _, j := range b.jobs {
			if j.state == stateScheduled && !s.reservedLocked(j) && s.matchesLocked(a, j) {
				s.handOutLocked(j, a, stateAssigned)
				return map[string]any{"job": s.agentJobJSONLocked(j)}
			}
		}
	}
	return map[string]any{}
}

// matchesLocked is Buildkite's dispatch rule for a clustered agent: the
// job's pipeline is in the agent's cluster, the job's queue (its queue
// rule, else the cluster's default queue) is the agent's queue (its queue
// tag, else the default queue), and every other rule key=value matches
// one of the agent's tags, where * in a value matches any text.
func (s *Simulator) matchesLocked(a *agent, j *job) bool {
	c := j.build.pipeline.cluster
	if c == nil || c != a.cluster {
		return false
	}
	jobQueue, agentQueue := "", tagValue(a.tags, "queue")
	for _, rule := range j.rules {
		k, v, _ := strings.Cut(rule, "=")
		if k == "queue" {
			jobQueue = v
			continue
		}
		if !tagMatches(a.tags, k, v) {
			return false
		}
	}
	def := c.queueByID(c.defaultQueue)
	defKey := ""
	if def != nil {
		defKey = def.key
	}
	if jobQueue == "" {
		jobQueue = defKey
	}
	if agentQueue == "" {
		agentQueue = defKey
	}
	return jobQueue == agentQueue
}

func tagValue(tags []string, key string) string {
	for _, t := range tags {
		if k, v, ok := strings.Cut(t, "="); ok && k == key {
			return v
		}
	}
	return ""
}

func tagMatches(tags []string, key, pattern string) bool {
	for _, t := range tags {
		k, v, ok := strings.Cut(t, "=")
		if !ok || k != key {
			continue
		}
		if ok, _ := path.Match(strings.ReplaceAll(pattern, "/", "\\/"), v); ok || pattern == v {
			return true
		}
	}
	return false
}

func (c *cluster) queueByKey(key string) *queue {
	for _, q := range c.queues {
		if q.key == key {
			return q
		}
	}
	return nil
}

func (c *cluster) queueByID(id string) *queue {
	for _, q := range c.queues {
		if q.id == id {
			return q
		}
	}
	return nil
}

// agentJobLocked finds a job this agent may act on: the one it holds, or
// with acquire any job of its cluster.
func (s *Simulator) agentJobLocked(a *agent, id string, acquire bool) (*job, error) {
	j := s.jobs[id]
	if j == nil {
		return nil, errf(http.StatusNotFound, "No job found")
	}
	if !acquire && j.agent != a {
		return nil, errf(http.StatusForbidden, "The job is not assigned to this agent")
	}
	return j, nil
}

func (s *Simulator) jobActionLocked(r *http.Request, a *agent, id, action string) (any, error) {
	switch {
	case action == "acquire" && r.Method == http.MethodPut:
		j, err := s.agentJobLocked(a, id, true)
		if err != nil {
			return nil, err
		}
		switch {
		case j.state == stateWaiting:
			// 423 Locked: the job waits for its dependencies; the agent
			// retries after Retry-After (core.Client.AcquireJob).
			return nil, &apiError{code: http.StatusLocked, msg: "The job is waiting on its dependencies", retryAfter: 1}
		case j.state != stateScheduled:
			return nil, errf(http.StatusUnprocessableEntity, "The job can't be acquired because it's %s", j.state)
		case a.jat != nil && a.jat.job != j:
			return nil, errf(http.StatusUnprocessableEntity, "The agent's job acquisition token is for another job")
		case a.jat == nil && s.reservedLocked(j):
			return nil, errf(http.StatusUnprocessableEntity, "The job is reserved by stack %q", j.reservedBy.key)
		case !s.matchesLocked(a, j):
			return nil, errf(http.StatusUnprocessableEntity, "The job's agent query rules don't match this agent")
		case a.job != nil:
			return nil, errf(http.StatusUnprocessableEntity, "The agent is already running a job")
		}
		s.handOutLocked(j, a, stateAccepted)
		return s.agentJobJSONLocked(j), nil
	case action == "accept" && r.Method == http.MethodPut:
		j, err := s.agentJobLocked(a, id, false)
		if err != nil {
			return nil, err
		}
		if j.state != stateAssigned {
			return nil, errf(http.StatusUnprocessableEntity, "The job can't be accepted because it's %s", j.state)
		}
		j.state = stateAccepted
		return s.agentJobJSONLocked(j), nil
	case action == "start" && r.Method == http.MethodPut:
		j, err := s.agentJobLocked(a, id, false)
		if err != nil {
			return nil, err
		}
		if j.state != stateAccepted {
			return nil, errf(http.StatusUnprocessableEntity, "The job can't be started because it's %s", j.state)
		}
		j.state, j.startedAt = stateRunning, s.clock.Now()
		s.hooks.enqueueLocked("job.started", j)
		return map[string]any{}, nil
	case action == "chunks" && r.Method == http.MethodPost:
		j, err := s.agentJobLocked(a, id, false)
		if err != nil {
			return nil, err
		}
		return map[string]any{}, s.chunkLocked(r, j)
	case action == "header_times" && r.Method == http.MethodPost:
		j, err := s.agentJobLocked(a, id, false)
		if err != nil {
			return nil, err
		}
		var ht struct {
			Times map[string]string `json:"header_times"`
		}
		if err := decodeBody(r, &ht); err != nil {
			return nil, err
		}
		if j.headerTime == nil {
			j.headerTime = map[string]string{}
		}
		for k, v := range ht.Times {
			if len(j.headerTime) < 10000 {
				j.headerTime[k] = v
			}
		}
		return map[string]any{}, nil
	case action == "finish" && r.Method == http.MethodPut:
		j, err := s.agentJobLocked(a, id, false)
		if err != nil {
			return nil, err
		}
		var req struct {
			ExitStatus string `json:"exit_status"`
			Signal     string `json:"signal"`
			// The agent's last job (--disconnect-after-job): no more
			// jobs are dispatched to it (api.JobFinishRequest's
			// ignore_agent_in_dispatches, v3.138.1), so none is handed to
			// an agent that is about to disconnect and would leave it
			// assigned.
			IgnoreAgentInDispatches *bool `json:"ignore_agent_in_dispatches"`
		}
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		if j.state != stateRunning && j.state != stateCanceling {
			return nil, errf(http.StatusUnprocessableEntity, "The job can't be finished because it's %s", j.state)
		}
		status, err := strconv.Atoi(req.ExitStatus)
		if err != nil {
			// The agent sends -1 when the job never ran; anything else
			// non-numeric is a bad request.
			return nil, errf(http.StatusUnprocessableEntity, "exit_status %q is not a number", req.ExitStatus)
		}
		j.exitStatus, j.signal, j.finishedAt = &status, req.Signal, s.clock.Now()
		switch {
		case j.state == stateCanceling:
			j.state = stateCanceled
		case status == 0:
			j.state = statePassed
		default:
			j.state = stateFailed
		}
		a.job, a.lastJobFinishedAt = nil, j.finishedAt
		if req.IgnoreAgentInDispatches != nil && *req.IgnoreAgentInDispatches {
			a.ignoreInDispatches = true
		}
		s.hooks.enqueueLocked("job.finished", j)
		return map[string]any{}, nil
	}
	return nil, errf(http.StatusNotFound, "Not Found")
}

// chunkLocked stores one log chunk: the body is gzip (Content-Encoding),
// placed at the query's offset; sequence and size are checked against it.
func (s *Simulator) chunkLocked(r *http.Request, j *job) error {
	q := r.URL.Query()
	offset, err1 := strconv.ParseUint(q.Get("offset"), 10, 64)
	size, err2 := strconv.ParseUint(q.Get("size"), 10, 64)
	if _, err := strconv.ParseUint(q.Get("sequence"), 10, 64); err != nil || err1 != nil || err2 != nil {
		return errf(http.StatusBadRequest, "sequence, offset and size must be numbers")
	}
	var body io.Reader = r.Body
	if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			return errf(http.StatusBadRequest, "chunk is not gzip: %v", err)
		}
		defer zr.Close()
		body = zr
	}
	data, err := io.ReadAll(io.LimitReader(body, chunkMaxBytes+1))
	if err != nil {
		return errf(http.StatusBadRequest, "read chunk: %v", err)
	}
	if uint64(len(data)) != size {
		return errf(http.StatusUnprocessableEntity, "chunk size %d does not match its %d bytes", size, len(data))
	}
	end := offset + size
	if end > logMaxBytes {
		return errf(http.StatusRequestEntityTooLarge, "the job's log is over %d bytes", logMaxBytes)
	}
	if uint64(len(j.log)) < end {
		j.log = append(j.log, make([]byte, int(end)-len(j.log))...)
	}
	copy(j.log[offset:end], data)
	j.logChunks++
	return nil
}

// agentJobJSONLocked is the job as the agent API gives it (api.Job): its
// environment is what the bootstrap runs with.
func (s *Simulator) agentJobJSONLocked(j *job) map[string]any {
	b := j.build
	env := map[string]string{
		"BUILDKITE":                       "true",
		"CI":                              "true",
		"BUILDKITE_JOB_ID":                j.id,
		"BUILDKITE_BUILD_ID":              b.id,
		"BUILDKITE_BUILD_NUMBER":          strconv.Itoa(b.number),
		"BUILDKITE_BUILD_URL":             s.webURL(b),
		"BUILDKITE_ORGANIZATION_SLUG":     s.org.slug,
		"BUILDKITE_PIPELINE_SLUG":         b.pipeline.slug,
		"BUILDKITE_PIPELINE_ID":           b.pipeline.id,
		"BUILDKITE_BRANCH":                b.branch,
		"BUILDKITE_COMMIT":                b.commit,
		"BUILDKITE_MESSAGE":               b.message,
		"BUILDKITE_COMMAND":               j.command,
		"BUILDKITE_STEP_KEY":              j.stepKey,
		"BUILDKITE_LABEL":                 j.label,
		"BUILDKITE_SOURCE":                "api",
		"BUILDKITE_REPO":                  "",
		"BUILDKITE_SCRIPT_PATH":           j.command,
		"BUILDKITE_AGENT_ID":              "",
		"BUILDKITE_AGENT_NAME":            "",
		"BUILDKITE_AGENT_META_DATA_QUEUE": "",
	}
	if a := j.agent; a != nil {
		env["BUILDKITE_AGENT_ID"], env["BUILDKITE_AGENT_NAME"] = a.id, a.name
		for _, t := range a.tags {
			if k, v, ok := strings.Cut(t, "="); ok {
				env["BUILDKITE_AGENT_META_DATA_"+strings.ToUpper(strings.ReplaceAll(k, "-", "_"))] = v
			}
		}
	}
	return map[string]any{
		"id": j.id, "endpoint": "", "state": j.state, "env": env,
		// The job's own access token (api.Job's token): the agent's job
		// runner uses it for the job's calls and gives it to the job as
		// BUILDKITE_AGENT_ACCESS_TOKEN, never the agent's own.
		"token":                   j.accessToken,
		"step":                    map[string]any{"key": j.stepKey, "label": j.label, "command": j.command},
		"chunks_max_size_bytes":   chunkMaxBytes,
		"chunks_interval_seconds": 1,
		"log_max_size_bytes":      logMaxBytes,
		"runnable_at":             bkTime(j.runnableAt),
	}
}

func (s *Simulator) webURL(b *build) string {
	return fmt.Sprintf("https://buildkite.com/%s/%s/builds/%d", s.org.slug, b.pipeline.slug, b.number)
}
