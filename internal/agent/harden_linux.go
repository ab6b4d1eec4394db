package agent

import "syscall"

// remountProc remounts the proc file system at target with data (its
// hidepid option), keeping its mount flags (nosuid, nodev, noexec, the
// atime mode): a remount sets every flag it is not given to off.
func remountProc(target string, flags uintptr, data string) error {
	return syscall.Mount("proc", target, "proc", syscall.MS_REMOUNT|flags, data)
}

// mountFlags are the mount flags of mountinfo's per-mount options.
func mountFlags(opts []string) uintptr {
	var f uintptr
	for _, o := range opts {
		switch o {
		case "ro":
			f |= syscall.MS_RDONLY
		case "nosuid":
			f |= syscall.MS_NOSUID
		case "nodev":
			f |= syscall.MS_NODEV
		case "noexec":
			f |= syscall.MS_NOEXEC
		case "noatime":
			f |= syscall.MS_NOATIME
		case "nodiratime":
			f |= syscall.MS_NODIRATIME
		case "relatime":
			f |= syscall.MS_RELATIME
		case "strictatime":
			f |= syscall.MS_STRICTATIME
		}
	}
	return f
}
