//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	buildkitesim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite/buildkitesimtest"
)

// poolLeftovers says what is left of the world's RunnerPool named pool:
// its claims, and any VM or ISO; nil when nothing is.
func poolLeftovers(ctx context.Context, w *devenv.World, pool string) error {
	var claims hfv1.MachineClaimList
	if err := w.API.Client.List(ctx, &claims, client.InNamespace(devenv.Namespace), client.MatchingLabels{hfv1.RunnerPoolLabel: pool}); err != nil {
		return err
	}
	snap, err := w.Snapshot(ctx)
	if err != nil {
		return err
	}
	if len(claims.Items) != 0 || len(snap.VMs) != 0 || len(snap.ISOs) != 0 {
		return fmt.Errorf("%d claims left; %s", len(claims.Items), summary(snap))
	}
	return nil
}

// waitPoolVerified waits for the world's RunnerPool named pool to have
// its CI platform scope verified.
func waitPoolVerified(t *testing.T, w *devenv.World, pool string) {
	t.Helper()
	eventually(t, 3*time.Minute, "pool "+pool+" verified", func() error {
		var p hfv1.RunnerPool
		if err := w.API.Client.Get(context.Background(), client.ObjectKey{Namespace: devenv.Namespace, Name: pool}, &p); err != nil {
			return err
		}
		if !hfv1.IsConditionTrue(p.Status.Conditions, hfv1.RunnerPoolScopeVerifiedCondition) {
			return fmt.Errorf("conditions %+v", p.Status.Conditions)
		}
		return nil
	})
}

// TestBuildkitePoolRunsJobs: a Buildkite RunnerPool (queue linux, no idle
// VMs) runs a build of three real shell jobs end to end. The simulator's
// signed job.scheduled webhooks make the pool create VMs; each VM's agent
// downloads the real buildkite-agent (hack/buildkite-agent) from the
// simulator's release tarball, checks its SHA-256, and runs it. The pool
// makes each VM for one queued job (spec.workloadConfig.buildkite.jobID),
// so each agent registers with a job acquisition token for that job,
// issued with a cluster agent token made for the claim, and runs
// `buildkite-agent start --acquire-job`: each job runs on the agent of the
// claim made for it. The agent exits, and the VM powers off and is
// destroyed. Then the credential-lifetime check: every per-VM cluster
// token was deleted when its claim ended, every job token lived at most an
// hour, and none of them can register an agent again.
func TestBuildkitePoolRunsJobs(t *testing.T) {
	w, wt := startWorld(t, func(o *devenv.Options) {
		o.Buildkite, o.BuildkiteAgentBinary = true, buildkitesimtest.AgentBinary(t)
	})
	ctx := context.Background()
	const pool = "bk-linux"
	if err := w.AddBuildkitePool(ctx, devenv.BuildkitePoolSpec{Name: pool, Queue: "linux", MaxReplicas: 3}); err != nil {
		t.Fatal(err)
	}
	waitPoolVerified(t, w, pool)

	sim := w.Buildkite.Sim
	var steps []buildkitesim.Step
	for i := range 3 {
		steps = append(steps, buildkitesim.Step{Key: fmt.Sprintf("step-%d", i), Agents: []string{"queue=linux"},
			Command: fmt.Sprintf(`echo "step %d on $(hostname) in $PWD"; test "$BUILDKITE_JOB_ID" != ""`, i)})
	}
	build, err := sim.CreateBuild(devenv.BuildkitePipeline, "e2e", steps)
	if err != nil {
		t.Fatal(err)
	}

	// The job each claim of the pool was made for, as seen while they live.
	boundJob := map[string]string{}
	eventually(t, 4*time.Minute, "every job passed", func() error {
		var claims hfv1.MachineClaimList
		if err := w.API.Client.List(ctx, &claims, client.InNamespace(devenv.Namespace), client.MatchingLabels{hfv1.RunnerPoolLabel: pool}); err != nil {
			return err
		}
		for _, c := range claims.Items {
			if wc := c.Spec.WorkloadConfig; wc != nil && wc.Buildkite != nil {
				boundJob[c.Name] = wc.Buildkite.JobID
			}
		}
		for i, id := range build.JobIDs {
			if j, _ := sim.Job(id); j.State != "passed" {
				return fmt.Errorf("job %d is %s", i, j.State)
			}
		}
		return nil
	})
	agents := map[string]string{}
	for i, id := range build.JobIDs {
		j, _ := sim.Job(id)
		if j.ExitStatus == nil || *j.ExitStatus != 0 || !strings.Contains(j.Log, fmt.Sprintf("step %d on", i)) {
			t.Errorf("job %d: exit %v, log %q", i, j.ExitStatus, j.Log)
		}
		if other, dup := agents[j.Agent]; dup {
			t.Errorf("agent %q ran %s and %s: a VM ran two jobs", j.Agent, other, id)
		}
		agents[j.Agent] = id
		// An agent is named <claim>-<uid part>-<install mark> and its VM
		// after the claim: the job ran in a VM the operator created.
		vm := j.Agent
		for range 2 {
			vm = vm[:max(strings.LastIndex(vm, "-"), 0)]
		}
		wt.mu.Lock()
		_, created := wt.vmNames[vm]
		wt.mu.Unlock()
		if !strings.HasPrefix(j.Agent, pool+"-") || !created {
			t.Errorf("job %d ran on agent %q, not one of the pool's VMs (VM %q)", i, j.Agent, vm)
		}
		// Made for this job: its claim names it, and its agent registered
		// with a job acquisition token for it.
		if b, seen := boundJob[vm]; seen && b != id {
			t.Errorf("job %d ran on the VM of claim %s, which was made for job %q", i, vm, b)
		}
		for _, a := range sim.Agents() {
			if a.Name == j.Agent && a.AcquireJob != id {
				t.Errorf("job %d ran on agent %s, which registered for job %q", i, a.Name, a.AcquireJob)
			}
		}
	}
	if len(boundJob) == 0 {
		t.Error("no claim of the pool was seen while it lived")
	}

	eventually(t, 3*time.Minute, "the pool's claims and VMs gone", func() error { return poolLeftovers(ctx, w, pool) })
	// Each agent is gone: it disconnected, or (its VM destroyed as soon
	// as its job finished, before the agent said goodbye) the operator
	// stopped it when its claim ended; none holds a job.
	for _, a := range sim.Agents() {
		if a.State == "connected" && !a.StopRequested || a.Job != "" {
			t.Errorf("agent %s after its VM went: %s, stop requested %v, job %q", a.Name, a.State, a.StopRequested, a.Job)
		}
	}

	// No credential outlives its VM: each per-VM token is deleted, and
	// the agent API refuses it.
	tokens, err := sim.Tokens(w.Buildkite.ClusterID)
	if err != nil {
		t.Fatal(err)
	}
	perVM := 0
	pool509 := x509.NewCertPool()
	pool509.AppendCertsFromPEM(w.SimulatorCA())
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool509, MinVersion: tls.VersionTLS12}}}
	for _, tok := range tokens {
		if !strings.HasPrefix(tok.Description, "hyperfleet agent ") {
			continue
		}
		perVM++
		if !tok.Deleted {
			t.Errorf("token %s (%s) not deleted after its claim ended", tok.ID, tok.Description)
		}
		req, _ := http.NewRequest(http.MethodPost, w.Buildkite.URL+"/v3/register", bytes.NewReader([]byte(`{"name":"thief"}`)))
		req.Header.Set("Authorization", "Token "+tok.Secret)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("registering with the ended claim's token %s: HTTP %d, want 401", tok.Description, resp.StatusCode)
		}
	}
	// Each job token was issued for one job, lived at most an hour, and
	// registers nothing once its claim ended (its issuing token deleted).
	jats := sim.JobTokens()
	if len(jats) < len(build.JobIDs) {
		t.Errorf("%d job acquisition tokens for %d jobs", len(jats), len(build.JobIDs))
	}
	for _, jt := range jats {
		if !strings.HasPrefix(jt.Token, "bkjat_") || jt.ExpiresAt.Sub(jt.IssuedAt) > time.Hour || !strings.HasPrefix(jt.Issuer, "hyperfleet agent ") {
			t.Errorf("job token for %s: %+v", jt.Job, jt)
		}
		req, _ := http.NewRequest(http.MethodPost, w.Buildkite.URL+"/v3/register", bytes.NewReader([]byte(`{"name":"thief"}`)))
		req.Header.Set("Authorization", "Token "+jt.Token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("registering with the job token of %s after its claim ended: HTTP %d, want 401", jt.Job, resp.StatusCode)
		}
	}
	wt.stop()
	wt.mu.Lock()
	defer wt.mu.Unlock()
	if len(wt.leaks) > 0 {
		t.Errorf("an operator credential appeared in: %s", strings.Join(wt.leaks, ", "))
	}
	if perVM < len(build.JobIDs) {
		t.Errorf("%d per-VM agent tokens for %d jobs", perVM, len(build.JobIDs))
	}
}

// TestBuildkiteDevWorld is what `make dev DEV_FLAGS=--platform buildkite`
// runs: the world's own template and pool on Buildkite
// (devenv.Options.Platform), jobs queued with QueueJobs (builds of one
// step on queue JobLabel), and the snapshot the live table and
// --exit-when-done read: every job passed on an agent of the pool's VMs,
// then nothing left (no claim, VM, seed ISO or live agent).
func TestBuildkiteDevWorld(t *testing.T) {
	w, _ := startWorld(t, func(o *devenv.Options) {
		o.Platform, o.BuildkiteAgentBinary = hfv1.WorkloadBuildkite, buildkitesimtest.AgentBinary(t)
	})
	ctx := context.Background()
	var pool hfv1.RunnerPool
	if err := w.API.Client.Get(ctx, client.ObjectKey{Namespace: devenv.Namespace, Name: devenv.PoolName}, &pool); err != nil {
		t.Fatal(err)
	}
	if pool.Spec.Workload.Type != hfv1.WorkloadBuildkite || pool.Spec.Workload.Buildkite.Queue != devenv.JobLabel {
		t.Fatalf("the world's pool is %+v, want Buildkite queue %s", pool.Spec.Workload, devenv.JobLabel)
	}
	const jobs = 2
	if err := w.QueueJobs(jobs, time.Second); err != nil {
		t.Fatal(err)
	}
	var snap devenv.Snapshot
	eventually(t, 4*time.Minute, "every job ran and the pool is back to zero", func() error {
		var err error
		if snap, err = w.Snapshot(ctx); err != nil {
			return err
		}
		if len(snap.PlatformJobs) != jobs || !snap.Done(0) {
			return fmt.Errorf("jobs %+v, %s, agents %+v", snap.PlatformJobs, summary(snap), snap.PlatformRunners)
		}
		return nil
	})
	if snap.Platform != "Buildkite" || len(snap.Jobs) != 0 {
		t.Errorf("snapshot of platform %q with %d GitHub jobs", snap.Platform, len(snap.Jobs))
	}
	for _, j := range snap.PlatformJobs {
		if j.Conclusion != "passed" || !strings.HasPrefix(j.RunnerName, devenv.PoolName+"-") {
			t.Errorf("job %+v: want passed on an agent of pool %s", j, devenv.PoolName)
		}
	}
}

// TestBuildkiteWarmVMBoundToJob: a Buildkite pool with a warm VM
// (minReplicas 1). The warm VM boots and stands by with no credential: its
// claim is Bootstrapped (reason WaitingForJob), no cluster agent token is
// made for it and no agent registers. A build's job.scheduled webhook
// makes the pool bind the job to that claim (its jobID), and the VM's
// agent, learning the job from the credential the operator then places,
// runs it with a job acquisition token: the job runs on the warm VM, not
// on a VM made for it. Once the agent registered, the claim's cluster token
// is deleted. Then the pool shrinks to nothing.
func TestBuildkiteWarmVMBoundToJob(t *testing.T) {
	w, _ := startWorld(t, func(o *devenv.Options) {
		o.Buildkite, o.BuildkiteAgentBinary = true, buildkitesimtest.AgentBinary(t)
	})
	ctx := context.Background()
	const pool = "bk-warm"
	if err := w.AddBuildkitePool(ctx, devenv.BuildkitePoolSpec{Name: pool, Queue: "warm", MinReplicas: 1, MaxReplicas: 2}); err != nil {
		t.Fatal(err)
	}
	waitPoolVerified(t, w, pool)
	sim := w.Buildkite.Sim
	perVM := func() []buildkitesim.TokenInfo {
		toks, err := sim.TokensDescribed(w.Buildkite.ClusterID, "hyperfleet agent ")
		if err != nil {
			t.Fatal(err)
		}
		return toks
	}

	var warm hfv1.MachineClaim
	eventually(t, 3*time.Minute, "the warm VM stands by", func() error {
		var claims hfv1.MachineClaimList
		if err := w.API.Client.List(ctx, &claims, client.InNamespace(devenv.Namespace), client.MatchingLabels{hfv1.RunnerPoolLabel: pool}); err != nil {
			return err
		}
		for _, c := range claims.Items {
			cond := hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimBootstrappedCondition)
			if cond != nil && cond.Status == "True" && cond.Reason == string(hfv1.WaitingForJobReason) {
				warm = c
				return nil
			}
		}
		return fmt.Errorf("%d claims, none standing by", len(claims.Items))
	})
	if wc := warm.Spec.WorkloadConfig; wc == nil || wc.Buildkite == nil || wc.Buildkite.JobID != "" {
		t.Fatalf("the warm claim is bound already: %+v", wc)
	}
	if toks := perVM(); len(toks) != 0 {
		t.Fatalf("cluster agent tokens made for a warm VM: %+v", toks)
	}
	if agents := sim.Agents(); len(agents) != 0 {
		t.Fatalf("agents registered before any job: %+v", agents)
	}

	build, err := sim.CreateBuild(devenv.BuildkitePipeline, "warm", []buildkitesim.Step{{Key: "warm", Agents: []string{"queue=warm"},
		Command: `echo "ran on $BUILDKITE_AGENT_NAME"; test "$BUILDKITE_JOB_ID" != ""`}})
	if err != nil {
		t.Fatal(err)
	}
	job := build.JobIDs[0]
	eventually(t, 4*time.Minute, "the job passed", func() error {
		if j, _ := sim.Job(job); j.State != "passed" {
			return fmt.Errorf("job is %s", j.State)
		}
		return nil
	})
	j, _ := sim.Job(job)
	if !strings.HasPrefix(j.Agent, warm.Name+"-") {
		t.Errorf("the job ran on agent %s, not on the warm VM of claim %s", j.Agent, warm.Name)
	}
	for _, a := range sim.Agents() {
		if a.Name == j.Agent && a.AcquireJob != job {
			t.Errorf("the warm VM's agent registered for job %q, not with a job token for %s", a.AcquireJob, job)
		}
	}
	var bound hfv1.MachineClaim
	if err := w.API.Client.Get(ctx, client.ObjectKeyFromObject(&warm), &bound); err == nil {
		if got := bound.Spec.WorkloadConfig.Buildkite.JobID; got != job {
			t.Errorf("the warm claim is bound to %q, want %s", got, job)
		}
	}
	eventually(t, 2*time.Minute, "the warm claim's cluster token deleted", func() error {
		for _, tok := range perVM() {
			if strings.HasSuffix(tok.Description, " "+j.Agent) && !tok.Deleted {
				return fmt.Errorf("token %s stays", tok.Description)
			}
		}
		return nil
	})

	// The pool shrinks to nothing.
	var p hfv1.RunnerPool
	if err := w.API.Client.Get(ctx, client.ObjectKey{Namespace: devenv.Namespace, Name: pool}, &p); err != nil {
		t.Fatal(err)
	}
	p.Spec.Scaling.MinReplicas = 0
	p.Spec.Scaling.ScaleDownDelay = &metav1.Duration{Duration: time.Second}
	if err := w.API.Client.Update(ctx, &p); err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*time.Minute, "the pool's claims and VMs gone", func() error { return poolLeftovers(ctx, w, pool) })
	for _, tok := range perVM() {
		if !tok.Deleted {
			t.Errorf("token %s not deleted after its claim ended", tok.Description)
		}
	}
}
