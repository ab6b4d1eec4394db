//go:build guest

package guest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agent"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	gitlabsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/gitlab"
)

// TestGitLabJobOnRealGuest: a GitLab RunnerPool's job on a real Debian
// guest. The VM resumes the image's saved state and its seed starts the
// agent (docs/guest-snapshots.md), the agent
// downloads gitlab-runner (the GitLab simulator's stand-in for
// `gitlab-runner run-single`, POSIX sh and curl: the real runner cannot be
// built here, docs/gitlab.md) over QEMU's network, checks its SHA-256 and
// runs it with the runner authentication token the operator created for
// this VM; it takes the one job, whose script prints the guest's
// /etc/debian_version and kernel, and then looks at what it runs under as
// a hostile job would (jobUserCheck): gitlab-runner runs as root and the
// job as the runner user, so the job must see no process of another user,
// neither gitlab-runner's nor the agent's, read the runner authentication
// token in no process's environment (CI_SERVER_TOKEN), attach to nothing
// above it and not become root (docs/templates.md, "The job user"). The
// VM powers off and is destroyed, and its runner is deleted at GitLab.
func TestGitLabJobOnRealGuest(t *testing.T) {
	w := startPlatformWorld(t, func(o *devenv.Options) { o.GitLab = true })
	ctx := context.Background()
	const pool = "gl-guest"
	if err := w.AddGitLabPool(ctx, devenv.GitLabPoolSpec{Name: pool, Tags: []string{"guest"}, MaxReplicas: 1}); err != nil {
		t.Fatal(err)
	}
	sim := w.GitLab.Sim
	p, err := sim.CreatePipeline(gitlabsim.PipelineRequest{Project: devenv.GitLabProject, Jobs: []gitlabsim.JobConfig{{
		Name: "on-a-vm", Tags: []string{"guest"},
		Script: []string{`echo "debian $(cat /etc/debian_version) kernel $(uname -r) on $(hostname)"`, `test -n "$CI_JOB_TOKEN"`,
			jobUserCheck(agent.EnvGitLabToken)}}}})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var job gitlabsim.Job
	eventually(t, 20*time.Minute, "the job succeeded on a real guest", func() error {
		j, ok := sim.Job(p.Jobs[0])
		if !ok {
			return fmt.Errorf("job %d unknown to the simulator", p.Jobs[0])
		}
		if j.Status != gitlabsim.StatusSuccess {
			return fmt.Errorf("job is %s", j.Status)
		}
		job = j
		return nil
	})
	t.Logf("the GitLab job succeeded on a real guest %s after its pipeline was created", time.Since(start).Round(time.Second))
	if !strings.Contains(job.Trace, "debian 12") {
		t.Errorf("job trace %q; want it to have run on a Debian 12 guest", job.Trace)
	}
	if !jobUserChecked(job.Trace) {
		t.Errorf("the job did not check what it runs under; its trace:\n%s", job.Trace)
	}
	eventually(t, 5*time.Minute, "the pool's claim, VM and runner gone", func() error {
		if err := poolLeftovers(ctx, w, pool); err != nil {
			return err
		}
		if live := sim.Runners(); len(live) != 0 {
			return fmt.Errorf("%d runners left at GitLab", len(live))
		}
		return nil
	})
	issued := sim.IssuedRunners()
	if len(issued) != 1 {
		t.Errorf("%d runners issued for one job on one VM", len(issued))
	}
	for _, r := range issued {
		if r.Live || !strings.HasPrefix(r.Description, pool+"-") {
			t.Errorf("runner %d (%s): live %v; want the pool's VM's runner, deleted", r.ID, r.Description, r.Live)
		}
	}
}
