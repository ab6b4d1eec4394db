package agent

import "syscall"

// remountProc remounts the proc file system at target with data (its
// hidepid option), keeping its mount flags (nosuid, nodev, noexec, the
// atime mode): a remount sets every flag it is not given to off.
func remountProc(target string, flags uintptr, data string) error {
	return syscall.Mount("proc", target, "proc", syscall.MS_REMOUNT|flags, data)
}

// mountFlagOf is the mount flag of each per-mount option of mountinfo
// that a remount must keep.
var mountFlagOf = map[string]uintptr{
	"ro":          syscall.MS_RDONLY,
	"nosuid":      syscall.MS_NOSUID,
	"nodev":       syscall.MS_NODEV,
	"noexec":      syscall.MS_NOEXEC,
	"noatime":     syscall.MS_NOATIME,
	"nodiratime":  syscall.MS_NODIRATIME,
	"relatime":    syscall.MS_RELATIME,
	"strictatime": syscall.MS_STRICTATIME,
}

// mountFlags are the mount flags of mountinfo's per-mount options.
func mountFlags(opts []string) uintptr {
	var f uintptr
	for _, o := range opts {
		f |= mountFlagOf[o]
	}
	return f
}
