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
