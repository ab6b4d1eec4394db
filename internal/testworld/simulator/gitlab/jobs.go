package gitlabsim

import (
	"errors"
	"fmt"
	"slices"
)

// PipelineRequest creates a pipeline of jobs in a project, as a push that
// runs .gitlab-ci.yml would. Stages run in the order their jobs are listed;
// a stage's jobs wait (created) until every job of the stages before it
// succeeded (or failed with allow_failure), and are skipped once one failed.
type PipelineRequest struct {
	Project string      `json:"project"` // full path
	Ref     string      `json:"ref,omitempty"`
	User    string      `json:"user,omitempty"` // who pushed; default the project's first member found
	Jobs    []JobConfig `json:"jobs"`
}

// JobConfig is one job of a pipeline.
type JobConfig struct {
	Name         string            `json:"name"`
	Stage        string            `json:"stage,omitempty"` // default "test"
	Script       []string          `json:"script"`
	Tags         []string          `json:"tags,omitempty"`
	Variables    map[string]string `json:"variables,omitempty"`
	AllowFailure bool              `json:"allowFailure,omitempty"`
	// Timeout in seconds (default 3600, GitLab's project default): the
	// job's timeout keyword, else its project's. The runner that takes the
	// job caps it at its maximum_timeout, when it has one.
	Timeout int `json:"timeout,omitempty"`
}

// Job is a job's state as tests read it.
type Job struct {
	ID         int64    `json:"id"`
	PipelineID int64    `json:"pipelineId"`
	ProjectID  int64    `json:"projectId"`
	Name       string   `json:"name"`
	Stage      string   `json:"stage"`
	Status     string   `json:"status"`
	Tags       []string `json:"tags"`
	RunnerID   int64    `json:"runnerId,omitempty"`
	// Protected: the job's ref is a protected branch.
	Protected bool `json:"protected,omitempty"`
	// Timeout is the job's timeout in seconds: its own, capped by its
	// runner's maximum_timeout once a runner took it.
	Timeout       int    `json:"timeout"`
	ExitCode      *int   `json:"exitCode,omitempty"`
	FailureReason string `json:"failureReason,omitempty"`
	Trace         string `json:"trace"`
}

// Pipeline is a created pipeline's ids.
type Pipeline struct {
	ID     int64   `json:"id"`
	Status string  `json:"status"`
	Jobs   []int64 `json:"jobs"`
}

// CreatePipeline creates a pipeline and makes its first stage's jobs
// pending (Job Hook deliveries for created and pending).
func (s *Simulator) CreatePipeline(req PipelineRequest) (Pipeline, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.projectByPathLocked(req.Project)
	if p == nil {
		return Pipeline{}, fmt.Errorf("no project %q", req.Project)
	}
	if len(req.Jobs) == 0 {
		return Pipeline{}, errors.New("a pipeline needs jobs")
	}
	var u *user
	if req.User != "" {
		if u = s.userByNameLocked(req.User); u == nil {
			return Pipeline{}, fmt.Errorf("no user %q", req.User)
		}
	} else {
		for _, c := range s.users {
			if !c.bot && c.projectLevel(p) >= Developer && (u == nil || c.id < u.id) {
				u = c
			}
		}
		if u == nil {
			return Pipeline{}, fmt.Errorf("project %q has no Developer to push; give user", req.Project)
		}
	}
	ref := req.Ref
	if ref == "" {
		ref = p.defaultBranch
	}
	now := s.clock.Now()
	pl := &pipeline{id: s.id("pipeline"), project: p, ref: ref, protected: p.protectedRef(ref), sha: randomHex(20), status: StatusCreated, created: now, user: u}
	pl.iid = pl.id - 500000
	for _, jc := range req.Jobs {
		if jc.Name == "" || len(jc.Script) == 0 {
			return Pipeline{}, errors.New("every job needs a name and a script")
		}
		stage := jc.Stage
		if stage == "" {
			stage = "test"
		}
		if !slices.Contains(pl.stages, stage) {
			pl.stages = append(pl.stages, stage)
		}
		timeout := jc.Timeout
		if timeout == 0 {
			timeout = 3600
		}
		j := &job{id: s.id("job"), name: jc.Name, stage: stage, script: jc.Script, tags: jc.Tags, variables: jc.Variables, allowFailure: jc.AllowFailure, pipeline: pl, status: StatusCreated, created: now, timeout: timeout}
		pl.jobs = append(pl.jobs, j)
		s.jobs[j.id] = j
		s.jobOrder = append(s.jobOrder, j.id)
	}
	s.pipes[pl.id] = pl
	for _, j := range pl.jobs {
		s.jobEventLocked(j)
	}
	s.advancePipelineLocked(pl)
	out := Pipeline{ID: pl.id, Status: pl.status}
	for _, j := range pl.jobs {
		out.Jobs = append(out.Jobs, j.id)
	}
	return out, nil
}

// advancePipelineLocked makes the next stage's jobs pending once the stages
// before it passed, skips the rest after a failure, and derives the
// pipeline's status.
func (s *Simulator) advancePipelineLocked(pl *pipeline) {
	failed := false
	for _, st := range pl.stages {
		done := true
		for _, j := range pl.jobs {
			if j.stage != st {
				continue
			}
			switch {
			case failed && j.status == StatusCreated:
				j.status = StatusSkipped
				s.jobEventLocked(j)
			case j.status == StatusCreated:
				j.status = StatusPending
				j.queued = s.clock.Now()
				s.queueTick++
				s.jobEventLocked(j)
				done = false
			case j.status == StatusPending || j.status == StatusRunning:
				done = false
			case (j.status == StatusFailed || j.status == StatusCanceled) && !j.allowFailure:
				failed = true
			}
		}
		if !done && !failed {
			break
		}
	}
	pl.status = pipelineStatus(pl)
}

// pipelineStatus is GitLab's composite status, for the states modelled.
func pipelineStatus(pl *pipeline) string {
	has := map[string]bool{}
	for _, j := range pl.jobs {
		st := j.status
		if st == StatusFailed && j.allowFailure {
			st = StatusSuccess
		}
		has[st] = true
	}
	switch {
	case has[StatusRunning]:
		return StatusRunning
	case has[StatusPending]:
		return StatusPending
	case has[StatusCreated]:
		return StatusCreated
	case has[StatusFailed]:
		return StatusFailed
	case has[StatusCanceled]:
		return StatusCanceled
	case has[StatusSuccess]:
		return StatusSuccess
	}
	return StatusSkipped
}

// finishJobLocked ends a job and moves its pipeline on.
func (s *Simulator) finishJobLocked(j *job, status, reason string, exit *int) {
	j.status = status
	j.failureReason = reason
	j.exitCode = exit
	j.finished = s.clock.Now()
	s.jobEventLocked(j)
	s.advancePipelineLocked(j.pipeline)
}

// cancelJobLocked cancels an unfinished job: a pending one is never picked
// up, a running one is told so on its runner's next update or trace patch
// (Job-Status: canceled), as GitLab does for runners without graceful
// cancellation.
func (s *Simulator) cancelJobLocked(j *job) {
	switch j.status {
	case StatusCreated, StatusPending, StatusRunning:
		s.finishJobLocked(j, StatusCanceled, "", nil)
	}
}

// CancelJob cancels a job (as the REST call does).
func (s *Simulator) CancelJob(id int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	j := s.jobs[id]
	if j == nil {
		return fmt.Errorf("no job %d", id)
	}
	s.cancelJobLocked(j)
	return nil
}

// Job returns a job's state and trace.
func (s *Simulator) Job(id int64) (Job, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j := s.jobs[id]
	if j == nil {
		return Job{}, false
	}
	out := Job{ID: j.id, PipelineID: j.pipeline.id, ProjectID: j.pipeline.project.id, Name: j.name, Stage: j.stage, Status: j.status, Tags: j.tags,
		Protected: j.pipeline.protected, Timeout: j.timeout, ExitCode: j.exitCode, FailureReason: j.failureReason, Trace: string(j.trace)}
	if j.runner != nil {
		out.RunnerID = j.runner.id
	}
	return out, true
}
