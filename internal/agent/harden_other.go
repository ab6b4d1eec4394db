//go:build !linux

package agent

import (
	"fmt"
	"runtime"
)

// remountProc: only Linux has hidepid (hardenForJob does not harden
// other systems).
func remountProc(string, uintptr, string) error {
	return fmt.Errorf("no proc file system to remount on %s", runtime.GOOS)
}

// mountFlags: none outside Linux.
func mountFlags([]string) uintptr { return 0 }
