package agent

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// The VM's hardening for the job (docs/templates.md, "The job user"): the
// agent runs as root and holds the runner credential in its memory; the
// runner holds it in its environment and memory. The job is hostile, so
// before any credential exists the agent makes sure that the job user (the
// --run-as user, a generic VM's generic.user) reads neither:
//
//   - /proc is remounted with hidepid=invisible: the job user sees no
//     process of another user in /proc at all (not its command line, its
//     status or its environment's existence). No gid= exemption: root
//     sees every process through CAP_SYS_PTRACE, and no non-root service
//     of the recipe's image needs other users' processes.
//   - kernel.yama.ptrace_scope is raised to at least 1 (restricted): a
//     process may attach to, and read the memory (/proc/<pid>/mem) of,
//     its own descendants only. Another user's processes (the agent, and
//     the runner on platforms whose runner is root) are out of the job's
//     reach through the kernel's uid checks whatever the scope; scope 1
//     also keeps a job from attaching to the runner of its own uid (its
//     ancestor), while the job may still debug what it starts itself
//     (gdb, strace, the sanitizers' leak checker), which scope 2 (only
//     CAP_SYS_PTRACE) would break for no gain here. A higher setting of
//     the image is kept.
//   - the job user must not be able to become root: not root itself, in
//     no root-equivalent group (rootGroups) and without a sudo rule. An
//     image that lets it is refused when the VM's credential serves more
//     than one job on its platform's side (agentconfig
//     BootstrapMethod.SingleJob) and the template did not accept it
//     (spec.guest.jobMayEscalate): root reads everything above. A
//     single-job credential runs, with a warning in the log.

// rootGroups are groups whose members can become root without a password:
// sudo and wheel through the usual sudoers rules and polkit's admin rule,
// docker, lxd, incus-admin and libvirt by starting a container or VM
// with the host's file system, disk by writing the root file system's
// block device, root by writing the files group root may write.
var rootGroups = []string{"root", "sudo", "wheel", "admin", "docker", "lxd", "incus-admin", "libvirt", "disk"}

// hidepid is the /proc mount option that hides other users' processes:
// "invisible" since Linux 5.8, "2" before.
var hidepidValues = []string{"invisible", "2"}

// minPtraceScope is the lowest Yama ptrace scope the job runs under.
const minPtraceScope = 1

// hardening is what the agent does to the VM before the job (see above).
// Run uses systemHardening in a real VM (Options.Root empty, Linux, as
// root) and none otherwise: the tests and the simulated VMs share one
// host, whose /proc and sysctls are not theirs. Tests give a hardening of
// their own (Options.hardening).
type hardening struct {
	// proc is the proc mount to remount with hidepid, mountinfo the
	// mount table that shows its options ("": no remount).
	proc, mountinfo string
	// ptraceScope is Yama's ptrace_scope sysctl file ("": not raised).
	ptraceScope string
	// sudo is the sudo binary that lists a user's rules; "": sudo is
	// looked for in the usual places, and a VM without one has no sudo
	// rules.
	sudo string
	// remount remounts the proc file system at target with the mount
	// flags it has (flags, from mountinfo) and data (remountProc).
	remount func(target string, flags uintptr, data string) error
	// groupsOf are the names of the groups of the user (user.User's
	// GroupIds, looked up); nil: os/user.
	groupsOf func(u *user.User) ([]string, error)
}

// systemHardening is the hardening of a real VM.
func systemHardening() *hardening {
	return &hardening{proc: "/proc", mountinfo: "/proc/self/mountinfo", ptraceScope: "/proc/sys/kernel/yama/ptrace_scope", remount: remountProc}
}

// hardenForJob hardens the VM for the job of user before any credential
// exists, and refuses an image whose job user can become root when the
// config's credential serves more than one job and the template did not
// accept it (ExitJobUserEscalates, the power-off notice's guestRefusal).
func (a *agent) hardenForJob(ctx context.Context, cfg *agentconfig.Config, u *runAs) error {
	h := a.opts.hardening
	if h == nil {
		if a.opts.Root != "" || runtime.GOOS != "linux" || os.Geteuid() != 0 {
			a.log.Info("VM not hardened for the job: not a real Linux VM of its own (--root set, not Linux, or the agent is not root)",
				"root", a.opts.Root, "os", runtime.GOOS, "euid", os.Geteuid())
			return nil
		}
		h = systemHardening()
	}
	h.hideProcesses(a)
	h.restrictPtrace(a)
	why, err := h.escalation(ctx, u)
	if err != nil {
		// Unknown is not "cannot": the check fails closed.
		why = append(why, err.Error())
	}
	if len(why) == 0 {
		a.log.Info("the job user cannot become root", "user", u.describe())
		return nil
	}
	reasons := strings.Join(why, "; ")
	switch {
	case cfg.BootstrapMethod.SingleJob():
		a.log.Warn("the job user can become root and read the runner's credential; it serves this one job only, so the job runs",
			"user", u.describe(), "bootstrapMethod", cfg.BootstrapMethod, "why", reasons)
		return nil
	case cfg.JobMayEscalate:
		a.log.Warn("the job user can become root and read the runner's credential, which serves more than one job; the template accepts it (spec.guest.jobMayEscalate), so the job runs",
			"user", u.describe(), "bootstrapMethod", cfg.BootstrapMethod, "why", reasons)
		return nil
	}
	a.guestRefusal = agentconfig.GuestRefusalJobUserEscalates
	return fail(ExitJobUserEscalates, "the job user %s can become root in this VM (%s), where it would read the %s credential, which serves more than one job on its platform; no job runs: build the image without the job user's sudo rule and root-equivalent groups (docs/templates.md, \"The job user\"), or set spec.guest.jobMayEscalate on the template to accept that a job can take the credential",
		u.describe(), reasons, cfg.BootstrapMethod)
}

// hideProcesses remounts /proc with hidepid, logging what it did; a
// failure is logged, not fatal: the kernel's uid checks keep another
// user's environment and memory from the job without it.
func (h *hardening) hideProcesses(a *agent) {
	if h.proc == "" {
		return
	}
	opts, flags, err := procMount(h.mountinfo, h.proc)
	if err != nil {
		a.log.Error("cannot hide other users' processes from the job", "path", h.proc, "error", err)
		return
	}
	if v := opts["hidepid"]; v == "invisible" || v == "2" {
		a.log.Info("other users' processes already hidden", "path", h.proc, "hidepid", v)
		return
	}
	var errs []error
	for _, v := range hidepidValues {
		err := h.remount(h.proc, flags, "hidepid="+v)
		if err == nil {
			a.log.Info("other users' processes hidden from the job", "path", h.proc, "hidepid", v)
			return
		}
		errs = append(errs, fmt.Errorf("hidepid=%s: %w", v, err))
	}
	a.log.Error("cannot hide other users' processes from the job", "path", h.proc, "error", errors.Join(errs...))
}

// restrictPtrace raises Yama's ptrace scope to minPtraceScope, logging
// what it did; a failure (a kernel without Yama) is logged, not fatal.
func (h *hardening) restrictPtrace(a *agent) {
	if h.ptraceScope == "" {
		return
	}
	data, err := os.ReadFile(h.ptraceScope)
	if err != nil {
		a.log.Error("cannot restrict ptrace for the job: the kernel has no Yama ptrace scope", "path", h.ptraceScope, "error", err)
		return
	}
	scope, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		a.log.Error("cannot restrict ptrace for the job: unreadable ptrace scope", "path", h.ptraceScope, "value", strings.TrimSpace(string(data)))
		return
	}
	if scope >= minPtraceScope {
		a.log.Info("ptrace already restricted", "ptraceScope", scope)
		return
	}
	if err := os.WriteFile(h.ptraceScope, []byte(strconv.Itoa(minPtraceScope)+"\n"), 0o644); err != nil {
		a.log.Error("cannot restrict ptrace for the job", "path", h.ptraceScope, "error", err)
		return
	}
	a.log.Info("ptrace restricted to each process's descendants", "ptraceScope", minPtraceScope, "was", scope)
}

// procMount reads the mount of target in mountinfo (the last one: it is
// the visible one): its super options, and the mount flags a remount must
// keep.
func procMount(mountinfo, target string) (map[string]string, uintptr, error) {
	data, err := os.ReadFile(mountinfo)
	if err != nil {
		return nil, 0, err
	}
	var mountOpts, superOpts string
	found := false
	for line := range strings.Lines(string(data)) {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		pre, post, ok := strings.Cut(strings.TrimSpace(line), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 6 || len(g) < 3 || unescapeMountinfo(f[4]) != target {
			continue
		}
		if g[0] != "proc" {
			return nil, 0, fmt.Errorf("%s is a %s file system, not proc", target, g[0])
		}
		mountOpts, superOpts, found = f[5], g[2], true
	}
	if !found {
		return nil, 0, fmt.Errorf("%s is not a mount point in %s", target, mountinfo)
	}
	opts := map[string]string{}
	for o := range strings.SplitSeq(superOpts, ",") {
		k, v, _ := strings.Cut(o, "=")
		opts[k] = v
	}
	return opts, mountFlags(strings.Split(mountOpts, ",")), nil
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// escalation says how the job user can become root, if it can: it is
// root, it is in a root-equivalent group, or sudo lists rules for it. An
// error means sudo could not tell.
func (h *hardening) escalation(ctx context.Context, u *runAs) ([]string, error) {
	if u.uid == 0 {
		return []string{"it is root"}, nil
	}
	pw, err := user.LookupId(strconv.Itoa(u.uid))
	if err != nil {
		return nil, fmt.Errorf("look up uid %d: %w", u.uid, err)
	}
	groupsOf := h.groupsOf
	if groupsOf == nil {
		groupsOf = groupNames
	}
	groups, err := groupsOf(pw)
	if err != nil {
		return nil, fmt.Errorf("the groups of %s: %w", pw.Username, err)
	}
	var why []string
	for _, g := range groups {
		if slices.Contains(rootGroups, g) {
			why = append(why, "it is in group "+g)
		}
	}
	rules, err := h.sudoRules(ctx, pw.Username)
	if err != nil {
		return why, err
	}
	if rules != "" {
		why = append(why, "sudo lets it run "+rules)
	}
	return why, nil
}

// groupNames are the names of u's groups (a group without a name by its
// number).
func groupNames(u *user.User) ([]string, error) {
	ids, err := u.GroupIds()
	if err != nil {
		return nil, err
	}
	if !slices.Contains(ids, u.Gid) {
		ids = append(ids, u.Gid)
	}
	var names []string
	for _, id := range ids {
		name := id
		if g, err := user.LookupGroupId(id); err == nil {
			name = g.Name
		}
		names = append(names, name)
	}
	return names, nil
}

// sudoPaths are where images install sudo.
var sudoPaths = []string{"/usr/bin/sudo", "/bin/sudo", "/usr/local/bin/sudo"}

// sudoTimeout bounds sudo's listing.
const sudoTimeout = 30 * time.Second

// sudoRules lists the sudo rules of name as sudo itself reads the image's
// sudoers (sudo -n -l -U name, run as root, which may list any user's):
// "" when sudo says the user may run nothing, or when there is no sudo. A
// listing sudo does not phrase either way is an error: the check fails
// closed rather than guess.
func (h *hardening) sudoRules(ctx context.Context, name string) (string, error) {
	bin := h.sudo
	if bin == "" {
		for _, p := range sudoPaths {
			if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
				bin = p
				break
			}
		}
		if bin == "" {
			return "", nil
		}
	}
	ctx, cancel := context.WithTimeout(ctx, sudoTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-n", "-l", "-U", name)
	cmd.Env = []string{"LC_ALL=C", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	text := strings.TrimSpace(out.String())
	switch {
	case err == nil && strings.Contains(text, "is not allowed to run sudo"):
		return "", nil
	case err == nil && strings.Contains(text, "may run the following commands"):
		_, rules, _ := strings.Cut(text, "may run the following commands")
		_, rules, _ = strings.Cut(rules, "\n")
		return strings.Join(strings.Fields(rules), " "), nil
	}
	return "", fmt.Errorf("cannot tell whether sudo lets %s become root (%s -n -l -U %s: %w): %s", name, bin, name, cmp.Or(err, errors.New("an answer it does not phrase either way")), tailString(text, 512))
}
