package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// agentPortName is the virtio-serial port name QEMU's guest agent uses.
const agentPortName = "org.qemu.guest_agent.0"

// request is one QGA command.
type request struct {
	Execute   string          `json:"execute"`
	Arguments json.RawMessage `json:"arguments"`
	ID        json.RawMessage `json:"id,omitempty"`
}

// qgaError is the error object of a reply.
type qgaError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *qgaError) Error() string { return e.Desc }

func genericError(err error) *qgaError {
	var q *qgaError
	if errors.As(err, &q) {
		return q
	}
	return &qgaError{Class: "GenericError", Desc: err.Error()}
}

// noReply is what a handler returns for a command that answers nothing
// on success (guest-shutdown, as in QEMU's agent).
type noReply struct{}

// serveAgent opens the agent's port and answers commands forever in the
// background.
func serveAgent() {
	path, err := waitAgentPort()
	if err != nil {
		logf("agent: %v", err)
		return
	}
	port, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		logf("agent: opening %s: %v", path, err)
		return
	}
	logf("agent: serving on %s", path)
	a := newAgent()
	go a.serve(port, port)
}

// waitAgentPort finds the device of the port named agentPortName in
// /sys/class/virtio-ports (there is no udev to make the
// /dev/virtio-ports/ link).
func waitAgentPort() (string, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		names, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, n := range names {
			raw, err := os.ReadFile(n)
			if err == nil && strings.TrimSpace(string(raw)) == agentPortName {
				return "/dev/" + filepath.Base(filepath.Dir(n)), nil
			}
		}
		if time.Now().After(deadline) {
			return "", errors.New("no virtio-serial port named " + agentPortName)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// portReader reads the agent port, waiting while no host is connected (a
// virtio-serial port then reads as end of file), and drops the 0xFF bytes
// a host sends to reset the agent's parser.
type portReader struct{ r io.Reader }

func (r portReader) Read(p []byte) (int, error) {
	for {
		n, err := r.r.Read(p)
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		kept := 0
		for _, c := range p[:n] {
			if c != 0xFF {
				p[kept] = c
				kept++
			}
		}
		if kept > 0 {
			return kept, nil
		}
		if n == 0 {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// serve decodes commands from the port and writes one reply per line. A
// malformed command (a host that went away mid-command) is dropped up to
// the end of its line, where the next one starts (libvirt ends each
// command with a newline).
func (a *agent) serve(port io.Reader, out io.Writer) {
	in := bufio.NewReader(portReader{port})
	for {
		dec := json.NewDecoder(in)
		for {
			var req request
			if err := dec.Decode(&req); err != nil {
				logf("agent: %v", err)
				in = bufio.NewReader(io.MultiReader(dec.Buffered(), in))
				_, _ = in.ReadString('\n')
				break
			}
			a.reply(out, req)
		}
	}
}

// reply runs one command and writes its answer.
func (a *agent) reply(port io.Writer, req request) {
	result, err := a.dispatch(req)
	if _, ok := result.(noReply); ok && err == nil {
		return
	}
	out := map[string]any{}
	if err != nil {
		out["error"] = genericError(err)
	} else {
		out["return"] = result
	}
	if len(req.ID) > 0 {
		out["id"] = req.ID
	}
	raw, _ := json.Marshal(out)
	a.writeMu.Lock()
	defer a.writeMu.Unlock()
	if req.Execute == "guest-sync-delimited" {
		// The sentinel byte lets the host discard whatever came before.
		raw = append([]byte{0xFF}, raw...)
	}
	if _, err := port.Write(append(raw, '\n')); err != nil {
		logf("agent: reply: %v", err)
	}
}

// powerOff syncs and powers the machine off (or halts, or reboots).
func powerOff(mode string) {
	cmd := unix.LINUX_REBOOT_CMD_POWER_OFF
	switch mode {
	case "halt":
		cmd = unix.LINUX_REBOOT_CMD_HALT
	case "reboot":
		cmd = unix.LINUX_REBOOT_CMD_RESTART
	}
	unix.Sync()
	if err := unix.Reboot(cmd); err != nil {
		logf("power %s: %v", mode, err)
	}
}

// agent holds the state of open files and started processes.
type agent struct {
	writeMu sync.Mutex

	mu         sync.Mutex
	nextHandle int64
	files      map[int64]*os.File
	execs      map[int]*execution
}

func newAgent() *agent {
	return &agent{nextHandle: 1000, files: map[int64]*os.File{}, execs: map[int]*execution{}}
}
