package proxmoxsim

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// A real VM's end ends every process in it. A guest program is a process
// of the test machine instead, started as the leader of a session of its
// own (Setsid), and a kill of its process group alone would leave what it
// started in groups of their own running: the agent runs each job and
// script in a new process group (internal/agent, so that it can stop the
// whole job), and a script that ignores SIGTERM outlived its VM, and the
// test, that way. killGuest ends the program's session and every process
// descended from it; sweepGuest ends what is left of the session after
// the program exited by itself (its children, reparented, keep the
// session).

// killGuest stops, then kills, the guest program leader and everything in
// its session or below it.
func killGuest(leader int) {
	for pg := range stopGuestGroups(leader) {
		_ = syscall.Kill(-pg, syscall.SIGKILL)
	}
}

// freezeGuest stops the guest program leader and everything in its
// session or below it, where they are: a paused or suspended VM's guest.
func freezeGuest(leader int) { stopGuestGroups(leader) }

// thawGuest continues what freezeGuest stopped.
func thawGuest(leader int) {
	groups := map[int]bool{leader: true}
	for _, p := range guestProcesses(leader) {
		groups[p.pgid] = true
	}
	for pg := range groups {
		_ = syscall.Kill(-pg, syscall.SIGCONT)
	}
}

// stopGuestGroups stops (SIGSTOP) every process group of the guest
// program leader's session or below it, and returns them. Stopped first,
// so that nothing forks while the process table is read; read again until
// no new process group turns up.
func stopGuestGroups(leader int) map[int]bool {
	groups := map[int]bool{leader: true}
	for range 5 {
		for pg := range groups {
			_ = syscall.Kill(-pg, syscall.SIGSTOP)
		}
		n := len(groups)
		for _, p := range guestProcesses(leader) {
			groups[p.pgid] = true
		}
		if len(groups) == n {
			break
		}
	}
	return groups
}

// sweepGuest kills what remains of an exited guest program's session. It
// runs before the program is reaped (procgroup.Leader.Wait): its zombie
// holds the session's and group's id, as does any process left in them,
// so no new process can have been given it.
func sweepGuest(leader int) {
	if len(guestProcesses(leader)) > 0 {
		killGuest(leader)
	}
}

// procStat is what /proc/<pid>/stat says of a process's place.
type procStat struct{ pid, ppid, pgid, sid int }

// guestProcesses lists the processes in the leader's session or descended
// from the leader, the leader excluded, never the test's own group.
func guestProcesses(leader int) []procStat {
	all := readProcStats()
	children := map[int][]procStat{}
	for _, p := range all {
		children[p.ppid] = append(children[p.ppid], p)
	}
	own := syscall.Getpgrp()
	seen := map[int]bool{}
	var out []procStat
	add := func(p procStat) bool {
		if seen[p.pid] || p.pid == leader || p.pgid == own || p.pgid <= 1 {
			return false
		}
		seen[p.pid] = true
		out = append(out, p)
		return true
	}
	for _, p := range all {
		if p.sid == leader {
			add(p)
		}
	}
	queue := []int{leader}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, c := range children[pid] {
			if add(c) {
				queue = append(queue, c.pid)
			}
		}
	}
	return out
}

// readProcStats reads every process's parent, group and session; a
// process that ends while it is read is left out.
func readProcStats() []procStat {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []procStat
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		if st, ok := parseProcStat(pid, b); ok {
			out = append(out, st)
		}
	}
	return out
}

// parseProcStat reads "pid (comm) state ppid pgrp session ...": comm may
// hold spaces and parentheses, so the fields start after its last ')'.
func parseProcStat(pid int, b []byte) (procStat, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 4 {
		return procStat{}, false
	}
	var n [3]int
	for k := range n {
		v, err := strconv.Atoi(string(f[k+1]))
		if err != nil {
			return procStat{}, false
		}
		n[k] = v
	}
	return procStat{pid: pid, ppid: n[0], pgid: n[1], sid: n[2]}, true
}
