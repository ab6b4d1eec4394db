// Package gitlab is GitLab CI as a HyperFleet workload back-end
// (docs/gitlab.md): it reads a template's spec.bootstrap.gitlab, a
// RunnerPool's spec.workload.gitlab and a MachineClaim's
// spec.workloadConfig.gitlab, creates one runner per VM on a GitLab
// instance (GitLab.com or self-managed) with the operator's access token,
// deletes it when the VM goes, lists pending jobs for demand resync and
// verifies Job Hook webhooks. It calls GitLab's REST API v4 through
// gitlab.com/gitlab-org/api/client-go.
package gitlab

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	gl "gitlab.com/gitlab-org/api/client-go"
	"golang.org/x/time/rate"
	"k8s.io/utils/clock"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// DefaultURL is GitLab.com.
const DefaultURL = "https://gitlab.com"

// Defaults of a Provider's bounds.
const (
	defaultHTTPTimeout = 30 * time.Second
	// repositoriesTTL is how long a group's project listing is reused
	// (workload.Provider.Repositories may be minutes old).
	repositoriesTTL = 5 * time.Minute
	// maxPages bounds every paginated listing (100 per page), so that a
	// huge group or a misbehaving server cannot keep a reconcile busy.
	maxPages = 20
	perPage  = 100
	// maxErrorBody bounds how much of an error answer a message quotes.
	maxErrorBody = 200
	// minMaximumTimeout is the shortest maximum_timeout GitLab accepts
	// for a runner (600 s: "needs to be at least 10 minutes").
	minMaximumTimeout = 10 * time.Minute
	// defaultMaximumTimeout bounds the jobs of a runner whose claim has
	// no pool to bound them (a claim made by hand): the pools' default
	// spec.lifecycle.jobTimeout.
	defaultMaximumTimeout = 3 * time.Hour
)

// Runner types of POST /user/runners (GitLab's runner_type).
const (
	runnerTypeInstance = "instance_type"
	runnerTypeGroup    = "group_type"
	runnerTypeProject  = "project_type"
)

// Config is one GitLab account: the instance, the operator's access token
// and the scope runners are created in.
type Config struct {
	// URL is the GitLab instance (https://gitlab.com or a self-managed
	// one); the REST API is its /api/v4.
	URL string
	// Token is a personal, group or project access token.
	Token string
	// Scope is a project (Owner the namespace path, Repository its last
	// segment), a group (Owner its full path) or the instance.
	Scope workload.Scope
	// RunUntagged is the runners' run_untagged when a RunnerSpec does not
	// say (false: tagged jobs only).
	RunUntagged bool
	// AccessLevel is the runners' access_level: not_protected (default)
	// or ref_protected.
	AccessLevel string
	// Transport is the HTTP transport (TLS settings); nil is
	// http.DefaultTransport.
	Transport http.RoundTripper
	// HTTPTimeout bounds each call; zero is 30s.
	HTTPTimeout time.Duration
	// Clock stamps credentials and caches; nil is the real clock.
	Clock clock.PassiveClock
}

// Provider is a GitLab account as a workload.Provider.
type Provider struct {
	cfg    Config
	client *gl.Client
	clock  clock.PassiveClock

	mu sync.Mutex
	// namespaceID is the numeric id of the scope's project or group,
	// resolved once (POST /user/runners takes ids, not paths).
	namespaceID int64
	repos       []string
	reposAt     time.Time
}

var (
	_ workload.Provider  = (*Provider)(nil)
	_ workload.JobReader = (*Provider)(nil)
	_ workload.Sealer    = (*Provider)(nil)
)

// New builds a Provider. client-go's retries and its client-side rate
// limiter are off: a Provider never waits out a rate limit or a 5xx, it
// returns the error (a *workload.RateLimitError for 429) so that the
// controller requeues (workload.Provider's contract).
func New(cfg Config) (*Provider, error) {
	if cfg.Token == "" {
		return nil, errors.New("gitlab: an access token is required")
	}
	if cfg.Scope.IsZero() {
		return nil, errors.New("gitlab: a project, group or instance scope is required")
	}
	base, err := url.Parse(cmp.Or(cfg.URL, DefaultURL))
	if err != nil || base.Host == "" || base.Scheme != "https" && base.Scheme != "http" {
		return nil, fmt.Errorf("gitlab: instance URL %q is not an http(s) URL", cfg.URL)
	}
	cfg.URL = strings.TrimRight(base.String(), "/")
	tr := cfg.Transport
	if tr == nil {
		tr = http.DefaultTransport
	}
	hc := &http.Client{Transport: observed{next: tr, instance: cfg.URL}, Timeout: cmp.Or(cfg.HTTPTimeout, defaultHTTPTimeout)}
	c, err := gl.NewClient(cfg.Token, gl.WithBaseURL(cfg.URL+"/api/v4"), gl.WithHTTPClient(hc),
		gl.WithoutRetries(), gl.WithCustomLimiter(rate.NewLimiter(rate.Inf, 0)))
	if err != nil {
		return nil, fmt.Errorf("gitlab: build the client: %w", err)
	}
	clk := cfg.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Provider{cfg: cfg, client: c, clock: clk}, nil
}

// Scope implements workload.Provider.
func (p *Provider) Scope() workload.Scope { return p.cfg.Scope }

// URL is the instance URL runners register to (gitlab-runner's --url).
func (p *Provider) URL() string { return p.cfg.URL }

// scopePath is the URL-encodable full path of a project or group scope.
func (p *Provider) scopePath() string {
	return p.cfg.Scope.String()
}

// VerifyScope implements workload.Provider. It checks, in GitLab's terms,
// what creating a runner in the scope needs: the token is valid and has
// the scopes create_runner, manage_runner and read_api (or api); the project or
// group exists and the token sees it; and its user holds the role runner
// management needs there, checked by listing the scope's runners
// (Maintainer of the project or group; for the instance, an
// administrator). GitLab asks Owner, not Maintainer, to create a group
// runner: a group Maintainer passes this check and meets the refusal at
// the first runner, which is reported as ErrUnauthorized then.
func (p *Provider) VerifyScope(ctx context.Context) error {
	tok, resp, err := p.client.PersonalAccessTokens.GetSinglePersonalAccessToken(gl.WithContext(ctx))
	if err != nil {
		return p.mapErr("read the access token's scopes", resp, err)
	}
	has := func(want ...string) bool {
		for _, s := range tok.Scopes {
			for _, w := range want {
				if s == w {
					return true
				}
			}
		}
		return false
	}
	// Creating needs create_runner, deleting manage_runner, reading jobs
	// read_api; api covers them all (and cancelling a pipeline, which
	// only api allows: docs/gitlab.md).
	if !has("create_runner", "api") || !has("manage_runner", "api") || !has("read_api", "api") {
		return fmt.Errorf("gitlab: access token %q has scopes %v; it needs create_runner, manage_runner and read_api (or api): %w",
			tok.Name, tok.Scopes, workload.ErrUnauthorized)
	}
	s := p.cfg.Scope
	opts := gl.ListOptions{PerPage: 1}
	switch {
	case s.Instance:
		_, resp, err = p.client.Runners.ListAllRunners(&gl.ListRunnersOptions{ListOptions: opts}, gl.WithContext(ctx))
	case s.IsOrganization():
		_, resp, err = p.client.Runners.ListGroupsRunners(s.Owner, &gl.ListGroupsRunnersOptions{ListOptions: opts}, gl.WithContext(ctx))
	default:
		_, resp, err = p.client.Runners.ListProjectRunners(p.scopePath(), &gl.ListProjectRunnersOptions{ListOptions: opts}, gl.WithContext(ctx))
	}
	if err != nil {
		return p.mapErr("verify that the token manages the runners of "+s.String(), resp, err)
	}
	return nil
}

// scopeID resolves the scope's project or group id, once.
func (p *Provider) scopeID(ctx context.Context) (int64, error) {
	p.mu.Lock()
	id := p.namespaceID
	p.mu.Unlock()
	if id != 0 || p.cfg.Scope.Instance {
		return id, nil
	}
	s := p.cfg.Scope
	if s.IsOrganization() {
		g, resp, err := p.client.Groups.GetGroup(s.Owner, nil, gl.WithContext(ctx))
		if err != nil {
			return 0, p.mapErr("read group "+s.Owner, resp, err)
		}
		id = g.ID
	} else {
		pr, resp, err := p.client.Projects.GetProject(p.scopePath(), nil, gl.WithContext(ctx))
		if err != nil {
			return 0, p.mapErr("read project "+s.String(), resp, err)
		}
		id = pr.ID
	}
	p.mu.Lock()
	p.namespaceID = id
	p.mu.Unlock()
	return id, nil
}

// IssueCredential implements workload.Provider: it creates a runner of the
// scope's type (POST /user/runners) described by spec.Name, with spec's
// labels as its tags, unpaused, and returns its runner authentication
// token. GitLab keeps no uniqueness of descriptions, so a name is not
// checked for being taken: the caller's names are unique (claim names).
//
// Every attribute that bounds what the token can get is explicit: the
// access level (not_protected or ref_protected, never GitLab's default
// left to chance), locked to its project, and maximum_timeout, which caps
// the timeout GitLab gives any job of the runner (spec.JobTimeout, at
// least GitLab's minimum of 10 minutes; 3 hours when no pool bounds it).
// A runner authentication token is multi-job on GitLab's side: the
// operator seals the runner at its first job (SealRunner).
func (p *Provider) IssueCredential(ctx context.Context, spec workload.RunnerSpec) (workload.Credential, error) {
	switch spec.Method {
	case "", MethodRunnerAuthToken, workload.Method(hfv1.BootstrapJITConfig):
		// jit-config is the template's default method, which GitLab runners
		// read as theirs: created up front, good for one VM.
	default:
		return workload.Credential{}, fmt.Errorf("gitlab: credential method %q is not GitLab's; runners get a runner authentication token: %w", spec.Method, workload.ErrInvalidRequest)
	}
	if spec.Name == "" {
		return workload.Credential{}, fmt.Errorf("gitlab: a runner needs a description (its name): %w", workload.ErrInvalidRequest)
	}
	untagged := p.cfg.RunUntagged
	if spec.RunUntagged != nil {
		untagged = *spec.RunUntagged
	}
	if len(spec.Labels) == 0 && !untagged {
		return workload.Credential{}, fmt.Errorf("gitlab: runner %s has no tags and may not run untagged jobs, so it could take no job: give the pool tags or set runUntagged: %w", spec.Name, workload.ErrInvalidRequest)
	}
	opts := &gl.CreateUserRunnerOptions{
		Description:    gl.Ptr(spec.Name),
		Paused:         gl.Ptr(false),
		Locked:         gl.Ptr(true),
		RunUntagged:    gl.Ptr(untagged),
		TagList:        gl.Ptr(append([]string{}, spec.Labels...)),
		AccessLevel:    gl.Ptr(cmp.Or(p.cfg.AccessLevel, "not_protected")),
		MaximumTimeout: gl.Ptr(maximumTimeout(spec.JobTimeout)),
		MaintenanceNote: gl.Ptr("Created by HyperFleet for one VM and one job; " +
			"paused at its first job, deleted with the VM."),
	}
	s := p.cfg.Scope
	id, err := p.scopeID(ctx)
	if err != nil {
		return workload.Credential{}, err
	}
	switch {
	case s.Instance:
		opts.RunnerType = gl.Ptr(runnerTypeInstance)
	case s.IsOrganization():
		opts.RunnerType, opts.GroupID = gl.Ptr(runnerTypeGroup), gl.Ptr(id)
	default:
		opts.RunnerType, opts.ProjectID = gl.Ptr(runnerTypeProject), gl.Ptr(id)
	}
	issued := p.clock.Now()
	r, resp, err := p.client.Users.CreateUserRunner(opts, gl.WithContext(ctx))
	if err != nil {
		return workload.Credential{}, p.mapErr("create runner "+spec.Name+" in "+s.String(), resp, err)
	}
	if r.Token == "" {
		return workload.Credential{}, fmt.Errorf("gitlab: runner %s was created without a token: %w", spec.Name, workload.ErrUnavailable)
	}
	cred := workload.Credential{
		Method: MethodRunnerAuthToken, Secret: workload.NewSecret(r.Token),
		RunnerName: spec.Name, RunnerID: r.ID, RegistrationURL: p.cfg.URL, IssuedAt: issued,
	}
	if r.TokenExpiresAt != nil {
		cred.ExpiresAt = *r.TokenExpiresAt
	}
	return cred, nil
}

// maximumTimeout is the runner's maximum_timeout, in seconds, for jobs the
// operator lets run for d (zero: no pool says; defaultMaximumTimeout):
// never below the 10 minutes GitLab accepts, so that a shorter jobTimeout
// is the operator's own hard limit (it cancels the job and destroys the
// VM) and GitLab's cap a second line behind it.
func maximumTimeout(d time.Duration) int64 {
	if d <= 0 {
		d = defaultMaximumTimeout
	}
	d = max(d, minMaximumTimeout)
	return int64((d + time.Second - 1) / time.Second)
}

// runnerDetails is GET /runners/:id as GitLab 17+ answers it: client-go's
// RunnerDetails lacks job_execution_status, which says whether the runner
// is running a job.
type runnerDetails struct {
	gl.RunnerDetails
	JobExecutionStatus string `json:"job_execution_status"`
}

func (p *Provider) runnerDetails(ctx context.Context, id int64) (*runnerDetails, error) {
	req, err := p.client.NewRequest(http.MethodGet, "runners/"+strconv.FormatInt(id, 10), nil, []gl.RequestOptionFunc{gl.WithContext(ctx)})
	if err != nil {
		return nil, fmt.Errorf("gitlab: build the request for runner %d: %w", id, err)
	}
	var d runnerDetails
	resp, err := p.client.Do(req, &d)
	if err != nil {
		return nil, p.mapErr(fmt.Sprintf("read runner %d", id), resp, err)
	}
	return &d, nil
}

// DeregisterRunner implements workload.Provider: DELETE /runners/:id (with
// id 0, the scope's runner described by name). A runner that is gone is
// success. GitLab deletes a busy runner and fails its job, so a runner
// that is running a job (job_execution_status active) is left with
// ErrRunnerBusy, as the contract asks. The runner is paused first
// (PUT /runners/:id paused=true): GitLab gives a paused runner no job, so
// it cannot take one between the check and the deletion; a busy runner
// stays paused, which only stops it taking a next job, and is deleted on
// a later call.
func (p *Provider) DeregisterRunner(ctx context.Context, id int64, name string) error {
	id, found, err := workload.RunnerToRemove(ctx, p.GetRunner, id, name)
	if !found || err != nil {
		return err
	}
	switch err := p.pause(ctx, id); {
	case errors.Is(err, workload.ErrNotFound):
		return nil
	case err != nil:
		return err
	}
	d, err := p.runnerDetails(ctx, id)
	if errors.Is(err, workload.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if d.JobExecutionStatus == "active" {
		return fmt.Errorf("gitlab: runner %d (%s) is running a job: %w", id, d.Description, workload.ErrRunnerBusy)
	}
	resp, err := p.client.Runners.DeleteRegisteredRunnerByID(id, gl.WithContext(ctx))
	if err != nil && (resp == nil || resp.StatusCode != http.StatusNotFound) {
		return p.mapErr(fmt.Sprintf("delete runner %d", id), resp, err)
	}
	return nil
}

// SealRunner implements workload.Sealer: PUT /runners/:id paused=true
// (with id 0, the scope's runner described by name). GitLab gives a
// paused runner no job (POST /jobs/request answers 204), while a job it
// already runs goes on: the job's updates and log authenticate with the
// job's own token, not the runner's. Pausing a paused runner changes
// nothing.
func (p *Provider) SealRunner(ctx context.Context, id int64, name string) error {
	if id == 0 {
		r, err := p.GetRunner(ctx, name)
		if err != nil {
			return err
		}
		id = r.ID
	}
	return p.pause(ctx, id)
}

// pause pauses runner id; ErrNotFound when it is gone.
func (p *Provider) pause(ctx context.Context, id int64) error {
	_, resp, err := p.client.Runners.UpdateRunnerDetails(id, &gl.UpdateRunnerDetailsOptions{Paused: gl.Ptr(true)}, gl.WithContext(ctx))
	if err != nil {
		return p.mapErr(fmt.Sprintf("pause runner %d", id), resp, err)
	}
	return nil
}

// listedRunner is a runner of GitLab's runner lists (the Runner entity)
// with job_execution_status (GitLab 17+), which client-go's Runner lacks:
// it says whether the runner runs a job, so that the resync sees a busy
// runner in the list alone.
type listedRunner struct {
	gl.Runner
	JobExecutionStatus string `json:"job_execution_status"`
}

// listRunners lists the scope's own runners (of its runner type: a
// project's or group's list also holds its ancestors' and the instance's),
// all pages up to the bound.
func (p *Provider) listRunners(ctx context.Context) ([]listedRunner, error) {
	s := p.cfg.Scope
	var out []listedRunner
	for page := int64(1); page > 0 && page <= maxPages; {
		lo := gl.ListOptions{PerPage: perPage, Page: page}
		path, opt := "runners/all", any(&gl.ListRunnersOptions{ListOptions: lo, Type: gl.Ptr(runnerTypeInstance)})
		switch {
		case s.Instance:
		case s.IsOrganization():
			path, opt = "groups/"+gl.PathEscape(s.Owner)+"/runners", &gl.ListGroupsRunnersOptions{ListOptions: lo, Type: gl.Ptr(runnerTypeGroup)}
		default:
			path, opt = "projects/"+gl.PathEscape(p.scopePath())+"/runners", &gl.ListProjectRunnersOptions{ListOptions: lo, Type: gl.Ptr(runnerTypeProject)}
		}
		req, err := p.client.NewRequest(http.MethodGet, path, opt, []gl.RequestOptionFunc{gl.WithContext(ctx)})
		if err != nil {
			return nil, fmt.Errorf("gitlab: build the request for the runners of %s: %w", s, err)
		}
		var rs []listedRunner
		resp, err := p.client.Do(req, &rs)
		if err != nil {
			return nil, p.mapErr("list the runners of "+s.String(), resp, err)
		}
		out = append(out, rs...)
		page = resp.NextPage
	}
	return out, nil
}

// runnerState maps GitLab's status and job_execution_status.
func runnerState(status, execution string) workload.RunnerState {
	switch {
	case execution == "active":
		return workload.RunnerBusy
	case status == "online":
		return workload.RunnerIdle
	}
	return workload.RunnerOffline
}

// GetRunner implements workload.Provider: the scope's own runner described
// by name, with its tags and state.
func (p *Provider) GetRunner(ctx context.Context, name string) (workload.Runner, error) {
	rs, err := p.listRunners(ctx)
	if err != nil {
		return workload.Runner{}, err
	}
	for _, r := range rs {
		if r.Description != name {
			continue
		}
		d, err := p.runnerDetails(ctx, r.ID)
		if err != nil {
			return workload.Runner{}, err
		}
		own, err := p.owns(ctx, d)
		if err != nil {
			return workload.Runner{}, err
		}
		if !own {
			continue
		}
		return workload.Runner{ID: d.ID, Name: d.Description, State: runnerState(d.Status, d.JobExecutionStatus), Labels: d.TagList}, nil
	}
	return workload.Runner{}, fmt.Errorf("gitlab: no runner %s in %s: %w", name, p.cfg.Scope, workload.ErrNotFound)
}

// owns reports whether a runner is the scope's own: a group's list also
// holds its ancestor groups' runners, and a project's the project runners
// other projects own and share with it. A group runner belongs to its one
// group; a project runner to the first project it lists (its owner).
func (p *Provider) owns(ctx context.Context, d *runnerDetails) (bool, error) {
	s := p.cfg.Scope
	if s.Instance {
		return d.RunnerType == runnerTypeInstance, nil
	}
	id, err := p.scopeID(ctx)
	if err != nil {
		return false, err
	}
	if s.IsOrganization() {
		return d.RunnerType == runnerTypeGroup && len(d.Groups) > 0 && d.Groups[0].ID == id, nil
	}
	return d.RunnerType == runnerTypeProject && len(d.Projects) > 0 && d.Projects[0].ID == id, nil
}

// ListRunners implements workload.Provider: the scope's runners whose
// description starts with prefix. Tags are not read (one call per runner);
// State is offline, idle or busy from the list's status and
// job_execution_status, so that the resync sees a runner take its job
// (and the operator seals it) even when the job's Job Hooks are lost.
func (p *Provider) ListRunners(ctx context.Context, prefix string) ([]workload.Runner, error) {
	rs, err := p.listRunners(ctx)
	if err != nil {
		return nil, err
	}
	var out []workload.Runner
	for _, r := range rs {
		if strings.HasPrefix(r.Description, prefix) {
			out = append(out, workload.Runner{ID: r.ID, Name: r.Description, State: runnerState(r.Status, r.JobExecutionStatus)})
		}
	}
	return out, nil
}

// jobState maps a GitLab job status to the neutral one. Jobs that do not
// wait for a runner yet (created, manual, ...) read as queued: GetJob meets
// them only for jobs demand already knows, and only pending ones are listed
// (QueuedJobs) or taken from webhooks as demand.
func jobState(status string) workload.JobState {
	switch status {
	case "created", "pending", "waiting_for_resource", "waiting_for_callback", "scheduled", "manual":
		return workload.JobQueued
	case "preparing", "running", "canceling":
		// preparing: a runner took the job and prepares its environment.
		return workload.JobInProgress
	}
	return workload.JobCompleted
}

// toJob is a GitLab job of project (its full path) in neutral terms.
func toJob(project string, j *gl.Job) workload.Job {
	out := workload.Job{
		ID: formatJobID(j.ID), Platform: hfv1.WorkloadGitLabCI, RunID: j.Pipeline.ID, Repository: project, Labels: j.TagList,
		State: jobState(j.Status), Name: j.Name, WorkflowName: j.Stage,
		RunnerName: j.Runner.Description, RunnerID: j.Runner.ID,
	}
	if out.State == workload.JobCompleted {
		out.Conclusion = j.Status
	}
	if j.CreatedAt != nil {
		out.CreatedAt = *j.CreatedAt
	}
	if j.StartedAt != nil {
		out.StartedAt = *j.StartedAt
	}
	if j.FinishedAt != nil {
		out.CompletedAt = *j.FinishedAt
	}
	return out
}

// QueuedJobs implements workload.Provider: GET /projects/:id/jobs with
// scope[]=pending for each project (full path) in the scope.
func (p *Provider) QueuedJobs(ctx context.Context, repositories []string) ([]workload.Job, error) {
	var out []workload.Job
	for _, repo := range repositories {
		if !p.cfg.Scope.Contains(repo) {
			continue
		}
		js, err := everyPage(p, "list the pending jobs of "+repo, func(page int64) ([]*gl.Job, *gl.Response, error) {
			opts := &gl.ListJobsOptions{ListOptions: gl.ListOptions{PerPage: perPage, Page: page}, Scope: &[]gl.BuildStateValue{gl.Pending}}
			return p.client.Jobs.ListProjectJobs(repo, opts, gl.WithContext(ctx))
		})
		if err != nil {
			return nil, err
		}
		for _, j := range js {
			out = append(out, toJob(repo, j))
		}
	}
	return out, nil
}

// everyPage reads a listing page by page, at most maxPages: list reads the
// page it is given, and its response says which page follows; what names
// the listing in errors.
func everyPage[T any](p *Provider, what string, list func(page int64) ([]T, *gl.Response, error)) ([]T, error) {
	var out []T
	for page := int64(1); page > 0 && page <= maxPages; {
		items, resp, err := list(page)
		if err != nil {
			return nil, p.mapErr(what, resp, err)
		}
		out = append(out, items...)
		page = resp.NextPage
	}
	return out, nil
}

// Repositories implements workload.Provider: the project, or the group's
// projects with its subgroups' (cached for a few minutes). For the
// instance it lists nothing: demand there comes from webhooks only
// (docs/gitlab.md), since scanning every project of an instance is not a
// resync GitLab's API bounds.
func (p *Provider) Repositories(ctx context.Context) ([]string, error) {
	s := p.cfg.Scope
	switch {
	case s.Instance:
		return nil, nil
	case !s.IsOrganization():
		return []string{s.String()}, nil
	}
	now := p.clock.Now()
	p.mu.Lock()
	if p.repos != nil && now.Sub(p.reposAt) < repositoriesTTL {
		defer p.mu.Unlock()
		return append([]string(nil), p.repos...), nil
	}
	p.mu.Unlock()
	ps, err := everyPage(p, "list the projects of group "+s.Owner, func(page int64) ([]*gl.Project, *gl.Response, error) {
		opts := &gl.ListGroupProjectsOptions{ListOptions: gl.ListOptions{PerPage: perPage, Page: page}, IncludeSubGroups: gl.Ptr(true)}
		return p.client.Groups.ListGroupProjects(s.Owner, opts, gl.WithContext(ctx))
	})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, pr := range ps {
		out = append(out, pr.PathWithNamespace)
	}
	p.mu.Lock()
	p.repos, p.reposAt = out, now
	p.mu.Unlock()
	return append([]string(nil), out...), nil
}

// GetJob implements workload.JobReader: GET /projects/:id/jobs/:job_id.
// GitLab answers 404 for an unknown id and for a job of another project;
// an id that is not one of GitLab's (a positive decimal number, as
// formatJobID writes it) is ErrNotFound without a request.
func (p *Provider) GetJob(ctx context.Context, repository string, id string) (workload.Job, error) {
	n, ok := parseJobID(id)
	if !ok {
		return workload.Job{}, fmt.Errorf("gitlab: read job %q of %s: GitLab's job ids are positive decimal numbers: %w", truncate(id, 64), repository, workload.ErrNotFound)
	}
	j, resp, err := p.client.Jobs.GetJob(repository, n, gl.WithContext(ctx))
	if err != nil {
		return workload.Job{}, p.mapErr(fmt.Sprintf("read job %d of %s", n, repository), resp, err)
	}
	return toJob(repository, j), nil
}

// CancelRun implements workload.Provider: it cancels the job's pipeline
// (POST /projects/:id/pipelines/:pipeline_id/cancel). A pipeline that is
// already gone is success.
func (p *Provider) CancelRun(ctx context.Context, repository string, runID int64) error {
	_, resp, err := p.client.Pipelines.CancelPipelineBuild(repository, runID, gl.WithContext(ctx))
	if err != nil && (resp == nil || resp.StatusCode != http.StatusNotFound) {
		return p.mapErr(fmt.Sprintf("cancel pipeline %d of %s", runID, repository), resp, err)
	}
	return nil
}

// mapErr turns a client-go error into the workload package's: 401 and 403
// are ErrUnauthorized, 404 ErrNotFound, 400 and 422 ErrInvalidRequest, 429
// a *workload.RateLimitError (Retry-After, else RateLimit-Reset), and 5xx
// or no answer ErrUnavailable. The message quotes GitLab's, bounded.
func (p *Provider) mapErr(what string, resp *gl.Response, err error) error {
	if resp == nil || resp.Response == nil {
		return fmt.Errorf("gitlab: %s: %w: %w", what, workload.ErrUnavailable, err)
	}
	msg := err.Error()
	var er *gl.ErrorResponse
	if errors.As(err, &er) && er.Message != "" {
		msg = er.Message
	}
	if len(msg) > maxErrorBody {
		msg = msg[:maxErrorBody] + "…"
	}
	code := resp.StatusCode
	switch code {
	case http.StatusTooManyRequests:
		return fmt.Errorf("gitlab: %s: %w", what, &workload.RateLimitError{RetryAt: retryAt(resp.Header, p.clock.Now())})
	case http.StatusUnauthorized, http.StatusForbidden:
		return fmt.Errorf("gitlab: %s: %d %s: %w", what, code, msg, workload.ErrUnauthorized)
	case http.StatusNotFound:
		return fmt.Errorf("gitlab: %s: %d %s: %w", what, code, msg, workload.ErrNotFound)
	case http.StatusBadRequest, http.StatusUnprocessableEntity, http.StatusConflict:
		return fmt.Errorf("gitlab: %s: %d %s: %w", what, code, msg, workload.ErrInvalidRequest)
	}
	return fmt.Errorf("gitlab: %s: %d %s: %w", what, code, msg, workload.ErrUnavailable)
}

// GitLab's job ids are numbers (workload.FormatNumericJobID).
var formatJobID, parseJobID = workload.FormatNumericJobID, workload.ParseNumericJobID

// retryAt reads when a throttled call may be retried: Retry-After
// (seconds), else RateLimit-Reset (Unix time), else a minute from now
// (GitLab's throttles count per minute).
func retryAt(h http.Header, now time.Time) time.Time {
	if s, err := strconv.Atoi(strings.TrimSpace(h.Get("Retry-After"))); err == nil && s >= 0 {
		return now.Add(time.Duration(s) * time.Second)
	}
	if u, err := strconv.ParseInt(strings.TrimSpace(h.Get("RateLimit-Reset")), 10, 64); err == nil && u > 0 {
		return time.Unix(u, 0)
	}
	return now.Add(time.Minute)
}
