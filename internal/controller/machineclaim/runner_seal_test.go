package machineclaim

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gl "gitlab.com/gitlab-org/api/client-go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	gitlabsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/gitlab"
	"github.com/hyperfleet/hyperfleet/internal/workloads"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

const sealOwnerPAT = "glpat-sealowner0000000000"

// sealWorld is one GitLab claim's world: the GitLab simulator (group acme,
// project acme/app) behind the operator's own GitLab back-end, whose calls
// to pause a runner (PUT /runners/:id) it counts, and a fake API server
// holding the claim's template, token Secret, pool and cluster.
type sealWorld struct {
	sim     *gitlabsim.Simulator
	srv     *httptest.Server
	kube    client.Client
	ci      *workloads.Platforms
	pauses  atomic.Int64
	tmpl    *hfv1.HypervisorMachineTemplate
	pool    *hfv1.RunnerPool
	runners *RunnerObservations
}

// countPauses counts the operator's PUT /runners/:id calls.
type countPauses struct {
	next http.RoundTripper
	n    *atomic.Int64
}

func (c countPauses) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, gitlabsim.APIPrefix+"/runners/") {
		c.n.Add(1)
	}
	return c.next.RoundTrip(r)
}

func newSealWorld(t *testing.T) *sealWorld {
	t.Helper()
	sim, err := gitlabsim.New(gitlabsim.Config{
		Projects: []gitlabsim.ProjectConfig{{Path: "acme/app"}},
		Users:    []gitlabsim.UserConfig{{Username: "owner", Members: map[string]int{"acme": gitlabsim.Owner}}},
		Tokens:   []gitlabsim.TokenConfig{{Token: sealOwnerPAT, User: "owner", Scopes: []string{"api"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sim)
	t.Cleanup(func() { srv.Close(); sim.Close() })
	w := &sealWorld{sim: sim, srv: srv, runners: NewRunnerObservations()}

	w.tmpl = readyTemplate()
	w.tmpl.Spec.Bootstrap.GitLab = &hfv1.GitLabBootstrap{URL: srv.URL, Group: "acme", AccessLevel: hfv1.GitLabNotProtected,
		Credentials: hfv1.GitLabCredentials{Token: hfv1.LocalSecretKeySelector{Name: "gitlab", Key: "token"}}}
	w.pool = &hfv1.RunnerPool{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pool"}, Spec: hfv1.RunnerPoolSpec{
		TemplateRef: hfv1.ObjectName{Name: w.tmpl.Name},
		Workload:    hfv1.Workload{Type: hfv1.WorkloadGitLabCI, GitLab: &hfv1.GitLabWorkload{Tags: []string{"linux"}}},
		Lifecycle:   hfv1.Lifecycle{JobTimeout: &metav1.Duration{Duration: 45 * time.Minute}},
	}}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "gitlab"}, Data: map[string][]byte{"token": []byte(sealOwnerPAT)}}
	w.kube = claimWorld(t, w.tmpl, w.pool, secret, worldCluster())
	w.ci = &workloads.Platforms{Client: w.kube, Backends: githubsimtest.Backends(t, countPauses{next: http.DefaultTransport, n: &w.pauses})}
	return w
}

// claim is a running claim of the pool whose runner the operator created
// at GitLab (the credential its VM received), as the claim controller
// issues it.
func (w *sealWorld) claim(t *testing.T, name string) (*hfv1.MachineClaim, workload.Credential) {
	t.Helper()
	c := unitClaim(name, 0)
	claim := &c
	claim.Spec.TemplateRef.Name = w.tmpl.Name
	claim.Spec.RunnerPoolRef = &hfv1.ObjectName{Name: w.pool.Name}
	claim.Spec.WorkloadConfig = &hfv1.WorkloadConfig{Type: hfv1.WorkloadGitLabCI, GitLab: &hfv1.GitLabRunnerConfig{Tags: []string{"linux"}}}
	claim.Status.Phase = hfv1.MachineClaimReady
	claim.Status.VMRef = hfv1.NewVMReference(unitCluster, "proxmox://1001", "pve1")
	cred, err := w.ci.RunnerCredential(context.Background(), claim)
	if err != nil {
		t.Fatalf("issue the claim's runner: %v", err)
	}
	return claim, cred
}

// reconciler is the claim controller over the world, as a (re)started
// operator builds it.
func (w *sealWorld) reconciler() *Reconciler {
	return &Reconciler{Client: w.kube, CI: w.ci, Recorder: record.NewFakeRecorder(100), Clock: clocktesting.NewFakeClock(time.Now()), Runners: w.runners}
}

// observe runs the claim controller's look at the claim's runner, as every
// pass of a running claim does (checkRunning).
func (w *sealWorld) observe(t *testing.T, r *Reconciler, claim *hfv1.MachineClaim) {
	t.Helper()
	var err error
	inScope(r, claim, func(s *claimScope) {
		s.tmpl = w.tmpl
		_, err = r.runner().observeWorkload(context.Background(), s)
	})
	if err != nil {
		t.Fatalf("observe the claim's runner: %v", err)
	}
}

// queue queues one job of acme/app for the pool's tag.
func (w *sealWorld) queue(t *testing.T, ref string) int64 {
	t.Helper()
	pl, err := w.sim.CreatePipeline(gitlabsim.PipelineRequest{Project: "acme/app", Ref: ref, Jobs: []gitlabsim.JobConfig{{Name: "build", Script: []string{"true"}, Tags: []string{"linux"}}}})
	if err != nil {
		t.Fatal(err)
	}
	return pl.Jobs[0]
}

// poll is one gitlab-runner process asking for a job with token (POST
// /api/v4/jobs/request, as the runner API the simulator checks against
// gitlab-runner's own types): the status, and the job's id and token.
func (w *sealWorld) poll(t *testing.T, token, systemID string) (int, int64, string) {
	t.Helper()
	code, body := w.runnerAPI(t, http.MethodPost, "/jobs/request", map[string]any{"token": token, "system_id": systemID})
	if code != http.StatusCreated {
		return code, 0, ""
	}
	var job struct {
		ID    int64  `json:"id"`
		Token string `json:"token"`
	}
	if err := json.Unmarshal(body, &job); err != nil {
		t.Fatal(err)
	}
	return code, job.ID, job.Token
}

func (w *sealWorld) runnerAPI(t *testing.T, method, path string, body any) (int, []byte) {
	t.Helper()
	raw, _ := json.Marshal(body)
	req, err := http.NewRequest(method, w.srv.URL+gitlabsim.APIPrefix+path, strings.NewReader(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

// recordRunning writes the CIJob of a job running on runner as the webhook
// receiver (a Job Hook "running") or the resync records it.
func (w *sealWorld) recordRunning(t *testing.T, id int64, runner string) {
	t.Helper()
	job := &hfv1.CIJob{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: hfv1.CIJobName(hfv1.WorkloadGitLabCI, strconv.FormatInt(id, 10))}}
	job.Spec.Platform, job.Spec.Repository, job.Spec.RunnerPoolRef = hfv1.WorkloadGitLabCI, "acme/app", hfv1.ObjectName{Name: w.pool.Name}
	job.Spec.SetID(strconv.FormatInt(id, 10))
	if err := w.kube.Create(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	job.Status.State, job.Status.RunnerName, job.Status.StartedAt = hfv1.CIJobInProgress, runner, &metav1.Time{Time: time.Now()}
	if err := w.kube.Status().Update(context.Background(), job); err != nil {
		t.Fatal(err)
	}
}

// TestSealRunnerAtItsFirstJob performs the attack of a job that copies its
// runner's token on a GitLab claim with the operator's own GitLab back-end
// and claim controller against the GitLab simulator: the job that the
// claim's runner took copies the runner authentication token (its VM's
// runner holds it) and, while its own job runs, polls GitLab with it from
// elsewhere, a second gitlab-runner process with a system_id of its own.
// Once the claim controller has seen the first job, from its CIJob (Job
// Hook) or from the runner list (the resync's observation, the job's hooks
// lost), GitLab gives the copied token no other job, from the VM or from
// elsewhere, while the first job runs on to its end; the claim records the
// seal, and neither a second pass nor a restart that lost the record makes
// another call than the one that seals. The runner was created with an
// explicit access level and a maximum_timeout of the pool's jobTimeout.
func TestSealRunnerAtItsFirstJob(t *testing.T) {
	for _, seen := range []string{"job hook", "runner list"} {
		t.Run(seen, func(t *testing.T) {
			w := newSealWorld(t)
			ctx := context.Background()
			claim, cred := w.claim(t, "pool-"+strings.ReplaceAll(seen, " ", "-"))
			token := cred.Secret.Reveal()

			admin, err := gl.NewClient(sealOwnerPAT, gl.WithBaseURL(w.srv.URL+gitlabsim.APIPrefix), gl.WithoutRetries())
			if err != nil {
				t.Fatal(err)
			}
			d, _, err := admin.Runners.GetRunnerDetails(cred.RunnerID)
			if err != nil {
				t.Fatal(err)
			}
			if d.MaximumTimeout != int64((45*time.Minute)/time.Second) || d.AccessLevel != "not_protected" || !d.Locked || d.Paused {
				t.Fatalf("the claim's runner at GitLab: maximum_timeout %d, access_level %q, locked %v, paused %v; want 2700 (the pool's jobTimeout), not_protected, locked, unpaused",
					d.MaximumTimeout, d.AccessLevel, d.Locked, d.Paused)
			}

			first, second := w.queue(t, "main"), w.queue(t, "feature/x")
			// The VM's runner takes the first job.
			code, got, jobToken := w.poll(t, token, "s_0000000000a1")
			if code != http.StatusCreated || got != first {
				t.Fatalf("the VM's runner: %d job %d, want job %d", code, got, first)
			}

			r := w.reconciler()
			switch seen {
			case "job hook":
				w.recordRunning(t, first, claim.Status.Bootstrap.RunnerName)
			case "runner list":
				// The resync's runner list (PoolResync.observeRunners)
				// shows the runner busy.
				p, _, err := w.ci.PoolProvider(ctx, w.pool, w.tmpl)
				if err != nil {
					t.Fatal(err)
				}
				rs, err := p.ListRunners(ctx, "")
				if err != nil {
					t.Fatal(err)
				}
				for _, l := range rs {
					if l.Name == claim.Status.Bootstrap.RunnerName {
						w.runners.Set(claim.UID, RunnerObservation{Present: true, State: l.State, At: time.Now()})
					}
				}
			}
			w.observe(t, r, claim)

			// The job's copy of the token, from elsewhere and from the VM.
			for _, sys := range []string{"s_0000000000e1", "s_0000000000a1"} {
				if code, got, _ := w.poll(t, token, sys); code != http.StatusNoContent {
					t.Fatalf("the copied runner token (system_id %s) after the first job was seen: %d job %d, want 204 (no job)", sys, code, got)
				}
			}
			if j, _ := w.sim.Job(second); j.Status != gitlabsim.StatusPending {
				t.Fatalf("the second job: %s, want still pending", j.Status)
			}
			// The first job runs on to its end on the sealed runner.
			if code, _ := w.runnerAPI(t, http.MethodPut, "/jobs/"+strconv.FormatInt(first, 10), map[string]any{"token": jobToken, "state": "success", "exit_code": 0}); code != http.StatusOK {
				t.Fatalf("the first job's end on the sealed runner: %d, want 200", code)
			}
			if j, _ := w.sim.Job(first); j.Status != gitlabsim.StatusSuccess {
				t.Fatalf("the first job: %s, want success", j.Status)
			}

			st := claim.Status.Bootstrap
			if st.RunnerSealedAt == nil || w.pauses.Load() != 1 {
				t.Fatalf("runnerSealedAt %v after %d pause calls, want set after 1", st.RunnerSealedAt, w.pauses.Load())
			}
			w.observe(t, r, claim)
			if w.pauses.Load() != 1 {
				t.Fatalf("a second pass of a sealed claim called GitLab: %d pause calls", w.pauses.Load())
			}
			// A restart that lost the record (the status write did not
			// happen) seals again, harmlessly.
			st.RunnerSealedAt = nil
			w.observe(t, w.reconciler(), claim)
			if st.RunnerSealedAt == nil || w.pauses.Load() != 2 {
				t.Fatalf("after a restart: runnerSealedAt %v, %d pause calls; want set, 2", st.RunnerSealedAt, w.pauses.Load())
			}
			if code, _, _ := w.poll(t, token, "s_0000000000e1"); code != http.StatusNoContent {
				t.Fatalf("the copied token after the second seal: %d, want 204", code)
			}
		})
	}
}

// TestNoSealBeforeTheFirstJob: a runner not yet seen with a job (listed
// idle) is left alone, without a call: it must take its job.
func TestNoSealBeforeTheFirstJob(t *testing.T) {
	w := newSealWorld(t)
	claim, cred := w.claim(t, "pool-idle")
	w.runners.Set(claim.UID, RunnerObservation{Present: true, State: workload.RunnerIdle, At: time.Now()})
	w.observe(t, w.reconciler(), claim)
	if claim.Status.Bootstrap.RunnerSealedAt != nil || w.pauses.Load() != 0 {
		t.Fatalf("an idle runner was sealed: %v, %d pause calls", claim.Status.Bootstrap.RunnerSealedAt, w.pauses.Load())
	}
	first := w.queue(t, "main")
	if code, got, _ := w.poll(t, cred.Secret.Reveal(), "s_0000000000a1"); code != http.StatusCreated || got != first {
		t.Fatalf("the VM's runner after the pass: %d job %d, want its job %d", code, got, first)
	}
}
