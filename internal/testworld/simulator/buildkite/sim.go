package buildkitesim

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/simclock"
)

// Config describes the simulated Buildkite organization and its limits.
type Config struct {
	// Organization is the organization's slug (default "acme").
	Organization string `json:"organization,omitempty"`
	// APITokens are the REST API access tokens and their scopes (such as
	// read_agents, write_builds, read_clusters, write_clusters).
	APITokens []APIToken `json:"apiTokens,omitempty"`
	// RateLimit is how many REST requests the organization may make per
	// minute (default 200, Buildkite's documented REST limit).
	RateLimit int `json:"rateLimit,omitempty"`
	// PingInterval, HeartbeatInterval and JobStatusInterval are the
	// seconds the register response tells agents (defaults 10, 60, 5).
	PingInterval      int `json:"pingInterval,omitempty"`
	HeartbeatInterval int `json:"heartbeatInterval,omitempty"`
	JobStatusInterval int `json:"jobStatusInterval,omitempty"`
	// AgentVersion is the version the served agent tarball is named by.
	AgentVersion string `json:"agentVersion,omitempty"`
	// AgentBinary is the path of the binary the tarball under /_sim/agent/
	// carries; empty serves none.
	AgentBinary string `json:"agentBinary,omitempty"`
}

// APIToken is a REST API access token with its scopes.
type APIToken struct {
	Token  string   `json:"token"`
	Scopes []string `json:"scopes"`
}

// maxBody bounds every request body the simulator reads (the agent's log
// chunks are at most chunkMaxBytes, compressed).
const maxBody = 4 << 20

// chunkMaxBytes is the chunk size the simulator tells agents to upload
// (api.Job's chunks_max_size_bytes); logMaxBytes bounds a job's whole log.
const (
	chunkMaxBytes = 100 * 1024
	logMaxBytes   = 16 << 20
)

// Simulator is an in-memory Buildkite: an http.Handler serving the agent
// API under /v3, the REST subset under /v2 and the admin API under /_sim.
// All state sits behind one mutex; webhook deliveries run outside it.
type Simulator struct {
	admin bool
	clock Clock
	log   *slog.Logger
	hooks *hookSet
	// release is the agent tarball (release.go), built once.
	release release

	mu        sync.Mutex
	cfg       Config
	org       *organization
	clusters  []*cluster
	pipelines map[string]*pipeline // slug
	builds    []*build
	jobs      map[string]*job   // id
	agents    map[string]*agent // id
	apiTokens map[string]APIToken
	stacks    map[string]*stack    // key
	jobTokens map[string]*jobToken // token
	faults    []Fault
	injected  int
	window    rateWindow
}

// Option customises a Simulator built by New.
type Option func(*Simulator)

// WithAdmin enables the /_sim/ admin API over HTTP (off unless asked for,
// as in cmd/github-sim); it answers loopback clients only. The Go methods
// (CreateCluster, CreateBuild, Job, ...) work either way, and the agent
// tarball under /_sim/agent/ is served either way.
func WithAdmin(enabled bool) Option { return func(s *Simulator) { s.admin = enabled } }

// WithClock makes the simulator read time from c (e.g. a FakeClock).
func WithClock(c Clock) Option { return func(s *Simulator) { s.clock = c } }

// WithLogger sets the logger for webhook diagnostics.
func WithLogger(l *slog.Logger) Option { return func(s *Simulator) { s.log = l } }

// WithWebhookClient sets the client webhook deliveries use (default: 10 s
// timeout).
func WithWebhookClient(c *http.Client) Option {
	return func(s *Simulator) { s.hooks.client = c }
}

// New builds a simulator with one organization (cfg.Organization) that has
// no clusters yet; the admin API adds them.
func New(cfg Config, opts ...Option) *Simulator {
	if cfg.Organization == "" {
		cfg.Organization = "acme"
	}
	if cfg.RateLimit == 0 {
		cfg.RateLimit = 200
	}
	if cfg.PingInterval == 0 {
		cfg.PingInterval = 10
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = 60
	}
	if cfg.JobStatusInterval == 0 {
		cfg.JobStatusInterval = 5
	}
	if cfg.AgentVersion == "" {
		cfg.AgentVersion = "3.138.1"
	}
	s := &Simulator{
		clock:     simclock.RealClock{},
		log:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		cfg:       cfg,
		pipelines: map[string]*pipeline{},
		jobs:      map[string]*job{},
		agents:    map[string]*agent{},
		apiTokens: map[string]APIToken{},
		stacks:    map[string]*stack{},
		jobTokens: map[string]*jobToken{},
	}
	s.hooks = newHookSet(s)
	for _, o := range opts {
		o(s)
	}
	s.org = &organization{id: newUUID(), slug: cfg.Organization, name: cfg.Organization, createdAt: s.clock.Now()}
	for _, t := range cfg.APITokens {
		s.apiTokens[t.Token] = t
	}
	return s
}

// Close stops webhook deliveries.
func (s *Simulator) Close() { s.hooks.close() }

// ServeHTTP routes /v3 (agent API), /v2 (REST), /_sim (admin and agent
// tarball).
func (s *Simulator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The body is read whole (bounded) before any handler takes the state
	// lock, so that a slow client never holds it.
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeMessage(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body: %v", err))
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	switch p := r.URL.Path; {
	case strings.HasPrefix(p, "/v3/"):
		s.serveAgentAPI(w, r, strings.TrimPrefix(p, "/v3/"))
	case strings.HasPrefix(p, "/v2/"):
		s.serveREST(w, r, strings.TrimPrefix(p, "/v2/"))
	case strings.HasPrefix(p, "/_sim/agent/"):
		s.serveAgentRelease(w, r, strings.TrimPrefix(p, "/_sim/agent/"))
	case strings.HasPrefix(p, "/_sim/") && s.admin:
		s.serveAdmin(w, r, strings.TrimPrefix(p, "/_sim/"))
	default:
		writeMessage(w, http.StatusNotFound, "Not Found")
	}
}

type organization struct {
	id, slug, name string
	createdAt      time.Time
}

type cluster struct {
	id, name, description string
	defaultQueue          string // queue id
	queues                []*queue
	tokens                []*clusterToken
	createdAt             time.Time
}

type queue struct {
	id, key, description string
	createdAt            time.Time
}

type clusterToken struct {
	id, description, token string
	allowedIPs             string
	expiresAt              time.Time // zero: never
	createdAt              time.Time
	cluster                *cluster
	deleted                bool
}

type pipeline struct {
	id, slug, name string
	cluster        *cluster
	nextNumber     int
	createdAt      time.Time
}

type build struct {
	id        string
	number    int
	pipeline  *pipeline
	message   string
	branch    string
	commit    string
	jobs      []*job
	createdAt time.Time
}

// Job states as Buildkite's REST API names them.
const (
	stateWaiting   = "waiting"
	stateScheduled = "scheduled"
	stateAssigned  = "assigned"
	stateAccepted  = "accepted"
	stateRunning   = "running"
	statePassed    = "passed"
	stateFailed    = "failed"
	stateCanceling = "canceling"
	stateCanceled  = "canceled"
)

type job struct {
	id         string
	build      *build
	stepKey    string
	label      string
	command    string
	rules      []string // agent query rules, as given
	state      string
	agent      *agent
	log        []byte
	logChunks  int
	exitStatus *int
	signal     string
	headerTime map[string]string
	// reservedBy holds the job for a stack until reservedUntil: no other
	// stack reserves it and no agent but one with its job acquisition
	// token takes it.
	reservedBy    *stack
	reservedUntil time.Time
	// accessToken is the job's own access token, handed to the agent with
	// the job (api.Job's token) and to the job as
	// BUILDKITE_AGENT_ACCESS_TOKEN: it authenticates this job's own calls
	// (start, log chunks, header times, state, finish) until the job
	// finishes, and nothing else (jobScoped).
	accessToken string

	createdAt, scheduledAt, runnableAt, startedAt, finishedAt time.Time
}

func (j *job) finished() bool {
	return j.state == statePassed || j.state == stateFailed || j.state == stateCanceled
}

type agent struct {
	id, name, accessToken string
	token                 *clusterToken
	cluster               *cluster
	tags                  []string
	hostname, version     string
	ipAddress, userAgent  string
	ignoreInDispatches    bool
	state                 string // connected, disconnected, stopping, stopped, lost
	stopRequested         bool
	job                   *job
	// jat is the job acquisition token the agent registered with: it
	// takes that token's job and no other.
	jat                 *jobToken
	lastJobFinishedAt   time.Time
	createdAt, lastSeen time.Time
}

// apiError is a Buildkite error answer: a status and {"message": ...}.
type apiError struct {
	code int
	msg  string
	// retryAfter, when set, is sent as Retry-After (seconds): the agent
	// waits that long before it asks again (core.Client.AcquireJob).
	retryAfter int
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s", e.code, e.msg) }

func errf(code int, format string, args ...any) *apiError {
	return &apiError{code: code, msg: fmt.Sprintf(format, args...)}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	if v != nil {
		_ = json.NewEncoder(w).Encode(v)
	}
}

// writeMessage writes Buildkite's error body, {"message": "..."}.
func writeMessage(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"message": msg})
}

func writeErr(w http.ResponseWriter, err error) {
	var ae *apiError
	if errors.As(err, &ae) {
		if ae.retryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(ae.retryAfter))
		}
		writeMessage(w, ae.code, ae.msg)
		return
	}
	writeMessage(w, http.StatusInternalServerError, err.Error())
}

func decodeBody(r *http.Request, v any) error {
	if r.ContentLength == 0 {
		return nil
	}
	dec := json.NewDecoder(r.Body)
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return errf(http.StatusBadRequest, "Problems parsing JSON: %v", err)
	}
	return nil
}

// newUUID returns a random version-4 UUID, the form of every Buildkite id.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func randomToken(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// bkTime formats a time as Buildkite's APIs do (RFC 3339, UTC, milliseconds).
func bkTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}
