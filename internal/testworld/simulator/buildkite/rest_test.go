package buildkitesim

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/buildkite/go-buildkite/v4"
)

var allScopes = []string{"read_organizations", "read_clusters", "write_clusters", "read_agents", "write_agents", "read_builds", "write_builds"}

func restClient(t *testing.T, w *world, token string) *buildkite.Client {
	t.Helper()
	c, err := buildkite.NewClient(buildkite.WithBaseURL(w.srv.URL+"/"), buildkite.WithTokenAuth(token))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// agentCall makes one agent API request by hand (the real agent's calls
// are TestRealAgent*'s): it sets up agents for the REST tests.
func agentCall(t *testing.T, w *world, method, path, token string, body any) (int, map[string]any) {
	t.Helper()
	var rd *strings.Reader
	if body != nil {
		raw, _ := json.Marshal(body)
		rd = strings.NewReader(string(raw))
	} else {
		rd = strings.NewReader("")
	}
	req, _ := http.NewRequest(method, w.srv.URL+"/v3/"+path, rd)
	req.Header.Set("Authorization", "Token "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

func statusOf(err error) int {
	var er *buildkite.ErrorResponse
	if errors.As(err, &er) {
		return er.Response.StatusCode
	}
	return 0
}

// TestRESTWithGoBuildkite drives the REST subset with
// github.com/buildkite/go-buildkite/v4, the client HyperFleet's Buildkite
// back-end will use: organization, clusters, queues, cluster agent tokens
// (create, list, delete, and what a deleted token still allows), scheduled
// builds with their jobs, agents and their stop, and build cancel.
func TestRESTWithGoBuildkite(t *testing.T) {
	w := newWorld(t, Config{APITokens: []APIToken{{Token: "admin", Scopes: allScopes}}})
	ctx := context.Background()
	bk := restClient(t, w, "admin")
	org := w.sim.cfg.Organization

	o, _, err := bk.Organizations.Get(ctx, org)
	if err != nil || o.Slug != org {
		t.Fatalf("organization: %+v, %v", o, err)
	}
	clusters, _, err := bk.Clusters.List(ctx, org, nil)
	if err != nil || len(clusters) != 1 || clusters[0].ID != w.cluster.ID || clusters[0].DefaultQueueID != w.cluster.DefaultQueueID {
		t.Fatalf("clusters: %+v, %v", clusters, err)
	}
	if _, err := w.sim.CreateQueue(w.cluster.ID, "large"); err != nil {
		t.Fatal(err)
	}
	queues, _, err := bk.ClusterQueues.List(ctx, org, w.cluster.ID, nil)
	if err != nil || len(queues) != 2 || queues[0].Key != "default" || queues[1].Key != "large" {
		t.Fatalf("queues: %+v, %v", queues, err)
	}

	// A token made through the API registers agents; one limited to other
	// addresses does not.
	tok, _, err := bk.ClusterTokens.Create(ctx, org, w.cluster.ID, buildkite.ClusterTokenCreateUpdate{Description: "vm-1"})
	if err != nil || tok.Token == "" || tok.ID == "" {
		t.Fatalf("create token: %+v, %v", tok, err)
	}
	narrow, _, err := bk.ClusterTokens.Create(ctx, org, w.cluster.ID, buildkite.ClusterTokenCreateUpdate{Description: "elsewhere", AllowedIPAddresses: "10.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := agentCall(t, w, "POST", "register", narrow.Token, map[string]any{"name": "x"}); code != http.StatusUnauthorized {
		t.Errorf("register from an address the token does not allow: %d, want 401", code)
	}
	code, reg := agentCall(t, w, "POST", "register", tok.Token, map[string]any{"name": "vm-1", "meta_data": []string{"queue=large"}})
	if code != http.StatusOK {
		t.Fatalf("register: %d %v", code, reg)
	}
	access := reg["access_token"].(string)
	if code, _ := agentCall(t, w, "POST", "connect", access, nil); code != http.StatusOK {
		t.Fatalf("connect: %d", code)
	}
	list, _, err := bk.ClusterTokens.List(ctx, org, w.cluster.ID, nil)
	if err != nil || len(list) != 3 || list[1].Token != "" {
		t.Fatalf("token list (secrets must not be listed): %+v, %v", list, err)
	}
	if _, err := bk.ClusterTokens.Delete(ctx, org, w.cluster.ID, tok.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := bk.ClusterTokens.Get(ctx, org, w.cluster.ID, tok.ID); statusOf(err) != http.StatusNotFound {
		t.Errorf("get a deleted token: %v, want 404", err)
	}
	if code, _ := agentCall(t, w, "POST", "register", tok.Token, map[string]any{"name": "vm-2"}); code != http.StatusUnauthorized {
		t.Errorf("register with a deleted token: %d, want 401", code)
	}
	// The agent registered before the deletion runs on with its own token.
	if code, _ := agentCall(t, w, "GET", "ping", access, nil); code != http.StatusOK {
		t.Errorf("ping of an agent whose registration token was deleted: %d, want 200", code)
	}

	// Scheduled builds, with their jobs' ids, states, rules and times.
	b, err := w.sim.CreateBuild(w.pipeline, "scheduled", []Step{
		{Key: "unit", Command: "make test", Agents: []string{"queue=large", "os=linux"}},
		{Key: "lint", Command: "make lint"},
	})
	if err != nil {
		t.Fatal(err)
	}
	builds, _, err := bk.Builds.ListByOrg(ctx, org, &buildkite.BuildsListOptions{State: []string{"scheduled"}})
	if err != nil || len(builds) != 1 || builds[0].ID != b.ID || len(builds[0].Jobs) != 2 {
		t.Fatalf("scheduled builds: %+v, %v", builds, err)
	}
	j := builds[0].Jobs[0]
	if j.ID != b.JobIDs[0] || j.State != "scheduled" || j.StepKey != "unit" || !slices.Equal(j.AgentQueryRules, []string{"queue=large", "os=linux"}) ||
		j.ScheduledAt == nil || j.CreatedAt == nil || j.StartedAt != nil || j.ClusterID != w.cluster.ID {
		t.Errorf("job as listed: %+v", j)
	}
	if byPipe, _, err := bk.Builds.ListByPipeline(ctx, org, w.pipeline, &buildkite.BuildsListOptions{State: []string{"running"}}); err != nil || len(byPipe) != 0 {
		t.Errorf("running builds of the pipeline: %d, %v", len(byPipe), err)
	}

	// The agent (queue=large, no os tag) does not match the unit job's
	// os=linux rule, nor the lint job's default queue: its ping has no job.
	if _, ping := agentCall(t, w, "GET", "ping", access, nil); ping["job"] != nil {
		t.Errorf("ping dispatched a job the agent does not match: %v", ping["job"])
	}

	agents, _, err := bk.Agents.List(ctx, org, nil)
	if err != nil || len(agents) != 1 || agents[0].Name != "vm-1" || agents[0].ConnectedState != "connected" || !slices.Equal(agents[0].Metadata, []string{"queue=large"}) {
		t.Fatalf("agents: %+v, %v", agents, err)
	}
	if _, err := bk.Agents.Stop(ctx, org, agents[0].ID, false); err != nil {
		t.Fatal(err)
	}
	if _, ping := agentCall(t, w, "GET", "ping", access, nil); ping["action"] != "disconnect" {
		t.Errorf("ping after stop: %v, want action disconnect", ping)
	}

	got, err := bk.Builds.Cancel(ctx, org, w.pipeline, "1")
	if err != nil || got.State != "canceled" {
		t.Fatalf("cancel: %+v, %v", got.State, err)
	}
	if _, err := bk.Builds.Cancel(ctx, org, w.pipeline, "1"); statusOf(err) != http.StatusUnprocessableEntity {
		t.Errorf("cancel a finished build: %v, want 422", err)
	}
}

// TestRESTScopesRateLimitsAndFaults: a token without a route's scope gets
// 403, an unknown one 401; the rate limit answers 429 with its headers;
// an injected 5xx reaches the client.
func TestRESTScopesRateLimitsAndFaults(t *testing.T) {
	w := newWorld(t, Config{RateLimit: 5, APITokens: []APIToken{
		{Token: "reader", Scopes: []string{"read_builds", "read_agents"}},
		{Token: "writer", Scopes: []string{"read_clusters", "write_clusters"}},
	}})
	ctx := context.Background()
	org := w.sim.cfg.Organization
	reader := restClient(t, w, "reader")
	if _, _, err := reader.Builds.ListByOrg(ctx, org, nil); err != nil {
		t.Errorf("read_builds lists builds: %v", err)
	}
	_, _, err := reader.ClusterTokens.Create(ctx, org, w.cluster.ID, buildkite.ClusterTokenCreateUpdate{Description: "x"})
	if statusOf(err) != http.StatusForbidden || !strings.Contains(err.Error(), "write_clusters") {
		t.Errorf("create a token without write_clusters: %v, want 403 naming the scope", err)
	}
	if _, _, err := restClient(t, w, "nobody").Agents.List(ctx, org, nil); statusOf(err) != http.StatusUnauthorized {
		t.Errorf("unknown token: %v, want 401", err)
	}

	writer := restClient(t, w, "writer")
	w.sim.InjectFault(Fault{Method: "POST", PathPrefix: "/v2/organizations/" + org + "/clusters/", Status: http.StatusBadGateway, Count: 1})
	if _, _, err := writer.ClusterTokens.Create(ctx, org, w.cluster.ID, buildkite.ClusterTokenCreateUpdate{Description: "x"}); statusOf(err) != http.StatusBadGateway {
		t.Errorf("injected fault: %v, want 502", err)
	}
	// Requests so far: two of the reader's (the unknown token's is not the
	// organization's), the fault; this is the fourth, then the fifth.
	if _, resp, err := writer.ClusterTokens.Create(ctx, org, w.cluster.ID, buildkite.ClusterTokenCreateUpdate{Description: "x"}); err != nil || resp.Header.Get("RateLimit-Remaining") != "1" {
		t.Fatalf("fourth request: %v, headers %v", err, resp.Header)
	}
	_, resp, err := writer.ClusterTokens.Create(ctx, org, w.cluster.ID, buildkite.ClusterTokenCreateUpdate{Description: "x"})
	if err != nil || resp.Header.Get("RateLimit-Remaining") != "0" || resp.Header.Get("RateLimit-Limit") != "5" || resp.Header.Get("RateLimit-Reset") == "" {
		t.Fatalf("fifth request: %v, headers %v", err, resp.Header)
	}
	// POST, not GET: go-buildkite retries a GET's 429 with backoff.
	_, _, err = writer.ClusterTokens.Create(ctx, org, w.cluster.ID, buildkite.ClusterTokenCreateUpdate{Description: "x"})
	if statusOf(err) != http.StatusTooManyRequests {
		t.Errorf("sixth request in the minute: %v, want 429", err)
	}
	if w.sim.InjectedFaults() != 1 {
		t.Errorf("injected faults: %d, want 1", w.sim.InjectedFaults())
	}
}

// TestClusterTokenExpiry: a token created with expires_at (the REST API's
// field; go-buildkite v4.23 does not send it) stops registering agents
// when it expires, on the simulator's clock.
func TestClusterTokenExpiry(t *testing.T) {
	w := newWorld(t, Config{APITokens: []APIToken{{Token: "admin", Scopes: allScopes}}})
	clock := newTestClock()
	w.sim.clock = clock
	body := `{"description":"short","expires_at":"` + clock.Now().Add(time.Hour).Format(time.RFC3339) + `"}`
	req, _ := http.NewRequest("POST", w.srv.URL+"/v2/organizations/"+w.sim.cfg.Organization+"/clusters/"+w.cluster.ID+"/tokens", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer admin")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var tok buildkite.ClusterToken
	_ = json.NewDecoder(resp.Body).Decode(&tok)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || tok.Token == "" {
		t.Fatalf("create: %d %+v", resp.StatusCode, tok)
	}
	if code, _ := agentCall(t, w, "POST", "register", tok.Token, map[string]any{"name": "a"}); code != http.StatusOK {
		t.Fatalf("register before expiry: %d", code)
	}
	clock.Advance(time.Hour)
	if code, _ := agentCall(t, w, "POST", "register", tok.Token, map[string]any{"name": "b"}); code != http.StatusUnauthorized {
		t.Errorf("register at expiry: %d, want 401", code)
	}
}
