package buildkitesim

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"
)

// The admin API: what a test (or a developer, through cmd/buildkite-sim's
// /_sim/ endpoints, loopback clients only) does that a Buildkite user does
// in the web UI: clusters, queues, tokens, pipelines, builds.

// Cluster is a cluster the admin API created.
type Cluster struct {
	ID             string `json:"id"`
	Name           string `json:"name"`
	DefaultQueueID string `json:"defaultQueueId"`
}

// CreateCluster creates a cluster with its default queue, keyed "default".
func (s *Simulator) CreateCluster(name string) Cluster {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	q := &queue{id: newUUID(), key: "default", createdAt: now}
	c := &cluster{id: newUUID(), name: name, defaultQueue: q.id, queues: []*queue{q}, createdAt: now}
	s.clusters = append(s.clusters, c)
	return Cluster{ID: c.id, Name: name, DefaultQueueID: q.id}
}

// CreateQueue adds a queue to a cluster and returns its id.
func (s *Simulator) CreateQueue(clusterID, key string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, err := s.clusterLocked(clusterID)
	if err != nil {
		return "", err
	}
	if c.queueByKey(key) != nil {
		return "", fmt.Errorf("queue %q exists in cluster %s", key, c.name)
	}
	q := &queue{id: newUUID(), key: key, createdAt: s.clock.Now()}
	c.queues = append(c.queues, q)
	return q.id, nil
}

// Token is a cluster agent token and its secret.
type Token struct {
	ID     string `json:"id"`
	Secret string `json:"token"`
}

// CreateToken creates a cluster agent token; a zero expiresAt never
// expires.
func (s *Simulator) CreateToken(clusterID, description string, expiresAt time.Time) (Token, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, err := s.clusterLocked(clusterID)
	if err != nil {
		return Token{}, err
	}
	t := &clusterToken{id: newUUID(), description: description, token: randomToken(25), expiresAt: expiresAt, cluster: c, createdAt: s.clock.Now()}
	c.tokens = append(c.tokens, t)
	return Token{ID: t.id, Secret: t.token}, nil
}

// DeleteToken revokes a cluster agent token, as the REST API's DELETE
// does.
func (s *Simulator) DeleteToken(clusterID, tokenID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := s.deleteToken(nil, map[string]string{"cluster": clusterID, "token": tokenID})
	return err
}

// CreatePipeline creates a pipeline in a cluster.
func (s *Simulator) CreatePipeline(slug, clusterID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, err := s.clusterLocked(clusterID)
	if err != nil {
		return err
	}
	if s.pipelines[slug] != nil {
		return fmt.Errorf("pipeline %s exists", slug)
	}
	s.pipelines[slug] = &pipeline{id: newUUID(), slug: slug, name: slug, cluster: c, createdAt: s.clock.Now()}
	return nil
}

// Step is a command step of a build the admin API creates.
type Step struct {
	Key     string   `json:"key,omitempty"`
	Label   string   `json:"label,omitempty"`
	Command string   `json:"command"`
	Agents  []string `json:"agents,omitempty"` // agent query rules, key=value
	// Waiting makes the job wait (as on a dependency) until Unblock.
	Waiting bool `json:"waiting,omitempty"`
}

// Build is a build the admin API created, with its jobs' ids in step
// order.
type Build struct {
	ID     string   `json:"id"`
	Number int      `json:"number"`
	JobIDs []string `json:"jobIds"`
}

// CreateBuild creates a build of a pipeline: one job per step, scheduled
// (or waiting), each announced by a job.scheduled webhook.
func (s *Simulator) CreateBuild(pipelineSlug, message string, steps []Step) (Build, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pipelines[pipelineSlug]
	if p == nil {
		return Build{}, fmt.Errorf("no pipeline %s", pipelineSlug)
	}
	if len(steps) == 0 {
		return Build{}, fmt.Errorf("a build needs at least one step")
	}
	now := s.clock.Now()
	p.nextNumber++
	b := &build{id: newUUID(), number: p.nextNumber, pipeline: p, message: message, branch: "main", commit: "HEAD", createdAt: now}
	out := Build{ID: b.id, Number: b.number}
	for _, st := range steps {
		if strings.TrimSpace(st.Command) == "" {
			return Build{}, fmt.Errorf("step %q has no command", st.Key)
		}
		for _, r := range st.Agents {
			if k, _, ok := strings.Cut(r, "="); !ok || k == "" {
				return Build{}, fmt.Errorf("agent query rule %q is not key=value", r)
			}
		}
		j := &job{id: newUUID(), build: b, stepKey: st.Key, label: st.Label, command: st.Command, rules: st.Agents, state: stateScheduled, createdAt: now, scheduledAt: now, runnableAt: now}
		if st.Waiting {
			j.state, j.runnableAt = stateWaiting, time.Time{}
		}
		b.jobs = append(b.jobs, j)
		s.jobs[j.id] = j
		out.JobIDs = append(out.JobIDs, j.id)
	}
	s.builds = append(s.builds, b)
	for _, j := range b.jobs {
		if j.state == stateScheduled {
			s.hooks.enqueueLocked("job.scheduled", j)
		}
	}
	return out, nil
}

// Unblock schedules a waiting job.
func (s *Simulator) Unblock(jobID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	j := s.jobs[jobID]
	if j == nil || j.state != stateWaiting {
		return fmt.Errorf("job %s is not waiting", jobID)
	}
	j.state, j.runnableAt = stateScheduled, s.clock.Now()
	s.hooks.enqueueLocked("job.scheduled", j)
	return nil
}

// JobInfo is what a test reads back about a job.
type JobInfo struct {
	ID         string `json:"id"`
	State      string `json:"state"`
	Agent      string `json:"agent,omitempty"` // the agent's name
	Log        string `json:"log"`
	ExitStatus *int   `json:"exitStatus,omitempty"`
	// AccessToken is the job's own access token, which its agent received
	// with it and gives the job as BUILDKITE_AGENT_ACCESS_TOKEN; empty
	// before an agent took the job.
	AccessToken string `json:"accessToken,omitempty"`
}

// Job returns a job's state, log and exit status.
func (s *Simulator) Job(id string) (JobInfo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j := s.jobs[id]
	if j == nil {
		return JobInfo{}, false
	}
	info := JobInfo{ID: j.id, State: j.state, Log: string(j.log), ExitStatus: j.exitStatus, AccessToken: j.accessToken}
	if j.agent != nil {
		info.Agent = j.agent.name
	}
	return info, true
}

// AgentInfo is what a test reads back about an agent.
type AgentInfo struct {
	ID    string   `json:"id"`
	Name  string   `json:"name"`
	State string   `json:"connectionState"`
	Tags  []string `json:"metaData"`
	// StopRequested: the REST API's stop was called for the agent.
	StopRequested bool `json:"stopRequested"`
	// Job is the job the agent holds (assigned, accepted or running);
	// empty when it holds none.
	Job string `json:"job,omitempty"`
	// AcquireJob is the job of the job acquisition token the agent
	// registered with; empty for an agent of a cluster agent token.
	AcquireJob string `json:"acquireJob,omitempty"`
}

// Agents lists every agent that registered, oldest first.
func (s *Simulator) Agents() []AgentInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []AgentInfo
	for _, a := range s.sortedAgentsLocked() {
		info := AgentInfo{ID: a.id, Name: a.name, State: a.state, Tags: a.tags, StopRequested: a.stopRequested}
		if a.job != nil {
			info.Job = a.job.id
		}
		if a.jat != nil {
			info.AcquireJob = a.jat.job.id
		}
		out = append(out, info)
	}
	return out
}

func isLoopback(remote string) bool {
	ip := net.ParseIP(remoteIP(remote))
	return ip != nil && ip.IsLoopback()
}

// serveAdmin is the admin API over HTTP: POST clusters {name}, POST
// clusters/{id}/queues {key}, POST clusters/{id}/tokens {description,
// expiresAt}, POST pipelines {slug, clusterId}, POST builds {pipeline,
// message, steps}, POST jobs/{id}/unblock, GET jobs/{id}, GET agents,
// POST faults {Fault}, POST webhooks {Webhook}, GET deliveries.
func (s *Simulator) serveAdmin(w http.ResponseWriter, r *http.Request, p string) {
	if !isLoopback(r.RemoteAddr) {
		writeMessage(w, http.StatusForbidden, "the admin API answers loopback clients only")
		return
	}
	seg := strings.Split(p, "/")
	var (
		v   any
		err error
	)
	switch {
	case r.Method == http.MethodPost && p == "clusters":
		var req struct{ Name string }
		if err = decodeBody(r, &req); err == nil {
			v = s.CreateCluster(req.Name)
		}
	case r.Method == http.MethodPost && len(seg) == 3 && seg[0] == "clusters" && seg[2] == "queues":
		var req struct{ Key string }
		if err = decodeBody(r, &req); err == nil {
			var id string
			id, err = s.CreateQueue(seg[1], req.Key)
			v = map[string]string{"id": id}
		}
	case r.Method == http.MethodPost && len(seg) == 3 && seg[0] == "clusters" && seg[2] == "tokens":
		var req struct {
			Description string
			ExpiresAt   time.Time
		}
		if err = decodeBody(r, &req); err == nil {
			v, err = s.CreateToken(seg[1], req.Description, req.ExpiresAt)
		}
	case r.Method == http.MethodPost && p == "pipelines":
		var req struct{ Slug, ClusterID string }
		if err = decodeBody(r, &req); err == nil {
			err = s.CreatePipeline(req.Slug, req.ClusterID)
			v = map[string]string{"slug": req.Slug}
		}
	case r.Method == http.MethodPost && p == "builds":
		var req struct {
			Pipeline, Message string
			Steps             []Step
		}
		if err = decodeBody(r, &req); err == nil {
			v, err = s.CreateBuild(req.Pipeline, req.Message, req.Steps)
		}
	case r.Method == http.MethodPost && len(seg) == 3 && seg[0] == "jobs" && seg[2] == "unblock":
		err = s.Unblock(seg[1])
		v = map[string]string{}
	case r.Method == http.MethodGet && len(seg) == 2 && seg[0] == "jobs":
		info, ok := s.Job(seg[1])
		if !ok {
			err = errf(http.StatusNotFound, "no job %s", seg[1])
		}
		v = info
	case r.Method == http.MethodGet && p == "agents":
		v = s.Agents()
	case r.Method == http.MethodPost && p == "faults":
		var f Fault
		if err = decodeBody(r, &f); err == nil {
			s.InjectFault(f)
			v = f
		}
	case r.Method == http.MethodPost && p == "webhooks":
		var h Webhook
		if err = decodeBody(r, &h); err == nil {
			s.AddWebhook(h)
			v = map[string]string{"url": h.URL}
		}
	case r.Method == http.MethodGet && p == "deliveries":
		v = s.Deliveries()
	default:
		err = errf(http.StatusNotFound, "Not Found")
	}
	if err != nil {
		var ae *apiError
		if !errors.As(err, &ae) {
			err = errf(http.StatusUnprocessableEntity, "%v", err)
		}
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// TokenInfo is a cluster agent token as the admin API shows it, deleted
// ones included, with its secret: what end-to-end tests try again after
// HyperFleet revoked it.
type TokenInfo struct {
	ID          string    `json:"id"`
	Description string    `json:"description"`
	Secret      string    `json:"token"`
	ExpiresAt   time.Time `json:"expiresAt,omitzero"`
	Deleted     bool      `json:"deleted"`
}

// TokensDescribed returns the cluster's agent tokens whose description
// starts with prefix (such as the operator's "hyperfleet agent "), deleted
// ones included, oldest first.
func (s *Simulator) TokensDescribed(clusterID, prefix string) ([]TokenInfo, error) {
	all, err := s.Tokens(clusterID)
	if err != nil {
		return nil, err
	}
	var out []TokenInfo
	for _, t := range all {
		if strings.HasPrefix(t.Description, prefix) {
			out = append(out, t)
		}
	}
	return out, nil
}

// Tokens returns a cluster's agent tokens, deleted ones included, oldest
// first.
func (s *Simulator) Tokens(clusterID string) ([]TokenInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, err := s.clusterLocked(clusterID)
	if err != nil {
		return nil, err
	}
	out := make([]TokenInfo, 0, len(c.tokens))
	for _, t := range c.tokens {
		out = append(out, TokenInfo{ID: t.id, Description: t.description, Secret: t.token, ExpiresAt: t.expiresAt, Deleted: t.deleted})
	}
	return out, nil
}
