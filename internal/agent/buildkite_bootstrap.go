//go:build !windows

package agent

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// jobEnvDropped are the variables of buildkite-agent's environment that are
// not the job's and that the bootstrap never sees: the registration token
// (a job acquisition token, or a cluster agent token: buildkite-agent
// inherits it from this agent and the real agent unsets it itself, an
// older one may not) and the marker that lets a runner run as root.
var jobEnvDropped = []string{EnvBuildkiteAgentToken, "RUNNER_ALLOW_RUNASROOT"}

// jobEnvFiles are the files buildkite-agent writes the job's environment
// to before the bootstrap runs (agent.JobRunner's job-env-<job> and
// job-env-json-<job>, in its temporary directory, readable by itself
// only), by the variables that name them: they are the job's, so they are
// handed to the job's user.
var jobEnvFiles = []string{"BUILDKITE_ENV_FILE", "BUILDKITE_ENV_JSON_FILE"}

// BuildkiteBootstrap is `hyperfleet-agent buildkite-bootstrap --user USER
// -- BOOTSTRAP ARGS...`: as root, started by buildkite-agent (running as
// the agent's own user) for one job, it switches to USER (its groups, gid
// and uid, in that order, for every thread) and executes BOOTSTRAP (the
// agent's `buildkite-agent bootstrap`, which runs the job's hooks, plugins
// and command) in its place, so buildkite-agent's signals and exit status
// reach the bootstrap itself. The bootstrap gets buildkite-agent's
// environment without jobEnvDropped, with USER's HOME, USER and LOGNAME:
// the job's access token (BUILDKITE_AGENT_ACCESS_TOKEN, Buildkite's for
// this job) is the only Buildkite credential left in it. It returns only
// when it could not execute the bootstrap (exit 1; 2 for bad arguments).
func BuildkiteBootstrap(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet(BuildkiteBootstrapCommand, flag.ContinueOnError)
	fs.SetOutput(stderr)
	name := fs.String("user", "", "the job's user")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	argv := fs.Args()
	if *name == "" || len(argv) == 0 {
		fmt.Fprintf(stderr, "hyperfleet-agent %s: usage: --user USER -- BOOTSTRAP [ARGS...]\n", BuildkiteBootstrapCommand)
		return 2
	}
	if err := execBootstrap(*name, argv); err != nil {
		fmt.Fprintf(stderr, "hyperfleet-agent %s: the job did not run: %v\n", BuildkiteBootstrapCommand, err)
	}
	return 1
}

// execBootstrap switches to the user name and executes argv; it returns
// only on failure.
func execBootstrap(name string, argv []string) error {
	u, err := lookupRunAs(name, "--user")
	if err != nil {
		return err
	}
	path := argv[0]
	if !filepath.IsAbs(path) {
		if path, err = exec.LookPath(path); err != nil {
			return err
		}
	}
	if u.cred != nil {
		for _, v := range jobEnvFiles {
			if err := handToUser(os.Getenv(v), u); err != nil {
				return fmt.Errorf("hand %s to %s: %w", v, u.describe(), err)
			}
		}
		if err := switchTo(u); err != nil {
			return err
		}
	}
	return syscall.Exec(path, argv, jobEnv(os.Environ(), u))
}

// switchTo makes every thread of this process u (syscall's Setgroups,
// Setgid and Setuid apply to all of them on Linux), and checks that there
// is no way back to the old uid.
func switchTo(u *runAs) error {
	groups := make([]int, 0, len(u.cred.Groups))
	for _, g := range u.cred.Groups {
		groups = append(groups, int(g))
	}
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("set the groups of %s: %w", u.describe(), err)
	}
	if err := syscall.Setgid(u.gid); err != nil {
		return fmt.Errorf("set gid %d of %s: %w", u.gid, u.describe(), err)
	}
	if err := syscall.Setuid(u.uid); err != nil {
		return fmt.Errorf("set uid %d of %s: %w", u.uid, u.describe(), err)
	}
	if os.Getuid() != u.uid || os.Geteuid() != u.uid || os.Getgid() != u.gid || os.Getegid() != u.gid {
		return fmt.Errorf("still uid %d/%d gid %d/%d after switching to %s", os.Getuid(), os.Geteuid(), os.Getgid(), os.Getegid(), u)
	}
	return nil
}

// jobEnv is environ without jobEnvDropped, with u's HOME, USER and LOGNAME
// in place of the agent's.
func jobEnv(environ []string, u *runAs) []string {
	out := make([]string, 0, len(environ)+3)
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case slices.Contains(jobEnvDropped, k):
		case u.name != "" && (k == "HOME" || k == "USER" || k == "LOGNAME"):
		default:
			out = append(out, kv)
		}
	}
	if u.name != "" {
		out = append(out, "USER="+u.name, "LOGNAME="+u.name)
		if u.home != "" {
			out = append(out, "HOME="+u.home)
		}
	}
	return out
}

// handToUser gives u the file at path, one buildkite-agent wrote for the
// job: only a regular file (never through a symbolic link) that this
// process's user owns and that no one else may write; anything else, or
// no path, is left alone. The job's environment names the path, and
// buildkite-agent sets that variable over anything the job's own
// environment says, but a check costs nothing.
func handToUser(path string, u *runAs) error {
	if path == "" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ELOOP) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok || !info.Mode().IsRegular() || int(st.Uid) != os.Geteuid() || info.Mode().Perm()&0o022 != 0 {
		return nil
	}
	return f.Chown(u.uid, u.gid)
}
