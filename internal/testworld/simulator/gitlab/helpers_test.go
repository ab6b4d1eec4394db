package gitlabsim

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	gitlab "gitlab.com/gitlab-org/api/client-go"
)

// Tokens of the test world (testConfig).
const (
	adminPAT     = "glpat-admin0000000000000000"
	ownerPAT     = "glpat-owner0000000000000000"
	maintPAT     = "glpat-maint0000000000000000"
	maintRunner  = "glpat-maintrunner000000000" // create_runner only
	devPAT       = "glpat-dev000000000000000000"
	readPAT      = "glpat-read00000000000000000" // read_api
	projectToken = "glpat-projectbot0000000000"  // project access token of acme/platform/app
	groupToken   = "glpat-groupbot000000000000"  // group access token of acme/platform, Owner
)

// testConfig is a world with nested groups and a role per user:
//
//	acme (owner: Owner)
//	acme/platform            (group token: Owner)
//	acme/platform/ci
//	acme/platform/app        (maint: Maintainer, dev: Developer, project token: Maintainer)
//	acme/platform/ci/tools
//	acme/web
func testConfig() Config {
	return Config{
		Groups:   []GroupConfig{{Path: "acme/platform/ci"}},
		Projects: []ProjectConfig{{Path: "acme/platform/app"}, {Path: "acme/platform/ci/tools"}, {Path: "acme/web"}},
		Users: []UserConfig{
			{Username: "root", Admin: true},
			{Username: "owner", Members: map[string]int{"acme": Owner}},
			{Username: "maint", Members: map[string]int{"acme/platform/app": Maintainer}},
			{Username: "dev", Members: map[string]int{"acme/platform/app": Developer}},
		},
		Tokens: []TokenConfig{
			{Token: adminPAT, User: "root", Scopes: []string{"api"}},
			{Token: ownerPAT, User: "owner", Scopes: []string{"api"}},
			{Token: maintPAT, User: "maint", Scopes: []string{"api"}},
			{Token: maintRunner, User: "maint", Scopes: []string{"create_runner"}},
			{Token: devPAT, User: "dev", Scopes: []string{"api"}},
			{Token: readPAT, User: "owner", Scopes: []string{"read_api"}},
			{Token: projectToken, Kind: "project", Resource: "acme/platform/app", AccessLevel: Maintainer, Scopes: []string{"api"}, Name: "hyperfleet"},
			{Token: groupToken, Kind: "group", Resource: "acme/platform", AccessLevel: Owner, Scopes: []string{"api", "create_runner"}, Name: "hyperfleet-group"},
		},
	}
}

// world is a simulator behind a test HTTP server.
type world struct {
	sim *Simulator
	srv *httptest.Server
}

func newWorld(t *testing.T, opts ...Option) *world {
	t.Helper()
	sim, err := New(testConfig(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sim)
	t.Cleanup(func() { srv.Close(); sim.Close() })
	return &world{sim: sim, srv: srv}
}

// client is client-go as the operator will build it, without retries so
// that tests see each answer.
func (w *world) client(t *testing.T, token string) *gitlab.Client {
	t.Helper()
	c, err := gitlab.NewClient(token, gitlab.WithBaseURL(w.srv.URL+APIPrefix), gitlab.WithoutRetries())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// call sends a raw request to the simulator (the runner API, or REST calls
// whose headers and bodies a test inspects) and returns the status, headers
// and body.
func (w *world) call(t *testing.T, method, path string, header http.Header, body any) (int, http.Header, []byte) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, w.srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if body != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, raw
}

// statusOf is the HTTP status of a client-go error (0 when it has none).
func statusOf(err error) int {
	// client-go turns every 404 into gitlab.ErrNotFound, dropping the body.
	if errors.Is(err, gitlab.ErrNotFound) {
		return http.StatusNotFound
	}
	var er *gitlab.ErrorResponse
	if !errors.As(err, &er) || er.Response == nil {
		return 0
	}
	return er.Response.StatusCode
}

func ptr[T any](v T) *T { return &v }

// createRunner makes a runner through client-go and fails the test on error.
func (w *world) createRunner(t *testing.T, token string, opt *gitlab.CreateUserRunnerOptions) *gitlab.UserRunner {
	t.Helper()
	r, _, err := w.client(t, token).Users.CreateUserRunner(opt)
	if err != nil {
		t.Fatalf("create runner: %v", err)
	}
	return r
}

func (w *world) projectID(t *testing.T, path string) int64 {
	t.Helper()
	w.sim.mu.Lock()
	defer w.sim.mu.Unlock()
	p := w.sim.projectByPathLocked(path)
	if p == nil {
		t.Fatalf("no project %s", path)
	}
	return p.id
}

func (w *world) groupID(t *testing.T, path string) int64 {
	t.Helper()
	w.sim.mu.Lock()
	defer w.sim.mu.Unlock()
	g := w.sim.groupByPathLocked(path)
	if g == nil {
		t.Fatalf("no group %s", path)
	}
	return g.id
}
