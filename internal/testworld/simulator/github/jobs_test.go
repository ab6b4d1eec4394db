package githubsim

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

func enqueue(t *testing.T, f *fixture, repo string, d time.Duration, labels ...string) Job {
	t.Helper()
	j, err := f.sim.EnqueueJob(JobRequest{Repository: repo, Labels: labels, Duration: d})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func TestJobsGoOnlyToCoveringIdleRunnersInScope(t *testing.T) {
	// The Go runners do not heartbeat while the clock jumps.
	f := newFixture(t, func(c *Config) { c.HeartbeatTimeout = Duration(time.Hour) })
	repoRunner := f.jitRunner("/repos/octo-org/app", "repo-linux", "self-hosted", "Linux")
	orgRunner := f.jitRunner("/orgs/octo-org", "org-gpu", "self-hosted", "Linux", "GPU")
	otherRepo := f.jitRunner("/repos/octo-org/other", "other-linux", "self-hosted", "linux", "gpu")
	userRunner := f.jitRunner("/repos/octocat/personal", "user-linux", "self-hosted", "linux", "gpu")

	// A job queued before any runner is online waits.
	gpu := enqueue(t, f, "octo-org/app", time.Minute, "self-hosted", "gpu")
	for _, r := range []*goRunner{repoRunner, orgRunner, otherRepo, userRunner} {
		r.connect()
	}
	// gpu: only the organization runner covers it (case-insensitively);
	// the other repository's and the user repository's runners are out of
	// scope.
	if id, code := orgRunner.poll(); code != 200 || id != gpu.ID {
		t.Fatalf("org runner poll = %d %d", id, code)
	}
	linux := enqueue(t, f, "octo-org/app", time.Minute, "LINUX")
	if id, code := repoRunner.poll(); code != 200 || id != linux.ID {
		t.Fatalf("repo runner poll = %d %d", id, code)
	}
	windows := enqueue(t, f, "octo-org/app", time.Minute, "windows")
	for _, r := range []*goRunner{otherRepo, userRunner} {
		if id, code := r.poll(); code != 204 {
			t.Errorf("runner %d got job %d (%d)", r.id, id, code)
		}
	}
	// A busy runner never gets a second job.
	second := enqueue(t, f, "octo-org/app", time.Minute, "gpu")
	if got, _ := f.sim.Job(second.ID); got.Status != "queued" {
		t.Errorf("second gpu job = %+v", got)
	}
	if id, _ := orgRunner.poll(); id != gpu.ID {
		t.Errorf("busy org runner now offers job %d", id)
	}
	got, _ := f.sim.Job(gpu.ID)
	if got.Status != "in_progress" || got.RunnerName != "org-gpu" || got.RunnerGroupName != "Default" {
		t.Errorf("gpu job = %+v", got)
	}
	f.clock.Advance(time.Minute)
	for _, id := range []int64{gpu.ID, linux.ID} {
		if got, _ := f.sim.Job(id); got.Status != "completed" || got.Conclusion != "success" {
			t.Errorf("job %d = %+v", id, got)
		}
	}
	if got, _ := f.sim.Job(windows.ID); got.Status != "queued" {
		t.Errorf("windows job = %+v", got)
	}
	// Both JIT runners ran their one job and are gone; the second gpu job
	// waits for a new runner.
	if _, ok := f.sim.RunnerByName("org-gpu"); ok {
		t.Error("ephemeral runner org-gpu still registered")
	}
	if _, code := orgRunner.poll(); code != 404 {
		t.Errorf("removed runner poll = %d", code)
	}
	if got, _ := f.sim.Job(second.ID); got.Status != "queued" {
		t.Errorf("second job = %+v", got)
	}
	f.flush()
	if a := actions(f.hooks.forJob(t, gpu.ID)); a != "queued,in_progress,completed" {
		t.Errorf("gpu job webhooks = %s", a)
	}
	if a := actions(f.hooks.forJob(t, windows.ID)); a != "queued" {
		t.Errorf("windows job webhooks = %s", a)
	}
	hs := f.hooks.forJob(t, gpu.ID)
	if hs[1].runner != "org-gpu" || hs[2].runner != "org-gpu" || hs[0].runner != "" {
		t.Errorf("runner names in webhooks = %q %q %q", hs[0].runner, hs[1].runner, hs[2].runner)
	}
}

func TestNonEphemeralRunnerTakesJobsOneAtATime(t *testing.T) {
	f := newFixture(t)
	tok := f.mustCall("POST", "/orgs/octo-org/actions/runners/registration-token", testPAT, nil, 201)["token"].(string)
	form := url.Values{"url": {"https://github.example/octo-org"}, "name": {"persistent"}, "labels": {"big"}, "runnergroup": {"hyperfleet"}, "os": {"Linux"}, "arch": {"x86_64"}}
	req, _ := http.NewRequest("POST", f.srv.URL+"/_runner/register", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "RemoteAuth "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 {
		t.Fatalf("register: %d %s", resp.StatusCode, raw)
	}
	enc := regexp.MustCompile(`encoded_config=(\S+)`).FindStringSubmatch(string(raw))[1]
	cfg := decodeConfig(t, enc)
	r := &goRunner{f: f, id: cfg.runnerID, secret: cfg.secret}
	st, _ := f.sim.RunnerByName("persistent")
	if st.Ephemeral || st.GroupName != "hyperfleet" || strings.Join(st.Labels, ",") != "self-hosted,Linux,X64,big" {
		t.Fatalf("registered runner = %+v", st)
	}
	r.connect()
	a := enqueue(t, f, "octo-org/app", 10*time.Second, "big", "x64")
	b := enqueue(t, f, "octo-org/other", 10*time.Second, "big")
	if id, _ := r.poll(); id != a.ID {
		t.Fatalf("first poll = %d", id)
	}
	if got, _ := f.sim.Job(b.ID); got.Status != "queued" {
		t.Fatalf("job b while runner busy = %+v", got)
	}
	f.clock.Advance(10 * time.Second)
	if status, conclusion, _ := r.jobStatus(a.ID); status != "completed" || conclusion != "success" {
		t.Fatalf("job a status = %s %s", status, conclusion)
	}
	if id, _ := r.poll(); id != b.ID {
		t.Fatalf("second poll = %d", id)
	}
	f.clock.Advance(10 * time.Second)
	if st, _ := f.sim.RunnerByName("persistent"); st.JobsRun != 2 || st.Busy || st.Status != "online" {
		t.Errorf("runner after two jobs = %+v", st)
	}
	// Registration errors.
	for name, tc := range map[string]struct {
		form url.Values
		tok  string
		code int
	}{
		"name taken":    {url.Values{"url": {"https://x/octo-org"}, "name": {"persistent"}}, tok, 409},
		"bad token":     {url.Values{"url": {"https://x/octo-org"}, "name": {"n"}}, "nope", 401},
		"wrong scope":   {url.Values{"url": {"https://x/octo-org/app"}, "name": {"n"}}, tok, 403},
		"unknown group": {url.Values{"url": {"https://x/octo-org"}, "name": {"n"}, "runnergroup": {"nope"}}, tok, 400},
		"bad url":       {url.Values{"url": {"octo-org"}, "name": {"n"}}, tok, 400},
		"unknown repo":  {url.Values{"url": {"https://x/octo-org/nope"}, "name": {"n"}}, tok, 404},
	} {
		req, _ := http.NewRequest("POST", f.srv.URL+"/_runner/register", strings.NewReader(tc.form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Authorization", "RemoteAuth "+tc.tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Errorf("%s: %d, want %d", name, resp.StatusCode, tc.code)
		}
	}
	f.clock.Advance(time.Hour)
	req, _ = http.NewRequest("POST", f.srv.URL+"/_runner/register", strings.NewReader(url.Values{"url": {"https://x/octo-org"}, "name": {"late"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "RemoteAuth "+tok)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("expired registration token: %d", resp.StatusCode)
	}
}

func TestCancelRun(t *testing.T) {
	f := newFixture(t)
	r := f.jitRunner("/orgs/octo-org", "c1", "self-hosted")
	r.connect()
	running := enqueue(t, f, "octo-org/app", time.Hour, "self-hosted")
	if id, _ := r.poll(); id != running.ID {
		t.Fatal("runner did not take the job")
	}
	queued := enqueue(t, f, "octo-org/app", time.Hour, "nobody-has-this")
	f.mustCall("POST", "/repos/octo-org/app/actions/runs/"+itoa(running.RunID)+"/cancel", testPAT, nil, 202)
	f.mustCall("POST", "/repos/octo-org/app/actions/runs/"+itoa(queued.RunID)+"/cancel", testPAT, nil, 202)
	for _, id := range []int64{running.ID, queued.ID} {
		if got, _ := f.sim.Job(id); got.Status != "completed" || got.Conclusion != "cancelled" {
			t.Errorf("job %d = %+v", id, got)
		}
	}
	// The runner sees the cancellation and exits; it was ephemeral, so it
	// is gone.
	if status, conclusion, code := r.jobStatus(running.ID); status != "completed" || conclusion != "cancelled" || code != 200 {
		t.Errorf("runner's view = %s %s %d", status, conclusion, code)
	}
	if _, ok := f.sim.RunnerByName("c1"); ok {
		t.Error("runner still registered after its cancelled job")
	}
	f.flush()
	if a := actions(f.hooks.forJob(t, queued.ID)); a != "queued,completed" {
		t.Errorf("queued job webhooks = %s", a)
	}
	var p struct {
		WorkflowJob struct {
			Conclusion string `json:"conclusion"`
		} `json:"workflow_job"`
	}
	hs := f.hooks.forJob(t, running.ID)
	_ = json.Unmarshal(hs[len(hs)-1].body, &p)
	if p.WorkflowJob.Conclusion != "cancelled" || actions(hs) != "queued,in_progress,completed" {
		t.Errorf("running job webhooks = %s, conclusion %s", actions(hs), p.WorkflowJob.Conclusion)
	}
	if err := f.sim.CancelRun(running.RunID); err == nil {
		t.Error("cancelling a completed run succeeded")
	}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

func TestHeartbeatTimeout(t *testing.T) {
	f := newFixture(t)
	idle := f.jitRunner("/orgs/octo-org", "idle", "self-hosted")
	busy := f.jitRunner("/orgs/octo-org", "busy", "self-hosted", "special")
	idle.connect()
	busy.connect()
	job := enqueue(t, f, "octo-org/app", time.Hour, "special")
	if id, _ := busy.poll(); id != job.ID {
		t.Fatal("busy runner did not take the job")
	}
	f.clock.Advance(20 * time.Second)
	busy.jobStatus(job.ID) // heartbeat keeps busy online
	f.clock.Advance(20 * time.Second)
	if st, _ := f.sim.RunnerByName("idle"); st.Status != "offline" {
		t.Errorf("idle runner without heartbeat = %+v", st)
	}
	if st, _ := f.sim.RunnerByName("busy"); st.Status != "online" || !st.Busy {
		t.Errorf("busy runner with heartbeat = %+v", st)
	}
	// The busy runner's process dies: its job fails once the heartbeat lapses.
	f.clock.Advance(31 * time.Second)
	if got, _ := f.sim.Job(job.ID); got.Status != "completed" || got.Conclusion != "failure" {
		t.Errorf("job of dead runner = %+v", got)
	}
	// An offline runner gets no job; its next poll must reconnect.
	next := enqueue(t, f, "octo-org/app", time.Minute, "self-hosted")
	if got, _ := f.sim.Job(next.ID); got.Status != "queued" {
		t.Errorf("job given to offline runner: %+v", got)
	}
	if _, code := idle.poll(); code != 409 {
		t.Errorf("poll with expired session = %d", code)
	}
	idle.connect()
	if id, _ := idle.poll(); id != next.ID {
		t.Errorf("reconnected runner did not take the job")
	}
	// A JIT runner that never connects is removed after a day.
	f.jitRunner("/orgs/octo-org", "never", "self-hosted")
	f.clock.Advance(24 * time.Hour)
	if _, ok := f.sim.RunnerByName("never"); ok {
		t.Error("offline ephemeral runner not removed after a day")
	}
}

// TestJobStatusLongPoll: with ?wait the job status read answers when the
// job completes, not before; it answers the running status once wait
// elapses; and the runner is online (not timed out) while it waits.
func TestJobStatusLongPoll(t *testing.T) {
	f := newFixture(t)
	r := f.jitRunner("/orgs/octo-org", "waiter", "self-hosted")
	r.connect()
	job := enqueue(t, f, "octo-org/app", time.Minute, "self-hosted")
	if id, _ := r.poll(); id != job.ID {
		t.Fatal("the runner did not take the job")
	}
	start := time.Now()
	if status, _, code := r.jobStatusWait(job.ID, "0.1"); code != 200 || status != "in_progress" {
		t.Fatalf("long poll of a running job after its wait = %d %s, want 200 in_progress", code, status)
	}
	if waited := time.Since(start); waited < 100*time.Millisecond {
		t.Errorf("the long poll answered after %s, before its wait of 100ms", waited)
	}

	type answer struct {
		status, conclusion string
		code               int
	}
	done := make(chan answer, 1)
	go func() {
		s, c, code := r.jobStatusWait(job.ID, "30")
		done <- answer{s, c, code}
	}()
	waitFor(t, 5*time.Second, "the long poll is open", func() bool {
		f.sim.mu.Lock()
		defer f.sim.mu.Unlock()
		rn := f.sim.jobs[job.ID].runner
		return rn != nil && rn.polls > 0
	})
	// Past the heartbeat timeout: the waiting runner stays online.
	f.clock.Advance(45 * time.Second)
	select {
	case a := <-done:
		t.Fatalf("the long poll answered %+v before the job completed", a)
	default:
	}
	if st, _ := f.sim.RunnerByName("waiter"); st.Status != "online" || !st.Busy {
		t.Errorf("runner in a long poll of its job = %+v, want online and busy", st)
	}
	f.clock.Advance(15 * time.Second)
	select {
	case a := <-done:
		if a.code != 200 || a.status != "completed" || a.conclusion != "success" {
			t.Errorf("long poll when the job completed = %+v, want 200 completed success", a)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the long poll did not answer when the job completed")
	}
}

func TestReservedJobIsRequeuedWhenRunnerVanishes(t *testing.T) {
	f := newFixture(t)
	a := f.jitRunner("/orgs/octo-org", "a", "self-hosted")
	a.connect()
	job := enqueue(t, f, "octo-org/app", time.Minute, "self-hosted")
	// Reserved for a, but a never picks it up and disconnects.
	if st, _ := f.sim.RunnerByName("a"); st.JobID != job.ID || !st.Busy {
		t.Fatalf("runner a = %+v", st)
	}
	if code, _ := a.do("DELETE", "/session?session="+a.session, nil); code != 204 {
		t.Fatalf("disconnect = %d", code)
	}
	if got, _ := f.sim.Job(job.ID); got.Status != "queued" || got.RunnerID != 0 {
		t.Fatalf("job after disconnect = %+v", got)
	}
	b := f.jitRunner("/orgs/octo-org", "b", "self-hosted")
	b.connect()
	if id, _ := b.poll(); id != job.ID {
		t.Fatalf("runner b did not take the requeued job")
	}
}

func TestWebhookHeadersDropAndRedeliver(t *testing.T) {
	f := newFixture(t)
	f.sim.DropWebhooks(1, 0)
	job := enqueue(t, f, "octo-org/app", time.Minute, "x")
	f.flush()
	if got := f.hooks.forJob(t, job.ID); len(got) != 0 {
		t.Fatalf("dropped delivery arrived: %d", len(got))
	}
	log := f.sim.Deliveries()
	if len(log) != 1 || !log[0].Dropped || log[0].Action != "queued" || log[0].JobID != job.ID {
		t.Fatalf("delivery log = %+v", log)
	}
	if n := f.sim.InjectedFaults()["webhook-drop"]; n != 1 {
		t.Errorf("InjectedFaults()[webhook-drop] = %d; want 1", n)
	}
	d, err := f.sim.Redeliver(log[0].ID)
	if err != nil || !d.Redelivery {
		t.Fatal(err, d)
	}
	f.flush()
	got := f.hooks.forJob(t, job.ID)
	if len(got) != 1 {
		t.Fatalf("redelivery arrived %d times", len(got))
	}
	h := got[0].header
	if h.Get("X-GitHub-Event") != "workflow_job" || h.Get("X-GitHub-Delivery") != log[0].ID || h.Get("Content-Type") != "application/json" ||
		!regexp.MustCompile(`^GitHub-Hookshot/[0-9a-f]+$`).MatchString(h.Get("User-Agent")) || h.Get("X-GitHub-Hook-ID") == "" ||
		!regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`).MatchString(h.Get("X-GitHub-Delivery")) {
		t.Errorf("headers = %v", h)
	}
	log = f.sim.Deliveries()
	if last := log[len(log)-1]; last.StatusCode != 204 || last.Error != "" || !last.Redelivery {
		t.Errorf("redelivery log = %+v", last)
	}
	// A failing endpoint is logged, not retried.
	bad, err := f.sim.AddWebhook(Webhook{URL: "http://127.0.0.1:1/unreachable", Secret: "s", Scope: "octo-org/other"})
	if err != nil {
		t.Fatal(err)
	}
	enqueue(t, f, "octo-org/other", time.Minute, "x")
	enqueue(t, f, "octo-org/app", time.Minute, "x") // out of the bad hook's scope
	f.flush()
	var badLog []Delivery
	for _, d := range f.sim.Deliveries() {
		if d.HookID == bad.ID {
			badLog = append(badLog, d)
		}
	}
	if len(badLog) != 1 || badLog[0].Error == "" || badLog[0].StatusCode != 0 {
		t.Errorf("failed deliveries = %+v", badLog)
	}
	// The admin API shows no secrets.
	resp, raw := f.call("GET", "/_sim/state", "", nil)
	if resp.StatusCode != 200 || strings.Contains(string(raw), hookSecret) || strings.Contains(string(raw), testPAT) {
		t.Errorf("state leaks secrets or failed: %d", resp.StatusCode)
	}
}

func TestEnqueueValidation(t *testing.T) {
	f := newFixture(t)
	for name, req := range map[string]JobRequest{
		"unknown repo":   {Repository: "octo-org/nope", Labels: []string{"x"}},
		"no labels":      {Repository: "octo-org/app"},
		"bad conclusion": {Repository: "octo-org/app", Labels: []string{"x"}, Conclusion: "great"},
		"unknown run":    {Repository: "octo-org/app", Labels: []string{"x"}, RunID: 5},
	} {
		if _, err := f.sim.EnqueueJob(req); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	j, err := f.sim.EnqueueJob(JobRequest{Repository: "Octo-Org/App", Labels: []string{"x"}, Conclusion: "failure"})
	if err != nil || j.Repository != "octo-org/app" || j.WorkflowName != "CI" || j.Name != "build" {
		t.Errorf("job = %+v, %v", j, err)
	}
	if err := f.sim.CompleteJob(j.ID, "failure"); err != nil {
		t.Fatal(err)
	}
	runs := f.sim.Runs()
	if len(runs) != 1 || runs[0].Status != "completed" || runs[0].Conclusion != "failure" {
		t.Errorf("runs = %+v", runs)
	}
}

// TestLongPollWait: ?wait= in seconds, capped at maxPollWait (a huge value
// or +Inf too, not overflowed into an immediate answer); the default when
// absent, negative or not a number.
func TestLongPollWait(t *testing.T) {
	for q, want := range map[string]time.Duration{
		"":                7 * time.Second,
		"wait=0":          0,
		"wait=0.25":       250 * time.Millisecond,
		"wait=20":         20 * time.Second,
		"wait=1e300":      maxPollWait,
		"wait=%2BInf":     maxPollWait,
		"wait=NaN":        7 * time.Second,
		"wait=-1":         7 * time.Second,
		"wait=soon":       7 * time.Second,
		"wait=9999999999": maxPollWait,
	} {
		r := httptest.NewRequest("GET", "/_runner/runners/1/jobs/2?"+q, nil)
		if got := longPollWait(r, 7*time.Second); got != want {
			t.Errorf("longPollWait(%q) = %s, want %s", q, got, want)
		}
	}
}
