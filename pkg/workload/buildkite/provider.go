package buildkite

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	bk "github.com/buildkite/go-buildkite/v4"
	"k8s.io/utils/clock"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// DefaultTokenLifetime is how long a claim's cluster agent token, and the
// job acquisition token it issues, stay usable. The operator issues them
// once the VM runs (or, for a warm VM, once its pool bound it a job), and
// the VM's agent registers within seconds; an agent keeps working on its
// own access token after that, so the token only has to outlast a slow
// start. It also dies on its own if deleting it fails.
const DefaultTokenLifetime = 30 * time.Minute

// tokenDescriptionPrefix starts the description of every cluster agent
// token the operator creates; the rest is the agent's (the claim's) name.
const tokenDescriptionPrefix = "hyperfleet agent "

// RequiredScopes are the REST API scopes the operator's token needs
// (docs/buildkite.md): the organization and cluster (VerifyScope), agent
// tokens (IssueCredential, DeregisterRunner), agents (GetRunner,
// ListRunners, stopping one), and builds (demand, CancelRun).
var RequiredScopes = []string{
	"read_organizations", "read_clusters", "write_clusters",
	"read_agents", "write_agents", "read_builds", "write_builds",
}

// Config is one Buildkite account: an organization's cluster and the
// operator's API token.
type Config struct {
	// APIURL is the REST API without /v2 (DefaultAPIURL).
	APIURL string
	// AgentEndpoint is the agent API VMs register to (DefaultAgentEndpoint).
	AgentEndpoint string
	// Organization is the organization's slug; Cluster the cluster's UUID.
	Organization, Cluster string
	// Scope is the organization, or one pipeline of it.
	Scope workload.Scope
	// Token is the API access token.
	Token string
	// Transport is the base transport; nil is http.DefaultTransport.
	Transport http.RoundTripper
	// Clock stamps credentials; nil is the real clock.
	Clock clock.PassiveClock
	// HTTPTimeout bounds each call (default 30s).
	HTTPTimeout time.Duration
	// TokenLifetime is how long agent tokens last (DefaultTokenLifetime).
	TokenLifetime time.Duration
}

// fingerprint identifies a configuration, the token included, for the
// Backend's provider cache; it never prints the token.
func (c Config) fingerprint() string {
	h := sha256.New()
	for _, s := range []string{c.APIURL, c.AgentEndpoint, c.Organization, c.Cluster, c.Scope.String(), c.Token, c.HTTPTimeout.String(), c.TokenLifetime.String()} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Provider is a Buildkite cluster as a workload.Provider. Runners are
// agents, named after their claims; the single-use credential of one is a
// job acquisition token for the one job its claim is bound to, issued with
// a cluster agent token made for the claim that never leaves the operator
// (stacks.go).
type Provider struct {
	cfg    Config
	client *bk.Client
	// stacks calls the Stacks API (stacks.go) with an agent token.
	stacks *http.Client
	clock  clock.PassiveClock

	mu          sync.Mutex
	pipelines   []string
	pipelinesAt time.Time
}

var _ workload.Provider = (*Provider)(nil)

// New builds a Provider.
func New(cfg Config) (*Provider, error) {
	if cfg.Organization == "" || cfg.Cluster == "" {
		return nil, errors.New("buildkite: an organization and a cluster are required")
	}
	cfg.APIURL = cmp.Or(cfg.APIURL, DefaultAPIURL)
	cfg.AgentEndpoint = cmp.Or(cfg.AgentEndpoint, DefaultAgentEndpoint)
	if u, err := url.Parse(cfg.APIURL); err != nil || u.Host == "" {
		return nil, fmt.Errorf("buildkite: API URL %q is not a URL", cfg.APIURL)
	}
	cfg.HTTPTimeout = cmp.Or(cfg.HTTPTimeout, 30*time.Second)
	cfg.TokenLifetime = cmp.Or(cfg.TokenLifetime, DefaultTokenLifetime)
	clk := cfg.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	base := cfg.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	// The metrics see every call, those the gate refuses locally too (code
	// 0), as GitHub's do.
	gate := &rateGate{next: base, clock: clk, organization: cfg.Organization}
	hc := &http.Client{Timeout: cfg.HTTPTimeout, Transport: metrics.Transport(gate, operation)}
	c, err := bk.NewClient(bk.WithBaseURL(strings.TrimSuffix(cfg.APIURL, "/")+"/"), bk.WithTokenAuth(cfg.Token),
		bk.WithHTTPClient(hc), bk.WithUserAgent("hyperfleet"))
	if err != nil {
		return nil, fmt.Errorf("buildkite: client: %w", err)
	}
	stacks := &http.Client{Timeout: cfg.HTTPTimeout, Transport: metrics.Transport(base, operation)}
	return &Provider{cfg: cfg, client: c, stacks: stacks, clock: clk}, nil
}

// Scope implements workload.Provider.
func (p *Provider) Scope() workload.Scope { return p.cfg.Scope }

// VerifyScope implements workload.Provider: the token holds every scope in
// RequiredScopes (GET /v2/access-token says which it has), and the
// organization and the cluster exist for it.
func (p *Provider) VerifyScope(ctx context.Context) error {
	tok, _, err := p.client.AccessTokens.Get(ctx)
	if err != nil {
		return apiError("read the API token's scopes", err)
	}
	var missing []string
	for _, s := range RequiredScopes {
		if !slices.Contains(tok.Scopes, s) {
			missing = append(missing, s)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("buildkite: the API token lacks the scopes %s (docs/buildkite.md): %w", strings.Join(missing, ", "), workload.ErrUnauthorized)
	}
	if _, _, err := p.client.Organizations.Get(ctx, p.cfg.Organization); err != nil {
		return apiError("organization "+p.cfg.Organization, err)
	}
	if _, _, err := p.client.Clusters.Get(ctx, p.cfg.Organization, p.cfg.Cluster); err != nil {
		return apiError("cluster "+p.cfg.Cluster, err)
	}
	return nil
}

// tokenCreate is the body of POST .../clusters/{id}/tokens with the
// expires_at Buildkite's API takes, which go-buildkite's
// ClusterTokenCreateUpdate (v4.23) does not carry: the token must die on
// its own even if deleting it fails.
type tokenCreate struct {
	Description string `json:"description"`
	ExpiresAt   string `json:"expires_at"`
}

// IssueCredential implements workload.Provider: the job acquisition token
// (MethodJobToken, stacks.go) of the job the runner is bound to
// (spec.Job), which registers one agent that may acquire that job only.
// It is issued with a cluster agent token made for the agent spec.Name,
// described "hyperfleet agent <name>" and expiring after TokenLifetime,
// which the operator keeps: a token an earlier attempt made for the same
// name is deleted first, so a claim holds at most one, and it goes once the
// agent registered (RetireRegistration) or the claim ends
// (DeregisterRunner), which revokes the job token too. A runner bound to no
// job gets nothing (ErrJobNotBindable): a cluster agent token registers
// any number of agents that take any job of the cluster's queues, and may
// call the Stacks API, so none ever reaches a VM. spec.Method is ignored.
func (p *Provider) IssueCredential(ctx context.Context, spec workload.RunnerSpec) (workload.Credential, error) {
	if spec.Name == "" {
		return workload.Credential{}, fmt.Errorf("buildkite: an agent name is required: %w", workload.ErrInvalidRequest)
	}
	if spec.Job == "" {
		return workload.Credential{}, fmt.Errorf("buildkite: agent %s is bound to no job; a Buildkite VM receives only a job acquisition token for the job its RunnerPool bound it to: %w",
			spec.Name, workload.ErrJobNotBindable)
	}
	if err := p.deleteTokens(ctx, spec.Name); err != nil {
		return workload.Credential{}, err
	}
	now := p.clock.Now()
	expires := now.Add(p.cfg.TokenLifetime).UTC().Truncate(time.Second)
	u := fmt.Sprintf("v2/organizations/%s/clusters/%s/tokens", url.PathEscape(p.cfg.Organization), url.PathEscape(p.cfg.Cluster))
	req, err := p.client.NewRequest(ctx, http.MethodPost, u, tokenCreate{Description: tokenDescriptionPrefix + spec.Name, ExpiresAt: expires.Format(time.RFC3339)})
	if err != nil {
		return workload.Credential{}, fmt.Errorf("buildkite: token request: %w", err)
	}
	var tok bk.ClusterToken
	if _, err := p.client.Do(req, &tok); err != nil {
		return workload.Credential{}, apiError("create the agent token of "+spec.Name, err)
	}
	if tok.Token == "" {
		return workload.Credential{}, fmt.Errorf("buildkite: the created agent token of %s has no secret: %w", spec.Name, workload.ErrUnavailable)
	}
	cred, err := p.jobCredential(ctx, spec, tok.Token, now)
	if err != nil {
		// No job token: the cluster token has no use left.
		return workload.Credential{}, errors.Join(err, p.deleteTokens(ctx, spec.Name))
	}
	return cred, nil
}

// RetireRegistration deletes the cluster agent token the operator made for
// the agent name (IssueCredential) once the agent registered: the agent
// works on its own access token from then on, and the job acquisition
// token the cluster token issued dies with it (Buildkite refuses a job
// token whose issuing agent token is no longer active), so neither
// registers anything again however long the job runs. Deleting what is
// already gone is success, so the caller may repeat it.
func (p *Provider) RetireRegistration(ctx context.Context, name string) error {
	return p.deleteTokens(ctx, name)
}

// deleteTokens deletes every cluster agent token the operator made for the
// agent name (a cleanup call).
func (p *Provider) deleteTokens(ctx context.Context, name string) error {
	ctx = withCleanup(ctx)
	want := tokenDescriptionPrefix + name
	opt := &bk.ClusterTokensListOptions{ListOptions: bk.ListOptions{PerPage: 100}}
	toks, err := everyPage("list the cluster's agent tokens", func(page int) ([]bk.ClusterToken, *bk.Response, error) {
		opt.Page = page
		return p.client.ClusterTokens.List(ctx, p.cfg.Organization, p.cfg.Cluster, opt)
	})
	if err != nil {
		return err
	}
	for _, t := range toks {
		if t.Description != want {
			continue
		}
		if _, err := p.client.ClusterTokens.Delete(ctx, p.cfg.Organization, p.cfg.Cluster, t.ID); err != nil && statusOf(err) != http.StatusNotFound {
			return apiError("delete the agent token of "+name, err)
		}
	}
	return nil
}

// maxPages bounds every paged listing (100 items a page).
const maxPages = 20

// everyPage reads a listing page by page, at most maxPages: list reads the
// page it is given, and its response says whether another follows.
func everyPage[T any](what string, list func(page int) ([]T, *bk.Response, error)) ([]T, error) {
	var out []T
	for page := 1; page <= maxPages; page++ {
		items, resp, err := list(page)
		if err != nil {
			return nil, apiError(what, err)
		}
		out = append(out, items...)
		if resp == nil || resp.NextPage == 0 {
			break
		}
	}
	return out, nil
}

// DeregisterRunner implements workload.Provider: the agent's token is
// deleted (it registers nothing any more), and a connected agent is
// stopped; a busy one returns ErrRunnerBusy and keeps running, its token
// gone. id is ignored (Buildkite's agent ids are UUIDs): agents are found
// by name.
func (p *Provider) DeregisterRunner(ctx context.Context, _ int64, name string) error {
	if err := p.deleteTokens(ctx, name); err != nil {
		return err
	}
	agents, err := p.agents(withCleanup(ctx), name)
	if err != nil {
		return err
	}
	for _, a := range agents {
		if a.Name != name {
			continue
		}
		if a.Job != nil && a.Job.ID != "" {
			return fmt.Errorf("buildkite: agent %s runs job %s: %w", name, a.Job.ID, workload.ErrRunnerBusy)
		}
		if _, err := p.client.Agents.Stop(withCleanup(ctx), p.cfg.Organization, a.ID, false); err != nil &&
			statusOf(err) != http.StatusNotFound && statusOf(err) != http.StatusUnprocessableEntity {
			// 422: no longer connected; 404: gone. Both are done.
			return apiError("stop agent "+name, err)
		}
	}
	return nil
}

// agents lists the organization's connected agents that Buildkite's name
// filter matches (all of them for an empty name); callers compare names
// themselves.
func (p *Provider) agents(ctx context.Context, name string) ([]bk.Agent, error) {
	opt := &bk.AgentListOptions{Name: name, ListOptions: bk.ListOptions{PerPage: 100}}
	return everyPage("list agents", func(page int) ([]bk.Agent, *bk.Response, error) {
		opt.Page = page
		return p.client.Agents.List(ctx, p.cfg.Organization, opt)
	})
}

func runnerOf(a bk.Agent) workload.Runner {
	r := workload.Runner{Name: a.Name, State: workload.RunnerIdle, Labels: a.Metadata}
	switch {
	case a.Job != nil && a.Job.ID != "":
		r.State = workload.RunnerBusy
	case a.ConnectedState != "" && a.ConnectedState != "connected":
		r.State = workload.RunnerOffline
	}
	return r
}

// GetRunner implements workload.Provider: the connected agent of that name.
func (p *Provider) GetRunner(ctx context.Context, name string) (workload.Runner, error) {
	agents, err := p.agents(ctx, name)
	if err != nil {
		return workload.Runner{}, err
	}
	for _, a := range agents {
		if a.Name == name {
			return runnerOf(a), nil
		}
	}
	return workload.Runner{}, fmt.Errorf("buildkite: agent %s: %w", name, workload.ErrNotFound)
}

// ListRunners implements workload.Provider.
func (p *Provider) ListRunners(ctx context.Context, prefix string) ([]workload.Runner, error) {
	// Buildkite's name filter is no prefix match: list all, keep ours.
	agents, err := p.agents(ctx, "")
	if err != nil {
		return nil, err
	}
	var out []workload.Runner
	for _, a := range agents {
		if strings.HasPrefix(a.Name, prefix) {
			out = append(out, runnerOf(a))
		}
	}
	return out, nil
}

// openBuildStates are the build states that may hold a scheduled job: a
// build is scheduled until a job starts, running while any runs, and
// failing while jobs remain after one failed.
var openBuildStates = []string{"scheduled", "running", "failing"}

// QueuedJobs implements workload.Provider: the scheduled command jobs of
// the provider's cluster in the given pipelines (organization/pipeline),
// read from the organization's open builds.
func (p *Provider) QueuedJobs(ctx context.Context, repositories []string) ([]workload.Job, error) {
	want := map[string]bool{}
	for _, r := range repositories {
		want[strings.ToLower(r)] = true
	}
	builds, err := p.openBuilds(ctx, false)
	if err != nil {
		return nil, err
	}
	var out []workload.Job
	for _, b := range builds {
		repo := p.repository(b)
		if !want[strings.ToLower(repo)] {
			continue
		}
		for _, j := range b.Jobs {
			if j.State == "scheduled" && j.ClusterID == p.cfg.Cluster {
				out = append(out, p.job(repo, b, j))
			}
		}
	}
	return out, nil
}

// openBuilds lists the organization's (or the scope pipeline's) builds
// that may hold scheduled jobs, newest first.
func (p *Provider) openBuilds(ctx context.Context, excludeJobs bool) ([]bk.Build, error) {
	opt := &bk.BuildsListOptions{State: openBuildStates, ExcludeJobs: excludeJobs, ListOptions: bk.ListOptions{PerPage: 100}}
	return everyPage("list open builds", func(page int) ([]bk.Build, *bk.Response, error) {
		opt.Page = page
		if pl := p.cfg.Scope.Repository; pl != "" {
			return p.client.Builds.ListByPipeline(ctx, p.cfg.Organization, pl, opt)
		}
		return p.client.Builds.ListByOrg(ctx, p.cfg.Organization, opt)
	})
}

// repository is a build's organization/pipeline.
func (p *Provider) repository(b bk.Build) string {
	if b.Pipeline == nil {
		return ""
	}
	return p.cfg.Organization + "/" + b.Pipeline.Slug
}

// DefaultQueueLabel is the label of a job whose agent query rules name no
// queue: Buildkite runs it on the cluster's default queue, which a webhook
// does not name, so routing matches it to the pools that say they serve
// the default queue (spec.workload.buildkite.defaultQueue). It has no "=",
// so it is never an agent tag.
const DefaultQueueLabel = "queue:default"

// JobLabels are the labels routing compares for a job's agent query rules:
// the rules, and DefaultQueueLabel first when they name no queue.
func JobLabels(rules []string) []string {
	out := make([]string, 0, len(rules)+1)
	hasQueue := false
	for _, r := range rules {
		if k, _, _ := strings.Cut(r, "="); k == "queue" {
			hasQueue = true
		}
		out = append(out, r)
	}
	if !hasQueue {
		out = append([]string{DefaultQueueLabel}, out...)
	}
	return out
}

// jobState maps Buildkite's job states onto the neutral ones: only
// scheduled waits for an agent; a job given to an agent (assigned,
// accepted) or running is in progress; waiting and blocked jobs wait for
// their build, not for an agent, and count as queued only for GetJob.
func jobState(s string) workload.JobState {
	switch s {
	case "assigned", "accepted", "running", "canceling", "timing_out":
		return workload.JobInProgress
	case "passed", "failed", "canceled", "timed_out", "skipped", "broken", "expired", "finished", "waiting_failed", "blocked_failed", "unblocked_failed":
		return workload.JobCompleted
	}
	return workload.JobQueued
}

func ts(t *bk.Timestamp) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.Time
}

// job is one REST job in the neutral form.
func (p *Provider) job(repo string, b bk.Build, j bk.Job) workload.Job {
	out := workload.Job{
		ID: j.ID, Platform: hfv1.WorkloadBuildkite, RunID: int64(b.Number), RunAttempt: 1,
		Repository: repo, Labels: JobLabels(j.AgentQueryRules),
		State: jobState(j.State), Name: cmp.Or(j.Label, j.Name, j.StepKey),
		RunnerName: j.Agent.Name,
		CreatedAt:  ts(j.CreatedAt), StartedAt: ts(j.StartedAt), CompletedAt: ts(j.FinishedAt),
	}
	if b.Pipeline != nil {
		out.WorkflowName = b.Pipeline.Slug
	}
	if out.State == workload.JobCompleted {
		out.Conclusion = j.State
	}
	return out
}

// Repositories implements workload.Provider: the scope's pipeline, or the
// pipelines of the cluster that have open builds now (the only ones that
// can hold a queued job), kept for a minute.
func (p *Provider) Repositories(ctx context.Context) ([]string, error) {
	if p.cfg.Scope.Repository != "" {
		return []string{p.cfg.Scope.String()}, nil
	}
	now := p.clock.Now()
	p.mu.Lock()
	if !p.pipelinesAt.IsZero() && now.Sub(p.pipelinesAt) < time.Minute {
		out := slices.Clone(p.pipelines)
		p.mu.Unlock()
		return out, nil
	}
	p.mu.Unlock()
	builds, err := p.openBuilds(ctx, true)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, b := range builds {
		if b.Pipeline == nil || b.Pipeline.ClusterID != p.cfg.Cluster {
			continue
		}
		if r := p.repository(b); !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	slices.Sort(out)
	p.mu.Lock()
	p.pipelines, p.pipelinesAt = slices.Clone(out), now
	p.mu.Unlock()
	return out, nil
}

// pipelineOf splits organization/pipeline, refusing another organization.
func (p *Provider) pipelineOf(repository string) (string, error) {
	org, pl, ok := strings.Cut(repository, "/")
	if !ok || pl == "" || strings.Contains(pl, "/") || !strings.EqualFold(org, p.cfg.Organization) {
		return "", fmt.Errorf("buildkite: %q is not a pipeline of organization %s: %w", repository, p.cfg.Organization, workload.ErrNotFound)
	}
	return pl, nil
}

// getJobBuilds is how many of a pipeline's newest builds GetJob searches:
// Buildkite's REST API reads a job only through its build, and the id
// alone does not say which.
const getJobBuilds = 100

// GetJob implements workload.Provider: the job of that UUID among the
// pipeline's newest builds; ErrNotFound when none of them has it.
func (p *Provider) GetJob(ctx context.Context, repository, id string) (workload.Job, error) {
	pl, err := p.pipelineOf(repository)
	if err != nil {
		return workload.Job{}, err
	}
	builds, _, err := p.client.Builds.ListByPipeline(ctx, p.cfg.Organization, pl, &bk.BuildsListOptions{ListOptions: bk.ListOptions{PerPage: getJobBuilds}})
	if err != nil {
		return workload.Job{}, apiError("builds of pipeline "+pl, err)
	}
	for _, b := range builds {
		for _, j := range b.Jobs {
			if j.ID != id {
				continue
			}
			return p.job(p.repository(b), b, j), nil
		}
	}
	return workload.Job{}, fmt.Errorf("buildkite: job %s of %s: %w", id, repository, workload.ErrNotFound)
}

// CancelRun implements workload.Provider: it cancels build runID of the
// pipeline (a cleanup call). A build that already finished (422) is done.
func (p *Provider) CancelRun(ctx context.Context, repository string, runID int64) error {
	pl, err := p.pipelineOf(repository)
	if err != nil {
		return err
	}
	_, err = p.client.Builds.Cancel(withCleanup(ctx), p.cfg.Organization, pl, strconv.FormatInt(runID, 10))
	if err != nil && statusOf(err) != http.StatusUnprocessableEntity {
		return apiError(fmt.Sprintf("cancel build %d of %s", runID, pl), err)
	}
	return nil
}
