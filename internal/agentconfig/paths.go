package agentconfig

import (
	"path"
	"strings"
)

// The agent removes runner.software.installPath after a downloaded runner
// ran and empties runner.software.workDir after every job, as root. A
// path that is, or contains, a directory the system needs would take the
// system down with it (and a job could plant files there before the agent
// runs again on a kept VM). Two lists decide which paths are refused;
// docs/security.md explains them. The CRD's CEL rules on
// spec.bootstrap.github.runner.installPath and workDir (api/v1alpha1)
// carry the same lists.

// SystemTrees are directories that belong to the system with everything
// in them: neither path may be one of them, inside one, or above one.
var SystemTrees = []string{
	"/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/root", "/run", "/sbin", "/sys", "/usr",
}

// SystemDirs are directories that hold the system's and other programs'
// data beside places a runner may use (/var/lib/hyperfleet, /opt/..., a
// home directory): neither path may be one of them or above one; a
// directory inside one is fine.
var SystemDirs = []string{
	"/home", "/media", "/mnt", "/opt", "/srv", "/tmp", "/var", "/var/cache", "/var/lib", "/var/lib/cloud", "/var/log", "/var/tmp",
}

// usrLocalStandard are the standard subdirectories of /usr/local, which
// stay refused with /usr/local itself: a runner may live in any other
// /usr/local/<name>, although /usr is a system tree.
var usrLocalStandard = []string{"bin", "etc", "games", "include", "lib", "lib64", "libexec", "man", "sbin", "share", "src"}

// CheckRunnerPath says why p may not be runner.software.installPath or
// workDir, or returns "" when it may. p must be absolute.
func CheckRunnerPath(p string) string {
	if p != path.Clean(p) {
		return "must be written plainly, without '//', '.', '..' or a trailing '/' (" + path.Clean(p) + "?)"
	}
	if p == "/" {
		return "is the root directory"
	}
	if local, ok := strings.CutPrefix(p, "/usr/local/"); ok {
		first, _, _ := strings.Cut(local, "/")
		for _, s := range usrLocalStandard {
			if first == s {
				return "is inside /usr/local/" + s + ", a system directory"
			}
		}
		return ""
	}
	for _, d := range SystemTrees {
		if why := againstSystemDir(p, d, true); why != "" {
			return why
		}
	}
	for _, d := range SystemDirs {
		if why := againstSystemDir(p, d, false); why != "" {
			return why
		}
	}
	return ""
}

// againstSystemDir says why the system directory d refuses p: p is d,
// contains d, or is inside d when d is a whole tree (SystemTrees); ""
// when d does not refuse it.
func againstSystemDir(p, d string, tree bool) string {
	switch {
	case p == d:
		return "is the system directory " + d
	case tree && strings.HasPrefix(p, d+"/"):
		return "is inside the system directory " + d
	case strings.HasPrefix(d, p+"/"):
		return "contains the system directory " + d
	}
	return ""
}
