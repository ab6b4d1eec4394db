package githubsim

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Webhook is a webhook endpoint receiving workflow_job deliveries.
type Webhook struct {
	// ID is the hook id (X-GitHub-Hook-ID); generated when zero.
	ID int64 `json:"id"`
	// URL receives the POSTs.
	URL string `json:"url"`
	// Secret signs the deliveries (never shown in State).
	Secret string `json:"-"`
	// Scope limits deliveries to an owner, owner/repo or enterprises/<slug>
	// (the repositories of its organizations); empty: all.
	Scope string `json:"scope,omitempty"`
}

// Delivery is one entry of the delivery log. Payload is the exact body
// that was (or would have been) sent.
type Delivery struct {
	// ID is the delivery GUID (X-GitHub-Delivery); a redelivery keeps it.
	ID         string `json:"id"`
	HookID     int64  `json:"hookID"`
	URL        string `json:"url"`
	Event      string `json:"event"`
	Action     string `json:"action"`
	JobID      int64  `json:"jobID"`
	RunID      int64  `json:"runID"`
	Redelivery bool   `json:"redelivery"`
	// Dropped deliveries were lost by fault injection and never sent.
	Dropped bool `json:"dropped,omitempty"`
	// Pending is true until the delivery has been attempted.
	Pending     bool            `json:"pending,omitempty"`
	StatusCode  int             `json:"statusCode,omitempty"`
	Error       string          `json:"error,omitempty"`
	Duration    time.Duration   `json:"duration,omitempty"`
	DeliveredAt time.Time       `json:"deliveredAt,omitzero"`
	Payload     json.RawMessage `json:"payload"`
}

// hookSet owns the endpoints, the delivery log and one delivery worker
// per endpoint. It has its own lock: deliveries are attempted without the
// simulator's state lock, and the state lock may be held while queueing
// (never the other way round).
type hookSet struct {
	s       *Simulator
	mu      sync.Mutex
	cond    *sync.Cond
	closed  bool
	hooks   []*hookWorker
	log     []*Delivery
	nextID  int64
	pending int
	// dropNext and dropRate lose deliveries (fault injection).
	dropNext int
	dropRate float64
}

type hookWorker struct {
	hook   Webhook
	queue  []*Delivery
	active bool
}

func newHookSet(s *Simulator) *hookSet {
	h := &hookSet{s: s, nextID: 400_000_000}
	h.cond = sync.NewCond(&h.mu)
	return h
}

func (h *hookSet) close() {
	h.mu.Lock()
	h.closed = true
	h.cond.Broadcast()
	h.mu.Unlock()
}

// AddWebhook registers an endpoint and returns it with its id.
func (s *Simulator) AddWebhook(w Webhook) (Webhook, error) {
	u, err := url.Parse(w.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Webhook{}, fmt.Errorf("webhook url %q must be an absolute http(s) URL", w.URL)
	}
	h := s.hooks
	h.mu.Lock()
	defer h.mu.Unlock()
	if w.ID == 0 {
		h.nextID++
		w.ID = h.nextID
	}
	for _, hw := range h.hooks {
		if hw.hook.ID == w.ID {
			return Webhook{}, fmt.Errorf("webhook %d exists", w.ID)
		}
	}
	hw := &hookWorker{hook: w}
	h.hooks = append(h.hooks, hw)
	go h.work(hw)
	return w, nil
}

// RemoveWebhook unregisters an endpoint; queued deliveries to it are
// abandoned.
func (s *Simulator) RemoveWebhook(id int64) bool {
	h := s.hooks
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, hw := range h.hooks {
		if hw.hook.ID == id {
			h.pending -= len(hw.queue)
			for _, d := range hw.queue {
				d.Pending, d.Error = false, "webhook removed"
			}
			hw.queue = nil
			h.hooks = append(h.hooks[:i], h.hooks[i+1:]...)
			h.cond.Broadcast()
			return true
		}
	}
	return false
}

// Webhooks lists the endpoints (without secrets).
func (s *Simulator) Webhooks() []Webhook {
	h := s.hooks
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Webhook, 0, len(h.hooks))
	for _, hw := range h.hooks {
		w := hw.hook
		w.Secret = ""
		out = append(out, w)
	}
	return out
}

// DropWebhooks makes the next n deliveries, and then each delivery with
// probability p, get lost (logged as dropped, never sent), simulating
// webhooks that never arrive. DropWebhooks(0, 0) stops dropping.
func (s *Simulator) DropWebhooks(n int, p float64) {
	h := s.hooks
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dropNext, h.dropRate = n, p
}

// emitLocked queues a workflow_job delivery about j to every endpoint
// whose scope covers the job's repository. The payload is rendered now,
// so it shows the job as it was at the event.
func (s *Simulator) emitLocked(j *job, action string) {
	payload := s.workflowJobPayload(j, action)
	raw, err := json.Marshal(payload)
	if err != nil {
		s.log.Error("encode webhook payload", "err", err)
		return
	}
	rp := j.run.repo
	h := s.hooks
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, hw := range h.hooks {
		if sc := hw.hook.Scope; sc != "" && !strings.EqualFold(sc, rp.owner.login) && !strings.EqualFold(sc, rp.fullName()) &&
			(s.enterpriseOf(rp.owner) == nil || !strings.EqualFold(sc, "enterprises/"+s.enterpriseOf(rp.owner).login)) {
			continue
		}
		d := &Delivery{ID: s.newGUID(), HookID: hw.hook.ID, URL: hw.hook.URL, Event: "workflow_job", Action: action, JobID: j.id, RunID: j.run.id, Payload: raw}
		h.log = append(h.log, d)
		if h.dropNext > 0 || (h.dropRate > 0 && s.rng.Float64() < h.dropRate) {
			if h.dropNext > 0 {
				h.dropNext--
			}
			d.Dropped, d.Error = true, "dropped by fault injection"
			s.countFaultLocked("webhook-drop")
			continue
		}
		h.enqueueLocked(hw, d)
	}
}

func (h *hookSet) enqueueLocked(hw *hookWorker, d *Delivery) {
	d.Pending = true
	hw.queue = append(hw.queue, d)
	h.pending++
	h.cond.Broadcast()
}

// workflowJobPayload renders the workflow_job event body.
func (s *Simulator) workflowJobPayload(j *job, action string) map[string]any {
	rp := j.run.repo
	p := map[string]any{
		"action":       action,
		"workflow_job": s.jobJSON(j),
		"repository":   s.repoJSON(rp),
		"sender":       s.accountJSON(s.owners[strings.ToLower(s.cfg.Sender)]),
	}
	if rp.owner.org {
		p["organization"] = s.orgJSON(rp.owner)
	}
	if e := s.enterpriseOf(rp.owner); e != nil {
		// GitHub names the enterprise of an organization that has one.
		p["enterprise"] = s.enterpriseJSON(e)
	}
	if in := s.installationFor(rp.owner); in != nil {
		p["installation"] = map[string]any{"id": in.id, "node_id": nodeID("IntegrationInstallation", in.id)}
	}
	return p
}

// work delivers hw's queue in order, one at a time: GitHub delivers the
// events of a job in order and does not retry failures.
func (h *hookSet) work(hw *hookWorker) {
	for {
		h.mu.Lock()
		for !h.closed && len(hw.queue) == 0 && h.has(hw) {
			h.cond.Wait()
		}
		if h.closed || !h.has(hw) {
			h.mu.Unlock()
			return
		}
		d := hw.queue[0]
		hw.queue = hw.queue[1:]
		hw.active = true
		hook := hw.hook
		h.mu.Unlock()

		code, dur, err := h.s.deliver(hook, d)

		h.s.mu.Lock()
		now := h.s.clock.Now()
		h.s.mu.Unlock()
		h.mu.Lock()
		hw.active = false
		d.Pending, d.StatusCode, d.Duration, d.DeliveredAt = false, code, dur, now
		if err != nil {
			d.Error = err.Error()
		} else if code < 200 || code > 299 {
			d.Error = fmt.Sprintf("endpoint answered %d", code)
		}
		if d.Error != "" {
			// GitHub does not retry; neither does the simulator.
			h.s.log.Warn("webhook delivery failed", "delivery", d.ID, "url", hook.URL, "action", d.Action, "job", d.JobID, "err", d.Error)
		}
		h.pending--
		h.cond.Broadcast()
		h.mu.Unlock()
	}
}

func (h *hookSet) has(hw *hookWorker) bool {
	for _, x := range h.hooks {
		if x == hw {
			return true
		}
	}
	return false
}

// deliver POSTs one delivery with GitHub's headers and signatures.
func (s *Simulator) deliver(hook Webhook, d *Delivery) (int, time.Duration, error) {
	req, err := http.NewRequest(http.MethodPost, hook.URL, bytes.NewReader(d.Payload))
	if err != nil {
		return 0, 0, err
	}
	target, targetID := "repository", int64(0)
	var payload struct {
		Repository struct {
			ID    int64 `json:"id"`
			Owner struct {
				ID   int64  `json:"id"`
				Type string `json:"type"`
			} `json:"owner"`
		} `json:"repository"`
	}
	_ = json.Unmarshal(d.Payload, &payload)
	targetID = payload.Repository.ID
	if payload.Repository.Owner.Type == "Organization" {
		target, targetID = "organization", payload.Repository.Owner.ID
	}
	h := req.Header
	h.Set("Content-Type", "application/json")
	h.Set("Accept", "*/*")
	h.Set("User-Agent", "GitHub-Hookshot/"+hookshotVersion)
	h.Set("X-GitHub-Event", d.Event)
	h.Set("X-GitHub-Delivery", d.ID)
	h.Set("X-GitHub-Hook-ID", strconv.FormatInt(hook.ID, 10))
	h.Set("X-GitHub-Hook-Installation-Target-Type", target)
	h.Set("X-GitHub-Hook-Installation-Target-ID", strconv.FormatInt(targetID, 10))
	if hook.Secret != "" {
		h.Set("X-Hub-Signature-256", "sha256="+hmacHex(sha256.New, hook.Secret, d.Payload))
		h.Set("X-Hub-Signature", "sha1="+hmacHex(sha1.New, hook.Secret, d.Payload))
	}
	start := time.Now()
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, time.Since(start), err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return resp.StatusCode, time.Since(start), nil
}

// hookshotVersion is the short hex version in GitHub's User-Agent.
const hookshotVersion = "4b2d0f3"

// SignPayload returns the X-Hub-Signature-256 value for body.
func SignPayload(secret string, body []byte) string {
	return "sha256=" + hmacHex(sha256.New, secret, body)
}

func hmacHex(h func() hash.Hash, secret string, body []byte) string {
	m := hmac.New(h, []byte(secret))
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// Deliveries returns the delivery log, oldest first.
func (s *Simulator) Deliveries() []Delivery {
	h := s.hooks
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Delivery, 0, len(h.log))
	for _, d := range h.log {
		out = append(out, *d)
	}
	return out
}

// Redeliver sends a logged delivery again (same GUID, Redelivery true),
// like "Redeliver" in GitHub's UI or the redeliveries API. Deliveries
// are never retried on their own.
func (s *Simulator) Redeliver(id string) (Delivery, error) {
	h := s.hooks
	h.mu.Lock()
	defer h.mu.Unlock()
	var orig *Delivery
	for i := len(h.log) - 1; i >= 0; i-- {
		if h.log[i].ID == id {
			orig = h.log[i]
			break
		}
	}
	if orig == nil {
		return Delivery{}, fmt.Errorf("no delivery %s", id)
	}
	for _, hw := range h.hooks {
		if hw.hook.ID == orig.HookID {
			d := &Delivery{ID: orig.ID, HookID: orig.HookID, URL: hw.hook.URL, Event: orig.Event, Action: orig.Action, JobID: orig.JobID, RunID: orig.RunID,
				Redelivery: true, Payload: orig.Payload}
			h.log = append(h.log, d)
			h.enqueueLocked(hw, d)
			return *d, nil
		}
	}
	return Delivery{}, fmt.Errorf("webhook %d of delivery %s no longer exists", orig.HookID, id)
}

// FlushWebhooks waits until every queued delivery has been attempted.
func (s *Simulator) FlushWebhooks(ctx context.Context) error {
	h := s.hooks
	for {
		h.mu.Lock()
		n, closed := h.pending, h.closed
		h.mu.Unlock()
		if n == 0 || closed {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), fmt.Errorf("%d webhook deliveries still pending", n))
		case <-time.After(2 * time.Millisecond):
		}
	}
}
