//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	gitlabsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/gitlab"
)

// TestGitLabPoolRunsJobs: a GitLab RunnerPool (tag linux, no idle VMs)
// runs three real shell jobs end to end. The first job is created while
// the group has no hook, so only the operator's resync of pending jobs
// finds it; the other two reach it as Job Hooks. For each job the
// operator creates a runner of its own at GitLab and a VM, whose agent
// downloads gitlab-runner (the simulator's stand-in, checked against its
// SHA-256), runs `run-single` with the runner's token for one job and
// exits; the VM powers off and is destroyed and the runner deleted. Then
// the credential-lifetime check: no runner the operator created is left,
// and GitLab refuses each one's token.
func TestGitLabPoolRunsJobs(t *testing.T) {
	w, wt := startWorld(t, func(o *devenv.Options) { o.GitLab = true })
	ctx := context.Background()
	const pool = "gl-linux"
	if err := w.AddGitLabPool(ctx, devenv.GitLabPoolSpec{Name: pool, Tags: []string{"linux"}, MaxReplicas: 3}); err != nil {
		t.Fatal(err)
	}
	waitPoolVerified(t, w, pool)

	sim := w.GitLab.Sim
	job := func(i int) gitlabsim.JobConfig {
		return gitlabsim.JobConfig{Name: fmt.Sprintf("job-%d", i), Tags: []string{"linux"},
			Script: []string{fmt.Sprintf(`echo "job %d on $(hostname) in $PWD"`, i), `test -n "$CI_JOB_TOKEN"`}}
	}
	// Known by the resync alone: no hook while it is created.
	w.GitLab.PauseHooks()
	resynced, err := sim.CreatePipeline(gitlabsim.PipelineRequest{Project: devenv.GitLabProject, Jobs: []gitlabsim.JobConfig{job(0)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.GitLab.ResumeHooks(); err != nil {
		t.Fatal(err)
	}
	hooked, err := sim.CreatePipeline(gitlabsim.PipelineRequest{Project: devenv.GitLabProject, Jobs: []gitlabsim.JobConfig{job(1), job(2)}})
	if err != nil {
		t.Fatal(err)
	}
	jobs := append(append([]int64(nil), resynced.Jobs...), hooked.Jobs...)

	eventually(t, 4*time.Minute, "every job succeeded", func() error {
		for i, id := range jobs {
			if j, _ := sim.Job(id); j.Status != gitlabsim.StatusSuccess {
				return fmt.Errorf("job %d is %s", i, j.Status)
			}
		}
		return nil
	})
	for _, d := range sim.Deliveries() {
		if d.JobID == resynced.Jobs[0] && d.Status == gitlabsim.StatusPending {
			t.Errorf("job 0's pending event was delivered (%+v); it must reach the operator by the resync alone", d)
		}
	}
	issued := map[int64]gitlabsim.IssuedRunner{}
	for _, r := range sim.IssuedRunners() {
		issued[r.ID] = r
	}
	runners := map[int64]int{}
	for i, id := range jobs {
		j, _ := sim.Job(id)
		if j.ExitCode == nil || *j.ExitCode != 0 || !strings.Contains(j.Trace, fmt.Sprintf("job %d on", i)) {
			t.Errorf("job %d: exit %v, trace %q", i, j.ExitCode, j.Trace)
		}
		if other, dup := runners[j.RunnerID]; dup {
			t.Errorf("runner %d ran jobs %d and %d: a VM ran two jobs", j.RunnerID, other, i)
		}
		runners[j.RunnerID] = i
		// A runner is described <claim>-<uid part>-<install mark> and its
		// VM named after the claim: the job ran in a VM the operator
		// created.
		r := issued[j.RunnerID]
		vm := r.Description
		for range 2 {
			vm = vm[:max(strings.LastIndex(vm, "-"), 0)]
		}
		wt.mu.Lock()
		_, created := wt.vmNames[vm]
		wt.mu.Unlock()
		if !strings.HasPrefix(r.Description, pool+"-") || !created {
			t.Errorf("job %d ran on runner %d %q, not one of the pool's VMs", i, j.RunnerID, r.Description)
		}
	}

	eventually(t, 3*time.Minute, "the pool's claims, VMs and runners gone", func() error {
		if err := poolLeftovers(ctx, w, pool); err != nil {
			return err
		}
		if live := sim.Runners(); len(live) != 0 {
			return fmt.Errorf("%d runners left at GitLab: %+v", len(live), live)
		}
		return nil
	})

	// No credential outlives its VM: each runner the operator created is
	// deleted, and the runner API refuses its token.
	pool509 := x509.NewCertPool()
	pool509.AppendCertsFromPEM(w.SimulatorCA())
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool509, MinVersion: tls.VersionTLS12}}}
	perVM := 0
	for _, r := range sim.IssuedRunners() {
		perVM++
		if r.Live {
			t.Errorf("runner %d (%s) not deleted after its claim ended", r.ID, r.Description)
		}
		body, _ := json.Marshal(map[string]string{"token": r.Token, "system_id": "s_thief0000000"})
		resp, err := hc.Post(w.GitLab.URL+"/api/v4/runners/verify", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("verifying the ended claim's runner token (%s): HTTP %d, want 403", r.Description, resp.StatusCode)
		}
	}
	wt.stop()
	wt.mu.Lock()
	defer wt.mu.Unlock()
	if len(wt.leaks) > 0 {
		t.Errorf("an operator credential appeared in: %s", strings.Join(wt.leaks, ", "))
	}
	if perVM < len(jobs) {
		t.Errorf("%d runners for %d jobs", perVM, len(jobs))
	}
}

// TestGitLabDevWorld is what `make dev DEV_FLAGS=--platform gitlab` runs:
// the world's own template and pool on GitLab (devenv.Options.Platform),
// jobs queued with QueueJobs (pipelines of one job tagged JobLabel), and
// the snapshot the live table and --exit-when-done read: every job
// succeeded on a runner of the pool's VMs, then nothing left (no claim,
// VM, seed ISO or runner at GitLab).
func TestGitLabDevWorld(t *testing.T) {
	w, _ := startWorld(t, func(o *devenv.Options) { o.Platform = hfv1.WorkloadGitLabCI })
	ctx := context.Background()
	var pool hfv1.RunnerPool
	if err := w.API.Client.Get(ctx, client.ObjectKey{Namespace: devenv.Namespace, Name: devenv.PoolName}, &pool); err != nil {
		t.Fatal(err)
	}
	if pool.Spec.Workload.Type != hfv1.WorkloadGitLabCI || pool.Spec.Workload.GitLab == nil ||
		strings.Join(pool.Spec.Workload.GitLab.Tags, ",") != devenv.JobLabel {
		t.Fatalf("the world's pool is %+v, want GitLab tag %s", pool.Spec.Workload, devenv.JobLabel)
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
			return fmt.Errorf("jobs %+v, %s, runners %+v", snap.PlatformJobs, summary(snap), snap.PlatformRunners)
		}
		return nil
	})
	if snap.Platform != "GitLab" || len(snap.Jobs) != 0 {
		t.Errorf("snapshot of platform %q with %d GitHub jobs", snap.Platform, len(snap.Jobs))
	}
	ran := map[string]bool{}
	for _, j := range snap.PlatformJobs {
		if j.Conclusion != gitlabsim.StatusSuccess || !strings.HasPrefix(j.RunnerName, devenv.PoolName+"-") || ran[j.RunnerName] {
			t.Errorf("job %+v: want success on a runner of pool %s of its own", j, devenv.PoolName)
		}
		ran[j.RunnerName] = true
	}
	if live := w.GitLab.Sim.Runners(); len(live) != 0 {
		t.Errorf("%d runners left at GitLab: %+v", len(live), live)
	}
}
