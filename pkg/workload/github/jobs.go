package github

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	gh "github.com/google/go-github/v88/github"

	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// QueuedJobs implements workload.Provider: for each repository, the queued
// workflow runs and, of each, the jobs still queued. Repositories outside
// the scope are refused rather than silently asked about.
func (p *Provider) QueuedJobs(ctx context.Context, repositories []string) ([]workload.Job, error) {
	var out []workload.Job
	for _, repo := range repositories {
		owner, name, err := p.repositoryOf(repo)
		if err != nil {
			return nil, err
		}
		opts := &gh.ListWorkflowRunsOptions{Status: "queued", ListOptions: gh.ListOptions{PerPage: 100}}
		for {
			runs, resp, err := p.client.Actions.ListRepositoryWorkflowRuns(ctx, owner, name, opts)
			if err != nil {
				return nil, p.mapErr("list the queued runs of "+repo, resp, err)
			}
			for _, run := range runs.WorkflowRuns {
				jobs, err := p.queuedJobsOf(ctx, owner, name, run)
				if err != nil {
					return nil, err
				}
				out = append(out, jobs...)
			}
			if resp.NextPage == 0 {
				break
			}
			opts.Page = resp.NextPage
		}
	}
	return out, nil
}

// GetJob implements workload.Provider: GET
// /repos/{owner}/{repo}/actions/jobs/{job_id}. GitHub answers 404, hence
// ErrNotFound, for an unknown id and for a job of another repository.
func (p *Provider) GetJob(ctx context.Context, repository string, id int64) (workload.Job, error) {
	owner, name, err := p.repositoryOf(repository)
	if err != nil {
		return workload.Job{}, err
	}
	what := fmt.Sprintf("get job %d of %s", id, repository)
	j, resp, err := p.client.Actions.GetWorkflowJobByID(ctx, owner, name, id)
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

// jobState maps a REST workflow job status to the neutral state.
func jobState(status string) (workload.JobState, bool) {
	switch status {
	case "queued", "waiting", "pending", "requested":
		return workload.JobQueued, true
	case "in_progress":
		return workload.JobInProgress, true
	case "completed":
		return workload.JobCompleted, true
	}
	return "", false
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
		ID:           j.GetID(),
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

func (p *Provider) queuedJobsOf(ctx context.Context, owner, repo string, run *gh.WorkflowRun) ([]workload.Job, error) {
	var out []workload.Job
	opts := &gh.ListWorkflowJobsOptions{Filter: "latest", ListOptions: gh.ListOptions{PerPage: 100}}
	for {
		jobs, resp, err := p.client.Actions.ListWorkflowJobs(ctx, owner, repo, run.GetID(), opts)
		if err != nil {
			return nil, p.mapErr(fmt.Sprintf("list the jobs of run %d in %s/%s", run.GetID(), owner, repo), resp, err)
		}
		for _, j := range jobs.Jobs {
			if s := j.GetStatus(); s != "queued" && s != "waiting" {
				continue
			}
			out = append(out, jobOf(owner+"/"+repo, j, workload.JobQueued))
		}
		if resp.NextPage == 0 {
			return out, nil
		}
		opts.Page = resp.NextPage
	}
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
