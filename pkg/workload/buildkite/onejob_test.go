package buildkite_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	bksim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite"
)

// TestVMCredentialServesOneJob: a hostile job copies every Buildkite
// credential its VM holds and uses it from elsewhere while its own job
// sleeps. Here the thief is a process with the credential and the agent
// API, against the simulator:
//
//   - a warm VM (its claim bound to no job) gets no credential at all; a
//     cluster agent token it got would register agents that take any job
//     of the cluster's queues, for 30 minutes, and call the Stacks API;
//   - the job acquisition token of a VM bound to a job registers no second
//     agent, is refused by the Stacks API, and an agent the thief
//     registers with it first is offered no job and acquires no other job;
//   - once the VM's agent registered, the operator deletes the claim's
//     cluster token (RetireRegistration): it registers nothing and calls
//     no Stacks API, and the job token is dead;
//   - the job's own access token (BUILDKITE_AGENT_ACCESS_TOKEN) pings for
//     no work, acquires no job, registers no agent and calls no Stacks API.
//
// Every other job of the cluster is still waiting for an agent at the end.
func TestVMCredentialServesOneJob(t *testing.T) {
	w := newWorld(t, bksim.Config{})
	if _, err := w.sim.CreateQueue(w.cluster.ID, "gpu"); err != nil {
		t.Fatal(err)
	}
	p := w.provider(t, workload.Scope{Owner: "acme"}, apiToken)
	ctx := context.Background()
	b, err := w.sim.CreateBuild("app", "go", []bksim.Step{
		{Key: "mine", Command: "sleep 600", Agents: []string{"queue=linux"}},
		{Key: "linux", Command: "true", Agents: []string{"queue=linux"}},
		{Key: "gpu", Command: "true", Agents: []string{"queue=gpu"}},
		{Key: "raced", Command: "true", Agents: []string{"queue=linux"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	mine, others, raced := b.JobIDs[0], b.JobIDs[1:3], b.JobIDs[3]
	stacksRegister := map[string]any{"key": "thief", "type": "custom", "queue_key": "linux"}

	// A warm VM: nothing to steal.
	warm, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: "warm-1", Labels: buildkite.AgentTags("linux", nil)})
	if !errors.Is(err, workload.ErrJobNotBindable) || !warm.Secret.IsZero() {
		t.Errorf("a warm VM's credential: %v, %v; want none (ErrJobNotBindable)", warm.Method, err)
	}
	if !warm.Secret.IsZero() {
		stolen := warm.Secret.Reveal()
		for i, queue := range []string{"linux", "gpu"} {
			name := []string{"thief-linux", "thief-gpu"}[i]
			access, code := w.register(t, stolen, name, "queue="+queue)
			if code != http.StatusOK {
				continue
			}
			if _, out := w.agentCall(t, http.MethodGet, "ping", access, nil); out["job"] != nil {
				t.Errorf("the warm VM's credential registered agent %s, which was given a job of queue %s: %v", name, queue, out["job"].(map[string]any)["id"])
			}
		}
		if code, _ := w.agentCall(t, http.MethodPost, "stacks/register", stolen, stacksRegister); code/100 == 2 {
			t.Errorf("the warm VM's credential called the Stacks API: %d", code)
		}
	}

	// A VM bound to its job: its agent registers with the job token.
	cred, err := p.IssueCredential(ctx, bound("vm-1", mine))
	if err != nil {
		t.Fatal(err)
	}
	stolen := cred.Secret.Reveal()
	access, code := w.register(t, stolen, "vm-1", "queue=linux")
	if code != http.StatusOK {
		t.Fatalf("the VM's agent registers: %d", code)
	}
	if _, code := w.register(t, stolen, "thief", "queue=linux"); code != http.StatusUnauthorized {
		t.Errorf("a second agent with the VM's job token: %d, want 401", code)
	}
	if code, _ := w.agentCall(t, http.MethodPost, "stacks/register", stolen, stacksRegister); code != http.StatusUnauthorized {
		t.Errorf("the Stacks API with the VM's job token: %d, want 401", code)
	}
	// The operator sees the agent registered and retires the cluster token.
	clusterToken := w.clusterToken(t, "vm-1")
	if clusterToken == "" {
		t.Fatal("the claim has no cluster token")
	}
	if r, err := p.GetRunner(ctx, "vm-1"); err != nil || r.State == workload.RunnerOffline {
		t.Fatalf("the VM's agent is not registered: %+v, %v", r, err)
	}
	if err := p.RetireRegistration(ctx, "vm-1"); err != nil {
		t.Fatal(err)
	}
	if _, code := w.register(t, clusterToken, "thief", "queue=gpu"); code != http.StatusUnauthorized {
		t.Errorf("the claim's cluster token after registration: %d, want 401", code)
	}
	if code, _ := w.agentCall(t, http.MethodPost, "stacks/register", clusterToken, stacksRegister); code != http.StatusUnauthorized {
		t.Errorf("the Stacks API with the claim's cluster token after registration: %d, want 401", code)
	}
	// The VM's agent acquires its job; the job's own token is what the
	// job sees.
	code, out := w.agentCall(t, http.MethodPut, "jobs/"+mine+"/acquire", access, nil)
	jobToken, _ := out["token"].(string)
	if code != http.StatusOK || jobToken == "" {
		t.Fatalf("the VM's agent acquires its job: %d %v", code, out)
	}
	for _, call := range []struct{ method, path string }{
		{http.MethodGet, "ping"}, {http.MethodPost, "register"}, {http.MethodPost, "stacks/register"},
		{http.MethodPut, "jobs/" + others[0] + "/acquire"}, {http.MethodPut, "jobs/" + others[1] + "/acquire"},
	} {
		if code, _ := w.agentCall(t, call.method, call.path, jobToken, stacksRegister); code != http.StatusUnauthorized {
			t.Errorf("%s %s with the job's access token: %d, want 401", call.method, call.path, code)
		}
	}

	// A thief that registers with a VM's job token before the VM does
	// holds an agent for that job alone: no work by ping, no other job.
	cred2, err := p.IssueCredential(ctx, bound("vm-2", raced))
	if err != nil {
		t.Fatal(err)
	}
	thief, code := w.register(t, cred2.Secret.Reveal(), "thief", "queue=linux")
	if code != http.StatusOK {
		t.Fatalf("the thief registers first: %d", code)
	}
	if _, out := w.agentCall(t, http.MethodGet, "ping", thief, nil); out["job"] != nil {
		t.Errorf("the thief's agent was offered a job: %v", out)
	}
	for _, id := range others {
		if code, _ := w.agentCall(t, http.MethodPut, "jobs/"+id+"/acquire", thief, nil); code != http.StatusUnprocessableEntity {
			t.Errorf("the thief's agent acquires job %s: %d, want 422", id, code)
		}
	}

	w.clock.Advance(time.Minute)
	for _, id := range others {
		j, err := p.GetJob(ctx, "acme/app", id)
		if err != nil || j.State != workload.JobQueued || j.RunnerName != "" {
			t.Errorf("job %s after the attacks: %+v, %v; want still waiting for an agent", id, j, err)
		}
	}
}
