package gitlabsim

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/simclock"
)

// APIPrefix is where GitLab serves its REST and runner APIs, on GitLab.com
// and on self-managed instances alike.
const APIPrefix = "/api/v4"

// Access levels, as GitLab numbers them (the REST API's access_level).
const (
	Guest      = 10
	Reporter   = 20
	Developer  = 30
	Maintainer = 40
	Owner      = 50
)

// Runner types, as the REST API names them (runner_type).
const (
	InstanceType = "instance_type"
	GroupType    = "group_type"
	ProjectType  = "project_type"
)

// Job statuses the simulator moves jobs through (a subset of GitLab's:
// no manual, scheduled, waiting_for_resource or preparing).
const (
	StatusCreated  = "created"
	StatusPending  = "pending"
	StatusRunning  = "running"
	StatusSuccess  = "success"
	StatusFailed   = "failed"
	StatusCanceled = "canceled"
	StatusSkipped  = "skipped"
)

// Clock is the simulator's source of time (package simclock).
type Clock = simclock.Clock

// NewFakeClock returns a clock that moves only when a test advances it.
func NewFakeClock(start time.Time) *simclock.FakeClock { return simclock.NewFakeClock(start) }

// Simulator is an in-memory GitLab; it is an http.Handler. All state sits
// behind one mutex; webhook deliveries are the only work done outside it
// (they wait on the network), by one goroutine per hook.
type Simulator struct {
	clock  Clock
	admin  bool
	log    *slog.Logger
	client *http.Client

	mu       sync.Mutex
	cfg      Config
	closed   bool
	rng      *mrand.Rand
	nextID   map[string]int64
	users    map[int64]*user
	groups   map[int64]*group
	projects map[int64]*project
	tokens   map[string]*accessToken
	runners  map[int64]*runner
	pipes    map[int64]*pipeline
	jobs     map[int64]*job
	jobOrder []int64
	hooks    map[int64]*hook
	// issued are every runner created, kept after its deletion, so that
	// tests can try a deleted runner's token (IssuedRunners).
	issued  []IssuedRunner
	faults  []*Fault
	buckets map[string]*bucket
	// queueTick changes whenever a job becomes pending or a runner changes,
	// as GitLab's runner queue value does; runners that send it back as
	// last_update get 204 at once while it has not moved.
	queueTick int64
	deliv     *deliveries
}

// Option customises a Simulator built by New.
type Option func(*Simulator)

// WithClock makes the simulator read time from c (e.g. a FakeClock).
func WithClock(c Clock) Option { return func(s *Simulator) { s.clock = c } }

// WithAdmin enables the /_sim/ admin API, which answers loopback clients
// only (it creates tokens and jobs and injects faults).
func WithAdmin(on bool) Option { return func(s *Simulator) { s.admin = on } }

// WithLogger sets the logger for webhook diagnostics.
func WithLogger(l *slog.Logger) Option { return func(s *Simulator) { s.log = l } }

// WithWebhookClient sets the HTTP client of webhook deliveries (default: a
// 10 s timeout, GitLab's default webhook timeout).
func WithWebhookClient(c *http.Client) Option { return func(s *Simulator) { s.client = c } }

// New builds a simulator from cfg. Call Close to stop webhook workers.
func New(cfg Config, opts ...Option) (*Simulator, error) {
	if cfg.RateLimit == 0 {
		cfg.RateLimit = 2000
	}
	if cfg.TraceUpdateInterval == 0 {
		cfg.TraceUpdateInterval = 3
	}
	if cfg.Version == "" {
		cfg.Version = "18.6.0"
	}
	s := &Simulator{
		clock:    simclock.RealClock{},
		log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		client:   &http.Client{Timeout: 10 * time.Second},
		cfg:      cfg,
		rng:      mrand.New(mrand.NewSource(cfg.Seed)),
		nextID:   map[string]int64{},
		users:    map[int64]*user{},
		groups:   map[int64]*group{},
		projects: map[int64]*project{},
		tokens:   map[string]*accessToken{},
		runners:  map[int64]*runner{},
		pipes:    map[int64]*pipeline{},
		jobs:     map[int64]*job{},
		hooks:    map[int64]*hook{},
		buckets:  map[string]*bucket{},
	}
	for _, o := range opts {
		o(s)
	}
	s.deliv = newDeliveries(s)
	if err := s.load(cfg); err != nil {
		return nil, fmt.Errorf("gitlab simulator config: %w", err)
	}
	return s, nil
}

// Close stops the webhook workers; queued deliveries are dropped.
func (s *Simulator) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.deliv.close()
}

// id hands out ids per kind, starting where GitLab.com's look plausible.
func (s *Simulator) id(kind string) int64 {
	base := map[string]int64{"user": 1000, "group": 2000, "project": 3000, "token": 100, "runner": 40000, "pipeline": 500000, "job": 9000000, "hook": 10, "manager": 70000}[kind]
	s.nextID[kind]++
	return base + s.nextID[kind]
}

// randomHex returns n random bytes in hex (tokens, UUIDs).
func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b)
}

// uuid returns a random version 4 UUID, the form of GitLab's webhook and
// event UUIDs.
func uuid() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// ServeHTTP routes /api/v4 to the REST and runner APIs and /_sim/ to the
// admin API and the runner stand-in's download.
func (s *Simulator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.EscapedPath()
	switch {
	case strings.HasPrefix(path, runnerPkgPrefix):
		s.serveRunnerPackage(w, r)
	case strings.HasPrefix(path, "/_sim/"):
		s.serveAdmin(w, r)
	case strings.HasPrefix(path, APIPrefix+"/"):
		s.serveAPI(w, r, strings.TrimPrefix(path, APIPrefix))
	default:
		writeMessage(w, http.StatusNotFound, "404 Not Found")
	}
}

// maxBody bounds every request body the simulator reads, except trace
// chunks (maxTraceChunk).
const maxBody = 1 << 20

// writeJSON answers with v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeMessage answers with GitLab's error body, {"message": "..."}; its
// messages start with the status ("404 Project Not Found").
func writeMessage(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"message": msg})
}

// writeError answers with Grape's parameter error body, {"error": "..."},
// which GitLab uses for missing or invalid parameters.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// timeJSON is the REST API's time format (ISO 8601, milliseconds, UTC).
func timeJSON(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

// timeHook is the webhook payloads' time format ("2023-10-23 15:09:56 UTC").
func timeHook(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format("2006-01-02 15:04:05 MST")
}
