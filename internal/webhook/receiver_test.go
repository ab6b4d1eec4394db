package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/demand"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github"
)

var testSecret = []byte("s3cr3t-webhook-key-for-tests")

func jobBody(id int64, action string, labels ...string) []byte {
	if len(labels) == 0 {
		labels = []string{"self-hosted", "gpu"}
	}
	return fmt.Appendf(nil, `{"action":%q,"workflow_job":{"id":%d,"run_id":5,"run_attempt":1,"status":%q,"labels":[%s],"runner_name":null,"created_at":"2024-05-01T10:00:00Z"},"repository":{"full_name":"octo/app"}}`,
		action, id, action, `"`+strings.Join(labels, `","`)+`"`)
}

// delivery builds a signed GitHub delivery.
func delivery(id string, event string, body []byte) *http.Request {
	req := httptest.NewRequest(http.MethodPost, github.WebhookFormat.Path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", event)
	req.Header.Set("X-GitHub-Delivery", id)
	req.Header.Set("X-Hub-Signature-256", github.SignWebhook(testSecret, body))
	return req
}

// fakeRouter routes every job to one pool, or as route says.
type fakeRouter struct {
	route func(ctx context.Context, job workload.Job) (demand.Decision, error)
}

func (f *fakeRouter) Route(ctx context.Context, job workload.Job) (demand.Decision, error) {
	return f.route(ctx, job)
}

func routeTo(ns, name string) *fakeRouter {
	return &fakeRouter{route: func(context.Context, workload.Job) (demand.Decision, error) {
		return demand.Decision{Pool: &demand.Candidate{Pool: types.NamespacedName{Namespace: ns, Name: name}}}, nil
	}}
}

type recorded struct {
	pool   types.NamespacedName
	ev     workload.JobEvent
	source string
}

// fakeRecorder collects records; block, when set, holds every Record until
// closed.
type fakeRecorder struct {
	mu    sync.Mutex
	got   []recorded
	ch    chan recorded
	block chan struct{}
	err   error
}

func newFakeRecorder() *fakeRecorder { return &fakeRecorder{ch: make(chan recorded, 1000)} }

func (f *fakeRecorder) Record(ctx context.Context, pool types.NamespacedName, ev workload.JobEvent, source string) error {
	if f.block != nil {
		select {
		case <-f.block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f.mu.Lock()
	err := f.err
	f.mu.Unlock()
	if err != nil {
		return err
	}
	r := recorded{pool, ev, source}
	f.mu.Lock()
	f.got = append(f.got, r)
	f.mu.Unlock()
	f.ch <- r
	return nil
}

func (f *fakeRecorder) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.got)
}

func (f *fakeRecorder) wait(t *testing.T) recorded {
	t.Helper()
	select {
	case r := <-f.ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("nothing was recorded")
		return recorded{}
	}
}

// logSink collects log lines.
type logSink struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (s *logSink) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.buf.WriteString(prefix + " " + args + "\n")
	}, funcr.Options{Verbosity: 10})
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

type harness struct {
	r      *Receiver
	rec    *fakeRecorder
	events *record.FakeRecorder
	logs   *logSink
	cancel context.CancelFunc
	done   chan struct{}
}

// newHarness starts a Receiver with its workers; mutate adjusts options.
func newHarness(t *testing.T, router Router, mutate func(*Options)) *harness {
	t.Helper()
	h := &harness{rec: newFakeRecorder(), events: record.NewFakeRecorder(100), logs: &logSink{}, done: make(chan struct{})}
	opts := Options{
		Format:   github.WebhookFormat,
		Parser:   github.WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: testSecret}},
		Router:   router,
		Recorder: h.rec,
		Events:   h.events,
		Logger:   h.logs.logger(),
	}
	if mutate != nil {
		mutate(&opts)
	}
	r, err := NewReceiver(opts)
	if err != nil {
		t.Fatal(err)
	}
	r.backoff = time.Millisecond
	h.r = r
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { defer close(h.done); _ = r.Run(ctx) }()
	t.Cleanup(h.stop)
	return h
}

func (h *harness) stop() {
	if h.rec.block != nil {
		select {
		case <-h.rec.block:
		default:
			close(h.rec.block)
		}
	}
	h.cancel()
	<-h.done
}

func (h *harness) serve(req *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.r.ServeHTTP(w, req)
	return w
}

func TestReceiverRejects(t *testing.T) {
	body := jobBody(1, "queued")
	tests := []struct {
		name     string
		req      func() *http.Request
		code     int
		result   string
		contains string
		header   [2]string
	}{
		{
			name: "GET",
			req:  func() *http.Request { r := delivery("d", "workflow_job", body); r.Method = http.MethodGet; return r },
			code: http.StatusMethodNotAllowed, result: ResultMethodNotAllowed, contains: "POST", header: [2]string{"Allow", "POST"},
		},
		{
			name: "form encoded",
			req: func() *http.Request {
				r := delivery("d", "workflow_job", body)
				r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				return r
			},
			code: http.StatusUnsupportedMediaType, result: ResultUnsupportedMediaType, contains: "content type to application/json",
		},
		{
			name: "no content type",
			req:  func() *http.Request { r := delivery("d", "workflow_job", body); r.Header.Del("Content-Type"); return r },
			code: http.StatusUnsupportedMediaType, result: ResultUnsupportedMediaType, contains: "application/json",
		},
		{
			name: "no delivery id",
			req: func() *http.Request {
				r := delivery("d", "workflow_job", body)
				r.Header.Del("X-GitHub-Delivery")
				return r
			},
			code: http.StatusBadRequest, result: ResultMissingDeliveryID, contains: "X-GitHub-Delivery",
		},
		{
			name: "delivery id with spaces",
			req:  func() *http.Request { return delivery("a b", "workflow_job", body) },
			code: http.StatusBadRequest, result: ResultMissingDeliveryID, contains: "X-GitHub-Delivery",
		},
		{
			name: "too large (Content-Length)",
			req:  func() *http.Request { return delivery("d", "workflow_job", bytes.Repeat([]byte(" "), 2048)) },
			code: http.StatusRequestEntityTooLarge, result: ResultTooLarge, contains: "1024 bytes",
		},
		{
			name: "too large (chunked)",
			req: func() *http.Request {
				r := delivery("d", "workflow_job", nil)
				r.Body = io.NopCloser(bytes.NewReader(bytes.Repeat([]byte(" "), 2048)))
				r.ContentLength = -1
				return r
			},
			code: http.StatusRequestEntityTooLarge, result: ResultTooLarge, contains: "too large",
		},
		{
			name: "no signature",
			req: func() *http.Request {
				r := delivery("d", "workflow_job", body)
				r.Header.Del("X-Hub-Signature-256")
				return r
			},
			code: http.StatusUnauthorized, result: ResultBadSignature, contains: "X-Hub-Signature-256",
		},
		{
			name: "sha1 signature only",
			req: func() *http.Request {
				r := delivery("d", "workflow_job", body)
				r.Header.Del("X-Hub-Signature-256")
				r.Header.Set("X-Hub-Signature", "sha1=0123456789abcdef0123456789abcdef01234567")
				return r
			},
			code: http.StatusUnauthorized, result: ResultBadSignature, contains: "unauthorized",
		},
		{
			name: "wrong signature",
			req: func() *http.Request {
				r := delivery("d", "workflow_job", body)
				r.Header.Set("X-Hub-Signature-256", github.SignWebhook([]byte("other"), body))
				return r
			},
			code: http.StatusUnauthorized, result: ResultBadSignature, contains: "unauthorized",
		},
		{
			name: "malformed",
			req:  func() *http.Request { return delivery("d", "workflow_job", []byte(`{"action":"queued"`)) },
			code: http.StatusBadRequest, result: ResultMalformed, contains: "malformed",
		},
		{
			name: "missing job id",
			req: func() *http.Request {
				return delivery("d", "workflow_job", []byte(`{"action":"queued","workflow_job":{},"repository":{"full_name":"a/b"}}`))
			},
			code: http.StatusBadRequest, result: ResultMalformed, contains: "workflow_job.id",
		},
		{
			name: "ping",
			req: func() *http.Request {
				return delivery("d", "ping", []byte(`{"zen":"Design for failure.","hook_id":1}`))
			},
			code: http.StatusOK, result: ResultIgnored, contains: "ignored",
		},
		{
			name: "unknown action",
			req:  func() *http.Request { return delivery("d", "workflow_job", jobBody(1, "requested")) },
			code: http.StatusOK, result: ResultIgnored, contains: "ignored",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, routeTo("ns", "pool"), func(o *Options) { o.MaxBodyBytes = 1024 })
			req := tc.req()
			before := metricValue(deliveriesTotal.WithLabelValues("github-actions", eventLabel(github.WebhookFormat.Events, req.Header.Get("X-GitHub-Event")), tc.result))
			w := h.serve(req)
			if w.Code != tc.code {
				t.Fatalf("status %d, want %d (body %q)", w.Code, tc.code, w.Body.String())
			}
			if !strings.Contains(w.Body.String(), tc.contains) {
				t.Fatalf("body %q does not say %q", w.Body.String(), tc.contains)
			}
			if tc.header[0] != "" && w.Header().Get(tc.header[0]) != tc.header[1] {
				t.Fatalf("header %s = %q, want %q", tc.header[0], w.Header().Get(tc.header[0]), tc.header[1])
			}
			after := metricValue(deliveriesTotal.WithLabelValues("github-actions", eventLabel(github.WebhookFormat.Events, req.Header.Get("X-GitHub-Event")), tc.result))
			if after != before+1 {
				t.Fatalf("deliveries_total{result=%s} went %v -> %v", tc.result, before, after)
			}
			h.stop()
			if n := h.rec.count(); n != 0 {
				t.Fatalf("%d records from a rejected delivery", n)
			}
			logs := h.logs.String()
			if strings.Contains(logs, string(testSecret)) || strings.Contains(logs, `"action":`) {
				t.Fatalf("logs leak the secret or the body:\n%s", logs)
			}
			if sig := strings.TrimPrefix(req.Header.Get("X-Hub-Signature-256"), "sha256="); len(sig) > 8 && strings.Contains(logs, sig) {
				t.Fatalf("logs leak the signature:\n%s", logs)
			}
		})
	}
}

func TestReceiverAcceptsAndRecords(t *testing.T) {
	h := newHarness(t, routeTo("team", "gpu"), nil)
	body := jobBody(4242, "queued")
	req := delivery("72d3162e-cc78-11e3-81ab-4c9367dc0958", "workflow_job", body)
	sig := req.Header.Get("X-Hub-Signature-256")
	before := metricValue(jobsRoutedTotal.WithLabelValues(OutcomeMatched))
	w := h.serve(req)
	if w.Code != http.StatusAccepted || !strings.Contains(w.Body.String(), "accepted") {
		t.Fatalf("status %d body %q", w.Code, w.Body.String())
	}
	r := h.rec.wait(t)
	if r.pool != (types.NamespacedName{Namespace: "team", Name: "gpu"}) || r.source != demand.SourceWebhook ||
		r.ev.Job.ID != "4242" || r.ev.DeliveryID != "72d3162e-cc78-11e3-81ab-4c9367dc0958" || r.ev.Job.State != workload.JobQueued {
		t.Fatalf("recorded %+v", r)
	}
	waitFor(t, func() bool { return metricValue(jobsRoutedTotal.WithLabelValues(OutcomeMatched)) == before+1 })

	// The same delivery again: 200 duplicate, nothing more recorded.
	w = h.serve(delivery("72d3162e-cc78-11e3-81ab-4c9367dc0958", "workflow_job", body))
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "duplicate") {
		t.Fatalf("duplicate: status %d body %q", w.Code, w.Body.String())
	}
	// A duplicate id with a bad signature is still a 401: unauthenticated
	// requests never reach the de-duplication.
	bad := delivery("72d3162e-cc78-11e3-81ab-4c9367dc0958", "workflow_job", body)
	bad.Header.Set("X-Hub-Signature-256", "sha256=00")
	if w := h.serve(bad); w.Code != http.StatusUnauthorized {
		t.Fatalf("bad signature on a known id: %d", w.Code)
	}
	h.stop()
	if n := h.rec.count(); n != 1 {
		t.Fatalf("%d records, want 1", n)
	}
	logs := h.logs.String()
	for _, secret := range []string{string(testSecret), strings.TrimPrefix(sig, "sha256="), `"workflow_job":{`} {
		if strings.Contains(logs, secret) {
			t.Fatalf("logs contain %q:\n%s", secret, logs)
		}
	}
}

// TestReceiverFastWhileBlocked: with every worker stuck, deliveries are
// still answered 202 at once until the queue is full, then 503 with
// Retry-After; once the workers move, everything accepted is recorded.
func TestReceiverFastWhileBlocked(t *testing.T) {
	rec := newFakeRecorder()
	rec.block = make(chan struct{})
	h := newHarness(t, routeTo("team", "gpu"), func(o *Options) {
		o.Workers, o.QueueSize, o.Recorder = 2, 5, rec
	})
	h.rec = rec
	// Two deliveries occupy the two workers.
	for i := range 2 {
		if w := h.serve(delivery(fmt.Sprintf("d-%d", i), "workflow_job", jobBody(int64(100+i), "queued"))); w.Code != http.StatusAccepted {
			t.Fatalf("status %d", w.Code)
		}
	}
	waitFor(t, func() bool { return h.r.QueueLen() == 0 })
	accepted := 2
	var overloaded *httptest.ResponseRecorder
	for i := 2; i < 20; i++ {
		// Answered although both workers are still blocked (the test
		// would hang here otherwise): no timing needed.
		w := h.serve(delivery(fmt.Sprintf("d-%d", i), "workflow_job", jobBody(int64(100+i), "queued")))
		switch w.Code {
		case http.StatusAccepted:
			accepted++
		case http.StatusServiceUnavailable:
			overloaded = w
		default:
			t.Fatalf("delivery %d: status %d", i, w.Code)
		}
	}
	// 2 workers hold one event each, 5 wait in the queue.
	if accepted != 7 {
		t.Fatalf("accepted %d, want 7", accepted)
	}
	if overloaded == nil || overloaded.Header().Get("Retry-After") == "" || !strings.Contains(overloaded.Body.String(), "retry") {
		t.Fatalf("no proper 503: %+v", overloaded)
	}
	if got := metricValue(queueDepth); got != 5 {
		t.Fatalf("queue depth gauge %v, want 5", got)
	}
	// A refused delivery is not remembered: GitHub's redelivery is taken.
	close(rec.block)
	for range 7 {
		rec.wait(t)
	}
	if w := h.serve(delivery("d-19", "workflow_job", jobBody(119, "queued"))); w.Code != http.StatusAccepted {
		t.Fatalf("redelivery of a refused delivery: %d", w.Code)
	}
	rec.wait(t)
}

func TestReceiverUnmatched(t *testing.T) {
	mismatch := []demand.Mismatch{
		{Candidate: demand.Candidate{Pool: types.NamespacedName{Namespace: "team", Name: "cpu"}, UID: "u1"}, Missing: []string{"gpu"}},
		{Candidate: demand.Candidate{Pool: types.NamespacedName{Namespace: "other", Name: "arm"}, UID: "u2"}, Missing: []string{"gpu", "x"}},
	}
	router := &fakeRouter{route: func(_ context.Context, job workload.Job) (demand.Decision, error) {
		if job.ID == "3" {
			return demand.Decision{}, nil // nobody serves the repository
		}
		return demand.Decision{Unmatched: mismatch}, nil
	}}
	h := newHarness(t, router, nil)
	unmatched := metricValue(jobsRoutedTotal.WithLabelValues(OutcomeUnmatched))
	outOfScope := metricValue(jobsRoutedTotal.WithLabelValues(OutcomeOutOfScope))
	for i, action := range []string{"queued", "in_progress", "queued"} {
		if w := h.serve(delivery(fmt.Sprintf("u-%d", i), "workflow_job", jobBody(int64(i+1), action))); w.Code != http.StatusAccepted {
			t.Fatalf("status %d", w.Code)
		}
	}
	waitFor(t, func() bool {
		return metricValue(jobsRoutedTotal.WithLabelValues(OutcomeUnmatched)) == unmatched+2 &&
			metricValue(jobsRoutedTotal.WithLabelValues(OutcomeOutOfScope)) == outOfScope+1
	})
	h.stop()
	var events []string
	for len(h.events.Events) > 0 {
		events = append(events, <-h.events.Events)
	}
	// Only the queued job 1 is explained, on both pools in scope.
	if len(events) != 2 {
		t.Fatalf("events: %q", events)
	}
	for i, e := range events {
		if !strings.HasPrefix(e, "Warning NoMatchingRunnerPool") || !strings.Contains(e, "job 1 of octo/app") ||
			!strings.Contains(e, "lack: "+strings.Join(mismatch[i].Missing, ", ")) {
			t.Fatalf("event %q", e)
		}
	}
	if h.rec.count() != 0 {
		t.Fatal("an unmatched job was recorded")
	}
}

// TestReceiverAmbiguous: a job covered as specifically by several pools is
// recorded for none of them; each queued one is explained on every tied pool.
func TestReceiverAmbiguous(t *testing.T) {
	tied := []demand.Candidate{
		{Pool: types.NamespacedName{Namespace: "aaa", Name: "grab"}, UID: "u1", Verified: true},
		{Pool: types.NamespacedName{Namespace: "team", Name: "cpu"}, UID: "u2", Verified: true},
	}
	router := &fakeRouter{route: func(context.Context, workload.Job) (demand.Decision, error) {
		return demand.Decision{Ambiguous: tied}, nil
	}}
	h := newHarness(t, router, nil)
	before := metricValue(jobsRoutedTotal.WithLabelValues(OutcomeAmbiguous))
	for i, action := range []string{"queued", "in_progress"} {
		if w := h.serve(delivery(fmt.Sprintf("a-%d", i), "workflow_job", jobBody(int64(i+1), action))); w.Code != http.StatusAccepted {
			t.Fatalf("status %d", w.Code)
		}
	}
	waitFor(t, func() bool { return metricValue(jobsRoutedTotal.WithLabelValues(OutcomeAmbiguous)) == before+2 })
	h.stop()
	var events []string
	for len(h.events.Events) > 0 {
		events = append(events, <-h.events.Events)
	}
	if len(events) != 2 {
		t.Fatalf("events: %q", events)
	}
	for _, e := range events {
		if !strings.HasPrefix(e, "Warning "+string(hfv1.AmbiguousJobRoutingReason)) || !strings.Contains(e, "job 1 of octo/app") ||
			!strings.Contains(e, "aaa/grab, team/cpu") {
			t.Fatalf("event %q", e)
		}
	}
	if h.rec.count() != 0 {
		t.Fatal("an ambiguous job was recorded")
	}
}

// TestReceiverRetriesWhilePoolsAreBeingVerified: a job whose covering pool
// is still having its scope checked is routed again, and recorded once the
// pool is verified.
func TestReceiverRetriesWhilePoolsAreBeingVerified(t *testing.T) {
	var calls atomic.Int32
	router := &fakeRouter{route: func(context.Context, workload.Job) (demand.Decision, error) {
		if calls.Add(1) < 3 {
			return demand.Decision{Pending: 1, Unverified: 1}, nil
		}
		return demand.Decision{Pool: &demand.Candidate{Pool: types.NamespacedName{Namespace: "team", Name: "new"}, Verified: true}}, nil
	}}
	h := newHarness(t, router, nil)
	if w := h.serve(delivery("p-1", "workflow_job", jobBody(1, "queued"))); w.Code != http.StatusAccepted {
		t.Fatalf("status %d", w.Code)
	}
	h.rec.wait(t)
	h.stop()
	if n := calls.Load(); n != 3 || h.rec.count() != 1 {
		t.Fatalf("%d routing attempts, %d recorded; want 3 and 1", n, h.rec.count())
	}
}

// TestReceiverRecordFailure: a job that cannot be recorded is retried, then
// counted as an error and forgotten, so GitHub's redelivery is processed.
func TestReceiverRecordFailure(t *testing.T) {
	rec := newFakeRecorder()
	rec.err = errors.New("the API server is away")
	h := newHarness(t, routeTo("team", "gpu"), func(o *Options) { o.Recorder = rec })
	h.rec = rec
	errorsBefore := metricValue(jobsRoutedTotal.WithLabelValues(OutcomeError))
	if w := h.serve(delivery("f-1", "workflow_job", jobBody(5, "queued"))); w.Code != http.StatusAccepted {
		t.Fatalf("status %d", w.Code)
	}
	waitFor(t, func() bool { return metricValue(jobsRoutedTotal.WithLabelValues(OutcomeError)) == errorsBefore+1 })
	rec.mu.Lock()
	rec.err = nil
	rec.mu.Unlock()
	if w := h.serve(delivery("f-1", "workflow_job", jobBody(5, "queued"))); w.Code != http.StatusAccepted {
		t.Fatalf("redelivery after a failure: status %d", w.Code)
	}
	if r := rec.wait(t); r.ev.Job.ID != "5" {
		t.Fatalf("recorded %+v", r)
	}
}

// TestReceiverDrainsOnStop: what is queued when Run's context ends is
// still recorded.
func TestReceiverDrainsOnStop(t *testing.T) {
	rec := newFakeRecorder()
	rec.block = make(chan struct{})
	h := newHarness(t, routeTo("team", "gpu"), func(o *Options) { o.Workers, o.Recorder = 1, rec })
	h.rec = rec
	for i := range 4 {
		if w := h.serve(delivery(fmt.Sprintf("s-%d", i), "workflow_job", jobBody(int64(i+1), "queued"))); w.Code != http.StatusAccepted {
			t.Fatalf("status %d", w.Code)
		}
	}
	h.cancel()
	close(rec.block)
	<-h.done
	if n := rec.count(); n != 4 {
		t.Fatalf("%d of 4 queued events recorded on stop", n)
	}
}

func TestDedupe(t *testing.T) {
	d := newDedupe(3, time.Minute)
	now := time.Now()
	for _, id := range []string{"a", "b", "c"} {
		if !d.add(id, now) {
			t.Fatalf("%s seen", id)
		}
	}
	if d.add("a", now.Add(time.Second)) {
		t.Fatal("a not remembered")
	}
	if !d.add("d", now.Add(2*time.Second)) || d.len() != 3 {
		t.Fatalf("size bound: len %d", d.len())
	}
	// b was least recently added: evicted.
	if !d.add("b", now.Add(3*time.Second)) {
		t.Fatal("b should have been evicted")
	}
	// Everything expires after the TTL.
	if !d.add("d", now.Add(2*time.Minute+time.Second)) {
		t.Fatal("d should have expired")
	}
	if !d.add("x", now.Add(5*time.Minute)) || d.len() != 1 {
		t.Fatalf("expired entries kept: len %d", d.len())
	}
	d.forget("x")
	if d.len() != 0 || !d.add("x", now.Add(5*time.Minute)) {
		t.Fatal("forget")
	}
}

func TestNewReceiverNeedsParts(t *testing.T) {
	if _, err := NewReceiver(Options{Format: github.WebhookFormat, Parser: github.WebhookParser{}}); err == nil {
		t.Fatal("a receiver without router and recorder was created")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// metricValue reads a counter or gauge.
func metricValue(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

// TestReceiverInFlightBound: deliveries being read hold in-flight slots;
// large ones (over LargeBodyBytes, or of unknown length) may hold only a
// quarter of them. Beyond, a delivery gets 503 with Retry-After before its
// body is read, and its connection is not kept.
func TestReceiverInFlightBound(t *testing.T) {
	h := newHarness(t, routeTo("ns", "pool"), func(o *Options) { o.MaxInFlight = 4 })
	type stalled struct {
		pw   *io.PipeWriter
		done chan int
	}
	// stall starts a delivery whose body never arrives until released.
	stall := func(id string, declared int64) stalled {
		pr, pw := io.Pipe()
		req := delivery(id, "workflow_job", nil)
		req.Body, req.ContentLength = pr, declared
		s := stalled{pw: pw, done: make(chan int, 1)}
		go func() { s.done <- h.serve(req).Code }()
		return s
	}
	waitInFlight := func(all, large int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			if a, l := h.r.InFlight(); a == all && l == large {
				return
			}
			if time.Now().After(deadline) {
				a, l := h.r.InFlight()
				t.Fatalf("in flight %d (large %d), want %d (%d)", a, l, all, large)
			}
		}
	}
	refused := func(id string, declared int64, body []byte) {
		t.Helper()
		req := delivery(id, "workflow_job", body)
		req.ContentLength = declared
		before := metricValue(deliveriesTotal.WithLabelValues("github-actions", "workflow_job", ResultTooManyInFlight))
		w := h.serve(req)
		if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" || w.Header().Get("Connection") != "close" {
			t.Fatalf("%s: status %d, headers %v; want 503 with Retry-After and Connection: close", id, w.Code, w.Header())
		}
		if after := metricValue(deliveriesTotal.WithLabelValues("github-actions", "workflow_job", ResultTooManyInFlight)); after != before+1 {
			t.Fatalf("too_many_in_flight went %v -> %v", before, after)
		}
	}

	large := stall("large-1", LargeBodyBytes+1)
	waitInFlight(1, 1)
	refused("large-2", LargeBodyBytes+1, nil)
	refused("chunked", -1, nil)
	var small []stalled
	for i := range 3 {
		small = append(small, stall(fmt.Sprintf("small-%d", i), 100))
	}
	waitInFlight(4, 1)
	refused("small-4", 100, nil)

	// Released slots admit again: a signed delivery is accepted.
	for _, s := range append(small, large) {
		s.pw.CloseWithError(errors.New("sender gone"))
		if code := <-s.done; code != http.StatusBadRequest {
			t.Fatalf("a delivery whose sender went away: %d, want 400", code)
		}
	}
	waitInFlight(0, 0)
	if w := h.serve(delivery("signed", "workflow_job", jobBody(9, "queued"))); w.Code != http.StatusAccepted {
		t.Fatalf("signed delivery after the stall: %d %s", w.Code, w.Body.String())
	}
}

// notConfigured is the parser of a receiver whose webhook Secret does not
// exist (yet).
type notConfigured struct{}

func (notConfigured) Parse(http.Header, []byte) (workload.JobEvent, error) {
	return workload.JobEvent{}, workload.ErrWebhookNotConfigured
}

// TestNoSecretYet: without a webhook secret every delivery gets 503 with
// Retry-After (GitHub retries), never 2xx, and nothing is recorded.
func TestNoSecretYet(t *testing.T) {
	h := newHarness(t, routeTo("team", "gpu"), func(o *Options) { o.Parser = notConfigured{} })
	w := h.serve(delivery("72d3162e-cc78-11e3-81ab-4c9367dc0959", "workflow_job", jobBody(7, "queued")))
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
		t.Fatalf("delivery without a webhook secret: %d (Retry-After %q), want 503 with Retry-After", w.Code, w.Header().Get("Retry-After"))
	}
	time.Sleep(50 * time.Millisecond) // a wrongly queued event would be recorded by now
	h.rec.mu.Lock()
	defer h.rec.mu.Unlock()
	if n := len(h.rec.got); n != 0 {
		t.Fatalf("%d events recorded", n)
	}
}

// unknownHost is the parser of a receiver that holds no secrets for the
// API host a delivery names (internal/manager's hostParsers).
type unknownHost struct{}

func (unknownHost) Parse(http.Header, []byte) (workload.JobEvent, error) {
	return workload.JobEvent{}, fmt.Errorf("%w: evil.example.net", workload.ErrUnknownHost)
}

// TestUnknownHostRefused: a delivery from an API host the receiver holds
// no secrets for is refused with 403, counted as unknown_host, its
// connection closed, and nothing is queued.
func TestUnknownHostRefused(t *testing.T) {
	h := newHarness(t, routeTo("team", "gpu"), func(o *Options) { o.Parser = unknownHost{} })
	refused := deliveriesTotal.WithLabelValues("github-actions", "workflow_job", ResultUnknownHost)
	before := metricValue(refused)
	w := h.serve(delivery("72d3162e-cc78-11e3-81ab-4c9367dc0960", "workflow_job", jobBody(7, "queued")))
	if w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "X-GitHub-Enterprise-Host") {
		t.Fatalf("a delivery from an unknown host: %d %q, want 403 naming the host header", w.Code, w.Body.String())
	}
	if w.Header().Get("Connection") != "close" {
		t.Errorf("the connection was kept (Connection %q)", w.Header().Get("Connection"))
	}
	if after := metricValue(refused); after != before+1 {
		t.Errorf("unknown_host went %v -> %v", before, after)
	}
	if n := h.r.QueueLen(); n != 0 {
		t.Errorf("%d events queued", n)
	}
}

// gatedRecorder records in order, holding the events hold names until
// released.
type gatedRecorder struct {
	hold    map[string]chan struct{} // by "<job>/<action>"
	mu      sync.Mutex
	order   []string
	changed chan struct{}
}

func (g *gatedRecorder) Record(ctx context.Context, _ types.NamespacedName, ev workload.JobEvent, _ string) error {
	key := fmt.Sprintf("%s/%s", ev.Job.ID, ev.Action)
	if ch := g.hold[key]; ch != nil {
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	g.mu.Lock()
	g.order = append(g.order, key)
	g.mu.Unlock()
	g.changed <- struct{}{}
	return nil
}

func (g *gatedRecorder) recorded() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.order)
}

// TestReceiverKeepsAJobsEventsInOrder: with several workers, a job's
// events are recorded in the order they were accepted (a completed event
// never overtakes its in_progress one), while other jobs' events go on.
func TestReceiverKeepsAJobsEventsInOrder(t *testing.T) {
	release := make(chan struct{})
	rec := &gatedRecorder{hold: map[string]chan struct{}{"1/queued": release}, changed: make(chan struct{}, 100)}
	h := newHarness(t, routeTo("team", "gpu"), func(o *Options) { o.Workers, o.Recorder = 3, rec })
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	for i, d := range []struct {
		job    int64
		action string
	}{{1, "queued"}, {1, "in_progress"}, {2, "queued"}, {1, "completed"}} {
		if w := h.serve(delivery(fmt.Sprintf("o-%d", i), "workflow_job", jobBody(d.job, d.action))); w.Code != http.StatusAccepted {
			t.Fatalf("delivery %d: status %d", i, w.Code)
		}
	}
	next := func() {
		t.Helper()
		select {
		case <-rec.changed:
		case <-time.After(10 * time.Second):
			t.Fatalf("nothing more was recorded; so far %v", rec.recorded())
		}
	}
	// Job 2 goes on while job 1's first event is held; job 1's later
	// events wait for it (nothing else can be recorded until it is).
	next()
	if got := rec.recorded(); fmt.Sprint(got) != "[2/queued]" {
		t.Fatalf("recorded %v while job 1's queued event is held, want [2/queued]", got)
	}
	close(release)
	next()
	next()
	next()
	if got, want := rec.recorded(), []string{"2/queued", "1/queued", "1/in_progress", "1/completed"}; !slices.Equal(got, want) {
		t.Fatalf("recorded %v, want %v", got, want)
	}
	waitFor(t, func() bool { h.r.order.mu.Lock(); defer h.r.order.mu.Unlock(); return len(h.r.order.last) == 0 })
}
