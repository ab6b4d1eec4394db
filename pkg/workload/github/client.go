package github

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/bradleyfalzon/ghinstallation/v2"
	gh "github.com/google/go-github/v88/github"
	"k8s.io/utils/clock"

	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github/scaleset"
	"github.com/hyperfleet/hyperfleet/pkg/workload/workloadmetrics"
)

// DefaultBaseURL is GitHub.com's REST API.
const DefaultBaseURL = "https://api.github.com"

// Default tunables.
const (
	defaultHTTPTimeout = 30 * time.Second
	// defaultReserve is the part of the hourly budget kept for cleanup
	// calls (deregistering runners, cancelling runs), so that a burst of
	// new runners cannot leave HyperFleet unable to clean up after itself.
	defaultReserve = 100
	// defaultRunnerGroupID is GitHub's Default runner group.
	defaultRunnerGroupID = 1
)

// Config is one GitHub account scope and the operator's credentials for it.
type Config struct {
	// BaseURL is the REST API root: https://api.github.com, or
	// https://<host>/api/v3 for GitHub Enterprise Server.
	BaseURL string
	// Scope is the organization or repository runners register in.
	Scope workload.Scope
	// Token is a personal access token; set it or App.
	Token string
	// App is a GitHub App installation; set it or Token.
	App *AppCredentials
	// RegistrationTokenURL, when set, is the absolute API URL that issues
	// registration tokens (the template's registrationURLs, expanded);
	// empty uses the standard endpoint under BaseURL.
	RegistrationTokenURL string
	// RunnerGroup is the template's runner group; VerifyScope checks that
	// an enterprise's group allows the scope's organization.
	RunnerGroup string
	// RunnerURL is the URL a registration-token runner registers to, such
	// as https://github.com/octo-org/octo-repo.
	RunnerURL string
	// HTTPTimeout bounds each call (default 30s).
	HTTPTimeout time.Duration
	// Reserve is the rate-limit budget kept for cleanup calls (default 100,
	// at most a tenth of the budget).
	Reserve int
	// Transport is the base HTTP transport (TLS settings); nil uses
	// http.DefaultTransport.
	Transport http.RoundTripper
	// Clock drives rate-limit decisions; nil is the real clock.
	Clock clock.PassiveClock
	// ObserveRate, when set, sees every rate-limit update.
	ObserveRate func(RateSnapshot)
	// ObserveCall, when set, sees every API call: the operation, the HTTP
	// status (0 when none came back) and how long it took.
	ObserveCall func(op string, code int, d time.Duration)
	// Logger receives the runner scale-set client's and listener's logs
	// (feed.go); nil discards them.
	Logger *slog.Logger
}

// AppCredentials are a GitHub App's id, installation id and private key.
type AppCredentials struct {
	AppID          int64
	InstallationID int64
	// PrivateKey is the App's PEM private key.
	PrivateKey []byte
}

// Provider is the GitHub Actions workload.Provider.
type Provider struct {
	cfg    Config
	client *gh.Client
	gate   *rateGate
	clock  clock.PassiveClock
	// app is the installation transport of an App provider (nil for a
	// PAT): it knows the permissions the installation token was granted.
	app *ghinstallation.Transport

	mu     sync.Mutex
	groups map[string]int64
	// groupChecks caches an enterprise scope's runner group checks by
	// lower-case name (enterprise.go).
	groupChecks map[string]groupCheck
	// runnerPackages caches resolved runner releases by version/os/arch.
	runnerPackages map[string]cachedPackage
	// queuedRuns remembers the queued jobs of each unfinished run
	// (jobs.go).
	queuedRuns map[int64]seenRun
	// repositories is an organization scope's repository list
	// (repositories.go).
	repositories listedRepositories
	// pages are the listings read with conditional requests
	// (conditional.go).
	pages pageCache
	// ss is the runner scale-set client, built on first use, and
	// scaleSetIDs the ids of the scale sets opened, by scaleSetKey
	// (feed.go).
	ss          *scaleset.Client
	scaleSetIDs map[string]int
	log         *slog.Logger
}

var _ workload.Provider = (*Provider)(nil)

// New builds a provider. It checks the configuration but makes no call.
func New(cfg Config) (*Provider, error) {
	if cfg.Scope.Owner == "" && !cfg.Scope.IsEnterprise() {
		return nil, errors.New("github: the scope needs an owner (organization or user) or an enterprise")
	}
	if (cfg.Token == "") == (cfg.App == nil) {
		return nil, errors.New("github: set exactly one of a personal access token and a GitHub App")
	}
	if cfg.Scope.IsEnterprise() && cfg.App != nil {
		return nil, errors.New("github: enterprise runners need a personal access token (classic) with manage_runners:enterprise; GitHub Apps cannot manage them")
	}
	if cfg.BaseURL == "" {
		cfg.BaseURL = DefaultBaseURL
	}
	base, err := url.Parse(strings.TrimSuffix(cfg.BaseURL, "/") + "/")
	if err != nil || base.Scheme == "" || base.Host == "" {
		return nil, fmt.Errorf("github: API base URL %q is not an absolute URL", cfg.BaseURL)
	}
	if cfg.HTTPTimeout <= 0 {
		cfg.HTTPTimeout = defaultHTTPTimeout
	}
	if cfg.Reserve <= 0 {
		cfg.Reserve = defaultReserve
	}
	if cfg.Transport == nil {
		cfg.Transport = http.DefaultTransport
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}

	authed := cfg.Transport
	var app *ghinstallation.Transport
	if cfg.App != nil {
		// ghinstallation caches the installation token and fetches a new
		// one a minute before it expires; the token never leaves this
		// transport.
		itr, err := ghinstallation.New(cfg.Transport, cfg.App.AppID, cfg.App.InstallationID, cfg.App.PrivateKey)
		if err != nil {
			return nil, fmt.Errorf("github: App private key: %w", err)
		}
		itr.BaseURL = strings.TrimSuffix(base.String(), "/")
		authed, app = itr, itr
	}
	gate := &rateGate{next: authed, clock: cfg.Clock, reserve: cfg.Reserve, observe: cfg.ObserveRate}
	var rt http.RoundTripper = gate
	if cfg.ObserveCall != nil {
		rt = workloadmetrics.Observed(gate, operationOf, cfg.ObserveCall)
	}
	baseURL := base.String()
	opts := []gh.ClientOptionsFunc{
		gh.WithHTTPClient(&http.Client{Transport: rt, Timeout: cfg.HTTPTimeout}),
		gh.WithURLs(&baseURL, &baseURL),
		gh.WithUserAgent("hyperfleet"),
	}
	if cfg.Token != "" {
		opts = append(opts, gh.WithAuthToken(cfg.Token))
	}
	client, err := gh.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("github: client: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Provider{cfg: cfg, client: client, gate: gate, clock: cfg.Clock, app: app, groups: map[string]int64{}, groupChecks: map[string]groupCheck{},
		runnerPackages: map[string]cachedPackage{}, scaleSetIDs: map[string]int{}, log: log.With("platform", "GitHub", "scope", cfg.Scope.String())}, nil
}

// Scope implements workload.Provider.
func (p *Provider) Scope() workload.Scope { return p.cfg.Scope }

// Rate returns the rate-limit state GitHub last reported.
func (p *Provider) Rate() RateSnapshot { return p.gate.snapshot() }

// Fingerprint identifies the configuration and credentials a provider was
// built from (sha256, never the credentials themselves), so a cache can
// tell when to build a new one.
func Fingerprint(cfg Config) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00%s\x00%s\x00%d\x00%s\x00%s\x00", cfg.BaseURL, cfg.Scope.Owner, cfg.Scope.Repository, cfg.Token,
		cfg.RegistrationTokenURL, cfg.RunnerURL, cfg.HTTPTimeout, cfg.Scope.Enterprise, cfg.RunnerGroup)
	if a := cfg.App; a != nil {
		fmt.Fprintf(h, "%d\x00%d\x00%s", a.AppID, a.InstallationID, a.PrivateKey)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// route is how operationOf knows one operation: a path containing
// contains and ending in suffix, with method (each: empty for any).
type route struct {
	contains, suffix, method string
	operation                string
}

// routes are the operations of GitHub's calls, the first match winning.
var routes = []route{
	{suffix: "/actions/runners/generate-jitconfig", operation: "generate-jitconfig"},
	{suffix: "/actions/runners/registration-token", operation: "registration-token"},
	{suffix: "/actions/runner-groups", operation: "list-runner-groups"},
	{contains: "/actions/runner-groups/", suffix: "/organizations", operation: "list-runner-group-organizations"},
	{contains: "/actions/runners/", method: http.MethodDelete, operation: "delete-runner"},
	{contains: "/actions/runners/", operation: "get-runner"},
	{suffix: "/actions/runners", operation: "list-runners"},
	{suffix: "/cancel", operation: "cancel-run"},
	{suffix: "/jobs", operation: "list-jobs"},
	{contains: "/actions/jobs/", operation: "get-job"},
	{suffix: "/actions/runs", operation: "list-runs"},
	{suffix: "/installation/repositories", operation: "list-installation-repositories"},
	{contains: "/orgs/", suffix: "/repos", operation: "list-org-repositories"},
}

// operationOf names an API call by its route, never by ids or names, so
// that metrics stay bounded.
func operationOf(req *http.Request) string {
	p := req.URL.Path
	for _, r := range routes {
		if strings.Contains(p, r.contains) && strings.HasSuffix(p, r.suffix) && (r.method == "" || r.method == req.Method) {
			return r.operation
		}
	}
	return "other"
}

// operations are the names routes gives calls.
func operations() []string {
	out := make([]string, len(routes))
	for i, r := range routes {
		out[i] = r.operation
	}
	return out
}
