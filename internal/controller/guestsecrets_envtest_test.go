package controller_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// TestRestartBetweenMintAndDeliveryLeavesNoUsableRunner: an operator that
// stops after it issued a VM's JIT runner configuration and before its
// write into the running VM landed (the secret lived in its memory only)
// leaves no runner anyone could use: the next operator finds no delivery
// recorded (status.bootstrap.credentialDeliveredAt), removes the
// never-started runner of the claim's name, registers a new one and
// places that in the VM; the first configuration no longer connects, and
// the VM's runner runs the one job.
func TestRestartBetweenMintAndDeliveryLeavesNoUsableRunner(t *testing.T) {
	seeds := t.TempDir()
	sim := startSimCapturingSeeds(t, seeds)
	gs := startGitHub(t)

	// The first operator's write into the guest is held until it has
	// stopped, then dropped: the credential it issued reaches nobody.
	var (
		once    sync.Once
		firstMu sync.Mutex
		first   agentconfig.GuestSecrets
	)
	held, release := make(chan struct{}), make(chan struct{})
	hook := func(r *http.Request) {
		_, raw, ok := proxmoxsim.FileWriteRequest(r)
		if !ok {
			return
		}
		once.Do(func() {
			firstMu.Lock()
			first, _ = agentconfig.ParseGuestSecrets(raw)
			firstMu.Unlock()
			close(held)
			<-release
			r.URL.Path += "-dropped"
		})
	}
	sim.onRequest.Store(&hook)
	op := startOperator(t, operatorOptions{github: gs.Transport})
	f := newFixture(t, sim, nil)
	f.useGitHub(gs, nil)
	claim := f.newClaim("restart-runner")
	select {
	case <-held:
	case <-time.After(2 * time.Minute):
		t.Fatal("no credential was written into the VM within 2 minutes")
	}
	op.stop(t)
	close(release)
	sim.onRequest.Store(nil)
	firstMu.Lock()
	firstJIT := first.JITConfig
	firstMu.Unlock()
	if firstJIT == "" {
		t.Fatal("the held write carried no JIT configuration")
	}
	stored, err := getClaim(t, claim)
	if err != nil {
		t.Fatal(err)
	}
	// The issue and the delivery are persisted together, by the status
	// write of the pass that placed the credential, which the stop cut
	// short: nothing says the credential was delivered.
	if b := stored.Status.Bootstrap; b != nil && b.CredentialDeliveredAt != nil {
		t.Fatalf("before the restart status.bootstrap = %+v; want no delivery recorded", b)
	}
	firstIDs := runnerIDs(gs, "")

	op.restart(t, operatorOptions{github: gs.Transport})
	got := waitClaimBootstrapped(t, claim, hfv1.CredentialDeliveredReason)
	b := got.Status.Bootstrap
	if b.CredentialDeliveredAt == nil || b.RunnerID == 0 {
		t.Fatalf("status.bootstrap = %+v; want the credential delivered with its runner", b)
	}
	placed, _, err := sim.GuestFile(context.Background(), int(got.Status.VMRef.VMID), agentconfig.SecretsFile)
	if err != nil {
		t.Fatalf("the VM's secrets: %v", err)
	}
	doc, err := agentconfig.ParseGuestSecrets(placed)
	if err != nil || doc.JITConfig == "" || doc.JITConfig == firstJIT {
		t.Fatalf("the VM received %d characters of JIT configuration (%v), want a new one", len(doc.JITConfig), err)
	}
	// The first runner is removed: its configuration connects no runner.
	for _, id := range firstIDs {
		if id == b.RunnerID {
			t.Fatalf("the runner issued before the restart (%d) is the one delivered", id)
		}
	}
	if live := runnerIDs(gs, b.RunnerName); len(live) != 1 || live[0] != b.RunnerID {
		t.Fatalf("live runners named %s: %v; want only the delivered %d", b.RunnerName, live, b.RunnerID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out strings.Builder
	thief := &githubsim.JITRunner{Client: &http.Client{Transport: gs.Transport, Timeout: 30 * time.Second}, Out: &out, PollWait: time.Second}
	if _, err := thief.Run(ctx, firstJIT); err == nil {
		t.Fatalf("the JIT configuration issued before the restart still connects a runner:\n%s", out.String())
	}

	// The VM's runner (run here on the host with what the VM received)
	// runs the one job.
	proc := githubsimtest.StartScript(t, gs.InstallRunner(t), "run.sh", "--jitconfig", doc.JITConfig)
	job, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted", "hyperfleet"}, Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if code := proc.Wait(t, time.Minute); code != 0 {
		t.Fatalf("run.sh exited %d:\n%s", code, proc.Output())
	}
	if j, _ := gs.Sim.Job(job.ID); j.Status != "completed" || j.RunnerName != b.RunnerName {
		t.Fatalf("job %+v; want completed by %s", j, b.RunnerName)
	}
	ran := 0
	for _, r := range gs.Sim.State().RemovedRunners {
		ran += r.JobsRun
	}
	for _, r := range gs.Sim.Runners() {
		ran += r.JobsRun
	}
	if ran != 1 {
		t.Errorf("%d jobs run by the claim's runners, want 1", ran)
	}
}

// runnerIDs are the ids of the GitHub simulator's live runners, those
// named name when it is not empty.
func runnerIDs(gs *githubsimtest.Server, name string) []int64 {
	var ids []int64
	for _, r := range gs.Sim.Runners() {
		if name == "" || r.Name == name {
			ids = append(ids, r.ID)
		}
	}
	return ids
}

// waitClaimBootstrapped waits for the claim's Bootstrapped condition to
// have reason.
func waitClaimBootstrapped(t *testing.T, claim *hfv1.MachineClaim, reason hfv1.ConditionReason) *hfv1.MachineClaim {
	t.Helper()
	var got *hfv1.MachineClaim
	eventually(t, time.Minute, fmt.Sprintf("claim %s Bootstrapped %s", claim.Name, reason), func() error {
		var err error
		if got, err = getClaim(t, claim); err != nil {
			return err
		}
		if c := hfv1.FindCondition(got.Status.Conditions, hfv1.MachineClaimBootstrappedCondition); c == nil || c.Reason != string(reason) {
			return fmt.Errorf("Bootstrapped %+v", c)
		}
		return nil
	})
	return got
}
