package gitlabsim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	gitlab "gitlab.com/gitlab-org/api/client-go"
)

// TestRunnersPerScope creates, reads, lists and deletes a runner of each
// type through client-go, as the operator will.
func TestRunnersPerScope(t *testing.T) {
	w := newWorld(t)
	app := w.projectID(t, "acme/platform/app")
	platform := w.groupID(t, "acme/platform")

	inst := w.createRunner(t, adminPAT, &gitlab.CreateUserRunnerOptions{RunnerType: ptr(InstanceType), Description: ptr("vm-1"), TagList: ptr([]string{"hyperfleet", "linux"})})
	grp := w.createRunner(t, groupToken, &gitlab.CreateUserRunnerOptions{RunnerType: ptr(GroupType), GroupID: ptr(platform), RunUntagged: ptr(false), TagList: ptr([]string{"hyperfleet"}), MaintenanceNote: ptr("made by HyperFleet")})
	proj := w.createRunner(t, maintRunner, &gitlab.CreateUserRunnerOptions{RunnerType: ptr(ProjectType), ProjectID: ptr(app), Paused: ptr(true), Locked: ptr(true)})
	for _, r := range []*gitlab.UserRunner{inst, grp, proj} {
		if !strings.HasPrefix(r.Token, "glrt-") || r.ID == 0 {
			t.Fatalf("runner %+v: want an id and a glrt- token", r)
		}
	}

	admin := w.client(t, adminPAT)
	d, _, err := admin.Runners.GetRunnerDetails(grp.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d.RunnerType != GroupType || d.RunUntagged || !slices.Equal(d.TagList, []string{"hyperfleet"}) || d.MaintenanceNote != "made by HyperFleet" ||
		len(d.Groups) != 1 || d.Groups[0].ID != platform || d.Status != "never_contacted" || d.Paused {
		t.Fatalf("group runner details: %+v", d)
	}
	d, _, err = w.client(t, maintPAT).Runners.GetRunnerDetails(proj.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d.RunnerType != ProjectType || !d.Paused || !d.Locked || !d.RunUntagged || len(d.Projects) != 1 || d.Projects[0].ID != app || d.IsShared {
		t.Fatalf("project runner details: %+v", d)
	}

	ids := func(rs []*gitlab.Runner) []int64 {
		var out []int64
		for _, r := range rs {
			out = append(out, r.ID)
		}
		return out
	}
	projRunners, _, err := w.client(t, maintPAT).Runners.ListProjectRunners("acme/platform/app", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(projRunners), []int64{inst.ID, grp.ID, proj.ID}; !slices.Equal(got, want) {
		t.Fatalf("project runners %v, want %v (instance, inherited group, own)", got, want)
	}
	groupRunners, _, err := w.client(t, ownerPAT).Runners.ListGroupsRunners("acme/platform/ci", &gitlab.ListGroupsRunnersOptions{Type: ptr(GroupType)})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(groupRunners); !slices.Equal(got, []int64{grp.ID}) {
		t.Fatalf("group runners of a subgroup, type group_type: %v, want the parent's %d", got, grp.ID)
	}
	all, _, err := admin.Runners.ListAllRunners(&gitlab.ListRunnersOptions{TagList: ptr([]string{"hyperfleet"})})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(all); !slices.Equal(got, []int64{inst.ID, grp.ID}) {
		t.Fatalf("all runners tagged hyperfleet: %v", got)
	}

	for _, r := range []*gitlab.UserRunner{inst, grp, proj} {
		if _, err := admin.Runners.DeleteRegisteredRunnerByID(r.ID); err != nil {
			t.Fatal(err)
		}
		if _, _, err := admin.Runners.GetRunnerDetails(r.ID); statusOf(err) != http.StatusNotFound {
			t.Fatalf("runner %d after delete: %v, want 404", r.ID, err)
		}
	}
}

// TestPermissionRefusals checks GitLab's role and scope rules for the
// calls the operator makes, and its 401/403/404 bodies.
func TestPermissionRefusals(t *testing.T) {
	w := newWorld(t)
	app := w.projectID(t, "acme/platform/app")
	web := w.projectID(t, "acme/web")
	acme := w.groupID(t, "acme")
	refuse := func(name string, token string, opt *gitlab.CreateUserRunnerOptions, status int) {
		t.Helper()
		_, _, err := w.client(t, token).Users.CreateUserRunner(opt)
		if statusOf(err) != status {
			t.Errorf("%s: %v, want %d", name, err, status)
		}
	}
	refuse("Developer creates a project runner", devPAT, &gitlab.CreateUserRunnerOptions{RunnerType: ptr(ProjectType), ProjectID: ptr(app)}, 403)
	refuse("project Maintainer creates a group runner", maintPAT, &gitlab.CreateUserRunnerOptions{RunnerType: ptr(GroupType), GroupID: ptr(acme)}, 403)
	refuse("group Owner creates an instance runner", ownerPAT, &gitlab.CreateUserRunnerOptions{RunnerType: ptr(InstanceType)}, 403)
	refuse("read_api token creates a runner", readPAT, &gitlab.CreateUserRunnerOptions{RunnerType: ptr(GroupType), GroupID: ptr(acme)}, 403)
	refuse("project token creates a runner of another project", projectToken, &gitlab.CreateUserRunnerOptions{RunnerType: ptr(ProjectType), ProjectID: ptr(web)}, 403)
	refuse("runner_type missing", adminPAT, &gitlab.CreateUserRunnerOptions{}, 400)
	refuse("untagged-only runner without tags", adminPAT, &gitlab.CreateUserRunnerOptions{RunnerType: ptr(InstanceType), RunUntagged: ptr(false)}, 400)
	refuse("unknown token", "glpat-nobody", &gitlab.CreateUserRunnerOptions{RunnerType: ptr(InstanceType)}, 401)

	// The bodies, as GitLab writes them.
	status, _, body := w.call(t, "POST", "/api/v4/user/runners", http.Header{"Private-Token": {readPAT}}, map[string]any{"runner_type": GroupType, "group_id": acme})
	var scopeErr struct{ Error, Scope string }
	if err := json.Unmarshal(body, &scopeErr); err != nil || status != 403 || scopeErr.Error != "insufficient_scope" || !strings.Contains(scopeErr.Scope, "create_runner") {
		t.Errorf("read_api token: %d %s, want 403 insufficient_scope naming create_runner", status, body)
	}
	status, _, body = w.call(t, "GET", "/api/v4/user", nil, nil)
	if status != 401 || string(body) != `{"message":"401 Unauthorized"}`+"\n" {
		t.Errorf("no credentials: %d %s", status, body)
	}
	// A project access token reaches its own project only, as GitLab's bot
	// users do; another project is not found (not forbidden).
	pc := w.client(t, projectToken)
	if _, _, err := pc.Projects.GetProject(app, nil); err != nil {
		t.Errorf("project token reads its project: %v", err)
	}
	if _, _, err := pc.Projects.GetProject("acme/web", nil); statusOf(err) != 404 {
		t.Errorf("project token reads another project: %v, want 404", err)
	}
	status, _, body = w.call(t, "GET", "/api/v4/projects/acme%2Fweb", http.Header{"Private-Token": {projectToken}}, nil)
	if status != 404 || string(body) != `{"message":"404 Project Not Found"}`+"\n" {
		t.Errorf("404 body: %d %s", status, body)
	}
	if _, _, err := w.client(t, ownerPAT).Runners.ListAllRunners(nil); statusOf(err) != 403 {
		t.Errorf("non-admin lists all runners: %v, want 403", err)
	}
	if _, _, err := w.client(t, devPAT).Runners.ListProjectRunners(app, nil); statusOf(err) != 403 {
		t.Errorf("Developer lists project runners: %v, want 403", err)
	}
	// A Maintainer of a project may not delete the group's runner.
	grp := w.createRunner(t, ownerPAT, &gitlab.CreateUserRunnerOptions{RunnerType: ptr(GroupType), GroupID: ptr(acme), TagList: ptr([]string{"x"})})
	if _, err := w.client(t, maintPAT).Runners.DeleteRegisteredRunnerByID(grp.ID); statusOf(err) != 403 {
		t.Errorf("project Maintainer deletes a group runner: %v, want 403", err)
	}
	if err := w.sim.RevokeToken(ownerPAT); err != nil {
		t.Fatal(err)
	}
	if _, _, err := w.client(t, ownerPAT).Users.CurrentUser(); statusOf(err) != 401 {
		t.Errorf("revoked token: %v, want 401", err)
	}
}

// TestProjectsAndGroups resolves projects and groups by URL-encoded full
// path and by id, and lists a group's projects with and without subgroups.
func TestProjectsAndGroups(t *testing.T) {
	w := newWorld(t)
	c := w.client(t, ownerPAT)
	p, _, err := c.Projects.GetProject("acme/platform/app", nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.PathWithNamespace != "acme/platform/app" || p.Namespace == nil || p.Namespace.FullPath != "acme/platform" || p.DefaultBranch != "main" {
		t.Fatalf("project: %+v", p)
	}
	byID, _, err := c.Projects.GetProject(p.ID, nil)
	if err != nil || byID.ID != p.ID {
		t.Fatalf("project by id: %v %+v", err, byID)
	}
	g, _, err := c.Groups.GetGroup("acme/platform/ci", nil)
	if err != nil {
		t.Fatal(err)
	}
	if g.FullPath != "acme/platform/ci" || g.ParentID != w.groupID(t, "acme/platform") {
		t.Fatalf("nested group: %+v", g)
	}
	names := func(ps []*gitlab.Project) []string {
		var out []string
		for _, p := range ps {
			out = append(out, p.PathWithNamespace)
		}
		slices.Sort(out)
		return out
	}
	direct, _, err := c.Groups.ListGroupProjects("acme/platform", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := names(direct); !slices.Equal(got, []string{"acme/platform/app"}) {
		t.Fatalf("direct projects: %v", got)
	}
	deep, _, err := c.Groups.ListGroupProjects(w.groupID(t, "acme"), &gitlab.ListGroupProjectsOptions{IncludeSubGroups: ptr(true)})
	if err != nil {
		t.Fatal(err)
	}
	if got := names(deep); !slices.Equal(got, []string{"acme/platform/app", "acme/platform/ci/tools", "acme/web"}) {
		t.Fatalf("projects with subgroups: %v", got)
	}
	// The project Maintainer sees the groups above its project, not their
	// other projects.
	mc := w.client(t, maintPAT)
	if _, _, err := mc.Groups.GetGroup("acme", nil); err != nil {
		t.Fatalf("member of a project reads its group: %v", err)
	}
	mine, _, err := mc.Groups.ListGroupProjects("acme", &gitlab.ListGroupProjectsOptions{IncludeSubGroups: ptr(true)})
	if err != nil || !slices.Equal(names(mine), []string{"acme/platform/app"}) {
		t.Fatalf("maintainer's view of acme: %v %v", err, names(mine))
	}
	if _, _, err := mc.Projects.GetProject("acme/web", nil); statusOf(err) != 404 {
		t.Fatalf("non-member reads a private project: %v, want 404", err)
	}
}

// TestPendingJobsAndPagination lists pending jobs a page at a time with
// GitLab's pagination headers, reads and cancels one.
func TestPendingJobsAndPagination(t *testing.T) {
	w := newWorld(t)
	var jobs []JobConfig
	for i := range 25 {
		jobs = append(jobs, JobConfig{Name: fmt.Sprintf("build-%02d", i), Script: []string{"true"}, Tags: []string{"hyperfleet", "linux"}})
	}
	pl, err := w.sim.CreatePipeline(PipelineRequest{Project: "acme/platform/app", Jobs: jobs})
	if err != nil {
		t.Fatal(err)
	}
	c := w.client(t, projectToken)
	var seen []int64
	opt := &gitlab.ListJobsOptions{Scope: &[]gitlab.BuildStateValue{gitlab.Pending}, ListOptions: gitlab.ListOptions{PerPage: 10}}
	for page := int64(1); page != 0; {
		opt.Page = page
		js, resp, err := c.Jobs.ListProjectJobs("acme/platform/app", opt)
		if err != nil {
			t.Fatal(err)
		}
		if resp.TotalItems != 25 || resp.TotalPages != 3 || resp.CurrentPage != page {
			t.Fatalf("page %d: total %d, pages %d, current %d", page, resp.TotalItems, resp.TotalPages, resp.CurrentPage)
		}
		for _, j := range js {
			if j.Status != "pending" || j.Pipeline.ID != pl.ID || !slices.Equal(j.TagList, []string{"hyperfleet", "linux"}) || j.CreatedAt == nil || j.Stage != "test" {
				t.Fatalf("pending job: %+v", j)
			}
			seen = append(seen, j.ID)
		}
		if link := resp.Header.Get("Link"); !strings.Contains(link, `rel="first"`) || !strings.Contains(link, `rel="last"`) {
			t.Fatalf("Link header: %q", link)
		}
		page = resp.NextPage
	}
	if len(seen) != 25 || seen[0] != pl.Jobs[24] {
		t.Fatalf("saw %d jobs, first %d (want newest first, %d)", len(seen), seen[0], pl.Jobs[24])
	}
	j, _, err := c.Jobs.CancelJob(w.projectID(t, "acme/platform/app"), pl.Jobs[0])
	if err != nil || j.Status != "canceled" {
		t.Fatalf("cancel: %v %+v", err, j)
	}
	got, _, err := c.Jobs.GetJob("acme/platform/app", pl.Jobs[0])
	if err != nil || got.Status != "canceled" || got.FinishedAt == nil {
		t.Fatalf("canceled job: %v %+v", err, got)
	}
	js, resp, err := c.Jobs.ListProjectJobs("acme/platform/app", &gitlab.ListJobsOptions{Scope: &[]gitlab.BuildStateValue{gitlab.Pending}})
	if err != nil || resp.TotalItems != 24 || len(js) != 20 || resp.NextPage != 2 {
		t.Fatalf("pending after cancel: %v total %d len %d next %d", err, resp.TotalItems, len(js), resp.NextPage)
	}
	if _, _, err := w.client(t, ownerPAT).Jobs.GetJob("acme/web", pl.Jobs[0]); statusOf(err) != 404 {
		t.Fatalf("job through another project: %v, want 404", err)
	}
}

// TestCancelPipeline cancels a pipeline of two stages through client-go:
// every unfinished job ends canceled, none skipped; a Reporter may not.
func TestCancelPipeline(t *testing.T) {
	w := newWorld(t)
	pl, err := w.sim.CreatePipeline(PipelineRequest{Project: "acme/platform/app", Jobs: []JobConfig{
		{Name: "build", Stage: "build", Script: []string{"true"}}, {Name: "test", Stage: "test", Script: []string{"true"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := w.client(t, readPAT).Pipelines.CancelPipelineBuild("acme/platform/app", pl.ID); statusOf(err) != 403 {
		t.Fatalf("cancel with a read_api token: %v, want 403", err)
	}
	c := w.client(t, devPAT)
	if _, _, err := c.Pipelines.CancelPipelineBuild("acme/web", pl.ID); statusOf(err) != 404 {
		t.Fatalf("cancel through another project: %v, want 404", err)
	}
	got, _, err := c.Pipelines.CancelPipelineBuild("acme/platform/app", pl.ID)
	if err != nil || got.ID != pl.ID || got.Status != "canceled" || got.ProjectID != w.projectID(t, "acme/platform/app") {
		t.Fatalf("cancel: %v %+v", err, got)
	}
	for _, id := range pl.Jobs {
		if j, _ := w.sim.Job(id); j.Status != StatusCanceled {
			t.Errorf("job %d is %s, want canceled", id, j.Status)
		}
	}
}

// TestPauseRunner pauses a runner with client-go's UpdateRunnerDetails: it
// then gets no job, and takes one again once unpaused; a Developer may not.
func TestPauseRunner(t *testing.T) {
	w := newWorld(t)
	c := w.client(t, maintPAT)
	pid := w.projectID(t, "acme/platform/app")
	r, _, err := c.Users.CreateUserRunner(&gitlab.CreateUserRunnerOptions{RunnerType: gitlab.Ptr(ProjectType), ProjectID: gitlab.Ptr(pid), TagList: gitlab.Ptr([]string{"linux"})})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.sim.CreatePipeline(PipelineRequest{Project: "acme/platform/app", Jobs: []JobConfig{{Name: "build", Script: []string{"true"}, Tags: []string{"linux"}}}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := w.client(t, devPAT).Runners.UpdateRunnerDetails(r.ID, &gitlab.UpdateRunnerDetailsOptions{Paused: gitlab.Ptr(true)}); statusOf(err) != 403 {
		t.Fatalf("a Developer pausing the runner: %v, want 403", err)
	}
	d, _, err := c.Runners.UpdateRunnerDetails(r.ID, &gitlab.UpdateRunnerDetailsOptions{Paused: gitlab.Ptr(true)})
	if err != nil || !d.Paused || d.ID != r.ID {
		t.Fatalf("pause: %v %+v", err, d)
	}
	request := map[string]any{"token": r.Token, "system_id": "s_0123456789ab"}
	if code, _, _ := w.call(t, http.MethodPost, APIPrefix+"/jobs/request", nil, request); code != http.StatusNoContent {
		t.Fatalf("job request of a paused runner: %d, want 204", code)
	}
	if _, _, err := c.Runners.UpdateRunnerDetails(r.ID, &gitlab.UpdateRunnerDetailsOptions{Paused: gitlab.Ptr(false)}); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := w.call(t, http.MethodPost, APIPrefix+"/jobs/request", nil, request); code != http.StatusCreated {
		t.Fatalf("job request once unpaused: %d, want 201", code)
	}
}

// TestTokenSelfAndUser reads the token's own scopes and its user, a bot user
// for a project access token.
func TestTokenSelfAndUser(t *testing.T) {
	w := newWorld(t)
	pat, _, err := w.client(t, maintRunner).PersonalAccessTokens.GetSinglePersonalAccessToken()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(pat.Scopes, []string{"create_runner"}) || !pat.Active || pat.Revoked {
		t.Fatalf("token self: %+v", pat)
	}
	u, _, err := w.client(t, projectToken).Users.CurrentUser()
	if err != nil {
		t.Fatal(err)
	}
	if !u.Bot || !strings.HasPrefix(u.Username, "project_"+strconv.FormatInt(w.projectID(t, "acme/platform/app"), 10)+"_bot_") {
		t.Fatalf("project token user: %+v", u)
	}
	if u, _, err := w.client(t, adminPAT).Users.CurrentUser(); err != nil || !u.IsAdmin || u.Username != "root" {
		t.Fatalf("admin user: %v %+v", err, u)
	}
}

// TestRateLimitAndFaults exhausts a token's budget (429 with GitLab's
// RateLimit headers and Retry-After), and injects a 5xx and latency.
func TestRateLimitAndFaults(t *testing.T) {
	w := newWorld(t)
	if err := w.sim.SetRateLimitUsed(ownerPAT, 2000); err != nil {
		t.Fatal(err)
	}
	status, h, body := w.call(t, "GET", "/api/v4/user", http.Header{"Private-Token": {ownerPAT}}, nil)
	if status != 429 || h.Get("RateLimit-Remaining") != "0" || h.Get("RateLimit-Limit") != "2000" || h.Get("Retry-After") == "" || h.Get("RateLimit-Reset") == "" || string(body) != "Retry later\n" {
		t.Fatalf("exhausted budget: %d %v %q", status, h, body)
	}
	if _, _, err := w.client(t, ownerPAT).Users.CurrentUser(); statusOf(err) != 429 {
		t.Fatalf("client-go on an exhausted budget: %v", err)
	}
	// Other tokens have budgets of their own.
	if _, _, err := w.client(t, adminPAT).Users.CurrentUser(); err != nil {
		t.Fatal(err)
	}

	w.sim.InjectFault(Fault{Method: "GET", PathPrefix: "/user", Status: 503, Count: 1})
	ac := w.client(t, adminPAT)
	if _, _, err := ac.Users.CurrentUser(); statusOf(err) != 503 {
		t.Fatalf("injected 503: %v", err)
	}
	if _, _, err := ac.Users.CurrentUser(); err != nil {
		t.Fatalf("after the fault was spent: %v", err)
	}
	w.sim.InjectFault(Fault{PathPrefix: "/user", Latency: 150 * time.Millisecond, Count: 1})
	start := time.Now()
	if _, _, err := ac.Users.CurrentUser(); err != nil || time.Since(start) < 150*time.Millisecond {
		t.Fatalf("latency fault: %v after %v", err, time.Since(start))
	}
	// client-go's default retries ride over a transient 5xx. Its backoff
	// for 5xx is fixed at 700-900 ms whatever the configured bounds
	// (Client.retryHTTPBackoff), which is most of this test's time.
	w.sim.InjectFault(Fault{PathPrefix: "/user", Status: 502, Count: 1})
	rc, err := gitlab.NewClient(adminPAT, gitlab.WithBaseURL(w.srv.URL+APIPrefix), gitlab.WithCustomRetryWaitMinMax(time.Millisecond, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := rc.Users.CurrentUser(); err != nil {
		t.Fatalf("client-go with retries after one 502: %v", err)
	}
}
