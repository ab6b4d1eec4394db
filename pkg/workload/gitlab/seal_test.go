package gitlab_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	gl "gitlab.com/gitlab-org/api/client-go"

	"github.com/hyperfleet/hyperfleet/internal/testworld/credmethods"
	gitlabsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/gitlab"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	glworkload "github.com/hyperfleet/hyperfleet/pkg/workload/gitlab"
)

// TestRunnerBounds: every runner is created with the attributes that bound
// what its token can get: an explicit access level (the template's, else
// not_protected), locked, and a maximum_timeout of the runner's job
// timeout, at least GitLab's 10 minutes, and 3 hours when no pool says.
func TestRunnerBounds(t *testing.T) {
	w := newWorld(t, nil)
	ctx := context.Background()
	admin, err := gl.NewClient(adminPAT, gl.WithBaseURL(w.srv.URL+gitlabsim.APIPrefix), gl.WithoutRetries())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name        string
		accessLevel string
		jobTimeout  time.Duration
		wantLevel   string
		wantTimeout int64
	}{
		{name: "vm-pool", jobTimeout: 45 * time.Minute, wantLevel: "not_protected", wantTimeout: 2700},
		{name: "vm-short", jobTimeout: time.Minute, wantLevel: "not_protected", wantTimeout: 600},
		{name: "vm-odd", jobTimeout: 90*time.Minute + 500*time.Millisecond, wantLevel: "not_protected", wantTimeout: 5401},
		{name: "vm-no-pool", wantLevel: "not_protected", wantTimeout: 3 * 3600},
		{name: "vm-protected", accessLevel: "ref_protected", jobTimeout: 72 * time.Hour, wantLevel: "ref_protected", wantTimeout: 72 * 3600},
	} {
		p, err := glworkload.New(glworkload.Config{URL: w.srv.URL, Token: ownerPAT, Scope: glworkload.ScopeOf("", "acme/platform", false), AccessLevel: tc.accessLevel})
		if err != nil {
			t.Fatal(err)
		}
		cred, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: tc.name, Labels: []string{"linux"}, Method: credmethods.MethodRunnerAuthToken, JobTimeout: tc.jobTimeout})
		if err != nil {
			t.Fatal(err)
		}
		d, _, err := admin.Runners.GetRunnerDetails(cred.RunnerID)
		if err != nil {
			t.Fatal(err)
		}
		if d.AccessLevel != tc.wantLevel || d.MaximumTimeout != tc.wantTimeout || !d.Locked || d.Paused {
			t.Errorf("%s: access_level %q, maximum_timeout %d, locked %v, paused %v; want %q, %d, locked, unpaused",
				tc.name, d.AccessLevel, d.MaximumTimeout, d.Locked, d.Paused, tc.wantLevel, tc.wantTimeout)
		}
	}
}

// TestSealRunner: SealRunner pauses the runner (by id, or by name), after
// which its token gets no job while the job it took runs on; sealing again
// is success, a runner that is gone ErrNotFound. The runner list shows a
// runner running a job busy, so that the resync sees it take its job.
func TestSealRunner(t *testing.T) {
	w := newWorld(t, nil)
	ctx := context.Background()
	p := w.provider(t, ownerPAT, glworkload.ScopeOf("", "acme/platform", false))
	queue := func() int64 {
		t.Helper()
		pl, err := w.sim.CreatePipeline(gitlabsim.PipelineRequest{Project: "acme/platform/app", Jobs: []gitlabsim.JobConfig{{Name: "build", Script: []string{"true"}, Tags: []string{"linux"}}}})
		if err != nil {
			t.Fatal(err)
		}
		return pl.Jobs[0]
	}
	state := func(name string) workload.RunnerState {
		t.Helper()
		rs, err := p.ListRunners(ctx, name)
		if err != nil || len(rs) != 1 {
			t.Fatalf("list %s: %v %v", name, rs, err)
		}
		return rs[0].State
	}
	for _, byName := range []bool{false, true} {
		name := "vm-seal-by-id"
		if byName {
			name = "vm-seal-by-name"
		}
		cred, err := p.IssueCredential(ctx, workload.RunnerSpec{Name: name, Labels: []string{"linux"}, Method: credmethods.MethodRunnerAuthToken})
		if err != nil {
			t.Fatal(err)
		}
		first, second := queue(), queue()
		token := cred.Secret.Reveal()
		if code, body := w.runnerCall(t, "/jobs/request", map[string]any{"token": token, "system_id": "s_0000000000a1"}); code != http.StatusCreated || int64(body["id"].(float64)) != first {
			t.Fatalf("%s takes its job: %d %v", name, code, body["id"])
		}
		if s := state(name); s != workload.RunnerBusy {
			t.Fatalf("%s running a job is listed %s, want busy", name, s)
		}
		id := cred.RunnerID
		if byName {
			id = 0
		}
		for range 2 {
			if err := p.SealRunner(ctx, id, name); err != nil {
				t.Fatalf("seal %s: %v", name, err)
			}
		}
		if code, _ := w.runnerCall(t, "/jobs/request", map[string]any{"token": token, "system_id": "s_0000000000e1"}); code != http.StatusNoContent {
			t.Fatalf("the sealed %s's token elsewhere: %d, want 204", name, code)
		}
		if j, _ := w.sim.Job(first); j.Status != gitlabsim.StatusRunning {
			t.Fatalf("the sealed runner's job: %s, want still running", j.Status)
		}
		if j, _ := w.sim.Job(second); j.Status != gitlabsim.StatusPending {
			t.Fatalf("the next job: %s, want pending", j.Status)
		}
		if err := w.sim.CancelJob(second); err != nil {
			t.Fatal(err)
		}
		if err := p.DeregisterRunner(ctx, cred.RunnerID, name); !errors.Is(err, workload.ErrRunnerBusy) {
			t.Fatalf("deregister %s while its job runs: %v, want busy", name, err)
		}
		if err := w.sim.CancelJob(first); err != nil {
			t.Fatal(err)
		}
		if err := p.DeregisterRunner(ctx, cred.RunnerID, name); err != nil {
			t.Fatal(err)
		}
		if err := p.SealRunner(ctx, id, name); !errors.Is(err, workload.ErrNotFound) {
			t.Fatalf("seal a deleted runner: %v, want ErrNotFound", err)
		}
	}
}
