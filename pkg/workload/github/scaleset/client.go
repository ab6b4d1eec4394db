// Package scaleset is a client for GitHub Actions' runner scale-set
// protocol, the webhook-free way to learn about jobs that Actions Runner
// Controller's listener uses: exchange a registration token for an admin
// token of the Actions service, create or adopt a runner scale set, hold
// its message session, long-poll its message queue, acquire the jobs it
// offers and generate JIT configurations for the scale set's runners.
//
// The protocol has no published Go client on the module proxy; this one
// follows the behaviour of ARC's (github.com/actions/scaleset): API
// version 6.0-preview, admin-token refresh a minute before expiry, one
// session refresh on an expired message-queue token, retries of 5xx and
// transport errors with exponential backoff. It is neutral of the
// operator: Listener turns messages into Events for any consumer.
// internal/testworld/simulator/github serves the same protocol for tests.
//
// The URLs the protocol's answers name (the Actions service's, the message
// queue's) are where the client sends its admin and message-queue tokens,
// so it calls them only over https and on the hosts the API URL allows
// (allowedHost), and it follows no redirect: a hostile or tampered answer
// would otherwise have the client carry its tokens to any URL.
package scaleset

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	// APIVersion is the Actions service API version every call names.
	APIVersion = "6.0-preview"
	// HeaderMaxCapacity tells the service how many runners the listener
	// may still start, so it can size the jobs it offers.
	HeaderMaxCapacity = "X-ScaleSetMaxCapacity"

	scaleSetsPath    = "_apis/runtime/runnerscalesets"
	runnerGroupsPath = "_apis/runtime/runnergroups/"

	// maxBody bounds every response body the client reads.
	maxBody = 4 << 20
	// refreshMargin: the admin token is renewed this long before it
	// expires, as ARC does.
	refreshMargin = 60 * time.Second
)

// Sentinel errors, matched with errors.Is against a *ResponseError.
var (
	// ErrTokenExpired: 401 from the service (admin or message-queue token).
	ErrTokenExpired = errors.New("actions service token expired or invalid")
	// ErrSessionConflict: 409 creating a session another listener holds.
	ErrSessionConflict = errors.New("message session held by another listener")
	// ErrNotFound: 404 (scale set, session or message gone).
	ErrNotFound = errors.New("not found")
	// ErrServer: 5xx after the retries.
	ErrServer = errors.New("actions service error")
	// ErrUntrustedURL: an answer named a URL the client does not call
	// with its tokens (not https, or not on an allowed host), or
	// redirected it; not retried.
	ErrUntrustedURL = errors.New("untrusted URL")
)

// Hosts of GitHub.com's REST API and of its Actions service: the
// registration exchange of api.github.com answers a service URL under
// actionsServiceDomain (such as pipelines.actions.githubusercontent.com),
// and sessions a message queue URL there too.
const (
	publicAPIHost        = "api.github.com"
	actionsServiceDomain = "actions.githubusercontent.com"
)

// ResponseError is an unexpected answer of GitHub or the Actions service.
type ResponseError struct {
	Method     string
	URL        string
	StatusCode int
	// TypeName and Message come from the service's error body when it has
	// one (e.g. TaskAgentSessionConflictException).
	TypeName string
	Message  string
}

func (e *ResponseError) Error() string {
	s := fmt.Sprintf("%s %s: HTTP %d", e.Method, e.URL, e.StatusCode)
	if e.TypeName != "" {
		s += " " + e.TypeName
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Unwrap names the sentinel for the status.
func (e *ResponseError) Unwrap() error {
	switch {
	case e.StatusCode == http.StatusUnauthorized:
		return ErrTokenExpired
	case e.StatusCode == http.StatusConflict:
		return ErrSessionConflict
	case e.StatusCode == http.StatusNotFound:
		return ErrNotFound
	case e.StatusCode >= 500:
		return ErrServer
	}
	return nil
}

// Config configures a Client.
type Config struct {
	// ConfigURL names the scope the scale set registers in, as a runner's
	// --url: https://github.com/<org> or https://github.com/<owner>/<repo>
	// (GitHub Enterprise Server: its host instead of github.com).
	ConfigURL string
	// APIURL is the REST root: https://api.github.com, or
	// https://<host>/api/v3 on GitHub Enterprise Server.
	APIURL string
	// Token returns a GitHub token (PAT or App installation token) that
	// may create registration tokens for the scope.
	Token func(ctx context.Context) (string, error)
	// HTTPClient makes every request (its Timeout should be zero or above
	// PollTimeout; per-request deadlines come from RequestTimeout and
	// PollTimeout). Default: http.DefaultTransport.
	HTTPClient *http.Client
	// Logger receives structured logs (default: discarded).
	Logger *slog.Logger
	// UserAgent names the caller (default "hyperfleet").
	UserAgent string
	// RetryMax is how often a 5xx, 429 or transport error is retried
	// (default 4, ARC's); RetryWaitMin/Max bound the exponential backoff
	// between tries (default 1 s and 30 s, ARC's).
	RetryMax                   int
	RetryWaitMin, RetryWaitMax time.Duration
	// RequestTimeout bounds one ordinary call (default 30 s); PollTimeout
	// one message long poll (default 70 s: the service answers within
	// 50 s).
	RequestTimeout, PollTimeout time.Duration
	// Now is the clock for token expiry (default time.Now).
	Now func() time.Time
}

// Client talks to GitHub (registration) and the Actions service of one
// scope. It is safe for concurrent use.
type Client struct {
	cfg       Config
	log       *slog.Logger
	http      *http.Client
	userAgent string
	apiURL    *url.URL

	mu         sync.Mutex
	serviceURL string
	adminToken string
	expires    time.Time
}

// New builds a Client; it contacts nobody until the first call.
func New(cfg Config) (*Client, error) {
	if cfg.ConfigURL == "" || cfg.APIURL == "" || cfg.Token == nil {
		return nil, errors.New("scaleset: ConfigURL, APIURL and Token are required")
	}
	if _, err := scopePath(cfg.ConfigURL); err != nil {
		return nil, err
	}
	api, err := url.Parse(strings.TrimRight(cfg.APIURL, "/"))
	if err != nil || api.Scheme != "https" || api.Host == "" {
		return nil, fmt.Errorf("scaleset: invalid APIURL %q: an https:// URL is required (its tokens travel to it)", cfg.APIURL)
	}
	hc := &http.Client{}
	if cfg.HTTPClient != nil {
		c := *cfg.HTTPClient
		hc = &c
	}
	// A redirect would carry the request, its Authorization header
	// included, wherever the answer says (Go forwards it to the same host
	// name on any port or scheme): the client follows none.
	hc.CheckRedirect = refuseRedirect
	cfg.HTTPClient = hc
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = "hyperfleet"
	}
	if cfg.RetryMax == 0 {
		cfg.RetryMax = 4
	}
	if cfg.RetryWaitMin == 0 {
		cfg.RetryWaitMin = time.Second
	}
	if cfg.RetryWaitMax == 0 {
		cfg.RetryWaitMax = 30 * time.Second
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = 30 * time.Second
	}
	if cfg.PollTimeout == 0 {
		cfg.PollTimeout = 70 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	// ARC's client sends a JSON user agent (system, version, commit,
	// subsystem, build); the service logs it. Same fields here.
	version, commit := buildVersion()
	ua, err := json.Marshal(map[string]string{"system": cfg.UserAgent, "version": version, "commit_sha": commit,
		"subsystem": "listener", "build_version": version, "build_commit_sha": commit, "kind": "hyperfleet-scaleset"})
	if err != nil {
		return nil, fmt.Errorf("scaleset: user agent: %w", err)
	}
	return &Client{cfg: cfg, log: cfg.Logger.With("githubConfigURL", cfg.ConfigURL), http: cfg.HTTPClient, userAgent: string(ua), apiURL: api}, nil
}

// refuseRedirect is every client's CheckRedirect: the redirect is not
// followed and the call fails with ErrUntrustedURL.
func refuseRedirect(req *http.Request, via []*http.Request) error {
	from := "the request"
	if len(via) > 0 {
		from = via[len(via)-1].Method + " " + redact(via[len(via)-1].URL.String())
	}
	return fmt.Errorf("%w: %s was redirected to %s; the client follows no redirects, since its token would go along: check the API URL and the network between the operator and GitHub (a proxy that redirects)",
		ErrUntrustedURL, from, redact(req.URL.String()))
}

// allowedHost says whether the client may call u, a URL from an answer of
// the protocol (what names it, for the error), with its tokens: https on
// the default port, and the host of the Actions service the API URL goes
// with: on GitHub.com (api.github.com) actions.githubusercontent.com or a
// host under it, on GitHub Enterprise Server the server's own host
// (https://<host>/_services/...), the API URL's host and port.
func (c *Client) allowedHost(what, raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%w: %s %q is not a URL: %w", ErrUntrustedURL, what, redact(raw), err)
	}
	if u.Scheme != "https" || u.Host == "" || u.User != nil {
		return fmt.Errorf("%w: %s %q is not an https:// URL; the client sends its tokens over https only", ErrUntrustedURL, what, redact(raw))
	}
	host := canonicalHost(u)
	api := canonicalHost(c.apiURL)
	if api == publicAPIHost {
		if u.Port() != "" && u.Port() != "443" || host != actionsServiceDomain && !strings.HasSuffix(host, "."+actionsServiceDomain) {
			return fmt.Errorf("%w: %s %q is not on GitHub's Actions service (%s or a host under it), where the client calls with the tokens of %s",
				ErrUntrustedURL, what, redact(raw), actionsServiceDomain, api)
		}
		return nil
	}
	if host != api {
		return fmt.Errorf("%w: %s %q is not on %s, the GitHub Enterprise Server of the API URL, where the client calls with its tokens",
			ErrUntrustedURL, what, redact(raw), api)
	}
	return nil
}

// canonicalHost is u's host in lower case, with its port unless it is
// https's default (as pkg/workload.CanonicalHost writes it).
func canonicalHost(u *url.URL) string {
	host, port := strings.ToLower(u.Hostname()), u.Port()
	if port == "" || port == "443" {
		return host
	}
	return net.JoinHostPort(host, port)
}

// scopePath is the registration-token path for the config URL's scope.
func scopePath(configURL string) (string, error) {
	u, err := url.Parse(configURL)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("scaleset: invalid ConfigURL %q", configURL)
	}
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	switch {
	case len(parts) == 2 && parts[0] == "enterprises" && parts[1] != "":
		return "/enterprises/" + parts[1] + "/actions/runners/registration-token", nil
	case len(parts) == 1 && parts[0] != "":
		return "/orgs/" + parts[0] + "/actions/runners/registration-token", nil
	case len(parts) == 2 && parts[0] != "" && parts[1] != "":
		return "/repos/" + parts[0] + "/" + parts[1] + "/actions/runners/registration-token", nil
	}
	return "", fmt.Errorf("scaleset: ConfigURL %q names no organization, repository or enterprise", configURL)
}

// request is one HTTP call, rebuilt for each retry.
type request struct {
	method  string
	url     string
	body    []byte
	header  http.Header
	timeout time.Duration
	// retryAuth retries 401/403 too (the registration exchange: a fresh
	// registration token may not have propagated yet, as ARC allows for).
	retryAuth bool
}

// do sends req with retries and returns the status and the bounded body.
func (c *Client) do(ctx context.Context, req request) (int, []byte, error) {
	if req.timeout == 0 {
		req.timeout = c.cfg.RequestTimeout
	}
	wait := c.cfg.RetryWaitMin
	for attempt := 0; ; attempt++ {
		code, body, err := c.once(ctx, req)
		if errors.Is(err, ErrUntrustedURL) {
			// The same answer again would be no better.
			return code, body, err
		}
		retry := err != nil || code == http.StatusTooManyRequests || (code >= 500 && code != http.StatusNotImplemented) ||
			(req.retryAuth && (code == http.StatusUnauthorized || code == http.StatusForbidden))
		if !retry || attempt >= c.cfg.RetryMax || ctx.Err() != nil {
			return code, body, err
		}
		c.log.Debug("retrying actions request", "method", req.method, "url", redact(req.url), "status", code, "attempt", attempt+1, "error", err)
		select {
		case <-ctx.Done():
			return 0, nil, fmt.Errorf("%s %s: %w", req.method, redact(req.url), ctx.Err())
		case <-time.After(wait):
		}
		wait = min(wait*2, c.cfg.RetryWaitMax)
	}
}

func (c *Client) once(ctx context.Context, req request) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, req.timeout)
	defer cancel()
	var body io.Reader
	if req.body != nil {
		body = bytes.NewReader(req.body)
	}
	hr, err := http.NewRequestWithContext(ctx, req.method, req.url, body)
	if err != nil {
		return 0, nil, fmt.Errorf("build %s request: %w", req.method, err)
	}
	for k, v := range req.header {
		hr.Header[k] = v
	}
	hr.Header.Set("User-Agent", c.userAgent)
	resp, err := c.http.Do(hr)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", req.method, redact(req.url), err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("%s %s: read body: %w", req.method, redact(req.url), err)
	}
	if len(data) > maxBody {
		return resp.StatusCode, nil, fmt.Errorf("%s %s: response body above %d bytes", req.method, redact(req.url), maxBody)
	}
	// The service may start bodies with a UTF-8 byte order mark.
	return resp.StatusCode, bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")), nil
}

// expect sends req (do) and returns the answer's body when its status is
// want, a *ResponseError for any other; errors begin with what.
func (c *Client) expect(ctx context.Context, what string, want int, req request) ([]byte, error) {
	code, body, err := c.do(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if code != want {
		return nil, fmt.Errorf("%s: %w", what, responseError(req.method, req.url, code, body))
	}
	return body, nil
}

// redact drops the query (it may carry session ids) from logged URLs.
func redact(u string) string {
	if i := strings.IndexByte(u, '?'); i >= 0 {
		return u[:i]
	}
	return u
}

func responseError(method, u string, code int, body []byte) error {
	e := &ResponseError{Method: method, URL: redact(u), StatusCode: code}
	var b struct {
		TypeName string `json:"typeName"`
		Message  string `json:"message"`
	}
	if json.Unmarshal(body, &b) == nil {
		e.TypeName, e.Message = b.TypeName, b.Message
	}
	if len(e.Message) > 512 {
		e.Message = e.Message[:512]
	}
	return e
}

// refreshLocked renews the admin token when it expires within a minute
// (or force): a registration token from the REST API, then the exchange
// at /actions/runner-registration.
func (c *Client) refreshLocked(ctx context.Context, force bool) error {
	if !force && c.adminToken != "" && c.cfg.Now().Add(refreshMargin).Before(c.expires) {
		return nil
	}
	c.log.Info("refreshing actions service admin token", "expiresAt", c.expires)
	gh, err := c.cfg.Token(ctx)
	if err != nil {
		return fmt.Errorf("github token: %w", err)
	}
	path, err := scopePath(c.cfg.ConfigURL)
	if err != nil {
		return err
	}
	u := c.apiURL.String() + path
	body, err := c.expect(ctx, "registration token", http.StatusCreated, request{method: http.MethodPost, url: u, header: http.Header{
		"Accept": {"application/vnd.github+json"}, "Authorization": {"Bearer " + gh}, "X-Github-Api-Version": {"2022-11-28"}}})
	if err != nil {
		return err
	}
	var rt struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal(body, &rt); err != nil || rt.Token == "" {
		return fmt.Errorf("registration token: undecodable answer: %w", errors.Join(err, errors.New("no token")))
	}
	reqBody, err := json.Marshal(map[string]string{"url": c.cfg.ConfigURL, "runner_event": "register"})
	if err != nil {
		return fmt.Errorf("encode registration exchange: %w", err)
	}
	u = c.apiURL.String() + "/actions/runner-registration"
	code, body, err := c.do(ctx, request{method: http.MethodPost, url: u, body: reqBody, retryAuth: true, header: http.Header{
		"Content-Type": {"application/json"}, "Authorization": {"RemoteAuth " + rt.Token}}})
	if err != nil {
		return fmt.Errorf("actions service registration: %w", err)
	}
	if code < 200 || code > 299 {
		return fmt.Errorf("actions service registration: %w", responseError(http.MethodPost, u, code, body))
	}
	var conn struct {
		URL   string `json:"url"`
		Token string `json:"token"`
	}
	if err := json.Unmarshal(body, &conn); err != nil {
		return fmt.Errorf("actions service registration: decode: %w", err)
	}
	if conn.URL == "" || conn.Token == "" {
		return errors.New("actions service registration: answer lacks url or token")
	}
	if err := c.allowedHost("the Actions service URL of the registration answer", conn.URL); err != nil {
		return fmt.Errorf("actions service registration: %w", err)
	}
	exp, err := tokenExpiry(conn.Token)
	if err != nil {
		return fmt.Errorf("actions service admin token: %w", err)
	}
	c.serviceURL, c.adminToken, c.expires = strings.TrimRight(conn.URL, "/")+"/", conn.Token, exp
	c.log.Info("actions service admin token refreshed", "serviceURL", c.serviceURL, "expiresAt", exp)
	return nil
}

// tokenExpiry reads the exp claim of a JWT without verifying it (the
// client only needs to know when to refresh; the service verifies).
func tokenExpiry(jwt string) (time.Time, error) {
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		return time.Time{}, errors.New("not a JWT")
	}
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}, fmt.Errorf("decode JWT claims: %w", err)
	}
	var claims struct {
		Exp json.Number `json:"exp"`
	}
	if err := json.Unmarshal(raw, &claims); err != nil {
		return time.Time{}, fmt.Errorf("decode JWT claims: %w", err)
	}
	sec, err := claims.Exp.Int64()
	if err != nil || sec <= 0 {
		return time.Time{}, errors.New("JWT has no exp claim")
	}
	return time.Unix(sec, 0), nil
}

// serviceCall sends an admin-token call to the Actions service, renewing
// the token first when due and once more on a 401 (the service may revoke
// a token before its exp).
func (c *Client) serviceCall(ctx context.Context, method, path string, query url.Values, in any, want int, out any) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return fmt.Errorf("encode %s %s: %w", method, path, err)
		}
	}
	for attempt := 0; ; attempt++ {
		c.mu.Lock()
		err := c.refreshLocked(ctx, attempt > 0)
		base, tok := c.serviceURL, c.adminToken
		c.mu.Unlock()
		if err != nil {
			return err
		}
		q := url.Values{}
		for k, v := range query {
			q[k] = v
		}
		q.Set("api-version", APIVersion)
		u := base + path + "?" + q.Encode()
		h := http.Header{"Content-Type": {"application/json"}, "Authorization": {"Bearer " + tok}}
		code, data, err := c.do(ctx, request{method: method, url: u, body: body, header: h})
		if err != nil {
			return err
		}
		if code == http.StatusUnauthorized && attempt == 0 {
			c.log.Info("actions service refused the admin token; refreshing", "method", method, "path", path)
			continue
		}
		if code != want {
			return responseError(method, u, code, data)
		}
		if out != nil {
			if err := json.Unmarshal(data, out); err != nil {
				return fmt.Errorf("decode %s %s: %w", method, path, err)
			}
		}
		return nil
	}
}

// RunnerGroupByName finds a runner group of the scope.
func (c *Client) RunnerGroupByName(ctx context.Context, name string) (*RunnerGroup, error) {
	var list struct {
		Count int           `json:"count"`
		Value []RunnerGroup `json:"value"`
	}
	if err := c.serviceCall(ctx, http.MethodGet, runnerGroupsPath, url.Values{"groupName": {name}}, nil, http.StatusOK, &list); err != nil {
		return nil, fmt.Errorf("get runner group %q: %w", name, err)
	}
	for i := range list.Value {
		if strings.EqualFold(list.Value[i].Name, name) {
			return &list.Value[i], nil
		}
	}
	return nil, fmt.Errorf("runner group %q: %w", name, ErrNotFound)
}

// ScaleSet returns the scale set named name in the runner group, or nil.
func (c *Client) ScaleSet(ctx context.Context, runnerGroupID int, name string) (*ScaleSet, error) {
	var list struct {
		Count int        `json:"count"`
		Value []ScaleSet `json:"value"`
	}
	q := url.Values{"runnerGroupId": {strconv.Itoa(runnerGroupID)}, "name": {name}}
	if err := c.serviceCall(ctx, http.MethodGet, scaleSetsPath, q, nil, http.StatusOK, &list); err != nil {
		return nil, fmt.Errorf("get scale set %q: %w", name, err)
	}
	switch len(list.Value) {
	case 0:
		return nil, nil
	case 1:
		return &list.Value[0], nil
	}
	return nil, fmt.Errorf("get scale set %q: %d scale sets have that name", name, len(list.Value))
}

// ScaleSetByID returns a scale set.
func (c *Client) ScaleSetByID(ctx context.Context, id int) (*ScaleSet, error) {
	var ss ScaleSet
	if err := c.serviceCall(ctx, http.MethodGet, fmt.Sprintf("%s/%d", scaleSetsPath, id), nil, nil, http.StatusOK, &ss); err != nil {
		return nil, fmt.Errorf("get scale set %d: %w", id, err)
	}
	return &ss, nil
}

// withLabelTypes fills label types ("System" when empty) and, as ARC does,
// gives a scale set without labels its name as its one label.
func withLabelTypes(ss ScaleSet) ScaleSet {
	if len(ss.Labels) == 0 && ss.Name != "" {
		ss.Labels = []Label{{Name: ss.Name}}
	}
	labels := make([]Label, len(ss.Labels))
	for i, l := range ss.Labels {
		if l.Type == "" {
			l.Type = "System"
		}
		labels[i] = l
	}
	ss.Labels = labels
	return ss
}

// CreateScaleSet creates a scale set (names are unique per runner group).
func (c *Client) CreateScaleSet(ctx context.Context, ss ScaleSet) (*ScaleSet, error) {
	if ss.Name == "" {
		return nil, errors.New("create scale set: a name is required")
	}
	var out ScaleSet
	if err := c.serviceCall(ctx, http.MethodPost, scaleSetsPath, nil, withLabelTypes(ss), http.StatusOK, &out); err != nil {
		return nil, fmt.Errorf("create scale set %q: %w", ss.Name, err)
	}
	return &out, nil
}

// UpdateScaleSet changes a scale set's name, runner group, labels or
// runner setting (zero fields stay).
func (c *Client) UpdateScaleSet(ctx context.Context, id int, ss ScaleSet) (*ScaleSet, error) {
	var out ScaleSet
	if err := c.serviceCall(ctx, http.MethodPatch, fmt.Sprintf("%s/%d", scaleSetsPath, id), nil, withLabelTypes(ss), http.StatusOK, &out); err != nil {
		return nil, fmt.Errorf("update scale set %d: %w", id, err)
	}
	return &out, nil
}

// DeleteScaleSet deletes a scale set.
func (c *Client) DeleteScaleSet(ctx context.Context, id int) error {
	if err := c.serviceCall(ctx, http.MethodDelete, fmt.Sprintf("%s/%d", scaleSetsPath, id), nil, nil, http.StatusNoContent, nil); err != nil {
		return fmt.Errorf("delete scale set %d: %w", id, err)
	}
	return nil
}

// runnerSetting is the setting of every scale set HyperFleet makes: its
// runners run one job each in a VM made for it, so a self-update would
// download and install a runner at the start of every job, in a VM thrown
// away after it.
func runnerSetting() *RunnerSetting { return &RunnerSetting{DisableUpdate: true} }

// EnsureScaleSet adopts the scale set of that name in the runner group
// (updating its labels and runner setting when they differ) or creates
// it, with self-update disabled. A scale set found without DisableUpdate
// (made by an older HyperFleet, or by hand) is updated: the service writes
// the setting into the JIT configurations it generates from then on. (A
// service that did not echo the setting back would cost one PATCH per
// call, that is per listener start.)
func (c *Client) EnsureScaleSet(ctx context.Context, runnerGroup, name string, labels []string) (*ScaleSet, error) {
	g, err := c.RunnerGroupByName(ctx, runnerGroup)
	if err != nil {
		return nil, err
	}
	want := ScaleSet{Name: name, RunnerGroupID: g.ID, RunnerSetting: runnerSetting()}
	for _, l := range labels {
		want.Labels = append(want.Labels, Label{Name: l})
	}
	want = withLabelTypes(want)
	have, err := c.ScaleSet(ctx, g.ID, name)
	if err != nil {
		return nil, err
	}
	if have == nil {
		c.log.Info("creating runner scale set", "name", name, "runnerGroup", g.Name, "labels", labels)
		return c.CreateScaleSet(ctx, want)
	}
	settingOK := have.RunnerSetting != nil && *have.RunnerSetting == *want.RunnerSetting
	if sameLabels(have.Labels, want.Labels) && settingOK {
		return have, nil
	}
	c.log.Info("updating runner scale set", "scaleSetID", have.ID, "name", name, "labels", labels, "disableUpdate", want.RunnerSetting.DisableUpdate)
	return c.UpdateScaleSet(ctx, have.ID, ScaleSet{Labels: want.Labels, RunnerSetting: want.RunnerSetting})
}

func sameLabels(a, b []Label) bool {
	if len(a) != len(b) {
		return false
	}
	set := map[string]bool{}
	for _, l := range a {
		set[strings.ToLower(l.Name)] = true
	}
	for _, l := range b {
		if !set[strings.ToLower(l.Name)] {
			return false
		}
	}
	return true
}

// GenerateJITConfig registers an ephemeral runner of the scale set and
// returns the configuration its run.sh --jitconfig takes.
func (c *Client) GenerateJITConfig(ctx context.Context, scaleSetID int, name, workFolder string) (*JITConfig, error) {
	if workFolder == "" {
		workFolder = "_work"
	}
	var out JITConfig
	in := map[string]string{"name": name, "workFolder": workFolder}
	if err := c.serviceCall(ctx, http.MethodPost, fmt.Sprintf("%s/%d/generatejitconfig", scaleSetsPath, scaleSetID), nil, in, http.StatusOK, &out); err != nil {
		return nil, fmt.Errorf("generate JIT config %q for scale set %d: %w", name, scaleSetID, err)
	}
	if out.EncodedJITConfig == "" {
		return nil, fmt.Errorf("generate JIT config %q: the answer has no encodedJITConfig", name)
	}
	return &out, nil
}

// buildVersion is the main module's version and VCS revision, for the
// user agent.
func buildVersion() (version, commit string) {
	version, commit = "devel", "unknown"
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return version, commit
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		version = v
	}
	for _, st := range bi.Settings {
		if st.Key == "vcs.revision" && st.Value != "" {
			commit = st.Value
		}
	}
	return version, commit
}
