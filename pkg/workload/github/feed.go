package github

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	gh "github.com/google/go-github/v88/github"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github/scaleset"
)

// GitHub's job feeds are runner scale sets (docs/github.md, "Runner scale
// sets"): OpenFeed creates or adopts the pool's scale set, and its Listen
// runs package scaleset's Listener over it. A scale set's messages name a
// job by the Actions service's ids (the runner request id and a GUID); the
// feed turns each into the job as the REST API and the webhooks know it
// (resolveJob), so that demand from the listener, the webhooks and the
// resync meets in one record per job.

var _ workload.FeedProvider = (*Provider)(nil)

// defaultRunnerGroup is the name of every scope's default runner group at
// the Actions service.
const defaultRunnerGroup = "Default"

// OpenFeed implements workload.FeedProvider: the runner scale set named
// spec.Name in runner group spec.Group (the Default group when empty) of
// the provider's organization or repository, created or adopted, with
// spec.Labels as its labels.
func (p *Provider) OpenFeed(ctx context.Context, spec workload.FeedSpec) (workload.Feed, error) {
	if p.cfg.Scope.IsEnterprise() {
		return nil, fmt.Errorf("github: runner scale sets of enterprise runners are not supported; use webhooks for pools of %s: %w", p.cfg.Scope, workload.ErrInvalidRequest)
	}
	c, err := p.scaleSets()
	if err != nil {
		return nil, err
	}
	group := spec.Group
	if group == "" {
		group = defaultRunnerGroup
	}
	ss, err := c.EnsureScaleSet(ctx, group, spec.Name, spec.Labels)
	if err != nil {
		return nil, scaleSetErr(fmt.Sprintf("create or adopt runner scale set %s in runner group %s of %s", spec.Name, group, p.cfg.Scope), err)
	}
	p.mu.Lock()
	p.scaleSetIDs[scaleSetKey(spec)] = ss.ID
	p.mu.Unlock()
	return &scaleSetFeed{p: p, c: c, id: ss.ID, name: ss.Name}, nil
}

// scaleSets returns the provider's scale-set client, built on first use:
// it registers with the provider's own credentials (the personal access
// token, or the App installation's token) through the same transport.
func (p *Provider) scaleSets() (*scaleset.Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ss != nil {
		return p.ss, nil
	}
	token := func(ctx context.Context) (string, error) {
		if p.app != nil {
			return p.app.Token(ctx)
		}
		return p.cfg.Token, nil
	}
	c, err := scaleset.New(scaleset.Config{
		ConfigURL:  p.cfg.RunnerURL,
		APIURL:     p.cfg.BaseURL,
		Token:      token,
		HTTPClient: &http.Client{Transport: p.cfg.Transport},
		Logger:     p.log,
		Now:        p.clock.Now,
	})
	if err != nil {
		return nil, fmt.Errorf("github: runner scale sets of %s: %w: %w", p.cfg.Scope, err, workload.ErrInvalidRequest)
	}
	p.ss = c
	return c, nil
}

// scaleSetErr classifies an error of the Actions service like the REST
// API's (mapErr): refusals of the request or of the credentials are the
// user's to fix, the rest is retried.
func scaleSetErr(what string, err error) error {
	var re *scaleset.ResponseError
	switch {
	case errors.As(err, &re) && (re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden):
		return fmt.Errorf("github: %s: %w: %w", what, err, workload.ErrUnauthorized)
	case errors.Is(err, scaleset.ErrNotFound):
		return fmt.Errorf("github: %s: %w: %w", what, err, workload.ErrNotFound)
	case errors.Is(err, scaleset.ErrUntrustedURL):
		// An answer that would send the tokens elsewhere: retrying gets
		// the same answer, and the listener waits as a refused one does.
		return fmt.Errorf("github: %s: %w: %w", what, err, workload.ErrInvalidRequest)
	case errors.As(err, &re) && re.StatusCode >= 400 && re.StatusCode < 500 && re.StatusCode != http.StatusTooManyRequests:
		return fmt.Errorf("github: %s: %w: %w", what, err, workload.ErrInvalidRequest)
	}
	// 5xx, 429 and transport errors, after the client's own retries.
	return fmt.Errorf("github: %s: %w: %w", what, err, workload.ErrUnavailable)
}

// scaleSetJIT is IssueCredential for a runner of a scale set (spec.Feed):
// the runner is registered as the scale set's, which alone takes the scale
// set's jobs.
func (p *Provider) scaleSetJIT(ctx context.Context, spec workload.RunnerSpec) (workload.Credential, error) {
	if spec.Name == "" {
		return workload.Credential{}, fmt.Errorf("github: a JIT runner needs a name: %w", workload.ErrInvalidRequest)
	}
	c, id, err := p.scaleSetID(ctx, *spec.Feed)
	if err != nil {
		return workload.Credential{}, err
	}
	issued := p.clock.Now()
	cfg, err := c.GenerateJITConfig(ctx, id, spec.Name, spec.WorkFolder)
	if errors.Is(err, scaleset.ErrNotFound) {
		// The scale set was deleted since it was looked up: once more.
		p.forgetScaleSet(*spec.Feed)
		if c, id, err = p.scaleSetID(ctx, *spec.Feed); err != nil {
			return workload.Credential{}, err
		}
		cfg, err = c.GenerateJITConfig(ctx, id, spec.Name, spec.WorkFolder)
	}
	var re *scaleset.ResponseError
	if errors.As(err, &re) && re.StatusCode == http.StatusConflict {
		return workload.Credential{}, fmt.Errorf("github: runner %s of scale set %s: %w: %w", spec.Name, spec.Feed.Name, err, workload.ErrNameTaken)
	}
	if err != nil {
		return workload.Credential{}, scaleSetErr(fmt.Sprintf("generate the JIT configuration of runner %s in scale set %s", spec.Name, spec.Feed.Name), err)
	}
	var runnerID int64
	if cfg.Runner != nil {
		runnerID = cfg.Runner.ID
	}
	return workload.Credential{
		Method:     MethodJIT,
		Secret:     workload.NewSecret(cfg.EncodedJITConfig),
		RunnerName: spec.Name,
		RunnerID:   runnerID,
		IssuedAt:   issued,
	}, nil
}

// scaleSetKey names a scale set in the provider's scope.
func scaleSetKey(spec workload.FeedSpec) string {
	return strings.ToLower(spec.Group) + "/" + strings.ToLower(spec.Name)
}

// scaleSetID is the id of the scale set of spec, opened (created or
// adopted) on first use and then remembered, so that issuing a runner
// costs one call to the service.
func (p *Provider) scaleSetID(ctx context.Context, spec workload.FeedSpec) (*scaleset.Client, int, error) {
	key := scaleSetKey(spec)
	p.mu.Lock()
	id, ok := p.scaleSetIDs[key]
	c := p.ss
	p.mu.Unlock()
	if ok && c != nil {
		return c, id, nil
	}
	f, err := p.OpenFeed(ctx, spec)
	if err != nil {
		return nil, 0, err
	}
	sf := f.(*scaleSetFeed)
	return sf.c, sf.id, nil
}

func (p *Provider) forgetScaleSet(spec workload.FeedSpec) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.scaleSetIDs, scaleSetKey(spec))
}

// scaleSetFeed is an opened runner scale set.
type scaleSetFeed struct {
	p    *Provider
	c    *scaleset.Client
	id   int
	name string
}

// ID implements workload.Feed.
func (f *scaleSetFeed) ID() int64 { return int64(f.id) }

// Listen implements workload.Feed with scaleset's Listener: statistics
// pass through, and each job message is handed on as the REST job it is
// about. A message whose job cannot be found through the REST API (the
// API unavailable for longer than resolveJob waits) is handed on as
// Unresolved: the scale set has the job acquired, and the pool's resync
// finds it queued.
func (f *scaleSetFeed) Listen(ctx context.Context, owner string, capacity func() int, handle func(context.Context, workload.FeedEvent) error) error {
	jobs := newRequestJobs(maxRememberedRequests)
	l, err := scaleset.NewListener(scaleset.ListenerConfig{
		Client: f.c, ScaleSetID: f.id, Owner: owner, MaxRunners: capacity, Logger: f.p.log,
		Handle: func(ctx context.Context, ev scaleset.Event) error {
			out := workload.FeedEvent{At: f.p.clock.Now()}
			if st := ev.Statistics; st != nil {
				out.Statistics = &workload.FeedStatistics{Assigned: st.TotalAssignedJobs, Running: st.TotalRunningJobs, Runners: st.TotalRegisteredRunners}
			}
			if ev.Type != scaleset.EventStatistics {
				job, err := f.p.resolveJob(ctx, jobs, ev)
				switch {
				case err == nil:
					out.Job = job
				case ctx.Err() != nil:
					return ctx.Err()
				default:
					out.Unresolved = fmt.Errorf("%s message of runner request %d (run %d of %s, job %q): %w",
						ev.Type, ev.Job.RequestID, ev.Job.WorkflowRunID, ev.Job.Repository, ev.Job.DisplayName, err)
				}
			}
			return handle(ctx, out)
		},
	})
	if err != nil {
		return err
	}
	err = l.Run(ctx)
	switch {
	case errors.Is(err, scaleset.ErrSessionConflict):
		return fmt.Errorf("github: scale set %s: %w: %w", f.name, err, workload.ErrFeedConflict)
	case errors.Is(err, scaleset.ErrUntrustedURL):
		return scaleSetErr("scale set "+f.name, err)
	}
	return err
}

// maxRememberedRequests bounds the runner requests a listener remembers
// the REST job of.
const maxRememberedRequests = 4096

// requestJobs remembers which REST job each runner request of a scale set
// is, so that a job's later messages (started, completed) need no lookup;
// the oldest entries go first.
type requestJobs struct {
	mu    sync.Mutex
	max   int
	ids   map[int64]int64
	order []int64
}

func newRequestJobs(limit int) *requestJobs {
	return &requestJobs{max: limit, ids: map[int64]int64{}}
}

func (r *requestJobs) get(req int64) (int64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id, ok := r.ids[req]
	return id, ok
}

func (r *requestJobs) put(req, job int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.ids[req]; !ok {
		r.order = append(r.order, req)
	}
	r.ids[req] = job
	for len(r.order) > r.max {
		delete(r.ids, r.order[0])
		r.order = r.order[1:]
	}
}

// resolveJob finds the REST job a scale-set job message is about: the job
// of the message's workflow run (latest attempt) with its display name and
// runs-on labels, preferring one in the state the message reports, and
// returns it in that state with what the message adds (the runner, the
// result, the service's times). A request seen before is read by its
// remembered id. GitHub's REST API can lag the Actions service by a
// moment, so a run that does not show the job yet is read again a few
// times, a second apart.
func (p *Provider) resolveJob(ctx context.Context, jobs *requestJobs, ev scaleset.Event) (workload.Job, error) {
	m := ev.Job
	state, ok := feedState(ev.Type)
	if !ok {
		return workload.Job{}, fmt.Errorf("unknown job message type %s", ev.Type)
	}
	if !p.cfg.Scope.Contains(m.Repository) {
		return workload.Job{}, fmt.Errorf("repository %s is outside %s: %w", m.Repository, p.cfg.Scope, workload.ErrInvalidRequest)
	}
	owner, repo, _ := strings.Cut(m.Repository, "/")
	var j *gh.WorkflowJob
	if id, ok := jobs.get(m.RequestID); ok {
		got, resp, err := p.client.Actions.GetWorkflowJobByID(ctx, owner, repo, id)
		if err != nil {
			return workload.Job{}, p.mapErr(fmt.Sprintf("get job %d of %s", id, m.Repository), resp, err)
		}
		j = got
	} else {
		var err error
		for attempt := 0; ; attempt++ {
			j, err = p.findRunJob(ctx, owner, repo, m, state)
			if err == nil || !errors.Is(err, workload.ErrNotFound) || attempt >= 4 {
				break
			}
			select {
			case <-ctx.Done():
				return workload.Job{}, ctx.Err()
			case <-time.After(time.Second):
			}
		}
		if err != nil {
			return workload.Job{}, err
		}
		jobs.put(m.RequestID, j.GetID())
	}
	job := jobOf(m.Repository, j, state)
	if rest, ok := jobState(j.GetStatus()); ok && workloadRank(rest) > workloadRank(state) {
		// The REST API already knows more (the job started or ended
		// while the message waited): keep it.
		job.State = rest
	}
	if m.RunnerName != "" {
		job.RunnerName, job.RunnerID = m.RunnerName, m.RunnerID
	}
	if job.State == workload.JobCompleted && job.Conclusion == "" {
		job.Conclusion = feedConclusion(m.Result)
	}
	return job, nil
}

// findRunJob lists the jobs of the message's run (the latest attempt, up
// to ten pages of 100) and picks the one the message is about.
func (p *Provider) findRunJob(ctx context.Context, owner, repo string, m scaleset.Job, state workload.JobState) (*gh.WorkflowJob, error) {
	opts := &gh.ListWorkflowJobsOptions{Filter: "latest", ListOptions: gh.ListOptions{PerPage: 100}}
	var candidates []*gh.WorkflowJob
	for page := 0; page < 10; page++ {
		list, resp, err := p.client.Actions.ListWorkflowJobs(ctx, owner, repo, m.WorkflowRunID, opts)
		if err != nil {
			return nil, p.mapErr(fmt.Sprintf("list the jobs of run %d of %s/%s", m.WorkflowRunID, owner, repo), resp, err)
		}
		for _, j := range list.Jobs {
			if j.GetName() == m.DisplayName && sameLabelSet(j.Labels, m.Labels) {
				candidates = append(candidates, j)
			}
		}
		if resp.NextPage == 0 {
			break
		}
		opts.Page = resp.NextPage
	}
	if len(candidates) == 0 {
		return nil, fmt.Errorf("run %d of %s/%s has no job %q with labels %v: %w", m.WorkflowRunID, owner, repo, m.DisplayName, m.Labels, workload.ErrNotFound)
	}
	// Jobs of one run with the same name and labels (rare: a reusable
	// workflow called twice) are told apart by state, then the oldest.
	best := candidates[0]
	for _, j := range candidates[1:] {
		js, _ := jobState(j.GetStatus())
		bs, _ := jobState(best.GetStatus())
		if (js == state) != (bs == state) {
			if js == state {
				best = j
			}
			continue
		}
		if j.GetID() < best.GetID() {
			best = j
		}
	}
	return best, nil
}

// feedState is the job state a scale-set message reports.
func feedState(t scaleset.EventType) (workload.JobState, bool) {
	switch t {
	case scaleset.EventJobAvailable, scaleset.EventJobAssigned:
		return workload.JobQueued, true
	case scaleset.EventJobStarted:
		return workload.JobInProgress, true
	case scaleset.EventJobCompleted:
		return workload.JobCompleted, true
	}
	return "", false
}

// feedConclusion is the Actions service's result of a job as the REST
// API's conclusion.
func feedConclusion(result string) string {
	switch strings.ToLower(result) {
	case "succeeded":
		return "success"
	case "failed":
		return "failure"
	case "canceled":
		return "cancelled"
	}
	return strings.ToLower(result)
}

func workloadRank(s workload.JobState) int { return hfv1.CIJobRank(hfv1.CIJobState(s)) }

// sameLabelSet compares label sets ignoring case and order.
func sameLabelSet(a, b []string) bool {
	return len(a) == len(b) && workload.Covers(a, b)
}
