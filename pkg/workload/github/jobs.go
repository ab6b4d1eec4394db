package github

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	gh "github.com/google/go-github/v88/github"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// unfinishedRunStatuses are the workflow run statuses whose runs may hold
// queued jobs, in the order QueuedJobs lists them (GitHub's status filter
// takes one value, so each is a listing of its own): a run is queued until
// one of its jobs starts and stays in_progress while others wait (a matrix
// build, jobs that need others); waiting (a job awaits an environment's
// approval), pending (a concurrency group) and requested (just created)
// runs can hold queued jobs too.
var unfinishedRunStatuses = []string{"queued", "in_progress", "waiting", "pending", "requested"}

// QueuedJobs implements workload.Provider: for each repository, the
// unfinished workflow runs (unfinishedRunStatuses) and, of each, the jobs
// still queued. Repositories outside the scope are refused rather than
// silently asked about.
//
// What it costs, per repository and resync: one listing per status
// (conditional: GitHub answers an unchanged listing 304, which does not
// count against the rate limit), and each run's jobs read twice per
// change of the run (settledRun), the second read a 304 too unless the
// jobs changed. With 100 unfinished runs in a repository and a 30 s
// resync that is 5 x 120 = 600 listings an hour, free while nothing
// changes, plus at most two counted job reads per run and change (a
// single-job run: one or two while queued, one or two once it started)
// instead of 100 x 120 = 12,000 job reads an hour read afresh; an
// installation has 5,000 calls an hour.
func (p *Provider) QueuedJobs(ctx context.Context, repositories []string) ([]workload.Job, error) {
	var out []workload.Job
	for _, repo := range repositories {
		owner, name, err := p.repositoryOf(repo)
		if err != nil {
			return nil, err
		}
		// A run whose status changes between two listings shows in both.
		seen := map[int64]bool{}
		for _, status := range unfinishedRunStatuses {
			runs, err := p.unfinishedRuns(ctx, owner, name, status)
			if err != nil {
				return nil, err
			}
			for _, run := range runs {
				if seen[run.id] {
					continue
				}
				seen[run.id] = true
				jobs, ok := p.settledRun(run)
				if !ok {
					if jobs, err = p.queuedJobsOf(ctx, owner, name, run.id); err != nil {
						return nil, err
					}
					p.rememberRun(repo, run, jobs)
				}
				out = append(out, jobs...)
			}
		}
		p.forgetRuns(repo, seen)
	}
	p.pages.sweep(p.clock.Now())
	return out, nil
}

// listedRun is what QueuedJobs keeps of a run in a listing: its id and
// when it last changed.
type listedRun struct {
	id        int64
	updatedAt time.Time
}

// unfinishedRuns lists the repository's runs of one status, every page,
// with conditional requests.
func (p *Provider) unfinishedRuns(ctx context.Context, owner, repo, status string) ([]listedRun, error) {
	pageURL := func(page int) string {
		return fmt.Sprintf("repos/%s/%s/actions/runs?status=%s&per_page=100&page=%d", url.PathEscape(owner), url.PathEscape(repo), status, page)
	}
	return conditionalPages(ctx, p, fmt.Sprintf("list the %s runs of %s/%s", status, owner, repo), 0, pageURL, func(body []byte) ([]listedRun, error) {
		var list gh.WorkflowRuns
		if err := json.Unmarshal(body, &list); err != nil {
			return nil, err
		}
		runs := make([]listedRun, 0, len(list.WorkflowRuns))
		for _, r := range list.WorkflowRuns {
			runs = append(runs, listedRun{id: r.GetID(), updatedAt: r.GetUpdatedAt().Time})
		}
		return runs, nil
	})
}

// seenRun is what QueuedJobs last read of an unfinished run: its
// updated_at and queued jobs, and how many listings in a row showed that
// updated_at.
type seenRun struct {
	repository string
	updatedAt  time.Time
	sightings  int
	jobs       []workload.Job
}

// settledRun returns the queued jobs last read of run when they cannot
// have changed since: GitHub moves a run's updated_at with each change of
// its jobs, so the same updated_at means the same jobs. That costs each
// unfinished run's jobs two reads per change (not one per resync: with
// 100 unfinished runs and a 30 s resync, the per-run reads alone would
// spend 12,000 of an installation's 5,000 calls an hour). Two, because
// updated_at has whole seconds: a change in the second the jobs were
// first read keeps it; the second read, a resync interval later, sees
// every change of that second, and any later change moves updated_at past
// it. A run that moves from queued to in_progress (or waiting, ...) keeps
// its id: its jobs are read again because its updated_at moved.
func (p *Provider) settledRun(run listedRun) ([]workload.Job, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.queuedRuns[run.id]
	if !ok || run.updatedAt.IsZero() || !r.updatedAt.Equal(run.updatedAt) || r.sightings < 2 {
		return nil, false
	}
	return slices.Clone(r.jobs), true
}

// rememberRun records the queued jobs just read of run.
func (p *Provider) rememberRun(repository string, run listedRun, jobs []workload.Job) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.queuedRuns == nil {
		p.queuedRuns = map[int64]seenRun{}
	}
	r := p.queuedRuns[run.id]
	if r.updatedAt.Equal(run.updatedAt) && !run.updatedAt.IsZero() {
		r.sightings++
	} else {
		r.updatedAt, r.sightings = run.updatedAt, 1
	}
	r.repository, r.jobs = repository, slices.Clone(jobs)
	p.queuedRuns[run.id] = r
}

// forgetRuns drops the remembered runs of repository that its complete
// listings of unfinished runs no longer show.
func (p *Provider) forgetRuns(repository string, listed map[int64]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, r := range p.queuedRuns {
		if r.repository == repository && !listed[id] {
			delete(p.queuedRuns, id)
		}
	}
}

// GetJob implements workload.Provider: GET
// /repos/{owner}/{repo}/actions/jobs/{job_id}. GitHub answers 404, hence
// ErrNotFound, for an unknown id and for a job of another repository. An
// id that is not one of GitHub's (a positive decimal number, as jobOf
// writes it) names no GitHub job: ErrNotFound too, without a request.
func (p *Provider) GetJob(ctx context.Context, repository string, id string) (workload.Job, error) {
	owner, name, err := p.repositoryOf(repository)
	if err != nil {
		return workload.Job{}, err
	}
	n, ok := parseJobID(id)
	if !ok {
		return workload.Job{}, fmt.Errorf("github: get job %q of %s: GitHub's job ids are positive decimal numbers: %w", webhookTruncate(id, 64), repository, workload.ErrNotFound)
	}
	what := fmt.Sprintf("get job %d of %s", n, repository)
	j, resp, err := p.client.Actions.GetWorkflowJobByID(ctx, owner, name, n)
	if err != nil {
		return workload.Job{}, p.mapErr(what, resp, err)
	}
	state, ok := jobState(j.GetStatus())
	if !ok {
		return workload.Job{}, fmt.Errorf("github: %s: unknown job status %q", what, webhookTruncate(j.GetStatus(), 64))
	}
	return jobOf(repository, j, state), nil
}

// repositoryOf checks that repository (owner/name) is in the scope and
// splits it. Repositories outside the scope are refused rather than
// silently asked about.
func (p *Provider) repositoryOf(repository string) (owner, name string, err error) {
	owner, name, _ = strings.Cut(repository, "/")
	if !p.cfg.Scope.Contains(repository) || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("github: repository %s is outside %s: %w", repository, p.cfg.Scope, workload.ErrInvalidRequest)
	}
	return owner, name, nil
}

// jobState maps a REST workflow job status to the neutral state: the
// statuses a workflow_job webhook's action names too (webhookJobState),
// and pending and requested, which only REST reports.
func jobState(status string) (workload.JobState, bool) {
	if status == "pending" || status == "requested" {
		return workload.JobQueued, true
	}
	return webhookJobState(status)
}

// jobOf converts a GitHub workflow job of repository (owner/name) to the
// neutral job in state. Webhooks, QueuedJobs and GetJob share it; the
// labels are copied, and nil when there are none.
func jobOf(repository string, j *gh.WorkflowJob, state workload.JobState) workload.Job {
	var labels []string
	if len(j.Labels) > 0 {
		labels = append(make([]string, 0, len(j.Labels)), j.Labels...)
	}
	return workload.Job{
		ID:           formatJobID(j.GetID()),
		Platform:     hfv1.WorkloadGitHubActions,
		RunID:        j.GetRunID(),
		RunAttempt:   j.GetRunAttempt(),
		Repository:   repository,
		Labels:       labels,
		State:        state,
		Conclusion:   j.GetConclusion(),
		WorkflowName: j.GetWorkflowName(),
		Name:         j.GetName(),
		RunnerName:   j.GetRunnerName(),
		RunnerID:     j.GetRunnerID(),
		CreatedAt:    j.GetCreatedAt().Time,
		StartedAt:    j.GetStartedAt().Time,
		CompletedAt:  j.GetCompletedAt().Time,
	}
}

// GitHub's job ids are numbers (workload.FormatNumericJobID).
var formatJobID, parseJobID = workload.FormatNumericJobID, workload.ParseNumericJobID

// queuedJobsOf reads the queued jobs of a run, every page, with
// conditional requests: the second read at one updated_at (settledRun) is
// then a 304 that costs no rate-limit budget unless the jobs changed.
func (p *Provider) queuedJobsOf(ctx context.Context, owner, repo string, runID int64) ([]workload.Job, error) {
	pageURL := func(page int) string {
		return fmt.Sprintf("repos/%s/%s/actions/runs/%d/jobs?filter=latest&per_page=100&page=%d", url.PathEscape(owner), url.PathEscape(repo), runID, page)
	}
	return conditionalPages(ctx, p, fmt.Sprintf("list the jobs of run %d in %s/%s", runID, owner, repo), 0, pageURL, func(body []byte) ([]workload.Job, error) {
		var list gh.Jobs
		if err := json.Unmarshal(body, &list); err != nil {
			return nil, err
		}
		var queued []workload.Job
		for _, j := range list.Jobs {
			if s := j.GetStatus(); s == "queued" || s == "waiting" {
				queued = append(queued, jobOf(owner+"/"+repo, j, workload.JobQueued))
			}
		}
		return queued, nil
	})
}

// CancelRun implements workload.Provider. A run that already finished
// (409) is success: there is nothing left to cancel.
func (p *Provider) CancelRun(ctx context.Context, repository string, runID int64) error {
	owner, name, err := p.repositoryOf(repository)
	if err != nil {
		return err
	}
	resp, err := p.client.Actions.CancelWorkflowRunByID(withCleanup(ctx), owner, name, runID)
	if err == nil || resp != nil && (resp.StatusCode == http.StatusAccepted || resp.StatusCode == http.StatusConflict) {
		// go-github reports 202 as an AcceptedError.
		return nil
	}
	return p.mapErr(fmt.Sprintf("cancel run %d of %s", runID, repository), resp, err)
}
