package qemu

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// delimiter is the byte the guest agent sends before its answer to
// guest-sync-delimited, and that a client sends to reset the agent's
// parser: whatever a previous, abandoned client left in the channel is
// skipped up to it.
const delimiter = 0xFF

// AgentCall runs one guest agent command through QEMU's virtio-serial
// socket and decodes its return value into out (when not nil). Each call
// opens the socket, resynchronises with guest-sync-delimited (a fresh id,
// so a late answer to an earlier client is never taken for this one) and
// closes it. An agent that is not running yet never answers: the call
// ends with ctx.
func AgentCall(ctx context.Context, socket, cmd string, args, out any) error {
	nc, err := dialUnix(socket)
	if err != nil {
		return err
	}
	defer nc.Close()
	c := newConn(nc)
	c.deadline(ctx, 10*time.Second)
	id := rand.Int64N(1 << 50)
	if _, err := c.c.Write([]byte{delimiter}); err != nil {
		return fmt.Errorf("guest agent: reset: %w", err)
	}
	if err := c.send("guest-sync-delimited", map[string]int64{"id": id}); err != nil {
		return fmt.Errorf("guest agent: %w", err)
	}
	for synced := false; !synced; {
		if _, err := c.r.ReadBytes(delimiter); err != nil {
			return fmt.Errorf("guest agent: sync: %w", err)
		}
		c.dec = json.NewDecoder(c.r)
		var r reply
		if err := c.dec.Decode(&r); err != nil {
			return fmt.Errorf("guest agent: sync: %w", err)
		}
		var got int64
		synced = json.Unmarshal(r.Return, &got) == nil && got == id
	}
	raw, err := c.call(cmd, args)
	if err != nil {
		return fmt.Errorf("guest agent: %w", err)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("guest agent: decode %s: %w", cmd, err)
		}
	}
	return nil
}

// ExecResult is a program's outcome in the guest.
type ExecResult struct {
	ExitCode       int
	Stdout, Stderr string
}

// AgentExec runs argv in the guest (guest-exec), waits for it by polling
// guest-exec-status, and returns its exit code and output: what
// `qm guest exec` does on Proxmox.
func AgentExec(ctx context.Context, socket string, argv ...string) (ExecResult, error) {
	pid, err := AgentStart(ctx, socket, argv...)
	if err != nil {
		return ExecResult{}, err
	}
	call := func(cmd string, args, out any) error {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return AgentCall(cctx, socket, cmd, args, out)
	}
	// Most programs end within milliseconds: poll soon, then less
	// often, up to once a second.
	wait := 25 * time.Millisecond
	for {
		var st struct {
			Exited   bool   `json:"exited"`
			ExitCode int    `json:"exitcode"`
			Signal   int    `json:"signal"`
			OutData  string `json:"out-data"`
			ErrData  string `json:"err-data"`
		}
		if err := call("guest-exec-status", map[string]int{"pid": pid}, &st); err != nil {
			return ExecResult{}, fmt.Errorf("wait for %s in the guest: %w", argv[0], err)
		}
		if st.Exited {
			out, _ := base64.StdEncoding.DecodeString(st.OutData)
			errOut, _ := base64.StdEncoding.DecodeString(st.ErrData)
			res := ExecResult{ExitCode: st.ExitCode, Stdout: string(out), Stderr: string(errOut)}
			if st.Signal != 0 {
				res.ExitCode = 128 + st.Signal
			}
			return res, nil
		}
		select {
		case <-ctx.Done():
			return ExecResult{}, fmt.Errorf("wait for %s in the guest: %w", argv[0], ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// AgentStart starts argv in the guest (guest-exec) and returns its PID
// there without waiting for it: a server a test runs in the guest.
func AgentStart(ctx context.Context, socket string, argv ...string) (int, error) {
	var started struct {
		PID int `json:"pid"`
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := AgentCall(cctx, socket, "guest-exec", map[string]any{"path": argv[0], "arg": argv[1:], "capture-output": true}, &started); err != nil {
		return 0, fmt.Errorf("run %s in the guest: %w", strings.Join(argv, " "), err)
	}
	return started.PID, nil
}

// WaitAgent polls guest-ping until the guest agent answers or ctx ends.
func WaitAgent(ctx context.Context, socket string, done <-chan struct{}) error {
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := AgentCall(cctx, socket, "guest-ping", nil, nil)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the guest agent did not answer: %w (last: %w)", ctx.Err(), err)
		case <-done:
			return ErrNotRunning
		case <-time.After(2 * time.Second):
		}
	}
}

// IsTimeout reports whether err is a call that got no answer in time (the
// agent is not running yet, or is busy).
func IsTimeout(err error) bool {
	var ne interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
