package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	bksim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite"
)

// TestBuildkiteDeliveriesThroughTheReceiver: the Buildkite simulator's own
// job webhooks, signed as Buildkite signs them, go through the receiver
// with Buildkite's format and parser (no delivery id header: the id comes
// from the verified body) and are recorded in order; a service with
// another secret is answered 401 and records nothing.
func TestBuildkiteDeliveriesThroughTheReceiver(t *testing.T) {
	rec := newFakeRecorder()
	be, err := buildkite.NewBackend(workload.Dependencies{})
	if err != nil {
		t.Fatal(err)
	}
	wr := be.(workload.WebhookReceiver)
	r, err := NewReceiver(Options{Format: wr.WebhookFormat(), Parser: wr.WebhookParser(nil, map[string][]byte{"acme": []byte("s3cret")}),
		Router: routeTo("ci", "linux"), Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	hook := httptest.NewServer(r)
	defer hook.Close()
	sim := bksim.New(bksim.Config{APITokens: []bksim.APIToken{{Token: "api", Scopes: bksim.Scopes()}}})
	defer sim.Close()
	srv := httptest.NewServer(sim)
	defer srv.Close()
	url := hook.URL + buildkite.WebhookFormat.Path
	sim.AddWebhook(bksim.Webhook{URL: url, Token: "s3cret", Signed: true})
	sim.AddWebhook(bksim.Webhook{URL: url, Token: "other", Signed: true, Events: []string{"job.scheduled"}})
	c := sim.CreateCluster("linux")
	if err := sim.CreatePipeline("app", c.ID); err != nil {
		t.Fatal(err)
	}
	tok, err := sim.CreateToken(c.ID, "t", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	call := func(method, path, token string, body any) map[string]any {
		t.Helper()
		raw, _ := json.Marshal(body)
		req, _ := http.NewRequest(method, srv.URL+"/v3/"+path, bytes.NewReader(raw))
		req.Header.Set("Authorization", "Token "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out := map[string]any{}
		_ = json.NewDecoder(resp.Body).Decode(&out)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s: %d %v", method, path, resp.StatusCode, out)
		}
		return out
	}
	access, _ := call(http.MethodPost, "register", tok.Secret, map[string]any{"name": "vm-1", "meta_data": []string{"queue=default"}})["access_token"].(string)
	call(http.MethodPost, "connect", access, map[string]any{})
	b, err := sim.CreateBuild("app", "go", []bksim.Step{{Command: "true"}})
	if err != nil {
		t.Fatal(err)
	}
	id := b.JobIDs[0]
	call(http.MethodGet, "ping", access, nil)
	call(http.MethodPut, "jobs/"+id+"/accept", access, nil)
	call(http.MethodPut, "jobs/"+id+"/start", access, map[string]any{"started_at": time.Now().UTC().Format(time.RFC3339)})
	call(http.MethodPut, "jobs/"+id+"/finish", access, map[string]any{"exit_status": "0"})
	want := []workload.JobState{workload.JobQueued, workload.JobInProgress, workload.JobCompleted}
	for i, st := range want {
		select {
		case got := <-rec.ch:
			if got.ev.Job.ID != id || got.ev.Job.State != st || got.ev.DeliveryID == "" || !got.ev.OwnerSigned || got.pool.Name != "linux" {
				t.Fatalf("record %d = %+v", i, got)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("record %d never came; deliveries %+v", i, sim.Deliveries())
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var refused, accepted int
		for _, d := range sim.Deliveries() {
			switch d.Status {
			case http.StatusUnauthorized:
				refused++
			case http.StatusOK, http.StatusAccepted, http.StatusNoContent:
				accepted++
			}
		}
		if refused == 1 && accepted == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("deliveries = %+v; want 3 accepted and the other secret's one refused with 401", sim.Deliveries())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := rec.count(); n != 3 {
		t.Fatalf("%d records; want 3", n)
	}
}
