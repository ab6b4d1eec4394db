package agent

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// runAs is the user the runner's scripts run as.
type runAs struct {
	name     string // empty: the agent's own user
	uid, gid int
	home     string
	// cred switches the runner to the user; nil when it is the agent's
	// own user.
	cred *syscall.Credential
	// proxyEnv are the config's proxy variables (agentconfig.Proxy.Env),
	// given to every script in place of the agent's own.
	proxyEnv []string
}

func (u *runAs) describe() string {
	if u.name == "" {
		return "(the agent's own user)"
	}
	return u.name
}

// lookupRunAs resolves the user name from (--run-as, or a generic
// config's generic.user) for the error messages.
func lookupRunAs(name, from string) (*runAs, error) {
	if name == "" {
		u := &runAs{uid: os.Getuid(), gid: os.Getgid()}
		if pw, err := user.LookupId(strconv.Itoa(u.uid)); err == nil {
			u.home = pw.HomeDir
		}
		return u, nil
	}
	pw, err := user.Lookup(name)
	if err != nil {
		var unknown user.UnknownUserError
		if errors.As(err, &unknown) {
			if from != "--run-as" {
				return nil, fail(ExitInternal, "%s %q: no such user in this VM; create it in the image (the operator names it, and its SPIRE entry selects it)", from, name)
			}
			return nil, fail(ExitInternal, "--run-as %q: no such user in this VM; create it in the image, or pass --run-as \"\" to run the runner as the agent's own user", name)
		}
		return nil, fail(ExitInternal, "%s %q: %v", from, name, err)
	}
	uid, err1 := strconv.Atoi(pw.Uid)
	gid, err2 := strconv.Atoi(pw.Gid)
	if err1 != nil || err2 != nil {
		return nil, fail(ExitInternal, "%s %q: user has a non-numeric uid %q or gid %q", from, name, pw.Uid, pw.Gid)
	}
	u := &runAs{name: pw.Username, uid: uid, gid: gid, home: pw.HomeDir}
	if uid == os.Getuid() && gid == os.Getgid() {
		return u, nil
	}
	var groups []uint32
	if ids, err := pw.GroupIds(); err == nil {
		for _, id := range ids {
			if g, err := strconv.ParseUint(id, 10, 32); err == nil {
				groups = append(groups, uint32(g))
			}
		}
	}
	u.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: groups}
	return u, nil
}

// env returns the environment of the runner's scripts: the agent's own,
// without anything the agent sets itself, with the user's HOME, USER and
// LOGNAME, RUNNER_ALLOW_RUNASROOT=1 for root, and extra.
func (u *runAs) env(extra ...string) []string {
	drop := func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "ACTIONS_RUNNER_INPUT_") || k == "RUNNER_ALLOW_RUNASROOT" {
			return true
		}
		if len(u.proxyEnv) > 0 && agentconfig.IsProxyEnv(kv) {
			// The template's proxy replaces the agent's own, in both
			// cases: a program reads whichever case it looks at first.
			return true
		}
		return u.name != "" && (k == "HOME" || k == "USER" || k == "LOGNAME")
	}
	var env []string
	for _, kv := range os.Environ() {
		if !drop(kv) {
			env = append(env, kv)
		}
	}
	if u.name != "" {
		env = append(env, "USER="+u.name, "LOGNAME="+u.name)
		if u.home != "" {
			env = append(env, "HOME="+u.home)
		}
	}
	env = append(env, u.proxyEnv...)
	if u.uid == 0 {
		// The real actions/runner refuses to run as root without it.
		env = append(env, "RUNNER_ALLOW_RUNASROOT=1")
	}
	return append(env, extra...)
}

func (u *runAs) String() string {
	return fmt.Sprintf("%s (uid %d, gid %d)", u.describe(), u.uid, u.gid)
}
