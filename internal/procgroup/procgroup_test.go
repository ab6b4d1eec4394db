//go:build linux

package procgroup

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// state is the state letter /proc gives pid ("" once it is gone).
func state(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b[strings.LastIndexByte(string(b), ')')+1:])
	return strings.Fields(s)[0]
}

// alive: running or sleeping, not a zombie and not gone.
func alive(pid int) bool { st := state(pid); return st != "" && st != "Z" }

// startGroup starts sh -c script as the leader of a group of its own,
// which writes the pid of a child it leaves behind to a file and then
// does what rest says.
func startGroup(t *testing.T, rest string) (*Leader, int) {
	t.Helper()
	pidFile := filepath.Join(t.TempDir(), "child")
	cmd := exec.Command("sh", "-c", "sleep 300 & echo $! > "+pidFile+"; "+rest)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	l := New(cmd)
	t.Cleanup(func() { _ = l.Signal(syscall.SIGKILL) })
	var child int
	for deadline := time.Now().Add(10 * time.Second); child == 0; time.Sleep(5 * time.Millisecond) {
		b, _ := os.ReadFile(pidFile)
		child, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		if child == 0 && time.Now().After(deadline) {
			t.Fatal("the script did not start its child")
		}
	}
	return l, child
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); alive(pid); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still runs (state %s)", pid, state(pid))
		}
	}
}

// TestAtExitRunsWhileTheLeaderHoldsTheID: atExit sees the leader as a
// zombie, which holds the group's id, so a kill there reaches the group's
// remaining member and nobody else; after Wait nothing is signalled.
func TestAtExitRunsWhileTheLeaderHoldsTheID(t *testing.T) {
	l, child := startGroup(t, "exit 3")
	var atExitState string
	err := l.Wait(func(pgid int) {
		atExitState = state(pgid)
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	})
	if atExitState != "Z" {
		t.Fatalf("leader's state in atExit = %q, want Z (exited, not reaped)", atExitState)
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("Wait = %v, want exit status 3", err)
	}
	waitGone(t, child)
	if state(l.Pgid()) != "" {
		t.Fatalf("leader %d not reaped after Wait", l.Pgid())
	}
	if err := l.Signal(syscall.SIGKILL); !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("Signal after Wait = %v, want os.ErrProcessDone", err)
	}
	if l.Do(func(int) { t.Error("Do ran after Wait") }) {
		t.Fatal("Do reported running after Wait")
	}
}

// TestSignalReachesTheWholeGroup: before the leader's exit a signal ends
// the leader and the child it started.
func TestSignalReachesTheWholeGroup(t *testing.T) {
	l, child := startGroup(t, "sleep 300")
	done := make(chan error, 1)
	go func() { done <- l.Wait(nil) }()
	if !l.Do(func(pgid int) {
		if pgid != l.Pgid() {
			t.Errorf("Do's pgid = %d, want %d", pgid, l.Pgid())
		}
	}) {
		t.Fatal("Do did not run while the leader runs")
	}
	if err := l.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
			t.Fatalf("Wait = %v, want killed by SIGTERM", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the leader did not end")
	}
	waitGone(t, child)
}

// TestWaitWithoutAtExitLeavesTheGroupAlone: nil atExit signals nothing;
// the member outlives the leader (and the test ends it by its pid).
func TestWaitWithoutAtExitLeavesTheGroupAlone(t *testing.T) {
	l, child := startGroup(t, "exit 0")
	t.Cleanup(func() { _ = syscall.Kill(child, syscall.SIGKILL) })
	if err := l.Wait(nil); err != nil {
		t.Fatal(err)
	}
	if !alive(child) {
		t.Fatal("the child was ended without an atExit")
	}
}
