package buildkite_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	bksim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite"
)

// TestJobAcquisitionToken: a runner made for a job gets a bkjat_ token
// good for that job only; an agent registered with it is offered nothing
// and cannot acquire another job (422, which buildkite-agent turns into
// exit 27); it works once; it expires with its lifetime; and deleting the
// claim's cluster token (DeregisterRunner) revokes it. A job that no longer
// waits, runs on another queue or is not the named pipeline's binds
// nothing (ErrJobNotBindable), as does a runner made for no job.
func TestJobAcquisitionToken(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, bksim.Config{})
	p := w.provider(t, workload.Scope{Owner: "acme"}, apiToken)
	b, err := w.sim.CreateBuild("app", "go", []bksim.Step{
		{Key: "a", Command: "true", Agents: []string{"queue=linux"}},
		{Key: "b", Command: "true", Agents: []string{"queue=linux"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	mine, other := b.JobIDs[0], b.JobIDs[1]
	labels := buildkite.AgentTags("linux", nil)

	if plain, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: "warm-1", Labels: labels}); !errors.Is(err, workload.ErrJobNotBindable) {
		t.Fatalf("unbound runner: %v %+v; want ErrJobNotBindable", err, plain)
	}
	// Another agent of the queue, registered with a cluster token the
	// operator did not make.
	other1, err := w.sim.CreateToken(w.cluster.ID, "someone else's agents", time.Time{})
	if err != nil {
		t.Fatal(err)
	}

	cred, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: "vm-1", Labels: labels, Job: mine, JobRepository: "acme/app"})
	if err != nil {
		t.Fatal(err)
	}
	if cred.Method != buildkite.MethodJobToken || cred.Job != mine || !strings.HasPrefix(cred.Secret.Reveal(), "bkjat_") {
		t.Fatalf("bound runner: %+v", cred)
	}
	if got := cred.ExpiresAt.Sub(w.clock.Now()); got <= 0 || got > buildkite.MaxJobTokenLifetime {
		t.Fatalf("job token lifetime %v, want (0, 1h]", got)
	}
	// Another agent of the queue is not offered the reserved job.
	warm, code := w.register(t, other1.Secret, "warm-1", labels...)
	if code != http.StatusOK {
		t.Fatalf("warm register: %d", code)
	}
	if _, out := w.agentCall(t, http.MethodGet, "ping", warm, nil); out["job"] != nil {
		if j, _ := out["job"].(map[string]any); j["id"] == mine {
			t.Fatal("the reserved job was offered to a warm agent")
		}
	}

	access, code := w.register(t, cred.Secret.Reveal(), "vm-1", labels...)
	if code != http.StatusOK {
		t.Fatalf("register with the job token: %d", code)
	}
	if _, out := w.agentCall(t, http.MethodGet, "ping", access, nil); out["job"] != nil {
		t.Fatalf("an agent of a job token was offered a job: %v", out)
	}
	if c, _ := w.agentCall(t, http.MethodPut, "jobs/"+other+"/acquire", access, nil); c != http.StatusUnprocessableEntity {
		t.Fatalf("acquire another job: %d, want 422", c)
	}
	if c, _ := w.agentCall(t, http.MethodPut, "jobs/"+mine+"/acquire", access, nil); c != http.StatusOK {
		t.Fatalf("acquire its job: %d", c)
	}
	if _, code := w.register(t, cred.Secret.Reveal(), "vm-1b", labels...); code != http.StatusUnauthorized {
		t.Fatalf("second registration with a used job token: %d, want 401", code)
	}
	// A job an agent took binds no further claim, and the cluster token
	// made for that attempt is gone again.
	if _, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: "vm-2", Labels: labels, Job: mine, JobRepository: "acme/app"}); !errors.Is(err, workload.ErrJobNotBindable) {
		t.Fatalf("a claim for a job an agent took: %v, want ErrJobNotBindable", err)
	}
	for _, tok := range w.restTokens(t) {
		if strings.HasSuffix(tok["description"].(string), " vm-2") {
			t.Fatalf("the cluster token of a refused job claim stayed: %v", tok)
		}
	}

	// Expiry: a token unused past its lifetime registers nothing.
	b2, err := w.sim.CreateBuild("app", "go", []bksim.Step{{Command: "true", Agents: []string{"queue=linux"}}, {Command: "true", Agents: []string{"queue=linux"}}})
	if err != nil {
		t.Fatal(err)
	}
	late, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: "vm-3", Labels: labels, Job: b2.JobIDs[0], JobRepository: "acme/app"})
	if err != nil {
		t.Fatal(err)
	}
	w.clock.Advance(late.ExpiresAt.Sub(w.clock.Now()) + time.Second)
	if _, code := w.register(t, late.Secret.Reveal(), "vm-3", labels...); code != http.StatusUnauthorized {
		t.Fatalf("register with an expired job token: %d, want 401", code)
	}

	// A job of another queue, or named with another pipeline, binds
	// nothing.
	if _, err := w.sim.CreateQueue(w.cluster.ID, "gpu"); err != nil {
		t.Fatal(err)
	}
	gpu, err := w.sim.CreateBuild("app", "gpu", []bksim.Step{{Command: "true", Agents: []string{"queue=gpu"}}})
	if err != nil {
		t.Fatal(err)
	}
	for name, spec := range map[string]workload.RunnerSpec{
		"another queue":    {Name: "vm-5", Labels: labels, Job: gpu.JobIDs[0], JobRepository: "acme/app"},
		"another pipeline": {Name: "vm-6", Labels: labels, Job: b2.JobIDs[1], JobRepository: "acme/docs"},
	} {
		if _, err := p.IssueCredential(ctx, spec); !errors.Is(err, workload.ErrJobNotBindable) {
			t.Errorf("%s: %v, want ErrJobNotBindable", name, err)
		}
	}

	// Revocation: the claim ends before its VM registers.
	rev, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: "vm-4", Labels: labels, Job: b2.JobIDs[1], JobRepository: "acme/app"})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.DeregisterRunner(ctx, 0, "vm-4"); err != nil {
		t.Fatal(err)
	}
	if _, code := w.register(t, rev.Secret.Reveal(), "vm-4", labels...); code != http.StatusUnauthorized {
		t.Fatalf("register with a revoked job token: %d, want 401", code)
	}
}
