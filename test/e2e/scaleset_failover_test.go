//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	"github.com/hyperfleet/hyperfleet/test/managerproc"
)

// TestScaleSetListenerFailsOver: a runner scale set's listener survives
// its replica. Two manager replicas run with leader election, as the
// chart's Deployment runs them; the leader holds the scale set's message
// session. It is killed (SIGKILL: its session is never deleted), and jobs
// are queued while no one listens. GitHub keeps a dead listener's session
// until it has not been polled for a while (the simulator as GitHub,
// ScaleSetSessionIdle), refusing a new one meanwhile; the standby, leader
// once the lease runs out, retries until the dead session expires, takes
// the scale set over with a session of its own and acquires the queued
// jobs, each of which runs on its own fresh VM. No webhook and no resync:
// the listener is the only way the operator learns of a job.
func TestScaleSetListenerFailsOver(t *testing.T) {
	dir := t.TempDir()
	managerBin := managerproc.GoBuild(t, dir, "./cmd/hyperfleet")
	ctx := context.Background()
	w, err := devenv.Start(ctx, devenv.Options{
		Dir: filepath.Join(dir, "world"), AgentBinary: agentBinary, ExternalOperator: true, MaxReplicas: 3,
		ResyncInterval: time.Hour, ScaleSetSessionIdle: 20 * time.Second, Progress: testWriter{t},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	hooks, agents := managerproc.NewService(t), managerproc.NewService(t)
	dep := managerproc.Prepare(t, w, managerproc.Options{
		Binary: managerBin, AgentBinary: agentBinary, CAFile: w.OperatorInputs().GitHubCAFile,
		LeaderElect: true, AgentServerURL: "https://" + agents.Addr,
		Args: []string{
			"--leader-elect-lease-duration=6s", "--leader-elect-renew-deadline=4s", "--leader-elect-retry-period=1s",
			// Every guest comes from 127.0.0.1 through the Service.
			"--agent-server-max-conns-per-address=-1",
		},
	})
	replicas := []*managerproc.Process{dep.Start(t), dep.Start(t)}
	route := func(live ...*managerproc.Process) {
		var h, a []string
		for _, p := range live {
			h, a = append(h, p.WebhookAddr), append(a, p.AgentServerAddr)
		}
		hooks.SetBackends(h...)
		agents.SetBackends(a...)
	}
	route(replicas...)
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range replicas {
				if b, err := os.ReadFile(p.LogFile); err == nil {
					t.Logf("%s (last 12 KiB):\n%s", filepath.Base(p.LogFile), managerproc.Tail(b, 12<<10))
				}
			}
		}
	})
	if err := w.ConnectOperator(ctx, "https://"+hooks.Addr+"/webhooks/github"); err != nil {
		t.Fatal(err)
	}
	if err := w.SetGitHubWebhook(false); err != nil {
		t.Fatal(err)
	}
	const pool, label, scaleSet = "scaleset", "scaleset", "hf-failover"
	if err := w.AddPool(ctx, devenv.PoolSpec{Name: pool, Cluster: devenv.ClusterName, Label: label, MaxReplicas: 3, ScaleSet: scaleSet}); err != nil {
		t.Fatal(err)
	}
	waitPoolVerified(t, w, pool)
	var session string
	eventually(t, 2*time.Minute, "the leader listening to the scale set", func() error {
		var p hfv1.RunnerPool
		if err := w.API.Client.Get(ctx, client.ObjectKey{Namespace: devenv.Namespace, Name: pool}, &p); err != nil {
			return err
		}
		sets := w.GitHub.ScaleSets()
		if !hfv1.IsConditionTrue(p.Status.Conditions, hfv1.RunnerPoolListeningCondition) || len(sets) != 1 || sets[0].Session == "" {
			return fmt.Errorf("Listening %+v, scale sets %+v", hfv1.FindCondition(p.Status.Conditions, hfv1.RunnerPoolListeningCondition), sets)
		}
		session = sets[0].Session
		return nil
	})
	var leader, standby *managerproc.Process
	eventually(t, time.Minute, "one replica leading", func() error {
		for i, p := range replicas {
			if ok, err := p.IsLeader(); err == nil && ok {
				leader, standby = p, replicas[1-i]
				return nil
			}
		}
		return fmt.Errorf("no replica holds the lease")
	})

	leader.Kill()
	route(standby)
	killed := time.Now()
	ids, err := w.EnqueueJobsFor(label, 2, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitJobsEachOnItsVM(t, w, ids)
	t.Logf("the jobs queued while the leader was dead ran %s after the kill", time.Since(killed).Round(time.Second))
	if ok, err := standby.IsLeader(); err != nil || !ok {
		t.Errorf("the standby does not lead (%v, %v)", ok, err)
	}
	if sets := w.GitHub.ScaleSets(); len(sets) != 1 || sets[0].Session == "" || sets[0].Session == session {
		t.Errorf("scale sets %+v: want one, listened to with a session other than the dead leader's %s", sets, session)
	}
	eventually(t, 3*time.Minute, "the scale-set pool empty again", func() error { return poolLeftovers(ctx, w, pool) })
}
