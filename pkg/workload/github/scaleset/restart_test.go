package scaleset_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github/scaleset"
)

// replicaTransport is a replica's network: once dead, nothing it sends
// arrives (a killed pod deletes no session). It counts the 409s its
// session creations got.
type replicaTransport struct {
	base      http.RoundTripper
	dead      atomic.Bool
	conflicts atomic.Int64
}

var errReplicaDead = errors.New("replica killed")

func (r *replicaTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if r.dead.Load() {
		return nil, errReplicaDead
	}
	resp, err := r.base.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusConflict && req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/sessions") {
		r.conflicts.Add(1)
	}
	return resp, err
}

// replicaClient is a client of octo-org's scope over its own network, on
// the simulator's clock.
func replicaClient(t *testing.T, url string, base http.RoundTripper, now func() time.Time) (*scaleset.Client, *replicaTransport) {
	t.Helper()
	tr := &replicaTransport{base: base}
	c, err := scaleset.New(scaleset.Config{
		ConfigURL:    url + "/octo-org",
		APIURL:       url,
		Token:        func(context.Context) (string, error) { return testPAT, nil },
		HTTPClient:   &http.Client{Transport: tr},
		RetryMax:     1,
		RetryWaitMin: 10 * time.Millisecond,
		RetryWaitMax: 20 * time.Millisecond,
		PollTimeout:  10 * time.Second,
		Now:          now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return c, tr
}

// waitFor polls cond (the simulator's state) until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 20 s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func scaleSetView(sim *githubsim.Simulator, id int) githubsim.ScaleSet {
	for _, s := range sim.ScaleSets() {
		if s.ID == int64(id) {
			return s
		}
	}
	return githubsim.ScaleSet{}
}

// TestListenerResumesAfterReplicaKilled: the replica holding a scale set's
// listener is killed (its session is never deleted); the next replica's
// listener is refused (409) while the dead one's session lives, gets the
// scale set once the service expires that session (2 minutes after its
// last poll, on the simulator's clock), and receives the job queued in
// between and acquires it. A live listener's session does not expire
// however long its poll waits.
//
// Mutation: a simulator that never expires sessions fails this test (the
// second listener is refused for ever, as before); one that counts a
// poll's arrival only, not the poll in flight, fails it too (the live
// listener loses its session while the clock moves); one that expires it
// before the idle
// timeout fails the check that the second listener is still refused at
// 2 min - 1 s. The old tests passed all three: none restarted a listener
// without deleting its session.
func TestListenerResumesAfterReplicaKilled(t *testing.T) {
	clock := githubsim.NewFakeClock(time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC))
	// Polls wait a minute of wall time: a live listener's poll is in
	// flight while the test moves the clock.
	gs, admin := start(t, githubsim.WithClock(clock), githubsim.WithScaleSetPollWait(time.Minute))
	scaleset.SetNow(admin, clock.Now)
	ctx := context.Background()
	ss, err := admin.EnsureScaleSet(ctx, "hyperfleet", "hf-restart", []string{"hf-restart"})
	if err != nil {
		t.Fatal(err)
	}

	// Replica A's listener holds the session and is polling.
	clientA, netA := replicaClient(t, gs.URL, gs.Transport, clock.Now)
	eventsA := newEventLog()
	stopA := runListener(t, scaleset.ListenerConfig{Client: clientA, ScaleSetID: ss.ID, Owner: "replica-a", Handle: eventsA.handle, MaxRunners: two})
	waitFor(t, "replica A polls", func() bool { v := scaleSetView(gs.Sim, ss.ID); return v.SessionOwn == "replica-a" && v.Polls == 1 })
	sessionA := scaleSetView(gs.Sim, ss.ID).Session
	clock.Advance(10 * time.Minute)
	if v := scaleSetView(gs.Sim, ss.ID); v.Session != sessionA {
		t.Fatalf("a polling listener's session expired: %+v", v)
	}

	// Replica A is killed: its poll is cut and it deletes nothing.
	netA.dead.Store(true)
	if err := stopA(); !errors.Is(err, context.Canceled) {
		t.Fatalf("replica A's Run = %v", err)
	}
	waitFor(t, "the service sees replica A's poll end", func() bool { return scaleSetView(gs.Sim, ss.ID).Polls == 0 })
	if v := scaleSetView(gs.Sim, ss.ID); v.Session != sessionA {
		t.Fatalf("replica A's session = %+v, want it left behind", v)
	}
	// A job comes while nobody listens.
	job, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"hf-restart"}, Duration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}

	// Replica B (the new leader) is refused while A's session lives.
	clientB, netB := replicaClient(t, gs.URL, gs.Transport, clock.Now)
	eventsB := newEventLog()
	runListener(t, scaleset.ListenerConfig{Client: clientB, ScaleSetID: ss.ID, Owner: "replica-b", Handle: eventsB.handle, MaxRunners: two,
		SessionConflictRetries: 1 << 20, SessionConflictWait: 10 * time.Millisecond})
	waitFor(t, "replica B is refused", func() bool { return netB.conflicts.Load() >= 1 })
	clock.Advance(2*time.Minute - time.Second)
	seen := netB.conflicts.Load()
	waitFor(t, "replica B is refused again", func() bool { return netB.conflicts.Load() >= seen+2 })
	if v := scaleSetView(gs.Sim, ss.ID); v.Session != sessionA {
		t.Fatalf("replica A's session expired before the idle timeout: %+v", v)
	}

	// Two minutes after A's last poll the service drops its session, and
	// B gets the scale set with the job queued meanwhile.
	clock.Advance(time.Second)
	waitFor(t, "replica B holds the session", func() bool { return scaleSetView(gs.Sim, ss.ID).SessionOwn == "replica-b" })
	avail := eventsB.next(t, scaleset.EventJobAvailable)
	if avail.Job.WorkflowRunID != job.RunID {
		t.Fatalf("replica B's JobAvailable = %+v", avail.Job)
	}
	if assigned := eventsB.next(t, scaleset.EventJobAssigned); assigned.Job.RequestID != avail.Job.RequestID {
		t.Fatalf("replica B's JobAssigned = %+v", assigned.Job)
	}
	if got, _ := gs.Sim.Job(job.ID); got.Status != "queued" {
		t.Fatalf("job = %+v", got)
	}
	eventsA.mu.Lock()
	defer eventsA.mu.Unlock()
	for _, ev := range eventsA.events {
		if ev.Type == scaleset.EventJobAvailable {
			t.Fatalf("the killed replica got %+v", ev)
		}
	}
}
