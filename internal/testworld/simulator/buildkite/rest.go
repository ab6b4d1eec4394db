package buildkitesim

import (
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Fault makes the next Count requests whose path starts with PathPrefix
// (and whose method is Method, when set) fail with Status (a 5xx, or 429).
type Fault struct {
	Method     string `json:"method,omitempty"`
	PathPrefix string `json:"pathPrefix"`
	Status     int    `json:"status"`
	Count      int    `json:"count"`
}

// InjectFault adds a fault.
func (s *Simulator) InjectFault(f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, f)
}

// InjectedFaults is how many requests faults have failed.
func (s *Simulator) InjectedFaults() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.injected
}

func (s *Simulator) faultLocked(_ string, method, p string) error {
	for i := range s.faults {
		f := &s.faults[i]
		if f.Count > 0 && strings.HasPrefix(p, f.PathPrefix) && (f.Method == "" || strings.EqualFold(f.Method, method)) {
			f.Count--
			s.injected++
			return errf(f.Status, "Injected fault")
		}
	}
	return nil
}

// rateWindow counts the organization's REST requests in the current
// minute.
type rateWindow struct {
	start time.Time
	used  int
}

// restRoute is one REST endpoint: a method, a path pattern below
// /v2/organizations/{org}/ ("{x}" matches one segment), the scope a token
// needs and the handler.
type restRoute struct {
	method, pattern, scope string
	h                      func(s *Simulator, r *http.Request, v map[string]string) (any, error)
}

// Scopes lists every API-token scope some REST route needs.
func Scopes() []string {
	var out []string
	for _, rt := range restRoutes {
		if !slices.Contains(out, rt.scope) {
			out = append(out, rt.scope)
		}
	}
	return out
}

var restRoutes = []restRoute{
	{"GET", "", "read_organizations", (*Simulator).getOrganization},
	{"GET", "clusters", "read_clusters", (*Simulator).listClusters},
	{"GET", "clusters/{cluster}", "read_clusters", (*Simulator).getCluster},
	{"GET", "clusters/{cluster}/queues", "read_clusters", (*Simulator).listQueues},
	{"GET", "clusters/{cluster}/tokens", "read_clusters", (*Simulator).listTokens},
	{"POST", "clusters/{cluster}/tokens", "write_clusters", (*Simulator).createToken},
	{"GET", "clusters/{cluster}/tokens/{token}", "read_clusters", (*Simulator).getToken},
	{"DELETE", "clusters/{cluster}/tokens/{token}", "write_clusters", (*Simulator).deleteToken},
	{"GET", "agents", "read_agents", (*Simulator).listAgents},
	{"GET", "agents/{agent}", "read_agents", (*Simulator).getAgent},
	{"PUT", "agents/{agent}/stop", "write_agents", (*Simulator).stopAgent},
	{"GET", "builds", "read_builds", (*Simulator).listBuilds},
	{"GET", "pipelines/{pipeline}/builds", "read_builds", (*Simulator).listBuilds},
	{"GET", "pipelines/{pipeline}/builds/{number}", "read_builds", (*Simulator).getBuild},
	{"PUT", "pipelines/{pipeline}/builds/{number}/cancel", "write_builds", (*Simulator).cancelBuild},
}

func matchPattern(pattern, p string) (map[string]string, bool) {
	ps, xs := strings.Split(pattern, "/"), strings.Split(p, "/")
	if pattern == "" {
		return map[string]string{}, p == ""
	}
	if len(ps) != len(xs) {
		return nil, false
	}
	v := map[string]string{}
	for i := range ps {
		if strings.HasPrefix(ps[i], "{") {
			if xs[i] == "" {
				return nil, false
			}
			v[strings.Trim(ps[i], "{}")] = xs[i]
		} else if ps[i] != xs[i] {
			return nil, false
		}
	}
	return v, true
}

func (s *Simulator) serveREST(w http.ResponseWriter, r *http.Request, p string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tok, ok := s.apiTokens[bearerTokenOnly(r)]
	if !ok {
		writeMessage(w, http.StatusUnauthorized, "Authentication required. Please supply a valid API Access Token: https://buildkite.com/docs/apis/rest-api#authentication")
		return
	}
	// Rate limit: per organization and minute, with the headers Buildkite
	// sends on every answer.
	now := s.clock.Now()
	if s.window.start.IsZero() || now.Sub(s.window.start) >= time.Minute {
		s.window = rateWindow{start: now}
	}
	s.window.used++
	remaining := s.cfg.RateLimit - s.window.used
	reset := int(time.Minute.Seconds() - now.Sub(s.window.start).Seconds())
	w.Header().Set("RateLimit-Limit", strconv.Itoa(s.cfg.RateLimit))
	w.Header().Set("RateLimit-Remaining", strconv.Itoa(max(remaining, 0)))
	w.Header().Set("RateLimit-Reset", strconv.Itoa(reset))
	if remaining < 0 {
		writeMessage(w, http.StatusTooManyRequests, "You have exceeded your REST API rate limit. Please wait before making more requests.")
		return
	}
	if err := s.faultLocked("rest", r.Method, "/v2/"+p); err != nil {
		writeErr(w, err)
		return
	}
	if p == "access-token" && r.Method == http.MethodGet {
		// The token's own description, which needs no scope: clients
		// (pkg/workload/buildkite's VerifyScope) read the scopes they hold
		// from it before they act.
		writeJSON(w, http.StatusOK, map[string]any{"uuid": tokenUUID(tok.Token), "scopes": tok.Scopes, "description": "simulated API access token"})
		return
	}
	rest, ok := strings.CutPrefix(p, "organizations/"+s.org.slug)
	if !ok || (rest != "" && !strings.HasPrefix(rest, "/")) {
		writeMessage(w, http.StatusNotFound, "No organization found")
		return
	}
	rest = strings.TrimPrefix(rest, "/")
	for _, rt := range restRoutes {
		v, ok := matchPattern(rt.pattern, rest)
		if !ok || rt.method != r.Method {
			continue
		}
		if !slices.Contains(tok.Scopes, rt.scope) {
			writeMessage(w, http.StatusForbidden, fmt.Sprintf("Your access token does not have the %s scope", rt.scope))
			return
		}
		out, err := rt.h(s, r, v)
		if err != nil {
			writeErr(w, err)
			return
		}
		code := http.StatusOK
		switch {
		case out == nil:
			w.WriteHeader(http.StatusNoContent)
			return
		case r.Method == http.MethodPost:
			code = http.StatusCreated
		}
		if list, ok := out.([]any); ok {
			out = s.paginate(w, r, list)
		}
		writeJSON(w, code, out)
		return
	}
	writeMessage(w, http.StatusNotFound, "Not Found")
}

// bearerTokenOnly reads a REST API token: "Authorization: Bearer <token>".
func validCIDR(s string) bool {
	_, err := netip.ParsePrefix(s)
	return err == nil
}

func bearerTokenOnly(r *http.Request) string {
	t, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return strings.TrimSpace(t)
}

// paginate cuts a list by page and per_page (default 30, at most 100) and
// sets the Link header's next and last, as Buildkite's REST API does.
func (s *Simulator) paginate(w http.ResponseWriter, r *http.Request, list []any) []any {
	q := r.URL.Query()
	per, _ := strconv.Atoi(q.Get("per_page"))
	if per <= 0 {
		per = 30
	}
	per = min(per, 100)
	page, _ := strconv.Atoi(q.Get("page"))
	page = max(page, 1)
	last := max((len(list)+per-1)/per, 1)
	link := func(n int) string {
		u := *r.URL
		qq := u.Query()
		qq.Set("page", strconv.Itoa(n))
		qq.Set("per_page", strconv.Itoa(per))
		u.RawQuery = qq.Encode()
		return fmt.Sprintf("<http://%s%s>", r.Host, u.RequestURI())
	}
	if page < last {
		w.Header().Set("Link", link(page+1)+`; rel="next", `+link(last)+`; rel="last"`)
	}
	from := min((page-1)*per, len(list))
	return list[from:min(from+per, len(list))]
}

func (s *Simulator) getOrganization(*http.Request, map[string]string) (any, error) {
	return map[string]any{"id": s.org.id, "slug": s.org.slug, "name": s.org.name, "created_at": bkTime(s.org.createdAt)}, nil
}

func (s *Simulator) clusterLocked(id string) (*cluster, error) {
	for _, c := range s.clusters {
		if c.id == id {
			return c, nil
		}
	}
	return nil, errf(http.StatusNotFound, "No cluster found")
}

func (s *Simulator) restClusterLocked(c *cluster) map[string]any {
	base := fmt.Sprintf("/v2/organizations/%s/clusters/%s", s.org.slug, c.id)
	return map[string]any{
		"id": c.id, "name": c.name, "description": c.description, "default_queue_id": c.defaultQueue,
		"url": base, "queues_url": base + "/queues", "created_at": bkTime(c.createdAt),
	}
}

func (s *Simulator) listClusters(*http.Request, map[string]string) (any, error) {
	out := []any{}
	for _, c := range s.clusters {
		out = append(out, s.restClusterLocked(c))
	}
	return out, nil
}

func (s *Simulator) getCluster(_ *http.Request, v map[string]string) (any, error) {
	c, err := s.clusterLocked(v["cluster"])
	if err != nil {
		return nil, err
	}
	return s.restClusterLocked(c), nil
}

func (s *Simulator) listQueues(_ *http.Request, v map[string]string) (any, error) {
	c, err := s.clusterLocked(v["cluster"])
	if err != nil {
		return nil, err
	}
	out := []any{}
	for _, q := range c.queues {
		out = append(out, map[string]any{"id": q.id, "key": q.key, "description": q.description, "dispatch_paused": false, "created_at": bkTime(q.createdAt)})
	}
	return out, nil
}

// restTokenLocked is a cluster token as the REST API lists it; the secret
// itself ("token") is only in the answer to its creation.
func (s *Simulator) restTokenLocked(t *clusterToken, secret bool) map[string]any {
	m := map[string]any{
		"id": t.id, "description": t.description, "allowed_ip_addresses": t.allowedIPs,
		"expires_at": bkTime(t.expiresAt), "created_at": bkTime(t.createdAt),
		"url": fmt.Sprintf("/v2/organizations/%s/clusters/%s/tokens/%s", s.org.slug, t.cluster.id, t.id),
	}
	if secret {
		m["token"] = t.token
	}
	return m
}

func (s *Simulator) listTokens(_ *http.Request, v map[string]string) (any, error) {
	c, err := s.clusterLocked(v["cluster"])
	if err != nil {
		return nil, err
	}
	out := []any{}
	for _, t := range c.tokens {
		if !t.deleted {
			out = append(out, s.restTokenLocked(t, false))
		}
	}
	return out, nil
}

func (s *Simulator) tokenLocked(v map[string]string) (*clusterToken, error) {
	c, err := s.clusterLocked(v["cluster"])
	if err != nil {
		return nil, err
	}
	for _, t := range c.tokens {
		if t.id == v["token"] && !t.deleted {
			return t, nil
		}
	}
	return nil, errf(http.StatusNotFound, "No token found")
}

func (s *Simulator) getToken(_ *http.Request, v map[string]string) (any, error) {
	t, err := s.tokenLocked(v)
	if err != nil {
		return nil, err
	}
	return s.restTokenLocked(t, false), nil
}

func (s *Simulator) createToken(r *http.Request, v map[string]string) (any, error) {
	c, err := s.clusterLocked(v["cluster"])
	if err != nil {
		return nil, err
	}
	var req struct {
		Description        string `json:"description"`
		AllowedIPAddresses string `json:"allowed_ip_addresses"`
		ExpiresAt          string `json:"expires_at"`
	}
	if err := decodeBody(r, &req); err != nil {
		return nil, err
	}
	if strings.TrimSpace(req.Description) == "" {
		return nil, errf(http.StatusUnprocessableEntity, "Validation failed: Description can't be blank")
	}
	t := &clusterToken{id: newUUID(), description: req.Description, token: randomToken(25), allowedIPs: req.AllowedIPAddresses, cluster: c, createdAt: s.clock.Now()}
	for _, cidr := range strings.Fields(req.AllowedIPAddresses) {
		if !validCIDR(cidr) {
			return nil, errf(http.StatusUnprocessableEntity, "Validation failed: Allowed ip addresses %q is not a valid CIDR", cidr)
		}
	}
	if req.ExpiresAt != "" {
		exp, err := time.Parse(time.RFC3339, req.ExpiresAt)
		if err != nil {
			return nil, errf(http.StatusUnprocessableEntity, "Validation failed: Expires at is not a valid time")
		}
		if !exp.After(s.clock.Now()) {
			return nil, errf(http.StatusUnprocessableEntity, "Validation failed: Expires at must be in the future")
		}
		t.expiresAt = exp
	}
	c.tokens = append(c.tokens, t)
	return s.restTokenLocked(t, true), nil
}

// deleteToken revokes a token: it registers no new agent. Agents that
// registered with it keep their own access tokens and run on (Buildkite
// documents revoking a token as stopping new registrations only).
func (s *Simulator) deleteToken(_ *http.Request, v map[string]string) (any, error) {
	t, err := s.tokenLocked(v)
	if err != nil {
		return nil, err
	}
	t.deleted = true
	return nil, nil
}

func (s *Simulator) restAgentLocked(a *agent) map[string]any {
	m := map[string]any{
		"id": a.id, "name": a.name, "connection_state": a.state, "hostname": a.hostname,
		"ip_address": a.ipAddress, "user_agent": a.userAgent, "version": a.version,
		"meta_data": a.tags, "created_at": bkTime(a.createdAt), "last_job_finished_at": bkTime(a.lastJobFinishedAt),
		"url": fmt.Sprintf("/v2/organizations/%s/agents/%s", s.org.slug, a.id),
	}
	if a.job != nil {
		m["job"] = s.restJobLocked(a.job)
	}
	return m
}

// agentJSONLocked is the agent as the agent API's connect answers it.
func (s *Simulator) agentJSONLocked(a *agent) map[string]any {
	return map[string]any{"id": a.id, "name": a.name, "connection_state": a.state}
}

func (s *Simulator) sortedAgentsLocked() []*agent {
	list := make([]*agent, 0, len(s.agents))
	for _, a := range s.agents {
		list = append(list, a)
	}
	slices.SortFunc(list, func(x, y *agent) int {
		if c := x.createdAt.Compare(y.createdAt); c != 0 {
			return c
		}
		return strings.Compare(x.id, y.id)
	})
	return list
}

// listAgents lists the connected agents (Buildkite's list leaves out
// disconnected ones), filtered by name, hostname and version.
func (s *Simulator) listAgents(r *http.Request, _ map[string]string) (any, error) {
	q := r.URL.Query()
	out := []any{}
	for _, a := range s.sortedAgentsLocked() {
		if a.state == "disconnected" || a.state == "stopped" || a.state == "lost" {
			continue
		}
		if (q.Get("name") != "" && q.Get("name") != a.name) || (q.Get("hostname") != "" && q.Get("hostname") != a.hostname) || (q.Get("version") != "" && q.Get("version") != a.version) {
			continue
		}
		out = append(out, s.restAgentLocked(a))
	}
	return out, nil
}

func (s *Simulator) getAgent(_ *http.Request, v map[string]string) (any, error) {
	a := s.agents[v["agent"]]
	if a == nil {
		return nil, errf(http.StatusNotFound, "No agent found")
	}
	return s.restAgentLocked(a), nil
}

// stopAgent asks a connected agent to stop: its next ping answers
// disconnect (after its job, unless force). A disconnected agent cannot be
// stopped (422).
func (s *Simulator) stopAgent(r *http.Request, v map[string]string) (any, error) {
	a := s.agents[v["agent"]]
	if a == nil {
		return nil, errf(http.StatusNotFound, "No agent found")
	}
	var req struct {
		Force bool `json:"force"`
	}
	if err := decodeBody(r, &req); err != nil {
		return nil, err
	}
	if a.state != "connected" {
		return nil, errf(http.StatusUnprocessableEntity, "Agent is not connected")
	}
	a.stopRequested = true
	if req.Force && a.job != nil && !a.job.finished() {
		a.job.state = stateCanceling
	}
	return nil, nil
}

// buildState derives a build's state from its jobs, as Buildkite reports
// it: scheduled until a job starts, running while any runs, then passed,
// failed or canceled.
func buildState(b *build) string {
	var running, failed, canceled, open bool
	for _, j := range b.jobs {
		switch j.state {
		case stateAssigned, stateAccepted, stateRunning, stateCanceling:
			running = true
		case stateScheduled, stateWaiting:
			open = true
		case stateFailed:
			failed = true
		case stateCanceled:
			canceled = true
		}
	}
	switch {
	case running:
		return "running"
	case open && (failed || canceled):
		return "failing"
	case open:
		return "scheduled"
	case canceled:
		return "canceled"
	case failed:
		return "failed"
	}
	return "passed"
}

func (s *Simulator) restJobLocked(j *job) map[string]any {
	m := map[string]any{
		"id": j.id, "type": "script", "name": j.label, "label": j.label, "step_key": j.stepKey,
		"state": j.state, "command": j.command, "agent_query_rules": j.rules,
		"created_at": bkTime(j.createdAt), "scheduled_at": bkTime(j.scheduledAt), "runnable_at": bkTime(j.runnableAt),
		"started_at": bkTime(j.startedAt), "finished_at": bkTime(j.finishedAt),
		"web_url": s.webURL(j.build) + "#" + j.id, "retried": false, "soft_failed": false, "unblockable": false,
	}
	if j.exitStatus != nil {
		m["exit_status"] = *j.exitStatus
	} else {
		m["exit_status"] = nil
	}
	if c := j.build.pipeline.cluster; c != nil {
		m["cluster_id"] = c.id
		if q := c.queueByKey(jobQueue(j, c)); q != nil {
			m["cluster_queue_id"] = q.id
		}
	}
	if j.agent != nil {
		m["agent"] = map[string]any{"id": j.agent.id, "name": j.agent.name}
	}
	return m
}

func jobQueue(j *job, c *cluster) string {
	for _, r := range j.rules {
		if k, v, _ := strings.Cut(r, "="); k == "queue" {
			return v
		}
	}
	if q := c.queueByID(c.defaultQueue); q != nil {
		return q.key
	}
	return ""
}

func (s *Simulator) restPipelineLocked(p *pipeline) map[string]any {
	m := map[string]any{"id": p.id, "slug": p.slug, "name": p.name, "created_at": bkTime(p.createdAt)}
	if p.cluster != nil {
		m["cluster_id"] = p.cluster.id
	}
	return m
}

func (s *Simulator) restBuildLocked(b *build, withJobs bool) map[string]any {
	m := map[string]any{
		"id": b.id, "number": b.number, "state": buildState(b), "blocked": false, "message": b.message,
		"branch": b.branch, "commit": b.commit, "web_url": s.webURL(b), "source": "api",
		"created_at": bkTime(b.createdAt), "scheduled_at": bkTime(b.createdAt),
		"pipeline": s.restPipelineLocked(b.pipeline),
	}
	if withJobs {
		jobs := []any{}
		for _, j := range b.jobs {
			jobs = append(jobs, s.restJobLocked(j))
		}
		m["jobs"] = jobs
	}
	return m
}

// listBuilds lists builds newest first, of the organization or one
// pipeline, filtered by state (state or state[] repeated), with their jobs
// unless exclude_jobs.
func (s *Simulator) listBuilds(r *http.Request, v map[string]string) (any, error) {
	q := r.URL.Query()
	states := append(q["state[]"], q["state"]...)
	out := []any{}
	for i := len(s.builds) - 1; i >= 0; i-- {
		b := s.builds[i]
		if p := v["pipeline"]; p != "" && b.pipeline.slug != p {
			continue
		}
		if len(states) > 0 && !slices.Contains(states, buildState(b)) {
			continue
		}
		out = append(out, s.restBuildLocked(b, q.Get("exclude_jobs") != "true"))
	}
	if p := v["pipeline"]; p != "" && s.pipelines[p] == nil {
		return nil, errf(http.StatusNotFound, "No pipeline found")
	}
	return out, nil
}

func (s *Simulator) buildLocked(v map[string]string) (*build, error) {
	n, _ := strconv.Atoi(v["number"])
	for _, b := range s.builds {
		if b.pipeline.slug == v["pipeline"] && b.number == n {
			return b, nil
		}
	}
	return nil, errf(http.StatusNotFound, "No build found")
}

func (s *Simulator) getBuild(_ *http.Request, v map[string]string) (any, error) {
	b, err := s.buildLocked(v)
	if err != nil {
		return nil, err
	}
	return s.restBuildLocked(b, true), nil
}

// cancelBuild cancels a build that has not finished: jobs not yet on an
// agent are canceled at once, running ones go to canceling (their agent
// sees it on its next job status check and finishes them).
func (s *Simulator) cancelBuild(_ *http.Request, v map[string]string) (any, error) {
	b, err := s.buildLocked(v)
	if err != nil {
		return nil, err
	}
	switch buildState(b) {
	case "passed", "failed", "canceled":
		return nil, errf(http.StatusUnprocessableEntity, "Build can't be canceled because it's already finished")
	}
	now := s.clock.Now()
	for _, j := range b.jobs {
		switch j.state {
		case stateWaiting, stateScheduled:
			j.state, j.finishedAt = stateCanceled, now
		case stateAssigned, stateAccepted, stateRunning:
			j.state = stateCanceling
		}
	}
	return s.restBuildLocked(b, true), nil
}

// tokenUUID is a stable UUID-shaped id of an API token (the simulator keeps
// no id per token): the first 16 bytes of its SHA-256, as a version-4 UUID.
func tokenUUID(token string) string {
	h := sha256.Sum256([]byte(token))
	h[6] = h[6]&0x0f | 0x40
	h[8] = h[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}
