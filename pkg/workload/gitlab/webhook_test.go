package gitlab_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	gitlabsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/gitlab"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	glworkload "github.com/hyperfleet/hyperfleet/pkg/workload/gitlab"
)

// delivery is one webhook delivery as the receiver got it.
type delivery struct {
	header http.Header
	body   []byte
}

// hookSink records the simulator's deliveries.
type hookSink struct {
	mu  sync.Mutex
	got []delivery
	srv *httptest.Server
}

func newHookSink(t *testing.T) *hookSink {
	t.Helper()
	s := &hookSink{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		s.mu.Lock()
		s.got = append(s.got, delivery{r.Header.Clone(), body})
		s.mu.Unlock()
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *hookSink) deliveries() []delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]delivery(nil), s.got...)
}

// TestWebhookParserWithSimulatorDeliveries parses the Job Hook deliveries
// the simulator sends for a job's life (a group hook with its own token,
// and a project hook with the shared one) and checks what the receiver
// learns, and what it refuses.
func TestWebhookParserWithSimulatorDeliveries(t *testing.T) {
	w := newWorld(t, nil)
	ctx := context.Background()
	groupSink, projectSink := newHookSink(t), newHookSink(t)
	if _, err := w.sim.AddHook(gitlabsim.HookConfig{URL: groupSink.srv.URL, Token: "group-token", Group: "acme/platform"}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.sim.AddHook(gitlabsim.HookConfig{URL: projectSink.srv.URL, Token: "shared-token", Project: "acme/web"}); err != nil {
		t.Fatal(err)
	}
	pl, err := w.sim.CreatePipeline(gitlabsim.PipelineRequest{Project: "acme/platform/ci/tools", Jobs: []gitlabsim.JobConfig{{Name: "build", Script: []string{"true"}, Tags: []string{"linux"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.sim.CreatePipeline(gitlabsim.PipelineRequest{Project: "acme/web", Jobs: []gitlabsim.JobConfig{{Name: "web", Script: []string{"true"}}}}); err != nil {
		t.Fatal(err)
	}
	p := w.provider(t, ownerPAT, glworkload.ScopeOf("", "acme/platform", false))
	cred, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: "hf-hook", Labels: []string{"linux"}})
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := w.runnerCall(t, "/jobs/request", map[string]any{"token": cred.Secret.Reveal(), "system_id": "s_0123456789ab"}); code != http.StatusCreated {
		t.Fatalf("job request: %d", code)
	}
	if err := w.sim.CancelJob(pl.Jobs[0]); err != nil {
		t.Fatal(err)
	}
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := w.sim.FlushWebhooks(fctx); err != nil {
		t.Fatal(err)
	}
	parser := (&glworkload.Backend{}).WebhookParser([]byte("shared-token"), map[string][]byte{glworkload.OwnerKey("acme/platform"): []byte("group-token")})

	var actions []string
	for _, d := range groupSink.deliveries() {
		ev, err := parser.Parse(d.header, d.body)
		if errors.Is(err, workload.ErrIgnoredEvent) {
			// created: the job does not wait for a runner yet.
			actions = append(actions, "ignored")
			continue
		}
		if err != nil {
			t.Fatalf("parse a group hook delivery: %v", err)
		}
		if ev.DeliveryID == "" || ev.DeliveryID != d.header.Get(glworkload.WebhookFormat.DeliveryHeader) || !ev.OwnerSigned {
			t.Fatalf("event: %+v", ev)
		}
		j := ev.Job
		if j.ID != strconv.FormatInt(pl.Jobs[0], 10) || j.Platform != hfv1.WorkloadGitLabCI || j.RunID != pl.ID || j.Repository != "acme/platform/ci/tools" || j.Name != "build" || j.CreatedAt.IsZero() || len(j.Labels) != 0 || !j.LabelsUnknown {
			t.Fatalf("job of the event: %+v", j)
		}
		switch ev.Action {
		case "running":
			if j.State != workload.JobInProgress || j.RunnerID != cred.RunnerID || j.RunnerName != "hf-hook" || j.StartedAt.IsZero() {
				t.Fatalf("running event: %+v", j)
			}
		case "canceled":
			if j.State != workload.JobCompleted || j.Conclusion != "canceled" || j.CompletedAt.IsZero() {
				t.Fatalf("canceled event: %+v", j)
			}
		}
		actions = append(actions, ev.Action)
	}
	if want := []string{"ignored", "pending", "running", "canceled"}; !slices.Equal(actions, want) {
		t.Fatalf("group hook events %v, want %v", actions, want)
	}

	d := groupSink.deliveries()[1]
	// The group's job events do not verify with the shared token, nor with
	// another group's own.
	forged := d.header.Clone()
	forged.Set(glworkload.WebhookTokenHeader, "shared-token")
	if _, err := parser.Parse(forged, d.body); !errors.Is(err, workload.ErrBadSignature) {
		t.Fatalf("a group's event with the shared token: %v, want ErrBadSignature", err)
	}
	forged.Del(glworkload.WebhookTokenHeader)
	if _, err := parser.Parse(forged, d.body); !errors.Is(err, workload.ErrBadSignature) {
		t.Fatalf("no token: %v, want ErrBadSignature", err)
	}
	other := (&glworkload.Backend{}).WebhookParser(nil, map[string][]byte{glworkload.OwnerKey("acme/web"): []byte("group-token")})
	if _, err := other.Parse(d.header, d.body); !errors.Is(err, workload.ErrBadSignature) {
		t.Fatalf("another owner's token: %v, want ErrBadSignature", err)
	}
	// An ancestor group's own token verifies too: its holder administers
	// every project below.
	top := (&glworkload.Backend{}).WebhookParser(nil, map[string][]byte{glworkload.OwnerKey("ACME"): []byte("group-token")})
	if ev, err := top.Parse(d.header, d.body); err != nil || !ev.OwnerSigned {
		t.Fatalf("an ancestor group's token: %v %+v", err, ev)
	}
	// A project under no group with its own token: the shared token, not
	// owner-signed.
	pd := projectSink.deliveries()
	if len(pd) < 2 {
		t.Fatalf("the project hook got %d deliveries, want created and pending", len(pd))
	}
	ev, err := parser.Parse(pd[1].header, pd[1].body) // pending
	if err != nil || ev.OwnerSigned || ev.Job.Repository != "acme/web" {
		t.Fatalf("a shared-token delivery: %v %+v", err, ev)
	}
	// Another event kind, validly signed, is ignored; a broken body is
	// malformed.
	push := pd[0].header.Clone()
	push.Set(glworkload.WebhookEventHeader, "Push Hook")
	if _, err := parser.Parse(push, pd[0].body); !errors.Is(err, workload.ErrIgnoredEvent) {
		t.Fatalf("a Push Hook: %v, want ErrIgnoredEvent", err)
	}
	if _, err := parser.Parse(pd[0].header, []byte(`{"object_kind":`)); !errors.Is(err, workload.ErrMalformed) {
		t.Fatalf("a broken body: %v, want ErrMalformed", err)
	}
}
