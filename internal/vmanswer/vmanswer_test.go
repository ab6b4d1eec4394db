package vmanswer

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestWrite: a refusal carries its status, its reason and message as
// JSON, and Retry-After in whole seconds (at least 1) when it has one;
// only 429 and 503 are transient.
func TestWrite(t *testing.T) {
	for _, c := range []struct {
		r         *Refusal
		retry     string
		transient bool
	}{
		{Refuse(http.StatusForbidden, "NoLiveClaim", "no claim %s", "a/b"), "", false},
		{Refuse(http.StatusServiceUnavailable, "Busy", "busy").After(1500 * time.Millisecond), "2", true},
		{Refuse(http.StatusTooManyRequests, "RateLimited", "slow down").After(100 * time.Millisecond), "1", true},
	} {
		rec := httptest.NewRecorder()
		Write(rec, c.r)
		var body Body
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		if rec.Code != c.r.Status || body.Reason != c.r.Reason || body.Message != c.r.Message || rec.Header().Get("Retry-After") != c.retry {
			t.Errorf("%+v answered %d %+v Retry-After %q", c.r, rec.Code, body, rec.Header().Get("Retry-After"))
		}
		if c.r.Transient() != c.transient {
			t.Errorf("%+v: Transient %v", c.r, c.r.Transient())
		}
	}
	rec := httptest.NewRecorder()
	WriteOK(rec, map[string]string{"a": "b"})
	if rec.Code != http.StatusOK || rec.Header().Get("Cache-Control") != "no-store" || rec.Body.String() != "{\"a\":\"b\"}\n" {
		t.Errorf("WriteOK: %d %q %q", rec.Code, rec.Header(), rec.Body.String())
	}
}
