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
		if !p.cfg.Scope.Contains(repo) {
			return nil, fmt.Errorf("github: repository %s is outside %s: %w", repo, p.cfg.Scope, workload.ErrInvalidRequest)
		}
		owner, name, _ := strings.Cut(repo, "/")
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
			out = append(out, workload.Job{
				ID: j.GetID(), RunID: j.GetRunID(), RunAttempt: j.GetRunAttempt(),
				Repository: owner + "/" + repo, Labels: j.Labels, State: workload.JobQueued,
				WorkflowName: j.GetWorkflowName(), Name: j.GetName(),
				CreatedAt: j.GetCreatedAt().Time,
			})
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
	if !p.cfg.Scope.Contains(repository) {
		return fmt.Errorf("github: repository %s is outside %s: %w", repository, p.cfg.Scope, workload.ErrInvalidRequest)
	}
	owner, name, _ := strings.Cut(repository, "/")
	resp, err := p.client.Actions.CancelWorkflowRunByID(withCleanup(ctx), owner, name, runID)
	if err == nil || resp != nil && (resp.StatusCode == http.StatusAccepted || resp.StatusCode == http.StatusConflict) {
		// go-github reports 202 as an AcceptedError.
		return nil
	}
	return p.mapErr(fmt.Sprintf("cancel run %d of %s", runID, repository), resp, err)
}
