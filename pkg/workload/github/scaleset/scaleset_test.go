package scaleset_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github/scaleset"
)

func two() int { return 2 }

const testPAT = "ghp_scalesetTestToken000000000000000000"

func simConfig() githubsim.Config {
	return githubsim.Config{
		Organizations: []githubsim.OrgConfig{{Login: "octo-org", RunnerGroups: []githubsim.RunnerGroupConfig{{ID: 2, Name: "hyperfleet"}}}},
		Repositories:  []githubsim.RepoConfig{{Name: "octo-org/app"}},
		PATs:          []githubsim.PATConfig{{Token: testPAT, Login: "octocat"}},
		Seed:          3,
	}
}

// start runs the simulator over HTTPS and a client of octo-org's scope.
func start(t *testing.T, opts ...githubsim.Option) (*githubsimtest.Server, *scaleset.Client) {
	t.Helper()
	gs := githubsimtest.Start(t, simConfig(), append([]githubsim.Option{githubsim.WithScaleSetPollWait(time.Second)}, opts...)...)
	c, err := scaleset.New(scaleset.Config{
		ConfigURL:    gs.URL + "/octo-org",
		APIURL:       gs.URL,
		Token:        func(context.Context) (string, error) { return testPAT, nil },
		HTTPClient:   &http.Client{Transport: gs.Transport},
		RetryWaitMin: 10 * time.Millisecond,
		RetryWaitMax: 50 * time.Millisecond,
		PollTimeout:  10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return gs, c
}

// eventLog collects a listener's events.
type eventLog struct {
	mu     sync.Mutex
	events []scaleset.Event
	ch     chan scaleset.Event
}

func newEventLog() *eventLog { return &eventLog{ch: make(chan scaleset.Event, 256)} }

func (e *eventLog) handle(_ context.Context, ev scaleset.Event) error {
	e.mu.Lock()
	e.events = append(e.events, ev)
	e.mu.Unlock()
	e.ch <- ev
	return nil
}

// next waits for the next job event of type typ (skipping statistics and
// other types).
func (e *eventLog) next(t *testing.T, typ scaleset.EventType) scaleset.Event {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case ev := <-e.ch:
			if ev.Type == typ {
				return ev
			}
		case <-deadline:
			t.Fatalf("no %s event within 20 s", typ)
		}
	}
}

func runListener(t *testing.T, cfg scaleset.ListenerConfig) (cancel func() error) {
	t.Helper()
	l, err := scaleset.NewListener(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	var once sync.Once
	var runErr error
	cancel = func() error {
		once.Do(func() {
			stop()
			runErr = <-done
		})
		return runErr
	}
	t.Cleanup(func() { _ = cancel() })
	return cancel
}

// TestListenerRunsJobThroughScaleSet: a job queued on GitHub reaches the
// listener as JobAvailable, is acquired, runs on a JIT runner of the scale
// set (the simulator's runner package) and its start and completion come
// back as events; no webhook is involved.
func TestListenerRunsJobThroughScaleSet(t *testing.T) {
	gs, c := start(t)
	ctx := context.Background()
	ss, err := c.EnsureScaleSet(ctx, "hyperfleet", "hf-linux", []string{"hf-linux"})
	if err != nil {
		t.Fatal(err)
	}
	if ss.ID == 0 || ss.RunnerGroupID != 2 || len(ss.Labels) != 1 || ss.Labels[0].Name != "hf-linux" {
		t.Fatalf("scale set = %+v", ss)
	}
	// Adopted, not duplicated; a label change is applied in place.
	again, err := c.EnsureScaleSet(ctx, "hyperfleet", "hf-linux", []string{"hf-linux", "linux"})
	if err != nil || again.ID != ss.ID || len(again.Labels) != 2 {
		t.Fatalf("ensure again = %+v, %v", again, err)
	}

	events := newEventLog()
	stop := runListener(t, scaleset.ListenerConfig{Client: c, ScaleSetID: ss.ID, Owner: "hyperfleet-test", Handle: events.handle,
		MaxRunners: func() int { return 5 }})
	waitSession(t, gs.Sim, ss.ID)

	job, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"hf-linux"}, Duration: 300 * time.Millisecond, WorkflowName: "CI", JobName: "build"})
	if err != nil {
		t.Fatal(err)
	}
	avail := events.next(t, scaleset.EventJobAvailable)
	if avail.Job.RequestID == 0 || avail.Job.JobID == "" || avail.Job.WorkflowRunID != job.RunID || avail.Job.Repository != "octo-org/app" || avail.Job.DisplayName != "build" ||
		!strings.Contains(avail.Job.Workflow, ".github/workflows/") || strings.Join(avail.Job.Labels, ",") != "hf-linux" {
		t.Fatalf("scaleset.JobAvailable = %+v", avail.Job)
	}
	if assigned := events.next(t, scaleset.EventJobAssigned); assigned.Job.RequestID != avail.Job.RequestID {
		t.Fatalf("scaleset.JobAssigned = %+v", assigned.Job)
	}
	jit, err := c.GenerateJITConfig(ctx, ss.ID, "hf-vm-1", "")
	if err != nil {
		t.Fatal(err)
	}
	if jit.Runner == nil || jit.Runner.ScaleSetID != ss.ID || jit.Runner.Name != "hf-vm-1" {
		t.Fatalf("JIT runner = %+v", jit.Runner)
	}
	proc := githubsimtest.StartScript(t, gs.InstallRunner(t), "run.sh", "--jitconfig", jit.EncodedJITConfig)
	started := events.next(t, scaleset.EventJobStarted)
	if started.Job.RequestID != avail.Job.RequestID || started.Job.JobID != avail.Job.JobID || started.Job.RunnerName != "hf-vm-1" || started.Job.RunnerID != jit.Runner.ID {
		t.Fatalf("scaleset.JobStarted = %+v", started.Job)
	}
	completed := events.next(t, scaleset.EventJobCompleted)
	if completed.Job.RequestID != avail.Job.RequestID || completed.Job.Result != "succeeded" || completed.Job.RunnerName != "hf-vm-1" {
		t.Fatalf("scaleset.JobCompleted = %+v", completed.Job)
	}
	if code := proc.Wait(t, 20*time.Second); code != 0 {
		t.Fatalf("run.sh exited %d:\n%s", code, proc.Output())
	}
	if got, _ := gs.Sim.Job(job.ID); got.Status != "completed" || got.Conclusion != "success" || got.RunnerName != "hf-vm-1" {
		t.Fatalf("job = %+v", got)
	}
	for _, s := range gs.Sim.ScaleSets() {
		if s.ID == int64(ss.ID) && s.MaxCapacity != 5 {
			t.Fatalf("X-ScaleSetMaxCapacity seen by the service = %d", s.MaxCapacity)
		}
	}
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run returned %v", err)
	}
	// Run gave the session back and acknowledged every message.
	for _, s := range gs.Sim.ScaleSets() {
		if s.ID == int64(ss.ID) && (s.Session != "" || s.Unacked != 0) {
			t.Fatalf("after Run: %+v", s)
		}
	}
}

func waitSession(t *testing.T, sim *githubsim.Simulator, id int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, s := range sim.ScaleSets() {
			if s.ID == int64(id) && s.Session != "" {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("scale set %d has no session", id)
}

// TestSessionConflictAndRedelivery: one session per scale set (a second
// gets ErrSessionConflict; the listener waits it out, bounded), and a
// message that was not acknowledged is delivered again to the next
// session.
func TestSessionConflictAndRedelivery(t *testing.T) {
	gs, c := start(t, githubsim.WithAdmin(true))
	ctx := context.Background()
	ss, err := c.CreateScaleSet(ctx, scaleset.ScaleSet{Name: "hf-conflict", RunnerGroupID: 1})
	if err != nil {
		t.Fatal(err)
	}
	s1, err := c.CreateSession(ctx, ss.ID, "first")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSession(ctx, ss.ID, "second"); !errors.Is(err, scaleset.ErrSessionConflict) || !strings.Contains(err.Error(), "TaskAgentSessionConflictException") {
		t.Fatalf("second session: %v", err)
	}
	job, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"hf-conflict"}, Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	m1, err := s1.GetMessage(ctx, 0, 1)
	if err != nil || m1 == nil || len(m1.Jobs) != 1 || m1.Jobs[0].Type != scaleset.JobAvailable || m1.Jobs[0].WorkflowRunID != job.RunID {
		t.Fatalf("first delivery = %+v, %v", m1, err)
	}
	if m1.Statistics == nil || m1.Statistics.TotalAvailableJobs != 1 {
		t.Fatalf("statistics = %+v", m1.Statistics)
	}
	// The holder goes away without acknowledging.
	if err := s1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	s2, err := c.CreateSession(ctx, ss.ID, "second")
	if err != nil {
		t.Fatal(err)
	}
	m2, err := s2.GetMessage(ctx, 0, 1)
	if err != nil || m2 == nil || m2.ID != m1.ID || len(m2.Jobs) != 1 || m2.Jobs[0].RunnerRequestID != m1.Jobs[0].RunnerRequestID {
		t.Fatalf("redelivery = %+v, %v", m2, err)
	}
	if err := s2.DeleteMessage(ctx, m2.ID); err != nil {
		t.Fatal(err)
	}
	// The REST job id is no runner request id: nothing is acquired.
	if got, err := s2.AcquireJobs(ctx, []int64{job.ID}); err != nil || len(got) != 0 {
		t.Fatalf("acquire by REST id = %v, %v", got, err)
	}
	if m3, err := s2.GetMessage(ctx, m2.ID, 1); err != nil || m3 != nil {
		t.Fatalf("after acknowledgement = %+v, %v", m3, err)
	}
	if err := s2.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// Two more conflicts (injected through the admin API) are waited out
	// by the listener (3 tries).
	resp, err := (&http.Client{Transport: gs.Transport}).Post(fmt.Sprintf("%s/_sim/scalesets/%d/session-conflict?count=2", gs.URL, ss.ID), "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("session-conflict: HTTP %d", resp.StatusCode)
	}
	events := newEventLog()
	stop := runListener(t, scaleset.ListenerConfig{Client: c, ScaleSetID: ss.ID, Owner: "waiter", Handle: events.handle, MaxRunners: two,
		SessionConflictRetries: 3, SessionConflictWait: 50 * time.Millisecond})
	waitSession(t, gs.Sim, ss.ID)
	if got := gs.Sim.InjectedFaults()["error-409"]; got != 2 {
		t.Fatalf("injected conflicts = %d", got)
	}
	_ = stop()

	// With fewer tries than conflicts the listener gives up.
	if err := gs.Sim.ScaleSetSessionConflict(int64(ss.ID), 5); err != nil {
		t.Fatal(err)
	}
	l, err := scaleset.NewListener(scaleset.ListenerConfig{Client: c, ScaleSetID: ss.ID, Owner: "impatient", Handle: events.handle, MaxRunners: two,
		SessionConflictRetries: 2, SessionConflictWait: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Run(ctx); !errors.Is(err, scaleset.ErrSessionConflict) {
		t.Fatalf("Run = %v", err)
	}
	gs.Sim.ClearFaults()
}

// TestTokenExpiryAndRefresh: the admin token is renewed a minute before
// its exp on the service's clock, and after the service revokes both
// tokens a poll refreshes the session (and with it the admin token) and
// still gets its message.
func TestTokenExpiryAndRefresh(t *testing.T) {
	clock := githubsim.NewFakeClock(time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC))
	// The session is not polled while the clock moves past its token's
	// expiry: an idle timeout beyond that keeps the service from expiring
	// the session itself (TestListenerResumesAfterReplicaKilled tests that).
	gs, c := start(t, githubsim.WithClock(clock), githubsim.WithScaleSetTokenTTL(10*time.Minute, 5*time.Minute), githubsim.WithAdmin(true),
		githubsim.WithScaleSetSessionIdleTimeout(time.Hour))
	scaleset.SetNow(c, clock.Now)
	ctx := context.Background()
	ss, err := c.CreateScaleSet(ctx, scaleset.ScaleSet{Name: "hf-tokens", RunnerGroupID: 1})
	if err != nil {
		t.Fatal(err)
	}
	first := scaleset.AdminToken(c)
	if !scaleset.AdminTokenExpiry(c).Equal(clock.Now().Add(10 * time.Minute).Truncate(time.Second)) {
		t.Fatalf("admin token expires %v", scaleset.AdminTokenExpiry(c))
	}
	clock.Advance(8 * time.Minute)
	if _, err := c.ScaleSetByID(ctx, ss.ID); err != nil || scaleset.AdminToken(c) != first {
		t.Fatalf("refreshed too early (%v)", err)
	}
	clock.Advance(90 * time.Second) // 30 s before exp: inside the margin
	if _, err := c.ScaleSetByID(ctx, ss.ID); err != nil || scaleset.AdminToken(c) == first {
		t.Fatalf("not refreshed before expiry (%v)", err)
	}

	sess, err := c.CreateSession(ctx, ss.ID, "tokens")
	if err != nil {
		t.Fatal(err)
	}
	queueToken := sess.Info().MessageQueueAccessToken
	if _, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"hf-tokens"}, Duration: time.Second}); err != nil {
		t.Fatal(err)
	}
	// The queue token lapses on the service's clock: the poll refreshes.
	clock.Advance(6 * time.Minute)
	m, err := sess.GetMessage(ctx, 0, 1)
	if err != nil || m == nil || len(m.Jobs) != 1 {
		t.Fatalf("after queue token expiry: %+v, %v", m, err)
	}
	if sess.Info().MessageQueueAccessToken == queueToken {
		t.Fatal("session not refreshed")
	}
	// Both tokens revoked early: acquire refreshes session and admin token.
	admin := scaleset.AdminToken(c)
	// Through the admin API, as the standalone simulator is driven.
	resp, err := (&http.Client{Transport: gs.Transport}).Post(gs.URL+"/_sim/scalesets/expire-tokens", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || gs.Sim.InjectedFaults()["scaleset-token-expiry"] != 1 {
		t.Fatalf("expire-tokens: HTTP %d", resp.StatusCode)
	}
	got, err := sess.AcquireJobs(ctx, []int64{m.Jobs[0].RunnerRequestID})
	if err != nil || len(got) != 1 {
		t.Fatalf("acquire after revocation = %v, %v", got, err)
	}
	if scaleset.AdminToken(c) == admin {
		t.Fatal("admin token not renewed after revocation")
	}
	if err := sess.DeleteMessage(ctx, m.ID); err != nil {
		t.Fatal(err)
	}
}

// TestServerErrorsBackOff: 5xx answers are retried by the client, and
// when its retries are spent the listener backs off and carries on.
func TestServerErrorsBackOff(t *testing.T) {
	gs, c := start(t)
	ctx := context.Background()
	ss, err := c.CreateScaleSet(ctx, scaleset.ScaleSet{Name: "hf-5xx", RunnerGroupID: 1})
	if err != nil {
		t.Fatal(err)
	}
	// Three failures fit within the client's four retries.
	if err := gs.Sim.InjectError(githubsim.ErrorFault{Method: "GET", PathPrefix: "/_actions/", Status: 503, Count: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ScaleSetByID(ctx, ss.ID); err != nil {
		t.Fatalf("retries did not ride out 3 x 503: %v", err)
	}
	// Ten outlast them: the listener's polls fail twice and it backs off.
	if err := gs.Sim.InjectError(githubsim.ErrorFault{Method: "GET", PathPrefix: "/_actions/", Status: 502, Count: 10}); err != nil {
		t.Fatal(err)
	}
	events := newEventLog()
	begin := time.Now()
	runListener(t, scaleset.ListenerConfig{Client: c, ScaleSetID: ss.ID, Owner: "backoff", Handle: events.handle, MaxRunners: two,
		BackoffMin: 100 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	job, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"hf-5xx"}, Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if ev := events.next(t, scaleset.EventJobAvailable); ev.Job.WorkflowRunID != job.RunID {
		t.Fatalf("scaleset.JobAvailable = %+v", ev.Job)
	}
	if faults := gs.Sim.InjectedFaults(); faults["error-503"] != 3 || faults["error-502"] != 10 {
		t.Fatalf("injected = %v", faults)
	}
	// Two failed polls: 100 ms then 200 ms of backoff at least.
	if d := time.Since(begin); d < 300*time.Millisecond {
		t.Fatalf("listener did not back off (%v)", d)
	}
}

// TestListenerReopensDroppedSession: when the service drops the session
// under a polling listener, the listener opens a new one and goes on; a
// consumer's error stops Run, which still gives the session back.
func TestListenerReopensDroppedSession(t *testing.T) {
	gs, c := start(t, githubsim.WithScaleSetPollWait(200*time.Millisecond))
	ctx := context.Background()
	ss, err := c.CreateScaleSet(ctx, scaleset.ScaleSet{Name: "hf-drop", RunnerGroupID: 1})
	if err != nil {
		t.Fatal(err)
	}
	events := newEventLog()
	boom := errors.New("consumer refused")
	l, err := scaleset.NewListener(scaleset.ListenerConfig{Client: c, ScaleSetID: ss.ID, Owner: "dropper", BackoffMin: 10 * time.Millisecond, MaxRunners: two,
		Handle: func(ctx context.Context, ev scaleset.Event) error {
			if ev.Type == scaleset.EventJobCompleted {
				return boom
			}
			return events.handle(ctx, ev)
		}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	waitSession(t, gs.Sim, ss.ID)
	var first string
	for _, s := range gs.Sim.ScaleSets() {
		if s.ID == int64(ss.ID) {
			first = s.Session
		}
	}
	// The service drops it (as if it had expired it).
	dropped := scaleset.SessionOf(c, ss.ID, first)
	if err := dropped.Close(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var now string
		for _, s := range gs.Sim.ScaleSets() {
			if s.ID == int64(ss.ID) {
				now = s.Session
			}
		}
		if now != "" && now != first {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the listener opened no new session")
		}
		time.Sleep(20 * time.Millisecond)
	}
	job, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"hf-drop"}, Duration: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if ev := events.next(t, scaleset.EventJobAssigned); ev.Job.WorkflowRunID != job.RunID {
		t.Fatalf("scaleset.JobAssigned = %+v", ev.Job)
	}
	// Completing it makes the consumer fail: Run ends with that error.
	if err := gs.Sim.CompleteJob(job.ID, "failure"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, boom) {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop on the consumer's error")
	}
	for _, s := range gs.Sim.ScaleSets() {
		if s.ID == int64(ss.ID) && s.Session != "" {
			t.Fatal("session left behind")
		}
	}
}
