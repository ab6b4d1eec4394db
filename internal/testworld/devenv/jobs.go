package devenv

import (
	"context"
	"fmt"
	"slices"
	"strconv"
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

// QueueJobs queues n jobs for the world's pool on its platform
// (Options.Platform), each running for d once a runner takes it: GitHub
// workflow jobs labelled JobLabel (EnqueueJobs), Buildkite builds of one
// step on queue JobLabel, or GitLab pipelines of one job tagged JobLabel.
// The Snapshot's PlatformJobs show them.
func (w *World) QueueJobs(n int, d time.Duration) error {
	switch w.opts.Platform {
	case hfv1.WorkloadBuildkite:
		return w.queueBuildkiteJobs(n, d)
	case hfv1.WorkloadGitLabCI:
		return w.queueGitLabJobs(n, d)
	}
	_, err := w.EnqueueJobs(n, d)
	return err
}

// PlatformJob is a job of the world's CI platform as the live table shows
// it, whichever the platform.
type PlatformJob struct {
	// ID is the platform's id of the job.
	ID string
	// Status is queued, in_progress or completed (GitHub's statuses, onto
	// which other platforms' states are mapped); Conclusion how a
	// completed job ended, in the platform's words.
	Status, Conclusion string
	// RunnerName is the runner (agent) that took it.
	RunnerName string
}

// PlatformRunner is a runner (a Buildkite agent, a GitLab runner) registered on the
// world's CI platform and not gone.
type PlatformRunner struct {
	Name, Status string
	Busy         bool
}

// Snapshot is the world at one moment, for the live table and the tests.
type Snapshot struct {
	// Platform names the world's CI platform (Backend.Name: GitHub,
	// Buildkite, GitLab).
	Platform string
	// PlatformJobs are the jobs queued through QueueJobs (and
	// EnqueueJobs), oldest first, on any platform.
	PlatformJobs []PlatformJob
	// PlatformRunners are the platform's runners that are not gone.
	PlatformRunners []PlatformRunner
	// Jobs are the GitHub jobs queued through EnqueueJobs, oldest first.
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
			if w.opts.Platform == hfv1.WorkloadGitHubActions {
				s.PlatformJobs = append(s.PlatformJobs, PlatformJob{ID: strconv.FormatInt(j.ID, 10), Status: j.Status, Conclusion: j.Conclusion, RunnerName: j.RunnerName})
			}
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
	switch w.opts.Platform {
	case hfv1.WorkloadBuildkite:
		s.Platform = "Buildkite"
		w.buildkiteSnapshot(&s)
	case hfv1.WorkloadGitLabCI:
		s.Platform = "GitLab"
		w.gitlabSnapshot(&s)
	default:
		s.Platform = "GitHub"
		for _, r := range s.Runners {
			s.PlatformRunners = append(s.PlatformRunners, PlatformRunner{Name: r.Name, Status: r.Status, Busy: r.Busy})
		}
	}
	return s, nil
}

// Done reports whether every queued job completed and the pool is back to
// its minimum with nothing in flight: no VM, seed ISO, claim or runner
// (GitHub's, or the platform's) beyond minReplicas.
func (s Snapshot) Done(minReplicas int) bool {
	for _, j := range s.Jobs {
		if j.Status != "completed" {
			return false
		}
	}
	for _, j := range s.PlatformJobs {
		if j.Status != "completed" {
			return false
		}
	}
	return len(s.VMs) <= minReplicas && len(s.ISOs) <= minReplicas && len(s.Claims) <= minReplicas &&
		max(len(s.Runners), len(s.PlatformRunners)) <= minReplicas
}
