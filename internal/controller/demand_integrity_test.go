package controller_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
)

// dropNextWebhook makes the simulator lose the webhook of the next event
// (run sends it), and checks that it was the one of job the returned id.
func (w *poolWorld) dropNextWebhook(action string, run func() int64) int64 {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.gs.Sim.FlushWebhooks(ctx); err != nil {
		w.t.Fatal(err)
	}
	w.gs.Sim.DropWebhooks(1, 0)
	id := run()
	if err := w.gs.Sim.FlushWebhooks(ctx); err != nil {
		w.t.Fatal(err)
	}
	for _, d := range w.gs.Sim.Deliveries() {
		if d.JobID == id && d.Action == action && d.Dropped {
			return id
		}
	}
	w.t.Fatalf("the %s webhook of job %d was not the one dropped", action, id)
	return 0
}

// forgeInProgress sends the operator's receiver an in_progress delivery
// for job, naming runner, signed with secret: what anyone holding that
// secret can send.
func (w *poolWorld) forgeInProgress(job githubsim.Job, runner, secret string) {
	w.t.Helper()
	now := time.Now().UTC().Format(time.RFC3339)
	owner, _, _ := strings.Cut(job.Repository, "/")
	body, err := json.Marshal(map[string]any{
		"action": "in_progress",
		"workflow_job": map[string]any{
			"id": job.ID, "run_id": job.RunID, "run_attempt": 1, "status": "in_progress", "labels": job.Labels,
			"name": job.Name, "workflow_name": job.WorkflowName, "runner_id": 4242, "runner_name": runner,
			"created_at": job.CreatedAt.UTC().Format(time.RFC3339), "started_at": now,
		},
		"repository":   map[string]any{"full_name": job.Repository},
		"organization": map[string]any{"login": owner},
	})
	if err != nil {
		w.t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, "https://"+w.op.components.Webhook.Addr().String()+"/webhooks/github", bytes.NewReader(body))
	if err != nil {
		w.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", "workflow_job")
	req.Header.Set("X-GitHub-Delivery", fmt.Sprintf("forged-%d", job.ID))
	req.Header.Set("X-Hub-Signature-256", githubsim.SignPayload(secret, body))
	resp, err := w.hookClient.Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		w.t.Fatalf("forged delivery: %d, want 202 (it is validly signed)", resp.StatusCode)
	}
}

// waitRunning waits until a runner took the job, and returns it.
func (w *poolWorld) waitRunning(id int64) githubsim.Job {
	w.t.Helper()
	var j githubsim.Job
	eventually(w.t, 3*time.Minute, "the job runs", func() error {
		if j, _ = w.gs.Sim.Job(id); j.Status != "in_progress" {
			return fmt.Errorf("job %d is %s; claims: %s", id, j.Status, w.claimSummary())
		}
		return nil
	})
	return j
}

// claimOfRunner is the pool's claim whose runner is name.
func (w *poolWorld) claimOfRunner(p *hfv1.RunnerPool, name string) *hfv1.MachineClaim {
	w.t.Helper()
	for _, c := range w.claims(p) {
		if c.Status.Bootstrap != nil && c.Status.Bootstrap.RunnerName == name {
			return &c
		}
	}
	w.t.Fatalf("no claim of pool %s has runner %s; claims: %s", p.Name, name, w.claimSummary())
	return nil
}

// TestForgedInProgressDoesNotStarveAQueuedJob: with the shared fallback
// secret accepted, the pool says so (WebhookSecretShared). A job's queued
// webhook is lost, and a fresh in_progress for it, signed with the
// fallback secret (which every owner whose webhook uses it holds), names
// the runner of a claim that is busy with another job. Recorded as
// delivered, it took the job out of the pool's demand for good (nothing
// moves a record back, the resync skips a recorded job) and gave the busy
// claim a job it never ran. Confirmed with GitHub, the job stays demand,
// gets a VM of its own and runs; the busy claim keeps its own job.
func TestForgedInProgressDoesNotStarveAQueuedJob(t *testing.T) {
	w := startPoolWorld(t, poolWorldOptions{sharedSecret: true})
	pool := w.newPool("forged", nil)
	w.waitPool(pool, "the pool reports the shared secret", 30*time.Second, func(p *hfv1.RunnerPool) error {
		c := hfv1.FindCondition(p.Status.Conditions, hfv1.RunnerPoolWebhookSecretSharedCondition)
		if c == nil || c.Status != "True" || c.Reason != string(hfv1.SharedWebhookSecretReason) || !strings.Contains(c.Message, "owner.octo-org") {
			return fmt.Errorf("WebhookSecretShared %+v", c)
		}
		return nil
	})
	if reasons := poolEventReasons(t, pool); reasons[string(hfv1.SharedWebhookSecretReason)] == 0 {
		t.Errorf("no %s warning event: %v", hfv1.SharedWebhookSecretReason, reasons)
	}

	// A busy claim: its runner runs a long job.
	busy := w.enqueue("forged", 1, 10*time.Minute)[0]
	busyJob := w.waitRunning(busy)
	victim := w.dropNextWebhook("queued", func() int64 { return w.enqueue("forged", 1, time.Second)[0] })
	victimJob, _ := w.gs.Sim.Job(victim)
	w.forgeInProgress(victimJob, busyJob.RunnerName, poolWebhookSecret)
	var record hfv1.CIJob
	eventually(t, 30*time.Second, "the forged delivery recorded", func() error {
		return env.Client.Get(context.Background(), client.ObjectKey{Namespace: pool.Namespace, Name: hfv1.CIJobName(hfv1.WorkloadGitHubActions, strconv.FormatInt(victim, 10))}, &record)
	})
	if record.Status.RunnerName == busyJob.RunnerName {
		t.Errorf("job %d recorded %s on the busy runner %s, as the forged delivery says; GitHub has it queued", victim, record.Status.State, busyJob.RunnerName)
	}

	w.waitJobs([]int64{victim}, 3*time.Minute)
	if j, _ := w.gs.Sim.Job(victim); j.RunnerName == busyJob.RunnerName {
		t.Errorf("job %d ran on the busy runner %s", victim, j.RunnerName)
	}
	claim := w.claimOfRunner(pool, busyJob.RunnerName)
	if got := claim.Status.Bootstrap.JobID; got != busy {
		t.Errorf("the busy claim %s records job %d, want its own job %d", claim.Name, got, busy)
	}
	var events corev1.EventList
	if err := env.Client.List(context.Background(), &events, client.InNamespace(pool.Namespace)); err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		if e.InvolvedObject.Name == claim.Name && e.Reason == "JobStarted" && strings.Contains(e.Message, fmt.Sprint(victim)) {
			t.Errorf("the busy claim was told it took the forged job: %s", e.Message)
		}
	}
	if err := w.gs.Sim.CompleteJob(busy, "success"); err != nil {
		t.Fatal(err)
	}
	w.assertDrained(pool, 2*time.Minute)
}

// TestResyncFindsQueuedJobInStartedRun: a matrix build, one of whose jobs
// runs while the other's queued webhook was lost: its run is in_progress,
// not queued, and the resync must look there too.
func TestResyncFindsQueuedJobInStartedRun(t *testing.T) {
	w := startPoolWorld(t, poolWorldOptions{})
	pool := w.newPool("matrix", nil)
	first := w.enqueue("matrix", 1, 10*time.Minute)[0]
	run := w.waitRunning(first)
	second := w.dropNextWebhook("queued", func() int64 {
		j, err := w.gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted", "matrix"}, Duration: time.Second, RunID: run.RunID})
		if err != nil {
			t.Fatal(err)
		}
		return j.ID
	})
	w.waitJobs([]int64{second}, 3*time.Minute)
	if err := w.gs.Sim.CompleteJob(first, "success"); err != nil {
		t.Fatal(err)
	}
	w.assertDrained(pool, 2*time.Minute)
}

// TestResyncFindsJobOfUnseenRepository: an organization pool, and a job of
// a repository of the organization no job was recorded from, whose
// webhook was lost: the resync scans the organization's repositories, not
// only those it has seen.
func TestResyncFindsJobOfUnseenRepository(t *testing.T) {
	w := startPoolWorld(t, poolWorldOptions{github: func(c *githubsim.Config) {
		c.Repositories = append(c.Repositories, githubsim.RepoConfig{Name: "octo-org/unseen"})
	}})
	pool := w.newPool("org", nil)
	if p := w.pool(pool); p.Spec.Workload.GitHub.Repository != "" {
		t.Fatalf("the pool is not an organization pool: %+v", p.Spec.Workload.GitHub)
	}
	id := w.dropNextWebhook("queued", func() int64 {
		j, err := w.gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/unseen", Labels: []string{"self-hosted", "org"}, Duration: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return j.ID
	})
	w.waitJobs([]int64{id}, 3*time.Minute)
	w.assertDrained(pool, 2*time.Minute)
}
