package devenv

import (
	"testing"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// TestSnapshotDone: done means every job completed and nothing beyond the
// pool's minimum is left anywhere.
func TestSnapshotDone(t *testing.T) {
	completed := []githubsim.Job{{ID: 1, Status: "completed"}, {ID: 2, Status: "completed"}}
	for _, tc := range []struct {
		name string
		snap Snapshot
		min  int
		want bool
	}{
		{"all clean", Snapshot{Jobs: completed}, 0, true},
		{"a job queued", Snapshot{Jobs: append(completed, githubsim.Job{ID: 3, Status: "queued"})}, 0, false},
		{"a job running", Snapshot{Jobs: []githubsim.Job{{ID: 3, Status: "in_progress"}}}, 0, false},
		{"a VM left", Snapshot{Jobs: completed, VMs: []proxmoxsim.VMState{{VMID: 1000}}}, 0, false},
		{"an ISO left", Snapshot{Jobs: completed, ISOs: []string{"local:iso/x.iso"}}, 0, false},
		{"a claim left", Snapshot{Jobs: completed, Claims: []hfv1.MachineClaim{{}}}, 0, false},
		{"a runner left", Snapshot{Jobs: completed, Runners: []githubsim.Runner{{Name: "r"}}}, 0, false},
		{"a platform job running", Snapshot{Jobs: completed, PlatformJobs: []PlatformJob{{ID: "b", Status: "in_progress"}}}, 0, false},
		{"a platform runner left", Snapshot{Jobs: completed, PlatformJobs: []PlatformJob{{ID: "b", Status: "completed"}},
			PlatformRunners: []PlatformRunner{{Name: "agent"}}}, 0, false},
		{"platform jobs done", Snapshot{PlatformJobs: []PlatformJob{{ID: "b", Status: "completed", Conclusion: "passed"}}}, 0, true},
		{"warm VM kept at min 1", Snapshot{Jobs: completed, VMs: []proxmoxsim.VMState{{VMID: 1000}}, ISOs: []string{"i"},
			Claims: []hfv1.MachineClaim{{}}, Runners: []githubsim.Runner{{Name: "r"}}}, 1, true},
	} {
		if got := tc.snap.Done(tc.min); got != tc.want {
			t.Errorf("%s: Done(%d) = %v, want %v", tc.name, tc.min, got, tc.want)
		}
	}
}

// TestGitLabJobStatus: GitLab's job statuses map onto the table's three,
// an ended job keeping GitLab's word as its conclusion.
func TestGitLabJobStatus(t *testing.T) {
	for status, want := range map[string][2]string{
		"created": {"queued", ""}, "pending": {"queued", ""}, "running": {"in_progress", ""},
		"success": {"completed", "success"}, "failed": {"completed", "failed"},
		"canceled": {"completed", "canceled"}, "skipped": {"completed", "skipped"},
	} {
		if got, conclusion := gitlabJobStatus(status); got != want[0] || conclusion != want[1] {
			t.Errorf("gitlabJobStatus(%q) = %q, %q; want %q, %q", status, got, conclusion, want[0], want[1])
		}
	}
}
