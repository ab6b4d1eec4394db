//go:build windows

package agent

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/windows"
)

// credential is unused on Windows: the runner runs as the agent's own
// account (switchUserBuilt), which is the service's. Starting a process as
// another Windows user needs that user's logon token (its password, or
// S4U with a domain), which the VM has no way to receive safely.
type credential struct{ Uid, Gid uint32 }

// switchUserBuilt: see credential.
const switchUserBuilt = false

func newCredential(uid, gid uint32, _ []uint32) *credential {
	return &credential{Uid: uid, Gid: gid}
}

// scriptProcAttr starts a runner script in a process group of its own
// (CREATE_NEW_PROCESS_GROUP), the target of its CTRL_BREAK, with no
// console window. cred is always nil here (switchUserBuilt).
func scriptProcAttr(*credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{CreationFlags: windows.CREATE_NEW_PROCESS_GROUP | windows.CREATE_NO_WINDOW}
}

// fetchProcAttr: broker mode is refused on Windows (the API refuses
// attestation with guest.os windows), so nothing is fetched as another user.
func fetchProcAttr(*credential) *syscall.SysProcAttr { return nil }

// processGroup is a job object that every process the script starts
// belongs to (a child inherits its parent's job): Windows has no process
// groups a signal reaches, and the runner's job steps start their own
// processes. Killing the job ends them all.
type processGroup struct {
	mu  sync.Mutex // killGroup runs from stop and from the waiter
	job windows.Handle
}

// contain puts the started script into a new job object that kills its
// processes when its last handle closes, so that nothing of the job
// outlives the agent either. A child the script started before this call
// (within microseconds of the start) is not in it.
func (p *process) contain() error {
	job, err := windows.CreateJobObject(nil, nil)
	if err != nil {
		return fmt.Errorf("creating a job object: %w", err)
	}
	info := windows.JOBOBJECT_EXTENDED_LIMIT_INFORMATION{}
	info.BasicLimitInformation.LimitFlags = windows.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
	if _, err := windows.SetInformationJobObject(job, windows.JobObjectExtendedLimitInformation,
		uintptr(unsafe.Pointer(&info)), uint32(unsafe.Sizeof(info))); err != nil {
		_ = windows.CloseHandle(job)
		return fmt.Errorf("setting the job object's limits: %w", err)
	}
	proc, err := windows.OpenProcess(windows.PROCESS_SET_QUOTA|windows.PROCESS_TERMINATE, false, uint32(p.cmd.Process.Pid))
	if err != nil {
		_ = windows.CloseHandle(job)
		return fmt.Errorf("opening the process: %w", err)
	}
	defer func() { _ = windows.CloseHandle(proc) }()
	if err := windows.AssignProcessToJobObject(job, proc); err != nil {
		_ = windows.CloseHandle(job)
		return fmt.Errorf("assigning the process to the job object: %w", err)
	}
	p.group.job = job
	return nil
}

// interruptGroup sends CTRL_BREAK to the script's process group, which the
// runner handles as a request to stop. It reaches the group only when the
// agent shares a console with it (run from a console); under the service
// manager there is none, and stop's grace ends in killGroup.
func (p *process) interruptGroup() {
	_ = windows.GenerateConsoleCtrlEvent(windows.CTRL_BREAK_EVENT, uint32(p.cmd.Process.Pid))
}

// killGroup terminates every process of the job object and closes it.
func (p *process) killGroup() {
	p.group.mu.Lock()
	defer p.group.mu.Unlock()
	if p.group.job == 0 {
		_ = p.cmd.Process.Kill()
		return
	}
	_ = windows.TerminateJobObject(p.group.job, 1)
	_ = windows.CloseHandle(p.group.job)
	p.group.job = 0
}

// waitAndEnd waits for the script and ends what it left behind in its
// job object.
func (p *process) waitAndEnd() error {
	err := p.cmd.Wait()
	p.killGroup()
	return err
}

// killedBy: a Windows process is never ended by a signal; its exit code
// says what ended it.
func killedBy(*os.ProcessState) (string, bool) { return "", false }
