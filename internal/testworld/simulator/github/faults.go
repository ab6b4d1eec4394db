package githubsim

import (
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Faults are injected failures of the REST API and of webhook delivery.
// Request rules match a method (empty: any) and a path prefix relative to
// the API root, without /api/v3 (e.g. "/orgs/octo-org/actions/runners";
// empty: any path). A rule with Count applies to the next Count matching
// requests and is then spent; a rule with only Probability applies to each
// matching request with that probability, until cleared.
type Faults struct {
	Errors          []ErrorFault          `json:"errors,omitempty"`
	SecondaryLimits []SecondaryLimitFault `json:"secondaryLimits,omitempty"`
	Webhooks        WebhookFaults         `json:"webhooks,omitzero"`
}

// ErrorFault answers matching requests with an error status.
type ErrorFault struct {
	Method      string  `json:"method,omitempty"`
	PathPrefix  string  `json:"pathPrefix,omitempty"`
	Status      int     `json:"status"`
	Message     string  `json:"message,omitempty"`
	Count       int     `json:"count,omitempty"`
	Probability float64 `json:"probability,omitempty"`
}

// SecondaryLimitFault answers matching requests with GitHub's secondary
// rate limit error.
type SecondaryLimitFault struct {
	Method      string  `json:"method,omitempty"`
	PathPrefix  string  `json:"pathPrefix,omitempty"`
	Count       int     `json:"count,omitempty"`
	Probability float64 `json:"probability,omitempty"`
	// Status is 403 (default) or 429.
	Status int `json:"status,omitempty"`
	// RetryAfter sets the retry-after header (whole seconds); zero sends
	// none, leaving clients to GitHub's documented fallback.
	RetryAfter Duration `json:"retryAfter,omitempty"`
	// ZeroRemaining reports x-ratelimit-remaining: 0 with the response,
	// which tells clients to wait until x-ratelimit-reset.
	ZeroRemaining bool `json:"zeroRemaining,omitempty"`
}

// WebhookFaults lose deliveries: the next DropNext, then each with
// probability DropProbability.
type WebhookFaults struct {
	DropNext        int     `json:"dropNext,omitempty"`
	DropProbability float64 `json:"dropProbability,omitempty"`
}

// faultState holds the active request rules.
type faultState struct {
	errors    []*ErrorFault
	secondary []*SecondaryLimitFault
}

func matchRule(method, prefix, reqMethod, path string) bool {
	return (method == "" || strings.EqualFold(method, reqMethod)) && strings.HasPrefix(path, prefix)
}

// fires decides whether a rule applies to this request and spends it.
func (s *Simulator) fires(count *int, p float64) bool {
	if *count > 0 {
		*count--
		return true
	}
	return p > 0 && s.rng.Float64() < p
}

// injectFaultLocked applies the first matching secondary limit or error
// rule; spent rules are dropped.
func (s *Simulator) injectFaultLocked(q *request, path string, h http.Header, b *bucket) *apiError {
	defer s.pruneFaultsLocked()
	for _, f := range s.faults.secondary {
		if !matchRule(f.Method, f.PathPrefix, q.r.Method, path) || (f.Count == 0 && f.Probability == 0) {
			continue
		}
		if !s.fires(&f.Count, f.Probability) {
			continue
		}
		code := f.Status
		if code == 0 {
			code = http.StatusForbidden
		}
		e := &apiError{code: code, header: http.Header{},
			msg: "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. If you reach out to GitHub Support for help, please include the request ID " + q.reqID + ".",
			doc: "https://docs.github.com/free-pro-team@latest/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits"}
		if f.RetryAfter > 0 {
			e.header.Set("Retry-After", strconv.Itoa(int((f.RetryAfter.D()+time.Second-1)/time.Second)))
		}
		if f.ZeroRemaining {
			h.Set("X-RateLimit-Remaining", "0")
		}
		s.countFaultLocked(fmt.Sprintf("secondary-limit-%d", code))
		return e
	}
	for _, f := range s.faults.errors {
		if !matchRule(f.Method, f.PathPrefix, q.r.Method, path) || (f.Count == 0 && f.Probability == 0) {
			continue
		}
		if !s.fires(&f.Count, f.Probability) {
			continue
		}
		msg := f.Message
		if msg == "" {
			msg = http.StatusText(f.Status)
			if f.Status >= 500 {
				msg = "Server Error"
			}
		}
		s.countFaultLocked(fmt.Sprintf("error-%d", f.Status))
		return &apiError{code: f.Status, msg: msg}
	}
	return nil
}

// countFaultLocked counts one injected fault of kind (InjectedFaults).
func (s *Simulator) countFaultLocked(kind string) {
	if s.injected == nil {
		s.injected = map[string]int{}
	}
	s.injected[kind]++
}

// InjectedFaults counts the faults injected so far by kind:
// "error-<status>" and "secondary-limit-<status>" for API requests,
// "webhook-drop" for lost deliveries. A chaos run reports them.
func (s *Simulator) InjectedFaults() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.injected)
}

// pruneFaultsLocked drops rules that are spent (count reached zero and no
// probability).
func (s *Simulator) pruneFaultsLocked() {
	errs := s.faults.errors[:0]
	for _, f := range s.faults.errors {
		if f.Count > 0 || f.Probability > 0 {
			errs = append(errs, f)
		}
	}
	s.faults.errors = errs
	sec := s.faults.secondary[:0]
	for _, f := range s.faults.secondary {
		if f.Count > 0 || f.Probability > 0 {
			sec = append(sec, f)
		}
	}
	s.faults.secondary = sec
}

// InjectError adds an error rule.
func (s *Simulator) InjectError(f ErrorFault) error {
	if f.Status < 400 || f.Status > 599 {
		return fmt.Errorf("error fault status %d is not a 4xx or 5xx", f.Status)
	}
	if f.Count < 0 || f.Probability < 0 || f.Probability > 1 || (f.Count == 0 && f.Probability == 0) {
		return fmt.Errorf("error fault needs count > 0 or probability in (0,1]")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults.errors = append(s.faults.errors, &f)
	return nil
}

// InjectSecondaryLimit adds a secondary rate limit rule.
func (s *Simulator) InjectSecondaryLimit(f SecondaryLimitFault) error {
	if f.Status != 0 && f.Status != http.StatusForbidden && f.Status != http.StatusTooManyRequests {
		return fmt.Errorf("secondary limit status must be 403 or 429")
	}
	if f.Count < 0 || f.Probability < 0 || f.Probability > 1 || (f.Count == 0 && f.Probability == 0) {
		return fmt.Errorf("secondary limit fault needs count > 0 or probability in (0,1]")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults.secondary = append(s.faults.secondary, &f)
	return nil
}

// AddFaults adds every rule of f and replaces the webhook drop settings
// when f sets any.
func (s *Simulator) AddFaults(f Faults) error {
	for _, e := range f.Errors {
		if err := s.InjectError(e); err != nil {
			return err
		}
	}
	for _, l := range f.SecondaryLimits {
		if err := s.InjectSecondaryLimit(l); err != nil {
			return err
		}
	}
	if f.Webhooks != (WebhookFaults{}) {
		if f.Webhooks.DropProbability < 0 || f.Webhooks.DropProbability > 1 || f.Webhooks.DropNext < 0 {
			return fmt.Errorf("webhook drop settings out of range")
		}
		s.DropWebhooks(f.Webhooks.DropNext, f.Webhooks.DropProbability)
	}
	return nil
}

// ClearFaults removes every fault rule and stops dropping webhooks.
func (s *Simulator) ClearFaults() {
	s.mu.Lock()
	s.faults = faultState{}
	s.mu.Unlock()
	s.DropWebhooks(0, 0)
}

// Faults returns the active rules (counts are what is left).
func (s *Simulator) Faults() Faults {
	s.mu.Lock()
	var f Faults
	for _, e := range s.faults.errors {
		f.Errors = append(f.Errors, *e)
	}
	for _, l := range s.faults.secondary {
		f.SecondaryLimits = append(f.SecondaryLimits, *l)
	}
	s.mu.Unlock()
	h := s.hooks
	h.mu.Lock()
	f.Webhooks = WebhookFaults{DropNext: h.dropNext, DropProbability: h.dropRate}
	h.mu.Unlock()
	return f
}
