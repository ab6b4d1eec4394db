//go:build windows

package agent

// The package's other tests are tagged !windows: their stand-in runners are
// /bin/sh scripts and their users Linux ones. This file holds the tests of
// the Windows code paths, compiled with GOOS=windows go test -c.

import (
	"os/exec"
	"testing"
	"time"
)

// TestJobObjectKillsTheTree: a script's children are in its job object,
// and killGroup ends them with it (compiled here with GOOS=windows; run
// only on a Windows machine, docs/windows.md).
func TestJobObjectKillsTheTree(t *testing.T) {
	cmd := exec.Command("cmd.exe", "/c", "ping -n 60 127.0.0.1 >NUL")
	cmd.SysProcAttr = scriptProcAttr(nil)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	if err := p.contain(); err != nil {
		_ = cmd.Process.Kill()
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	p.killGroup()
	select {
	case err := <-waited:
		if err == nil {
			t.Error("the script exited 0; want it killed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the script still runs 10 s after its job object was terminated")
	}
	if code := cmd.ProcessState.ExitCode(); code != 1 {
		t.Errorf("exit code %d, want 1 (TerminateJobObject's)", code)
	}
	p.killGroup() // a second call (stop, then the waiter) is harmless
}
