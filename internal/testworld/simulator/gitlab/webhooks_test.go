package gitlabsim

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	gitlab "gitlab.com/gitlab-org/api/client-go"
)

// received is one webhook request as a receiver saw it.
type received struct {
	header http.Header
	event  *gitlab.JobEvent
}

// TestJobHooks runs a job and checks the Job Hook deliveries of a project
// hook and of a hook on an ancestor group: GitLab's headers (the secret
// token, the event and webhook UUIDs, the instance), one delivery per
// state change in order, and payloads that client-go's webhook parser
// reads as JobEvents.
func TestJobHooks(t *testing.T) {
	var mu sync.Mutex
	got := map[string][]received{}
	receiver := func(name string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				t.Error(err)
				return
			}
			ev, err := gitlab.ParseWebhook(gitlab.HookEventType(r), body)
			if err != nil {
				t.Errorf("%s: client-go cannot parse the delivery: %v", name, err)
				return
			}
			je, ok := ev.(*gitlab.JobEvent)
			if !ok {
				t.Errorf("%s: parsed as %T, want *gitlab.JobEvent", name, ev)
				return
			}
			mu.Lock()
			got[name] = append(got[name], received{header: r.Header.Clone(), event: je})
			mu.Unlock()
		}))
	}
	projSrv, groupSrv, otherSrv := receiver("project"), receiver("group"), receiver("other")
	defer projSrv.Close()
	defer groupSrv.Close()
	defer otherSrv.Close()

	cfg := testConfig()
	cfg.URL = "https://gitlab.example.com"
	sim, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sim)
	defer func() { srv.Close(); sim.Close() }()
	w := &world{sim: sim, srv: srv}
	projHook, err := sim.AddHook(HookConfig{URL: projSrv.URL, Token: "s3cret", Project: "acme/platform/app"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sim.AddHook(HookConfig{URL: groupSrv.URL, Token: "group-secret", Group: "acme"}); err != nil {
		t.Fatal(err)
	}
	if _, err := sim.AddHook(HookConfig{URL: otherSrv.URL, Token: "x", Project: "acme/web"}); err != nil {
		t.Fatal(err)
	}

	r := w.createRunner(t, maintPAT, &gitlab.CreateUserRunnerOptions{RunnerType: ptr(ProjectType), ProjectID: ptr(w.projectID(t, "acme/platform/app")), TagList: ptr([]string{"hyperfleet"})})
	pl, err := sim.CreatePipeline(PipelineRequest{Project: "acme/platform/app", Jobs: []JobConfig{{Name: "build", Tags: []string{"hyperfleet"}, Script: []string{"true"}}}})
	if err != nil {
		t.Fatal(err)
	}
	status, _, body := w.call(t, "POST", "/api/v4/jobs/request", nil, glrJobRequest{Token: r.Token})
	if status != 201 {
		t.Fatalf("request: %d %s", status, body)
	}
	id := strconv.FormatInt(pl.Jobs[0], 10)
	tok := regexp.MustCompile(`"token":"(glcbt-[0-9a-f]+)"`).FindSubmatch(body)
	if st, _, _ := w.call(t, "PUT", "/api/v4/jobs/"+id, nil, glrUpdateJobRequest{Token: string(tok[1]), State: "success"}); st != 200 {
		t.Fatalf("finish: %d", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := sim.FlushWebhooks(ctx); err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	defer mu.Unlock()
	uuidRE := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	var hookUUID string
	for name, secret := range map[string]string{"project": "s3cret", "group": "group-secret"} {
		var states []string
		for _, d := range got[name] {
			h := d.header
			if h.Get("X-Gitlab-Event") != "Job Hook" || h.Get("X-Gitlab-Token") != secret || h.Get("X-Gitlab-Instance") != "https://gitlab.example.com" ||
				!uuidRE.MatchString(h.Get("X-Gitlab-Event-UUID")) || !uuidRE.MatchString(h.Get("X-Gitlab-Webhook-UUID")) || h.Get("Content-Type") != "application/json" {
				t.Errorf("%s hook headers: %v", name, h)
			}
			if name == "project" {
				if hookUUID == "" {
					hookUUID = h.Get("X-Gitlab-Webhook-UUID")
				} else if hookUUID != h.Get("X-Gitlab-Webhook-UUID") {
					t.Errorf("one hook, two webhook UUIDs: %s and %s", hookUUID, h.Get("X-Gitlab-Webhook-UUID"))
				}
			}
			e := d.event
			if e.ObjectKind != "build" || e.BuildID != pl.Jobs[0] || e.PipelineID != pl.ID || e.ProjectID != w.projectID(t, "acme/platform/app") || e.BuildName != "build" || e.Ref != "main" {
				t.Errorf("%s payload: %+v", name, e)
			}
			if e.BuildStatus == StatusRunning && (e.Runner.ID != r.ID || !slices.Equal(e.Runner.Tags, []string{"hyperfleet"}) || e.BuildStartedAt == "") {
				t.Errorf("running payload's runner: %+v", e.Runner)
			}
			states = append(states, e.BuildStatus)
		}
		if want := []string{"created", "pending", "running", "success"}; !slices.Equal(states, want) {
			t.Errorf("%s hook got states %v, want %v", name, states, want)
		}
	}
	if len(got["other"]) != 0 {
		t.Errorf("a hook of another project got %d deliveries", len(got["other"]))
	}
	n := 0
	for _, d := range sim.Deliveries() {
		if d.HookID == projHook && d.Response == 200 {
			n++
		}
	}
	if n != 4 {
		t.Errorf("delivery log: %d successful deliveries to the project hook, want 4", n)
	}
}
