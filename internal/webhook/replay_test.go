package webhook

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/demand"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github"
)

const replayPAT = "ghp_webhookReplayTestPATneverLeavesTheTest0"

// simReaders confirms every pool's jobs with one provider on the GitHub
// simulator.
type simReaders struct{ p workload.JobReader }

func (s simReaders) JobReaderFor(context.Context, types.NamespacedName) (workload.JobReader, error) {
	return s.p, nil
}

// payload is a workflow_job delivery body about job id of octo-org/app,
// with GitHub's times set to at.
func payload(id int64, action string, at time.Time) []byte {
	ts := at.UTC().Format(time.RFC3339)
	runner, started, completed, conclusion := "null", "null", "null", "null"
	if action != "queued" {
		runner, started = `"runner-1"`, `"`+ts+`"`
	}
	if action == "completed" {
		completed, conclusion = `"`+ts+`"`, `"success"`
	}
	return fmt.Appendf(nil, `{"action":%q,"workflow_job":{"id":%d,"run_id":5,"run_attempt":1,"status":%q,"labels":["self-hosted","replay"],`+
		`"runner_name":%s,"created_at":%q,"started_at":%s,"completed_at":%s,"conclusion":%s},"repository":{"full_name":"octo-org/app"}}`,
		action, id, action, runner, ts, started, completed, conclusion)
}

// TestReceiverReplayedAndForgedDeliveries sends deliveries through the
// real Receiver, Router and Recorder (confirming with the GitHub
// simulator) against a real API server: a signed queued delivery creates
// demand; a captured queued delivery of a finished job replayed an hour
// later under a fresh delivery id is accepted but creates none; a signed
// completed delivery for a job GitHub still has queued leaves its demand;
// a forged one is refused.
func TestReceiverReplayedAndForgedDeliveries(t *testing.T) {
	e := testEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gs := githubsimtest.Start(t, githubsim.Config{
		Organizations: []githubsim.OrgConfig{{Login: "octo-org"}},
		Repositories:  []githubsim.RepoConfig{{Name: "octo-org/app"}},
		PATs:          []githubsim.PATConfig{{Token: replayPAT, Login: "octocat"}},
	})
	provider, err := github.New(github.Config{BaseURL: gs.URL + "/api/v3", Scope: workload.Scope{Owner: "octo-org", Repository: "app"},
		Token: replayPAT, Transport: gs.Transport, RunnerURL: gs.URL + "/octo-org/app"})
	if err != nil {
		t.Fatal(err)
	}
	enqueue := func() int64 {
		j, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted", "replay"}, Duration: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return j.ID
	}
	waiting, finished := enqueue(), enqueue()
	if err := gs.Sim.CompleteJob(finished, "success"); err != nil {
		t.Fatal(err)
	}

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "replay-"}}
	if err := e.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	tmpl := &hfv1.HypervisorMachineTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "runner"},
		Spec: hfv1.HypervisorMachineTemplateSpec{
			HypervisorClusterRef: hfv1.ObjectName{Name: "pve"},
			Source:               hfv1.MachineSource{Proxmox: hfv1.ProxmoxSource{TemplateID: ptr.To[int32](9000)}},
			Resources:            hfv1.MachineResources{CPU: 2, Memory: resource.MustParse("2Gi")},
			Bootstrap: hfv1.Bootstrap{GitHub: &hfv1.GitHubBootstrap{
				Owner: "octo-org", Repository: "app",
				Credentials: hfv1.GitHubCredentials{PAT: &hfv1.LocalSecretKeySelector{Name: "github", Key: "token"}},
			}},
		},
	}
	pool := &hfv1.RunnerPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "replay"},
		Spec: hfv1.RunnerPoolSpec{
			TemplateRef: hfv1.ObjectName{Name: tmpl.Name},
			Workload:    hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{Labels: []string{"replay"}}},
			Scaling:     hfv1.Scaling{MaxReplicas: 5},
		},
	}
	for _, obj := range []client.Object{tmpl, pool} {
		if err := e.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	// As the RunnerPool controller records once the template's credentials
	// reach the pool's scope: routing only considers verified pools.
	pool.Status.ScopeVerification, _ = scopeVerification(pool, tmpl)
	meta.SetStatusCondition(&pool.Status.Conditions, metav1.Condition{Type: string(hfv1.RunnerPoolScopeVerifiedCondition), Status: metav1.ConditionTrue,
		Reason: string(hfv1.ScopeVerifiedReason), Message: "verified for the test", ObservedGeneration: pool.Generation})
	if err := e.Client.Status().Update(ctx, pool); err != nil {
		t.Fatal(err)
	}

	recv, err := NewReceiver(Options{
		Format:   github.WebhookFormat,
		Parser:   github.WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: testSecret}},
		Router:   demand.NewRouter(e.Client, ciPlatforms),
		Recorder: demand.NewRecorder(e.Client, e.Client, nil).ConfirmWebhookEvents(simReaders{provider}, 10*time.Minute),
	})
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = recv.Run(ctx) }()
	defer func() { cancel(); <-runDone }()
	srv := httptest.NewServer(recv)
	defer srv.Close()
	httpClient := srv.Client()
	url := srv.URL + github.WebhookFormat.Path
	now := time.Now()
	matched := jobsRoutedTotal.WithLabelValues(OutcomeMatched)
	matchedBefore := metricValue(matched)

	stateOf := func(id int64) (hfv1.CIJobState, bool) {
		var cj hfv1.CIJob
		err := e.Client.Get(ctx, types.NamespacedName{Namespace: ns.Name, Name: hfv1.CIJobName(hfv1.WorkloadGitHubActions, strconv.FormatInt(id, 10))}, &cj)
		if apierrors.IsNotFound(err) {
			return "", false
		}
		if err != nil {
			t.Fatal(err)
		}
		return cj.Status.State, true
	}
	waitState := func(id int64, want hfv1.CIJobState, what string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			got, ok := stateOf(id)
			if ok && got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: job %d recorded %q (exists %v), want %s", what, id, got, ok, want)
			}
		}
	}

	if resp := post(t, httpClient, url, "fresh-queued", payload(waiting, "queued", now), testSecret); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("signed delivery: %d, want 202", resp.StatusCode)
	}
	waitState(waiting, hfv1.CIJobQueued, "a signed queued delivery creates demand")

	// Replay: the body GitHub signed an hour ago, under a new delivery id.
	if resp := post(t, httpClient, url, "replayed-under-a-new-id", payload(finished, "queued", now.Add(-time.Hour)), testSecret); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("replayed delivery: %d, want 202 (it is signed; the recorder confirms it)", resp.StatusCode)
	}
	waitState(finished, hfv1.CIJobCompleted, "a replayed queued delivery of a finished job creates no demand")

	if resp := post(t, httpClient, url, "forged-completed", payload(waiting, "completed", now), []byte("a leaked or guessed secret")); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("forged delivery: %d, want 401", resp.StatusCode)
	}
	// Signed but out of order (GitHub has the job queued): the recorder
	// asks GitHub and the job keeps its demand. Its processing shows in
	// the routing counter (the third matched job of this test).
	if resp := post(t, httpClient, url, "early-completed", payload(waiting, "completed", now), testSecret); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("out-of-order completed delivery: %d, want 202", resp.StatusCode)
	}
	for deadline := time.Now().Add(30 * time.Second); metricValue(matched)-matchedBefore < 3; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the out-of-order completed delivery was not processed")
		}
	}
	if got, _ := stateOf(waiting); got != hfv1.CIJobQueued {
		t.Fatalf("an unconfirmed completed delivery moved job %d to %s; GitHub has it queued", waiting, got)
	}

	// A fresh in_progress signed with the fallback secret, which every
	// owner whose webhook uses it holds (no owner here has its own key):
	// GitHub has the job queued, so it keeps its demand and no runner.
	confirmations := metricValue(confirmationsTotal("shared_secret"))
	if resp := post(t, httpClient, url, "forged-in-progress", payload(waiting, "in_progress", now), testSecret); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("in_progress delivery signed with the fallback: %d, want 202", resp.StatusCode)
	}
	for deadline := time.Now().Add(30 * time.Second); metricValue(matched)-matchedBefore < 4; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the in_progress delivery was not processed")
		}
	}
	var cj hfv1.CIJob
	if err := e.Client.Get(ctx, types.NamespacedName{Namespace: ns.Name, Name: hfv1.CIJobName(hfv1.WorkloadGitHubActions, strconv.FormatInt(waiting, 10))}, &cj); err != nil {
		t.Fatal(err)
	}
	if cj.Status.State != hfv1.CIJobQueued || cj.Status.RunnerName != "" || metricValue(confirmationsTotal("shared_secret")) != confirmations+1 {
		t.Fatalf("after a fresh in_progress signed with the fallback secret: status %+v, %v confirmations; want queued without a runner, confirmed once",
			cj.Status, metricValue(confirmationsTotal("shared_secret"))-confirmations)
	}
}

// confirmationsTotal is the counter of webhook events confirmed with the
// CI platform for reason.
func confirmationsTotal(reason string) prometheus.Counter {
	return metrics.WebhookConfirmations.WithLabelValues(reason)
}
