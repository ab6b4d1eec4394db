package qemu

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// A saved state is a guest stopped at one moment: its RAM and device state
// in a file (QMP migrate to "exec:cat > file") and its disk as it was then
// (the overlay the saved machine booted on, never written again). A clone
// resumes it with a qcow2 overlay of its own backed by that disk and
// Machine.Incoming set to the file: QEMU loads the state instead of
// booting, and the guest goes on where the saved one stopped.
//
// Migration to a file, not savevm: savevm's internal snapshot lives in the
// image it was taken in, and loadvm looks for it in each drive's top image
// only, which for a clone is its own overlay; the migration file is read
// by any number of clones at once.

// SaveState stops p's guest, writes its state to path and ends QEMU. The
// disk p booted on then holds exactly what the state expects: every clone
// resumed from path must be backed by it, and nothing may write to it
// again. The migration flushes the disk before it completes.
func SaveState(ctx context.Context, p *Process, path string) error {
	sock := p.Machine.QMPSocket()
	if _, err := QMP(ctx, sock, "stop", nil); err != nil {
		return fmt.Errorf("save the guest's state: %w", err)
	}
	uri := "exec:cat > " + shellQuote(path)
	if _, err := QMP(ctx, sock, "migrate", map[string]any{"uri": uri}); err != nil {
		return fmt.Errorf("save the guest's state to %s: %w", path, err)
	}
	if err := waitMigration(ctx, sock); err != nil {
		return fmt.Errorf("save the guest's state to %s: %w", path, err)
	}
	if _, err := QMP(ctx, sock, "quit", nil); err != nil && !isClosed(err) {
		return fmt.Errorf("end QEMU after saving its state: %w", err)
	}
	select {
	case <-p.Done():
		return nil
	case <-ctx.Done():
		p.Kill()
		return fmt.Errorf("QEMU did not end after saving its state: %w", ctx.Err())
	}
}

// Resume lets a QEMU started with Machine.Incoming run: it waits until
// the state is loaded and continues the guest, which the saved one left
// stopped (SaveState stops it before writing, so the disk and the state
// agree). A resumed guest's clock still shows the time of the save:
// StepClock it.
func Resume(ctx context.Context, p *Process) error {
	sock := p.Machine.QMPSocket()
	for {
		raw, err := QMP(ctx, sock, "query-status", nil)
		if err != nil {
			select {
			case <-p.Done():
				return fmt.Errorf("resume %s: %w (qemu.log next to its console)", p.Machine.Incoming, ErrNotRunning)
			default:
			}
			// QEMU serves QMP once it has started; until then, retry.
			if ctx.Err() != nil {
				return fmt.Errorf("resume %s: %w", p.Machine.Incoming, err)
			}
		}
		var st struct {
			Status string `json:"status"`
		}
		if err == nil {
			if jerr := json.Unmarshal(raw, &st); jerr != nil {
				return fmt.Errorf("query-status: %w", jerr)
			}
		}
		switch st.Status {
		case "paused", "postmigrate", "prelaunch":
			if _, err := QMP(ctx, sock, "cont", nil); err != nil {
				return fmt.Errorf("resume %s: %w", p.Machine.Incoming, err)
			}
			return nil
		case "running":
			return nil
		case "inmigrate", "":
		default:
			return fmt.Errorf("resume %s: QEMU is %s", p.Machine.Incoming, st.Status)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("resume %s: still %q: %w", p.Machine.Incoming, st.Status, ctx.Err())
		case <-p.Done():
			return fmt.Errorf("resume %s: %w", p.Machine.Incoming, ErrNotRunning)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitMigration polls query-migrate until the migration completed (nil)
// or failed.
func waitMigration(ctx context.Context, sock string) error {
	for {
		raw, err := QMP(ctx, sock, "query-migrate", nil)
		if err != nil {
			return err
		}
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := json.Unmarshal(raw, &st); err != nil {
			return fmt.Errorf("query-migrate: %w", err)
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", st.Status, st.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("migration still %s: %w", st.Status, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// isClosed is a QMP call whose connection QEMU closed under it (quit ends
// QEMU before or after it answers).
func isClosed(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "EOF") || strings.Contains(err.Error(), "connection reset"))
}

// shellQuote quotes s for /bin/sh, which runs QEMU's exec: migration URIs.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// StepClock sets a resumed guest's clock to now: the saved guest's clock
// stopped with it, and after a resume it runs on from the moment of the
// save (the emulated RTC and TSC are part of the state), minutes or days
// behind. TLS certificates, the agent's deadlines and the job's time
// stamps need the real time. guest-set-time with a time sets the system
// clock and then the RTC with hwclock; a guest without hwclock fails the
// call, and date -s sets the system clock instead.
func StepClock(ctx context.Context, socket string, now time.Time) error {
	err := AgentCall(ctx, socket, "guest-set-time", map[string]int64{"time": now.UnixNano()}, nil)
	if err == nil {
		return nil
	}
	res, xerr := AgentExec(ctx, socket, "date", "-u", "-s", "@"+strconv.FormatInt(now.Unix(), 10))
	if xerr != nil {
		return fmt.Errorf("step the guest's clock: %w (guest-set-time: %w)", xerr, err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("step the guest's clock: date -s exited %d: %s (guest-set-time: %w)", res.ExitCode, res.Stderr, err)
	}
	return nil
}

// AgentWriteFile writes data to path in the guest through the guest
// agent (guest-file-open, -write, -close), as the operator places a VM's
// secrets. The agent creates a new file 0666; mode is set afterwards
// with chmod, so content that must stay private goes into a directory
// only root can enter.
func AgentWriteFile(ctx context.Context, socket, path string, data []byte, mode os.FileMode) error {
	var handle int
	if err := AgentCall(ctx, socket, "guest-file-open", map[string]string{"path": path, "mode": "wb"}, &handle); err != nil {
		return fmt.Errorf("write %s in the guest: %w", path, err)
	}
	werr := AgentCall(ctx, socket, "guest-file-write", map[string]any{"handle": handle, "buf-b64": base64.StdEncoding.EncodeToString(data)}, nil)
	cerr := AgentCall(ctx, socket, "guest-file-close", map[string]int{"handle": handle}, nil)
	if err := errors.Join(werr, cerr); err != nil {
		return fmt.Errorf("write %s in the guest: %w", path, err)
	}
	res, err := AgentExec(ctx, socket, "chmod", strconv.FormatUint(uint64(mode.Perm()), 8), path)
	if err != nil {
		return fmt.Errorf("chmod %s in the guest: %w", path, err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("chmod %s in the guest: exit %d: %s", path, res.ExitCode, res.Stderr)
	}
	return nil
}

// CPUTime is the CPU time QEMU has used so far (user and system, all its
// threads: /proc/<pid>/stat's utime and stime), what the guest cost the
// machine. Read it before QEMU exits.
func (p *Process) CPUTime() (time.Duration, error) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(p.Pid()) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("QEMU's CPU time: %w", err)
	}
	// The command name, in parentheses, may hold spaces: fields count
	// from the last ')'.
	i := strings.LastIndexByte(string(raw), ')')
	if i < 0 {
		return 0, fmt.Errorf("QEMU's CPU time: unexpected /proc stat %q", raw)
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("QEMU's CPU time: unexpected /proc stat %q", raw)
	}
	// utime and stime are fields 14 and 15 of stat(5); f[0] is field 3.
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("QEMU's CPU time: %w", err)
	}
	// USER_HZ is 100 on every Linux architecture QEMU runs the tests on.
	return time.Duration(utime+stime) * (time.Second / 100), nil
}
