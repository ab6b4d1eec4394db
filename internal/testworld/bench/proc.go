package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of /proc/<pid>/stat's CPU times: USER_HZ, 100 on
// every Linux architecture Go supports (the kernel's ABI, independent of
// its internal HZ).
const clockTick = 10 * time.Millisecond

// Usage is a process's memory and CPU time at one moment.
type Usage struct {
	// RSS is VmRSS, HWM VmHWM (the peak RSS), in bytes.
	RSS, HWM int64
	// CPU is user + system time.
	CPU time.Duration
}

// ReadUsage reads pid's usage from /proc.
func ReadUsage(pid int) (Usage, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Usage{}, fmt.Errorf("read process status: %w", err)
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Usage{}, fmt.Errorf("read process stat: %w", err)
	}
	return ParseUsage(status, stat)
}

// ParseUsage parses /proc/<pid>/status (VmRSS, VmHWM) and /proc/<pid>/stat
// (utime and stime, fields 14 and 15).
func ParseUsage(status, stat []byte) (Usage, error) {
	var u Usage
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			return Usage{}, fmt.Errorf("status line %q: want <n> kB", sc.Text())
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return Usage{}, fmt.Errorf("status line %q: %w", sc.Text(), err)
		}
		if k == "VmRSS" {
			u.RSS = n << 10
		} else {
			u.HWM = n << 10
		}
	}
	if u.RSS == 0 {
		return Usage{}, fmt.Errorf("no VmRSS in process status")
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// fields are counted from the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return Usage{}, fmt.Errorf("process stat %q: no command name", stat)
	}
	f := strings.Fields(string(stat[i+1:]))
	// f[0] is field 3 (state): utime is field 14, stime 15.
	if len(f) < 13 {
		return Usage{}, fmt.Errorf("process stat: %d fields after the command name, want at least 13", len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return Usage{}, fmt.Errorf("process stat: %w", err)
		}
		ticks += n
	}
	u.CPU = time.Duration(ticks) * clockTick
	return u, nil
}

// CPUShare is the CPU time used between a and b over the wall time
// between them, as a share of one core (0.05 is 5 %).
func CPUShare(a, b Usage, wall time.Duration) float64 {
	if wall <= 0 {
		return 0
	}
	return float64(b.CPU-a.CPU) / float64(wall)
}

// CPUTimes are the machine's CPU times from /proc/stat's "cpu" line, in
// clock ticks summed over all cores: busy is everything but idle and
// iowait.
type CPUTimes struct {
	Busy, Total int64
}

// ReadCPUTimes reads the machine's CPU times.
func ReadCPUTimes() (CPUTimes, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return CPUTimes{}, fmt.Errorf("read /proc/stat: %w", err)
	}
	return ParseCPUTimes(b)
}

// ParseCPUTimes parses /proc/stat's first line: "cpu user nice system
// idle iowait irq softirq steal guest guest_nice" (guest time is already in
// user and nice, so it is not added again).
func ParseCPUTimes(b []byte) (CPUTimes, error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 5 || f[0] != "cpu" {
		return CPUTimes{}, fmt.Errorf("/proc/stat starts %q, want the cpu line", line)
	}
	var t CPUTimes
	for i, s := range f[1:min(len(f), 9)] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return CPUTimes{}, fmt.Errorf("/proc/stat cpu field %d: %w", i+1, err)
		}
		t.Total += n
		if i != 3 && i != 4 { // idle, iowait
			t.Busy += n
		}
	}
	return t, nil
}

// BusyShare is the share of all the machine's cores busy between a and b
// (1 is every core busy all the time).
func BusyShare(a, b CPUTimes) float64 {
	if b.Total <= a.Total {
		return 0
	}
	return float64(b.Busy-a.Busy) / float64(b.Total-a.Total)
}

// ProcessesNamed returns the pids of the processes whose command name
// (/proc/<pid>/comm) is one of names, by name.
func ProcessesNamed(names ...string) map[string][]int {
	out := map[string][]int{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil {
			continue
		}
		name := strings.TrimSpace(string(comm))
		for _, n := range names {
			if name == n {
				out[n] = append(out[n], pid)
			}
		}
	}
	return out
}
