package devenv

import (
	"context"
	"fmt"
	"slices"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// EnqueueJobs queues n jobs for the pool's label on the repository; each
// runs for d once a runner takes it. It returns their ids.
func (w *World) EnqueueJobs(n int, d time.Duration) ([]int64, error) {
	return w.EnqueueJobsFor(JobLabel, n, d)
}

// Snapshot is the world at one moment, for the live table and the tests.
type Snapshot struct {
	// Jobs are the jobs queued through EnqueueJobs, oldest first.
	Jobs []githubsim.Job
	// Claims are the pool namespace's MachineClaims, by name.
	Claims []hfv1.MachineClaim
	// Pool is the RunnerPool (zero if it could not be read).
	Pool hfv1.RunnerPool
	// VMs are the operator's VMs on the Proxmox simulator (templates and
	// foreign VMs left out).
	VMs []proxmoxsim.VMState
	// ISOs are the ISO volumes on the simulator (the operator's NoCloud
	// seeds).
	ISOs []string
	// Runners are the runners registered on GitHub (removed ones left out).
	Runners []githubsim.Runner
}

// Snapshot reads the world's state.
func (w *World) Snapshot(ctx context.Context) (Snapshot, error) {
	var s Snapshot
	w.mu.Lock()
	ids := slices.Clone(w.jobs)
	w.mu.Unlock()
	for _, id := range ids {
		if j, ok := w.GitHub.Job(id); ok {
			s.Jobs = append(s.Jobs, j)
		}
	}
	var claims hfv1.MachineClaimList
	if err := w.API.Client.List(ctx, &claims, client.InNamespace(Namespace)); err != nil {
		return s, fmt.Errorf("devenv: list claims: %w", err)
	}
	s.Claims = claims.Items
	slices.SortFunc(s.Claims, func(a, b hfv1.MachineClaim) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
	_ = w.API.Client.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: PoolName}, &s.Pool)
	pve := w.Proxmox.State()
	for _, vm := range pve.VMs {
		if !vm.Template {
			s.VMs = append(s.VMs, vm)
		}
	}
	for _, st := range pve.Storages {
		for _, v := range st.Volumes {
			if v.Content == "iso" {
				s.ISOs = append(s.ISOs, v.VolID)
			}
		}
	}
	for _, r := range w.GitHub.Runners() {
		if !r.Removed {
			s.Runners = append(s.Runners, r)
		}
	}
	return s, nil
}

// Done reports whether every queued job completed and the pool is back to
// its minimum with nothing in flight: no VM, seed ISO, claim or GitHub
// runner beyond minReplicas.
func (s Snapshot) Done(minReplicas int) bool {
	for _, j := range s.Jobs {
		if j.Status != "completed" {
			return false
		}
	}
	return len(s.VMs) <= minReplicas && len(s.ISOs) <= minReplicas && len(s.Claims) <= minReplicas && len(s.Runners) <= minReplicas
}
