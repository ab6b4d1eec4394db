//go:build guest

package guest

import (
	"fmt"
	"regexp"
	"strings"
)

// jobUserCheckOK starts the line a job prints when it found nothing of the
// runner's or the agent's to read; jobUserCheckFailed each thing it did.
const (
	jobUserCheckOK     = "JOB-USER-CHECK OK"
	jobUserCheckFailed = "JOB-USER-CHECK FAILED"
)

// jobUserCheck is a job's step (bash or sh, in a Debian guest) that
// attacks what it runs under, as a hostile job would (docs/templates.md,
// "The job user"): it may see no process of another user in /proc (the
// agent's /proc is remounted with hidepid), walks up its ancestors to the
// first that is not its user's (the agent, or a runner of another user),
// which it must neither see nor read the environment or memory of, nor
// attach to with ptrace; it must not attach to or read the memory of its
// own topmost ancestor either (the runner of its own user: ptrace
// scope 1); it must not become root (no sudo, no root-equivalent group).
// secretVars are environment variables no process the job can read may
// hold (a runner's multi-job token), checked in every /proc/<pid>/environ
// it can open. The step exits non-zero, failing the job, on the first
// finding, and prints jobUserCheckOK when there is none.
func jobUserCheck(secretVars ...string) string {
	var b strings.Builder
	b.WriteString(`bad=0
fail() { echo "` + jobUserCheckFailed + `: $*"; bad=1; }
me=$(id -u)
[ "$me" -ne 0 ] || fail "the job runs as root"
own=0
for d in /proc/[0-9]*; do
	owner=$(stat -c %u "$d" 2>/dev/null) || continue
	if [ "$owner" = "$me" ]; then
		own=$((own + 1))
	else
		fail "sees process ${d#/proc/} of uid $owner: $(tr '\0' ' ' <"$d/cmdline" 2>/dev/null | cut -c1-100)"
	fi
done
[ "$own" -gt 0 ] || fail "sees none of its own processes"
# Up the ancestors: the last of the job's user, then the first that is not.
top=$$
p=$$
while :; do
	pp=$(sed 's/.*) //' "/proc/$p/stat" | cut -d' ' -f2)
	[ "${pp:-0}" -gt 1 ] || break
	[ "$(stat -c %u "/proc/$pp" 2>/dev/null)" = "$me" ] || break
	top=$pp
	p=$pp
done
above=$pp
[ "${above:-0}" -gt 1 ] || fail "no process above the job's own ($top)"
[ ! -e "/proc/$above" ] || fail "sees the process above its own, $above: $(tr '\0' ' ' <"/proc/$above/cmdline" 2>/dev/null)"
cat "/proc/$above/environ" >/dev/null 2>&1 && fail "reads the environment of $above"
python3 - "$above" "$top" <<'PY' || bad=1
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH, PTRACE_DETACH = 16, 17
found = False
for what, pid in (("the process above the job", int(sys.argv[1])), ("the job's topmost ancestor of its own user", int(sys.argv[2]))):
    try:
        with open("/proc/%d/mem" % pid, "rb"):
            print("` + jobUserCheckFailed + `: opens the memory of %s (%d)" % (what, pid))
            found = True
    except OSError as e:
        print("cannot open the memory of %s (%d): %s" % (what, pid, e.strerror))
    if libc.ptrace(PTRACE_ATTACH, pid, None, None) == 0:
        libc.ptrace(PTRACE_DETACH, pid, None, None)
        print("` + jobUserCheckFailed + `: attaches to %s (%d)" % (what, pid))
        found = True
    else:
        print("cannot attach to %s (%d): %s" % (what, pid, os.strerror(ctypes.get_errno())))
sys.exit(1 if found else 0)
PY
if sudo -n true >/dev/null 2>&1; then fail "sudo makes it root without a password"; fi
for g in $(id -Gn); do
	case $g in root | sudo | wheel | admin | docker | lxd | incus-admin | libvirt | disk) fail "is in group $g" ;; esac
done
`)
	for _, v := range secretVars {
		fmt.Fprintf(&b, `for e in /proc/[0-9]*/environ; do
	tr '\0' '\n' <"$e" 2>/dev/null | grep -q '^%[1]s=' && fail "reads %[1]s in $e"
done
`, v)
	}
	b.WriteString(`[ "$bad" -eq 0 ] && echo "` + jobUserCheckOK + `: uid $me sees $own processes, all its own; $above above them hidden"
exit "$bad"
`)
	return b.String()
}

// jobUserCheckedRE is the line of a jobUserCheck that found nothing (not
// its command, which a GitLab trace echoes).
var jobUserCheckedRE = regexp.MustCompile(regexp.QuoteMeta(jobUserCheckOK) + `: uid [0-9]+ sees`)

// jobUserChecked says whether a job's log has a jobUserCheck's line of
// success.
func jobUserChecked(log string) bool { return jobUserCheckedRE.MatchString(log) }
