package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// agentConn is a test's end of an agent: commands in, replies out.
type agentConn struct {
	t   *testing.T
	in  io.Writer
	out *bufio.Reader
}

func startAgent(t *testing.T) *agentConn {
	t.Helper()
	cmdR, cmdW := io.Pipe()
	repR, repW := io.Pipe()
	go newAgent().serve(cmdR, repW)
	t.Cleanup(func() { _ = cmdW.Close(); _ = repR.Close() })
	return &agentConn{t: t, in: cmdW, out: bufio.NewReader(repR)}
}

// call sends raw and returns the reply line.
func (c *agentConn) call(raw string) []byte {
	c.t.Helper()
	if _, err := io.WriteString(c.in, raw+"\n"); err != nil {
		c.t.Fatal(err)
	}
	line, err := c.out.ReadBytes('\n')
	if err != nil {
		c.t.Fatal(err)
	}
	return line
}

// ret sends a command and decodes its "return" into v, failing on an
// error reply.
func (c *agentConn) ret(cmd string, v any) {
	c.t.Helper()
	var reply struct {
		Return json.RawMessage `json:"return"`
		Error  *qgaError       `json:"error"`
	}
	line := c.call(cmd)
	if err := json.Unmarshal(line, &reply); err != nil || reply.Error != nil {
		c.t.Fatalf("%s: %s (%v)", cmd, line, err)
	}
	if v != nil {
		if err := json.Unmarshal(reply.Return, v); err != nil {
			c.t.Fatalf("%s: %s: %v", cmd, reply.Return, err)
		}
	}
}

func TestAgentProtocol(t *testing.T) {
	c := startAgent(t)
	var id int64
	c.ret(`{"execute":"guest-sync","arguments":{"id":12345}}`, &id)
	if id != 12345 {
		t.Errorf("guest-sync returned %d", id)
	}
	// A host resets the parser with 0xFF; guest-sync-delimited answers
	// after a 0xFF of its own.
	line := c.call("\xff" + `{"execute":"guest-sync-delimited","arguments":{"id":7}}`)
	if !bytes.Equal(line, []byte("\xff{\"return\":7}\n")) {
		t.Errorf("guest-sync-delimited: %q", line)
	}
	if got := string(c.call(`{"execute":"guest-ping","id":"a1"}`)); got != `{"id":"a1","return":{}}`+"\n" {
		t.Errorf("guest-ping with an id: %s", got)
	}
	var e struct {
		Error qgaError `json:"error"`
	}
	if err := json.Unmarshal(c.call(`{"execute":"guest-frobnicate"}`), &e); err != nil || e.Error.Class != "CommandNotFound" {
		t.Errorf("unknown command: %+v, %v", e, err)
	}
	var info struct {
		Commands []struct {
			Name            string `json:"name"`
			SuccessResponse bool   `json:"success-response"`
		} `json:"supported_commands"`
	}
	c.ret(`{"execute":"guest-info"}`, &info)
	for _, cmd := range info.Commands {
		if cmd.Name == "guest-shutdown" && cmd.SuccessResponse {
			t.Error("guest-shutdown claims a success response")
		}
	}
	if len(info.Commands) != len(handlers) {
		t.Errorf("guest-info lists %d commands, the agent has %d", len(info.Commands), len(handlers))
	}
	// A malformed command costs the decoder, not the agent.
	// A malformed command and a good one in one write: the good one is
	// answered.
	line = c.call(`{"execute": [}` + "\n" + `{"execute":"guest-sync","arguments":{"id":8}}`)
	if string(line) != `{"return":8}`+"\n" {
		t.Errorf("after a malformed command: %s", line)
	}
}

// TestAgentFiles: files behave as with QEMU's agent: a new file is 0666
// whatever the umask, "a" appends, reads report end of file, a closed
// handle is gone.
func TestAgentFiles(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	c := startAgent(t)
	path := filepath.Join(t.TempDir(), "f")
	write := func(mode, data string) {
		var h int64
		c.ret(`{"execute":"guest-file-open","arguments":{"path":"`+path+`","mode":"`+mode+`"}}`, &h)
		c.ret(`{"execute":"guest-file-write","arguments":{"handle":`+itoa(h)+`,"buf-b64":"`+base64.StdEncoding.EncodeToString([]byte(data))+`"}}`, nil)
		c.ret(`{"execute":"guest-file-close","arguments":{"handle":`+itoa(h)+`}}`, nil)
	}
	write("w", "hello ")
	write("a", "world")
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o666 {
		t.Errorf("new file mode %v, want 0666", st.Mode().Perm())
	}
	var h int64
	c.ret(`{"execute":"guest-file-open","arguments":{"path":"`+path+`"}}`, &h)
	var chunk struct {
		Count int    `json:"count"`
		Buf   string `json:"buf-b64"`
		EOF   bool   `json:"eof"`
	}
	c.ret(`{"execute":"guest-file-read","arguments":{"handle":`+itoa(h)+`,"count":5}}`, &chunk)
	if got, _ := base64.StdEncoding.DecodeString(chunk.Buf); string(got) != "hello" || chunk.EOF {
		t.Errorf("first read %q eof=%v", got, chunk.EOF)
	}
	c.ret(`{"execute":"guest-file-read","arguments":{"handle":`+itoa(h)+`}}`, &chunk)
	if got, _ := base64.StdEncoding.DecodeString(chunk.Buf); string(got) != " world" || !chunk.EOF {
		t.Errorf("second read %q eof=%v", got, chunk.EOF)
	}
	c.ret(`{"execute":"guest-file-close","arguments":{"handle":`+itoa(h)+`}}`, nil)
	if !strings.Contains(string(c.call(`{"execute":"guest-file-read","arguments":{"handle":`+itoa(h)+`}}`)), `"error"`) {
		t.Error("a closed handle still reads")
	}
	if !strings.Contains(string(c.call(`{"execute":"guest-file-open","arguments":{"path":"`+path+`.absent"}}`)), `"error"`) {
		t.Error("opening a missing file for reading succeeded")
	}
}

func TestAgentExec(t *testing.T) {
	c := startAgent(t)
	var started struct {
		PID int `json:"pid"`
	}
	c.ret(`{"execute":"guest-exec","arguments":{"path":"/bin/sh","arg":["-c","cat; echo err >&2; exit 3"],"input-data":"`+
		base64.StdEncoding.EncodeToString([]byte("in"))+`","capture-output":true}}`, &started)
	var st struct {
		Exited   bool   `json:"exited"`
		ExitCode int    `json:"exitcode"`
		Out      string `json:"out-data"`
		Err      string `json:"err-data"`
	}
	for !st.Exited {
		c.ret(`{"execute":"guest-exec-status","arguments":{"pid":`+itoa(int64(started.PID))+`}}`, &st)
	}
	out, _ := base64.StdEncoding.DecodeString(st.Out)
	errOut, _ := base64.StdEncoding.DecodeString(st.Err)
	if st.ExitCode != 3 || string(out) != "in" || string(errOut) != "err\n" {
		t.Errorf("exec: code %d out %q err %q", st.ExitCode, out, errOut)
	}
	if !strings.Contains(string(c.call(`{"execute":"guest-exec-status","arguments":{"pid":`+itoa(int64(started.PID))+`}}`)), `"error"`) {
		t.Error("a reported process is still known")
	}
}

func itoa(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func TestIsPowerPress(t *testing.T) {
	ev := func(typ, code uint16, value int32) []byte {
		b := make([]byte, inputEventSize)
		binary.LittleEndian.PutUint16(b[16:], typ)
		binary.LittleEndian.PutUint16(b[18:], code)
		binary.LittleEndian.PutUint32(b[20:], uint32(value))
		return b
	}
	if !isPowerPress(ev(evKey, keyPower, 1)) {
		t.Error("KEY_POWER down not recognised")
	}
	for _, b := range [][]byte{ev(evKey, keyPower, 0), ev(evKey, 115, 1), ev(0, keyPower, 1)} {
		if isPowerPress(b) {
			t.Errorf("%x taken for a power press", b)
		}
	}
}
