package githubsim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"

	"github.com/hyperfleet/hyperfleet/internal/testworld/testdeps"
)

// This file checks the simulator against GitHub's own published contract:
// every REST response it serves in a scenario that reaches every endpoint
// and every status it can answer is validated against the response schema
// of @octokit/openapi (GitHub's REST description), and every workflow_job
// payload is compared with @octokit/webhooks-examples.

// exchange is one recorded API call.
type exchange struct {
	method, path, query string
	status              int
	header              http.Header
	body                []byte
}

// recorder wraps the simulator and records API exchanges (not /_sim/ or
// /_runner/).
type recorder struct {
	h  http.Handler
	mu sync.Mutex
	ex []exchange
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/_") {
		rc.h.ServeHTTP(w, r)
		return
	}
	rec := httptest.NewRecorder()
	rc.h.ServeHTTP(rec, r)
	// Record before answering: once the client has its answer, the test
	// may read the exchanges.
	rc.mu.Lock()
	rc.ex = append(rc.ex, exchange{method: r.Method, path: r.URL.Path, query: r.URL.RawQuery, status: rec.Code, header: rec.Header().Clone(), body: rec.Body.Bytes()})
	rc.mu.Unlock()
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}

// exchanges returns the recorded exchanges so far.
func (rc *recorder) exchanges() []exchange {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]exchange(nil), rc.ex...)
}

// loadGitHubSpec reads GitHub's REST description and keeps only the
// operations the simulator serves and the components they reference (the
// full 13 MB document takes seconds to resolve; the pruned one
// milliseconds, with identical schemas).
func loadGitHubSpec(t *testing.T, routes []*route) *openapi3.T {
	t.Helper()
	read := func(name string) map[string]any {
		path := testdeps.NPMFile(t, "@octokit/openapi", "generated/"+name)
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var full map[string]any
		if err := json.Unmarshal(raw, &full); err != nil {
			t.Fatalf("decode %s: %v", path, err)
		}
		return full
	}
	full := read("api.github.com.json")
	// The enterprise runner endpoints are GitHub Enterprise Cloud's: its
	// description documents them, with its own components.
	ghec := read("ghec.json")
	fullPaths := full["paths"].(map[string]any)
	paths := map[string]any{}
	for _, rt := range routes {
		item, _ := fullPaths[rt.pattern].(map[string]any)
		if strings.HasPrefix(rt.pattern, "/enterprises/") {
			item, _ = ghec["paths"].(map[string]any)[rt.pattern].(map[string]any)
		}
		op := item[strings.ToLower(rt.method)]
		if op == nil {
			t.Errorf("the simulator serves %s %s, which GitHub's REST description does not document", rt.method, rt.pattern)
			continue
		}
		pi, _ := paths[rt.pattern].(map[string]any)
		if pi == nil {
			pi = map[string]any{}
			if params, ok := item["parameters"]; ok {
				pi["parameters"] = params
			}
			paths[rt.pattern] = pi
		}
		pi[strings.ToLower(rt.method)] = op
	}
	components := map[string]any{}
	var collect func(v any)
	fullComponents := full["components"].(map[string]any)
	addRef := func(ref string) {
		parts := strings.Split(strings.TrimPrefix(ref, "#/components/"), "/")
		if len(parts) != 2 {
			t.Fatalf("unexpected $ref %q", ref)
		}
		kind, _ := components[parts[0]].(map[string]any)
		if kind == nil {
			kind = map[string]any{}
			components[parts[0]] = kind
		}
		if _, done := kind[parts[1]]; done {
			return
		}
		v := fullComponents[parts[0]].(map[string]any)[parts[1]]
		if v == nil {
			// Referenced by an enterprise operation only.
			v = ghec["components"].(map[string]any)[parts[0]].(map[string]any)[parts[1]]
		}
		if v == nil {
			t.Fatalf("dangling $ref %q", ref)
		}
		kind[parts[1]] = v
		collect(v)
	}
	collect = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if ref, ok := x["$ref"].(string); ok {
				addRef(ref)
			}
			for _, e := range x {
				collect(e)
			}
		case []any:
			for _, e := range x {
				collect(e)
			}
		}
	}
	collect(paths)
	addRef("#/components/schemas/basic-error")
	pruned, err := json.Marshal(map[string]any{"openapi": full["openapi"], "info": full["info"], "paths": paths, "components": components})
	if err != nil {
		t.Fatal(err)
	}
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(pruned)
	if err != nil {
		t.Fatalf("load GitHub's REST description: %v", err)
	}
	if err := doc.Validate(loader.Context, openapi3.DisableExamplesValidation()); err != nil {
		t.Fatalf("GitHub's REST description (pruned) does not validate: %v", err)
	}
	return doc
}

func TestContractAgainstGitHubOpenAPI(t *testing.T) {
	// Stricter than kin-openapi's default: URIs must be absolute.
	openapi3.DefineStringFormatValidator("uri", openapi3.NewCallbackValidator(func(v string) error {
		u, err := url.Parse(v)
		if err != nil || u.Scheme == "" || u.Host == "" {
			return fmt.Errorf("not an absolute URI: %q", v)
		}
		return nil
	}))
	cfg := testConfig(t)
	cfg.HeartbeatTimeout = Duration(time.Hour)
	clock := NewFakeClock(t0)
	sim, err := New(cfg, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	doc := loadGitHubSpec(t, sim.routes)
	rec := &recorder{h: sim}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	defer sim.Close()
	f := &fixture{t: t, sim: sim, clock: clock, srv: srv}

	runScenario(t, f)

	// Validate every recorded response.
	type key struct {
		pattern, method string
		status          int
	}
	seen := map[key]int{}
	basicError := doc.Components.Schemas["basic-error"].Value
	for _, ex := range rec.exchanges() {
		path := strings.TrimPrefix(ex.path, gheAPIPrefix)
		rt, vars, _ := sim.match(ex.method, path)
		where := fmt.Sprintf("%s %s?%s -> %d", ex.method, ex.path, ex.query, ex.status)
		for _, h := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Used", "X-RateLimit-Reset", "X-RateLimit-Resource", "X-GitHub-Request-Id"} {
			if ex.header.Get(h) == "" {
				t.Errorf("%s: no %s header", where, h)
			}
		}
		if ex.status == http.StatusNotModified {
			// A conditional request's answer: no body, the ETag it matched.
			if len(ex.body) != 0 || ex.header.Get("ETag") == "" {
				t.Errorf("%s: 304 with a body (%d bytes) or without an ETag (%q)", where, len(ex.body), ex.header.Get("ETag"))
			}
		} else if ex.status != http.StatusNoContent && !strings.HasPrefix(ex.header.Get("Content-Type"), "application/json") {
			t.Errorf("%s: Content-Type %q", where, ex.header.Get("Content-Type"))
		}
		if rt == nil {
			// Unknown paths answer GitHub's generic error.
			validateBody(t, where, basicError, ex.body)
			continue
		}
		seen[key{rt.pattern, rt.method, ex.status}]++
		pi := doc.Paths.Find(rt.pattern)
		op := pi.GetOperation(ex.method)
		if op.Responses.Status(ex.status) == nil && ex.status == http.StatusNotModified {
			// GitHub answers conditional requests on every GET, though its
			// description documents 304 for a few operations only; checked
			// above.
			continue
		}
		if op.Responses.Status(ex.status) == nil {
			// Not documented for this operation (401 on most, rate limits,
			// 404 on some): GitHub answers its generic error object.
			if ex.status < 400 {
				t.Errorf("%s: success status not documented by GitHub", where)
			}
			validateBody(t, where, basicError, ex.body)
			continue
		}
		req, _ := http.NewRequest(ex.method, "https://api.github.com"+path+"?"+ex.query, nil)
		input := &openapi3filter.ResponseValidationInput{
			RequestValidationInput: &openapi3filter.RequestValidationInput{
				Request: req, PathParams: vars,
				Route: &routers.Route{Spec: doc, Path: rt.pattern, PathItem: pi, Method: ex.method, Operation: op},
			},
			Status:  ex.status,
			Header:  ex.header,
			Body:    io.NopCloser(bytes.NewReader(ex.body)),
			Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
		}
		if err := openapi3filter.ValidateResponse(context.Background(), input); err != nil {
			t.Errorf("%s: response does not match GitHub's schema:\n%v\nbody: %.600s", where, err, ex.body)
		}
	}
	// Every endpoint, with every status it can answer, was exercised.
	var missing []string
	for _, rt := range sim.routes {
		for _, code := range rt.codes {
			if seen[key{rt.pattern, rt.method, code}] == 0 {
				missing = append(missing, fmt.Sprintf("%s %s -> %d", rt.method, rt.pattern, code))
			}
		}
	}
	if len(missing) > 0 {
		t.Errorf("the scenario did not exercise:\n  %s", strings.Join(missing, "\n  "))
	}
	t.Logf("validated %d responses over %d (operation, status) pairs", len(rec.exchanges()), len(seen))
}

func validateBody(t *testing.T, where string, schema *openapi3.Schema, body []byte) {
	t.Helper()
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Errorf("%s: body is not JSON: %v", where, err)
		return
	}
	if err := schema.VisitJSON(v, openapi3.MultiErrors()); err != nil {
		t.Errorf("%s: body does not match basic-error: %v", where, err)
	}
	if m, _ := v.(map[string]any); m["message"] == nil || m["documentation_url"] == nil {
		t.Errorf("%s: error body lacks message or documentation_url: %s", where, body)
	}
}

// runScenario reaches every endpoint with every status it can answer.
func runScenario(t *testing.T, f *fixture) {
	pat := testPAT
	jitBody := func(name string, group int, labels ...string) map[string]any {
		return map[string]any{"name": name, "runner_group_id": group, "labels": labels, "work_folder": "_work"}
	}
	// Runners in both scopes: idle ones, and busy ones (for 422 on delete).
	idleRepo, _ := f.jit("/repos/octo-org/app", "idle-repo", 1, "self-hosted", "idle")
	idleOrg, _ := f.jit("/orgs/octo-org", "idle-org", 2, "self-hosted", "idle")
	busyRepo := f.jitRunner("/repos/octo-org/app", "busy-repo", "self-hosted", "busy-repo")
	busyOrg := f.jitRunner("/orgs/octo-org", "busy-org", "self-hosted", "busy-org")
	idleEnt, _ := f.jit("/enterprises/octo-ent", "idle-ent", 2, "self-hosted", "idle")
	busyEnt := f.jitRunner("/enterprises/octo-ent", "busy-ent", "self-hosted", "busy-ent")
	busyRepo.connect()
	busyOrg.connect()
	busyEnt.connect()
	jobRepo := enqueue(t, f, "octo-org/app", time.Hour, "busy-repo")
	jobOrg := enqueue(t, f, "octo-org/other", time.Hour, "busy-org")
	enqueue(t, f, "ent-org/app", time.Hour, "busy-ent")
	queued := enqueue(t, f, "octo-org/app", time.Hour, "nobody")
	busyRepo.poll()
	busyOrg.poll()
	busyEnt.poll()
	for i := range 3 {
		f.jit("/repos/octo-org/app", fmt.Sprintf("page-%d", i), 1, "self-hosted")
	}

	id := func(m map[string]any) string { return strconv.FormatInt(int64(m["id"].(float64)), 10) }
	vars := map[string]string{
		"owner": "octo-org", "repo": "app", "org": "octo-org", "run_id": itoa(jobRepo.RunID), "job_id": itoa(jobRepo.ID),
		"installation_id": strconv.Itoa(testOrgInst), "enterprise": "octo-ent", "runner_group_id": "2",
	}
	releaseVars := map[string]string{"owner": "actions", "repo": "runner", "tag": "v" + f.sim.cfg.RunnerVersion}
	concrete := func(rt *route, over map[string]string) string {
		segs := make([]string, len(rt.segs))
		for i, s := range rt.segs {
			if strings.HasPrefix(s, "{") {
				name := s[1 : len(s)-1]
				v := vars[name]
				if strings.Contains(rt.pattern, "/releases/") {
					v = releaseVars[name]
				}
				if o, ok := over[name]; ok {
					v = o
				}
				if name == "runner_id" && v == "" {
					switch {
					case strings.HasPrefix(rt.pattern, "/orgs/"):
						v = id(idleOrg)
					case strings.HasPrefix(rt.pattern, "/enterprises/"):
						v = id(idleEnt)
					default:
						v = id(idleRepo)
					}
				}
				s = v
			}
			segs[i] = s
		}
		return "/" + strings.Join(segs, "/")
	}
	orgTok := f.installationToken(testOrgInst)
	tokenFor := func(rt *route) string {
		switch {
		case rt.auth == authJWT:
			return f.jwt()
		case rt.pattern == "/installation/repositories":
			return orgTok
		}
		return pat
	}
	call := func(rt *route, over map[string]string, token string, body any, want int) *http.Response {
		t.Helper()
		p := concrete(rt, over)
		if body == nil && rt.method == "POST" && strings.HasSuffix(rt.pattern, "generate-jitconfig") {
			body = jitBody("scenario-"+strconv.Itoa(len(f.sim.Runners())), 1, "self-hosted")
		}
		if token == "" {
			token = tokenFor(rt)
		}
		resp, raw := f.call(rt.method, p, token, body)
		if resp.StatusCode != want {
			t.Errorf("%s %s: %d, want %d: %s", rt.method, p, resp.StatusCode, want, raw)
		}
		return resp
	}
	byKey := map[string]*route{}
	for _, rt := range f.sim.routes {
		byKey[rt.method+" "+rt.pattern] = rt
	}
	r := func(k string) *route {
		rt := byKey[k]
		if rt == nil {
			t.Fatalf("no route %s", k)
		}
		return rt
	}

	for _, rt := range f.sim.routes {
		// Success (the deletes come last, below).
		switch {
		case rt.method == "DELETE":
		case rt.method == "POST" && strings.HasSuffix(rt.pattern, "/cancel"):
			call(rt, map[string]string{"run_id": itoa(queued.RunID)}, "", nil, 202)
		case rt.method == "POST":
			call(rt, nil, "", nil, 201)
		default:
			// Then the same request, conditional on the ETag it got: 304,
			// not counted against the rate limit.
			ok := call(rt, nil, "", nil, 200)
			etag := ok.Header.Get("ETag")
			resp, raw := f.callHeader(rt.method, concrete(rt, nil), tokenFor(rt), nil, http.Header{"If-None-Match": {etag}})
			if resp.StatusCode != http.StatusNotModified || len(raw) != 0 {
				t.Errorf("GET %s If-None-Match %s: %d with %d bytes, want 304 without a body", rt.pattern, etag, resp.StatusCode, len(raw))
			}
			if before, after := rateUsed(t, ok), rateUsed(t, resp); after != before {
				t.Errorf("GET %s: the 304 counted against the rate limit (used %d before it, %d after)", rt.pattern, before, after)
			}
		}
		// 401: wrong credentials.
		bad := "ghp_wrong"
		if rt.auth == authJWT {
			bad = "a.b.c"
		}
		call(rt, nil, bad, nil, 401)
		// 403 and 429: secondary rate limits (with and without retry-after).
		p := concrete(rt, nil)
		_ = f.sim.InjectSecondaryLimit(SecondaryLimitFault{Method: rt.method, PathPrefix: p, Count: 1, RetryAfter: Duration(time.Minute)})
		call(rt, nil, "", nil, 403)
		_ = f.sim.InjectSecondaryLimit(SecondaryLimitFault{Method: rt.method, PathPrefix: p, Count: 1, Status: 429})
		call(rt, nil, "", nil, 429)
		// 404: unknown account, repository or object.
		switch {
		case rt.scope == scopeRepo && strings.Contains(rt.pattern, "{run_id}"):
			call(rt, map[string]string{"run_id": "1"}, "", nil, 404)
		case rt.scope == scopeRepo && strings.Contains(rt.pattern, "{job_id}"):
			call(rt, map[string]string{"job_id": "1"}, "", nil, 404)
		case rt.scope == scopeRepo:
			call(rt, map[string]string{"repo": "nope"}, "", nil, 404)
		case rt.scope == scopeOrg:
			call(rt, map[string]string{"org": "nope"}, "", nil, 404)
		case rt.scope == scopeEnterprise:
			call(rt, map[string]string{"enterprise": "nope"}, "", nil, 404)
		case strings.Contains(rt.pattern, "/releases/tags/"):
			call(rt, map[string]string{"tag": "v0.0.1"}, "", nil, 404)
		case strings.Contains(rt.pattern, "/releases/"):
			call(rt, map[string]string{"repo": "nope"}, "", nil, 404)
		case rt.pattern == "/installation/repositories":
			// Not an installation's token: 403.
			call(rt, nil, pat, nil, 403)
		default:
			call(rt, map[string]string{"installation_id": "999"}, "", nil, 404)
		}
	}
	// Primary rate limit exhaustion (403) through the GHES prefix.
	f.sim.SetRateLimitUsed("user:octocat", 5000)
	resp, _ := f.call("GET", "/api/v3/orgs/octo-org/actions/runners", pat, nil)
	if resp.StatusCode != 403 {
		t.Errorf("exhausted: %d", resp.StatusCode)
	}
	f.sim.SetRateLimitUsed("user:octocat", 0)
	// An unknown path and a missing Authorization.
	f.call("GET", "/repos/octo-org/app/pulls", pat, nil)
	f.call("GET", "/orgs/octo-org/actions/runners", "", nil)
	// Installation token permissions (403 Resource not accessible).
	userTok := f.installationToken(testUserInst)
	f.call("GET", "/repos/octocat/personal/actions/runners", userTok, nil)

	// Pagination.
	call(r("GET /repos/{owner}/{repo}/actions/runners"), nil, "", nil, 200)
	f.call("GET", "/repos/octo-org/app/actions/runners?per_page=2&page=2", pat, nil)
	f.call("GET", "/repos/octo-org/app/actions/runners?name=idle-repo", pat, nil)
	f.call("GET", "/repos/octo-org/app/actions/runs?status=queued&per_page=1", pat, nil)
	f.call("GET", "/repos/octo-org/app/actions/runs?status=in_progress", pat, nil)
	f.call("GET", "/orgs/octo-org/repos?type=private&per_page=1&page=2", pat, nil)
	f.call("GET", "/installation/repositories?per_page=1", orgTok, nil)

	// generate-jitconfig: 409, 422, 400 in both scopes.
	for _, scope := range []string{"/repos/octo-org/app", "/orgs/octo-org", "/enterprises/octo-ent"} {
		p := scope + "/actions/runners/generate-jitconfig"
		for _, body := range []any{
			jitBody("a", 1), map[string]any{"name": "a", "runner_group_id": 1}, jitBody("a", 99, "x"),
			map[string]any{"runner_group_id": 1, "labels": []string{"x"}}, map[string]any{"name": "a", "labels": []string{"x"}},
			jitBody("a", 1, ""), map[string]any{"name": 5, "runner_group_id": 1, "labels": []string{"x"}},
		} {
			resp, raw := f.call("POST", p, pat, body)
			if resp.StatusCode != 422 {
				t.Errorf("POST %s %v: %d %s", p, body, resp.StatusCode, raw)
			}
		}
		if resp, _ := f.call("POST", p, pat, "{"); resp.StatusCode != 400 {
			t.Errorf("bad JSON: %d", resp.StatusCode)
		}
	}
	if resp, _ := f.call("POST", "/repos/octo-org/app/actions/runners/generate-jitconfig", pat, jitBody("idle-repo", 1, "x")); resp.StatusCode != 409 {
		t.Errorf("repo 409: %d", resp.StatusCode)
	}
	if resp, _ := f.call("POST", "/orgs/octo-org/actions/runners/generate-jitconfig", pat, jitBody("idle-org", 1, "x")); resp.StatusCode != 409 {
		t.Errorf("org 409: %d", resp.StatusCode)
	}
	if resp, _ := f.call("POST", "/enterprises/octo-ent/actions/runners/generate-jitconfig", pat, jitBody("idle-ent", 1, "x")); resp.StatusCode != 409 {
		t.Errorf("enterprise 409: %d", resp.StatusCode)
	}

	// Access tokens: 422 and 400.
	at := r("POST /app/installations/{installation_id}/access_tokens")
	call(at, nil, "", map[string]any{"permissions": map[string]string{"contents": "write"}}, 422)
	call(at, nil, "", map[string]any{"repositories": []string{"app"}}, 201)
	call(at, nil, "", "{", 400)

	// Cancel: 409 once completed.
	cancel := r("POST /repos/{owner}/{repo}/actions/runs/{run_id}/cancel")
	call(cancel, map[string]string{"run_id": itoa(queued.RunID)}, "", nil, 409)
	// Job views while running, then cancelled.
	f.call("GET", fmt.Sprintf("/repos/octo-org/app/actions/runs/%d/jobs", jobRepo.RunID), pat, nil)
	f.call("GET", fmt.Sprintf("/repos/octo-org/other/actions/jobs/%d", jobOrg.ID), pat, nil)

	// Deletes: 422 for busy runners, 204, then 404.
	call(r("DELETE /repos/{owner}/{repo}/actions/runners/{runner_id}"), map[string]string{"runner_id": itoa(busyRepo.id)}, "", nil, 422)
	call(r("DELETE /orgs/{org}/actions/runners/{runner_id}"), map[string]string{"runner_id": itoa(busyOrg.id)}, "", nil, 422)
	call(r("DELETE /enterprises/{enterprise}/actions/runners/{runner_id}"), map[string]string{"runner_id": itoa(busyEnt.id)}, "", nil, 422)
	for _, rt := range []*route{r("DELETE /repos/{owner}/{repo}/actions/runners/{runner_id}"), r("DELETE /orgs/{org}/actions/runners/{runner_id}"), r("DELETE /enterprises/{enterprise}/actions/runners/{runner_id}")} {
		call(rt, nil, "", nil, 204)
		call(rt, nil, "", nil, 404)
	}
	// Completed jobs and runs, after the clock runs them out.
	f.clock.Advance(time.Hour)
	f.call("GET", fmt.Sprintf("/repos/octo-org/app/actions/runs/%d", jobRepo.RunID), pat, nil)
	f.call("GET", fmt.Sprintf("/repos/octo-org/app/actions/jobs/%d", jobRepo.ID), pat, nil)
	f.call("GET", "/repos/octo-org/app/actions/runs", pat, nil)
}

// TestWebhookPayloadsMatchGitHubExamples compares the key sets of the
// simulator's workflow_job payloads with every published example of the
// same action: every key an example has (recursively, through objects and
// the elements of arrays of objects) must be present.
func TestWebhookPayloadsMatchGitHubExamples(t *testing.T) {
	path := testdeps.NPMFile(t, "@octokit/webhooks-examples", "api.github.com/index.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var index []struct {
		Name     string           `json:"name"`
		Examples []map[string]any `json:"examples"`
	}
	if err := json.Unmarshal(raw, &index); err != nil {
		t.Fatalf("decode %s: %v", path, err)
	}
	examples := map[string][]map[string]any{}
	for _, ev := range index {
		if ev.Name != "workflow_job" {
			continue
		}
		for _, ex := range ev.Examples {
			a, _ := ex["action"].(string)
			examples[a] = append(examples[a], ex)
		}
	}
	if len(examples["queued"]) == 0 || len(examples["in_progress"]) == 0 || len(examples["completed"]) == 0 {
		t.Fatalf("no workflow_job examples in %s", path)
	}

	// An organization repository with a license and an App installation,
	// so that every optional object of the examples is present.
	f := newFixture(t, func(c *Config) { c.HeartbeatTimeout = Duration(time.Hour) })
	r := f.jitRunner("/orgs/octo-org", "payload-runner", "self-hosted", "gpu")
	r.connect()
	job := enqueue(t, f, "octo-org/app", time.Minute, "self-hosted", "gpu")
	r.poll()
	f.clock.Advance(time.Minute)
	f.flush()
	got := map[string]bool{}
	for _, d := range f.sim.Deliveries() {
		if d.JobID != job.ID {
			continue
		}
		var payload map[string]any
		if err := json.Unmarshal(d.Payload, &payload); err != nil {
			t.Fatal(err)
		}
		got[d.Action] = true
		for i, ex := range examples[d.Action] {
			var missing []string
			missingKeys(ex, payload, "", &missing)
			if len(missing) > 0 {
				sort.Strings(missing)
				t.Errorf("%s payload lacks keys of GitHub's example %d: %s", d.Action, i, strings.Join(missing, ", "))
			}
		}
	}
	for _, a := range []string{"queued", "in_progress", "completed"} {
		if !got[a] {
			t.Errorf("no %s delivery", a)
		}
	}
}

// missingKeys appends the key paths of want that have lacks. The
// top-level deployment object is skipped: GitHub sends it only for jobs
// that deploy to an environment, which the simulator does not model.
func missingKeys(want, have any, prefix string, out *[]string) {
	switch w := want.(type) {
	case map[string]any:
		h, _ := have.(map[string]any)
		for k, v := range w {
			if prefix == "" && k == "deployment" {
				continue
			}
			hv, ok := h[k]
			if !ok {
				*out = append(*out, prefix+"."+k)
				continue
			}
			missingKeys(v, hv, prefix+"."+k, out)
		}
	case []any:
		h, _ := have.([]any)
		for _, we := range w {
			if _, isObj := we.(map[string]any); !isObj {
				continue
			}
			if len(h) == 0 {
				*out = append(*out, prefix+"[] (empty)")
				return
			}
			for _, he := range h {
				missingKeys(we, he, prefix+"[]", out)
			}
		}
	}
}
