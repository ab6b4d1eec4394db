package gitlabsim

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"

	gitlab "gitlab.com/gitlab-org/api/client-go"
)

// requestJob asks for a job with token as one gitlab-runner process does
// (its own system_id) and returns the status and the job payload's id and
// timeout.
func (w *world) requestJob(t *testing.T, token, systemID string) (code int, id int64, timeout int) {
	t.Helper()
	code, _, body := w.call(t, http.MethodPost, APIPrefix+"/jobs/request", nil, map[string]any{"token": token, "system_id": systemID})
	if code != http.StatusCreated {
		return code, 0, 0
	}
	var job struct {
		ID         int64 `json:"id"`
		RunnerInfo struct {
			Timeout int `json:"timeout"`
		} `json:"runner_info"`
	}
	if err := json.Unmarshal(body, &job); err != nil {
		t.Fatal(err)
	}
	return code, job.ID, job.RunnerInfo.Timeout
}

// TestRunnerLimits: the runner attributes that bound what a runner
// authentication token gets, as GitLab applies them. One token serves any
// number of processes (each its own runner manager): both get jobs. A
// paused runner gets no job, while the job it runs goes on to its end
// (its updates authenticate with the job's token). maximum_timeout caps
// the timeout of the jobs the runner takes (GitLab accepts no less than
// 600 s), and an update of it applies to the jobs taken afterwards. A
// ref_protected runner takes only the jobs of protected refs (the default
// branch, and branches configured protected); a not_protected one takes
// any, protected ones included.
func TestRunnerLimits(t *testing.T) {
	// setup is a world of its own for each case, whose jobs are of
	// project acme/platform/app and tag linux.
	setup := func(t *testing.T) (w *world, c *gitlab.Client, queue func(ref string, timeout int) int64, newRunner func(gitlab.CreateUserRunnerOptions) *gitlab.UserRunner) {
		w = newWorld(t)
		c = w.client(t, maintPAT)
		pid := w.projectID(t, "acme/platform/app")
		queue = func(ref string, timeout int) int64 {
			t.Helper()
			pl, err := w.sim.CreatePipeline(PipelineRequest{Project: "acme/platform/app", Ref: ref, Jobs: []JobConfig{{Name: "build", Script: []string{"true"}, Tags: []string{"linux"}, Timeout: timeout}}})
			if err != nil {
				t.Fatal(err)
			}
			return pl.Jobs[0]
		}
		newRunner = func(opt gitlab.CreateUserRunnerOptions) *gitlab.UserRunner {
			opt.RunnerType, opt.ProjectID, opt.TagList = gitlab.Ptr(ProjectType), gitlab.Ptr(pid), gitlab.Ptr([]string{"linux"})
			r, _, err := c.Users.CreateUserRunner(&opt)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		return w, c, queue, newRunner
	}

	t.Run("one token, several processes, paused at the first job", func(t *testing.T) {
		w, c, queue, newRunner := setup(t)
		r := newRunner(gitlab.CreateUserRunnerOptions{MaximumTimeout: gitlab.Ptr(int64(1800))})
		first, second, third := queue("main", 3600), queue("main", 3600), queue("main", 3600)
		if code, id, timeout := w.requestJob(t, r.Token, "s_00000000000a"); code != http.StatusCreated || id != first || timeout != 1800 {
			t.Fatalf("first process: %d job %d timeout %d, want 201 job %d capped at the runner's 1800 s", code, id, timeout, first)
		}
		if code, id, _ := w.requestJob(t, r.Token, "s_00000000000b"); code != http.StatusCreated || id != second {
			t.Fatalf("a second process with the same token: %d job %d, want 201 job %d (the token is multi-job)", code, id, second)
		}
		if _, _, err := c.Runners.UpdateRunnerDetails(r.ID, &gitlab.UpdateRunnerDetailsOptions{Paused: gitlab.Ptr(true)}); err != nil {
			t.Fatal(err)
		}
		for _, sys := range []string{"s_00000000000a", "s_00000000000c"} {
			if code, id, _ := w.requestJob(t, r.Token, sys); code != http.StatusNoContent {
				t.Fatalf("paused runner, process %s: %d job %d, want 204", sys, code, id)
			}
		}
		w.sim.mu.Lock()
		jobToken := w.sim.jobs[first].token
		w.sim.mu.Unlock()
		if code, _, _ := w.call(t, http.MethodPatch, APIPrefix+"/jobs/"+strconv.FormatInt(first, 10)+"/trace", http.Header{"Job-Token": {jobToken}, "Content-Range": {"0-2"}}, []byte("ok\n")); code != http.StatusAccepted {
			t.Fatalf("the running job's log on a paused runner: %d, want 202", code)
		}
		if code, _, _ := w.call(t, http.MethodPut, APIPrefix+"/jobs/"+strconv.FormatInt(first, 10), nil, map[string]any{"token": jobToken, "state": "success", "exit_code": 0, "output": map[string]any{"bytesize": 3}}); code != http.StatusOK {
			t.Fatalf("the running job's end on a paused runner: %d, want 200", code)
		}
		if j, _ := w.sim.Job(first); j.Status != StatusSuccess || j.Timeout != 1800 {
			t.Fatalf("the job the paused runner ran: %+v", j)
		}
		if j, _ := w.sim.Job(third); j.Status != StatusPending {
			t.Fatalf("a job queued while the runner was paused: %s, want pending", j.Status)
		}
	})

	t.Run("maximum_timeout", func(t *testing.T) {
		w, c, queue, newRunner := setup(t)
		pid := w.projectID(t, "acme/platform/app")
		if _, _, err := c.Users.CreateUserRunner(&gitlab.CreateUserRunnerOptions{RunnerType: gitlab.Ptr(ProjectType), ProjectID: gitlab.Ptr(pid),
			TagList: gitlab.Ptr([]string{"linux"}), MaximumTimeout: gitlab.Ptr(int64(599))}); statusOf(err) != http.StatusBadRequest {
			t.Fatalf("maximum_timeout 599: %v, want 400", err)
		}
		r := newRunner(gitlab.CreateUserRunnerOptions{AccessLevel: gitlab.Ptr("ref_protected")})
		short := queue("main", 900)
		if _, id, timeout := w.requestJob(t, r.Token, "s_00000000000d"); id != short || timeout != 900 {
			t.Fatalf("no maximum_timeout: job %d timeout %d, want job %d with its own 900 s", id, timeout, short)
		}
		if _, _, err := c.Runners.UpdateRunnerDetails(r.ID, &gitlab.UpdateRunnerDetailsOptions{MaximumTimeout: gitlab.Ptr(int64(60))}); statusOf(err) != http.StatusBadRequest {
			t.Fatalf("an update to maximum_timeout 60: %v, want 400", err)
		}
		d, _, err := c.Runners.UpdateRunnerDetails(r.ID, &gitlab.UpdateRunnerDetailsOptions{MaximumTimeout: gitlab.Ptr(int64(600))})
		if err != nil || d.MaximumTimeout != 600 || d.AccessLevel != "ref_protected" {
			t.Fatalf("update: %v %+v", err, d)
		}
		long := queue("main", 7200)
		if _, id, timeout := w.requestJob(t, r.Token, "s_00000000000d"); id != long || timeout != 600 {
			t.Fatalf("after the update: job %d timeout %d, want job %d capped at 600 s", id, timeout, long)
		}
		if j, _ := w.sim.Job(short); j.Timeout != 900 {
			t.Fatalf("the job taken before the update: timeout %d, want its 900 s", j.Timeout)
		}
	})

	t.Run("access level", func(t *testing.T) {
		w, c, queueWith, newRunner := setup(t)
		pid := w.projectID(t, "acme/platform/app")
		queue := func(ref string) int64 { return queueWith(ref, 0) }
		runner := func(level string) *gitlab.UserRunner {
			return newRunner(gitlab.CreateUserRunnerOptions{AccessLevel: gitlab.Ptr(level)})
		}
		feature := queue("feature/x")
		protected := queue("main")
		refProtected, notProtected := runner("ref_protected"), runner("not_protected")
		if code, id, _ := w.requestJob(t, refProtected.Token, "s_0000000000e1"); code != http.StatusCreated || id != protected {
			t.Fatalf("ref_protected runner: %d job %d, want the protected-ref job %d (not the older job %d of an unprotected branch)", code, id, protected, feature)
		}
		if j, _ := w.sim.Job(protected); !j.Protected {
			t.Fatal("a job of the default branch is not protected")
		}
		if code, _, _ := w.requestJob(t, refProtected.Token, "s_0000000000e1"); code != http.StatusNoContent {
			t.Fatalf("ref_protected runner with only an unprotected-branch job pending: %d, want 204", code)
		}
		if _, id, _ := w.requestJob(t, notProtected.Token, "s_0000000000e2"); id != feature {
			t.Fatalf("not_protected runner: job %d, want %d", id, feature)
		}
		another := queue("main")
		if _, id, _ := w.requestJob(t, notProtected.Token, "s_0000000000e2"); id != another {
			t.Fatalf("not_protected runner: job %d, want the protected-ref job %d as well", id, another)
		}
		// A branch configured protected besides the default one.
		if _, err := w.sim.AddProject(ProjectConfig{Path: "acme/platform/svc", ProtectedBranches: []string{"release"}}); err != nil {
			t.Fatal(err)
		}
		for ref, want := range map[string]bool{"release": true, "main": true, "dev": false} {
			pl, err := w.sim.CreatePipeline(PipelineRequest{Project: "acme/platform/svc", User: "owner", Ref: ref, Jobs: []JobConfig{{Name: "build", Script: []string{"true"}}}})
			if err != nil {
				t.Fatal(err)
			}
			if j, _ := w.sim.Job(pl.Jobs[0]); j.Protected != want {
				t.Errorf("a job of branch %s of acme/platform/svc: protected %v, want %v", ref, j.Protected, want)
			}
		}
		if _, _, err := c.Users.CreateUserRunner(&gitlab.CreateUserRunnerOptions{RunnerType: gitlab.Ptr(ProjectType), ProjectID: gitlab.Ptr(pid),
			TagList: gitlab.Ptr([]string{"linux"}), AccessLevel: gitlab.Ptr("protected")}); statusOf(err) != http.StatusBadRequest {
			t.Fatalf("access_level protected: %v, want 400", err)
		}
	})
}
