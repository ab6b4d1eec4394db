package github

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// scripted answers requests with queued responses and counts calls.
type scripted struct {
	answers []func(*http.Request) *http.Response
	calls   int
}

func (s *scripted) RoundTrip(req *http.Request) (*http.Response, error) {
	s.calls++
	if len(s.answers) == 0 {
		return respond(req, 200, nil, `{}`), nil
	}
	a := s.answers[0]
	s.answers = s.answers[1:]
	return a(req), nil
}

func respond(req *http.Request, code int, h http.Header, body string) *http.Response {
	if h == nil {
		h = http.Header{}
	}
	return &http.Response{StatusCode: code, Header: h, Body: io.NopCloser(strings.NewReader(body)), Request: req}
}

func rateHeaders(limit, remaining int, reset time.Time) http.Header {
	h := http.Header{}
	h.Set("X-Ratelimit-Limit", strconv.Itoa(limit))
	h.Set("X-Ratelimit-Remaining", strconv.Itoa(remaining))
	h.Set("X-Ratelimit-Reset", strconv.FormatInt(reset.Unix(), 10))
	return h
}

func answer(code int, h http.Header, body string) func(*http.Request) *http.Response {
	return func(req *http.Request) *http.Response { return respond(req, code, h, body) }
}

func newGate(t *testing.T, next http.RoundTripper) (*rateGate, *clocktesting.FakeClock) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	return &rateGate{next: next, clock: clk, reserve: 100}, clk
}

func do(t *testing.T, g *rateGate, cleanup bool) error {
	t.Helper()
	ctx := context.Background()
	if cleanup {
		ctx = withCleanup(ctx)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://api.github.test/repos/o/r/actions/runners", nil)
	resp, err := g.RoundTrip(req)
	if resp != nil {
		_ = resp.Body.Close()
	}
	return err
}

func wantRateLimit(t *testing.T, err error, at time.Time, secondary, reserve bool) {
	t.Helper()
	var rl *workload.RateLimitError
	if !errors.As(err, &rl) || !errors.Is(err, workload.ErrRateLimited) {
		t.Fatalf("got %v, want a rate-limit error", err)
	}
	if !rl.RetryAt.Equal(at) || rl.Secondary != secondary || rl.Reserve != reserve {
		t.Fatalf("got %+v, want retry at %s secondary=%v reserve=%v", rl, at, secondary, reserve)
	}
}

func TestRateGatePrimaryBudgetSpent(t *testing.T) {
	next := &scripted{}
	g, clk := newGate(t, next)
	reset := clk.Now().Add(20 * time.Minute)
	next.answers = append(next.answers, answer(403, rateHeaders(5000, 0, reset), `{"message":"API rate limit exceeded for installation ID 1."}`))
	if err := do(t, g, false); err != nil {
		t.Fatalf("the first call must go out: %v", err)
	}
	// Spent: every call, cleanup or not, waits for reset without a request.
	wantRateLimit(t, do(t, g, false), reset, false, false)
	wantRateLimit(t, do(t, g, true), reset, false, false)
	if next.calls != 1 {
		t.Fatalf("%d requests reached GitHub, want 1", next.calls)
	}
	clk.SetTime(reset)
	if err := do(t, g, false); err != nil {
		t.Fatalf("after reset: %v", err)
	}
	if next.calls != 2 {
		t.Fatalf("%d requests reached GitHub, want 2", next.calls)
	}
}

func TestRateGateReserveKeptForCleanup(t *testing.T) {
	next := &scripted{}
	g, clk := newGate(t, next)
	reset := clk.Now().Add(time.Hour)
	next.answers = append(next.answers, answer(200, rateHeaders(5000, 100, reset), `{}`))
	if err := do(t, g, false); err != nil {
		t.Fatal(err)
	}
	wantRateLimit(t, do(t, g, false), reset, false, true)
	if err := do(t, g, true); err != nil {
		t.Fatalf("a cleanup call must spend the reserve: %v", err)
	}
	if next.calls != 2 {
		t.Fatalf("%d requests reached GitHub, want 2", next.calls)
	}
}

func TestRateGateReserveIsAtMostATenthOfTheBudget(t *testing.T) {
	next := &scripted{}
	g, clk := newGate(t, next)
	reset := clk.Now().Add(time.Hour)
	// A 60-request budget keeps 6 in reserve, not 100.
	next.answers = append(next.answers, answer(200, rateHeaders(60, 7, reset), `{}`), answer(200, rateHeaders(60, 6, reset), `{}`))
	for i := range 2 {
		if err := do(t, g, false); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	wantRateLimit(t, do(t, g, false), reset, false, true)
}

func TestRateGateSecondaryRetryAfter(t *testing.T) {
	next := &scripted{}
	g, clk := newGate(t, next)
	h := rateHeaders(5000, 4000, clk.Now().Add(time.Hour))
	h.Set("Retry-After", "90")
	next.answers = append(next.answers, answer(403, h, `{"message":"You have exceeded a secondary rate limit."}`))
	_ = do(t, g, false)
	at := clk.Now().Add(90 * time.Second)
	wantRateLimit(t, do(t, g, true), at, true, false)
	clk.Step(89 * time.Second)
	wantRateLimit(t, do(t, g, false), at, true, false)
	clk.Step(time.Second)
	if err := do(t, g, false); err != nil {
		t.Fatalf("after retry-after: %v", err)
	}
}

func TestRateGateSecondaryWithoutRetryAfterBacksOffExponentially(t *testing.T) {
	next := &scripted{}
	g, clk := newGate(t, next)
	reset := clk.Now().Add(time.Hour)
	limited := answer(429, rateHeaders(5000, 4000, reset), `{"message":"You have exceeded a secondary rate limit. Please wait a few minutes before you try again."}`)
	// No retry-after and budget left: at least a minute, doubling.
	for i, wait := range []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute} {
		next.answers = append(next.answers, limited)
		_ = do(t, g, false)
		wantRateLimit(t, do(t, g, false), clk.Now().Add(wait), true, false)
		clk.Step(wait)
		if i == 2 {
			break
		}
	}
	// A success resets the backoff.
	next.answers = append(next.answers, answer(200, rateHeaders(5000, 3999, reset), `{}`), limited)
	if err := do(t, g, false); err != nil {
		t.Fatal(err)
	}
	_ = do(t, g, false)
	wantRateLimit(t, do(t, g, false), clk.Now().Add(time.Minute), true, false)
}

func TestRateGateSecondaryWithSpentBudgetWaitsForReset(t *testing.T) {
	next := &scripted{}
	g, clk := newGate(t, next)
	reset := clk.Now().Add(7 * time.Minute)
	next.answers = append(next.answers, answer(403, rateHeaders(5000, 0, reset), `{"message":"You have exceeded a secondary rate limit."}`))
	_ = do(t, g, false)
	wantRateLimit(t, do(t, g, false), reset, false, false)
}

func TestRetryAfterHeaderForms(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, c := range []struct {
		v    string
		want time.Duration
	}{
		{"30", 30 * time.Second},
		{now.Add(2 * time.Minute).UTC().Format(http.TimeFormat), 2 * time.Minute},
		{"soon", secondaryBackoffBase},
	} {
		if got := retryAfter(c.v, now); got != c.want {
			t.Errorf("retryAfter(%q) = %s, want %s", c.v, got, c.want)
		}
	}
}
