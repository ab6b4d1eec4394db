package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// devSnapshot is a world with one job running on a claim's runner, one
// queued job and one claim being deleted.
func devSnapshot() devenv.Snapshot {
	now := metav1.Now()
	running := hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Name: "runners-abcde"}}
	running.Status.Phase = hfv1.MachineClaimReady
	running.Status.VMRef = &hfv1.VMReference{HypervisorCluster: "local-pve", VMID: 1001}
	running.Status.Bootstrap = &hfv1.BootstrapStatus{RunnerName: "runners-abcde-x7k2p"}
	leaving := hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Name: "runners-fghij", DeletionTimestamp: &now}}
	leaving.Status.Phase = hfv1.MachineClaimDraining
	leaving.Status.Bootstrap = &hfv1.BootstrapStatus{RunnerName: "runners-fghij-q9w8e"}
	pending := hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Name: "runners-klmno"}}

	s := devenv.Snapshot{
		Platform: "GitHub",
		PlatformJobs: []devenv.PlatformJob{
			{ID: "1", Status: "completed", Conclusion: "success", RunnerName: "runners-zzzzz-aaaaa"},
			{ID: "2", Status: "in_progress", RunnerName: "runners-abcde-x7k2p"},
			{ID: "3", Status: "queued"},
		},
		Claims:          []hfv1.MachineClaim{running, leaving, pending},
		VMs:             []proxmoxsim.VMState{{VMID: 1001, Name: "runners-abcde", Status: "running"}},
		PlatformRunners: []devenv.PlatformRunner{{Name: "runners-abcde-x7k2p", Status: "online", Busy: true}},
	}
	s.Pool.Status.DesiredReplicas = 3
	s.Pool.Status.BusyReplicas = 1
	return s
}

func TestLiveTableShowsJobsClaimsAndRunners(t *testing.T) {
	var out bytes.Buffer
	table := &liveTable{out: &out, now: func() time.Time { return time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC) }}
	table.show(devSnapshot(), 0, 5)
	got := out.String()

	for _, want := range []string{
		"---- 15:04:05\n",
		"RunnerPool ci/runners: desired 3, ready 0, idle 0, busy 1, starting 0, terminating 0 (min 0, max 5)",
		"Jobs: 1 queued, 1 in progress, 1 completed; VMs: 1; runners on GitHub: 1",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	// Rows, with the columns' spacing folded so the test does not pin the
	// tabwriter's padding.
	rows := map[string]string{}
	for line := range strings.SplitSeq(got, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			rows[f[0]] = strings.Join(f, " ")
		}
	}
	for key, want := range map[string]string{
		"1":             "1 completed (success) runners-zzzzz-aaaaa",
		"2":             "2 in_progress runners-abcde-x7k2p",
		"3":             "3 queued -",
		"runners-abcde": "runners-abcde Ready 1001 running runners-abcde-x7k2p (online, busy)",
		"runners-fghij": "runners-fghij Draining (deleting) - - runners-fghij-q9w8e (not registered)",
		"runners-klmno": "runners-klmno - - - -",
	} {
		if rows[key] != want {
			t.Errorf("row %s = %q, want %q", key, rows[key], want)
		}
	}
	if strings.Contains(got, "\033[") {
		t.Errorf("output that is not a terminal got escape sequences:\n%q", got)
	}
}

func TestLiveTablePrintsOnlyChanges(t *testing.T) {
	var out bytes.Buffer
	table := &liveTable{out: &out}
	s := devSnapshot()
	table.show(s, 0, 5)
	table.show(s, 0, 5)
	if n := strings.Count(out.String(), "---- "); n != 1 {
		t.Fatalf("an unchanged world was printed %d times, want once:\n%s", n, out.String())
	}
	s.PlatformJobs[2].Status = "in_progress"
	table.show(s, 0, 5)
	if n := strings.Count(out.String(), "---- "); n != 2 {
		t.Fatalf("a changed world was printed %d times in total, want 2", n)
	}
}

func TestLiveTableRedrawsTerminal(t *testing.T) {
	var out bytes.Buffer
	table := &liveTable{out: &out, tty: true}
	table.show(devSnapshot(), 0, 5)
	if got := out.String(); !strings.HasPrefix(got, "\033[H\033[2J") || !strings.Contains(got, "q: quit") {
		t.Fatalf("terminal output should clear the screen and show the keys, got:\n%q", got)
	}
}

// TestLiveTableShowsBuildkite: a Buildkite world's jobs (UUIDs) and agents
// fill the same table, the summary naming the platform.
func TestLiveTableShowsBuildkite(t *testing.T) {
	var out bytes.Buffer
	table := &liveTable{out: &out}
	s := devSnapshot()
	s.Platform = "Buildkite"
	s.PlatformJobs = []devenv.PlatformJob{
		{ID: "0190a1b2-0000-4000-8000-000000000001", Status: "completed", Conclusion: "passed", RunnerName: "runners-zzzzz-aaaaa"},
		{ID: "0190a1b2-0000-4000-8000-000000000002", Status: "in_progress", RunnerName: "runners-abcde-x7k2p"},
	}
	s.PlatformRunners = []devenv.PlatformRunner{{Name: "runners-abcde-x7k2p", Status: "connected", Busy: true}}
	table.show(s, 0, 5)
	for _, want := range []string{
		"Jobs: 0 queued, 1 in progress, 1 completed; VMs: 1; runners on Buildkite: 1",
		"0190a1b2-0000-4000-8000-000000000001  completed (passed)  runners-zzzzz-aaaaa",
		"runners-abcde-x7k2p (connected, busy)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// TestLiveTableShowsGitLab: a GitLab world's jobs (numeric ids, GitLab's
// end statuses as conclusions) and runners (named by their description)
// fill the same table, the summary naming the platform.
func TestLiveTableShowsGitLab(t *testing.T) {
	var out bytes.Buffer
	table := &liveTable{out: &out}
	s := devSnapshot()
	s.Platform = "GitLab"
	s.PlatformJobs = []devenv.PlatformJob{
		{ID: "1000001", Status: "completed", Conclusion: "success", RunnerName: "runners-zzzzz-aaaaa"},
		{ID: "1000002", Status: "in_progress", RunnerName: "runners-abcde-x7k2p"},
		{ID: "1000003", Status: "queued"},
	}
	s.PlatformRunners = []devenv.PlatformRunner{{Name: "runners-abcde-x7k2p", Status: "online", Busy: true}}
	table.show(s, 0, 5)
	for _, want := range []string{
		"Jobs: 1 queued, 1 in progress, 1 completed; VMs: 1; runners on GitLab: 1",
		"1000001  completed (success)  runners-zzzzz-aaaaa",
		"1000003  queued               -",
		"runners-abcde-x7k2p (online, busy)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}
