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
