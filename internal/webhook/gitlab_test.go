package webhook

import (
	"context"
	"crypto/tls"
	"net/http"
	"strconv"
	"testing"
	"time"

	gitlabsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/gitlab"
	"github.com/hyperfleet/hyperfleet/pkg/workload/gitlab"
)

// TestGitLabReceiverWithSimulatorDeliveries: the GitLab simulator delivers
// a job's Job Hook events to the receiver at GitLab's path, over HTTPS,
// from a group hook with the group's own token and a project hook below
// it with the same token. Each event is recorded once (the two hooks'
// deliveries share X-Gitlab-Event-UUID), owner-signed; a hook with a wrong
// token is refused with 401.
func TestGitLabReceiverWithSimulatorDeliveries(t *testing.T) {
	certFile, keyFile, pool := writeCert(t, t.TempDir())
	rec := newFakeRecorder()
	parser := (&gitlab.Backend{}).WebhookParser(nil, map[string][]byte{gitlab.OwnerKey("acme/platform"): []byte("group-token")})
	r, err := NewReceiver(Options{Format: gitlab.WebhookFormat, Parser: parser, Router: routeTo("ci", "gitlab"), Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(ServerOptions{Addr: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, Receivers: []*Receiver{r}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	}()
	<-srv.Ready()
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	sim, err := gitlabsim.New(gitlabsim.Config{
		Projects: []gitlabsim.ProjectConfig{{Path: "acme/platform/app"}, {Path: "acme/web"}},
		Users:    []gitlabsim.UserConfig{{Username: "dev", Members: map[string]int{"acme": gitlabsim.Developer}}},
	}, gitlabsim.WithWebhookClient(hc))
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	url := "https://" + srv.Addr().String() + gitlab.WebhookFormat.Path
	for _, h := range []gitlabsim.HookConfig{
		{URL: url, Token: "group-token", Group: "acme/platform"},
		{URL: url, Token: "group-token", Project: "acme/platform/app"},
		{URL: url, Token: "wrong-token", Project: "acme/web"},
	} {
		if _, err := sim.AddHook(h); err != nil {
			t.Fatal(err)
		}
	}
	pl, err := sim.CreatePipeline(gitlabsim.PipelineRequest{Project: "acme/platform/app", Jobs: []gitlabsim.JobConfig{{Name: "build", Script: []string{"true"}, Tags: []string{"linux"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sim.CreatePipeline(gitlabsim.PipelineRequest{Project: "acme/web", Jobs: []gitlabsim.JobConfig{{Name: "web", Script: []string{"true"}}}}); err != nil {
		t.Fatal(err)
	}
	if err := sim.CancelJob(pl.Jobs[0]); err != nil {
		t.Fatal(err)
	}
	fctx, fcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer fcancel()
	if err := sim.FlushWebhooks(fctx); err != nil {
		t.Fatal(err)
	}
	var actions []string
	for range 2 { // pending, canceled; created is not demand yet
		got := rec.wait(t)
		if got.ev.Job.ID != strconv.FormatInt(pl.Jobs[0], 10) || got.ev.Job.Repository != "acme/platform/app" || !got.ev.OwnerSigned || got.pool.Name != "gitlab" {
			t.Fatalf("recorded %+v", got)
		}
		actions = append(actions, got.ev.Action)
	}
	if actions[0] != "pending" || actions[1] != "canceled" {
		t.Fatalf("recorded actions %v, want pending, canceled", actions)
	}
	time.Sleep(100 * time.Millisecond)
	if n := rec.count(); n != 2 {
		t.Fatalf("recorded %d events; want 2 (each event once, whichever hook delivered it)", n)
	}
	// Two hooks deliver each of the app's three events: one of each pending
	// and canceled pair is accepted, the other answered 200 as a duplicate,
	// both created ones 200 as ignored; acme/web's hook is refused.
	codes := map[int]int{}
	for _, d := range sim.Deliveries() {
		codes[d.Response]++
	}
	if codes[http.StatusAccepted] != 2 || codes[http.StatusOK] != 4 || codes[http.StatusUnauthorized] == 0 || len(codes) != 3 {
		t.Fatalf("delivery answers by status %v; want 2 accepted, 4 OK, the wrong token's 401", codes)
	}
}
