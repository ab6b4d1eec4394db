package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"time"
)

// reply is one JSON object from QMP or the guest agent: a command's return
// value or error, or (QMP only) an asynchronous event.
type reply struct {
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	Event string          `json:"event"`
	QMP   json.RawMessage `json:"QMP"`
}

// CommandError is an error reply of QMP or the guest agent.
type CommandError struct {
	Command, Class, Desc string
}

func (e *CommandError) Error() string {
	return fmt.Sprintf("%s failed: %s: %s", e.Command, e.Class, e.Desc)
}

type request struct {
	Execute   string `json:"execute"`
	Arguments any    `json:"arguments,omitempty"`
}

// conn is a JSON stream over a unix socket with deadlines from a context.
type conn struct {
	c   net.Conn
	r   *bufio.Reader
	dec *json.Decoder
}

func newConn(c net.Conn) *conn {
	r := bufio.NewReader(c)
	return &conn{c: c, r: r, dec: json.NewDecoder(r)}
}

func (c *conn) deadline(ctx context.Context, fallback time.Duration) {
	d, ok := ctx.Deadline()
	if !ok {
		d = time.Now().Add(fallback)
	}
	_ = c.c.SetDeadline(d)
}

func (c *conn) send(cmd string, args any) error {
	b, err := json.Marshal(request{Execute: cmd, Arguments: args})
	if err != nil {
		return fmt.Errorf("encode %s: %w", cmd, err)
	}
	if _, err := c.c.Write(b); err != nil {
		return fmt.Errorf("send %s: %w", cmd, err)
	}
	return nil
}

// QMP runs monitor commands on one QEMU (power button, quit, eject).
// Commands are sent one at a time on a fresh connection: QEMU serves one
// monitor client per socket, and these calls are rare.
func QMP(ctx context.Context, socket, cmd string, args any) (json.RawMessage, error) {
	nc, err := dialUnix(socket)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	c := newConn(nc)
	c.deadline(ctx, 10*time.Second)
	var greeting reply
	if err := c.dec.Decode(&greeting); err != nil || greeting.QMP == nil {
		return nil, fmt.Errorf("QMP greeting on %s: %w", socket, err)
	}
	if _, err := c.call("qmp_capabilities", nil); err != nil {
		return nil, err
	}
	return c.call(cmd, args)
}

// call sends cmd and returns its reply, skipping QMP events.
func (c *conn) call(cmd string, args any) (json.RawMessage, error) {
	if err := c.send(cmd, args); err != nil {
		return nil, err
	}
	for {
		var r reply
		if err := c.dec.Decode(&r); err != nil {
			return nil, fmt.Errorf("%s: read reply: %w", cmd, err)
		}
		if r.Event != "" {
			continue
		}
		if r.Error != nil {
			return nil, &CommandError{Command: cmd, Class: r.Error.Class, Desc: r.Error.Desc}
		}
		return r.Return, nil
	}
}
