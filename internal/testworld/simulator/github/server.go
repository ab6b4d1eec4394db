package githubsim

import (
	"crypto/rsa"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// gheAPIPrefix is where GitHub Enterprise Server serves the REST API; the
// simulator serves it there and at the root (like api.github.com).
const gheAPIPrefix = "/api/v3"

// Simulator is an in-memory GitHub that speaks the REST API subset
// HyperFleet uses (self-hosted runners, workflow runs and jobs, App
// installation tokens), runs jobs on runners that connect through its own
// runner protocol, and delivers signed workflow_job webhooks. It is an
// http.Handler.
//
// All state sits behind one mutex; every request and every clock event
// takes it. Webhook deliveries are the only work done outside it (they
// wait on the network), by one goroutine per endpoint.
type Simulator struct {
	clock  Clock
	admin  bool
	log    *slog.Logger
	client *http.Client
	routes []*route

	mu            sync.Mutex
	cfg           Config
	closed        bool
	caPEM         []byte
	rng           *mrand.Rand
	owners        map[string]*owner // lower-case login
	enterprises   map[string]*owner // lower-case slug
	repos         map[string]*repo  // lower-case owner/name
	pats          map[string]*PATConfig
	apps          []*app
	installations map[int64]*installation
	tokens        map[string]*accessToken
	regTokens     map[string]*regToken
	buckets       map[string]*bucket
	runners       map[int64]*runner
	runs          map[int64]*run
	jobs          map[int64]*job
	jobOrder      []int64
	runOrder      []int64
	labelIDs      map[string]int64
	faults        faultState
	// injected counts injected faults by kind (InjectedFaults).
	injected      map[string]int
	reqSeq        uint64
	nextRunnerID  int64
	nextRunID     int64
	nextJobID     int64
	nextRunNumber map[int64]int64
	timers        map[Timer]bool

	hooks      *hookSet
	ss         scaleSetState
	lastServer string // scheme://host of the latest API request, for runner files
	// defaultSteps are the steps of jobs enqueued without their own
	// (SetDefaultJobSteps).
	defaultSteps []string
}

// Option customises a Simulator built by New.
type Option func(*Simulator)

// WithClock makes the simulator schedule all work on c (e.g. a FakeClock).
func WithClock(c Clock) Option { return func(s *Simulator) { s.clock = c } }

// WithAdmin enables the /_sim/ admin API (off unless asked for, in the Go
// API as in the standalone binary). It answers loopback clients only: it
// enqueues jobs, injects faults and moves the clock. The runner package
// under /_sim/runner/ is served either way.
func WithAdmin(enabled bool) Option { return func(s *Simulator) { s.admin = enabled } }

// WithLogger sets the logger for webhook and runner diagnostics.
func WithLogger(l *slog.Logger) Option { return func(s *Simulator) { s.log = l } }

// WithWebhookClient sets the HTTP client webhook deliveries use (default:
// 10 s timeout, like GitHub's). Tests whose receivers use TLS pass one that
// trusts them.
func WithWebhookClient(c *http.Client) Option { return func(s *Simulator) { s.client = c } }

// WithCACertificate sets the PEM CA certificate clients must trust to reach
// the simulator over HTTPS; it is added to the runner package as
// sim-ca.pem, which the runner scripts pass to curl.
func WithCACertificate(pem []byte) Option { return func(s *Simulator) { s.caPEM = pem } }

// New builds a simulator from cfg. Call Close to stop webhook workers and
// timers.
func New(cfg Config, opts ...Option) (*Simulator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid simulator config: %w", err)
	}
	if cfg.RateLimit == 0 {
		cfg.RateLimit = 5000
	}
	if cfg.UnauthenticatedRateLimit == 0 {
		cfg.UnauthenticatedRateLimit = 60
	}
	if cfg.HeartbeatTimeout == 0 {
		cfg.HeartbeatTimeout = Duration(time.Minute)
	}
	if cfg.EphemeralOfflineRemoval == 0 {
		cfg.EphemeralOfflineRemoval = Duration(24 * time.Hour)
	}
	if cfg.OfflineRemoval == 0 {
		cfg.OfflineRemoval = Duration(14 * 24 * time.Hour)
	}
	if cfg.RunnerVersion == "" {
		cfg.RunnerVersion = "2.329.0"
	}
	if cfg.Sender == "" {
		cfg.Sender = "octocat"
	}
	s := &Simulator{
		clock:         RealClock{},
		log:           slog.New(slog.NewTextHandler(io.Discard, nil)),
		client:        &http.Client{Timeout: 10 * time.Second},
		cfg:           cfg,
		rng:           mrand.New(mrand.NewSource(cfg.Seed)),
		owners:        map[string]*owner{},
		enterprises:   map[string]*owner{},
		repos:         map[string]*repo{},
		pats:          map[string]*PATConfig{},
		installations: map[int64]*installation{},
		tokens:        map[string]*accessToken{},
		regTokens:     map[string]*regToken{},
		buckets:       map[string]*bucket{},
		runners:       map[int64]*runner{},
		runs:          map[int64]*run{},
		jobs:          map[int64]*job{},
		labelIDs:      map[string]int64{},
		nextRunnerID:  10,
		nextRunID:     10_000_000_000,
		nextJobID:     30_000_000_000,
		nextRunNumber: map[int64]int64{},
		timers:        map[Timer]bool{},
	}
	for _, o := range opts {
		o(s)
	}
	s.ss.init()
	s.routes = apiRoutes()
	if err := s.initAccounts(); err != nil {
		return nil, err
	}
	s.hooks = newHookSet(s)
	for _, w := range cfg.Webhooks {
		secret := w.Secret
		if w.SecretFile != "" {
			raw, err := os.ReadFile(w.SecretFile)
			if err != nil {
				return nil, fmt.Errorf("webhook %s: read secret: %w", w.URL, err)
			}
			secret = strings.TrimRight(string(raw), "\r\n")
		}
		if _, err := s.AddWebhook(Webhook{ID: w.ID, URL: w.URL, Secret: secret, Scope: w.Scope}); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// initAccounts builds owners, repositories, tokens and Apps from the config.
func (s *Simulator) initAccounts() error {
	nextID := int64(100_000)
	id := func(v int64) int64 {
		if v != 0 {
			return v
		}
		nextID++
		return nextID
	}
	for _, o := range s.cfg.Organizations {
		ow := &owner{login: o.Login, id: id(o.ID), org: true, groups: []*runnerGroup{{id: 1, name: "Default", visibility: "all", def: true, allowsPublic: false}}}
		for _, g := range o.RunnerGroups {
			vis := g.Visibility
			if vis == "" {
				vis = "all"
			}
			ow.groups = append(ow.groups, &runnerGroup{id: g.ID, name: g.Name, visibility: vis, allowsPublic: g.AllowsPublicRepositories})
		}
		s.owners[strings.ToLower(o.Login)] = ow
	}
	for _, u := range s.cfg.Users {
		s.owners[strings.ToLower(u.Login)] = &owner{login: u.Login, id: id(u.ID)}
	}
	s.initEnterprises(id)
	ensureUser := func(login string) *owner {
		if o := s.owners[strings.ToLower(login)]; o != nil {
			return o
		}
		o := &owner{login: login, id: id(0)}
		s.owners[strings.ToLower(login)] = o
		return o
	}
	ensureUser(s.cfg.Sender)
	for _, r := range s.cfg.Repositories {
		ownerLogin, name, _ := strings.Cut(r.Name, "/")
		s.repos[strings.ToLower(r.Name)] = newRepo(ensureUser(ownerLogin), name, id(r.ID), id(0), r)
	}
	for i := range s.cfg.PATs {
		p := s.cfg.PATs[i]
		ensureUser(p.Login)
		s.pats[p.Token] = &p
	}
	for _, ac := range s.cfg.Apps {
		pemText := ac.PublicKey
		if ac.PublicKeyFile != "" {
			raw, err := os.ReadFile(ac.PublicKeyFile)
			if err != nil {
				return fmt.Errorf("app %d: read public key: %w", ac.ID, err)
			}
			pemText = string(raw)
		}
		key, err := ParseRSAPublicKey([]byte(pemText))
		if err != nil {
			return fmt.Errorf("app %d: %w", ac.ID, err)
		}
		a := &app{id: ac.ID, clientID: ac.ClientID, slug: ac.Slug, key: key}
		if a.slug == "" {
			a.slug = fmt.Sprintf("app-%d", ac.ID)
		}
		for _, ic := range ac.Installations {
			acct := s.owners[strings.ToLower(ic.Account)]
			if acct == nil {
				return fmt.Errorf("installation %d: account %q is neither an organization nor a user", ic.ID, ic.Account)
			}
			perms := ic.Permissions
			if perms == nil {
				perms = map[string]string{"administration": "write", "organization_self_hosted_runners": "write", "actions": "read", "metadata": "read"}
			}
			sel := ic.RepositorySelection
			if sel == "" {
				sel = "all"
			}
			in := &installation{id: ic.ID, app: a, account: acct, permissions: perms, selection: sel, repos: map[string]bool{}, rateLimit: ic.RateLimit}
			for _, rn := range ic.Repositories {
				in.repos[strings.ToLower(rn)] = true
			}
			a.installations = append(a.installations, in)
			s.installations[ic.ID] = in
		}
		s.apps = append(s.apps, a)
	}
	return nil
}

// Close stops webhook workers and timers; further API requests fail with
// 503. It is safe to call more than once.
func (s *Simulator) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for t := range s.timers {
		t.Stop()
	}
	s.timers = map[Timer]bool{}
	for _, r := range s.runners {
		r.wakeLocked()
	}
	s.mu.Unlock()
	s.hooks.close()
	return nil
}

// afterFunc schedules f under the state lock on the simulator's clock.
// Timers are tracked so that Close can stop them.
func (s *Simulator) afterFunc(d time.Duration, f func()) Timer {
	var t Timer
	t = s.clock.AfterFunc(d, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.timers, t)
		if s.closed {
			return
		}
		f()
	})
	s.timers[t] = true
	return t
}

func (s *Simulator) stopTimer(t Timer) {
	if t != nil {
		t.Stop()
		delete(s.timers, t)
	}
}

// owner is an organization or user account.
type owner struct {
	login  string
	id     int64
	org    bool
	groups []*runnerGroup
	// enterprise: the account is an enterprise (login is its slug), over
	// the organizations members.
	enterprise bool
	members    []*owner
}

func (o *owner) group(id int64) *runnerGroup {
	for _, g := range o.groups {
		if g.id == id {
			return g
		}
	}
	return nil
}

func (o *owner) groupByName(name string) *runnerGroup {
	for _, g := range o.groups {
		if strings.EqualFold(g.name, name) {
			return g
		}
	}
	return nil
}

// runnerGroup is an organization runner group; repositories have only the
// implicit Default group (id 1).
type runnerGroup struct {
	id           int64
	name         string
	visibility   string
	def          bool
	allowsPublic bool
	// selected are the organizations an enterprise group of visibility
	// selected serves.
	selected []*owner
}

var defaultGroup = &runnerGroup{id: 1, name: "Default", visibility: "all", def: true}

// repo is a repository.
type repo struct {
	owner         *owner
	name          string
	id            int64
	private       bool
	defaultBranch string
	license       string
	description   string
	archived      bool
	workflowID    int64
}

func (r *repo) fullName() string { return r.owner.login + "/" + r.name }

// apiError is an error response with GitHub's body shape.
type apiError struct {
	code   int
	msg    string
	errors []string
	doc    string
	header http.Header
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s", e.code, e.msg) }

func errNotFound() *apiError { return &apiError{code: http.StatusNotFound, msg: "Not Found"} }

func errValidation(format string, args ...any) *apiError {
	return &apiError{code: http.StatusUnprocessableEntity, msg: fmt.Sprintf(format, args...)}
}

// request is one API call being served.
type request struct {
	r     *http.Request
	route *route
	vars  map[string]string
	query url.Values
	body  []byte
	id    *identity
	owner *owner
	repo  *repo
	now   time.Time
	reqID string
	// base is scheme://host of the request, for Link headers.
	base   string
	header http.Header
}

// authKind is how a route authenticates.
type authKind int

const (
	authToken authKind = iota // PAT or installation token
	authJWT                   // App JWT
)

// scopeKind is the account a route works on.
type scopeKind int

const (
	scopeNone scopeKind = iota
	scopeRepo
	scopeOrg
	scopeEnterprise
)

// route is one REST endpoint. codes lists every status it can answer
// (besides injected faults); the contract test exercises each of them.
type route struct {
	method  string
	pattern string
	segs    []string
	auth    authKind
	scope   scopeKind
	perm    string
	permLvl string
	doc     string
	codes   []int
	handler func(s *Simulator, q *request) (int, any, error)
}

func newRoute(method, pattern string, auth authKind, scope scopeKind, doc string, codes []int, h func(*Simulator, *request) (int, any, error)) *route {
	if method == http.MethodGet {
		// Every GET answers a conditional request for an unchanged
		// response with 304 (serveAPI).
		codes = append(codes, http.StatusNotModified)
	}
	return &route{method: method, pattern: pattern, segs: strings.Split(strings.Trim(pattern, "/"), "/"), auth: auth, scope: scope,
		doc: "https://docs.github.com/rest/" + doc, codes: codes, handler: h}
}

func (rt *route) withPerm(perm, level string) *route { rt.perm, rt.permLvl = perm, level; return rt }

// Statuses every token-authenticated route can answer: bad credentials,
// primary and secondary rate limits.
var commonCodes = []int{http.StatusUnauthorized, http.StatusForbidden, http.StatusTooManyRequests}

// apiRoutes is the routing table.
func apiRoutes() []*route {
	const (
		shr  = "actions/self-hosted-runners#"
		runs = "actions/workflow-runs#"
		jobs = "actions/workflow-jobs#"
	)
	c := func(codes ...int) []int { return append(codes, commonCodes...) }
	repoRunners := func(rt *route) *route { return rt.withPerm("administration", "write") }
	orgRunners := func(rt *route) *route { return rt.withPerm("organization_self_hosted_runners", "write") }
	return []*route{
		repoRunners(newRoute("POST", "/repos/{owner}/{repo}/actions/runners/registration-token", authToken, scopeRepo, shr+"create-a-registration-token-for-a-repository", c(201, 404), (*Simulator).handleRegistrationToken)),
		orgRunners(newRoute("POST", "/orgs/{org}/actions/runners/registration-token", authToken, scopeOrg, shr+"create-a-registration-token-for-an-organization", c(201, 404), (*Simulator).handleRegistrationToken)),
		repoRunners(newRoute("POST", "/repos/{owner}/{repo}/actions/runners/generate-jitconfig", authToken, scopeRepo, shr+"create-configuration-for-a-just-in-time-runner-for-a-repository", c(201, 400, 404, 409, 422), (*Simulator).handleJITConfig)),
		orgRunners(newRoute("POST", "/orgs/{org}/actions/runners/generate-jitconfig", authToken, scopeOrg, shr+"create-configuration-for-a-just-in-time-runner-for-an-organization", c(201, 400, 404, 409, 422), (*Simulator).handleJITConfig)),
		repoRunners(newRoute("GET", "/repos/{owner}/{repo}/actions/runners", authToken, scopeRepo, shr+"list-self-hosted-runners-for-a-repository", c(200, 404), (*Simulator).handleListRunners)),
		orgRunners(newRoute("GET", "/orgs/{org}/actions/runners", authToken, scopeOrg, shr+"list-self-hosted-runners-for-an-organization", c(200, 404), (*Simulator).handleListRunners)),
		repoRunners(newRoute("GET", "/repos/{owner}/{repo}/actions/runners/{runner_id}", authToken, scopeRepo, shr+"get-a-self-hosted-runner-for-a-repository", c(200, 404), (*Simulator).handleGetRunner)),
		orgRunners(newRoute("GET", "/orgs/{org}/actions/runners/{runner_id}", authToken, scopeOrg, shr+"get-a-self-hosted-runner-for-an-organization", c(200, 404), (*Simulator).handleGetRunner)),
		repoRunners(newRoute("DELETE", "/repos/{owner}/{repo}/actions/runners/{runner_id}", authToken, scopeRepo, shr+"delete-a-self-hosted-runner-from-a-repository", c(204, 404, 422), (*Simulator).handleDeleteRunner)),
		orgRunners(newRoute("DELETE", "/orgs/{org}/actions/runners/{runner_id}", authToken, scopeOrg, shr+"delete-a-self-hosted-runner-from-an-organization", c(204, 404, 422), (*Simulator).handleDeleteRunner)),
		orgRunners(newRoute("GET", "/orgs/{org}/actions/runner-groups", authToken, scopeOrg, "actions/self-hosted-runner-groups#list-self-hosted-runner-groups-for-an-organization", c(200, 404), (*Simulator).handleListRunnerGroups)),
		// Enterprise runners (GitHub Enterprise Cloud's description).
		enterpriseRoute(newRoute("POST", "/enterprises/{enterprise}/actions/runners/registration-token", authToken, scopeEnterprise, shr+"create-a-registration-token-for-an-enterprise", c(201, 404), (*Simulator).handleRegistrationToken)),
		enterpriseRoute(newRoute("POST", "/enterprises/{enterprise}/actions/runners/generate-jitconfig", authToken, scopeEnterprise, shr+"create-configuration-for-a-just-in-time-runner-for-an-enterprise", c(201, 400, 404, 409, 422), (*Simulator).handleJITConfig)),
		enterpriseRoute(newRoute("GET", "/enterprises/{enterprise}/actions/runners", authToken, scopeEnterprise, shr+"list-self-hosted-runners-for-an-enterprise", c(200, 404), (*Simulator).handleListRunners)),
		enterpriseRoute(newRoute("GET", "/enterprises/{enterprise}/actions/runners/{runner_id}", authToken, scopeEnterprise, shr+"get-a-self-hosted-runner-for-an-enterprise", c(200, 404), (*Simulator).handleGetRunner)),
		enterpriseRoute(newRoute("DELETE", "/enterprises/{enterprise}/actions/runners/{runner_id}", authToken, scopeEnterprise, shr+"delete-a-self-hosted-runner-from-an-enterprise", c(204, 404, 422), (*Simulator).handleDeleteRunner)),
		enterpriseRoute(newRoute("GET", "/enterprises/{enterprise}/actions/runner-groups", authToken, scopeEnterprise, "actions/self-hosted-runner-groups#list-self-hosted-runner-groups-for-an-enterprise", c(200, 404), (*Simulator).handleListRunnerGroups)),
		enterpriseRoute(newRoute("GET", "/enterprises/{enterprise}/actions/runner-groups/{runner_group_id}/organizations", authToken, scopeEnterprise, "actions/self-hosted-runner-groups#list-organization-access-to-a-self-hosted-runner-group-in-an-enterprise", c(200, 404), (*Simulator).handleListRunnerGroupOrgs)),
		// Organization pools' resync lists the repositories it scans.
		newRoute("GET", "/orgs/{org}/repos", authToken, scopeOrg, "repos/repos#list-organization-repositories", c(200, 404), (*Simulator).handleListOrgRepos).withPerm("metadata", "read"),
		newRoute("GET", "/installation/repositories", authToken, scopeNone, "apps/installations#list-repositories-accessible-to-the-app-installation", c(200), (*Simulator).handleListInstallationRepos),
		newRoute("GET", "/repos/{owner}/{repo}/actions/runs", authToken, scopeRepo, runs+"list-workflow-runs-for-a-repository", c(200, 404), (*Simulator).handleListRuns).withPerm("actions", "read"),
		newRoute("GET", "/repos/{owner}/{repo}/actions/runs/{run_id}", authToken, scopeRepo, runs+"get-a-workflow-run", c(200, 404), (*Simulator).handleGetRun).withPerm("actions", "read"),
		newRoute("GET", "/repos/{owner}/{repo}/actions/runs/{run_id}/jobs", authToken, scopeRepo, jobs+"list-jobs-for-a-workflow-run", c(200, 404), (*Simulator).handleListJobs).withPerm("actions", "read"),
		newRoute("GET", "/repos/{owner}/{repo}/actions/jobs/{job_id}", authToken, scopeRepo, jobs+"get-a-job-for-a-workflow-run", c(200, 404), (*Simulator).handleGetJob).withPerm("actions", "read"),
		newRoute("POST", "/repos/{owner}/{repo}/actions/runs/{run_id}/cancel", authToken, scopeRepo, runs+"cancel-a-workflow-run", c(202, 404, 409), (*Simulator).handleCancelRun).withPerm("actions", "write"),
		// Public repositories' releases need no permission; the operator
		// resolves the runner package from actions/runner's.
		newRoute("GET", "/repos/{owner}/{repo}/releases/latest", authToken, scopeNone, "releases/releases#get-the-latest-release", c(200, 404), (*Simulator).handleLatestRelease),
		newRoute("GET", "/repos/{owner}/{repo}/releases/tags/{tag}", authToken, scopeNone, "releases/releases#get-a-release-by-tag-name", c(200, 404), (*Simulator).handleReleaseByTag),
		newRoute("POST", "/app/installations/{installation_id}/access_tokens", authJWT, scopeNone, "apps/apps#create-an-installation-access-token-for-an-app", c(201, 400, 404, 422), (*Simulator).handleAccessToken),
	}
}

// match finds the route for method and path (relative to the API root).
// The second result reports whether the path exists for another method.
func (s *Simulator) match(method, path string) (*route, map[string]string, bool) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	pathExists := false
	for _, rt := range s.routes {
		vars, ok := matchSegs(rt.segs, parts)
		if !ok {
			continue
		}
		if rt.method == method {
			return rt, vars, true
		}
		pathExists = true
	}
	return nil, nil, pathExists
}

func matchSegs(segs, parts []string) (map[string]string, bool) {
	if len(segs) != len(parts) {
		return nil, false
	}
	vars := map[string]string{}
	for i, sg := range segs {
		if strings.HasPrefix(sg, "{") {
			if parts[i] == "" {
				return nil, false
			}
			v, err := url.PathUnescape(parts[i])
			if err != nil {
				return nil, false
			}
			vars[sg[1:len(sg)-1]] = v
			continue
		}
		if sg != parts[i] {
			return nil, false
		}
	}
	return vars, true
}

// ServeHTTP implements http.Handler.
func (s *Simulator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case strings.HasPrefix(r.URL.Path, runnerPkgPrefix):
		s.serveRunnerPackage(w, r)
		return
	case strings.HasPrefix(r.URL.Path, adminPrefix):
		s.serveAdmin(w, r)
		return
	case strings.HasPrefix(r.URL.Path, runnerAPIPrefix):
		s.serveRunnerAPI(w, r)
		return
	case strings.HasPrefix(r.URL.Path, actionsPrefix):
		s.serveActions(w, r)
		return
	}
	path := r.URL.Path
	if path == gheAPIPrefix || strings.HasPrefix(path, gheAPIPrefix+"/") {
		path = strings.TrimPrefix(path, gheAPIPrefix)
	}
	if path == runnerRegistration {
		s.serveRunnerRegistration(w, r)
		return
	}
	s.serveAPI(w, r, path)
}

// serveAPI runs one REST call in GitHub's order: authentication (401),
// primary rate limit (403), injected secondary limits and errors, the
// account and its access (404, 403), then the handler.
func (s *Simulator) serveAPI(w http.ResponseWriter, r *http.Request, path string) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 10<<20))
	if err != nil {
		http.Error(w, "read request body", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqSeq++
	q := &request{r: r, query: r.URL.Query(), body: body, now: s.clock.Now(), reqID: requestID(s.reqSeq), base: requestBase(r), header: http.Header{}}
	h := w.Header()
	h.Set("X-GitHub-Request-Id", q.reqID)
	h.Set("X-GitHub-Media-Type", "github.v3; format=json")
	h.Set("X-GitHub-Api-Version-Selected", "2022-11-28")
	if s.closed {
		s.writeError(w, q, &apiError{code: http.StatusServiceUnavailable, msg: "simulator closed"})
		return
	}
	s.lastServer = q.base
	rt, vars, _ := s.match(r.Method, path)
	q.route, q.vars = rt, vars
	authKind := authToken
	if rt != nil {
		authKind = rt.auth
	}
	id, aerr := s.authenticateLocked(q, authKind)
	if aerr != nil {
		s.setRateHeaders(h, s.unauthBucketLocked(r, q.now), q.now)
		s.writeError(w, q, aerr)
		return
	}
	q.id = id
	b := s.bucketLocked(id, q.now)
	if id.kind == "anonymous" {
		b = s.unauthBucketLocked(r, q.now)
	}
	if b.used >= b.limit {
		s.setRateHeaders(h, b, q.now)
		s.writeError(w, q, &apiError{code: http.StatusForbidden, msg: fmt.Sprintf("API rate limit exceeded for %s. If you reach out to GitHub Support for help, please include the request ID %s and timestamp %s UTC.", id.rateSubject(r), q.reqID, q.now.UTC().Format("2006-01-02 15:04:05")),
			doc: "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"})
		return
	}
	b.used++
	s.setRateHeaders(h, b, q.now)
	if rt == nil {
		// GitHub answers 404 both for unknown paths and for known paths
		// with another method.
		s.writeError(w, q, &apiError{code: http.StatusNotFound, msg: "Not Found", doc: "https://docs.github.com/rest"})
		return
	}
	if id.kind == "anonymous" {
		s.writeError(w, q, &apiError{code: http.StatusUnauthorized, msg: "Requires authentication"})
		return
	}
	if fe := s.injectFaultLocked(q, path, h, b); fe != nil {
		s.writeError(w, q, fe)
		return
	}
	if err := s.resolveScopeLocked(q); err != nil {
		s.writeError(w, q, err)
		return
	}
	code, resp, herr := rt.handler(s, q)
	if herr != nil {
		var ae *apiError
		if !errors.As(herr, &ae) {
			ae = &apiError{code: http.StatusInternalServerError, msg: herr.Error()}
		}
		s.writeError(w, q, ae)
		return
	}
	for k, v := range q.header {
		h[k] = v
	}
	if code == http.StatusNoContent {
		w.WriteHeader(code)
		return
	}
	raw, err := json.Marshal(resp)
	if err != nil {
		s.writeError(w, q, &apiError{code: http.StatusInternalServerError, msg: "encode response: " + err.Error()})
		return
	}
	if r.Method == http.MethodGet && code == http.StatusOK {
		etag := fmt.Sprintf(`W/"%x"`, sha256.Sum256(raw))
		h.Set("ETag", etag)
		if etagMatches(r.Header.Get("If-None-Match"), etag) {
			// "Making a conditional request does not count against your
			// primary rate limit if a 304 response is returned and the
			// request was made while correctly authorized" (GitHub's REST
			// best practices).
			b.used--
			s.setRateHeaders(h, b, q.now)
			w.WriteHeader(http.StatusNotModified)
			return
		}
	}
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(raw)))
	w.WriteHeader(code)
	_, _ = w.Write(raw)
}

// etagMatches reports whether an If-None-Match header names etag (or
// "*"); weak and strong forms compare equal, as GitHub's do.
func etagMatches(header, etag string) bool {
	weak := func(t string) string { return strings.TrimPrefix(strings.TrimSpace(t), "W/") }
	for _, t := range strings.Split(header, ",") {
		if t = strings.TrimSpace(t); t == "*" || t != "" && weak(t) == weak(etag) {
			return true
		}
	}
	return false
}

// resolveScopeLocked finds the route's repository or organization and
// checks that the caller may use it: unknown accounts and accounts the
// caller cannot see are 404 (GitHub does not reveal private resources),
// a missing App permission is 403.
func (s *Simulator) resolveScopeLocked(q *request) *apiError {
	switch q.route.scope {
	case scopeRepo:
		rp := s.repos[strings.ToLower(q.vars["owner"]+"/"+q.vars["repo"])]
		if rp == nil {
			return errNotFound()
		}
		q.owner, q.repo = rp.owner, rp
	case scopeOrg:
		o := s.owners[strings.ToLower(q.vars["org"])]
		if o == nil || !o.org {
			return errNotFound()
		}
		q.owner = o
	case scopeEnterprise:
		o := s.enterprises[strings.ToLower(q.vars["enterprise"])]
		if o == nil {
			return errNotFound()
		}
		q.owner = o
	default:
		return nil
	}
	if !q.id.canSee(q.owner, q.repo) {
		return errNotFound()
	}
	if q.route.scope == scopeEnterprise && !q.id.managesEnterpriseRunners() {
		return &apiError{code: http.StatusForbidden, msg: "Resource not accessible by personal access token: the enterprise's runners need a token (classic) with the manage_runners:enterprise scope"}
	}
	if q.route.perm != "" && q.id.kind == "installation" && !hasPermission(q.id.token.permissions, q.route.perm, q.route.permLvl) {
		return &apiError{code: http.StatusForbidden, msg: "Resource not accessible by integration"}
	}
	return nil
}

// hasPermission reports whether perms grant perm at level (write implies
// read, admin implies both).
func hasPermission(perms map[string]string, perm, level string) bool {
	rank := map[string]int{"read": 1, "write": 2, "admin": 3}
	return rank[perms[perm]] >= rank[level]
}

// writeError sends GitHub's error body: message, documentation_url and the
// status as a string (as api.github.com does since 2024).
func (s *Simulator) writeError(w http.ResponseWriter, q *request, e *apiError) {
	doc := e.doc
	if doc == "" && q.route != nil {
		doc = q.route.doc
	}
	if doc == "" {
		doc = "https://docs.github.com/rest"
	}
	body := map[string]any{"message": e.msg, "documentation_url": doc, "status": strconv.Itoa(e.code)}
	if len(e.errors) > 0 {
		body["errors"] = e.errors
	}
	raw, _ := json.Marshal(body)
	h := w.Header()
	for k, v := range e.header {
		h[k] = v
	}
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(raw)))
	w.WriteHeader(e.code)
	_, _ = w.Write(raw)
}

// requestID renders a request id in GitHub's shape (five hex groups).
func requestID(seq uint64) string {
	return fmt.Sprintf("%04X:%04X:%06X:%07X:%08X", 0xC0DE, seq%0xFFFF, seq*7919%0xFFFFFF, seq*104729%0xFFFFFFF, uint32(seq*2654435761))
}

// requestBase is scheme://host as the client addressed the simulator.
func requestBase(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// apiBase is the REST root used in API object URLs.
func (s *Simulator) apiBase() string {
	if s.cfg.ServerURL != "" {
		return strings.TrimRight(s.cfg.ServerURL, "/") + gheAPIPrefix
	}
	return "https://api.github.com"
}

// htmlBase is the web root used in html_url fields.
func (s *Simulator) htmlBase() string {
	if s.cfg.ServerURL != "" {
		return strings.TrimRight(s.cfg.ServerURL, "/")
	}
	return "https://github.com"
}

// serverBase is the URL runners reach the simulator at.
func (s *Simulator) serverBase() string {
	if s.cfg.ServerURL != "" {
		return strings.TrimRight(s.cfg.ServerURL, "/")
	}
	if s.lastServer != "" {
		return s.lastServer
	}
	return "https://127.0.0.1"
}

// SetServerURL sets Config.ServerURL after the fact, for tests whose server
// address is known only once it listens.
func (s *Simulator) SetServerURL(u string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg.ServerURL = strings.TrimRight(u, "/")
}

// SetCACertificate sets the CA the runner package tells curl to trust.
func (s *Simulator) SetCACertificate(pem []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.caPEM = append([]byte(nil), pem...)
}

// pagination reads per_page (default 30, at most 100) and page and returns
// the slice bounds for total items, setting GitHub's Link header.
func (q *request) paginate(total int) (int, int) {
	perPage := 30
	if v, err := strconv.Atoi(q.query.Get("per_page")); err == nil && v > 0 {
		perPage = min(v, 100)
	}
	page := 1
	if v, err := strconv.Atoi(q.query.Get("page")); err == nil && v > 0 {
		page = v
	}
	last := max((total+perPage-1)/perPage, 1)
	link := func(p int, rel string) string {
		v := url.Values{}
		for k, vs := range q.query {
			v[k] = vs
		}
		v.Set("per_page", strconv.Itoa(perPage))
		v.Set("page", strconv.Itoa(p))
		return fmt.Sprintf("<%s%s?%s>; rel=%q", q.base, q.r.URL.Path, v.Encode(), rel)
	}
	var links []string
	if page > 1 {
		links = append(links, link(min(page-1, last), "prev"))
	}
	if page < last {
		links = append(links, link(page+1, "next"), link(last, "last"))
	}
	if page > 1 {
		links = append(links, link(1, "first"))
	}
	if len(links) > 0 {
		q.header.Set("Link", strings.Join(links, ", "))
	}
	start := min((page-1)*perPage, total)
	return start, min(start+perPage, total)
}

// clientIP is the remote address without port.
func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// ghTime formats a time as GitHub does in API objects.
func ghTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05Z") }

// ghTimeOrNil is ghTime, or nil for the zero time.
func ghTimeOrNil(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return ghTime(t)
}

// randomString returns n characters from alphabet, drawn from the seeded
// generator (under the state lock).
func (s *Simulator) randomString(n int, alphabet string) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[s.rng.Intn(len(alphabet))]
	}
	return string(b)
}

const alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

// newGUID returns a random GUID (delivery ids, runner client ids).
func (s *Simulator) newGUID() string {
	b := make([]byte, 16)
	for i := range b {
		b[i] = byte(s.rng.Intn(256))
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// app is a GitHub App.
type app struct {
	id            int64
	clientID      string
	slug          string
	key           *rsa.PublicKey
	installations []*installation
}

// installation is an App installation.
type installation struct {
	id          int64
	app         *app
	account     *owner
	permissions map[string]string
	selection   string
	repos       map[string]bool
	rateLimit   int
}

// installationFor returns the first installation on an account, for the
// webhook payloads' installation field.
func (s *Simulator) installationFor(o *owner) *installation {
	for _, a := range s.apps {
		for _, in := range a.installations {
			if in.account == o {
				return in
			}
		}
	}
	return nil
}
