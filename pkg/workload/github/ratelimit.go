package github

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// Secondary-limit backoff when GitHub gives no retry-after and the primary
// budget is not exhausted: at least a minute (GitHub's guidance), doubling
// with each consecutive secondary limit.
const (
	secondaryBackoffBase = time.Minute
	secondaryBackoffMax  = 30 * time.Minute
)

// Cleanup calls (deregistration, cancellation), which may spend the
// reserved part of the budget, are marked as every platform's
// (workload.WithCleanup).
var withCleanup, isCleanup = workload.WithCleanup, workload.IsCleanup

// RateSnapshot is the rate-limit state last reported by GitHub.
type RateSnapshot struct {
	Limit, Remaining int
	Reset            time.Time
	// BlockedUntil is set while a secondary limit holds every call back.
	BlockedUntil time.Time
}

// rateGate sits under go-github as an http.RoundTripper. It reads GitHub's
// rate-limit headers from every response and, before a request goes out,
// refuses it with a *workload.RateLimitError when GitHub would refuse it
// anyway: the budget is spent (until reset), a secondary limit is in force
// (retry-after, or the documented fallback), or only the reserve for
// cleanup calls is left and the call is not a cleanup. Refusing locally
// keeps HyperFleet from hammering an API that has already said no, which
// GitHub punishes with longer blocks.
type rateGate struct {
	next    http.RoundTripper
	clock   clock.PassiveClock
	reserve int
	// observe, when set, sees every state change (metrics).
	observe func(RateSnapshot)

	mu      sync.Mutex
	known   bool
	limit   int
	remain  int
	reset   time.Time
	blocked time.Time
	strikes int
}

// check returns the error a request must fail with now, or nil.
func (g *rateGate) check(cleanup bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.clock.Now()
	if now.Before(g.blocked) {
		return &workload.RateLimitError{RetryAt: g.blocked, Secondary: true}
	}
	if !g.known || !now.Before(g.reset) {
		return nil
	}
	if g.remain <= 0 {
		return &workload.RateLimitError{RetryAt: g.reset}
	}
	if !cleanup && g.remain <= g.reserveLocked() {
		return &workload.RateLimitError{RetryAt: g.reset, Reserve: true}
	}
	return nil
}

// reserveLocked is the configured reserve, at most a tenth of the budget
// so that a small budget still serves new runners.
func (g *rateGate) reserveLocked() int {
	if g.limit > 0 {
		return min(g.reserve, g.limit/10)
	}
	return g.reserve
}

// RoundTrip implements http.RoundTripper.
func (g *rateGate) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := g.check(isCleanup(req.Context())); err != nil {
		return nil, err
	}
	resp, err := g.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	g.record(resp)
	return resp, nil
}

// record updates the state from a response.
func (g *rateGate) record(resp *http.Response) {
	h := resp.Header
	limit, errL := strconv.Atoi(h.Get("X-Ratelimit-Limit"))
	remain, errR := strconv.Atoi(h.Get("X-Ratelimit-Remaining"))
	reset, errT := strconv.ParseInt(h.Get("X-Ratelimit-Reset"), 10, 64)
	limited := resp.StatusCode == http.StatusTooManyRequests ||
		resp.StatusCode == http.StatusForbidden && (errR == nil && remain == 0 || h.Get("Retry-After") != "" || secondaryMessage(resp))

	g.mu.Lock()
	now := g.clock.Now()
	if errL == nil && errR == nil && errT == nil {
		g.known, g.limit, g.remain, g.reset = true, limit, remain, time.Unix(reset, 0)
	}
	switch {
	case !limited:
		if resp.StatusCode < 400 {
			g.strikes = 0
		}
	case h.Get("Retry-After") != "":
		g.blocked = now.Add(retryAfter(h.Get("Retry-After"), now))
		g.strikes++
	case g.known && g.remain <= 0 && now.Before(g.reset):
		// Primary budget spent: check refuses until reset.
	default:
		d := secondaryBackoffBase << min(g.strikes, 5)
		g.blocked = now.Add(min(d, secondaryBackoffMax))
		g.strikes++
	}
	snap := RateSnapshot{Limit: g.limit, Remaining: g.remain, Reset: g.reset, BlockedUntil: g.blocked}
	g.mu.Unlock()
	if g.observe != nil {
		g.observe(snap)
	}
}

// snapshot returns the current state.
func (g *rateGate) snapshot() RateSnapshot {
	g.mu.Lock()
	defer g.mu.Unlock()
	return RateSnapshot{Limit: g.limit, Remaining: g.remain, Reset: g.reset, BlockedUntil: g.blocked}
}

// retryAfter parses a retry-after header: delay seconds or an HTTP date.
func retryAfter(v string, now time.Time) time.Duration {
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return secondaryBackoffBase
}

// secondaryMessage reports whether a 403 body names a secondary (abuse)
// limit, restoring the body for go-github to read.
func secondaryMessage(resp *http.Response) bool {
	if resp.Body == nil {
		return false
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return false
	}
	s := strings.ToLower(string(body))
	return strings.Contains(s, "secondary rate limit") || strings.Contains(s, "abuse")
}
