//go:build !windows

package agent

import (
	"fmt"
	"os"
	"syscall"
)

// credential is the user a child process is switched to.
type credential = syscall.Credential

// switchUserBuilt says that --run-as (and generic.user) can run the
// runner as another user here: setuid through SysProcAttr.Credential.
const switchUserBuilt = true

func newCredential(uid, gid uint32, groups []uint32) *credential {
	return &credential{Uid: uid, Gid: gid, Groups: groups}
}

// scriptProcAttr puts a runner script in a process group of its own, so
// that stopping it reaches everything it started, as cred (nil: the
// agent's own user).
func scriptProcAttr(cred *credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Credential: cred}
}

// fetchProcAttr runs spire-agent's fetch command as cred.
func fetchProcAttr(cred *credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred}
}

// processGroup needs nothing on Unix: the group is the script's pid.
type processGroup struct{}

// contain is done by Setpgid at the start.
func (p *process) contain() error { return nil }

func (p *process) interruptGroup() { _ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGINT) }

func (p *process) killGroup() { _ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) }

// killedBy names the signal that ended a process, if one did.
func killedBy(st *os.ProcessState) (string, bool) {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Sprintf("%d (%s)", int(ws.Signal()), ws.Signal()), true
	}
	return "", false
}
