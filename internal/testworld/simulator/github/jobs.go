package githubsim

import (
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// run is a workflow run.
type run struct {
	id           int64
	repo         *repo
	workflowName string
	path         string
	headSHA      string
	headBranch   string
	runNumber    int64
	status       string
	conclusion   string
	createdAt    time.Time
	updatedAt    time.Time
	jobs         []*job
}

// job is a workflow job.
type job struct {
	id          int64
	run         *run
	name        string
	labels      []string
	duration    time.Duration
	want        string // conclusion when it completes on its own
	status      string
	conclusion  string
	createdAt   time.Time
	startedAt   time.Time
	completedAt time.Time
	runner      *runner
	runnerID    int64
	runnerName  string
	groupID     int64
	groupName   string
	timer       Timer
	// ssOffered: a scale set was sent JobAvailable; scaleSet acquired
	// it at ssAssigned. Such a job runs only on that scale set's runners.
	ssOffered bool
	// ssRequestID and ssJobID are the service's ids of the job's runner
	// request and plan job: not the REST job id, as on GitHub.
	ssRequestID int64
	ssJobID     string
	scaleSet    *scaleSet
	ssAssigned  time.Time
	// steps are what the job runs on its runner (JobRequest.Steps); log
	// is their output as the runner reported it.
	steps []string
	log   string
}

// JobRequest asks for a workflow run with one job.
type JobRequest struct {
	// Repository is owner/name; it must exist.
	Repository string `json:"repository"`
	// Labels are the job's runs-on labels (at least one).
	Labels []string `json:"labels"`
	// Duration is how long the job runs once a runner takes it, on the
	// simulator's clock.
	Duration time.Duration `json:"duration"`
	// WorkflowName and JobName default to "CI" and "build".
	WorkflowName string `json:"workflowName,omitempty"`
	JobName      string `json:"jobName,omitempty"`
	// Conclusion is the conclusion when the job finishes on its own:
	// success (default), failure, neutral, skipped or timed_out.
	Conclusion string `json:"conclusion,omitempty"`
	// RunID adds the job to an existing, unfinished run of the same
	// repository instead of creating one.
	RunID int64 `json:"runID,omitempty"`
	// Steps are shell commands the job runs on its runner, as a
	// workflow's run: steps: the runner package's run.sh runs each with
	// sh -c in its work folder, as the runner's user, until one fails, and
	// reports their outcome and output (the runner API's job result). A
	// job with steps completes when its runner reports them, success when
	// every step exited 0, failure otherwise; Duration and Conclusion do
	// not apply. Empty: the simulator's default steps
	// (SetDefaultJobSteps), else none.
	Steps []string `json:"steps,omitempty"`
}

// Job is a snapshot of a workflow job.
type Job struct {
	ID              int64         `json:"id"`
	RunID           int64         `json:"runID"`
	RunAttempt      int           `json:"runAttempt"`
	Repository      string        `json:"repository"`
	Name            string        `json:"name"`
	WorkflowName    string        `json:"workflowName"`
	Labels          []string      `json:"labels"`
	Status          string        `json:"status"`
	Conclusion      string        `json:"conclusion,omitempty"`
	RunnerID        int64         `json:"runnerID,omitempty"`
	RunnerName      string        `json:"runnerName,omitempty"`
	RunnerGroupID   int64         `json:"runnerGroupID,omitempty"`
	RunnerGroupName string        `json:"runnerGroupName,omitempty"`
	Duration        time.Duration `json:"duration"`
	CreatedAt       time.Time     `json:"createdAt"`
	StartedAt       time.Time     `json:"startedAt,omitzero"`
	CompletedAt     time.Time     `json:"completedAt,omitzero"`
	// Steps are the job's steps (JobRequest.Steps) and Log their output,
	// once its runner reported them.
	Steps []string `json:"steps,omitempty"`
	Log   string   `json:"log,omitempty"`
}

// Run is a snapshot of a workflow run.
type Run struct {
	ID           int64     `json:"id"`
	Repository   string    `json:"repository"`
	WorkflowName string    `json:"workflowName"`
	Status       string    `json:"status"`
	Conclusion   string    `json:"conclusion,omitempty"`
	JobIDs       []int64   `json:"jobIDs"`
	CreatedAt    time.Time `json:"createdAt"`
}

var validConclusions = map[string]bool{"success": true, "failure": true, "neutral": true, "skipped": true, "timed_out": true, "cancelled": true, "action_required": true}

// EnqueueJob creates a queued job (in a new workflow run unless RunID is
// set), sends its queued webhook and gives it to a covering idle runner if
// one is online.
func (s *Simulator) EnqueueJob(req JobRequest) (Job, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Job{}, errors.New("simulator closed")
	}
	rp := s.repos[strings.ToLower(req.Repository)]
	if rp == nil {
		return Job{}, fmt.Errorf("repository %q does not exist", req.Repository)
	}
	if rp.archived {
		return Job{}, fmt.Errorf("repository %q is archived: it runs no workflows", req.Repository)
	}
	if len(req.Labels) == 0 {
		return Job{}, errors.New("a job needs at least one runs-on label")
	}
	for _, l := range req.Labels {
		if strings.TrimSpace(l) == "" {
			return Job{}, errors.New("labels must not be empty")
		}
	}
	if req.Duration < 0 {
		return Job{}, errors.New("duration must not be negative")
	}
	conclusion := req.Conclusion
	if conclusion == "" {
		conclusion = "success"
	}
	if !validConclusions[conclusion] {
		return Job{}, fmt.Errorf("unknown conclusion %q", conclusion)
	}
	if req.WorkflowName == "" {
		req.WorkflowName = "CI"
	}
	if req.JobName == "" {
		req.JobName = "build"
	}
	now := s.clock.Now()
	var rn *run
	if req.RunID != 0 {
		rn = s.runs[req.RunID]
		if rn == nil || rn.repo != rp || rn.status == "completed" {
			return Job{}, fmt.Errorf("run %d is not an unfinished run of %s", req.RunID, rp.fullName())
		}
	} else {
		s.nextRunID += 7
		s.nextRunNumber[rp.id]++
		rn = &run{id: s.nextRunID, repo: rp, workflowName: req.WorkflowName, path: ".github/workflows/" + workflowFile(req.WorkflowName),
			headSHA: headSHA(s.nextRunID), headBranch: rp.defaultBranch, runNumber: s.nextRunNumber[rp.id], status: "queued",
			createdAt: now, updatedAt: now}
		s.runs[rn.id] = rn
		s.runOrder = append(s.runOrder, rn.id)
	}
	s.nextJobID += 13
	j := &job{id: s.nextJobID, run: rn, name: req.JobName, labels: append([]string(nil), req.Labels...), duration: req.Duration,
		want: conclusion, status: "queued", createdAt: now, steps: req.Steps}
	if len(j.steps) == 0 {
		j.steps = s.defaultSteps
	}
	j.steps = append([]string(nil), j.steps...)
	rn.jobs = append(rn.jobs, j)
	s.jobs[j.id] = j
	s.jobOrder = append(s.jobOrder, j.id)
	s.updateRunLocked(rn)
	s.emitLocked(j, "queued")
	s.offerJobLocked(j)
	s.scheduleLocked()
	return s.jobSnapshot(j), nil
}

func workflowFile(name string) string {
	f := strings.Map(func(c rune) rune {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
			return c
		case c >= 'A' && c <= 'Z':
			return c + 'a' - 'A'
		}
		return '-'
	}, name)
	return f + ".yml"
}

// covers reports whether a runner may take a job: in scope (the job's
// repository, or its organization for organization runners) and with
// every job label among its own, ignoring case. An enterprise's runner
// takes jobs of the organizations its runner group serves.
func covers(r *runner, j *job) bool {
	if (r.scaleSet != nil || j.scaleSet != nil || j.ssOffered) && (r.scaleSet == nil || j.scaleSet != r.scaleSet) {
		// Scale-set jobs run on the runners of the scale set that
		// acquired them, and scale-set runners run nothing else.
		return false
	}
	rp := j.run.repo
	switch {
	case r.repo != nil:
		if r.repo != rp {
			return false
		}
	case r.owner.enterprise:
		if !r.owner.groupServes(r.group, rp.owner) {
			return false
		}
	case r.owner != rp.owner || !r.owner.org:
		return false
	}
	have := map[string]bool{}
	for _, l := range r.labels {
		have[strings.ToLower(l)] = true
	}
	for _, l := range j.labels {
		if !have[strings.ToLower(l)] {
			return false
		}
	}
	return true
}

// scheduleLocked gives queued jobs (oldest first) to idle online runners
// that cover them; among several, the one idle the longest wins.
func (s *Simulator) scheduleLocked() {
	var idle []*runner
	for _, r := range s.runners {
		if !r.removed && !r.busy && s.onlineLocked(r) {
			idle = append(idle, r)
		}
	}
	if len(idle) == 0 {
		return
	}
	sort.Slice(idle, func(a, b int) bool {
		if !idle[a].idleSince.Equal(idle[b].idleSince) {
			return idle[a].idleSince.Before(idle[b].idleSince)
		}
		return idle[a].id < idle[b].id
	})
	for _, id := range s.jobOrder {
		j := s.jobs[id]
		if j.status != "queued" || j.runner != nil {
			// Done, running, or reserved for a runner that has not
			// picked it up yet: never hand one job to two runners.
			continue
		}
		for i, r := range idle {
			if r.busy || !covers(r, j) {
				continue
			}
			s.assignJobLocked(j, r)
			idle = append(idle[:i], idle[i+1:]...)
			break
		}
		if len(idle) == 0 {
			return
		}
	}
}

// assignJobLocked reserves a job for a runner. The job stays queued (and
// shows no runner) until the runner's process picks it up, as on GitHub.
func (s *Simulator) assignJobLocked(j *job, r *runner) {
	j.runner = r
	r.busy, r.job = true, j
	s.stopTimer(r.rmTimer)
	r.rmTimer = nil
	r.wakeLocked()
}

// acquireJobLocked starts a job its runner has picked up: in_progress now
// (with the runner's fields), completed after its duration.
func (s *Simulator) acquireJobLocked(j *job) {
	if j.status != "queued" || j.runner == nil {
		return
	}
	r := j.runner
	j.status, j.startedAt = "in_progress", s.clock.Now()
	j.runnerID, j.runnerName, j.groupID, j.groupName = r.id, r.name, r.group.id, r.group.name
	r.jobsRun++
	s.updateRunLocked(j.run)
	s.emitLocked(j, "in_progress")
	s.scaleSetJobEventLocked(j, "JobStarted")
	if len(j.steps) > 0 {
		// Its runner reports when its steps are done.
		return
	}
	j.timer = s.afterFunc(j.duration, func() {
		j.timer = nil
		if j.status == "in_progress" {
			s.completeJobLocked(j, j.want)
		}
	})
}

// unassignLocked puts a reserved job back in the queue (its runner went
// away before picking it up).
func (s *Simulator) unassignLocked(j *job) {
	if r := j.runner; r != nil && r.job == j {
		r.busy, r.job = false, nil
	}
	j.runner = nil
}

// completeJobLocked finishes a job. Its runner is released: an ephemeral
// runner that ran it is removed (GitHub deregisters it after its one job),
// any other goes back to idle.
func (s *Simulator) completeJobLocked(j *job, conclusion string) {
	if j.status == "completed" {
		return
	}
	s.stopTimer(j.timer)
	j.timer = nil
	j.status, j.conclusion, j.completedAt = "completed", conclusion, s.clock.Now()
	if r := j.runner; r != nil && r.job == j {
		r.busy = false
		if r.ephemeral && j.runnerID != 0 {
			// It ran its one job.
			s.removeRunnerLocked(r)
		} else {
			r.job = nil
			r.idleSince = s.clock.Now()
			if r.session == "" {
				s.armRemovalLocked(r)
			}
		}
		r.wakeLocked()
	}
	s.updateRunLocked(j.run)
	s.emitLocked(j, "completed")
	s.scaleSetJobEventLocked(j, "JobCompleted")
	s.scheduleLocked()
}

// updateRunLocked derives the run's status from its jobs.
func (s *Simulator) updateRunLocked(rn *run) {
	rn.updatedAt = s.clock.Now()
	queued, running := 0, 0
	conclusion := "success"
	for _, j := range rn.jobs {
		switch j.status {
		case "queued":
			queued++
		case "in_progress":
			running++
		default:
			switch {
			case j.conclusion == "cancelled":
				conclusion = "cancelled"
			case conclusion != "cancelled" && (j.conclusion == "failure" || j.conclusion == "timed_out"):
				conclusion = "failure"
			}
		}
	}
	switch {
	case running > 0:
		rn.status = "in_progress"
	case queued > 0:
		if rn.status != "in_progress" {
			rn.status = "queued"
		}
	default:
		rn.status, rn.conclusion = "completed", conclusion
	}
}

// cancelRunLocked completes every unfinished job of the run as cancelled.
func (s *Simulator) cancelRunLocked(rn *run) error {
	if rn.status == "completed" {
		return &apiError{code: http.StatusConflict, msg: "Cannot cancel a workflow run that is completed."}
	}
	for _, j := range rn.jobs {
		s.completeJobLocked(j, "cancelled")
	}
	return nil
}

// CancelRun cancels a workflow run, as POST .../runs/{id}/cancel does.
func (s *Simulator) CancelRun(runID int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rn := s.runs[runID]
	if rn == nil {
		return fmt.Errorf("run %d does not exist", runID)
	}
	return s.cancelRunLocked(rn)
}

// CompleteJob finishes a queued or running job now with a conclusion.
func (s *Simulator) CompleteJob(jobID int64, conclusion string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	j := s.jobs[jobID]
	if j == nil {
		return fmt.Errorf("job %d does not exist", jobID)
	}
	if !validConclusions[conclusion] {
		return fmt.Errorf("unknown conclusion %q", conclusion)
	}
	s.completeJobLocked(j, conclusion)
	return nil
}

func (s *Simulator) jobSnapshot(j *job) Job {
	return Job{ID: j.id, RunID: j.run.id, RunAttempt: 1, Repository: j.run.repo.fullName(), Name: j.name, WorkflowName: j.run.workflowName,
		Labels: append([]string(nil), j.labels...), Status: j.status, Conclusion: j.conclusion, RunnerID: j.runnerID, RunnerName: j.runnerName,
		RunnerGroupID: j.groupID, RunnerGroupName: j.groupName, Duration: j.duration, CreatedAt: j.createdAt, StartedAt: j.startedAt, CompletedAt: j.completedAt,
		Steps: append([]string(nil), j.steps...), Log: j.log}
}

// SetDefaultJobSteps gives every job enqueued from now on without steps of
// its own these (JobRequest.Steps): what a test has the jobs of a world
// it does not queue itself run, such as devenv's.
func (s *Simulator) SetDefaultJobSteps(steps ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.defaultSteps = append([]string(nil), steps...)
}

// Job returns a job by id.
func (s *Simulator) Job(id int64) (Job, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j := s.jobs[id]
	if j == nil {
		return Job{}, false
	}
	return s.jobSnapshot(j), true
}

// Jobs returns every job in creation order.
func (s *Simulator) Jobs() []Job {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Job, 0, len(s.jobOrder))
	for _, id := range s.jobOrder {
		out = append(out, s.jobSnapshot(s.jobs[id]))
	}
	return out
}

// Runs returns every workflow run in creation order.
func (s *Simulator) Runs() []Run {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Run, 0, len(s.runOrder))
	for _, id := range s.runOrder {
		rn := s.runs[id]
		r := Run{ID: rn.id, Repository: rn.repo.fullName(), WorkflowName: rn.workflowName, Status: rn.status, CreatedAt: rn.createdAt}
		if rn.status == "completed" {
			r.Conclusion = rn.conclusion
		}
		for _, j := range rn.jobs {
			r.JobIDs = append(r.JobIDs, j.id)
		}
		out = append(out, r)
	}
	return out
}

// runInRepoLocked finds the run_id path variable's run in the repository.
func (s *Simulator) runInRepoLocked(q *request) (*run, error) {
	id, err := strconv.ParseInt(q.vars["run_id"], 10, 64)
	if err != nil {
		return nil, errNotFound()
	}
	rn := s.runs[id]
	if rn == nil || rn.repo != q.repo {
		return nil, errNotFound()
	}
	return rn, nil
}

// handleListRuns is GET /repos/{owner}/{repo}/actions/runs. status filters
// by status (queued, in_progress, completed, ...) or conclusion, as
// GitHub's does; newest first.
func (s *Simulator) handleListRuns(q *request) (int, any, error) {
	status := q.query.Get("status")
	var list []*run
	for i := len(s.runOrder) - 1; i >= 0; i-- {
		rn := s.runs[s.runOrder[i]]
		if rn.repo != q.repo {
			continue
		}
		if status != "" && rn.status != status && (rn.status != "completed" || rn.conclusion != status) {
			continue
		}
		if b := q.query.Get("branch"); b != "" && rn.headBranch != b {
			continue
		}
		list = append(list, rn)
	}
	start, end := q.paginate(len(list))
	out := make([]any, 0, end-start)
	for _, rn := range list[start:end] {
		out = append(out, s.runJSON(rn))
	}
	return http.StatusOK, map[string]any{"total_count": len(list), "workflow_runs": out}, nil
}

// handleGetRun is GET /repos/{owner}/{repo}/actions/runs/{run_id}.
func (s *Simulator) handleGetRun(q *request) (int, any, error) {
	rn, err := s.runInRepoLocked(q)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, s.runJSON(rn), nil
}

// handleListJobs is GET /repos/{owner}/{repo}/actions/runs/{run_id}/jobs.
func (s *Simulator) handleListJobs(q *request) (int, any, error) {
	rn, err := s.runInRepoLocked(q)
	if err != nil {
		return 0, nil, err
	}
	start, end := q.paginate(len(rn.jobs))
	out := make([]any, 0, end-start)
	for _, j := range rn.jobs[start:end] {
		out = append(out, s.jobJSON(j))
	}
	return http.StatusOK, map[string]any{"total_count": len(rn.jobs), "jobs": out}, nil
}

// handleGetJob is GET /repos/{owner}/{repo}/actions/jobs/{job_id}.
func (s *Simulator) handleGetJob(q *request) (int, any, error) {
	id, err := strconv.ParseInt(q.vars["job_id"], 10, 64)
	if err != nil {
		return 0, nil, errNotFound()
	}
	j := s.jobs[id]
	if j == nil || j.run.repo != q.repo {
		return 0, nil, errNotFound()
	}
	return http.StatusOK, s.jobJSON(j), nil
}

// handleCancelRun is POST /repos/{owner}/{repo}/actions/runs/{run_id}/cancel.
func (s *Simulator) handleCancelRun(q *request) (int, any, error) {
	rn, err := s.runInRepoLocked(q)
	if err != nil {
		return 0, nil, err
	}
	if err := s.cancelRunLocked(rn); err != nil {
		return 0, nil, err
	}
	return http.StatusAccepted, map[string]any{}, nil
}
