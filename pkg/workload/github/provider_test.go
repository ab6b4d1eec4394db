package github_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/credmethods"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	ghworkload "github.com/hyperfleet/hyperfleet/pkg/workload/github"
)

const (
	testPAT        = "ghp_providerTestPATmustNeverLeaveTheOperator0"
	testAppID      = 31337
	testInstallOrg = 4242
)

var appKey = func() githubsim.AppKey {
	k, err := githubsim.NewAppKey()
	if err != nil {
		panic(err)
	}
	return k
}()

func simConfig() githubsim.Config {
	return githubsim.Config{
		Organizations: []githubsim.OrgConfig{{Login: "octo-org", RunnerGroups: []githubsim.RunnerGroupConfig{{ID: 7, Name: "hyperfleet"}}}},
		Repositories:  []githubsim.RepoConfig{{Name: "octo-org/app"}, {Name: "octo-org/other"}},
		PATs:          []githubsim.PATConfig{{Token: testPAT, Login: "octocat"}},
		Apps: []githubsim.AppConfig{{ID: testAppID, PublicKey: appKey.PublicPEM, Installations: []githubsim.InstallationConfig{
			{ID: testInstallOrg, Account: "octo-org"},
		}}},
		// Generous: a runner script starved of CPU on a loaded CI machine
		// must not miss it (the simulator then fails the job, as GitHub does).
		HeartbeatTimeout: githubsim.Duration(30 * time.Second),
	}
}

// counting counts requests by path suffix on the way to the simulator.
type counting struct {
	next        http.RoundTripper
	accessToken atomic.Int32
	total       atomic.Int32
}

func (c *counting) RoundTrip(r *http.Request) (*http.Response, error) {
	c.total.Add(1)
	if strings.HasSuffix(r.URL.Path, "/access_tokens") {
		c.accessToken.Add(1)
	}
	return c.next.RoundTrip(r)
}

func newProvider(t *testing.T, srv *githubsim.Simulator, url string, tr http.RoundTripper, mutate func(*ghworkload.Config)) *ghworkload.Provider {
	t.Helper()
	cfg := ghworkload.Config{BaseURL: url + "/api/v3", Scope: workload.Scope{Owner: "octo-org", Repository: "app"}, Token: testPAT, Transport: tr,
		RunnerURL: url + "/octo-org/app"}
	if mutate != nil {
		mutate(&cfg)
	}
	p, err := ghworkload.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func jitFiles(t *testing.T, enc string) map[string]string {
	t.Helper()
	outer, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		t.Fatalf("JIT config is not base64: %v", err)
	}
	var m map[string]string
	if err := json.Unmarshal(outer, &m); err != nil {
		t.Fatalf("JIT config is not a JSON map: %v", err)
	}
	return m
}

func TestJITRunnerLifecycleWithPAT(t *testing.T) {
	gs := githubsimtest.Start(t, simConfig())
	p := newProvider(t, gs.Sim, gs.URL, gs.Transport, nil)
	ctx := context.Background()
	labels := ghworkload.RunnerLabels("linux", "x64", []string{"gpu"})
	spec := workload.RunnerSpec{Name: "pool-abc-1a2b3c4d", Labels: labels, Method: credmethods.MethodJIT, WorkFolder: "/var/lib/hyperfleet/work"}

	cred, err := p.IssueCredential(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if cred.RunnerID == 0 || cred.RunnerName != spec.Name || cred.Method != credmethods.MethodJIT || cred.IssuedAt.IsZero() {
		t.Fatalf("credential = %+v", cred)
	}
	files := jitFiles(t, cred.Secret.Reveal())
	for _, f := range []string{".runner", ".credentials", ".credentials_rsaparams"} {
		if files[f] == "" {
			t.Errorf("JIT config lacks %s", f)
		}
	}
	r, ok := gs.Sim.RunnerByName(spec.Name)
	if !ok || r.Status != "offline" || !r.JIT || r.Scope != "octo-org/app" {
		t.Fatalf("simulator runner = %+v, %v", r, ok)
	}
	if strings.Join(r.Labels, ",") != strings.Join(labels, ",") {
		t.Errorf("runner labels %v, want %v", r.Labels, labels)
	}

	// The same name again is taken.
	if _, err := p.IssueCredential(ctx, spec); !errors.Is(err, workload.ErrNameTaken) {
		t.Fatalf("second registration: %v, want ErrNameTaken", err)
	}
	got, err := p.GetRunner(ctx, spec.Name)
	if err != nil || got.ID != cred.RunnerID || got.State != workload.RunnerOffline {
		t.Fatalf("GetRunner = %+v, %v", got, err)
	}
	list, err := p.ListRunners(ctx, "pool-")
	if err != nil || len(list) != 1 {
		t.Fatalf("ListRunners = %+v, %v", list, err)
	}

	// Deregistration: by id, and again (already gone) without error.
	if err := p.DeregisterRunner(ctx, cred.RunnerID, spec.Name); err != nil {
		t.Fatal(err)
	}
	if err := p.DeregisterRunner(ctx, cred.RunnerID, spec.Name); err != nil {
		t.Fatalf("removing a removed runner: %v", err)
	}
	if err := p.DeregisterRunner(ctx, 0, "never-registered"); err != nil {
		t.Fatalf("removing an unknown runner by name: %v", err)
	}
	if _, err := p.GetRunner(ctx, spec.Name); !errors.Is(err, workload.ErrNotFound) {
		t.Fatalf("GetRunner after removal: %v", err)
	}
}

// TestJITConfigRunsOneJobAndBusyRunnerStays: the issued JIT configuration
// works with the runner package; while the runner runs a job it cannot be
// removed, and afterwards GitHub has removed it already.
func TestJITConfigRunsOneJobAndBusyRunnerStays(t *testing.T) {
	gs := githubsimtest.Start(t, simConfig())
	p := newProvider(t, gs.Sim, gs.URL, gs.Transport, nil)
	ctx := context.Background()
	cred, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: "busy-1", Labels: ghworkload.RunnerLabels("linux", "x64", nil), Method: credmethods.MethodJIT})
	if err != nil {
		t.Fatal(err)
	}
	dir := gs.InstallRunner(t)
	proc := githubsimtest.StartScript(t, dir, "run.sh", "--jitconfig", cred.Secret.Reveal())
	job, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted", "linux"}, Duration: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the runner takes the job", func() bool {
		j, _ := gs.Sim.Job(job.ID)
		return j.Status == "in_progress" && j.RunnerName == "busy-1"
	})
	// GetJob sees the runner that took the job.
	running, err := p.GetJob(ctx, "octo-org/app", strconv.FormatInt(job.ID, 10))
	if err != nil || running.State != workload.JobInProgress || running.RunnerName != "busy-1" || running.RunnerID != cred.RunnerID ||
		running.Conclusion != "" || running.StartedAt.IsZero() || !running.CompletedAt.IsZero() {
		t.Fatalf("running job = %+v, %v", running, err)
	}
	if err := p.DeregisterRunner(ctx, cred.RunnerID, "busy-1"); !errors.Is(err, workload.ErrRunnerBusy) {
		t.Fatalf("removing a busy runner: %v, want ErrRunnerBusy", err)
	}
	r, err := p.GetRunner(ctx, "busy-1")
	if err != nil || r.State != workload.RunnerBusy {
		t.Fatalf("busy runner = %+v, %v", r, err)
	}
	if code := proc.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("run.sh exited %d:\n%s", code, proc.Output())
	}
	done, err := p.GetJob(ctx, "octo-org/app", strconv.FormatInt(job.ID, 10))
	if err != nil || done.State != workload.JobCompleted || done.Conclusion != "success" || done.RunnerName != "busy-1" || done.CompletedAt.IsZero() {
		t.Fatalf("finished job = %+v, %v", done, err)
	}
	if err := p.DeregisterRunner(ctx, cred.RunnerID, "busy-1"); err != nil {
		t.Fatalf("removing a runner GitHub already removed: %v", err)
	}
}

func TestAppInstallationTokenIsCachedAndOrgRunnerGroupResolved(t *testing.T) {
	gs := githubsimtest.Start(t, simConfig())
	tr := &counting{next: gs.Transport}
	p := newProvider(t, gs.Sim, gs.URL, tr, func(c *ghworkload.Config) {
		c.Token = ""
		c.App = &ghworkload.AppCredentials{AppID: testAppID, InstallationID: testInstallOrg, PrivateKey: appKey.PrivatePEM}
		c.Scope = workload.Scope{Owner: "octo-org"}
	})
	ctx := context.Background()
	for i := range 3 {
		name := "org-runner-" + string(rune('a'+i))
		if _, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: name, Labels: []string{"self-hosted"}, Group: "hyperfleet", Method: credmethods.MethodJIT}); err != nil {
			t.Fatal(err)
		}
		r, _ := gs.Sim.RunnerByName(name)
		if r.GroupID != 7 || r.Scope != "octo-org" {
			t.Errorf("runner %s in group %d, scope %s; want group 7 (hyperfleet), organization scope", name, r.GroupID, r.Scope)
		}
	}
	if n := tr.accessToken.Load(); n != 1 {
		t.Errorf("%d installation token requests for %d API calls, want 1 (cached)", n, tr.total.Load())
	}
	if _, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: "x", Labels: []string{"a"}, Group: "nope"}); !errors.Is(err, workload.ErrInvalidRequest) {
		t.Errorf("unknown runner group: %v, want ErrInvalidRequest", err)
	}
}

func TestRegistrationToken(t *testing.T) {
	gs := githubsimtest.Start(t, simConfig())
	p := newProvider(t, gs.Sim, gs.URL, gs.Transport, nil)
	cred, err := p.IssueCredential(context.Background(), workload.RunnerSpec{Name: "rt-1", Method: credmethods.MethodRegistrationToken})
	if err != nil {
		t.Fatal(err)
	}
	if cred.Secret.IsZero() || cred.RegistrationURL != gs.URL+"/octo-org/app" || cred.ExpiresAt.Before(time.Now().Add(50*time.Minute)) || cred.RunnerID != 0 {
		t.Fatalf("registration credential = %+v", cred)
	}
	// The token registers a runner with the package's config.sh.
	dir := gs.InstallRunner(t)
	proc := githubsimtest.StartScript(t, dir, "config.sh", "--url", cred.RegistrationURL, "--token", cred.Secret.Reveal(), "--ephemeral",
		"--unattended", "--name", "rt-1", "--labels", "gpu", "--work", "_work", "--disableupdate")
	if code := proc.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("config.sh exited %d:\n%s", code, proc.Output())
	}
	if _, ok := gs.Sim.RunnerByName("rt-1"); !ok {
		t.Fatal("the runner did not register with the token")
	}

	// A custom registration-token URL (registrationURLs) is honoured.
	custom := newProvider(t, gs.Sim, gs.URL, gs.Transport, func(c *ghworkload.Config) {
		c.RegistrationTokenURL = gs.URL + "/api/v3/repos/octo-org/other/actions/runners/registration-token"
	})
	if _, err := custom.IssueCredential(context.Background(), workload.RunnerSpec{Method: credmethods.MethodRegistrationToken}); err != nil {
		t.Fatalf("custom registration URL: %v", err)
	}
}

func TestErrorsAreClassified(t *testing.T) {
	gs := githubsimtest.Start(t, simConfig())
	ctx := context.Background()
	bad := newProvider(t, gs.Sim, gs.URL, gs.Transport, func(c *ghworkload.Config) { c.Token = "ghp_wrong" })
	_, err := bad.IssueCredential(ctx, workload.RunnerSpec{Name: "n", Labels: []string{"a"}})
	if !errors.Is(err, workload.ErrUnauthorized) || strings.Contains(err.Error(), "ghp_wrong") {
		t.Errorf("bad token: %v", err)
	}
	missing := newProvider(t, gs.Sim, gs.URL, gs.Transport, func(c *ghworkload.Config) { c.Scope = workload.Scope{Owner: "octo-org", Repository: "nope"} })
	if _, err := missing.IssueCredential(ctx, workload.RunnerSpec{Name: "n", Labels: []string{"a"}}); !errors.Is(err, workload.ErrNotFound) {
		t.Errorf("unknown repository: %v", err)
	}
	p := newProvider(t, gs.Sim, gs.URL, gs.Transport, nil)
	if err := gs.Sim.InjectError(githubsim.ErrorFault{Status: 502, Count: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.ListRunners(ctx, ""); !errors.Is(err, workload.ErrUnavailable) {
		t.Errorf("502: %v", err)
	}
	// A secondary limit with retry-after: the call after it is refused
	// locally until then.
	if err := gs.Sim.InjectSecondaryLimit(githubsim.SecondaryLimitFault{Count: 1, Status: 429, RetryAfter: githubsim.Duration(120 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	_, err = p.ListRunners(ctx, "")
	wait, limited := workload.RetryAfter(err, time.Now())
	if !limited || wait < 100*time.Second {
		t.Fatalf("secondary limit: %v (wait %s)", err, wait)
	}
	if _, err := p.ListRunners(ctx, ""); !errors.Is(err, workload.ErrRateLimited) {
		t.Fatalf("call during the secondary limit: %v", err)
	}
	if rate := p.Rate(); rate.BlockedUntil.IsZero() || rate.Limit == 0 {
		t.Errorf("rate snapshot = %+v", rate)
	}
}

func TestQueuedJobsAndCancel(t *testing.T) {
	gs := githubsimtest.Start(t, simConfig())
	p := newProvider(t, gs.Sim, gs.URL, gs.Transport, func(c *ghworkload.Config) { c.Scope = workload.Scope{Owner: "octo-org"} })
	ctx := context.Background()
	a, _ := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted", "gpu"}, Duration: time.Minute})
	b, _ := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/other", Labels: []string{"self-hosted"}, Duration: time.Minute})
	jobs, err := p.QueuedJobs(ctx, []string{"octo-org/app", "octo-org/other"})
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]workload.Job{}
	for _, j := range jobs {
		byID[j.ID] = j
	}
	if j := byID[strconv.FormatInt(a.ID, 10)]; j.RunID != a.RunID || j.Repository != "octo-org/app" || strings.Join(j.Labels, ",") != "self-hosted,gpu" || j.State != workload.JobQueued {
		t.Errorf("job a = %+v", j)
	}
	if _, ok := byID[strconv.FormatInt(b.ID, 10)]; !ok || len(jobs) != 2 {
		t.Errorf("queued jobs = %+v", jobs)
	}
	if _, err := p.QueuedJobs(ctx, []string{"someone/else"}); !errors.Is(err, workload.ErrInvalidRequest) {
		t.Errorf("out-of-scope repository: %v", err)
	}
	if err := p.CancelRun(ctx, "octo-org/app", a.RunID); err != nil {
		t.Fatal(err)
	}
	if j, _ := gs.Sim.Job(a.ID); j.Status != "completed" || j.Conclusion != "cancelled" {
		t.Errorf("cancelled job = %+v", j)
	}
	// Cancelling a finished run is success: nothing left to cancel.
	if err := p.CancelRun(ctx, "octo-org/app", a.RunID); err != nil {
		t.Errorf("cancel a completed run: %v", err)
	}
	jobs, _ = p.QueuedJobs(ctx, []string{"octo-org/app"})
	if len(jobs) != 0 {
		t.Errorf("queued after cancel: %+v", jobs)
	}
}

func TestGetJob(t *testing.T) {
	gs := githubsimtest.Start(t, simConfig())
	p := newProvider(t, gs.Sim, gs.URL, gs.Transport, func(c *ghworkload.Config) { c.Scope = workload.Scope{Owner: "octo-org"} })
	ctx := context.Background()
	a, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted", "gpu"}, Duration: time.Minute,
		WorkflowName: "ci", JobName: "build"})
	if err != nil {
		t.Fatal(err)
	}
	id := strconv.FormatInt(a.ID, 10)
	j, err := p.GetJob(ctx, "octo-org/app", id)
	if err != nil {
		t.Fatal(err)
	}
	if j.ID != id || j.Platform != hfv1.WorkloadGitHubActions || j.RunID != a.RunID || j.RunAttempt != 1 || j.Repository != "octo-org/app" || strings.Join(j.Labels, ",") != "self-hosted,gpu" ||
		j.State != workload.JobQueued || j.WorkflowName != "ci" || j.Name != "build" || j.RunnerName != "" || j.RunnerID != 0 ||
		j.Conclusion != "" || j.CreatedAt.IsZero() || !j.CompletedAt.IsZero() {
		t.Errorf("queued job = %+v", j)
	}

	if err := gs.Sim.CompleteJob(a.ID, "failure"); err != nil {
		t.Fatal(err)
	}
	j, err = p.GetJob(ctx, "octo-org/app", id)
	if err != nil || j.State != workload.JobCompleted || j.Conclusion != "failure" || j.CompletedAt.IsZero() || j.RunID != a.RunID {
		t.Errorf("completed job = %+v, %v", j, err)
	}

	// An unknown id, and a known one asked of another repository, are not
	// found.
	if _, err := p.GetJob(ctx, "octo-org/app", strconv.FormatInt(a.ID+1000, 10)); !errors.Is(err, workload.ErrNotFound) {
		t.Errorf("unknown job: %v, want ErrNotFound", err)
	}
	if _, err := p.GetJob(ctx, "octo-org/other", id); !errors.Is(err, workload.ErrNotFound) {
		t.Errorf("job of another repository: %v, want ErrNotFound", err)
	}

	// Repositories outside the scope are refused without a call.
	for _, repo := range []string{"someone/else", "octo-org", "octo-org/", "octo-org/app/x"} {
		if _, err := p.GetJob(ctx, repo, id); !errors.Is(err, workload.ErrInvalidRequest) {
			t.Errorf("repository %q: %v, want ErrInvalidRequest", repo, err)
		}
	}
	repoScoped := newProvider(t, gs.Sim, gs.URL, gs.Transport, nil)
	if _, err := repoScoped.GetJob(ctx, "octo-org/other", id); !errors.Is(err, workload.ErrInvalidRequest) {
		t.Errorf("repository outside a repository scope: %v, want ErrInvalidRequest", err)
	}

	// An id that is not one of GitHub's (a Buildkite UUID, a number
	// written with a sign or a leading zero, one past int64) names no
	// GitHub job: not found, without asking GitHub (a provider whose every
	// request fails otherwise would answer another error).
	var requests atomic.Int32
	offline := newProvider(t, gs.Sim, gs.URL, countingTransport{n: &requests}, func(c *ghworkload.Config) { c.Scope = workload.Scope{Owner: "octo-org"} })
	for _, bad := range []string{"", "0", "-" + id, "+" + id, "0" + id, id + " ", "0190a1b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b", "9223372036854775808"} {
		if _, err := offline.GetJob(ctx, "octo-org/app", bad); !errors.Is(err, workload.ErrNotFound) {
			t.Errorf("job id %q: %v, want ErrNotFound", bad, err)
		}
	}
	if n := requests.Load(); n != 0 {
		t.Errorf("ids that are not GitHub's cost %d requests, want none", n)
	}
	if _, err := offline.GetJob(ctx, "octo-org/app", id); errors.Is(err, workload.ErrNotFound) || requests.Load() == 0 {
		t.Errorf("the counting transport saw no request for a GitHub id (%v): the check above proves nothing", err)
	}
}

// countingTransport counts the requests it is given and fails each.
type countingTransport struct{ n *atomic.Int32 }

func (c countingTransport) RoundTrip(*http.Request) (*http.Response, error) {
	c.n.Add(1)
	return nil, errors.New("offline: this test expects no request")
}

func TestSecretNeverFormats(t *testing.T) {
	s := workload.NewSecret("jit-very-secret")
	c := workload.Credential{Secret: s, RunnerName: "r"}
	for _, out := range []string{
		s.String(), fmtAll(s), fmtAll(c), mustJSON(t, c),
	} {
		if strings.Contains(out, "jit-very-secret") {
			t.Errorf("secret printed: %s", out)
		}
	}
	if s.Reveal() != "jit-very-secret" {
		t.Error("Reveal lost the value")
	}
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func fmtAll(v any) string {
	return fmt.Sprintf("%v %+v %#v %s %q", v, v, v, v, v)
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// jobReads counts the reads of a run's jobs on the way to the simulator.
type jobReads struct {
	next http.RoundTripper
	n    atomic.Int32
}

func (c *jobReads) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/jobs") && strings.Contains(r.URL.Path, "/actions/runs/") {
		c.n.Add(1)
	}
	return c.next.RoundTrip(r)
}

// TestQueuedJobsReadsAQueuedRunTwice: a queued run's jobs are read at
// two listings in a row that show the same updated_at and not again
// until it moves; a job added to the run (in the same second of
// updated_at or a later one) is found.
func TestQueuedJobsReadsAQueuedRunTwice(t *testing.T) {
	clk := githubsim.NewFakeClock(time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC))
	gs := githubsimtest.Start(t, simConfig(), githubsim.WithClock(clk))
	reads := &jobReads{next: gs.Transport}
	p := newProvider(t, gs.Sim, gs.URL, reads, nil)
	ctx := context.Background()
	a, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted"}, Duration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	list := func(want ...int64) {
		t.Helper()
		jobs, err := p.QueuedJobs(ctx, []string{"octo-org/app"})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, j := range jobs {
			got = append(got, j.ID)
		}
		// The decimal ids print as the numbers do.
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("queued jobs %v, want %v", got, want)
		}
	}
	for i, wantReads := range []int32{1, 2, 2, 2} {
		list(a.ID)
		if got := reads.n.Load(); got != wantReads {
			t.Fatalf("listing %d: %d reads of the run's jobs, want %d", i+1, got, wantReads)
		}
	}

	// A job added in a later second moves updated_at: read again.
	clk.Advance(2 * time.Second)
	b, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted"}, Duration: time.Minute, RunID: a.RunID})
	if err != nil {
		t.Fatal(err)
	}
	list(a.ID, b.ID)
	if got := reads.n.Load(); got != 3 {
		t.Fatalf("after a job was added: %d reads, want 3", got)
	}

	// A job added in the same second as the first read after it: the
	// second read finds it, since the resync comes at least a second
	// later.
	clk.Advance(2 * time.Second)
	c, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted"}, Duration: time.Minute, RunID: a.RunID})
	if err != nil {
		t.Fatal(err)
	}
	list(a.ID, b.ID, c.ID)
	d, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted"}, Duration: time.Minute, RunID: a.RunID})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(30 * time.Second)
	list(a.ID, b.ID, c.ID, d.ID)
	list(a.ID, b.ID, c.ID, d.ID)
	if got := reads.n.Load(); got != 5 {
		t.Fatalf("after a job added in the same second: %d reads, want 5", got)
	}

	// A run that leaves the queued listing is forgotten; cancelling it
	// leaves nothing queued.
	if err := p.CancelRun(ctx, "octo-org/app", a.RunID); err != nil {
		t.Fatal(err)
	}
	list()
}

// requests records the requests on the way to the simulator, as
// "METHOD path?query".
type requests struct {
	next http.RoundTripper
	mu   sync.Mutex
	log  []string
}

func (c *requests) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.log = append(c.log, r.Method+" "+strings.TrimPrefix(r.URL.Path, "/api/v3")+"?"+r.URL.RawQuery)
	c.mu.Unlock()
	return c.next.RoundTrip(r)
}

// since returns the requests made after the first n, and the new count.
func (c *requests) since(n int) ([]string, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.log[n:]...), len(c.log)
}

// TestQueuedJobsInRunsThatStarted: a matrix build's run is in_progress as
// soon as one of its jobs runs; the jobs of it still queued are listed.
// Every unfinished status is a listing of its own; once nothing changed,
// the listings are answered 304 and spend no rate-limit budget.
func TestQueuedJobsInRunsThatStarted(t *testing.T) {
	clk := githubsim.NewFakeClock(time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC))
	gs := githubsimtest.Start(t, simConfig(), githubsim.WithClock(clk))
	reqs := &requests{next: gs.Transport}
	p := newProvider(t, gs.Sim, gs.URL, reqs, nil)
	ctx := context.Background()
	started, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted", "matrix-a"}, Duration: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	waiting, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted", "matrix-b"}, Duration: time.Hour, RunID: started.RunID})
	if err != nil {
		t.Fatal(err)
	}
	// A runner takes the first job: the run is in progress, the second
	// job still queued.
	cred, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: "matrix-a-runner", Labels: []string{"self-hosted", "matrix-a"}, Method: credmethods.MethodJIT})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		_, _ = (&githubsim.JITRunner{Client: &http.Client{Transport: gs.Transport}, PollWait: time.Second}).Run(runCtx, cred.Secret.Reveal())
	}()
	waitFor(t, 30*time.Second, "the first job started", func() bool {
		j, _ := gs.Sim.Job(started.ID)
		return j.Status == "in_progress"
	})

	_, n := reqs.since(0)
	jobs, err := p.QueuedJobs(ctx, []string{"octo-org/app"})
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 1 || jobs[0].ID != strconv.FormatInt(waiting.ID, 10) || jobs[0].State != workload.JobQueued || jobs[0].RunID != started.RunID {
		t.Fatalf("queued jobs %+v, want job %d of the in-progress run %d", jobs, waiting.ID, started.RunID)
	}
	calls, n := reqs.since(n)
	var statuses []string
	for _, c := range calls {
		if _, q, ok := strings.Cut(c, "/actions/runs?"); ok {
			v, _ := url.ParseQuery(q)
			statuses = append(statuses, v.Get("status"))
		}
	}
	if got := strings.Join(statuses, ","); got != "queued,in_progress,waiting,pending,requested" {
		t.Errorf("run listings by status: %s, want one per unfinished status", got)
	}

	// Nothing changed: the second read of the run's jobs (at the same
	// updated_at) and the five listings are conditional and answered 304,
	// which GitHub does not count against the rate limit; once the jobs
	// were read twice, only the listings are made.
	before := p.Rate().Remaining
	if _, err := p.QueuedJobs(ctx, []string{"octo-org/app"}); err != nil {
		t.Fatal(err)
	}
	calls, n = reqs.since(n)
	if len(calls) != 6 || p.Rate().Remaining != before {
		t.Errorf("second listing: %d calls (%v), remaining budget %d -> %d; want the 5 listings and one read of the jobs, none counted", len(calls), calls, before, p.Rate().Remaining)
	}
	if jobs, err = p.QueuedJobs(ctx, []string{"octo-org/app"}); err != nil || len(jobs) != 1 || jobs[0].ID != strconv.FormatInt(waiting.ID, 10) {
		t.Fatalf("settled listing: %+v, %v", jobs, err)
	}
	calls, _ = reqs.since(n)
	if len(calls) != 5 || p.Rate().Remaining != before {
		t.Errorf("settled listing: %d calls (%v), remaining budget %d -> %d; want the 5 listings, none counted", len(calls), calls, before, p.Rate().Remaining)
	}
}

// TestRepositories: an organization scope's repositories are listed with
// the credentials' own endpoint (a PAT: the organization's, archived ones
// left out; an App: its installation's selection), kept for a few minutes,
// and listed again conditionally: unchanged, at no rate-limit cost; a new
// repository shows. A repository scope is its repository, with no call.
func TestRepositories(t *testing.T) {
	cfg := simConfig()
	cfg.Repositories = append(cfg.Repositories, githubsim.RepoConfig{Name: "octo-org/attic", Archived: true}, githubsim.RepoConfig{Name: "octocat/personal"})
	cfg.Apps[0].Installations = append(cfg.Apps[0].Installations,
		githubsim.InstallationConfig{ID: testInstallOrg + 1, Account: "octo-org", RepositorySelection: "selected", Repositories: []string{"other"}})
	gs := githubsimtest.Start(t, cfg)
	ctx := context.Background()
	clk := clocktesting.NewFakePassiveClock(time.Now())
	reqs := &requests{next: gs.Transport}
	org := newProvider(t, gs.Sim, gs.URL, reqs, func(c *ghworkload.Config) { c.Scope, c.Clock = workload.Scope{Owner: "octo-org"}, clk })
	list := func(p *ghworkload.Provider, want string) {
		t.Helper()
		got, err := p.Repositories(ctx)
		if err != nil || strings.Join(got, ",") != want {
			t.Fatalf("Repositories = %v, %v; want %s", got, err, want)
		}
	}
	list(org, "octo-org/app,octo-org/other")
	calls, n := reqs.since(0)
	if len(calls) != 1 || !strings.HasPrefix(calls[0], "GET /orgs/octo-org/repos?") {
		t.Errorf("calls %v, want one organization listing", calls)
	}
	clk.SetTime(clk.Now().Add(4 * time.Minute))
	list(org, "octo-org/app,octo-org/other")
	if calls, n = reqs.since(n); len(calls) != 0 {
		t.Errorf("within the refresh interval: calls %v, want none", calls)
	}
	clk.SetTime(clk.Now().Add(2 * time.Minute))
	before := org.Rate().Remaining
	list(org, "octo-org/app,octo-org/other")
	if calls, n = reqs.since(n); len(calls) != 1 || org.Rate().Remaining != before {
		t.Errorf("refresh of an unchanged list: calls %v, budget %d -> %d; want one call, not counted", calls, before, org.Rate().Remaining)
	}
	if err := gs.Sim.AddRepository(githubsim.RepoConfig{Name: "octo-org/fresh"}); err != nil {
		t.Fatal(err)
	}
	clk.SetTime(clk.Now().Add(6 * time.Minute))
	list(org, "octo-org/app,octo-org/fresh,octo-org/other")

	app := newProvider(t, gs.Sim, gs.URL, reqs, func(c *ghworkload.Config) {
		c.Scope, c.Token = workload.Scope{Owner: "octo-org"}, ""
		c.App = &ghworkload.AppCredentials{AppID: testAppID, InstallationID: testInstallOrg + 1, PrivateKey: appKey.PrivatePEM}
	})
	_, n = reqs.since(n)
	list(app, "octo-org/other")
	if calls, _ := reqs.since(n); !slices.ContainsFunc(calls, func(c string) bool { return strings.HasPrefix(c, "GET /installation/repositories?") }) {
		t.Errorf("an App's listing: calls %v, want GET /installation/repositories", calls)
	}

	repo := newProvider(t, gs.Sim, gs.URL, reqs, nil)
	_, n = reqs.since(0)
	list(repo, "octo-org/app")
	if calls, _ := reqs.since(n); len(calls) != 0 {
		t.Errorf("a repository scope: calls %v, want none", calls)
	}
}
