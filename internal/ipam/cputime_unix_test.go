//go:build unix

package ipam

import (
	"syscall"
	"testing"
	"time"
)

// cpuMark is the process's CPU time when a benchmark loop starts. On the
// shared 2-vCPU machines the benchmarks run on, other builds take most of
// the CPU and inflate wall-clock ns/op several times over; CPU time spent by
// this process per op (GC included) is the cost the allocator itself adds.
type cpuMark time.Duration

func cpuStart() cpuMark { return cpuMark(processCPU()) }

// report adds cpu-ns/op; call it after the b.Loop loop, when b.N is final.
func (m cpuMark) report(b *testing.B) {
	b.ReportMetric(float64(processCPU()-time.Duration(m))/float64(b.N), "cpu-ns/op")
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
