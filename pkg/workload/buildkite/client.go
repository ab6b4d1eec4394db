package buildkite

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	bk "github.com/buildkite/go-buildkite/v4"
	"k8s.io/utils/clock"

	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// cleanupReserve is how much of the minute's REST budget only cleanup calls
// (token deletion, stopping agents, cancelling builds) may spend, so that a
// busy minute of demand reads never keeps a VM's credential alive.
const cleanupReserve = 10

// Cleanup calls are marked as every platform's (workload.WithCleanup).
var withCleanup, isCleanup = workload.WithCleanup, workload.IsCleanup

// rateGate sits under go-buildkite as an http.RoundTripper. It reads the
// RateLimit-Remaining and RateLimit-Reset headers Buildkite sends on every
// REST answer (a budget per organization and minute) and refuses a request
// locally with a *workload.RateLimitError when Buildkite would refuse it
// anyway, or when only the cleanup reserve is left and the call is not a
// cleanup. A 429 answer becomes that error too: go-buildkite retries a GET
// answered 429 with an exponential backoff of up to 15 minutes, and a
// Provider never waits out a rate limit (workload.Provider).
type rateGate struct {
	next  http.RoundTripper
	clock clock.PassiveClock
	// organization is the budget's account in the metrics.
	organization string

	mu        sync.Mutex
	known     bool
	remaining int
	reset     time.Time
}

func (g *rateGate) RoundTrip(req *http.Request) (*http.Response, error) {
	now := g.clock.Now()
	g.mu.Lock()
	if g.known && now.Before(g.reset) {
		switch {
		case g.remaining <= 0:
			g.mu.Unlock()
			return nil, &workload.RateLimitError{RetryAt: g.reset}
		case g.remaining <= cleanupReserve && !isCleanup(req.Context()):
			g.mu.Unlock()
			return nil, &workload.RateLimitError{RetryAt: g.reset, Reserve: true}
		}
	}
	g.mu.Unlock()
	resp, err := g.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	remaining, rerr := strconv.Atoi(resp.Header.Get("RateLimit-Remaining"))
	secs, serr := strconv.Atoi(resp.Header.Get("RateLimit-Reset"))
	if rerr == nil && serr == nil {
		g.mu.Lock()
		g.known, g.remaining, g.reset = true, remaining, now.Add(time.Duration(secs)*time.Second)
		g.mu.Unlock()
		metrics.ObserveRemaining(g.organization, remaining)
	}
	if resp.StatusCode == http.StatusTooManyRequests {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
		retry := now.Add(time.Minute)
		if serr == nil {
			retry = now.Add(time.Duration(secs) * time.Second)
		}
		return nil, &workload.RateLimitError{RetryAt: retry}
	}
	return resp, nil
}

// apiError turns a go-buildkite error into the workload sentinels: 401 and
// 403 (a missing scope) are ErrUnauthorized, 404 ErrNotFound, 400 and 422
// ErrInvalidRequest, 5xx and transport failures ErrUnavailable; a rate
// limit stays a *workload.RateLimitError. what says which call failed.
func apiError(what string, err error) error {
	if err == nil {
		return nil
	}
	var rl *workload.RateLimitError
	if errors.As(err, &rl) {
		return rl
	}
	var er *bk.ErrorResponse
	if errors.As(err, &er) && er.Response != nil {
		msg := er.Message
		code := er.Response.StatusCode
		switch code {
		case http.StatusUnauthorized, http.StatusForbidden:
			return fmt.Errorf("buildkite: %s: %d %s: %w", what, code, msg, workload.ErrUnauthorized)
		case http.StatusNotFound:
			return fmt.Errorf("buildkite: %s: %w", what, workload.ErrNotFound)
		case http.StatusBadRequest, http.StatusUnprocessableEntity:
			return fmt.Errorf("buildkite: %s: %d %s: %w", what, code, msg, workload.ErrInvalidRequest)
		default:
			return fmt.Errorf("buildkite: %s: %d %s: %w", what, code, msg, workload.ErrUnavailable)
		}
	}
	// No answer (a timeout, a refused connection) or one that did not
	// decode: Buildkite could not answer, and the caller retries.
	return fmt.Errorf("buildkite: %s: %w: %w", what, workload.ErrUnavailable, err)
}

// statusOf is the HTTP status of a go-buildkite error; 0 when it is not an
// answer of the API.
func statusOf(err error) int {
	var er *bk.ErrorResponse
	if errors.As(err, &er) && er.Response != nil {
		return er.Response.StatusCode
	}
	return 0
}
