package buildkitesim

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/simclock"
)

// TestStacksAPI: registering a stack (201, then 200; a reserved type, an
// unknown queue refused), reserving (another stack cannot take a reserved
// job), issuing job tokens (lifetime bounded by an hour and by the
// reservation), and a job token that expires on its own while the agent
// token that issued it lives on.
func TestStacksAPI(t *testing.T) {
	clk := simclock.NewFakeClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	sim := New(Config{}, WithClock(clk))
	t.Cleanup(sim.Close)
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	c := sim.CreateCluster("hyperfleet")
	if _, err := sim.CreateQueue(c.ID, "linux"); err != nil {
		t.Fatal(err)
	}
	tok, err := sim.CreateToken(c.ID, "stack", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.CreatePipeline("app", c.ID); err != nil {
		t.Fatal(err)
	}
	w := &world{sim: sim, srv: srv, cluster: c, token: tok, pipeline: "app"}
	call := func(method, path string, body any) (int, map[string]any) {
		return agentCall(t, w, method, path, tok.Secret, body)
	}

	reg := map[string]any{"key": "s1", "type": "custom", "queue_key": "linux", "metadata": map[string]string{"v": "1"}}
	if code, out := call(http.MethodPost, "stacks/register", reg); code != http.StatusCreated || out["cluster_queue_key"] != "linux" {
		t.Fatalf("register: %d %v", code, out)
	}
	if code, _ := call(http.MethodPost, "stacks/register", reg); code != http.StatusOK {
		t.Fatalf("register again: %d, want 200", code)
	}
	for name, body := range map[string]map[string]any{
		"a reserved type":  {"key": "s2", "type": "kubernetes", "queue_key": "linux"},
		"an unknown queue": {"key": "s2", "type": "custom", "queue_key": "gpu"},
	} {
		if code, _ := call(http.MethodPost, "stacks/register", body); code != http.StatusUnprocessableEntity {
			t.Errorf("register with %s: %d, want 422", name, code)
		}
	}
	if code, _ := call(http.MethodPost, "stacks/register", map[string]any{"key": "s2", "type": "custom", "queue_key": "linux"}); code != http.StatusCreated {
		t.Fatalf("register s2: %d", code)
	}
	if code, _ := agentCall(t, w, http.MethodPost, "stacks/register", "bogus", reg); code != http.StatusUnauthorized {
		t.Errorf("register with an unknown token: %d, want 401", code)
	}

	b, err := sim.CreateBuild("app", "m", []Step{{Command: "true", Agents: []string{"queue=linux"}}})
	if err != nil {
		t.Fatal(err)
	}
	job := b.JobIDs[0]
	if code, out := call(http.MethodPut, "stacks/s1/scheduled-jobs/batch-reserve", map[string]any{"job_uuids": []string{job, "nope"}, "reservation_expiry_seconds": 600}); code != http.StatusOK ||
		len(out["reserved"].([]any)) != 1 || len(out["not_reserved"].([]any)) != 1 {
		t.Fatalf("reserve: %d %v", code, out)
	}
	if _, out := call(http.MethodPut, "stacks/s2/scheduled-jobs/batch-reserve", map[string]any{"job_uuids": []string{job}}); len(out["reserved"].([]any)) != 0 {
		t.Fatalf("another stack reserved a reserved job: %v", out)
	}
	if code, _ := call(http.MethodPost, "stacks/s1/job-acquisition-tokens", map[string]any{"job_uuids": []string{job}, "token_lifetime_seconds": 3601}); code != http.StatusUnprocessableEntity {
		t.Errorf("a token for more than an hour: %d, want 422", code)
	}
	if _, out := call(http.MethodPost, "stacks/s2/job-acquisition-tokens", map[string]any{"job_uuids": []string{job}}); len(out["not_issued"].([]any)) != 1 {
		t.Errorf("a token for another stack's reservation: %v", out)
	}
	code, out := call(http.MethodPost, "stacks/s1/job-acquisition-tokens", map[string]any{"job_uuids": []string{job}, "token_lifetime_seconds": 3600})
	toks, _ := out["job_acquisition_tokens"].([]any)
	if code != http.StatusCreated || len(toks) != 1 {
		t.Fatalf("issue: %d %v", code, out)
	}
	jt := toks[0].(map[string]any)
	secret, _ := jt["job_acquisition_token"].(string)
	expires, _ := time.Parse(time.RFC3339, jt["expires_at"].(string))
	if !strings.HasPrefix(secret, "bkjat_") || !expires.Equal(clk.Now().Add(600*time.Second)) {
		t.Fatalf("token %v: want bkjat_ and the reservation's end (10 min), not the hour asked", jt)
	}
	clk.Advance(601 * time.Second)
	if code, _ := agentCall(t, w, http.MethodPost, "register", secret, map[string]any{"name": "late", "meta_data": []string{"queue=linux"}}); code != http.StatusUnauthorized {
		t.Errorf("register with an expired job token (its issuer alive): %d, want 401", code)
	}
}

// TestJobTokensServeTheirJobOnly: a job acquisition token is no Stacks API
// credential (register, reserve, issue: 401 for all, whatever stack it
// names), registers one agent, and that agent acquires its job and no
// other. The job's own access token, which the agent receives with the job
// and hands the job, acts on that job's calls alone (state, start, chunks,
// header times, finish) and only until it finishes: it pings for no work,
// acquires and accepts nothing, registers no agent and calls no Stacks API.
func TestJobTokensServeTheirJobOnly(t *testing.T) {
	w := newWorld(t, Config{})
	if _, err := w.sim.CreateQueue(w.cluster.ID, "linux"); err != nil {
		t.Fatal(err)
	}
	b, err := w.sim.CreateBuild("app", "m", []Step{
		{Key: "mine", Command: "true", Agents: []string{"queue=linux"}},
		{Key: "other", Command: "true", Agents: []string{"queue=linux"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	mine, other := b.JobIDs[0], b.JobIDs[1]
	jat, err := w.sim.IssueJobToken(w.token.Secret, "linux", mine, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	stacks := []struct {
		method, path string
		body         map[string]any
	}{
		{http.MethodPost, "stacks/register", map[string]any{"key": "thief", "type": "custom", "queue_key": "linux"}},
		{http.MethodPut, "stacks/sim-linux/scheduled-jobs/batch-reserve", map[string]any{"job_uuids": []string{other}}},
		{http.MethodPost, "stacks/sim-linux/job-acquisition-tokens", map[string]any{"job_uuids": []string{other}}},
		{http.MethodPost, "stacks/sim-linux/deregister", map[string]any{}},
	}
	for _, c := range stacks {
		if code, _ := agentCall(t, w, c.method, c.path, jat, c.body); code != http.StatusUnauthorized {
			t.Errorf("%s %s with a job token: %d, want 401", c.method, c.path, code)
		}
	}
	code, out := agentCall(t, w, http.MethodPost, "register", jat, map[string]any{"name": "vm", "meta_data": []string{"queue=linux"}})
	access, _ := out["access_token"].(string)
	if code != http.StatusOK || access == "" {
		t.Fatalf("register with the job token: %d %v", code, out)
	}
	if code, _ := agentCall(t, w, http.MethodPost, "register", jat, map[string]any{"name": "vm-2", "meta_data": []string{"queue=linux"}}); code != http.StatusUnauthorized {
		t.Errorf("a second agent with the job token: %d, want 401", code)
	}
	if code, _ := agentCall(t, w, http.MethodPut, "jobs/"+other+"/acquire", access, nil); code != http.StatusUnprocessableEntity {
		t.Errorf("its agent acquires another job: %d, want 422", code)
	}
	code, out = agentCall(t, w, http.MethodPut, "jobs/"+mine+"/acquire", access, nil)
	jobToken, _ := out["token"].(string)
	if code != http.StatusOK || jobToken == "" || jobToken == access {
		t.Fatalf("acquire its job: %d %v; want the job with a token of its own", code, out)
	}
	if info, _ := w.sim.Job(mine); info.AccessToken != jobToken {
		t.Fatalf("the job's token %q is not the one handed out", info.AccessToken)
	}
	// The job's token: its own calls only.
	if code, _ := agentCall(t, w, http.MethodGet, "jobs/"+mine, jobToken, nil); code != http.StatusOK {
		t.Errorf("the job reads its state: %d", code)
	}
	if code, _ := agentCall(t, w, http.MethodPut, "jobs/"+mine+"/start", jobToken, map[string]any{"started_at": time.Now().UTC().Format(time.RFC3339)}); code != http.StatusOK {
		t.Errorf("the job starts with its token: %d", code)
	}
	for _, c := range append(stacks, []struct {
		method, path string
		body         map[string]any
	}{
		{http.MethodGet, "ping", nil},
		{http.MethodPost, "heartbeat", map[string]any{}},
		{http.MethodPost, "register", map[string]any{"name": "thief", "meta_data": []string{"queue=linux"}}},
		{http.MethodPut, "jobs/" + other + "/acquire", nil},
		{http.MethodPut, "jobs/" + mine + "/acquire", nil},
		{http.MethodGet, "jobs/" + other, nil},
		{http.MethodPut, "jobs/" + other + "/finish", map[string]any{"exit_status": "0"}},
	}...) {
		if code, _ := agentCall(t, w, c.method, c.path, jobToken, c.body); code != http.StatusUnauthorized {
			t.Errorf("%s %s with the job's own token: %d, want 401", c.method, c.path, code)
		}
	}
	if code, _ := agentCall(t, w, http.MethodPut, "jobs/"+mine+"/finish", jobToken, map[string]any{"exit_status": "0"}); code != http.StatusOK {
		t.Errorf("the job finishes with its token: %d", code)
	}
	if code, _ := agentCall(t, w, http.MethodGet, "jobs/"+mine, jobToken, nil); code != http.StatusUnauthorized {
		t.Errorf("the finished job's token still reads it: %d, want 401", code)
	}
	if info, _ := w.sim.Job(other); info.State != stateScheduled || info.Agent != "" {
		t.Errorf("the other job after the attempts: %+v", info)
	}
}
