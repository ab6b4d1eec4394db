package buildkitesim

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRealAgentRunsAcquiredJobs runs the real agent's job loop (the binary
// of hack/buildkite-agent) against the simulator, once per job with
// --acquire-job and --disconnect-after-job as HyperFleet's VMs will: it
// registers with the cluster token, acquires exactly its job, runs the
// command with bash, uploads the log and finishes with the command's exit
// status, and exits. A signed webhook receiver sees job.started and
// job.finished for each.
func TestRealAgentRunsAcquiredJobs(t *testing.T) {
	w := newWorld(t, Config{})
	const secret = "webhook-secret"
	var (
		mu     sync.Mutex
		events []string
	)
	hook := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := VerifySignature(secret, r.Header.Get("X-Buildkite-Signature"), body, time.Now(), 5*time.Minute); err != nil {
			t.Errorf("webhook %s: %v", r.Header.Get("X-Buildkite-Event"), err)
		}
		mu.Lock()
		events = append(events, r.Header.Get("X-Buildkite-Event"))
		mu.Unlock()
	}))
	defer hook.Close()
	w.sim.AddWebhook(Webhook{URL: hook.URL, Token: secret, Signed: true})

	b, err := w.sim.CreateBuild(w.pipeline, "two jobs", []Step{
		{Key: "ok", Command: `echo "hello from $BUILDKITE_JOB_ID"; echo "in $(basename "$PWD")"`},
		{Key: "bad", Command: "echo about to fail; exit 3", Agents: []string{"queue=default"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	okJob, badJob := b.JobIDs[0], b.JobIDs[1]

	code, out := w.runAgent(t, w.token.Secret, "--name", "vm-1", "--acquire-job", okJob, "--disconnect-after-job", "--tags", "queue=default,os=linux")
	if code != 0 {
		t.Fatalf("agent exited %d:\n%s", code, out)
	}
	info, _ := w.sim.Job(okJob)
	if info.State != statePassed || info.ExitStatus == nil || *info.ExitStatus != 0 {
		t.Fatalf("job %s: state %s, exit status %v; agent output:\n%s", okJob, info.State, info.ExitStatus, out)
	}
	if !strings.Contains(info.Log, "hello from "+okJob) || !strings.Contains(info.Log, "in app") {
		t.Errorf("job log lacks the command's output (and its checkout directory):\n%s", info.Log)
	}
	if info.Agent != "vm-1" {
		t.Errorf("job ran on %q, want vm-1", info.Agent)
	}

	code, out = w.runAgent(t, w.token.Secret, "--name", "vm-2", "--acquire-job", badJob, "--disconnect-after-job")
	if code != 0 {
		t.Fatalf("agent exited %d (a failed job is still a job done):\n%s", code, out)
	}
	info, _ = w.sim.Job(badJob)
	if info.State != stateFailed || info.ExitStatus == nil || *info.ExitStatus != 3 {
		t.Fatalf("job %s: state %s, exit status %v, want failed with 3; agent output:\n%s", badJob, info.State, info.ExitStatus, out)
	}
	if !strings.Contains(info.Log, "about to fail") {
		t.Errorf("job log lacks the command's output:\n%s", info.Log)
	}
	for _, a := range w.sim.Agents() {
		if a.State != "disconnected" {
			t.Errorf("agent %s is %s after its job, want disconnected", a.Name, a.State)
		}
	}

	// Acquiring a job that already ran is refused (422), which the agent
	// reports with its exit code 27.
	code, out = w.runAgent(t, w.token.Secret, "--acquire-job", okJob, "--disconnect-after-job")
	if code != exitCodeAcquisitionRejected {
		t.Errorf("acquiring a finished job: agent exited %d, want %d:\n%s", code, exitCodeAcquisitionRejected, out)
	}

	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		got := strings.Join(events, ",")
		mu.Unlock()
		want := "job.scheduled,job.scheduled,job.started,job.finished,job.started,job.finished"
		if got == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("webhooks delivered: %s, want %s", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exitCodeAcquisitionRejected is the real agent's exit code when Buildkite
// refuses --acquire-job (hack/buildkite-agent/main.go, exitAcquisitionRejected,
// the same code as the real agent's).
const exitCodeAcquisitionRejected = 27

// TestRealAgentWaitsForLockedJob: a job still waiting on its dependencies
// answers acquire with 423 and Retry-After; the agent asks again and runs
// it once it is scheduled.
func TestRealAgentWaitsForLockedJob(t *testing.T) {
	w := newWorld(t, Config{})
	b, err := w.sim.CreateBuild(w.pipeline, "locked", []Step{{Key: "later", Command: "echo ran after unblock", Waiting: true}})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(1500 * time.Millisecond)
		if err := w.sim.Unblock(b.JobIDs[0]); err != nil {
			t.Error(err)
		}
	}()
	code, out := w.runAgent(t, w.token.Secret, "--acquire-job", b.JobIDs[0], "--disconnect-after-job")
	info, _ := w.sim.Job(b.JobIDs[0])
	if code != 0 || info.State != statePassed {
		t.Fatalf("agent exited %d, job %s:\n%s", code, info.State, out)
	}
	if !strings.Contains(out, "waiting for a dependency") {
		t.Errorf("the agent never saw the job locked (423):\n%s", out)
	}
}

// TestRealAgentRefusedTokens: an agent with a wrong, a deleted (revoked)
// or an expired token is not registered and exits with an error.
func TestRealAgentRefusedTokens(t *testing.T) {
	w := newWorld(t, Config{})
	revoked, err := w.sim.CreateToken(w.cluster.ID, "revoked", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.sim.DeleteToken(w.cluster.ID, revoked.ID); err != nil {
		t.Fatal(err)
	}
	expired, err := w.sim.CreateToken(w.cluster.ID, "expired", time.Now().Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	b, err := w.sim.CreateBuild(w.pipeline, "never runs", []Step{{Command: "true"}})
	if err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]string{"wrong": "not-a-token", "revoked": revoked.Secret, "expired": expired.Secret} {
		code, out := w.runAgent(t, tok, "--acquire-job", b.JobIDs[0], "--disconnect-after-job")
		if code == 0 || !strings.Contains(out, "401") {
			t.Errorf("%s token: agent exited %d, want a refused registration (401):\n%s", name, code, out)
		}
	}
	if n := len(w.sim.Agents()); n != 0 {
		t.Errorf("%d agents registered with refused tokens", n)
	}
	if info, _ := w.sim.Job(b.JobIDs[0]); info.State != stateScheduled {
		t.Errorf("job is %s, want still scheduled", info.State)
	}
}

// TestRealAgentPingsForJob: without --acquire-job the agent is dispatched
// a job through its pings, by the agent query rules: the job waits for an
// agent of its queue whose tags match its other rules (* matching any
// text); the agent accepts, runs and finishes it, and disconnects after it.
func TestRealAgentPingsForJob(t *testing.T) {
	w := newWorld(t, Config{})
	if _, err := w.sim.CreateQueue(w.cluster.ID, "large"); err != nil {
		t.Fatal(err)
	}
	b, err := w.sim.CreateBuild(w.pipeline, "dispatched", []Step{
		{Key: "default-queue", Command: "echo wrong queue"},
		{Key: "large", Command: "echo dispatched to $BUILDKITE_AGENT_META_DATA_OS", Agents: []string{"queue=large", "os=linux*"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	code, out := w.runAgent(t, w.token.Secret, "--name", "big", "--tags", "queue=large,os=linux-amd64", "--disconnect-after-job")
	if code != 0 {
		t.Fatalf("agent exited %d:\n%s", code, out)
	}
	info, _ := w.sim.Job(b.JobIDs[1])
	if info.State != statePassed || info.Agent != "big" || !strings.Contains(info.Log, "dispatched to linux-amd64") {
		t.Fatalf("job on the large queue: %+v; agent output:\n%s", info, out)
	}
	if other, _ := w.sim.Job(b.JobIDs[0]); other.State != stateScheduled {
		t.Errorf("the default queue's job is %s, want still scheduled", other.State)
	}
}

// TestRealAgentDisconnectsAfterOneJob: an agent with --disconnect-after-job
// and no --acquire-job takes one of two jobs of its queue from its pings,
// runs it, and exits; its finish said ignore_agent_in_dispatches, so the
// other job was never dispatched to it (a job handed to an agent that is
// leaving would stay assigned to nobody) and is still scheduled.
func TestRealAgentDisconnectsAfterOneJob(t *testing.T) {
	w := newWorld(t, Config{})
	b, err := w.sim.CreateBuild(w.pipeline, "two", []Step{{Key: "a", Command: "echo a"}, {Key: "b", Command: "echo b"}})
	if err != nil {
		t.Fatal(err)
	}
	code, out := w.runAgent(t, w.token.Secret, "--name", "once", "--disconnect-after-job")
	if code != 0 {
		t.Fatalf("agent exited %d:\n%s", code, out)
	}
	first, _ := w.sim.Job(b.JobIDs[0])
	second, _ := w.sim.Job(b.JobIDs[1])
	if first.State != statePassed || first.Agent != "once" {
		t.Errorf("first job %s on %q, want passed on once", first.State, first.Agent)
	}
	if second.State != stateScheduled || second.Agent != "" {
		t.Errorf("second job %s on %q, want scheduled on no agent:\n%s", second.State, second.Agent, out)
	}
	if strings.Contains(out, "Ignoring the new job") {
		t.Errorf("the simulator dispatched a job to an agent that had said it takes no more:\n%s", out)
	}
}
