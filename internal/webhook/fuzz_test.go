package webhook

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github"
)

// FuzzReceiver sends arbitrary headers and bodies: the handler never
// panics, never answers 5xx except 503 when overloaded, always explains
// itself, and nothing is queued or recorded without a valid signature.
func FuzzReceiver(f *testing.F) {
	f.Add("POST", "application/json", "workflow_job", "d-1", true, "", jobBody(1, "queued"))
	f.Add("POST", "application/json; charset=utf-8", "workflow_job", "d-2", true, "", jobBody(2, "completed"))
	f.Add("POST", "application/json", "workflow_job", "d-3", false, "sha256=00", jobBody(3, "queued"))
	f.Add("POST", "application/json", "ping", "d-4", true, "", []byte(`{"zen":"x"}`))
	f.Add("GET", "", "", "", false, "", []byte{})
	f.Add("POST", "text/plain", "workflow_job", "d-5", true, "", []byte(`{}`))
	f.Add("POST", "application/json", "workflow_job", "", true, "", jobBody(6, "queued"))
	f.Add("POST", "application/json", "workflow_job", "d-7", true, "", []byte(`{"action":"queued","workflow_job":{"id":7},"repository":{"full_name":"a/b"}}`))
	f.Add("POST", "application/json", "workflow_job", "d-8", true, "", bytes.Repeat([]byte("x"), 5000))

	rec := newFakeRecorder()
	r, err := NewReceiver(Options{
		Format: github.WebhookFormat,
		Parser: github.WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: testSecret}}, Router: routeTo("team", "gpu"), Recorder: rec,
		MaxBodyBytes: 4096, QueueSize: 4, Workers: 1,
	})
	if err != nil {
		f.Fatal(err)
	}
	// Deliveries accepted with a valid signature, by id: the only ones that
	// may be recorded.
	signed := map[string]bool{}
	// No workers run: the queue fills up (503 is exercised too) and is then
	// worked through here, synchronously, checking what gets recorded.
	drain := func(t *testing.T) {
		for r.QueueLen() > 0 {
			r.process(context.Background(), <-r.queue)
			got := rec.wait(t)
			if !signed[got.ev.DeliveryID] {
				t.Fatalf("recorded delivery %q, which had no valid signature", got.ev.DeliveryID)
			}
		}
	}
	f.Fuzz(func(t *testing.T, method, contentType, event, deliveryID string, sign bool, signature string, body []byte) {
		if !validMethod(method) {
			method = http.MethodPost
		}
		req := httptest.NewRequest(method, github.WebhookFormat.Path, bytes.NewReader(body))
		setHeader(req.Header, "Content-Type", contentType)
		setHeader(req.Header, "X-GitHub-Event", event)
		setHeader(req.Header, "X-GitHub-Delivery", deliveryID)
		valid := github.SignWebhook(testSecret, body)
		if sign {
			signature = valid
		}
		setHeader(req.Header, "X-Hub-Signature-256", signature)
		validSig := req.Header.Get("X-Hub-Signature-256") == valid
		queued := r.QueueLen()
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		if w.Code >= 500 && w.Code != http.StatusServiceUnavailable {
			t.Fatalf("status %d: %s", w.Code, w.Body.String())
		}
		if w.Body.Len() == 0 {
			t.Fatalf("status %d without an explanation", w.Code)
		}
		if !validSig && (w.Code == http.StatusAccepted || r.QueueLen() != queued) {
			t.Fatalf("a delivery without a valid signature was accepted (%d)", w.Code)
		}
		if w.Code == http.StatusAccepted {
			signed[req.Header.Get("X-GitHub-Delivery")] = true
		}
		if w.Code == http.StatusServiceUnavailable {
			drain(t)
		}
	})
}

func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for _, c := range m {
		if c <= ' ' || c >= 0x7f || strings.ContainsRune("()<>@,;:\\\"/[]?={}", c) {
			return false
		}
	}
	return true
}

// setHeader sets a header the way a client could send it: values with
// control characters are dropped (net/http would refuse to send them).
func setHeader(h http.Header, k, v string) {
	if v == "" || strings.ContainsFunc(v, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return
	}
	h.Set(k, v)
}
