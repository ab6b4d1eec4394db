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

// processGroup is the script's process group, made by Setpgid at the
// start: its id is the script's pid.
type processGroup struct{ pgid int }

// contain records the group Setpgid made.
func (p *process) contain() error {
	p.group.pgid = p.cmd.Process.Pid
	return nil
}

func (p *process) interruptGroup() { p.signalGroup(syscall.SIGINT) }

func (p *process) killGroup() { p.signalGroup(syscall.SIGKILL) }

// signalGroup signals the script's group; never pid 0 or -1, which would
// be the agent's own group or every process it may signal.
func (p *process) signalGroup(sig syscall.Signal) {
	if p.group.pgid > 1 {
		_ = syscall.Kill(-p.group.pgid, sig)
	}
}

// killedBy names the signal that ended a process, if one did.
func killedBy(st *os.ProcessState) (string, bool) {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Sprintf("%d (%s)", int(ws.Signal()), ws.Signal()), true
	}
	return "", false
}
