// Package vmanswer is how the operator's endpoints for VMs (the credential
// broker, internal/broker; the TPM enrollment, internal/tpmenroll) answer:
// a JSON body on success, and on refusal an HTTP status, a reason the
// agent and the metrics read, a message that says why, and Retry-After on
// what the VM should retry. The agent parses both the same way
// (internal/agent).
package vmanswer

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Body is the body of every answer but a 200.
type Body struct {
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Refusal is a VM's request turned down.
type Refusal struct {
	Status  int
	Reason  string
	Message string
	// RetryAfter, when set, is sent as Retry-After (whole seconds, at
	// least 1).
	RetryAfter time.Duration
}

// Refuse is a refusal with status and reason, and the message format
// makes.
func Refuse(status int, reason, format string, args ...any) *Refusal {
	return &Refusal{Status: status, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// After sets when to retry and returns r.
func (r *Refusal) After(d time.Duration) *Refusal {
	r.RetryAfter = d
	return r
}

func (r *Refusal) Error() string { return r.Reason + ": " + r.Message }

// Transient reports whether the VM is to retry (429 or 503): such a
// refusal is no event on the claim.
func (r *Refusal) Transient() bool {
	return r.Status == http.StatusTooManyRequests || r.Status == http.StatusServiceUnavailable
}

// Write answers with r.
func Write(w http.ResponseWriter, r *Refusal) {
	if r.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(max(1, r.RetryAfter.Round(time.Second)/time.Second))))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(r.Status)
	_ = json.NewEncoder(w).Encode(Body{Reason: r.Reason, Message: r.Message})
}

// WriteOK answers 200 with v, which no cache may keep.
func WriteOK(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(v)
}
