//go:build !windows

package agent

import (
	"fmt"
	"os"
	"syscall"

	"github.com/hyperfleet/hyperfleet/internal/procgroup"
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
// start and led by the script. procgroup signals it only while the script
// has not been reaped: a kill after the reap could reach whatever group
// was given the freed id since.
type processGroup struct{ leader *procgroup.Leader }

// contain records the group Setpgid made.
func (p *process) contain() error {
	p.group.leader = procgroup.New(p.cmd)
	return nil
}

func (p *process) interruptGroup() { _ = p.group.leader.Signal(syscall.SIGINT) }

func (p *process) killGroup() { _ = p.group.leader.Signal(syscall.SIGKILL) }

// waitAndEnd waits for the script and ends what it left behind in its
// group, while its unreaped exit still holds the group's id.
func (p *process) waitAndEnd() error {
	return p.group.leader.Wait(procgroup.KillGroup)
}

// killedBy names the signal that ended a process, if one did.
func killedBy(st *os.ProcessState) (string, bool) {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Sprintf("%d (%s)", int(ws.Signal()), ws.Signal()), true
	}
	return "", false
}
