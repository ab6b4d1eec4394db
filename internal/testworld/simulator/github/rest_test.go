package githubsim

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestRegistrationToken(t *testing.T) {
	f := newFixture(t)
	for _, path := range []string{"/repos/octo-org/app", "/orgs/octo-org", "/api/v3/repos/octo-org/app", "/api/v3/orgs/octo-org"} {
		out := f.mustCall("POST", path+"/actions/runners/registration-token", testPAT, nil, 201)
		tok, _ := out["token"].(string)
		if len(tok) < 20 {
			t.Errorf("%s: token %q too short", path, tok)
		}
		exp, err := time.Parse(time.RFC3339, out["expires_at"].(string))
		if err != nil || !exp.Equal(t0.Add(time.Hour)) {
			t.Errorf("%s: expires_at %v (%v), want %v", path, out["expires_at"], err, t0.Add(time.Hour))
		}
	}
	f.mustCall("POST", "/repos/octo-org/nope/actions/runners/registration-token", testPAT, nil, 404)
	f.mustCall("POST", "/orgs/octocat/actions/runners/registration-token", testPAT, nil, 404) // a user, not an org
}

func TestJITConfig(t *testing.T) {
	f := newFixture(t)
	f.sim.SetServerURL("https://sim.example:8443")
	runner, cfg := f.jit("/orgs/octo-org", "hf-runner-1", 2, "self-hosted", "Linux", "X64", "hyperfleet", "gpu")
	if runner["name"] != "hf-runner-1" || runner["status"] != "offline" || runner["busy"] != false || runner["os"] != "Linux" || runner["ephemeral"] != true {
		t.Errorf("runner = %v", runner)
	}
	labels := runner["labels"].([]any)
	if len(labels) != 5 {
		t.Fatalf("labels = %v", labels)
	}
	l0, l4 := labels[0].(map[string]any), labels[4].(map[string]any)
	if l0["name"] != "self-hosted" || l0["type"] != "read-only" || l4["name"] != "gpu" || l4["type"] != "custom" || l4["id"] == nil {
		t.Errorf("labels = %v", labels)
	}
	if int64(runner["id"].(float64)) != cfg.runnerID || cfg.secret == "" || cfg.server != "https://sim.example:8443" || cfg.work != "_work" {
		t.Errorf("decoded config: id %d secret %q server %q work %q", cfg.runnerID, cfg.secret, cfg.server, cfg.work)
	}
	if !strings.Contains(cfg.files[".runner"], `"agentName": "hf-runner-1"`) || !strings.Contains(cfg.files[".runner"], `"poolId": 2`) ||
		!strings.Contains(cfg.files[".runner"], `"gitHubUrl": "https://sim.example:8443/octo-org"`) {
		t.Errorf(".runner = %s", cfg.files[".runner"])
	}
	if r, ok := f.sim.RunnerByName("hf-runner-1"); !ok || !r.JIT || !r.Ephemeral || r.Status != "offline" || r.GroupName != "hyperfleet" {
		t.Errorf("state runner = %+v", r)
	}

	// Name taken (case-insensitively) in the same scope; free in another.
	body := func(name string, group any, labels any) map[string]any {
		m := map[string]any{"name": name, "runner_group_id": group, "labels": labels}
		if name == "" {
			delete(m, "name")
		}
		if labels == nil {
			delete(m, "labels")
		}
		return m
	}
	out := f.mustCall("POST", "/orgs/octo-org/actions/runners/generate-jitconfig", testPAT, body("HF-RUNNER-1", 1, []string{"x"}), 409)
	if !strings.Contains(out["message"].(string), "already exists") || out["documentation_url"] == "" {
		t.Errorf("409 body = %v", out)
	}
	f.mustCall("POST", "/repos/octo-org/app/actions/runners/generate-jitconfig", testPAT, body("hf-runner-1", 1, []string{"x"}), 201)

	many := make([]string, 101)
	for i := range many {
		many[i] = fmt.Sprintf("l%d", i)
	}
	for name, tc := range map[string]struct {
		path string
		body any
		code int
		msg  string
	}{
		"labels missing":   {"/orgs/octo-org", body("a", 1, nil), 422, `"labels" wasn't supplied`},
		"labels empty":     {"/orgs/octo-org", body("a", 1, []string{}), 422, "fewer items than 1"},
		"labels > 100":     {"/orgs/octo-org", body("a", 1, many), 422, "more items than 100"},
		"label not string": {"/orgs/octo-org", body("a", 1, []any{5}), 422, "is not a string"},
		"name missing":     {"/orgs/octo-org", body("", 1, []string{"x"}), 422, `"name" wasn't supplied`},
		"name blank":       {"/orgs/octo-org", body("  ", 1, []string{"x"}), 422, "must not be empty"},
		"group missing":    {"/orgs/octo-org", map[string]any{"name": "a", "labels": []string{"x"}}, 422, `"runner_group_id" wasn't supplied`},
		"group unknown":    {"/orgs/octo-org", body("a", 99, []string{"x"}), 422, "No runner group"},
		"repo group 2":     {"/repos/octo-org/app", body("a", 2, []string{"x"}), 422, "No runner group"},
		"bad JSON":         {"/orgs/octo-org", "{", 400, "Problems parsing JSON"},
		"unknown org":      {"/orgs/nope", body("a", 1, []string{"x"}), 404, "Not Found"},
		"unknown repo":     {"/repos/octo-org/nope", body("a", 1, []string{"x"}), 404, "Not Found"},
	} {
		out := f.mustCall("POST", tc.path+"/actions/runners/generate-jitconfig", testPAT, tc.body, tc.code)
		if msg, _ := out["message"].(string); !strings.Contains(msg, tc.msg) {
			t.Errorf("%s: message %q, want %q", name, msg, tc.msg)
		}
		if doc, _ := out["documentation_url"].(string); !strings.HasPrefix(doc, "https://docs.github.com/") {
			t.Errorf("%s: documentation_url %q", name, doc)
		}
	}
}

func TestListRunnersPagination(t *testing.T) {
	f := newFixture(t)
	for i := range 5 {
		f.jit("/repos/octo-org/app", fmt.Sprintf("r-%d", i), 1, "self-hosted")
	}
	f.jit("/orgs/octo-org", "org-runner", 1, "self-hosted") // another scope: not listed
	resp, raw := f.call("GET", "/repos/octo-org/app/actions/runners?per_page=2", testPAT, nil)
	var list struct {
		TotalCount int              `json:"total_count"`
		Runners    []map[string]any `json:"runners"`
	}
	if err := json.Unmarshal(raw, &list); err != nil || resp.StatusCode != 200 {
		t.Fatalf("list: %d %s", resp.StatusCode, raw)
	}
	if list.TotalCount != 5 || len(list.Runners) != 2 || list.Runners[0]["name"] != "r-0" {
		t.Errorf("page 1 = %d %v", list.TotalCount, list.Runners)
	}
	link := resp.Header.Get("Link")
	if !strings.Contains(link, `page=2&per_page=2>; rel="next"`) || !strings.Contains(link, `page=3&per_page=2>; rel="last"`) {
		t.Errorf("Link = %q", link)
	}
	resp, raw = f.call("GET", "/repos/octo-org/app/actions/runners?per_page=2&page=3", testPAT, nil)
	_ = json.Unmarshal(raw, &list)
	if len(list.Runners) != 1 || list.Runners[0]["name"] != "r-4" || strings.Contains(resp.Header.Get("Link"), `rel="next"`) {
		t.Errorf("page 3 = %v, Link %q", list.Runners, resp.Header.Get("Link"))
	}
	_, raw = f.call("GET", "/repos/octo-org/app/actions/runners?per_page=500", testPAT, nil)
	_ = json.Unmarshal(raw, &list)
	if len(list.Runners) != 5 {
		t.Errorf("per_page=500: %d runners", len(list.Runners))
	}
	_, raw = f.call("GET", "/repos/octo-org/app/actions/runners?name=r-3", testPAT, nil)
	_ = json.Unmarshal(raw, &list)
	if list.TotalCount != 1 || list.Runners[0]["name"] != "r-3" {
		t.Errorf("name filter = %d %v", list.TotalCount, list.Runners)
	}
	_, raw = f.call("GET", "/orgs/octo-org/actions/runners", testPAT, nil)
	_ = json.Unmarshal(raw, &list)
	if list.TotalCount != 1 || list.Runners[0]["name"] != "org-runner" {
		t.Errorf("org list = %d %v", list.TotalCount, list.Runners)
	}
}

func TestGetAndDeleteRunner(t *testing.T) {
	f := newFixture(t)
	r := f.jitRunner("/repos/octo-org/app", "busy-one", "self-hosted", "linux")
	idle, _ := f.jit("/repos/octo-org/app", "idle-one", 1, "self-hosted")
	idleID := strconv.FormatInt(int64(idle["id"].(float64)), 10)
	base := "/repos/octo-org/app/actions/runners/"
	got := f.mustCall("GET", base+idleID, testPAT, nil, 200)
	if got["name"] != "idle-one" {
		t.Errorf("get = %v", got)
	}
	f.mustCall("GET", "/orgs/octo-org/actions/runners/"+idleID, testPAT, nil, 404) // other scope
	f.mustCall("DELETE", base+idleID, testPAT, nil, 204)
	f.mustCall("DELETE", base+idleID, testPAT, nil, 404)
	f.mustCall("GET", base+idleID, testPAT, nil, 404)
	f.mustCall("GET", base+"notanumber", testPAT, nil, 404)

	r.connect()
	job, err := f.sim.EnqueueJob(JobRequest{Repository: "octo-org/app", Labels: []string{"linux"}, Duration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if id, code := r.poll(); code != 200 || id != job.ID {
		t.Fatalf("poll = %d %d", id, code)
	}
	busyID := strconv.FormatInt(r.id, 10)
	if got := f.mustCall("GET", base+busyID, testPAT, nil, 200); got["busy"] != true || got["status"] != "online" {
		t.Errorf("busy runner = %v", got)
	}
	out := f.mustCall("DELETE", base+busyID, testPAT, nil, 422)
	if out["message"] != `Runner "busy-one" is still running a job` {
		t.Errorf("422 message = %q", out["message"])
	}
	f.clock.Advance(time.Minute)
	// The ephemeral runner was removed after its job.
	f.mustCall("DELETE", base+busyID, testPAT, nil, 404)
}

func TestAuthentication(t *testing.T) {
	f := newFixture(t)
	path := "/repos/octo-org/app/actions/runners"
	for name, tc := range map[string]struct {
		auth string
		code int
		msg  string
	}{
		"missing":       {"", 401, "Requires authentication"},
		"unknown token": {"token ghp_nope", 401, "Bad credentials"},
		"bad scheme":    {"Basic Zm9vOmJhcg==", 401, "Bad credentials"},
		"bearer PAT":    {"Bearer " + testPAT, 200, ""},
		"token PAT":     {"token " + testPAT, 200, ""},
		"other owner":   {"token " + testPATLimited, 404, "Not Found"},
	} {
		req, _ := http.NewRequest("GET", f.srv.URL+path, nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Errorf("%s: status %d, want %d (%v)", name, resp.StatusCode, tc.code, body)
		}
		if tc.msg != "" && body["message"] != tc.msg {
			t.Errorf("%s: message %v, want %q", name, body["message"], tc.msg)
		}
		if resp.Header.Get("X-RateLimit-Limit") == "" || resp.Header.Get("X-GitHub-Request-Id") == "" {
			t.Errorf("%s: headers %v", name, resp.Header)
		}
	}
	// The limited PAT can use its owner's repository.
	f.mustCall("GET", "/repos/octocat/personal/actions/runners", testPATLimited, nil, 200)

	// Installation tokens: their account only, their permissions only.
	orgTok := f.installationToken(testOrgInst)
	f.mustCall("GET", path, orgTok, nil, 200)
	f.mustCall("GET", "/orgs/octo-org/actions/runners", orgTok, nil, 200)
	f.mustCall("GET", "/repos/octocat/personal/actions/runners", orgTok, nil, 404)
	userTok := f.installationToken(testUserInst)
	out := f.mustCall("GET", "/repos/octocat/personal/actions/runners", userTok, nil, 403)
	if out["message"] != "Resource not accessible by integration" {
		t.Errorf("403 message = %v", out["message"])
	}
	f.mustCall("GET", "/repos/octocat/personal/actions/runs", userTok, nil, 200) // actions: read
	// Installation tokens expire after an hour.
	f.clock.Advance(time.Hour)
	f.mustCall("GET", path, orgTok, nil, 401)
}

func TestAppJWT(t *testing.T) {
	f := newFixture(t)
	key, stranger := testAppKeys(t)
	now := f.clock.Now()
	sign := func(k AppKey, iss any, iat, exp time.Time) string {
		tok, err := SignAppJWT(k.Private, iss, iat, exp)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	path := fmt.Sprintf("/app/installations/%d/access_tokens", testOrgInst)
	for name, tok := range map[string]string{
		"iss string":    sign(key, "4242", now.Add(-60*time.Second), now.Add(10*time.Minute)),
		"iss number":    sign(key, testAppID, now, now.Add(5*time.Minute)),
		"iss client id": sign(key, testClientID, now.Add(-30*time.Second), now.Add(2*time.Minute)),
		"iat drift":     sign(key, "4242", now.Add(50*time.Second), now.Add(5*time.Minute)),
	} {
		out := f.mustCall("POST", path, tok, nil, 201)
		if tk, _ := out["token"].(string); !strings.HasPrefix(tk, "ghs_") || len(tk) != 40 {
			t.Errorf("%s: token %q", name, tk)
		}
		if out["expires_at"] != ghTime(now.Add(time.Hour)) || out["repository_selection"] != "all" {
			t.Errorf("%s: %v", name, out)
		}
		if p, _ := out["permissions"].(map[string]any); p["administration"] != "write" || p["organization_self_hosted_runners"] != "write" {
			t.Errorf("%s: permissions %v", name, p)
		}
	}
	for name, tc := range map[string]struct {
		tok string
		msg string
	}{
		"expired":         {sign(key, "4242", now.Add(-11*time.Minute), now.Add(-time.Minute)), "'Expiration time' claim ('exp') must be a numeric value representing the future time"},
		"exp too far":     {sign(key, "4242", now, now.Add(11*time.Minute)), "too far in the future"},
		"window too long": {sign(key, "4242", now.Add(-5*time.Minute), now.Add(7*time.Minute)), "too far in the future"},
		"iat in future":   {sign(key, "4242", now.Add(2*time.Minute), now.Add(5*time.Minute)), "'Issued at' claim ('iat')"},
		"wrong key":       {sign(stranger, "4242", now, now.Add(5*time.Minute)), "could not be decoded"},
		"unknown app":     {sign(key, "999", now, now.Add(5*time.Minute)), "Integration not found"},
		"garbage":         {"a.b.c", "could not be decoded"},
		"HS256": {func() string {
			tok := sign(key, "4242", now, now.Add(5*time.Minute))
			parts := strings.Split(tok, ".")
			return "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9." + parts[1] + "." + parts[2]
		}(), "RS256"},
	} {
		out := f.mustCall("POST", path, tc.tok, nil, 401)
		if msg, _ := out["message"].(string); !strings.Contains(msg, tc.msg) {
			t.Errorf("%s: message %q, want %q", name, msg, tc.msg)
		}
	}
	// A PAT is not an App JWT.
	f.mustCall("POST", path, testPAT, nil, 401)
	f.mustCall("POST", "/app/installations/12345/access_tokens", f.jwt(), nil, 404)
	f.mustCall("POST", "/app/installations/abc/access_tokens", f.jwt(), nil, 404)
	f.mustCall("POST", path, f.jwt(), map[string]any{"permissions": map[string]string{"contents": "write"}}, 422)
	f.mustCall("POST", path, f.jwt(), map[string]any{"repositories": []string{"nope"}}, 422)
	f.mustCall("POST", path, f.jwt(), "{", 400)
	out := f.mustCall("POST", path, f.jwt(), map[string]any{"repositories": []string{"app"}, "permissions": map[string]string{"administration": "write"}}, 201)
	if out["repository_selection"] != "selected" || len(out["repositories"].([]any)) != 1 {
		t.Errorf("narrowed token = %v", out)
	}
	tok := out["token"].(string)
	f.mustCall("GET", "/repos/octo-org/app/actions/runners", tok, nil, 200)
	f.mustCall("GET", "/repos/octo-org/other/actions/runners", tok, nil, 404)
	f.mustCall("GET", "/repos/octo-org/app/actions/runs", tok, nil, 403) // no actions permission requested

	// Go shortcut.
	direct, exp, err := f.sim.InstallationToken(testOrgInst)
	if err != nil || !exp.Equal(now.Add(time.Hour)) {
		t.Fatal(err, exp)
	}
	f.mustCall("GET", "/orgs/octo-org/actions/runners", direct, nil, 200)
}

func TestRateLimits(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.RateLimit = 10 })
	path := "/repos/octo-org/app/actions/runners"
	for i := 1; i <= 10; i++ {
		resp, raw := f.call("GET", path, testPAT, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, raw)
		}
		h := resp.Header
		if h.Get("X-RateLimit-Limit") != "10" || h.Get("X-RateLimit-Used") != strconv.Itoa(i) || h.Get("X-RateLimit-Remaining") != strconv.Itoa(10-i) ||
			h.Get("X-RateLimit-Reset") != strconv.FormatInt(t0.Add(time.Hour).Unix(), 10) || h.Get("X-RateLimit-Resource") != "core" {
			t.Fatalf("request %d: rate headers %v", i, h)
		}
	}
	resp, raw := f.call("GET", path, testPAT, nil)
	if resp.StatusCode != 403 || resp.Header.Get("X-RateLimit-Remaining") != "0" || !strings.Contains(string(raw), "API rate limit exceeded for user ID 583231") {
		t.Fatalf("exhausted: %d %v %s", resp.StatusCode, resp.Header, raw)
	}
	// Another identity has its own budget.
	f.mustCall("GET", "/repos/octocat/personal/actions/runners", testPATLimited, nil, 200)
	// The window resets after an hour on the simulator clock.
	f.clock.Advance(time.Hour)
	resp, _ = f.call("GET", path, testPAT, nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Remaining") != "9" {
		t.Fatalf("after reset: %d %v", resp.StatusCode, resp.Header)
	}
	// Installations are budgeted per installation.
	tok := f.installationToken(testOrgInst)
	f.sim.SetRateLimitUsed("installation:77", 10)
	resp, raw = f.call("GET", path, tok, nil)
	if resp.StatusCode != 403 || !strings.Contains(string(raw), "installation ID 77") {
		t.Fatalf("installation exhausted: %d %s", resp.StatusCode, raw)
	}
	// Unauthenticated budget: 60 per address.
	resp, _ = f.call("GET", path, "ghp_wrong", nil)
	if resp.StatusCode != 401 || resp.Header.Get("X-RateLimit-Limit") != "60" {
		t.Fatalf("401 rate headers: %d %v", resp.StatusCode, resp.Header)
	}
}

func TestSecondaryLimitsAndInjectedErrors(t *testing.T) {
	f := newFixture(t)
	if err := f.sim.InjectSecondaryLimit(SecondaryLimitFault{Method: "POST", PathPrefix: "/orgs/octo-org/actions/runners/generate-jitconfig", Count: 2, RetryAfter: Duration(30 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	body := map[string]any{"name": "x", "runner_group_id": 1, "labels": []string{"a"}}
	// Other paths and methods are unaffected.
	f.mustCall("GET", "/orgs/octo-org/actions/runners", testPAT, nil, 200)
	for i := 0; i < 2; i++ {
		resp, raw := f.call("POST", "/api/v3/orgs/octo-org/actions/runners/generate-jitconfig", testPAT, body)
		if resp.StatusCode != 403 || resp.Header.Get("Retry-After") != "30" || !strings.Contains(string(raw), "secondary rate limit") {
			t.Fatalf("secondary %d: %d %v %s", i, resp.StatusCode, resp.Header, raw)
		}
		if resp.Header.Get("X-RateLimit-Remaining") == "0" {
			t.Errorf("secondary limit reported remaining 0")
		}
	}
	f.mustCall("POST", "/orgs/octo-org/actions/runners/generate-jitconfig", testPAT, body, 201)

	if err := f.sim.InjectSecondaryLimit(SecondaryLimitFault{Count: 1, Status: 429}); err != nil {
		t.Fatal(err)
	}
	resp, _ := f.call("GET", "/orgs/octo-org/actions/runners", testPAT, nil)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "" {
		t.Fatalf("429: %d %v", resp.StatusCode, resp.Header)
	}
	if err := f.sim.InjectSecondaryLimit(SecondaryLimitFault{Count: 1, ZeroRemaining: true}); err != nil {
		t.Fatal(err)
	}
	resp, _ = f.call("GET", "/orgs/octo-org/actions/runners", testPAT, nil)
	if resp.StatusCode != 403 || resp.Header.Get("X-RateLimit-Remaining") != "0" || resp.Header.Get("X-RateLimit-Reset") == "" {
		t.Fatalf("403 remaining 0: %d %v", resp.StatusCode, resp.Header)
	}

	if err := f.sim.InjectError(ErrorFault{Method: "DELETE", PathPrefix: "/repos/", Status: 502, Count: 1}); err != nil {
		t.Fatal(err)
	}
	out := f.mustCall("DELETE", "/repos/octo-org/app/actions/runners/1", testPAT, nil, 502)
	if out["message"] != "Server Error" {
		t.Errorf("502 body %v", out)
	}
	f.mustCall("DELETE", "/repos/octo-org/app/actions/runners/1", testPAT, nil, 404)
	if err := f.sim.InjectError(ErrorFault{Status: 503, Probability: 1, Message: "Service Unavailable"}); err != nil {
		t.Fatal(err)
	}
	f.mustCall("GET", "/orgs/octo-org/actions/runners", testPAT, nil, 503)
	if len(f.sim.Faults().Errors) != 1 {
		t.Errorf("faults = %+v", f.sim.Faults())
	}
	want := map[string]int{"secondary-limit-403": 3, "secondary-limit-429": 1, "error-502": 1, "error-503": 1}
	if got := f.sim.InjectedFaults(); !maps.Equal(got, want) {
		t.Errorf("InjectedFaults() = %v; want %v", got, want)
	}
	f.sim.ClearFaults()
	f.mustCall("GET", "/orgs/octo-org/actions/runners", testPAT, nil, 200)
	if err := f.sim.InjectError(ErrorFault{Status: 200, Count: 1}); err == nil {
		t.Error("status 200 fault accepted")
	}
	if err := f.sim.InjectSecondaryLimit(SecondaryLimitFault{Status: 500, Count: 1}); err == nil {
		t.Error("status 500 secondary limit accepted")
	}
}

func TestRunsAndJobsEndpoints(t *testing.T) {
	f := newFixture(t)
	j1, err := f.sim.EnqueueJob(JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted", "gpu"}, WorkflowName: "Build", JobName: "compile", Duration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	j2, _ := f.sim.EnqueueJob(JobRequest{Repository: "octo-org/app", Labels: []string{"linux"}})
	if _, err := f.sim.EnqueueJob(JobRequest{Repository: "octo-org/app", Labels: []string{"x"}, RunID: j1.RunID, JobName: "test"}); err != nil {
		t.Fatal(err)
	}
	if j1.ID == j2.ID || j1.RunID == j2.RunID || j1.Status != "queued" {
		t.Fatalf("jobs %+v %+v", j1, j2)
	}
	runs := f.mustCall("GET", "/repos/octo-org/app/actions/runs?status=queued", testPAT, nil, 200)
	if runs["total_count"].(float64) != 2 {
		t.Fatalf("queued runs = %v", runs["total_count"])
	}
	first := runs["workflow_runs"].([]any)[0].(map[string]any) // newest first
	if int64(first["id"].(float64)) != j2.RunID || first["status"] != "queued" || first["conclusion"] != nil {
		t.Errorf("run = %v", first)
	}
	f.mustCall("GET", "/repos/octo-org/app/actions/runs?status=completed", testPAT, nil, 200)
	jobs := f.mustCall("GET", fmt.Sprintf("/repos/octo-org/app/actions/runs/%d/jobs", j1.RunID), testPAT, nil, 200)
	if jobs["total_count"].(float64) != 2 {
		t.Fatalf("jobs = %v", jobs)
	}
	jj := jobs["jobs"].([]any)[0].(map[string]any)
	if int64(jj["id"].(float64)) != j1.ID || jj["status"] != "queued" || jj["runner_id"] != nil || jj["name"] != "compile" || jj["workflow_name"] != "Build" ||
		fmt.Sprint(jj["labels"]) != "[self-hosted gpu]" {
		t.Errorf("job = %v", jj)
	}
	f.mustCall("GET", fmt.Sprintf("/repos/octo-org/app/actions/jobs/%d", j1.ID), testPAT, nil, 200)
	f.mustCall("GET", fmt.Sprintf("/repos/octo-org/other/actions/jobs/%d", j1.ID), testPAT, nil, 404)
	f.mustCall("GET", fmt.Sprintf("/repos/octo-org/app/actions/runs/%d", j1.RunID), testPAT, nil, 200)
	f.mustCall("GET", "/repos/octo-org/app/actions/runs/1/jobs", testPAT, nil, 404)
	f.mustCall("POST", fmt.Sprintf("/repos/octo-org/app/actions/runs/%d/cancel", j1.RunID), testPAT, nil, 202)
	out := f.mustCall("POST", fmt.Sprintf("/repos/octo-org/app/actions/runs/%d/cancel", j1.RunID), testPAT, nil, 409)
	if out["message"] != "Cannot cancel a workflow run that is completed." {
		t.Errorf("409 = %v", out)
	}
	got, _ := f.sim.Job(j1.ID)
	if got.Status != "completed" || got.Conclusion != "cancelled" {
		t.Errorf("cancelled job = %+v", got)
	}
	runs = f.mustCall("GET", "/repos/octo-org/app/actions/runs?status=cancelled", testPAT, nil, 200)
	if runs["total_count"].(float64) != 1 {
		t.Errorf("cancelled runs = %v", runs["total_count"])
	}
}

func TestRunnerGroups(t *testing.T) {
	f := newFixture(t)
	out := f.mustCall("GET", "/orgs/octo-org/actions/runner-groups", testPAT, nil, 200)
	groups := out["runner_groups"].([]any)
	if out["total_count"].(float64) != 2 || groups[0].(map[string]any)["name"] != "Default" || groups[0].(map[string]any)["default"] != true ||
		groups[1].(map[string]any)["id"].(float64) != 2 {
		t.Errorf("groups = %v", out)
	}
	f.mustCall("GET", "/orgs/octocat/actions/runner-groups", testPAT, nil, 404)
}

func TestUnknownPath(t *testing.T) {
	f := newFixture(t)
	out := f.mustCall("GET", "/repos/octo-org/app/pulls", testPAT, nil, 404)
	if out["message"] != "Not Found" {
		t.Errorf("body = %v", out)
	}
	f.mustCall("PUT", "/orgs/octo-org/actions/runners", testPAT, nil, 404)
	resp, _ := f.call("GET", "/_sim/state", "", nil)
	if resp.StatusCode != 200 {
		t.Errorf("admin state: %d", resp.StatusCode)
	}
}

// TestAdminAPIOffByDefaultAndLoopbackOnly: the admin API is off unless
// asked for; enabled, it refuses any peer that is not loopback.
func TestAdminAPIOffByDefaultAndLoopbackOnly(t *testing.T) {
	state := func(sim *Simulator, peer string) int {
		req := httptest.NewRequest("GET", "/_sim/state", nil)
		req.RemoteAddr = peer
		rec := httptest.NewRecorder()
		sim.ServeHTTP(rec, req)
		return rec.Code
	}
	off, err := New(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	if code := state(off, "127.0.0.1:40000"); code != 404 {
		t.Errorf("admin API by default: %d, want it off (404)", code)
	}
	on, err := New(testConfig(t), WithAdmin(true))
	if err != nil {
		t.Fatal(err)
	}
	for peer, want := range map[string]int{"127.0.0.1:40000": 200, "[::1]:40000": 200, "192.0.2.1:1234": 403, "[2001:db8::1]:1234": 403} {
		if code := state(on, peer); code != want {
			t.Errorf("admin API for peer %s: %d, want %d", peer, code, want)
		}
	}
	// The runner package is not part of the admin API.
	req := httptest.NewRequest("GET", "/_sim/runner/actions-runner-linux-x64.tar.gz", nil)
	rec := httptest.NewRecorder()
	off.ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Errorf("runner package with the admin API off, from a remote peer: %d", rec.Code)
	}
}

// TestRunStatusWhileJobsWait: a run is queued until one of its jobs
// starts, then in_progress while others still wait (a matrix build), also
// once the started ones are done, as on GitHub; the status filter lists it
// under in_progress only.
func TestRunStatusWhileJobsWait(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.HeartbeatTimeout = Duration(time.Hour) })
	first := enqueue(t, f, "octo-org/app", time.Minute, "self-hosted", "matrix-a")
	second, err := f.sim.EnqueueJob(JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted", "matrix-b"}, RunID: first.RunID, Duration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	listed := func(status string) []int64 {
		t.Helper()
		var ids []int64
		for _, r := range f.mustCall("GET", "/repos/octo-org/app/actions/runs?status="+status, testPAT, nil, 200)["workflow_runs"].([]any) {
			ids = append(ids, int64(r.(map[string]any)["id"].(float64)))
		}
		return ids
	}
	if q, p := listed("queued"), listed("in_progress"); len(q) != 1 || q[0] != first.RunID || len(p) != 0 {
		t.Fatalf("before any job started: queued runs %v, in progress %v", q, p)
	}
	r := f.jitRunner("/orgs/octo-org", "matrix-a-runner", "self-hosted", "matrix-a")
	r.connect()
	r.poll()
	for _, stage := range []string{"a job runs", "the started job is done"} {
		if q, p := listed("queued"), listed("in_progress"); len(q) != 0 || len(p) != 1 || p[0] != first.RunID {
			t.Fatalf("%s, the other queued: queued runs %v, in progress %v; want the run in progress only", stage, q, p)
		}
		f.clock.Advance(time.Minute)
	}
	if got, _ := f.sim.Job(second.ID); got.Status != "queued" {
		t.Fatalf("job %d is %s, want queued", second.ID, got.Status)
	}
}

// TestRepositoryListings: GET /orgs/{org}/repos lists what the caller
// sees, newest first, filtered by type; GET /installation/repositories
// answers installation tokens only, with the installation's selection.
func TestRepositoryListings(t *testing.T) {
	public := false
	f := newFixture(t, func(c *Config) {
		c.Repositories = append(c.Repositories, RepoConfig{Name: "octo-org/attic", ID: 376034446, Archived: true, Private: &public})
		c.Apps[0].Installations = append(c.Apps[0].Installations,
			InstallationConfig{ID: 79, Account: "octo-org", RepositorySelection: "selected", Repositories: []string{"other"}})
	})
	names := func(list []any) []string {
		var out []string
		for _, r := range list {
			m := r.(map[string]any)
			out = append(out, fmt.Sprintf("%s archived=%v", m["full_name"], m["archived"]))
		}
		return out
	}
	orgRepos := func(token, query string, want int) []string {
		t.Helper()
		resp, raw := f.call("GET", "/orgs/octo-org/repos"+query, token, nil)
		if resp.StatusCode != want {
			t.Fatalf("GET /orgs/octo-org/repos%s: %d, want %d: %s", query, resp.StatusCode, want, raw)
		}
		var list []any
		if want == http.StatusOK {
			if err := json.Unmarshal(raw, &list); err != nil {
				t.Fatal(err)
			}
		}
		return names(list)
	}
	if got := fmt.Sprint(orgRepos(testPAT, "", 200)); got != "[octo-org/attic archived=true octo-org/other archived=false octo-org/app archived=false]" {
		t.Errorf("organization repositories, newest first: %s", got)
	}
	if got := fmt.Sprint(orgRepos(testPAT, "?type=public", 200)); got != "[octo-org/attic archived=true]" {
		t.Errorf("public ones: %s", got)
	}
	if got := fmt.Sprint(orgRepos(testPAT, "?per_page=1&page=3", 200)); got != "[octo-org/app archived=false]" {
		t.Errorf("third page of one: %s", got)
	}
	orgRepos(testPATLimited, "", 404) // a token limited to octocat does not see octo-org
	if got := fmt.Sprint(orgRepos(f.installationToken(79), "", 200)); got != "[octo-org/other archived=false]" {
		t.Errorf("an installation on selected repositories: %s", got)
	}

	all := f.mustCall("GET", "/installation/repositories", f.installationToken(testOrgInst), nil, 200)
	if got := fmt.Sprint(names(all["repositories"].([]any))); all["total_count"].(float64) != 3 || all["repository_selection"] != "all" ||
		got != "[octo-org/app archived=false octo-org/other archived=false octo-org/attic archived=true]" {
		t.Errorf("installation repositories: %v", all)
	}
	selected := f.mustCall("GET", "/installation/repositories", f.installationToken(79), nil, 200)
	if got := fmt.Sprint(names(selected["repositories"].([]any))); got != "[octo-org/other archived=false]" || selected["repository_selection"] != "selected" {
		t.Errorf("selected installation repositories: %v", selected)
	}
	out := f.mustCall("GET", "/installation/repositories", testPAT, nil, 403)
	if !strings.Contains(out["message"].(string), "installation access token") {
		t.Errorf("a personal access token: %v", out)
	}
	if _, err := f.sim.EnqueueJob(JobRequest{Repository: "octo-org/attic", Labels: []string{"x"}}); err == nil {
		t.Error("an archived repository ran a workflow")
	}

	// A repository created later is the newest, and runs workflows.
	if err := f.sim.AddRepository(RepoConfig{Name: "octo-org/fresh"}); err != nil {
		t.Fatal(err)
	}
	if got := orgRepos(testPAT, "?per_page=1", 200); fmt.Sprint(got) != "[octo-org/fresh archived=false]" {
		t.Errorf("newest repository: %v", got)
	}
	if _, err := f.sim.EnqueueJob(JobRequest{Repository: "octo-org/fresh", Labels: []string{"x"}}); err != nil {
		t.Error(err)
	}
	for _, bad := range []string{"octo-org/fresh", "nobody/repo", "octo-org"} {
		if err := f.sim.AddRepository(RepoConfig{Name: bad}); err == nil {
			t.Errorf("AddRepository(%q) succeeded", bad)
		}
	}
}
