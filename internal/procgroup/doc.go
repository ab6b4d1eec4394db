// Package procgroup signals the process group of a child that leads one
// (started with Setpgid or Setsid) without ever signalling a group id the
// kernel has since given to another process.
//
// kill(-pgid) is only safe while something holds the id. Once the leader
// is reaped and no member is left, the id is free, and the next process
// that makes a group of its own may get it: pid_max is 32768 on many
// machines, and a busy one wraps it in seconds. A kill sent then ends an
// unrelated group. The leader's zombie holds its id until it is reaped,
// so a Leader waits for the leader's exit without reaping it (waitid with
// WNOWAIT), ends what is left of the group then, and only then reaps; it
// refuses to signal once the leader has exited. Everything that waits for
// the child must go through Leader.Wait.
//
// Windows has no process groups a signal reaches (internal/agent uses a
// job object there), so the package is empty on Windows.
package procgroup
