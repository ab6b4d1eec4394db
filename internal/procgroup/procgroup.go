//go:build !windows

package procgroup

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
)

// Leader is a started child that leads its own process group.
type Leader struct {
	cmd *exec.Cmd

	mu     sync.Mutex
	exited bool // the leader exited: its id is about to be freed
}

// New returns the Leader of cmd, which has been started with its own
// process group (SysProcAttr.Setpgid or Setsid).
func New(cmd *exec.Cmd) *Leader { return &Leader{cmd: cmd} }

// Pgid is the group's id: the leader's pid.
func (l *Leader) Pgid() int { return l.cmd.Process.Pid }

// Signal sends sig to every process of the group. Once the leader has
// exited it sends nothing and returns os.ErrProcessDone: what was left of
// the group was Wait's atExit's to end.
func (l *Leader) Signal(sig syscall.Signal) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.exited {
		return os.ErrProcessDone
	}
	if err := syscall.Kill(-l.Pgid(), sig); err != nil {
		return fmt.Errorf("signal process group %d: %w", l.Pgid(), err)
	}
	return nil
}

// Do runs f with the group's id while the leader has not exited, so that
// the id cannot be reused while f uses it (for a caller that ends more
// than the group, such as a whole session). It reports whether f ran.
func (l *Leader) Do(f func(pgid int)) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.exited {
		return false
	}
	f(l.Pgid())
	return true
}

// Wait waits for the leader to exit, runs atExit (if not nil) with the
// group's id while the leader's zombie still holds it, and then reaps the
// leader with cmd.Wait, whose error it returns. From atExit on, Signal and
// Do do nothing.
//
// Where the kernel cannot wait without reaping (waitExited returns
// errors.ErrUnsupported: every Unix but Linux, none of which HyperFleet
// ships for), Wait reaps first and runs atExit after, with the race
// described above.
func (l *Leader) Wait(atExit func(pgid int)) error {
	end := func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.exited = true
		if atExit != nil {
			atExit(l.Pgid())
		}
	}
	switch err := waitExited(l.Pgid()); {
	case errors.Is(err, errors.ErrUnsupported):
		werr := l.cmd.Wait()
		end()
		return werr
	case err != nil:
		// Not our child to wait for any more (someone reaped it): its id
		// may already be another's, so nothing is signalled.
		l.mu.Lock()
		l.exited = true
		l.mu.Unlock()
		return errors.Join(fmt.Errorf("wait for process %d: %w", l.Pgid(), err), l.cmd.Wait())
	}
	end()
	return l.cmd.Wait()
}

// KillGroup sends SIGKILL to the group pgid. As Wait's atExit it ends
// whatever the leader left behind in its group.
func KillGroup(pgid int) { _ = syscall.Kill(-pgid, syscall.SIGKILL) }
