//go:build guest

package guest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	buildkitesim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite/buildkitesimtest"
)

// startPlatformWorld starts a world of one real guest at most, which a
// test of another CI platform than GitHub adds its pool to; its logs are
// kept when the test fails.
func startPlatformWorld(t *testing.T, platform func(*devenv.Options)) *devenv.World {
	t.Helper()
	dir := t.TempDir()
	// The platforms' loops, not the boot: the VM resumes the image's
	// saved state (docs/guest-snapshots.md).
	img := resumable(t, "--agent", agentBinary)
	opts := devenv.Options{Dir: dir, AgentBinary: agentBinary, MaxReplicas: 1, Progress: testWriter{t}, GuestImage: &img}
	platform(&opts)
	w, err := devenv.Start(context.Background(), opts)
	if err != nil {
		keepLogs(t, dir)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			keepLogs(t, dir)
		}
		if err := w.Stop(); err != nil {
			t.Errorf("stop world: %v", err)
		}
	})
	return w
}

// poolLeftovers says what is left of the world's RunnerPool named pool:
// its claims, and any VM or ISO; nil when nothing is.
func poolLeftovers(ctx context.Context, w *devenv.World, pool string) error {
	var claims hfv1.MachineClaimList
	if err := w.API.Client.List(ctx, &claims, client.InNamespace(devenv.Namespace), client.MatchingLabels{hfv1.RunnerPoolLabel: pool}); err != nil {
		return err
	}
	snap, err := w.Snapshot(ctx)
	if err != nil {
		return err
	}
	if len(claims.Items) != 0 || len(snap.VMs) != 0 || len(snap.ISOs) != 0 {
		return fmt.Errorf("%d claims, VMs %v, ISOs %v left", len(claims.Items), snap.VMs, snap.ISOs)
	}
	return nil
}

// TestBuildkiteJobOnRealGuest: a Buildkite RunnerPool's job on a real
// Debian guest. The VM resumes the image's saved state and its seed
// starts the agent (docs/guest-snapshots.md), the
// agent downloads the real buildkite-agent (hack/buildkite-agent) from
// the simulator's release tarball over QEMU's network, checks its SHA-256,
// registers it with a token made for this VM, and it runs the one job; the
// VM powers off and is destroyed, and its token no longer exists. The job
// prints the guest's /etc/debian_version and kernel, which a process guest
// (the e2e suite's) does not have as a VM does.
func TestBuildkiteJobOnRealGuest(t *testing.T) {
	w := startPlatformWorld(t, func(o *devenv.Options) {
		o.Buildkite, o.BuildkiteAgentBinary = true, buildkitesimtest.AgentBinary(t)
	})
	ctx := context.Background()
	const pool = "bk-guest"
	if err := w.AddBuildkitePool(ctx, devenv.BuildkitePoolSpec{Name: pool, Queue: "guest", MaxReplicas: 1}); err != nil {
		t.Fatal(err)
	}
	sim := w.Buildkite.Sim
	build, err := sim.CreateBuild(devenv.BuildkitePipeline, "guest", []buildkitesim.Step{{Key: "on-a-vm", Agents: []string{"queue=guest"},
		Command: `echo "debian $(cat /etc/debian_version) kernel $(uname -r) on $(hostname)"; test -n "$BUILDKITE_JOB_ID"`}})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var job buildkitesim.JobInfo
	eventually(t, 20*time.Minute, "the job passed on a real guest", func() error {
		j, ok := sim.Job(build.JobIDs[0])
		if !ok {
			return fmt.Errorf("job %s unknown to the simulator", build.JobIDs[0])
		}
		if j.State != "passed" {
			return fmt.Errorf("job is %s", j.State)
		}
		job = j
		return nil
	})
	t.Logf("the Buildkite job passed on a real guest %s after it was scheduled", time.Since(start).Round(time.Second))
	if !strings.Contains(job.Log, "debian 12") || !strings.HasPrefix(job.Agent, pool+"-") {
		t.Errorf("job ran on agent %q with log %q; want the pool's VM, a Debian 12 guest", job.Agent, job.Log)
	}
	eventually(t, 5*time.Minute, "the pool's claim and VM gone", func() error { return poolLeftovers(ctx, w, pool) })
	tokens, err := sim.Tokens(w.Buildkite.ClusterID)
	if err != nil {
		t.Fatal(err)
	}
	perVM := 0
	for _, tok := range tokens {
		if strings.HasPrefix(tok.Description, "hyperfleet agent ") {
			perVM++
			if !tok.Deleted {
				t.Errorf("the VM's agent token %s (%s) outlived its claim", tok.ID, tok.Description)
			}
		}
	}
	if perVM != 1 {
		t.Errorf("%d per-VM agent tokens for one job on one VM", perVM)
	}
}
