package gitlabsim

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Fault is an injected failure of the API (REST and runner API alike): a
// request whose method (empty: any) and path under /api/v4 (prefix; empty:
// any) match is answered with Status and GitLab's error body, after
// Latency. Status 0 only delays. A rule with Count applies to the next Count
// matching requests and is then spent; one with only Probability applies to
// each matching request with that probability until cleared.
type Fault struct {
	Method      string        `json:"method,omitempty"`
	PathPrefix  string        `json:"pathPrefix,omitempty"`
	Status      int           `json:"status,omitempty"`
	Message     string        `json:"message,omitempty"`
	Latency     time.Duration `json:"latency,omitempty"`
	Count       int           `json:"count,omitempty"`
	Probability float64       `json:"probability,omitempty"`
}

// InjectFault adds a fault rule.
func (s *Simulator) InjectFault(f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, &f)
}

// ClearFaults removes every fault rule.
func (s *Simulator) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = nil
}

// matchFaultLocked returns the first fault that fires for the request and
// spends it.
func (s *Simulator) matchFaultLocked(method, path string) *Fault {
	for i, f := range s.faults {
		if f.Method != "" && !strings.EqualFold(f.Method, method) || !strings.HasPrefix(path, f.PathPrefix) {
			continue
		}
		switch {
		case f.Count > 0:
			f.Count--
			if f.Count == 0 && f.Probability == 0 {
				s.faults = append(s.faults[:i], s.faults[i+1:]...)
			}
		case f.Probability > 0 && s.rng.Float64() < f.Probability:
		default:
			continue
		}
		c := *f
		return &c
	}
	return nil
}

// bucket is a credential's rate-limit window (one minute, GitLab's
// throttle period for the authenticated API).
type bucket struct {
	start time.Time
	used  int
}

// request is one API call being answered.
type request struct {
	w    http.ResponseWriter
	r    *http.Request
	path string   // under /api/v4, still escaped
	seg  []string // path segments, unescaped
	tok  *accessToken
	body map[string]any
}

func (q *request) param(name string) string {
	if v := q.r.URL.Query().Get(name); v != "" {
		return v
	}
	if q.body != nil {
		switch v := q.body[name].(type) {
		case string:
			return v
		case float64:
			return strconv.FormatFloat(v, 'f', -1, 64)
		case bool:
			return strconv.FormatBool(v)
		}
	}
	return ""
}

// readBody parses a JSON or form body (GitLab takes both) into q.body.
func (q *request) readBody() error {
	if q.r.Body == nil || q.r.Method == http.MethodGet {
		return nil
	}
	raw, err := io.ReadAll(io.LimitReader(q.r.Body, maxBody+1))
	if err != nil {
		return fmt.Errorf("read body: %w", err)
	}
	if len(raw) > maxBody {
		return fmt.Errorf("body over %d bytes", maxBody)
	}
	q.body = map[string]any{}
	if len(raw) == 0 {
		return nil
	}
	if strings.HasPrefix(q.r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
		vals, err := url.ParseQuery(string(raw))
		if err != nil {
			return fmt.Errorf("form body: %w", err)
		}
		for k, v := range vals {
			if strings.HasSuffix(k, "[]") {
				q.body[strings.TrimSuffix(k, "[]")] = anySlice(v)
			} else {
				q.body[k] = v[0]
			}
		}
		return nil
	}
	if err := json.Unmarshal(raw, &q.body); err != nil {
		return fmt.Errorf("JSON body: %w", err)
	}
	return nil
}

func anySlice(v []string) []any {
	out := make([]any, len(v))
	for i, x := range v {
		out[i] = x
	}
	return out
}

// serveAPI answers a request under /api/v4: faults first (a fault may stand
// for a proxy in front of GitLab), then the runner API, which authenticates
// with runner and job tokens, then the REST API.
func (s *Simulator) serveAPI(w http.ResponseWriter, r *http.Request, path string) {
	r.Body = http.MaxBytesReader(w, r.Body, maxTraceChunk+1)
	s.mu.Lock()
	f := s.matchFaultLocked(r.Method, path)
	s.mu.Unlock()
	if f != nil {
		if f.Latency > 0 {
			select {
			case <-time.After(f.Latency):
			case <-r.Context().Done():
				return
			}
		}
		if f.Status != 0 {
			msg := f.Message
			if msg == "" {
				msg = fmt.Sprintf("%d %s", f.Status, http.StatusText(f.Status))
			}
			writeMessage(w, f.Status, msg)
			return
		}
	}
	var seg []string
	for _, p := range strings.Split(strings.Trim(path, "/"), "/") {
		u, err := url.PathUnescape(p)
		if err != nil {
			writeMessage(w, http.StatusBadRequest, "400 Bad request - malformed path")
			return
		}
		seg = append(seg, u)
	}
	q := &request{w: w, r: r, path: path, seg: seg}
	if s.serveRunnerAPI(q) {
		return
	}
	if err := q.readBody(); err != nil {
		writeMessage(w, http.StatusBadRequest, "400 Bad request - "+err.Error())
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.authenticateLocked(q) {
		return
	}
	s.restLocked(q)
}

// credential reads a PRIVATE-TOKEN header or an OAuth-style Bearer token,
// the two ways client-go sends access tokens.
func credential(r *http.Request) string {
	if t := r.Header.Get("PRIVATE-TOKEN"); t != "" {
		return t
	}
	if a := r.Header.Get("Authorization"); strings.HasPrefix(a, "Bearer ") {
		return strings.TrimPrefix(a, "Bearer ")
	}
	return r.URL.Query().Get("private_token")
}

// authenticateLocked checks the credential (401 for a missing, unknown,
// revoked or expired token, as GitLab) and spends the rate-limit budget
// (429 once it is exhausted).
func (s *Simulator) authenticateLocked(q *request) bool {
	now := s.clock.Now()
	cred := credential(q.r)
	at := s.tokens[cred]
	if cred == "" || at == nil || at.revoked || (!at.expiresAt.IsZero() && !now.Before(at.expiresAt)) {
		writeMessage(q.w, http.StatusUnauthorized, "401 Unauthorized")
		return false
	}
	q.tok = at
	at.lastUsed = now
	key := fmt.Sprintf("token:%d", at.id)
	b := s.buckets[key]
	if b == nil || now.Sub(b.start) >= time.Minute {
		b = &bucket{start: now}
		s.buckets[key] = b
	}
	b.used++
	reset := b.start.Add(time.Minute)
	limit := s.cfg.RateLimit
	h := q.w.Header()
	h.Set("RateLimit-Limit", strconv.Itoa(limit))
	h.Set("RateLimit-Observed", strconv.Itoa(b.used))
	h.Set("RateLimit-Remaining", strconv.Itoa(max(0, limit-b.used)))
	h.Set("RateLimit-Reset", strconv.FormatInt(reset.Unix(), 10))
	h.Set("RateLimit-ResetTime", reset.UTC().Format(http.TimeFormat))
	if b.used > limit {
		h.Set("RateLimit-Name", "throttle_authenticated_api")
		h.Set("Retry-After", strconv.Itoa(max(1, int(reset.Sub(now).Seconds()+0.999))))
		h.Set("Content-Type", "text/plain")
		q.w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(q.w, "Retry later\n")
		return false
	}
	return true
}

// SetRateLimitUsed pre-spends a token's budget in the current window.
func (s *Simulator) SetRateLimitUsed(token string, used int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	at := s.tokens[token]
	if at == nil {
		return fmt.Errorf("no token %q", token)
	}
	s.buckets[fmt.Sprintf("token:%d", at.id)] = &bucket{start: s.clock.Now(), used: used}
	return nil
}

// requireScope answers 403 insufficient_scope, GitLab's answer to a token
// without any of the scopes an endpoint accepts.
func requireScope(q *request, scopes ...string) bool {
	if q.tok.has(scopes...) {
		return true
	}
	writeJSON(q.w, http.StatusForbidden, map[string]string{
		"error":             "insufficient_scope",
		"error_description": "The request requires higher privileges than provided by the access token.",
		"scope":             strings.Join(scopes, " "),
	})
	return false
}

// readScopes are the scopes that allow a GET; writes need api (and the
// narrower scopes some endpoints name).
func readScopes(extra ...string) []string { return append([]string{"api", "read_api"}, extra...) }

// paginate applies page and per_page (default 20, at most 100, as GitLab's
// offset pagination) and sets X-Page, X-Per-Page, X-Total, X-Total-Pages,
// X-Next-Page, X-Prev-Page and Link. It returns the slice bounds.
func (s *Simulator) paginate(q *request, total int) (int, int) {
	page, _ := strconv.Atoi(q.r.URL.Query().Get("page"))
	if page < 1 {
		page = 1
	}
	per, _ := strconv.Atoi(q.r.URL.Query().Get("per_page"))
	if per < 1 {
		per = 20
	}
	per = min(per, 100)
	pages := max(1, (total+per-1)/per)
	h := q.w.Header()
	h.Set("X-Page", strconv.Itoa(page))
	h.Set("X-Per-Page", strconv.Itoa(per))
	h.Set("X-Total", strconv.Itoa(total))
	h.Set("X-Total-Pages", strconv.Itoa(pages))
	next, prev := "", ""
	if page < pages {
		next = strconv.Itoa(page + 1)
	}
	if page > 1 {
		prev = strconv.Itoa(page - 1)
	}
	h.Set("X-Next-Page", next)
	h.Set("X-Prev-Page", prev)
	link := func(p int, rel string) string {
		u := *q.r.URL
		v := u.Query()
		v.Set("page", strconv.Itoa(p))
		v.Set("per_page", strconv.Itoa(per))
		u.RawQuery = v.Encode()
		return fmt.Sprintf("<%s%s>; rel=%q", s.baseURL(q.r), u.RequestURI(), rel)
	}
	var links []string
	if prev != "" {
		links = append(links, link(page-1, "prev"))
	}
	if next != "" {
		links = append(links, link(page+1, "next"))
	}
	links = append(links, link(1, "first"), link(pages, "last"))
	h.Set("Link", strings.Join(links, ", "))
	start := min(total, (page-1)*per)
	return start, min(total, start+per)
}

// baseURL is the configured instance URL or the request's scheme and host.
func (s *Simulator) baseURL(r *http.Request) string {
	if s.cfg.URL != "" {
		return strings.TrimRight(s.cfg.URL, "/")
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}
