package libvirtd

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// nsProcess is a process of the daemon's PID namespace.
type nsProcess struct {
	hostPID, nsPID int
	comm           string
}

// processes lists the processes of the daemon's PID namespace, found by
// comparing /proc/<pid>/ns/pid with the holder's.
func (d *Daemon) processes() ([]nsProcess, error) {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", d.holder.Process.Pid))
	if err != nil {
		return nil, fmt.Errorf("libvirtd: the daemon's PID namespace: %w", err)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("libvirtd: listing processes: %w", err)
	}
	var procs []nsProcess
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if other, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err != nil || other != ns {
			continue
		}
		p, ok := readStatus(pid)
		if ok {
			procs = append(procs, p)
		}
	}
	return procs, nil
}

// readStatus reads a process's name and its PID in its own namespace (the
// last field of NSpid); false when it has exited meanwhile.
func readStatus(pid int) (nsProcess, bool) {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return nsProcess{}, false
	}
	defer f.Close()
	p := nsProcess{hostPID: pid}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, value, _ := strings.Cut(sc.Text(), ":")
		fields := strings.Fields(value)
		switch {
		case key == "Name" && len(fields) > 0:
			p.comm = fields[0]
		case key == "NSpid" && len(fields) > 0:
			p.nsPID, _ = strconv.Atoi(fields[len(fields)-1])
		case key == "State" && len(fields) > 0 && fields[0] == "Z":
			return nsProcess{}, false
		}
	}
	return p, p.nsPID != 0
}

// findProcess is the host PID of the daemon's process named comm.
func (d *Daemon) findProcess(comm string) (int, error) {
	return d.find(func(p nsProcess) bool { return p.comm == comm }, "no "+comm+" runs in the daemon's namespaces")
}

// hostPID maps a PID inside the daemon's namespace to the host's.
func (d *Daemon) hostPID(nsPID int) (int, error) {
	return d.find(func(p nsProcess) bool { return p.nsPID == nsPID }, fmt.Sprintf("no process %d in the daemon's namespaces", nsPID))
}

// find is the host PID of the first of the daemon's processes that match.
func (d *Daemon) find(match func(nsProcess) bool, missing string) (int, error) {
	procs, err := d.processes()
	if err != nil {
		return 0, err
	}
	for _, p := range procs {
		if match(p) {
			return p.hostPID, nil
		}
	}
	return 0, errors.New("libvirtd: " + missing)
}

// waitGone waits until pid has exited and been reaped, polling /proc: a
// process that is not our child gives no other signal.
func waitGone(pid int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		// A zombie still takes signals; it is gone once the holder has
		// reaped it.
		if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("libvirtd: process %d still runs after %s", pid, limit)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitState waits until pid's state (/proc/<pid>/stat) is state: a
// signal is delivered after kill returns.
func waitState(pid int, state byte, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		got, err := procState(pid)
		if err != nil {
			return err
		}
		if got == state {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("libvirtd: process %d not in state %c after %s", pid, state, limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// procState is the state letter of /proc/<pid>/stat (R, S, T, Z...).
func procState(pid int) (byte, error) {
	fields, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	return fields[0][0], nil
}

// statFields are the fields of /proc/<pid>/stat after the parenthesised
// command name, from the state (field 3) on.
func statFields(pid int) ([]string, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, fmt.Errorf("libvirtd: process %d: %w", pid, err)
	}
	fields := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	if len(fields) < 15 {
		return nil, fmt.Errorf("libvirtd: process %d: short stat line", pid)
	}
	return fields, nil
}

// worldCPU is the CPU time of the daemon's whole world so far: each live
// process's own and its reaped children's, plus what the holder reaped
// (daemons and guests that have exited). Read before the holder is
// killed: processes the kernel ends with the namespace are not
// accounted to anyone.
func (d *Daemon) worldCPU() time.Duration {
	procs, err := d.processes()
	if err != nil {
		return 0
	}
	var ticks int64
	for _, p := range procs {
		ticks += cpuTicks(p.hostPID)
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ
}

// cpuTicks is utime+stime+cutime+cstime from /proc/<pid>/stat, in clock
// ticks; 0 when the process is gone.
func cpuTicks(pid int) int64 {
	fields, err := statFields(pid)
	if err != nil {
		return 0
	}
	// utime is field 14, the 12th from the state.
	var sum int64
	for _, f := range fields[11:15] {
		n, _ := strconv.ParseInt(f, 10, 64)
		sum += n
	}
	return sum
}

// StopNext catches the next process named comm to run in the daemon's
// namespaces, from this call on, and stops it (SIGSTOP): a child libvirtd
// runs for a long job, such as the qemu-img that converts a volume, held in
// the middle of its work. It polls /proc every millisecond; the process
// must live longer than that (a conversion of hundreds of MiB does).
// caught waits until the process is stopped, failing the test after limit,
// and returns the function that resumes it; the end of the test resumes it
// too.
func (d *Daemon) StopNext(t testing.TB, comm string, limit time.Duration) (caught func() (resume func())) {
	t.Helper()
	seen := map[int]bool{}
	if procs, err := d.processes(); err == nil {
		for _, p := range procs {
			if p.comm == comm {
				seen[p.hostPID] = true // running already: not the next one
			}
		}
	}
	type catch struct {
		pid int
		err error
	}
	done := make(chan catch, 1)
	go func() {
		deadline := time.Now().Add(limit)
		for time.Now().Before(deadline) {
			procs, err := d.processes()
			if err != nil {
				done <- catch{err: err}
				return
			}
			for _, p := range procs {
				if p.comm == comm && !seen[p.hostPID] {
					if err := syscall.Kill(p.hostPID, syscall.SIGSTOP); err != nil {
						done <- catch{err: fmt.Errorf("libvirtd: stopping %s (PID %d): %w", comm, p.hostPID, err)}
						return
					}
					done <- catch{pid: p.hostPID, err: waitState(p.hostPID, 'T', 10*time.Second)}
					return
				}
			}
			time.Sleep(time.Millisecond)
		}
		done <- catch{err: fmt.Errorf("libvirtd: no new %s ran within %s", comm, limit)}
	}()
	return func() func() {
		t.Helper()
		c := <-done
		if c.pid != 0 {
			t.Cleanup(func() { _ = syscall.Kill(c.pid, syscall.SIGCONT) })
		}
		if c.err != nil {
			t.Fatal(c.err)
		}
		return func() { _ = syscall.Kill(c.pid, syscall.SIGCONT) }
	}
}
