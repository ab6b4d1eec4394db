package githubsim

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Test world: organization octo-org (App installation 77 with the default
// permissions), user octocat (installation 78 with actions: read only),
// repositories octo-org/app, octo-org/other and octocat/personal.
const (
	testPAT        = "ghp_testAllOwners000000000000000000000"
	testPATLimited = "ghp_testOnlyOctocat0000000000000000000"
	testAppID      = 4242
	testClientID   = "Iv23liSimulatorTest"
	testOrgInst    = 77
	testUserInst   = 78
	hookSecret     = "It's a Secret to Everybody"
)

var (
	appKeyOnce sync.Once
	appKey     AppKey
	otherKey   AppKey
)

// testAppKeys generates the App key (and a stranger's key) once: RSA
// generation is slow under the race detector.
func testAppKeys(t testing.TB) (AppKey, AppKey) {
	appKeyOnce.Do(func() {
		var err error
		if appKey, err = NewAppKey(); err != nil {
			panic(err)
		}
		if otherKey, err = NewAppKey(); err != nil {
			panic(err)
		}
	})
	return appKey, otherKey
}

func testConfig(t testing.TB) Config {
	key, _ := testAppKeys(t)
	return Config{
		Organizations: []OrgConfig{{Login: "octo-org", ID: 9919, RunnerGroups: []RunnerGroupConfig{{ID: 2, Name: "hyperfleet"}}}, {Login: "ent-org", ID: 9920}, {Login: "outside-org", ID: 9921}},
		// Enterprise octo-ent: its group hyperfleet serves ent-org only.
		Enterprises: []EnterpriseConfig{{Slug: "octo-ent", ID: 77, Organizations: []string{"ent-org", "outside-org"}, RunnerGroups: []EnterpriseRunnerGroupConfig{
			{ID: 2, Name: "hyperfleet", Visibility: "selected", SelectedOrganizations: []string{"ent-org"}},
		}}},
		Users: []UserConfig{{Login: "octocat", ID: 583231}, {Login: "limited", ID: 1234}},
		Repositories: []RepoConfig{
			{Name: "octo-org/app", ID: 376034443, License: "MIT"},
			{Name: "octo-org/other", ID: 376034444},
			{Name: "octocat/personal", ID: 376034445},
			{Name: "ent-org/app", ID: 376034446},
			{Name: "outside-org/app", ID: 376034447},
		},
		PATs: []PATConfig{
			{Token: testPAT, Login: "octocat", Scopes: []string{"repo", "manage_runners:enterprise"}},
			{Token: testPATLimited, Login: "limited", Owners: []string{"octocat"}},
		},
		Apps: []AppConfig{{ID: testAppID, ClientID: testClientID, Slug: "hyperfleet-test", PublicKey: key.PublicPEM, Installations: []InstallationConfig{
			{ID: testOrgInst, Account: "octo-org"},
			{ID: testUserInst, Account: "octocat", Permissions: map[string]string{"actions": "read", "metadata": "read"}},
		}}},
		HeartbeatTimeout: Duration(30 * time.Second),
		Seed:             7,
	}
}

// fixture is a simulator on a FakeClock behind an httptest server, with a
// webhook receiver.
type fixture struct {
	t     *testing.T
	sim   *Simulator
	clock *FakeClock
	srv   *httptest.Server
	hooks *hookReceiver
}

var t0 = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

func newFixture(t *testing.T, mutate ...func(*Config)) *fixture {
	t.Helper()
	cfg := testConfig(t)
	for _, m := range mutate {
		m(&cfg)
	}
	clock := NewFakeClock(t0)
	// Some tests read /_sim/state over the loopback test server.
	sim, err := New(cfg, WithClock(clock), WithAdmin(true))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv := httptest.NewServer(sim)
	hooks := newHookReceiver(t)
	if _, err := sim.AddWebhook(Webhook{URL: hooks.srv.URL + "/hook", Secret: hookSecret}); err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, sim: sim, clock: clock, srv: srv, hooks: hooks}
	t.Cleanup(func() {
		srv.Close()
		sim.Close()
	})
	return f
}

// call sends a REST request; body may be nil, a string, or a value to
// encode as JSON.
func (f *fixture) call(method, path, token string, body any) (*http.Response, []byte) {
	f.t.Helper()
	return f.callHeader(method, path, token, body, nil)
}

// callHeader is call with more request headers.
func (f *fixture) callHeader(method, path, token string, body any, header http.Header) (*http.Response, []byte) {
	f.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			f.t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, f.srv.URL+path, rd)
	if err != nil {
		f.t.Fatal(err)
	}
	req.Header.Set("Accept", "application/vnd.github+json")
	for k, v := range header {
		req.Header[k] = v
	}
	if token != "" {
		if strings.Count(token, ".") == 2 {
			req.Header.Set("Authorization", "Bearer "+token)
		} else {
			req.Header.Set("Authorization", "token "+token)
		}
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		f.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp, raw
}

// mustCall is call that checks the status and decodes the JSON body.
func (f *fixture) mustCall(method, path, token string, body any, want int) map[string]any {
	f.t.Helper()
	resp, raw := f.call(method, path, token, body)
	if resp.StatusCode != want {
		f.t.Fatalf("%s %s: status %d, want %d: %s", method, path, resp.StatusCode, want, raw)
	}
	out := map[string]any{}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &out); err != nil {
			f.t.Fatalf("%s %s: decode %s: %v", method, path, raw, err)
		}
	}
	return out
}

// jwt signs a valid App JWT at the fixture's time.
func (f *fixture) jwt() string {
	key, _ := testAppKeys(f.t)
	now := f.clock.Now()
	tok, err := SignAppJWT(key.Private, strconv.Itoa(testAppID), now.Add(-60*time.Second), now.Add(9*time.Minute))
	if err != nil {
		f.t.Fatal(err)
	}
	return tok
}

// installationToken exchanges the App JWT for an installation token.
func (f *fixture) installationToken(inst int64) string {
	f.t.Helper()
	out := f.mustCall("POST", "/app/installations/"+strconv.FormatInt(inst, 10)+"/access_tokens", f.jwt(), nil, 201)
	return out["token"].(string)
}

// decodedConfig is an encoded_jit_config taken apart.
type decodedConfig struct {
	files    map[string]string
	runnerID int64
	secret   string
	server   string
	work     string
}

var (
	agentIDRE = regexp.MustCompile(`"agentId": (\d+)`)
	secretRE  = regexp.MustCompile(`"simRunnerSecret": "([^"]+)"`)
	serverRE  = regexp.MustCompile(`"serverUrl": "([^"]+)"`)
	workRE    = regexp.MustCompile(`"workFolder": "([^"]+)"`)
)

func decodeConfig(t testing.TB, enc string) decodedConfig {
	t.Helper()
	outer, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		t.Fatalf("encoded config is not base64: %v", err)
	}
	var m map[string]string
	if err := json.Unmarshal(outer, &m); err != nil {
		t.Fatalf("encoded config is not a JSON object of strings: %v", err)
	}
	d := decodedConfig{files: map[string]string{}}
	for name, v := range m {
		raw, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			t.Fatalf("%s is not base64: %v", name, err)
		}
		d.files[name] = string(raw)
	}
	for _, name := range []string{".runner", ".credentials", ".credentials_rsaparams"} {
		var v map[string]any
		if err := json.Unmarshal([]byte(d.files[name]), &v); err != nil {
			t.Fatalf("%s is not JSON: %v\n%s", name, err, d.files[name])
		}
	}
	if mm := agentIDRE.FindStringSubmatch(d.files[".runner"]); mm != nil {
		d.runnerID, _ = strconv.ParseInt(mm[1], 10, 64)
	}
	if mm := secretRE.FindStringSubmatch(d.files[".credentials"]); mm != nil {
		d.secret = mm[1]
	}
	if mm := serverRE.FindStringSubmatch(d.files[".runner"]); mm != nil {
		d.server = mm[1]
	}
	if mm := workRE.FindStringSubmatch(d.files[".runner"]); mm != nil {
		d.work = mm[1]
	}
	return d
}

// jit registers a JIT runner through the REST API.
func (f *fixture) jit(scopePath, name string, group int, labels ...string) (map[string]any, decodedConfig) {
	f.t.Helper()
	out := f.mustCall("POST", scopePath+"/actions/runners/generate-jitconfig", testPAT,
		map[string]any{"name": name, "runner_group_id": group, "labels": labels, "work_folder": "_work"}, 201)
	return out["runner"].(map[string]any), decodeConfig(f.t, out["encoded_jit_config"].(string))
}

// goRunner speaks the runner protocol from Go, for job-model tests.
type goRunner struct {
	f       *fixture
	id      int64
	secret  string
	session string
}

func (f *fixture) jitRunner(scopePath, name string, labels ...string) *goRunner {
	f.t.Helper()
	group := 1
	_, cfg := f.jit(scopePath, name, group, labels...)
	return &goRunner{f: f, id: cfg.runnerID, secret: cfg.secret}
}

func (g *goRunner) do(method, path string, form url.Values) (int, map[string]string) {
	g.f.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, _ := http.NewRequest(method, g.f.srv.URL+"/_runner/runners/"+strconv.FormatInt(g.id, 10)+path, body)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	req.Header.Set("Authorization", "Bearer "+g.secret)
	resp, err := g.f.srv.Client().Do(req)
	if err != nil {
		g.f.t.Fatalf("runner API %s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	kv := map[string]string{"_body": string(raw)}
	for _, line := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			kv[k] = v
		}
	}
	return resp.StatusCode, kv
}

func (g *goRunner) connect() {
	g.f.t.Helper()
	code, kv := g.do("POST", "/session", url.Values{"os": {"Linux"}})
	if code != 200 {
		g.f.t.Fatalf("connect runner %d: %d %s", g.id, code, kv["_body"])
	}
	g.session = kv["session_id"]
}

// poll long-polls once with a short wall-clock wait; it returns the job id
// (0 on 204) and the status code.
func (g *goRunner) poll() (int64, int) {
	g.f.t.Helper()
	code, kv := g.do("GET", "/message?wait=0.05&session="+g.session, nil)
	id, _ := strconv.ParseInt(kv["job_id"], 10, 64)
	return id, code
}

func (g *goRunner) jobStatus(jobID int64) (string, string, int) {
	g.f.t.Helper()
	return g.jobStatusWait(jobID, "")
}

// jobStatusWait reads a job's status as a long poll of wait seconds (none
// when empty).
func (g *goRunner) jobStatusWait(jobID int64, wait string) (string, string, int) {
	g.f.t.Helper()
	path := "/jobs/" + strconv.FormatInt(jobID, 10)
	if wait != "" {
		path += "?wait=" + wait
	}
	code, kv := g.do("GET", path, nil)
	return kv["status"], kv["conclusion"], code
}

// hookReceiver records webhook deliveries and checks their signatures.
type hookReceiver struct {
	t   testing.TB
	srv *httptest.Server
	mu  sync.Mutex
	got []receivedHook
}

type receivedHook struct {
	header http.Header
	body   []byte
	action string
	jobID  int64
	runner string
}

func newHookReceiver(t testing.TB) *hookReceiver {
	h := &hookReceiver{t: t}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var p struct {
			Action      string `json:"action"`
			WorkflowJob struct {
				ID         int64   `json:"id"`
				RunnerName *string `json:"runner_name"`
			} `json:"workflow_job"`
		}
		_ = json.Unmarshal(body, &p)
		rh := receivedHook{header: r.Header.Clone(), body: body, action: p.Action, jobID: p.WorkflowJob.ID}
		if p.WorkflowJob.RunnerName != nil {
			rh.runner = *p.WorkflowJob.RunnerName
		}
		h.mu.Lock()
		h.got = append(h.got, rh)
		h.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hookReceiver) all() []receivedHook {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]receivedHook(nil), h.got...)
}

// forJob returns the actions delivered for a job, in order, after
// checking every delivery's signatures.
func (h *hookReceiver) forJob(t testing.TB, jobID int64) []receivedHook {
	t.Helper()
	var out []receivedHook
	for _, d := range h.all() {
		if d.jobID == jobID {
			checkSignatures(t, d, hookSecret)
			out = append(out, d)
		}
	}
	return out
}

func actions(hs []receivedHook) string {
	var a []string
	for _, h := range hs {
		a = append(a, h.action)
	}
	return strings.Join(a, ",")
}

func checkSignatures(t testing.TB, d receivedHook, secret string) {
	t.Helper()
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(d.body)
	want := "sha256=" + hex.EncodeToString(m.Sum(nil))
	if got := d.header.Get("X-Hub-Signature-256"); !hmac.Equal([]byte(got), []byte(want)) {
		t.Errorf("X-Hub-Signature-256 = %q, want %q", got, want)
	}
	m1 := hmac.New(sha1.New, []byte(secret))
	m1.Write(d.body)
	if got, want := d.header.Get("X-Hub-Signature"), "sha1="+hex.EncodeToString(m1.Sum(nil)); got != want {
		t.Errorf("X-Hub-Signature = %q, want %q", got, want)
	}
}

// flush waits for webhook deliveries.
func (f *fixture) flush() {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.sim.FlushWebhooks(ctx); err != nil {
		f.t.Fatal(err)
	}
}

// waitFor polls cond (wall clock) for up to d.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// rateUsed is the x-ratelimit-used of a response.
func rateUsed(t *testing.T, resp *http.Response) int {
	t.Helper()
	n, err := strconv.Atoi(resp.Header.Get("X-RateLimit-Used"))
	if err != nil {
		t.Fatalf("x-ratelimit-used %q: %v", resp.Header.Get("X-RateLimit-Used"), err)
	}
	return n
}
