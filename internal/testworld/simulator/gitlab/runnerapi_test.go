package gitlabsim

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	gitlab "gitlab.com/gitlab-org/api/client-go"
)

// The structs below mirror the JSON of gitlab-runner's runner API client at
// the version runnertypes_test.go pins (gitlabRunnerVersion, main at commit
// fc1f1862bd91): common/network.go (VerifyRunnerRequest,
// VerifyRunnerResponse, UnregisterRunnerManagerRequest, Info, JobRequest,
// UpdateJobRequest, JobTraceOutput) and common/spec/spec.go (Job, JobInfo,
// GitInfo, RunnerInfo, Variable, Step, GitlabFeatures, Credentials). They
// are written here, field by field, because gitlab-runner's packages cannot
// be built on this machine (several of its dependencies cannot be fetched);
// runnertypes_test.go reads gitlab-runner's source at that version and fails
// when a JSON name, omitempty or Go kind here differs from it. The tests
// send requests built from them, as the runner does, and check that every
// field the runner reads is in the simulator's answers with a type it
// decodes (requireKeys).

type glrVerifyRunnerRequest struct {
	Info     glrInfo `json:"info"`
	Token    string  `json:"token,omitempty"`
	SystemID string  `json:"system_id,omitempty"`
}

type glrVerifyRunnerResponse struct {
	ID             int64     `json:"id,omitempty"`
	Token          string    `json:"token,omitempty"`
	TokenExpiresAt time.Time `json:"token_expires_at"`
}

type glrUnregisterRunnerManagerRequest struct {
	Token    string `json:"token,omitempty"`
	SystemID string `json:"system_id"`
}

type glrInfo struct {
	Name         string `json:"name,omitempty"`
	Version      string `json:"version,omitempty"`
	Revision     string `json:"revision,omitempty"`
	Platform     string `json:"platform,omitempty"`
	Architecture string `json:"architecture,omitempty"`
	Executor     string `json:"executor,omitempty"`
	Shell        string `json:"shell,omitempty"`
}

type glrJobRequest struct {
	Info       glrInfo `json:"info"`
	Token      string  `json:"token,omitempty"`
	SystemID   string  `json:"system_id,omitempty"`
	LastUpdate string  `json:"last_update,omitempty"`
}

type glrJobInfo struct {
	Name                                     string  `json:"name"`
	Stage                                    string  `json:"stage"`
	PipelineID                               int64   `json:"pipeline_id"`
	ProjectID                                int64   `json:"project_id"`
	ProjectName                              string  `json:"project_name"`
	ProjectFullPath                          string  `json:"project_full_path"`
	NamespaceID                              int64   `json:"namespace_id"`
	RootNamespaceID                          int64   `json:"root_namespace_id"`
	OrganizationID                           int64   `json:"organization_id"`
	InstanceID                               string  `json:"instance_id"`
	InstanceUUID                             string  `json:"instance_uuid"`
	UserID                                   int64   `json:"user_id"`
	ScopedUserID                             *int64  `json:"scoped_user_id,omitempty"`
	TimeInQueueSeconds                       float64 `json:"time_in_queue_seconds"`
	ProjectJobsRunningOnInstanceRunnersCount string  `json:"project_jobs_running_on_instance_runners_count"`
	QueueSize                                int64   `json:"queue_size"`
	QueueDepth                               int64   `json:"queue_depth"`
}

type glrGitInfo struct {
	RepoURL          string   `json:"repo_url"`
	RepoObjectFormat string   `json:"repo_object_format"`
	Ref              string   `json:"ref"`
	Sha              string   `json:"sha"`
	BeforeSha        string   `json:"before_sha"`
	RefType          string   `json:"ref_type"`
	Refspecs         []string `json:"refspecs"`
	Depth            int      `json:"depth"`
	Protected        *bool    `json:"protected"`
}

// glrVariable is spec.Variable. GitLab leaves file and raw out of a
// variable when they are false (its runner variables drop them), so the
// runner reads them as false: optional here (tag sim:"optional").
type glrVariable struct {
	Key    string `json:"key"`
	Value  string `json:"value"`
	Public bool   `json:"public"`
	File   bool   `json:"file" sim:"optional"`
	Masked bool   `json:"masked"`
	Raw    bool   `json:"raw" sim:"optional"`
}

type glrStep struct {
	Name         string   `json:"name"`
	Script       []string `json:"script"`
	Timeout      int      `json:"timeout"`
	When         string   `json:"when"`
	AllowFailure bool     `json:"allow_failure"`
}

// glrFeatures is spec.GitlabFeatures. GitLab sends tracing only where
// OpenTelemetry export is set up; the runner reads its absence as none (a
// nil pointer): optional here.
type glrFeatures struct {
	TraceSections     bool            `json:"trace_sections"`
	TokenMaskPrefixes []string        `json:"token_mask_prefixes"`
	FailureReasons    []string        `json:"failure_reasons"`
	Tracing           json.RawMessage `json:"tracing" sim:"optional"`
}

type glrCredentials struct {
	Type     string `json:"type"`
	URL      string `json:"url"`
	Username string `json:"username"`
	Password string `json:"password"`
}

// glrJob is spec.Job; image, services, artifacts, cache and dependencies
// are kept raw (the shell executor ignores images and services, and the
// simulator models no artifacts or caches) but must be present. inputs,
// policy_options and suspend_options are raw and optional: GitLab sends
// them for jobs with inputs, of an execution policy or suspended for
// approval, none of which the simulator models, and the runner reads
// their absence as none.
type glrJob struct {
	ID            int64      `json:"id"`
	Token         string     `json:"token"`
	AllowGitFetch bool       `json:"allow_git_fetch"`
	JobInfo       glrJobInfo `json:"job_info"`
	GitInfo       glrGitInfo `json:"git_info"`
	RunnerInfo    struct {
		UUID    string `json:"uuid"`
		Timeout int    `json:"timeout"`
	} `json:"runner_info"`
	Inputs         json.RawMessage  `json:"inputs" sim:"optional"`
	Variables      []glrVariable    `json:"variables"`
	Steps          []glrStep        `json:"steps"`
	Image          json.RawMessage  `json:"image"`
	Services       json.RawMessage  `json:"services"`
	Artifacts      json.RawMessage  `json:"artifacts"`
	Cache          json.RawMessage  `json:"cache"`
	Credentials    []glrCredentials `json:"credentials"`
	Dependencies   json.RawMessage  `json:"dependencies"`
	Features       glrFeatures      `json:"features"`
	Secrets        json.RawMessage  `json:"secrets,omitempty"`
	Hooks          json.RawMessage  `json:"hooks,omitempty"`
	Run            json.RawMessage  `json:"run,omitempty"`
	PolicyOptions  json.RawMessage  `json:"policy_options" sim:"optional"`
	SuspendOptions json.RawMessage  `json:"suspend_options" sim:"optional"`
}

type glrJobTraceOutput struct {
	Checksum string `json:"checksum,omitempty"`
	Bytesize int    `json:"bytesize,omitempty"`
}

type glrUpdateJobRequest struct {
	Info                  glrInfo           `json:"info"`
	Token                 string            `json:"token,omitempty"`
	State                 string            `json:"state,omitempty"`
	FailureReason         string            `json:"failure_reason,omitempty"`
	Checksum              string            `json:"checksum,omitempty"`
	Output                glrJobTraceOutput `json:"output"`
	ExitCode              int               `json:"exit_code,omitempty"`
	RuntimeEnvironmentKey string            `json:"runtime_environment_key,omitempty"`
}

// requireKeys fails when raw (a JSON object) lacks a key of typ's JSON
// fields (recursing into struct fields, and into the first element of
// slices of structs); omitempty fields are optional, as for the runner, and
// so are those tagged sim:"optional" (see glrVariable).
func requireKeys(t *testing.T, where string, raw json.RawMessage, typ reflect.Type) {
	t.Helper()
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		t.Fatalf("%s: not an object: %v", where, err)
	}
	for i := range typ.NumField() {
		f := typ.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		v, ok := obj[name]
		if !ok {
			if !strings.Contains(opts, "omitempty") && f.Tag.Get("sim") != "optional" {
				t.Errorf("%s.%s: missing (gitlab-runner reads it)", where, name)
			}
			continue
		}
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft.Kind() == reflect.Struct && ft != reflect.TypeFor[time.Time]():
			requireKeys(t, where+"."+name, v, ft)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			var elems []json.RawMessage
			if err := json.Unmarshal(v, &elems); err != nil {
				t.Errorf("%s.%s: not an array: %v", where, name, err)
			} else if len(elems) > 0 {
				requireKeys(t, where+"."+name+"[0]", elems[0], ft.Elem())
			}
		}
	}
}

// TestRunnerAPIAgainstRunnerTypes drives the runner API with gitlab-runner's
// own request shapes through a whole job: verify, request (204 until a job
// matches, honouring last_update), trace patches, updates, and the end of
// the job and of the runner.
func TestRunnerAPIAgainstRunnerTypes(t *testing.T) {
	w := newWorld(t)
	app := w.projectID(t, "acme/platform/app")
	r := w.createRunner(t, maintPAT, &gitlab.CreateUserRunnerOptions{RunnerType: ptr(ProjectType), ProjectID: ptr(app), TagList: ptr([]string{"hyperfleet"}), RunUntagged: ptr(false)})
	info := glrInfo{Name: "gitlab-runner", Version: "18.11.0", Platform: "linux", Architecture: "amd64", Executor: "shell", Shell: "bash"}

	status, _, body := w.call(t, "POST", "/api/v4/runners/verify", nil, glrVerifyRunnerRequest{Token: r.Token, SystemID: "s_0123456789ab"})
	var vr glrVerifyRunnerResponse
	if status != 200 || json.Unmarshal(body, &vr) != nil || vr.ID != r.ID || vr.Token != r.Token {
		t.Fatalf("verify: %d %s", status, body)
	}
	requireKeys(t, "verify", body, reflect.TypeFor[glrVerifyRunnerResponse]())
	if status, _, _ := w.call(t, "POST", "/api/v4/runners/verify", nil, glrVerifyRunnerRequest{Token: "glrt-wrong", SystemID: "s_0123456789ab"}); status != 403 {
		t.Fatalf("verify with a wrong token: %d, want 403", status)
	}

	req := glrJobRequest{Info: info, Token: r.Token, SystemID: "s_0123456789ab"}
	status, h, _ := w.call(t, "POST", "/api/v4/jobs/request", nil, req)
	if status != 204 || h.Get("X-GitLab-Last-Update") == "" {
		t.Fatalf("request with no jobs: %d %v", status, h)
	}
	req.LastUpdate = h.Get("X-GitLab-Last-Update")
	// An untagged job and one tagged for other runners do not match; the
	// queue moved, so last_update no longer short-circuits.
	if _, err := w.sim.CreatePipeline(PipelineRequest{Project: "acme/platform/app", Jobs: []JobConfig{{Name: "untagged", Script: []string{"true"}}, {Name: "gpu", Script: []string{"true"}, Tags: []string{"gpu"}}}}); err != nil {
		t.Fatal(err)
	}
	status, h, _ = w.call(t, "POST", "/api/v4/jobs/request", nil, req)
	if status != 204 || h.Get("X-GitLab-Last-Update") == req.LastUpdate {
		t.Fatalf("request with no matching job: %d, last update %q (was %q)", status, h.Get("X-GitLab-Last-Update"), req.LastUpdate)
	}
	req.LastUpdate = h.Get("X-GitLab-Last-Update")
	pl, err := w.sim.CreatePipeline(PipelineRequest{Project: "acme/platform/app", Jobs: []JobConfig{{Name: "build", Script: []string{"echo hello", "make"}, Tags: []string{"hyperfleet"}, Variables: map[string]string{"GREETING": "hi"}}}})
	if err != nil {
		t.Fatal(err)
	}
	status, _, body = w.call(t, "POST", "/api/v4/jobs/request", nil, req)
	if status != 201 {
		t.Fatalf("request with a matching job: %d %s", status, body)
	}
	requireKeys(t, "job", body, reflect.TypeFor[glrJob]())
	var job glrJob
	if err := json.Unmarshal(body, &job); err != nil {
		t.Fatalf("job payload into gitlab-runner's types: %v", err)
	}
	if job.ID != pl.Jobs[0] || !strings.HasPrefix(job.Token, "glcbt-") || job.JobInfo.ProjectID != app || job.JobInfo.ProjectFullPath != "acme/platform/app" ||
		len(job.Steps) != 1 || job.Steps[0].Name != "script" || strings.Join(job.Steps[0].Script, ";") != "echo hello;make" || job.RunnerInfo.Timeout != 3600 ||
		!strings.Contains(job.GitInfo.RepoURL, "gitlab-ci-token:"+job.Token+"@") || len(job.GitInfo.Sha) != 40 {
		t.Fatalf("job payload: %+v", job)
	}
	vars := map[string]string{}
	for _, v := range job.Variables {
		vars[v.Key] = v.Value
	}
	if vars["CI_JOB_TOKEN"] != job.Token || vars["CI_JOB_ID"] != strconv.FormatInt(job.ID, 10) || vars["GREETING"] != "hi" || vars["CI_PROJECT_PATH"] != "acme/platform/app" {
		t.Fatalf("job variables: %v", vars)
	}
	if j, _ := w.sim.Job(job.ID); j.Status != StatusRunning || j.RunnerID != r.ID {
		t.Fatalf("picked job: %+v", j)
	}

	patch := func(token, contentRange, data string) (int, http.Header) {
		hd := http.Header{"Job-Token": {token}, "Content-Type": {"text/plain"}}
		if contentRange != "" {
			hd.Set("Content-Range", contentRange)
		}
		st, h, _ := w.call(t, "PATCH", "/api/v4/jobs/"+strconv.FormatInt(job.ID, 10)+"/trace", hd, []byte(data))
		return st, h
	}
	if st, h := patch(job.Token, "0-5", "hello\n"); st != 202 || h.Get("Job-Status") != "running" || h.Get("Range") != "0-6" || h.Get("X-GitLab-Trace-Update-Interval") == "" {
		t.Fatalf("first trace patch: %d %v", st, h)
	}
	if st, h := patch(job.Token, "3-5", "lo\n"); st != 416 || h.Get("Range") != "0-6" {
		t.Fatalf("overlapping patch: %d %v, want 416 with Range 0-6", st, h)
	}
	if st, _ := patch(job.Token, "", "x"); st != 400 {
		t.Fatalf("patch without Content-Range: %d, want 400", st)
	}
	if st, _ := patch("glcbt-wrong", "6-7", "x\n"); st != 403 {
		t.Fatalf("patch with a wrong job token: %d, want 403", st)
	}
	if st, _ := patch(job.Token, "6-11", "world\n"); st != 202 {
		t.Fatalf("second patch: %d", st)
	}

	put := func(u glrUpdateJobRequest) (int, http.Header) {
		st, h, _ := w.call(t, "PUT", "/api/v4/jobs/"+strconv.FormatInt(job.ID, 10), http.Header{"Job-Token": {u.Token}}, u)
		return st, h
	}
	if st, h := put(glrUpdateJobRequest{Info: info, Token: job.Token, State: "running"}); st != 200 || h.Get("Job-Status") != "running" {
		t.Fatalf("heartbeat: %d %v", st, h)
	}
	// The runner says it sent 20 bytes of log; 12 arrived: 202, try again.
	if st, _ := put(glrUpdateJobRequest{Info: info, Token: job.Token, State: "failed", FailureReason: "script_failure", ExitCode: 2, Output: glrJobTraceOutput{Bytesize: 20}}); st != 202 {
		t.Fatalf("update with the log incomplete: %d, want 202", st)
	}
	if st, h := put(glrUpdateJobRequest{Info: info, Token: job.Token, State: "failed", FailureReason: "script_failure", ExitCode: 2, Output: glrJobTraceOutput{Bytesize: 12}}); st != 200 || h.Get("Job-Status") != "failed" {
		t.Fatalf("final update: %d %v", st, h)
	}
	j, _ := w.sim.Job(job.ID)
	if j.Status != StatusFailed || j.ExitCode == nil || *j.ExitCode != 2 || j.FailureReason != "script_failure" || j.Trace != "hello\nworld\n" {
		t.Fatalf("finished job: %+v", j)
	}
	if st, h := put(glrUpdateJobRequest{Token: job.Token, State: "success"}); st != 403 || h.Get("Job-Status") != "failed" {
		t.Fatalf("update of a finished job: %d %v, want 403 with Job-Status failed", st, h)
	}

	// unregister (glrt- tokens): the manager goes, the runner stays.
	if st, _, _ := w.call(t, "DELETE", "/api/v4/runners/managers", nil, glrUnregisterRunnerManagerRequest{Token: r.Token, SystemID: "s_0123456789ab"}); st != 204 {
		t.Fatalf("unregister manager: %d", st)
	}
	if rs := w.sim.Runners(); len(rs) != 1 || len(rs[0].Managers) != 0 {
		t.Fatalf("runners after unregistering the manager: %+v", rs)
	}
	// A runner deleted through REST: its token stops working at once.
	if _, err := w.client(t, maintPAT).Runners.DeleteRegisteredRunnerByID(r.ID); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := w.call(t, "POST", "/api/v4/runners/verify", nil, glrVerifyRunnerRequest{Token: r.Token}); st != 403 {
		t.Fatalf("verify after delete: %d, want 403", st)
	}
	if st, _, _ := w.call(t, "POST", "/api/v4/jobs/request", nil, glrJobRequest{Token: r.Token}); st != 403 {
		t.Fatalf("request after delete: %d, want 403", st)
	}
}

// TestStagesAndRunnerToken checks the pipeline's stage order (the second
// stage waits, then is skipped after a failure), tokens sent in the
// RUNNER-TOKEN header only, and a running job's failure when its runner is
// deleted.
func TestStagesAndRunnerToken(t *testing.T) {
	w := newWorld(t)
	r := w.createRunner(t, adminPAT, &gitlab.CreateUserRunnerOptions{RunnerType: ptr(InstanceType)})
	pl, err := w.sim.CreatePipeline(PipelineRequest{Project: "acme/web", User: "owner", Jobs: []JobConfig{
		{Name: "build", Stage: "build", Script: []string{"true"}},
		{Name: "test", Stage: "test", Script: []string{"true"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if j, _ := w.sim.Job(pl.Jobs[1]); j.Status != StatusCreated {
		t.Fatalf("second stage before the first ran: %s", j.Status)
	}
	status, _, body := w.call(t, "POST", "/api/v4/jobs/request", http.Header{"Runner-Token": {r.Token}}, glrJobRequest{})
	var job glrJob
	if status != 201 || json.Unmarshal(body, &job) != nil || job.ID != pl.Jobs[0] {
		t.Fatalf("request by header token: %d %s", status, body)
	}
	if st, _, _ := w.call(t, "PUT", "/api/v4/jobs/"+strconv.FormatInt(job.ID, 10), http.Header{"Job-Token": {job.Token}}, glrUpdateJobRequest{State: "failed", FailureReason: "script_failure", ExitCode: 1}); st != 200 {
		t.Fatalf("fail the first job: %d", st)
	}
	if j, _ := w.sim.Job(pl.Jobs[1]); j.Status != StatusSkipped {
		t.Fatalf("second stage after a failure: %s, want skipped", j.Status)
	}

	pl, err = w.sim.CreatePipeline(PipelineRequest{Project: "acme/web", User: "owner", Jobs: []JobConfig{{Name: "long", Script: []string{"sleep 100"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if st, _, _ := w.call(t, "POST", "/api/v4/jobs/request", nil, glrJobRequest{Token: r.Token}); st != 201 {
		t.Fatalf("request: %d", st)
	}
	if _, err := w.client(t, adminPAT).Runners.DeleteRegisteredRunnerByID(r.ID); err != nil {
		t.Fatal(err)
	}
	if j, _ := w.sim.Job(pl.Jobs[0]); j.Status != StatusFailed || j.FailureReason != "runner_system_failure" {
		t.Fatalf("running job of a deleted runner: %+v", j)
	}
}
