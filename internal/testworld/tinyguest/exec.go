package tinyguest

import (
	"fmt"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"
)

// Result is how a program run with Exec ended.
type Result struct {
	Stdout, Stderr string
	ExitCode       int
}

// execLimit bounds how long Exec waits for a program.
const execLimit = 30 * time.Second

// Start starts /init as one of its tools (args, such as "serve", "8080")
// in the guest through guest-exec and returns its PID in the guest,
// without waiting for it.
func Start(conn *libvirt.Libvirt, dom libvirt.Domain, args ...string) (int, error) {
	var started struct {
		PID int `json:"pid"`
	}
	err := agentCall(conn, dom, "guest-exec", map[string]any{"path": "/init", "arg": args, "capture-output": true}, &started)
	if err != nil {
		return 0, fmt.Errorf("tinyguest: starting %s in %s: %w", strings.Join(args, " "), dom.Name, err)
	}
	return started.PID, nil
}

// Exec runs /init as one of its tools in the guest (Start) and waits for
// its end: "echo", "cat" and "false", and a network test's "dial
// HOST:PORT" (a TCP connection, exit code 1 when none is made within 3
// s), "serve PORT" (answers every connection with a line naming the
// guest; Start it), "readdress ADDRESS/PREFIX" (the NIC's IPv4
// address replaced) and "remac MAC" (its MAC address replaced).
func Exec(conn *libvirt.Libvirt, dom libvirt.Domain, args ...string) (Result, error) {
	pid, err := Start(conn, dom, args...)
	if err != nil {
		return Result{}, err
	}
	deadline := time.Now().Add(execLimit)
	for {
		var st struct {
			Exited   bool   `json:"exited"`
			ExitCode int    `json:"exitcode"`
			Out      []byte `json:"out-data"`
			Err      []byte `json:"err-data"`
		}
		if err := agentCall(conn, dom, "guest-exec-status", map[string]int{"pid": pid}, &st); err != nil {
			return Result{}, fmt.Errorf("tinyguest: waiting for %s in %s: %w", strings.Join(args, " "), dom.Name, err)
		}
		if st.Exited {
			return Result{Stdout: string(st.Out), Stderr: string(st.Err), ExitCode: st.ExitCode}, nil
		}
		if time.Now().After(deadline) {
			return Result{}, fmt.Errorf("tinyguest: %s in %s still runs after %s", strings.Join(args, " "), dom.Name, execLimit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
