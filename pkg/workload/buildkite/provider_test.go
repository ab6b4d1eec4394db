package buildkite_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	bksim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/simclock"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite"
)

// The provider against the Buildkite simulator (internal/testworld/
// simulator/buildkite), whose REST answers are go-buildkite's own types
// and whose agent API the real buildkite-agent drives in the simulator's
// own tests. Here a few raw agent-API calls stand in for a VM's agent
// (register, connect, ping): what the provider sees of an agent is the
// simulator's REST view of it.

const apiToken = "bkua_operator"

// passive is the simulator's fake clock as the provider's clock, so that
// both see the same time.
type passive struct{ c *simclock.FakeClock }

func (p passive) Now() time.Time                  { return p.c.Now() }
func (p passive) Since(t time.Time) time.Duration { return p.c.Now().Sub(t) }

type world struct {
	sim     *bksim.Simulator
	srv     *httptest.Server
	clock   *bksim.FakeClock
	cluster bksim.Cluster
}

func newWorld(t *testing.T, cfg bksim.Config) *world {
	t.Helper()
	if cfg.APITokens == nil {
		cfg.APITokens = []bksim.APIToken{{Token: apiToken, Scopes: bksim.Scopes()}}
	}
	clk := simclock.NewFakeClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	sim := bksim.New(cfg, bksim.WithClock(clk))
	srv := httptest.NewServer(sim)
	t.Cleanup(func() { srv.Close(); sim.Close() })
	c := sim.CreateCluster("linux")
	if _, err := sim.CreateQueue(c.ID, "linux"); err != nil {
		t.Fatal(err)
	}
	if err := sim.CreatePipeline("app", c.ID); err != nil {
		t.Fatal(err)
	}
	return &world{sim: sim, srv: srv, clock: clk, cluster: c}
}

func (w *world) provider(t *testing.T, scope workload.Scope, token string) *buildkite.Provider {
	t.Helper()
	p, err := buildkite.New(buildkite.Config{
		APIURL: w.srv.URL, AgentEndpoint: w.srv.URL + "/v3", Organization: "acme", Cluster: w.cluster.ID,
		Scope: scope, Token: token, Clock: passive{w.clock}, HTTPTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// agentCall is one agent-API request as a VM's agent makes it.
func (w *world) agentCall(t *testing.T, method, path, token string, body any) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		raw, _ := json.Marshal(body)
		rd = bytes.NewReader(raw)
	}
	req, _ := http.NewRequest(method, w.srv.URL+"/v3/"+path, rd)
	req.Header.Set("Authorization", "Token "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]any{}
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// register registers and connects an agent with a cluster agent token and
// returns its access token; code is register's status.
func (w *world) register(t *testing.T, token, name string, tags ...string) (access string, code int) {
	t.Helper()
	code, out := w.agentCall(t, http.MethodPost, "register", token, map[string]any{"name": name, "hostname": name, "version": "3.138.1", "meta_data": tags})
	if code != http.StatusOK {
		return "", code
	}
	access, _ = out["access_token"].(string)
	if c, _ := w.agentCall(t, http.MethodPost, "connect", access, map[string]any{}); c != http.StatusOK {
		t.Fatalf("connect: %d", c)
	}
	return access, code
}

// restTokens lists the cluster's agent tokens as the REST API does.
func (w *world) restTokens(t *testing.T) []map[string]any {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, w.srv.URL+"/v2/organizations/acme/clusters/"+w.cluster.ID+"/tokens", nil)
	req.Header.Set("Authorization", "Bearer "+apiToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// queueJob creates a build of one job on queue linux and returns the
// job's id.
func (w *world) queueJob(t *testing.T) string {
	t.Helper()
	b, err := w.sim.CreateBuild("app", "go", []bksim.Step{{Key: "test", Command: "true", Agents: []string{"queue=linux"}}})
	if err != nil {
		t.Fatal(err)
	}
	return b.JobIDs[0]
}

// bound is the spec of the runner name bound to job, as the operator
// issues it.
func bound(name, job string) workload.RunnerSpec {
	return workload.RunnerSpec{Name: name, Labels: buildkite.AgentTags("linux", nil), Job: job, JobRepository: "acme/app"}
}

// clusterToken is the secret of the cluster agent token the operator made
// for the agent name, as the simulator's admin API shows it; empty when
// none is left.
func (w *world) clusterToken(t *testing.T, name string) string {
	t.Helper()
	toks, err := w.sim.Tokens(w.cluster.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range toks {
		if tok.Description == "hyperfleet agent "+name && !tok.Deleted {
			return tok.Secret
		}
	}
	return ""
}

// TestClusterTokenLifecycle: the claim's cluster agent token is the
// operator's and issues the job acquisition token its VM gets. A runner
// bound to no job gets nothing, and no token is made for it. One token per
// claim: issuing again replaces it (the replaced token's job token
// registers nothing); it expires on its own; once the agent registered,
// RetireRegistration deletes it (it registers no agent and calls no Stacks
// API any more, the job token is dead) while the agent works on; and
// deregistering the runner deletes it and stops the agent.
func TestClusterTokenLifecycle(t *testing.T) {
	w := newWorld(t, bksim.Config{})
	p := w.provider(t, workload.Scope{Owner: "acme"}, apiToken)
	ctx := context.Background()
	if err := p.VerifyScope(ctx); err != nil {
		t.Fatalf("VerifyScope: %v", err)
	}
	if cred, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: "warm-1", Labels: buildkite.AgentTags("linux", nil)}); !errors.Is(err, workload.ErrJobNotBindable) || !cred.Secret.IsZero() {
		t.Fatalf("a runner bound to no job: %+v, %v; want no credential, ErrJobNotBindable", cred, err)
	}
	if toks := w.restTokens(t); len(toks) != 0 {
		t.Fatalf("a token was made for a runner bound to no job: %v", toks)
	}
	job := w.queueJob(t)
	first, err := p.IssueCredential(ctx, bound("claim-a", job))
	if err != nil {
		t.Fatal(err)
	}
	cred, err := p.IssueCredential(ctx, bound("claim-a", job))
	if err != nil {
		t.Fatal(err)
	}
	if cred.Method != buildkite.MethodJobToken || cred.Job != job || cred.RunnerName != "claim-a" || cred.RegistrationURL != w.srv.URL+"/v3" ||
		!strings.HasPrefix(cred.Secret.Reveal(), "bkjat_") || cred.ExpiresAt.After(w.clock.Now().Add(buildkite.DefaultTokenLifetime)) {
		t.Fatalf("credential = %+v (expires %s)", cred, cred.ExpiresAt)
	}
	if strings.Contains(fmt.Sprintf("%v %+v", cred, cred), cred.Secret.Reveal()) {
		t.Fatal("the credential prints its token")
	}
	// One cluster token per claim, with Buildkite's expires_at: the second
	// issue replaced the first, whose job token registers nothing.
	toks := w.restTokens(t)
	var expires time.Time
	if len(toks) == 1 {
		expires, _ = time.Parse(time.RFC3339, fmt.Sprint(toks[0]["expires_at"]))
	}
	if len(toks) != 1 || toks[0]["description"] != "hyperfleet agent claim-a" || !expires.Equal(w.clock.Now().Add(buildkite.DefaultTokenLifetime)) {
		t.Fatalf("tokens = %v", toks)
	}
	if _, code := w.register(t, first.Secret.Reveal(), "claim-a"); code != http.StatusUnauthorized {
		t.Fatalf("the replaced token's job token registered: %d", code)
	}
	// The tokens expire on their own, even if nobody deletes them.
	w.clock.Advance(buildkite.DefaultTokenLifetime + time.Second)
	if _, code := w.register(t, cred.Secret.Reveal(), "claim-a"); code != http.StatusUnauthorized {
		t.Fatalf("an expired job token registered: %d", code)
	}

	// A fresh one registers; then the cluster token goes.
	cred, err = p.IssueCredential(ctx, bound("claim-a", job))
	if err != nil {
		t.Fatal(err)
	}
	cluster := w.clusterToken(t, "claim-a")
	access, code := w.register(t, cred.Secret.Reveal(), "claim-a", "queue=linux")
	if code != http.StatusOK || cluster == "" {
		t.Fatalf("register with a fresh job token: %d (cluster token %t)", code, cluster != "")
	}
	r, err := p.GetRunner(ctx, "claim-a")
	if err != nil || r.State != workload.RunnerIdle || !slices.Contains(r.Labels, "queue=linux") {
		t.Fatalf("GetRunner = %+v, %v", r, err)
	}
	for range 2 {
		if err := p.RetireRegistration(ctx, "claim-a"); err != nil {
			t.Fatalf("RetireRegistration: %v", err)
		}
	}
	if w.clusterToken(t, "claim-a") != "" || len(w.restTokens(t)) != 0 {
		t.Fatal("RetireRegistration left the cluster token")
	}
	if _, code := w.register(t, cluster, "thief", "queue=linux"); code != http.StatusUnauthorized {
		t.Fatalf("the retired cluster token registered an agent: %d", code)
	}
	if code, _ := w.agentCall(t, http.MethodPost, "stacks/register", cluster, map[string]any{"key": "thief", "type": "custom", "queue_key": "linux"}); code != http.StatusUnauthorized {
		t.Fatalf("the retired cluster token called the Stacks API: %d", code)
	}
	if _, code := w.register(t, cred.Secret.Reveal(), "thief"); code != http.StatusUnauthorized {
		t.Fatalf("the job token registered again: %d", code)
	}
	// The agent works on with its own access token: it acquires its job.
	if c, _ := w.agentCall(t, http.MethodPut, "jobs/"+job+"/acquire", access, nil); c != http.StatusOK {
		t.Fatalf("the registered agent's acquire after its cluster token went: %d", c)
	}
	if err := p.DeregisterRunner(ctx, 0, "claim-a"); !errors.Is(err, workload.ErrRunnerBusy) {
		t.Fatalf("DeregisterRunner of the agent with its job = %v; want ErrRunnerBusy", err)
	}

	// Deregistering an agent that took no job deletes its token and stops
	// it.
	other := w.queueJob(t)
	cred, err = p.IssueCredential(ctx, bound("claim-b", other))
	if err != nil {
		t.Fatal(err)
	}
	access, code = w.register(t, cred.Secret.Reveal(), "claim-b", "queue=linux")
	if code != http.StatusOK {
		t.Fatalf("register claim-b: %d", code)
	}
	if err := p.DeregisterRunner(ctx, 0, "claim-b"); err != nil {
		t.Fatal(err)
	}
	if len(w.restTokens(t)) != 0 {
		t.Fatal("DeregisterRunner left a token")
	}
	if _, out := w.agentCall(t, http.MethodGet, "ping", access, nil); out["action"] != "disconnect" {
		t.Fatalf("the deregistered agent's ping = %v; want disconnect", out)
	}
	// Gone already: success again.
	if err := p.DeregisterRunner(ctx, 0, "claim-b"); err != nil {
		t.Fatal(err)
	}
}

func TestBusyAgentStays(t *testing.T) {
	w := newWorld(t, bksim.Config{})
	p := w.provider(t, workload.Scope{Owner: "acme"}, apiToken)
	ctx := context.Background()
	job := w.queueJob(t)
	cred, err := p.IssueCredential(ctx, bound("claim-b", job))
	if err != nil {
		t.Fatal(err)
	}
	access, code := w.register(t, cred.Secret.Reveal(), "claim-b", "queue=linux")
	if code != http.StatusOK {
		t.Fatal(code)
	}
	if c, out := w.agentCall(t, http.MethodPut, "jobs/"+job+"/acquire", access, nil); c != http.StatusOK {
		t.Fatalf("acquire: %d %v", c, out)
	}
	r, err := p.GetRunner(ctx, "claim-b")
	if err != nil || r.State != workload.RunnerBusy {
		t.Fatalf("GetRunner = %+v, %v; want busy", r, err)
	}
	if err := p.DeregisterRunner(ctx, 0, "claim-b"); !errors.Is(err, workload.ErrRunnerBusy) {
		t.Fatalf("DeregisterRunner of a busy agent = %v; want ErrRunnerBusy", err)
	}
	if len(w.restTokens(t)) != 0 {
		t.Fatal("the busy agent's token was kept")
	}
	runners, err := p.ListRunners(ctx, "claim-")
	if err != nil || len(runners) != 1 || runners[0].Name != "claim-b" {
		t.Fatalf("ListRunners = %+v, %v", runners, err)
	}
	if _, err := p.GetRunner(ctx, "claim-z"); !errors.Is(err, workload.ErrNotFound) {
		t.Fatalf("GetRunner of no agent = %v", err)
	}
}

func TestVerifyScopeRefusals(t *testing.T) {
	w := newWorld(t, bksim.Config{APITokens: []bksim.APIToken{
		{Token: apiToken, Scopes: bksim.Scopes()},
		{Token: "bkua_reader", Scopes: []string{"read_organizations", "read_clusters", "read_agents", "read_builds"}},
	}})
	ctx := context.Background()
	err := w.provider(t, workload.Scope{Owner: "acme"}, "bkua_reader").VerifyScope(ctx)
	if !errors.Is(err, workload.ErrUnauthorized) || !strings.Contains(err.Error(), "write_clusters, write_agents, write_builds") {
		t.Fatalf("VerifyScope without write scopes = %v", err)
	}
	if err := w.provider(t, workload.Scope{Owner: "acme"}, "bkua_unknown").VerifyScope(ctx); !errors.Is(err, workload.ErrUnauthorized) {
		t.Fatalf("VerifyScope with an unknown token = %v", err)
	}
	other, err := buildkite.New(buildkite.Config{APIURL: w.srv.URL, Organization: "acme", Cluster: "0190a1b2-0000-4000-8000-000000000000", Token: apiToken, Clock: passive{w.clock}})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.VerifyScope(ctx); !errors.Is(err, workload.ErrNotFound) {
		t.Fatalf("VerifyScope of an unknown cluster = %v", err)
	}
	// A refused scope is the user's to fix, under the platform's name.
	if _, err := w.provider(t, workload.Scope{Owner: "acme"}, "bkua_reader").IssueCredential(ctx, bound("x", w.queueJob(t))); !errors.Is(err, workload.ErrUnauthorized) {
		t.Fatalf("IssueCredential without write_clusters = %v", err)
	}
}

func TestQueuedJobsGetJobAndCancel(t *testing.T) {
	w := newWorld(t, bksim.Config{})
	if err := w.sim.CreatePipeline("docs", w.cluster.ID); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p := w.provider(t, workload.Scope{Owner: "acme"}, apiToken)
	b, err := w.sim.CreateBuild("app", "go", []bksim.Step{
		{Key: "linux", Label: "on linux", Command: "make", Agents: []string{"queue=linux", "os=linux"}},
		{Key: "default", Command: "make docs"},
		{Key: "later", Command: "make release", Waiting: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.sim.CreateBuild("docs", "docs", []bksim.Step{{Command: "true", Agents: []string{"queue=linux"}}}); err != nil {
		t.Fatal(err)
	}
	repos, err := p.Repositories(ctx)
	if err != nil || !slices.Equal(repos, []string{"acme/app", "acme/docs"}) {
		t.Fatalf("Repositories = %v, %v", repos, err)
	}
	jobs, err := p.QueuedJobs(ctx, []string{"acme/app"})
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 2 {
		t.Fatalf("QueuedJobs = %+v; want the two scheduled jobs of acme/app (not the waiting one, not acme/docs)", jobs)
	}
	byKey := map[string]workload.Job{}
	for _, j := range jobs {
		byKey[j.ID] = j
		if j.Platform != "buildkite" || j.Repository != "acme/app" || j.RunID != int64(b.Number) || j.State != workload.JobQueued || j.CreatedAt.IsZero() {
			t.Errorf("job = %+v", j)
		}
	}
	linux, def := byKey[b.JobIDs[0]], byKey[b.JobIDs[1]]
	if !slices.Equal(linux.Labels, []string{"queue=linux", "os=linux"}) || linux.Name != "on linux" {
		t.Errorf("the linux job = %+v", linux)
	}
	if !slices.Equal(def.Labels, []string{buildkite.DefaultQueueLabel}) {
		t.Errorf("the default queue's job has labels %v; want %s", def.Labels, buildkite.DefaultQueueLabel)
	}
	// Routing: a pool of queue linux with os=linux takes the first; only a
	// pool that says it serves the default queue takes the second.
	pool := append(buildkite.AgentTags("linux", []string{"os=linux"}), "self-hosted", "hyperfleet")
	if !workload.Covers(pool, linux.Labels) || workload.Covers(pool, def.Labels) || !workload.Covers(append(pool, buildkite.DefaultQueueLabel), def.Labels) {
		t.Error("routing by labels does not follow Buildkite's queues")
	}
	got, err := p.GetJob(ctx, "acme/app", b.JobIDs[0])
	if err != nil || got.ID != b.JobIDs[0] || got.State != workload.JobQueued {
		t.Fatalf("GetJob = %+v, %v", got, err)
	}
	if _, err := p.GetJob(ctx, "acme/app", "0190a1b2-0000-4000-8000-000000000001"); !errors.Is(err, workload.ErrNotFound) {
		t.Fatalf("GetJob of no job = %v", err)
	}
	if _, err := p.GetJob(ctx, "other/app", b.JobIDs[0]); !errors.Is(err, workload.ErrNotFound) {
		t.Fatalf("GetJob of another organization = %v", err)
	}
	if err := p.CancelRun(ctx, "acme/app", int64(b.Number)); err != nil {
		t.Fatal(err)
	}
	if j, _ := w.sim.Job(b.JobIDs[0]); j.State != "canceled" {
		t.Fatalf("after CancelRun the job is %s", j.State)
	}
	got, err = p.GetJob(ctx, "acme/app", b.JobIDs[0])
	if err != nil || got.State != workload.JobCompleted || got.Conclusion != "canceled" {
		t.Fatalf("GetJob of a canceled job = %+v, %v", got, err)
	}
	// A finished build: cancelling again is done, not an error.
	if err := p.CancelRun(ctx, "acme/app", int64(b.Number)); err != nil {
		t.Fatalf("CancelRun of a finished build = %v", err)
	}
	// A pipeline-scoped provider reads its pipeline only.
	docs := w.provider(t, workload.Scope{Owner: "acme", Repository: "docs"}, apiToken)
	if repos, err := docs.Repositories(ctx); err != nil || !slices.Equal(repos, []string{"acme/docs"}) {
		t.Fatalf("pipeline Repositories = %v, %v", repos, err)
	}
	if jobs, err := docs.QueuedJobs(ctx, []string{"acme/docs"}); err != nil || len(jobs) != 1 {
		t.Fatalf("pipeline QueuedJobs = %+v, %v", jobs, err)
	}
}

func TestRateLimitAndOutagesDoNotWait(t *testing.T) {
	w := newWorld(t, bksim.Config{RateLimit: 12})
	p := w.provider(t, workload.Scope{Owner: "acme"}, apiToken)
	ctx := context.Background()
	w.sim.InjectFault(bksim.Fault{Method: http.MethodGet, PathPrefix: "/v2/organizations/acme/builds", Status: http.StatusServiceUnavailable, Count: 1})
	if _, err := p.QueuedJobs(ctx, []string{"acme/app"}); !errors.Is(err, workload.ErrUnavailable) {
		t.Fatalf("QueuedJobs on a 503 = %v", err)
	}
	// The budget runs down to the cleanup reserve: demand reads stop
	// locally, cleanup goes on; past the budget Buildkite answers 429,
	// which comes back at once (go-buildkite alone would retry it for
	// minutes).
	start := time.Now()
	var err error
	for range 20 {
		if _, err = p.QueuedJobs(ctx, []string{"acme/app"}); err != nil {
			break
		}
	}
	var rl *workload.RateLimitError
	if !errors.As(err, &rl) || !rl.Reserve {
		t.Fatalf("demand reads near the limit = %v; want a reserve RateLimitError", err)
	}
	if err := p.DeregisterRunner(ctx, 0, "nobody"); err != nil {
		t.Fatalf("cleanup within the reserve = %v", err)
	}
	for range 20 {
		if err = p.DeregisterRunner(ctx, 0, "nobody"); err != nil {
			break
		}
	}
	if !errors.As(err, &rl) || rl.Reserve || !rl.RetryAt.After(w.clock.Now()) {
		t.Fatalf("cleanup past the limit = %v; want a RateLimitError with a retry time", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("rate-limited calls took %s; a provider never waits a limit out", d)
	}
}
