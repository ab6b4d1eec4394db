package githubsim

import (
	"strings"
	"testing"
	"time"
)

// TestRunnerScriptRunsSteps: a job's steps run on the runner that takes
// it, as its user in its work folder, without the JIT configuration in
// their environment; the first that fails fails the job, and what they
// printed is the job's log. The job lasts as long as its steps, not its
// Duration.
func TestRunnerScriptRunsSteps(t *testing.T) {
	f := newTLSFixture(t)
	work := t.TempDir()
	for i, tc := range []struct {
		steps      []string
		conclusion string
		log        []string
		notLog     []string
	}{
		{[]string{`echo "in $(pwd)"`, `echo "jit=${ACTIONS_RUNNER_INPUT_JITCONFIG-unset}"`}, "success",
			[]string{"in " + work, "jit=unset"}, []string{"failed"}},
		{[]string{`echo first`, `echo boom >&2; exit 3`, `echo never`}, "failure",
			[]string{"first", "boom", "step 2 failed"}, []string{"never"}},
	} {
		dir := f.installRunner()
		name := "steps-vm-" + string(rune('1'+i))
		out := f.mustCall("POST", "/orgs/octo-org/actions/runners/generate-jitconfig", testPAT,
			map[string]any{"name": name, "runner_group_id": 2, "labels": []string{"self-hosted", "hyperfleet"}, "work_folder": work}, 201)
		sc := startScript(t, dir, "./run.sh", "--jitconfig", out["encoded_jit_config"].(string))
		waitFor(t, 20*time.Second, name+" online", func() bool {
			r, ok := f.sim.RunnerByName(name)
			return ok && r.Status == "online"
		})
		// An hour: only the steps' report can end it in time.
		job, err := f.sim.EnqueueJob(JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted", "hyperfleet"}, Duration: time.Hour, Steps: tc.steps})
		if err != nil {
			t.Fatal(err)
		}
		if code := sc.wait(t, 30*time.Second); code != 0 {
			t.Fatalf("run.sh exited %d:\n%s", code, sc.out.String())
		}
		checkShellErrors(t, sc.out.String())
		got, _ := f.sim.Job(job.ID)
		if got.Status != "completed" || got.Conclusion != tc.conclusion || got.RunnerName != name || len(got.Steps) != len(tc.steps) {
			t.Errorf("job = %+v, want completed %s on %s", got, tc.conclusion, name)
		}
		for _, want := range tc.log {
			if !strings.Contains(got.Log, want) || !strings.Contains(sc.out.String(), want) {
				t.Errorf("job log %q (runner output %q) lacks %q", got.Log, sc.out.String(), want)
			}
		}
		for _, bad := range tc.notLog {
			if strings.Contains(got.Log, bad) {
				t.Errorf("job log %q has %q", got.Log, bad)
			}
		}
	}
	// The default steps are those of every job enqueued without its own.
	f.sim.SetDefaultJobSteps("true")
	if j, err := f.sim.EnqueueJob(JobRequest{Repository: "octo-org/app", Labels: []string{"hyperfleet"}}); err != nil || len(j.Steps) != 1 {
		t.Errorf("job with the default steps = %+v, %v", j, err)
	}
}
