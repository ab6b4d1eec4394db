package gitlabsim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// HookConfig adds a project or group webhook (one of Project and Group, a
// full path). Group hooks also receive the events of projects in subgroups,
// as GitLab's do.
type HookConfig struct {
	URL     string `json:"url"`
	Token   string `json:"token,omitempty"` // sent as X-Gitlab-Token
	Project string `json:"project,omitempty"`
	Group   string `json:"group,omitempty"`
}

// Delivery is one webhook delivery as tests read it.
type Delivery struct {
	HookID    int64           `json:"hookId"`
	EventUUID string          `json:"eventUuid"`
	JobID     int64           `json:"jobId"`
	Status    string          `json:"buildStatus"`
	Payload   json.RawMessage `json:"payload"`
	// Response is the receiver's status code; 0 when it could not be
	// reached (Error says why).
	Response int    `json:"response"`
	Error    string `json:"error,omitempty"`
}

// RemoveHooks removes every webhook (a test world whose receiver moved
// adds its new address after).
func (s *Simulator) RemoveHooks() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.hooks)
}

// AddHook adds a webhook with job_events on and returns it.
func (s *Simulator) AddHook(c HookConfig) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := &hook{ID: s.id("hook"), UUID: uuid(), URL: c.URL, Token: c.Token, JobEvents: true}
	switch {
	case c.URL == "":
		return 0, errors.New("hook without url")
	case c.Project != "" && c.Group == "":
		p := s.projectByPathLocked(c.Project)
		if p == nil {
			return 0, fmt.Errorf("no project %q", c.Project)
		}
		h.ProjectID = p.id
	case c.Group != "" && c.Project == "":
		g := s.groupByPathLocked(c.Group)
		if g == nil {
			return 0, fmt.Errorf("no group %q", c.Group)
		}
		h.GroupID = g.id
	default:
		return 0, errors.New("give one of project and group")
	}
	s.hooks[h.ID] = h
	return h.ID, nil
}

// jobEventLocked queues a Job Hook delivery of j's current state to every
// hook of its project and of the project's groups.
func (s *Simulator) jobEventLocked(j *job) {
	if s.closed {
		return
	}
	p := j.pipeline.project
	var targets []*hook
	for _, h := range s.hooks {
		if h.JobEvents && (h.ProjectID == p.id || h.GroupID != 0 && s.groups[h.GroupID] != nil && p.group.under(s.groups[h.GroupID])) {
			targets = append(targets, h)
		}
	}
	if len(targets) == 0 {
		return
	}
	payload, err := json.Marshal(s.jobHookPayloadLocked(j))
	if err != nil {
		panic(err) // maps of plain values always marshal
	}
	event := uuid()
	base := s.cfg.URL
	if base == "" {
		base = "http://gitlab.example.com"
	}
	for _, h := range targets {
		s.deliv.enqueue(h, delivery{Delivery: Delivery{HookID: h.ID, EventUUID: event, JobID: j.id, Status: j.status, Payload: payload}, url: h.URL, token: h.Token, hookUUID: h.UUID, instance: base, version: s.cfg.Version})
	}
}

// jobHookPayloadLocked is the Job Hook body (object_kind "build"), with the
// keys GitLab's webhook events documentation lists for job events. It
// carries the runner's tags, not the job's: a receiver reads the job's
// tag_list through the REST API.
func (s *Simulator) jobHookPayloadLocked(j *job) map[string]any {
	pl := j.pipeline
	p := pl.project
	base := s.cfg.URL
	if base == "" {
		base = "http://gitlab.example.com"
	}
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
	if r := j.runner; r != nil {
		tags := r.tags
		if tags == nil {
			tags = []string{}
		}
		runnerJ = map[string]any{"id": r.id, "description": r.description, "runner_type": r.kind, "active": !r.paused, "is_shared": r.kind == InstanceType, "tags": tags}
	}
	var reason any
	if j.failureReason != "" {
		reason = j.failureReason
	}
	web := base + "/" + p.fullPath()
	return map[string]any{
		"object_kind": "build", "ref": pl.ref, "tag": false, "before_sha": "0000000000000000000000000000000000000000", "sha": pl.sha,
		"retries_count": 0, "build_id": j.id, "build_name": j.name, "build_stage": j.stage, "build_status": j.status,
		"build_created_at": timeHook(j.created), "build_started_at": timeHook(j.started), "build_finished_at": timeHook(j.finished),
		"build_duration": dur, "build_queued_duration": queued, "build_allow_failure": j.allowFailure, "build_failure_reason": reason,
		"pipeline_id": pl.id, "runner": runnerJ, "project_id": p.id, "project_name": p.group.fullPath + " / " + p.name,
		"user":        map[string]any{"id": pl.user.id, "name": pl.user.name, "username": pl.user.username, "avatar_url": nil, "email": "[REDACTED]"},
		"commit":      map[string]any{"id": pl.id, "name": nil, "sha": pl.sha, "message": "Simulated commit\n", "author_name": pl.user.name, "author_email": pl.user.username + "@example.com", "author_url": base + "/" + pl.user.username, "status": pl.status, "duration": nil, "started_at": nil, "finished_at": nil},
		"repository":  map[string]any{"name": p.name, "url": web + ".git", "description": "", "homepage": web, "git_http_url": web + ".git", "git_ssh_url": "git@gitlab.example.com:" + p.fullPath() + ".git", "visibility_level": 0},
		"project":     map[string]any{"id": p.id, "name": p.name, "description": "", "web_url": web, "avatar_url": nil, "git_ssh_url": "git@gitlab.example.com:" + p.fullPath() + ".git", "git_http_url": web + ".git", "namespace": p.group.name, "visibility_level": 0, "path_with_namespace": p.fullPath(), "default_branch": p.defaultBranch, "ci_config_path": ""},
		"environment": nil,
	}
}

// delivery is a queued Job Hook.
type delivery struct {
	Delivery
	url, token, hookUUID, instance, version string
}

// deliveries runs one worker per hook, so each hook gets its events in
// order; failures are recorded, never retried (GitLab retries only by
// disabling failing hooks, which is not modelled).
type deliveries struct {
	s      *Simulator
	mu     sync.Mutex
	queues map[int64]chan delivery
	log    []Delivery
	wg     sync.WaitGroup
	ctx    context.Context
	stop   context.CancelFunc
	// pending counts queued and in-flight deliveries (FlushWebhooks).
	pending int
}

func newDeliveries(s *Simulator) *deliveries {
	ctx, stop := context.WithCancel(context.Background())
	return &deliveries{s: s, queues: map[int64]chan delivery{}, ctx: ctx, stop: stop}
}

func (d *deliveries) enqueue(h *hook, dl delivery) {
	d.mu.Lock()
	defer d.mu.Unlock()
	q := d.queues[h.ID]
	if q == nil {
		q = make(chan delivery, 1024)
		d.queues[h.ID] = q
		d.wg.Add(1)
		go d.worker(q)
	}
	d.pending++
	select {
	case q <- dl:
	default:
		d.pending--
		d.log = append(d.log, Delivery{HookID: dl.HookID, EventUUID: dl.EventUUID, JobID: dl.JobID, Status: dl.Status, Error: "queue full: dropped"})
	}
}

func (d *deliveries) worker(q chan delivery) {
	defer d.wg.Done()
	for {
		select {
		case <-d.ctx.Done():
			return
		case dl := <-q:
			d.send(dl)
			d.mu.Lock()
			d.pending--
			d.mu.Unlock()
		}
	}
}

// send POSTs one delivery with GitLab's webhook headers.
func (d *deliveries) send(dl delivery) {
	req, err := http.NewRequestWithContext(d.ctx, http.MethodPost, dl.url, bytes.NewReader(dl.Payload))
	if err == nil {
		h := req.Header
		h.Set("Content-Type", "application/json")
		h.Set("User-Agent", "GitLab/"+dl.version)
		h.Set("X-Gitlab-Event", "Job Hook")
		h.Set("X-Gitlab-Webhook-UUID", dl.hookUUID)
		h.Set("X-Gitlab-Event-UUID", dl.EventUUID)
		h.Set("X-Gitlab-Instance", dl.instance)
		// GitLab 17.4+ sends an Idempotency-Key that stays the same when a
		// delivery is retried; each delivery here is sent once.
		h.Set("Idempotency-Key", uuid())
		if dl.token != "" {
			h.Set("X-Gitlab-Token", dl.token)
		}
		var resp *http.Response
		if resp, err = d.s.client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			_ = resp.Body.Close()
			dl.Response = resp.StatusCode
		}
	}
	if err != nil {
		dl.Error = err.Error()
		d.s.log.Warn("gitlab simulator: webhook delivery failed", "url", dl.url, "err", err)
	}
	d.mu.Lock()
	d.log = append(d.log, dl.Delivery)
	d.mu.Unlock()
}

// close stops the workers and waits for them.
func (d *deliveries) close() {
	d.stop()
	d.wg.Wait()
}

// Deliveries returns the deliveries made so far, in the order they ended.
func (s *Simulator) Deliveries() []Delivery {
	s.deliv.mu.Lock()
	defer s.deliv.mu.Unlock()
	return append([]Delivery(nil), s.deliv.log...)
}

// FlushWebhooks waits until every queued delivery was sent, or ctx ends.
func (s *Simulator) FlushWebhooks(ctx context.Context) error {
	for {
		s.deliv.mu.Lock()
		n := s.deliv.pending
		s.deliv.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
			return fmt.Errorf("flush webhooks: %d deliveries still queued: %w", n, ctx.Err())
		}
	}
}
