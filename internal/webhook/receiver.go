// Package webhook is the HTTPS receiver of the CI platforms' job webhooks
// (GitHub's workflow_job, and every platform whose back-end implements
// workload.WebhookReceiver, each at its own path), on every manager
// replica: it bounds each delivery, verifies its signature,
// drops repeated delivery ids and queues the event for workers that turn it
// into a demand record (a CIJob) through package demand.
//
// The Receiver answers fast and works asynchronously: it checks the
// request (method, content type, size, delivery id), admits it within the
// in-flight bound (Options.MaxInFlight; 503 beyond, before the body is
// read), verifies the signature and decodes the event with a
// workload.WebhookParser, drops repeated deliveries, and puts the event on
// a bounded in-memory queue (202 Accepted). Workers route each job to a RunnerPool and record it.
// The queue is the only state kept in memory, and only for as long as it
// takes to write the CIJob: a delivery lost in a crash is recovered by the
// periodic resync (see docs/architecture.md, "Demand records in the API
// server").
//
// Every manager replica runs a Server (it does not need leader election):
// a platform may deliver to any of them, the CIJob's name de-duplicates across
// replicas, and only the leader's controllers act on the records.
package webhook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/demand"
	"github.com/hyperfleet/hyperfleet/internal/httpsserver"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// ReasonNoMatchingRunnerPool is the reason of the Warning event a pool
// gets when a queued job of its repository asks for labels its runners
// lack.
const ReasonNoMatchingRunnerPool = "NoMatchingRunnerPool"

// Defaults of Options.
const (
	// DefaultMaxBodyBytes bounds a delivery: workflow_job payloads are a
	// few kB, and every admitted delivery may hold this much memory while
	// it is read (docs/security.md, "Webhook intake").
	DefaultMaxBodyBytes = 256 << 10
	// DefaultMaxInFlight bounds the deliveries being read and checked at
	// once; beyond it a delivery gets 503 before its body is read.
	DefaultMaxInFlight = 64
	// LargeBodyBytes divides deliveries: one declaring a larger body (or
	// none, chunked) is large, and large ones share a quarter of the
	// in-flight slots, so that stalled large uploads cannot take the slots
	// ordinary deliveries need.
	LargeBodyBytes    = 64 << 10
	DefaultWorkers    = 4
	DefaultQueueSize  = 1000
	DefaultDedupeTTL  = time.Hour
	DefaultDedupeSize = 10000
	// DefaultRetryAfter is the Retry-After of a 503 when the queue is full.
	DefaultRetryAfter = 10 * time.Second
	// maxDeliveryIDLength bounds a delivery id (GitHub's X-GitHub-Delivery
	// is a GUID, 36 characters).
	maxDeliveryIDLength = 128
	// recordAttempts is how often a worker tries to route and record one
	// event before leaving it to the resync.
	recordAttempts = 3
)

// Router routes a job to a pool (*demand.Router).
type Router interface {
	Route(ctx context.Context, job workload.Job) (demand.Decision, error)
}

// Recorder records a job event for a pool (*demand.Recorder).
type Recorder interface {
	Record(ctx context.Context, pool types.NamespacedName, ev workload.JobEvent, source string) error
}

// Options configure a Receiver.
type Options struct {
	// Format is how the platform delivers (required): the path, the
	// headers read before the body, the names in answers; the back-end's
	// workload.WebhookReceiver gives it.
	Format workload.WebhookFormat
	// Parser verifies and decodes deliveries (required), normally a
	// github.WebhookParser with the webhook's secret.
	Parser workload.WebhookParser
	// Router and Recorder route and record jobs (required).
	Router   Router
	Recorder Recorder
	// Events, when set, receives the NoMatchingRunnerPool warnings (the
	// manager's GetEventRecorderFor("hyperfleet-webhook")).
	Events record.EventRecorder
	// MaxBodyBytes bounds a delivery's body; larger ones get 413. Default
	// 256 KiB (GitHub caps payloads at 25 MB, but workflow_job payloads are
	// a few kB).
	MaxBodyBytes int64
	// MaxInFlight bounds the deliveries being read and verified at once
	// (default 64); beyond it, and beyond a quarter of it for large
	// deliveries (LargeBodyBytes), a delivery gets 503 without its body
	// being read. Bodies in memory are therefore bounded by about
	// MaxInFlight/4 x MaxBodyBytes + MaxInFlight x LargeBodyBytes.
	MaxInFlight int
	// Workers is how many events are routed and recorded at once (default 4).
	Workers int
	// QueueSize bounds the accepted events waiting for a worker (default
	// 1000); when full, deliveries get 503 with Retry-After.
	QueueSize int
	// DedupeTTL and DedupeSize bound the memory of delivery ids (default
	// 1 h and 10,000).
	DedupeTTL  time.Duration
	DedupeSize int
	// RetryAfter is the Retry-After of a 503 (default 10 s).
	RetryAfter time.Duration
	// DrainTimeout bounds how long Run keeps working through the queue
	// after its context ends (default 10 s).
	DrainTimeout time.Duration
	// Logger logs; the zero value discards.
	Logger logr.Logger
	// Clock is the time source of the dedupe TTL, the latency metric, the
	// retry backoff and the drain timeout (default: the real clock).
	Clock clock.Clock
}

// Receiver is the webhook endpoint: an http.Handler plus the workers that
// route and record what it accepts (Run). It never logs the secret, the
// signature or the body.
type Receiver struct {
	opts   Options
	log    logr.Logger
	clock  clock.Clock
	queue  chan item
	order  *jobOrder
	dedupe *dedupe
	// slots admits deliveries (MaxInFlight tokens); large ones also need
	// one of largeSlots.
	slots, largeSlots chan struct{}
	// backoff is the wait between attempts; tests shorten it.
	backoff time.Duration
}

type item struct {
	ev       workload.JobEvent
	received time.Time
	// after is closed once the previous event of the same job is done
	// (nil: none queued); done is closed when this one is.
	after <-chan struct{}
	done  chan struct{}
}

// jobOrder keeps one job's events in the order they were accepted while
// several workers record events: GitHub sends a short job's in_progress
// and completed deliveries milliseconds apart, and a completed event
// recorded before its in_progress one must be confirmed with the CI
// platform's API (demand.ConfirmWebhookEvents), a call and its latency
// for nothing. Events of different jobs still run side by side.
type jobOrder struct {
	mu sync.Mutex
	// last is each job's most recently accepted event's done channel,
	// until that event is done.
	last map[jobKey]chan struct{}
}

// jobKey identifies a job across CI platforms: two platforms may use the
// same id.
type jobKey struct {
	platform hfv1.WorkloadType
	id       string
}

func keyOf(j workload.Job) jobKey { return jobKey{platform: j.Platform, id: j.ID} }

// enqueue puts ev on q behind the job's earlier events; false when q is
// full.
func (o *jobOrder) enqueue(q chan<- item, ev workload.JobEvent, received time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	it := item{ev: ev, received: received, after: o.last[keyOf(ev.Job)], done: make(chan struct{})}
	select {
	case q <- it:
		o.last[keyOf(ev.Job)] = it.done
		return true
	default:
		return false
	}
}

// finish marks it done, letting the job's next event go.
func (o *jobOrder) finish(it item) {
	o.mu.Lock()
	defer o.mu.Unlock()
	close(it.done)
	if k := keyOf(it.ev.Job); o.last[k] == it.done {
		delete(o.last, k)
	}
}

// NewReceiver checks opts and fills in the defaults.
func NewReceiver(opts Options) (*Receiver, error) {
	if opts.Parser == nil || opts.Router == nil || opts.Recorder == nil {
		return nil, errors.New("webhook receiver: Parser, Router and Recorder are required")
	}
	if f := opts.Format; f.Platform == "" || f.Label == "" || !strings.HasPrefix(f.Path, "/") || f.EventHeader == "" || f.SignatureHeader == "" {
		return nil, errors.New("webhook receiver: Format needs the platform's name, label, path, event header and signature header")
	}
	opts.MaxBodyBytes = orDefault(opts.MaxBodyBytes, DefaultMaxBodyBytes)
	opts.MaxInFlight = orDefault(opts.MaxInFlight, DefaultMaxInFlight)
	opts.Workers = orDefault(opts.Workers, DefaultWorkers)
	opts.QueueSize = orDefault(opts.QueueSize, DefaultQueueSize)
	opts.DedupeTTL = orDefault(opts.DedupeTTL, DefaultDedupeTTL)
	opts.DedupeSize = orDefault(opts.DedupeSize, DefaultDedupeSize)
	opts.RetryAfter = orDefault(opts.RetryAfter, DefaultRetryAfter)
	opts.DrainTimeout = orDefault(opts.DrainTimeout, 10*time.Second)
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Receiver{
		opts:       opts,
		log:        opts.Logger,
		clock:      opts.Clock,
		queue:      make(chan item, opts.QueueSize),
		order:      &jobOrder{last: map[jobKey]chan struct{}{}},
		dedupe:     newDedupe(opts.DedupeSize, opts.DedupeTTL),
		slots:      make(chan struct{}, opts.MaxInFlight),
		largeSlots: make(chan struct{}, max(1, opts.MaxInFlight/4)),
		backoff:    200 * time.Millisecond,
	}, nil
}

// orDefault returns v, or def when v is zero or negative: an option left
// unset, or set out of range, takes its default. The receiver's and the
// server's options (server.go) use it.
func orDefault[T ~int | ~int64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// QueueLen is how many accepted events wait for a worker.
func (r *Receiver) QueueLen() int { return len(r.queue) }

// InFlight is how many deliveries are being read and verified, and how
// many of them are large.
func (r *Receiver) InFlight() (all, large int) { return len(r.slots), len(r.largeSlots) }

// admit takes an in-flight slot for a delivery declaring contentLength
// bytes (-1: unknown); ok is false when none is free. It never waits: a
// waiting request would hold its connection and buffers all the same.
func (r *Receiver) admit(contentLength int64) (release func(), ok bool) {
	large := contentLength < 0 || contentLength > LargeBodyBytes
	if large {
		select {
		case r.largeSlots <- struct{}{}:
		default:
			return nil, false
		}
	}
	select {
	case r.slots <- struct{}{}:
	default:
		if large {
			<-r.largeSlots
		}
		return nil, false
	}
	return func() {
		<-r.slots
		if large {
			<-r.largeSlots
		}
	}, true
}

// readBody reads a delivery's body, at most limit bytes. A declared length
// is read into a buffer of exactly that size, so an admitted delivery
// holds no more than it announced.
func readBody(w http.ResponseWriter, req *http.Request, limit int64) ([]byte, error) {
	src := http.MaxBytesReader(w, req.Body, limit)
	if n := req.ContentLength; n >= 0 && n <= limit {
		body := make([]byte, n)
		if _, err := io.ReadFull(src, body); err != nil {
			return nil, err
		}
		return body, nil
	}
	return io.ReadAll(src)
}

// ServeHTTP implements http.Handler.
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	received := r.clock.Now()
	f := &r.opts.Format
	event := req.Header.Get(f.EventHeader)
	evLabel := eventLabel(f.Events, event)
	reply := func(code int, result, msg string) {
		deliveriesTotal.WithLabelValues(f.Label, evLabel, result).Inc()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(code)
		_, _ = io.WriteString(w, msg+"\n")
	}

	if req.Method != http.MethodPost {
		httpsserver.DropConnection(w)
		w.Header().Set("Allow", http.MethodPost)
		reply(http.StatusMethodNotAllowed, ResultMethodNotAllowed, "method not allowed: "+f.Platform+" webhooks are delivered with POST")
		return
	}
	if mt, _, err := mime.ParseMediaType(req.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		httpsserver.DropConnection(w)
		reply(http.StatusUnsupportedMediaType, ResultUnsupportedMediaType,
			"unsupported media type: set the webhook's content type to application/json in its "+f.Platform+" settings")
		return
	}
	var delivery string
	if f.DeliveryHeader != "" {
		delivery = req.Header.Get(f.DeliveryHeader)
		if delivery == "" {
			httpsserver.DropConnection(w)
			reply(http.StatusBadRequest, ResultMissingDeliveryID, "bad request: the "+f.DeliveryHeader+" header is missing")
			return
		}
		if !validDeliveryID(delivery) {
			httpsserver.DropConnection(w)
			reply(http.StatusBadRequest, ResultMissingDeliveryID, "bad request: the "+f.DeliveryHeader+" header is not a delivery id")
			return
		}
	}
	if req.ContentLength > r.opts.MaxBodyBytes {
		httpsserver.DropConnection(w)
		reply(http.StatusRequestEntityTooLarge, ResultTooLarge, fmt.Sprintf("request entity too large: the limit is %d bytes", r.opts.MaxBodyBytes))
		return
	}
	release, ok := r.admit(req.ContentLength)
	if !ok {
		httpsserver.DropConnection(w)
		w.Header().Set("Retry-After", strconv.Itoa(int((r.opts.RetryAfter+time.Second-1)/time.Second)))
		reply(http.StatusServiceUnavailable, ResultTooManyInFlight, "service unavailable: too many deliveries are being received at once; retry later")
		return
	}
	defer release()
	body, err := readBody(w, req, r.opts.MaxBodyBytes)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			reply(http.StatusRequestEntityTooLarge, ResultTooLarge, fmt.Sprintf("request entity too large: the limit is %d bytes", r.opts.MaxBodyBytes))
			return
		}
		reply(http.StatusBadRequest, ResultMalformed, "bad request: the body could not be read in full before the read timeout")
		return
	}
	log := r.log.WithValues("platform", f.Label, "event", evLabel)

	ev, err := r.opts.Parser.Parse(req.Header, body)
	switch {
	case errors.Is(err, workload.ErrWebhookNotConfigured):
		log.Info("webhook delivery refused: no webhook secret is configured")
		w.Header().Set("Retry-After", strconv.Itoa(int((r.opts.RetryAfter+time.Second-1)/time.Second)))
		reply(http.StatusServiceUnavailable, ResultNotConfigured, "service unavailable: the receiver has no webhook secret yet; retry later")
		return
	case errors.Is(err, workload.ErrUnknownHost):
		log.V(1).Info("webhook delivery refused: from an API host without secrets here", "reason", err.Error())
		httpsserver.DropConnection(w)
		reply(http.StatusForbidden, ResultUnknownHost,
			"forbidden: the "+f.HostHeader+" header names an API host this receiver holds no webhook secrets for; give the operator that host's secrets (docs/security.md, \"The API host is part of the scope\")")
		return
	case errors.Is(err, workload.ErrBadSignature):
		log.V(1).Info("webhook delivery rejected: bad signature")
		// Whoever cannot sign keeps no connection: it would otherwise
		// wait, idle, for its next try until IdleTimeout.
		httpsserver.DropConnection(w)
		reply(http.StatusUnauthorized, ResultBadSignature,
			"unauthorized: the "+f.SignatureHeader+" header is missing or does not match the webhook secret")
		return
	case errors.Is(err, workload.ErrIgnoredEvent):
		log.V(1).Info("webhook delivery ignored", "reason", err.Error())
		reply(http.StatusOK, ResultIgnored, "ignored: only "+f.Used+" are used")
		return
	case err != nil:
		// ErrMalformed, or an error a parser did not classify: the sender's
		// fault either way, never a 5xx.
		log.Info("webhook delivery rejected: malformed", "reason", err.Error())
		reply(http.StatusBadRequest, ResultMalformed, "bad request: "+oneLine(err.Error()))
		return
	}
	if f.DeliveryHeader != "" {
		ev.DeliveryID = delivery
	} else if delivery = ev.DeliveryID; delivery == "" || !validDeliveryID(delivery) {
		// The parser derives the id from a verified body: a parser bug,
		// never the sender's, yet the delivery cannot be de-duplicated.
		log.Error(nil, "webhook delivery refused: the parser gave it no valid delivery id")
		reply(http.StatusBadRequest, ResultMissingDeliveryID, "bad request: the delivery carries no id")
		return
	}
	log = log.WithValues("delivery", delivery, "action", ev.Action, "job", ev.Job.ID)

	if !r.dedupe.add(delivery, received) {
		log.V(1).Info("webhook delivery is a duplicate")
		reply(http.StatusOK, ResultDuplicate, "duplicate: this delivery was already accepted")
		return
	}
	if r.order.enqueue(r.queue, ev, received) {
		queueDepth.Set(float64(len(r.queue)))
	} else {
		r.dedupe.forget(delivery)
		log.Info("webhook queue full: delivery refused with 503", "queueSize", cap(r.queue))
		w.Header().Set("Retry-After", strconv.Itoa(int((r.opts.RetryAfter+time.Second-1)/time.Second)))
		reply(http.StatusServiceUnavailable, ResultOverloaded, "service unavailable: too many deliveries are waiting; retry later")
		return
	}
	log.V(1).Info("webhook delivery accepted")
	reply(http.StatusAccepted, ResultAccepted, "accepted")
}

// validDeliveryID accepts what a GUID can be and a little more: printable
// ASCII without spaces, bounded.
func validDeliveryID(id string) bool {
	if len(id) > maxDeliveryIDLength {
		return false
	}
	for _, c := range id {
		if c > unicode.MaxASCII || !unicode.IsPrint(c) || c == ' ' {
			return false
		}
	}
	return true
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

// Run starts the workers and blocks until ctx ends; then it works through
// what is still queued for at most DrainTimeout and returns. Stop sending
// requests to the handler before ctx ends (Server does).
func (r *Receiver) Run(ctx context.Context) error {
	// Work continues past ctx's end while draining, for DrainTimeout.
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	var wg sync.WaitGroup
	for range r.opts.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.work(ctx, workCtx)
		}()
	}
	<-ctx.Done()
	timer := r.clock.NewTimer(r.opts.DrainTimeout)
	defer timer.Stop()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-timer.C():
		cancelWork()
		<-done
	}
	return nil
}

// work takes events from the queue until ctx ends, then drains it; events
// are processed with workCtx, which outlives ctx by the drain time.
func (r *Receiver) work(ctx, workCtx context.Context) {
	for {
		select {
		case it := <-r.queue:
			queueDepth.Set(float64(len(r.queue)))
			r.inOrder(workCtx, it)
		case <-ctx.Done():
			for {
				select {
				case it := <-r.queue:
					queueDepth.Set(float64(len(r.queue)))
					r.inOrder(workCtx, it)
				default:
					return
				}
			}
		}
	}
}

// inOrder processes it once the job's earlier events are done. An event
// waits only for events accepted before it, which other workers already
// took from the queue, so the wait always ends. Out of time (ctx over),
// it is left to the resync.
func (r *Receiver) inOrder(ctx context.Context, it item) {
	defer r.order.finish(it)
	if it.after != nil {
		select {
		case <-it.after:
		case <-ctx.Done():
		}
	}
	if ctx.Err() != nil {
		return // out of time: left to the resync
	}
	r.process(ctx, it)
}

// process routes and records one event. Failures are retried a few times;
// then the delivery id is forgotten, so that a redelivery from GitHub is
// processed again, and the resync will find the job.
func (r *Receiver) process(ctx context.Context, it item) {
	ev := it.ev
	log := r.log.WithValues("delivery", ev.DeliveryID, "action", ev.Action, "job", ev.Job.ID, "repository", ev.Job.Repository)
	var err error
	for attempt := 1; attempt <= recordAttempts; attempt++ {
		if attempt > 1 {
			select {
			case <-ctx.Done():
			case <-r.clock.After(r.backoff * time.Duration(1<<(attempt-2))):
			}
		}
		var done bool
		done, err = r.routeAndRecord(ctx, it, log)
		if done {
			return
		}
		if ctx.Err() != nil {
			break
		}
	}
	jobsRoutedTotal.WithLabelValues(OutcomeError).Inc()
	r.dedupe.forget(ev.DeliveryID)
	log.Error(err, "could not record a webhook's job; the periodic resync will pick it up")
}

// routeAndRecord makes one attempt; done is false when it should be retried.
func (r *Receiver) routeAndRecord(ctx context.Context, it item, log logr.Logger) (done bool, _ error) {
	ev := it.ev
	dec, err := r.opts.Router.Route(ctx, ev.Job)
	if err != nil {
		return false, fmt.Errorf("routing: %w", err)
	}
	if ev.Job.LabelsUnknown && !dec.Job.LabelsUnknown {
		// The event did not carry the job's labels (a GitLab Job Hook);
		// routing read them from the platform, and the record keeps them.
		ev.Job.Labels, ev.Job.LabelsUnknown = dec.Job.Labels, false
	}
	if len(dec.Ambiguous) > 0 {
		jobsRoutedTotal.WithLabelValues(OutcomeAmbiguous).Inc()
		log.Info("equally specific RunnerPools cover the job; none scales for it", "pools", len(dec.Ambiguous))
		if ev.Job.State == workload.JobQueued {
			r.warnAmbiguous(ev.Job, dec.Ambiguous)
		}
		return true, nil
	}
	if dec.Pool == nil && dec.Pending > 0 {
		// A pool created (or edited) just before its job: retried while
		// its scope check completes (docs/security.md).
		return false, fmt.Errorf("%d RunnerPools covering the job have not had their scope verified yet", dec.Pending)
	}
	if dec.Pool == nil {
		if !dec.InScope() {
			jobsRoutedTotal.WithLabelValues(OutcomeOutOfScope).Inc()
			log.V(1).Info("no RunnerPool serves the job's repository", "labels", ev.Job.Labels)
			return true, nil
		}
		jobsRoutedTotal.WithLabelValues(OutcomeUnmatched).Inc()
		log.V(1).Info("no RunnerPool covers the job's labels", "labels", ev.Job.Labels, "poolsInScope", len(dec.Unmatched))
		if ev.Job.State == workload.JobQueued {
			r.warnUnmatched(ev.Job, dec.Unmatched)
		}
		return true, nil
	}
	pool := dec.Pool.Pool
	err = r.opts.Recorder.Record(ctx, pool, ev, demand.SourceWebhook)
	if errors.Is(err, demand.ErrOtherHostsJob) {
		// Permanent: retrying changes nothing.
		jobsRoutedTotal.WithLabelValues(OutcomeError).Inc()
		log.Info("The job's id is recorded in its pool's namespace for another API host's job; it is not recorded", "pool", pool.String(), "reason", err.Error())
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("recording for RunnerPool %s: %w", pool, err)
	}
	jobsRoutedTotal.WithLabelValues(OutcomeMatched).Inc()
	processingSeconds.Observe(r.clock.Since(it.received).Seconds())
	log.V(1).Info("job recorded", "pool", pool.String())
	return true, nil
}

// warnUnmatched explains on each pool in the job's scope why it did not
// scale for the job.
func (r *Receiver) warnUnmatched(job workload.Job, unmatched []demand.Mismatch) {
	if r.opts.Events == nil {
		return
	}
	for _, m := range unmatched {
		pool := &hfv1.RunnerPool{
			TypeMeta:   metav1.TypeMeta{APIVersion: hfv1.GroupVersion.String(), Kind: "RunnerPool"},
			ObjectMeta: metav1.ObjectMeta{Namespace: m.Pool.Namespace, Name: m.Pool.Name, UID: m.UID},
		}
		if m.Untagged {
			r.opts.Events.Eventf(pool, corev1.EventTypeWarning, ReasonNoMatchingRunnerPool,
				"queued job %s of %s asks for no labels (an untagged job) and matches no RunnerPool; this pool's runners take only jobs with labels (runUntagged)",
				job.ID, job.Repository)
			continue
		}
		r.opts.Events.Eventf(pool, corev1.EventTypeWarning, ReasonNoMatchingRunnerPool,
			"queued job %s of %s (runs-on: %s) matches no RunnerPool; this pool's runners lack: %s",
			job.ID, job.Repository, labelList(job.Labels), labelList(m.Missing))
	}
}

// warnAmbiguous tells each of the equally specific pools that covered a
// queued job that none of them scaled for it, and which pools tie.
func (r *Receiver) warnAmbiguous(job workload.Job, tied []demand.Candidate) {
	if r.opts.Events == nil {
		return
	}
	names := make([]string, 0, len(tied))
	for _, c := range tied {
		names = append(names, c.Pool.String())
	}
	for _, c := range tied {
		pool := &hfv1.RunnerPool{
			TypeMeta:   metav1.TypeMeta{APIVersion: hfv1.GroupVersion.String(), Kind: "RunnerPool"},
			ObjectMeta: metav1.ObjectMeta{Namespace: c.Pool.Namespace, Name: c.Pool.Name, UID: c.UID},
		}
		r.opts.Events.Eventf(pool, corev1.EventTypeWarning, string(hfv1.AmbiguousJobRoutingReason),
			"queued job %s of %s (runs-on: %s) is covered as specifically by RunnerPools %s; none scales for it. "+
				"Give the pools distinct labels (spec.workload.github.labels) or scopes (spec.workload.github.repository)",
			job.ID, job.Repository, labelList(job.Labels), labelList(names))
	}
}

// labelList prints labels for an event message, bounded.
func labelList(labels []string) string {
	const maxShown = 10
	shown := labels[:min(len(labels), maxShown)]
	s := strings.Join(shown, ", ")
	if len(labels) > maxShown {
		s += fmt.Sprintf(" (and %d more)", len(labels)-maxShown)
	}
	if len(s) > 400 {
		s = s[:400] + "..."
	}
	if s == "" {
		s = "(none)"
	}
	return s
}
