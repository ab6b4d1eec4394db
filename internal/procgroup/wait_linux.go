package procgroup

import (
	"errors"

	"golang.org/x/sys/unix"
)

// waitExited blocks until the child pid has exited and leaves it a zombie
// (WNOWAIT): it still holds its pid, and so its group's id.
func waitExited(pid int) error {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
