package buildkitesim

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Webhook is a configured notification service: Buildkite posts each event
// named in Events (all job events when empty) to URL, authenticated with
// Token either as X-Buildkite-Token (plain) or, with Signed, as
// X-Buildkite-Signature: timestamp=<unix seconds>,signature=<hex
// HMAC-SHA256 of "<timestamp>.<body>" keyed by Token>.
type Webhook struct {
	URL    string   `json:"url"`
	Token  string   `json:"token"`
	Signed bool     `json:"signed"`
	Events []string `json:"events,omitempty"`
}

// Sign returns the X-Buildkite-Signature value for body at time ts.
func Sign(token string, ts time.Time, body []byte) string {
	stamp := strconv.FormatInt(ts.Unix(), 10)
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte(stamp + "."))
	m.Write(body)
	return "timestamp=" + stamp + ",signature=" + hex.EncodeToString(m.Sum(nil))
}

// VerifySignature checks an X-Buildkite-Signature header against body: the
// HMAC must match and the timestamp be within maxAge of now (replays of an
// old delivery are refused).
func VerifySignature(token, header string, body []byte, now time.Time, maxAge time.Duration) error {
	var stamp, sig string
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "timestamp":
			stamp = v
		case "signature":
			sig = v
		}
	}
	if stamp == "" || sig == "" {
		return errors.New("signature header lacks timestamp or signature")
	}
	secs, err := strconv.ParseInt(stamp, 10, 64)
	if err != nil {
		return fmt.Errorf("signature timestamp: %w", err)
	}
	if d := now.Sub(time.Unix(secs, 0)); d > maxAge || d < -maxAge {
		return fmt.Errorf("signature timestamp is %s away from now", d.Round(time.Second))
	}
	want := Sign(token, time.Unix(secs, 0), body)
	if subtle.ConstantTimeCompare([]byte(want), []byte("timestamp="+stamp+",signature="+sig)) != 1 {
		return errors.New("signature does not match")
	}
	return nil
}

// hookSet delivers events in order, one goroutine, outside the state lock.
type hookSet struct {
	s      *Simulator
	client *http.Client
	mu     sync.Mutex
	hooks  []Webhook
	queue  chan delivery
	done   chan struct{}
	once   sync.Once
	// Delivered records every delivery's event and answer, for tests.
	delivered []Delivery
}

// Delivery is one webhook delivery made.
type Delivery struct {
	URL    string
	Event  string
	Status int
	Err    string
}

type delivery struct {
	hook  Webhook
	event string
	body  []byte
}

func newHookSet(s *Simulator) *hookSet {
	h := &hookSet{s: s, client: &http.Client{Timeout: 10 * time.Second}, queue: make(chan delivery, 1024), done: make(chan struct{})}
	go h.run()
	return h
}

func (h *hookSet) close() {
	h.once.Do(func() { close(h.done) })
}

func (h *hookSet) run() {
	for {
		select {
		case <-h.done:
			return
		case d := <-h.queue:
			h.deliver(d)
		}
	}
}

func (h *hookSet) deliver(d delivery) {
	req, err := http.NewRequest(http.MethodPost, d.hook.URL, bytes.NewReader(d.body))
	rec := Delivery{URL: d.hook.URL, Event: d.event}
	if err == nil {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Buildkite-Event", d.event)
		if d.hook.Signed {
			req.Header.Set("X-Buildkite-Signature", Sign(d.hook.Token, h.s.clock.Now(), d.body))
		} else {
			req.Header.Set("X-Buildkite-Token", d.hook.Token)
		}
		var resp *http.Response
		if resp, err = h.client.Do(req); err == nil {
			rec.Status = resp.StatusCode
			_ = resp.Body.Close()
		}
	}
	if err != nil {
		rec.Err = err.Error()
		h.s.log.Warn("webhook delivery failed", "url", d.hook.URL, "event", d.event, "err", err)
	}
	h.mu.Lock()
	h.delivered = append(h.delivered, rec)
	h.mu.Unlock()
}

// AddWebhook configures a notification service.
func (s *Simulator) AddWebhook(w Webhook) {
	s.hooks.mu.Lock()
	defer s.hooks.mu.Unlock()
	s.hooks.hooks = append(s.hooks.hooks, w)
}

// Deliveries returns the deliveries made so far.
func (s *Simulator) Deliveries() []Delivery {
	s.hooks.mu.Lock()
	defer s.hooks.mu.Unlock()
	return append([]Delivery(nil), s.hooks.delivered...)
}

// enqueueLocked renders event's payload for j (under the state lock, so it
// is the state at the event) and queues it for every webhook that wants it.
// The payload is Buildkite's: event, job (the REST job), build, pipeline
// and sender.
func (h *hookSet) enqueueLocked(event string, j *job) {
	h.mu.Lock()
	hooks := append([]Webhook(nil), h.hooks...)
	h.mu.Unlock()
	if len(hooks) == 0 {
		return
	}
	s := h.s
	body, err := json.Marshal(map[string]any{
		"event":    event,
		"job":      s.restJobLocked(j),
		"build":    s.restBuildLocked(j.build, false),
		"pipeline": s.restPipelineLocked(j.build.pipeline),
		"sender":   map[string]any{"id": s.org.id, "name": "HyperFleet simulator"},
	})
	if err != nil {
		s.log.Error("webhook payload", "err", err)
		return
	}
	for _, w := range hooks {
		if len(w.Events) > 0 && !contains(w.Events, event) {
			continue
		}
		select {
		case h.queue <- delivery{hook: w, event: event, body: body}:
		default:
			s.log.Warn("webhook queue full; delivery dropped", "event", event)
		}
	}
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// RemoveWebhooks removes every webhook (a receiver that moved is added
// again).
func (s *Simulator) RemoveWebhooks() {
	s.hooks.mu.Lock()
	defer s.hooks.mu.Unlock()
	s.hooks.hooks = nil
}
