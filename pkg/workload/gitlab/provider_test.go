package gitlab_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/credmethods"
	gitlabsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/gitlab"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	glworkload "github.com/hyperfleet/hyperfleet/pkg/workload/gitlab"
)

// Tokens of the test world (simConfig).
const (
	adminPAT     = "glpat-provideradmin00000000"
	ownerPAT     = "glpat-providerowner00000000"
	ownerMinPAT  = "glpat-providerownermin00000" // create_runner, manage_runner, read_api
	noManagePAT  = "glpat-providernomanage0000"  // create_runner, read_api
	maintPAT     = "glpat-providermaint00000000"
	devPAT       = "glpat-providerdev0000000000"
	noRunnerPAT  = "glpat-providerreadonly00000" // read_api only
	projectToken = "glpat-providerprojbot00000"  // project access token of acme/platform/app
)

// simConfig is a world of nested groups:
//
//	acme (owner: Owner)
//	acme/platform/app    (maint: Maintainer, dev: Developer, project token)
//	acme/platform/ci/tools
//	acme/web
func simConfig() gitlabsim.Config {
	return gitlabsim.Config{
		Groups:   []gitlabsim.GroupConfig{{Path: "acme/platform/ci"}},
		Projects: []gitlabsim.ProjectConfig{{Path: "acme/platform/app"}, {Path: "acme/platform/ci/tools"}, {Path: "acme/web"}},
		Users: []gitlabsim.UserConfig{
			{Username: "root", Admin: true},
			{Username: "owner", Members: map[string]int{"acme": gitlabsim.Owner}},
			{Username: "maint", Members: map[string]int{"acme/platform/app": gitlabsim.Maintainer}},
			{Username: "dev", Members: map[string]int{"acme/platform/app": gitlabsim.Developer}},
		},
		Tokens: []gitlabsim.TokenConfig{
			{Token: adminPAT, User: "root", Scopes: []string{"api"}},
			{Token: ownerPAT, User: "owner", Scopes: []string{"api"}},
			{Token: ownerMinPAT, User: "owner", Scopes: []string{"create_runner", "manage_runner", "read_api"}},
			{Token: noManagePAT, User: "owner", Scopes: []string{"create_runner", "read_api"}},
			{Token: maintPAT, User: "maint", Scopes: []string{"api"}},
			{Token: devPAT, User: "dev", Scopes: []string{"api"}},
			{Token: noRunnerPAT, User: "owner", Scopes: []string{"read_api"}},
			{Token: projectToken, Kind: "project", Resource: "acme/platform/app", AccessLevel: gitlabsim.Maintainer, Scopes: []string{"api"}, Name: "hyperfleet"},
		},
	}
}

type world struct {
	sim *gitlabsim.Simulator
	srv *httptest.Server
}

func newWorld(t *testing.T, mutate func(*gitlabsim.Config)) *world {
	t.Helper()
	cfg := simConfig()
	if mutate != nil {
		mutate(&cfg)
	}
	sim, err := gitlabsim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sim)
	t.Cleanup(func() { srv.Close(); sim.Close() })
	return &world{sim: sim, srv: srv}
}

func (w *world) provider(t *testing.T, token string, scope workload.Scope) *glworkload.Provider {
	t.Helper()
	p, err := glworkload.New(glworkload.Config{URL: w.srv.URL, Token: token, Scope: scope, HTTPTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// runnerCall sends a runner API request as gitlab-runner does and returns
// the status and the decoded answer.
func (w *world) runnerCall(t *testing.T, path string, body any) (int, map[string]any) {
	t.Helper()
	raw, _ := json.Marshal(body)
	resp, err := http.Post(w.srv.URL+gitlabsim.APIPrefix+path, "application/json", bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// TestRunnersPerScope creates, finds, lists and deletes a runner in each
// kind of scope, and checks with the runner API that its token works until
// it is deleted and not after.
func TestRunnersPerScope(t *testing.T) {
	w := newWorld(t, nil)
	ctx := context.Background()
	for _, tc := range []struct {
		name, token string
		scope       workload.Scope
		runnerType  string
	}{
		{"project", maintPAT, glworkload.ScopeOf("acme/platform/app", "", false), "project_type"},
		{"project token", projectToken, glworkload.ScopeOf("acme/platform/app", "", false), "project_type"},
		{"subgroup", ownerPAT, glworkload.ScopeOf("", "acme/platform", false), "group_type"},
		{"subgroup, least scopes", ownerMinPAT, glworkload.ScopeOf("", "acme/platform/ci", false), "group_type"},
		{"instance", adminPAT, glworkload.ScopeOf("", "", true), "instance_type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := w.provider(t, tc.token, tc.scope)
			if err := p.VerifyScope(ctx); err != nil {
				t.Fatalf("VerifyScope: %v", err)
			}
			name := "hf-" + strings.ReplaceAll(tc.name, " ", "-")
			cred, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: name, Labels: []string{"linux", "hyperfleet"}, Method: workload.Method(hfv1.BootstrapJITConfig)})
			if err != nil {
				t.Fatalf("IssueCredential: %v", err)
			}
			if cred.Method != credmethods.MethodRunnerAuthToken || !strings.HasPrefix(cred.Secret.Reveal(), "glrt-") || cred.RunnerID == 0 ||
				cred.RunnerName != name || cred.RegistrationURL != w.srv.URL || cred.IssuedAt.IsZero() {
				t.Fatalf("credential: %+v", cred)
			}
			if printed := fmt.Sprintf("%v %+v %s", cred, cred, cred.Secret); strings.Contains(printed, "glrt-") {
				t.Fatalf("the runner token prints: %s", printed)
			}
			var info *gitlabsim.RunnerInfo
			for _, r := range w.sim.Runners() {
				if r.ID == cred.RunnerID {
					info = &r
				}
			}
			if info == nil || info.Type != tc.runnerType || !slices.Equal(info.Tags, []string{"linux", "hyperfleet"}) || info.Paused {
				t.Fatalf("the simulator's runner: %+v", info)
			}
			got, err := p.GetRunner(ctx, name)
			if err != nil || got.ID != cred.RunnerID || got.State != workload.RunnerOffline || !slices.Equal(got.Labels, []string{"linux", "hyperfleet"}) {
				t.Fatalf("GetRunner: %v %+v", err, got)
			}
			list, err := p.ListRunners(ctx, "hf-")
			if err != nil || !slices.ContainsFunc(list, func(r workload.Runner) bool { return r.ID == cred.RunnerID }) {
				t.Fatalf("ListRunners: %v %+v", err, list)
			}
			if code, _ := w.runnerCall(t, "/runners/verify", map[string]any{"token": cred.Secret.Reveal(), "system_id": "s_0123456789ab"}); code != http.StatusOK {
				t.Fatalf("verify with the new token: %d", code)
			}
			if err := p.DeregisterRunner(ctx, cred.RunnerID, name); err != nil {
				t.Fatalf("DeregisterRunner: %v", err)
			}
			if err := p.DeregisterRunner(ctx, cred.RunnerID, name); err != nil {
				t.Fatalf("DeregisterRunner of a runner that is gone: %v", err)
			}
			if _, err := p.GetRunner(ctx, name); !errors.Is(err, workload.ErrNotFound) {
				t.Fatalf("GetRunner after deletion: %v, want ErrNotFound", err)
			}
			if code, _ := w.runnerCall(t, "/runners/verify", map[string]any{"token": cred.Secret.Reveal(), "system_id": "s_0123456789ab"}); code != http.StatusForbidden {
				t.Fatalf("verify with a deleted runner's token: %d, want 403", code)
			}
		})
	}
}

// TestVerifyScopeRefusals: what GitLab refuses is ErrUnauthorized or
// ErrNotFound, as the contract asks.
func TestVerifyScopeRefusals(t *testing.T) {
	w := newWorld(t, nil)
	ctx := context.Background()
	for _, tc := range []struct {
		name, token string
		scope       workload.Scope
		want        error
	}{
		{"token without create_runner", noRunnerPAT, glworkload.ScopeOf("", "acme", false), workload.ErrUnauthorized},
		{"token without manage_runner", noManagePAT, glworkload.ScopeOf("", "acme", false), workload.ErrUnauthorized},
		{"developer of the project", devPAT, glworkload.ScopeOf("acme/platform/app", "", false), workload.ErrUnauthorized},
		{"maintainer of a project, not of its group", maintPAT, glworkload.ScopeOf("", "acme/platform", false), workload.ErrUnauthorized},
		{"instance without administrator", ownerPAT, glworkload.ScopeOf("", "", true), workload.ErrUnauthorized},
		{"unknown project", ownerPAT, glworkload.ScopeOf("acme/nothing", "", false), workload.ErrNotFound},
		{"project token elsewhere", projectToken, glworkload.ScopeOf("acme/web", "", false), workload.ErrNotFound},
		{"unknown token", "glpat-unknown00000000000000", glworkload.ScopeOf("acme/web", "", false), workload.ErrUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := w.provider(t, tc.token, tc.scope).VerifyScope(ctx); !errors.Is(err, tc.want) {
				t.Fatalf("VerifyScope: %v, want %v", err, tc.want)
			}
		})
	}
	// A runner without tags that may not run untagged jobs could take no
	// job: refused before GitLab is asked.
	p := w.provider(t, maintPAT, glworkload.ScopeOf("acme/platform/app", "", false))
	if _, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: "hf-none"}); !errors.Is(err, workload.ErrInvalidRequest) {
		t.Fatalf("IssueCredential without tags: %v, want ErrInvalidRequest", err)
	}
	if _, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: "hf-reg", Labels: []string{"linux"}, Method: workload.Method(hfv1.BootstrapRunnerToken)}); !errors.Is(err, workload.ErrInvalidRequest) {
		t.Fatalf("IssueCredential with GitHub's runner-token method: %v, want ErrInvalidRequest", err)
	}
	if _, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: "hf-untagged", RunUntagged: ptr.To(true)}); err != nil {
		t.Fatalf("IssueCredential of an untagged runner: %v", err)
	}
	// The template's runUntagged is the default; a pool's or claim's
	// false overrides it.
	p2, err := glworkload.New(glworkload.Config{URL: w.srv.URL, Token: maintPAT, Scope: p.Scope(), RunUntagged: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p2.IssueCredential(ctx, workload.RunnerSpec{Name: "hf-default-untagged"}); err != nil {
		t.Fatalf("IssueCredential of an untagged runner by the template's default: %v", err)
	}
	if _, err := p2.IssueCredential(ctx, workload.RunnerSpec{Name: "hf-not-untagged", RunUntagged: ptr.To(false)}); !errors.Is(err, workload.ErrInvalidRequest) {
		t.Fatalf("IssueCredential without tags, run_untagged overridden to false: %v, want ErrInvalidRequest", err)
	}
	// Creating a group runner needs Owner of the group.
	grp := w.provider(t, devPAT, glworkload.ScopeOf("", "acme/platform", false))
	if _, err := grp.IssueCredential(ctx, workload.RunnerSpec{Name: "hf-dev", Labels: []string{"linux"}}); !errors.Is(err, workload.ErrUnauthorized) && !errors.Is(err, workload.ErrNotFound) {
		t.Fatalf("a developer creating a group runner: %v", err)
	}
}

// TestGetRunnerFindsTheScopesOwn: a group's runner list also holds its
// ancestor group's runners; a runner of the same name there is not the
// scope's, and is left alone by its deregistration by name.
func TestGetRunnerFindsTheScopesOwn(t *testing.T) {
	w := newWorld(t, nil)
	ctx := context.Background()
	top := w.provider(t, ownerPAT, glworkload.ScopeOf("", "acme", false))
	sub := w.provider(t, ownerPAT, glworkload.ScopeOf("", "acme/platform", false))
	theirs, err := top.IssueCredential(ctx, workload.RunnerSpec{Name: "hf-same", Labels: []string{"linux"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.GetRunner(ctx, "hf-same"); !errors.Is(err, workload.ErrNotFound) {
		t.Fatalf("the subgroup found its parent's runner: %v", err)
	}
	if err := sub.DeregisterRunner(ctx, 0, "hf-same"); err != nil {
		t.Fatal(err)
	}
	mine, err := sub.IssueCredential(ctx, workload.RunnerSpec{Name: "hf-same", Labels: []string{"linux"}})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := sub.GetRunner(ctx, "hf-same"); err != nil || r.ID != mine.RunnerID {
		t.Fatalf("the subgroup's own runner: %v %+v (want %d)", err, r, mine.RunnerID)
	}
	if r, err := top.GetRunner(ctx, "hf-same"); err != nil || r.ID != theirs.RunnerID {
		t.Fatalf("the parent's runner after the subgroup's deregistration: %v %+v (want %d)", err, r, theirs.RunnerID)
	}
}

// TestJobs lists a group's projects, its pending jobs with their tags and
// pipeline, reads one, cancels its pipeline, and finds a busy runner
// refusing deregistration.
func TestJobs(t *testing.T) {
	w := newWorld(t, nil)
	ctx := context.Background()
	p := w.provider(t, ownerPAT, glworkload.ScopeOf("", "acme/platform", false))
	repos, err := p.Repositories(ctx)
	slices.Sort(repos)
	if err != nil || !slices.Equal(repos, []string{"acme/platform/app", "acme/platform/ci/tools"}) {
		t.Fatalf("Repositories: %v %v", err, repos)
	}
	pl, err := w.sim.CreatePipeline(gitlabsim.PipelineRequest{Project: "acme/platform/ci/tools", Jobs: []gitlabsim.JobConfig{
		{Name: "build", Stage: "build", Script: []string{"echo hi"}, Tags: []string{"linux", "hyperfleet"}},
		{Name: "deploy", Stage: "deploy", Script: []string{"true"}, Tags: []string{"linux"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.sim.CreatePipeline(gitlabsim.PipelineRequest{Project: "acme/web", Jobs: []gitlabsim.JobConfig{{Name: "x", Script: []string{"true"}}}}); err != nil {
		t.Fatal(err)
	}
	jobs, err := p.QueuedJobs(ctx, append(repos, "acme/web"))
	if err != nil || len(jobs) != 1 {
		t.Fatalf("QueuedJobs: %v %+v (want the one pending job of the group; deploy waits for its stage, acme/web is outside)", err, jobs)
	}
	j := jobs[0]
	if j.ID != strconv.FormatInt(pl.Jobs[0], 10) || j.Platform != hfv1.WorkloadGitLabCI || j.RunID != pl.ID || j.Repository != "acme/platform/ci/tools" || j.State != workload.JobQueued ||
		!slices.Equal(j.Labels, []string{"hyperfleet", "linux"}) && !slices.Equal(j.Labels, []string{"linux", "hyperfleet"}) || j.Name != "build" || j.CreatedAt.IsZero() {
		t.Fatalf("queued job: %+v", j)
	}
	// A runner takes the job: it is busy and stays.
	cred, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: "hf-busy", Labels: []string{"linux", "hyperfleet"}})
	if err != nil {
		t.Fatal(err)
	}
	if code, body := w.runnerCall(t, "/jobs/request", map[string]any{"token": cred.Secret.Reveal(), "system_id": "s_0123456789ab"}); code != http.StatusCreated || strconv.FormatInt(int64(body["id"].(float64)), 10) != j.ID {
		t.Fatalf("job request: %d %v", code, body["id"])
	}
	got, err := p.GetJob(ctx, j.Repository, j.ID)
	if err != nil || got.State != workload.JobInProgress || got.RunnerID != cred.RunnerID || got.RunnerName != "hf-busy" || got.StartedAt.IsZero() {
		t.Fatalf("GetJob: %v %+v", err, got)
	}
	if r, err := p.GetRunner(ctx, "hf-busy"); err != nil || r.State != workload.RunnerBusy {
		t.Fatalf("GetRunner of the busy runner: %v %+v", err, r)
	}
	if err := p.DeregisterRunner(ctx, 0, "hf-busy"); !errors.Is(err, workload.ErrRunnerBusy) {
		t.Fatalf("DeregisterRunner of a busy runner: %v, want ErrRunnerBusy", err)
	}
	// The refused deregistration paused the runner: it takes no next job.
	for _, r := range w.sim.Runners() {
		if r.ID == cred.RunnerID && !r.Paused {
			t.Fatal("the busy runner was not paused")
		}
	}
	// Cancelling a pipeline needs the api scope: a token with the least
	// scopes that manage runners is refused.
	if err := w.provider(t, ownerMinPAT, p.Scope()).CancelRun(ctx, j.Repository, j.RunID); !errors.Is(err, workload.ErrUnauthorized) {
		t.Fatalf("CancelRun without the api scope: %v, want ErrUnauthorized", err)
	}
	if err := p.CancelRun(ctx, j.Repository, j.RunID); err != nil {
		t.Fatalf("CancelRun: %v", err)
	}
	for _, id := range pl.Jobs {
		if sj, _ := w.sim.Job(id); sj.Status != gitlabsim.StatusCanceled {
			t.Fatalf("job %d after CancelRun: %s", id, sj.Status)
		}
	}
	if got, err := p.GetJob(ctx, j.Repository, j.ID); err != nil || got.State != workload.JobCompleted || got.Conclusion != "canceled" || got.CompletedAt.IsZero() {
		t.Fatalf("GetJob after cancel: %v %+v", err, got)
	}
	if err := p.DeregisterRunner(ctx, 0, "hf-busy"); err != nil {
		t.Fatalf("DeregisterRunner once the job ended: %v", err)
	}
	if _, err := p.GetJob(ctx, "acme/web", j.ID); !errors.Is(err, workload.ErrNotFound) {
		t.Fatalf("GetJob through another project: %v, want ErrNotFound", err)
	}
	for _, id := range []string{"", "0", "-1", "01", "12a", "99999999999999999999"} {
		if _, err := p.GetJob(ctx, j.Repository, id); !errors.Is(err, workload.ErrNotFound) {
			t.Fatalf("GetJob(%q): %v, want ErrNotFound", id, err)
		}
	}
}

// TestPagination: listings follow X-Next-Page past one page.
func TestPagination(t *testing.T) {
	w := newWorld(t, nil)
	ctx := context.Background()
	jobs := make([]gitlabsim.JobConfig, 130)
	for i := range jobs {
		jobs[i] = gitlabsim.JobConfig{Name: "j", Script: []string{"true"}, Tags: []string{"linux"}}
	}
	if _, err := w.sim.CreatePipeline(gitlabsim.PipelineRequest{Project: "acme/platform/app", Jobs: jobs}); err != nil {
		t.Fatal(err)
	}
	p := w.provider(t, maintPAT, glworkload.ScopeOf("acme/platform/app", "", false))
	got, err := p.QueuedJobs(ctx, []string{"acme/platform/app"})
	if err != nil || len(got) != 130 {
		t.Fatalf("QueuedJobs over two pages: %v, %d jobs", err, len(got))
	}
	for i := range 105 {
		if _, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: "hf-many-" + string(rune('a'+i%26)) + string(rune('a'+i/26)), Labels: []string{"linux"}}); err != nil {
			t.Fatal(err)
		}
	}
	rs, err := p.ListRunners(ctx, "hf-many-")
	if err != nil || len(rs) != 105 {
		t.Fatalf("ListRunners over two pages: %v, %d runners", err, len(rs))
	}
}

// TestRateLimitAndOutage: a 429 is a *workload.RateLimitError with
// GitLab's reset time, never waited out; a 5xx or no answer is
// ErrUnavailable.
func TestRateLimitAndOutage(t *testing.T) {
	w := newWorld(t, func(c *gitlabsim.Config) { c.RateLimit = 10 })
	ctx := context.Background()
	p := w.provider(t, maintPAT, glworkload.ScopeOf("acme/platform/app", "", false))
	if err := w.sim.SetRateLimitUsed(maintPAT, 10); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := p.GetRunner(ctx, "x")
	wait, limited := workload.RetryAfter(err, time.Now())
	if !limited || !errors.Is(err, workload.ErrRateLimited) || wait <= 0 || wait > time.Minute {
		t.Fatalf("rate limited call: %v (retry in %v)", err, wait)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatalf("the provider waited %v on a rate limit", time.Since(start))
	}
	w2 := newWorld(t, nil)
	p2 := w2.provider(t, maintPAT, glworkload.ScopeOf("acme/platform/app", "", false))
	w2.sim.InjectFault(gitlabsim.Fault{PathPrefix: "/projects", Status: http.StatusBadGateway, Count: 1})
	if _, err := p2.QueuedJobs(ctx, []string{"acme/platform/app"}); !errors.Is(err, workload.ErrUnavailable) {
		t.Fatalf("502: %v, want ErrUnavailable", err)
	}
	w2.srv.Close()
	if err := p2.VerifyScope(ctx); !errors.Is(err, workload.ErrUnavailable) {
		t.Fatalf("no answer: %v, want ErrUnavailable", err)
	}
}
