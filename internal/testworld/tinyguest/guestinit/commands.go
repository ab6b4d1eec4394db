package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// agentVersion is what guest-info reports.
const agentVersion = "7.2.0-tinyguest"

// handlers maps each supported command to its implementation.
var handlers map[string]func(a *agent, args json.RawMessage) (any, error)

func init() {
	handlers = map[string]func(a *agent, args json.RawMessage) (any, error){
		"guest-sync":                   guestSync,
		"guest-sync-delimited":         guestSync,
		"guest-ping":                   func(*agent, json.RawMessage) (any, error) { return struct{}{}, nil },
		"guest-info":                   guestInfo,
		"guest-get-osinfo":             guestOSInfo,
		"guest-get-host-name":          guestHostName,
		"guest-network-get-interfaces": guestInterfaces,
		"guest-file-open":              (*agent).fileOpen,
		"guest-file-read":              (*agent).fileRead,
		"guest-file-write":             (*agent).fileWrite,
		"guest-file-seek":              (*agent).fileSeek,
		"guest-file-flush":             (*agent).fileFlush,
		"guest-file-close":             (*agent).fileClose,
		"guest-exec":                   (*agent).exec,
		"guest-exec-status":            (*agent).execStatus,
		"guest-shutdown":               guestShutdown,
	}
}

func (a *agent) dispatch(req request) (any, error) {
	h, ok := handlers[req.Execute]
	if !ok {
		return nil, &qgaError{Class: "CommandNotFound", Desc: fmt.Sprintf("The command %s has not been found", req.Execute)}
	}
	return h(a, req.Arguments)
}

// decodeArgs unmarshals a command's arguments (absent is empty).
func decodeArgs(args json.RawMessage, v any) error {
	if len(args) == 0 {
		return nil
	}
	if err := json.Unmarshal(args, v); err != nil {
		return &qgaError{Class: "GenericError", Desc: "Invalid parameter: " + err.Error()}
	}
	return nil
}

func guestSync(_ *agent, args json.RawMessage) (any, error) {
	var in struct {
		ID *int64 `json:"id"`
	}
	if err := decodeArgs(args, &in); err != nil {
		return nil, err
	}
	if in.ID == nil {
		return nil, &qgaError{Class: "GenericError", Desc: "Parameter 'id' is missing"}
	}
	return *in.ID, nil
}

func guestInfo(*agent, json.RawMessage) (any, error) {
	type command struct {
		Name            string `json:"name"`
		Enabled         bool   `json:"enabled"`
		SuccessResponse bool   `json:"success-response"`
	}
	names := make([]string, 0, len(handlers))
	for n := range handlers {
		names = append(names, n)
	}
	sort.Strings(names)
	cmds := make([]command, 0, len(names))
	for _, n := range names {
		cmds = append(cmds, command{Name: n, Enabled: true, SuccessResponse: n != "guest-shutdown"})
	}
	return map[string]any{"version": agentVersion, "supported_commands": cmds}, nil
}

func guestOSInfo(*agent, json.RawMessage) (any, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return nil, err
	}
	return map[string]string{
		"id":             "tinyguest",
		"name":           "tinyguest",
		"pretty-name":    "tinyguest (HyperFleet test guest)",
		"version":        "1",
		"version-id":     "1",
		"kernel-release": unix.ByteSliceToString(u.Release[:]),
		"kernel-version": unix.ByteSliceToString(u.Version[:]),
		"machine":        unix.ByteSliceToString(u.Machine[:]),
	}, nil
}

func guestHostName(*agent, json.RawMessage) (any, error) {
	name, err := os.Hostname()
	if err != nil {
		return nil, err
	}
	return map[string]string{"host-name": name}, nil
}

// guestInterfaces reports every interface with its kernel addresses.
func guestInterfaces(*agent, json.RawMessage) (any, error) {
	type ipAddress struct {
		Type    string `json:"ip-address-type"`
		Address string `json:"ip-address"`
		Prefix  int    `json:"prefix"`
	}
	type iface struct {
		Name     string      `json:"name"`
		Hardware string      `json:"hardware-address,omitempty"`
		Addrs    []ipAddress `json:"ip-addresses"`
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	out := []iface{}
	for _, i := range ifaces {
		hw := i.HardwareAddr.String()
		if i.Flags&net.FlagLoopback != 0 {
			hw = "00:00:00:00:00:00"
		}
		entry := iface{Name: i.Name, Hardware: hw, Addrs: []ipAddress{}}
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ones, _ := ipn.Mask.Size()
			kind := "ipv6"
			if ipn.IP.To4() != nil {
				kind = "ipv4"
			}
			entry.Addrs = append(entry.Addrs, ipAddress{Type: kind, Address: ipn.IP.String(), Prefix: ones})
		}
		out = append(out, entry)
	}
	return out, nil
}

func guestShutdown(_ *agent, args json.RawMessage) (any, error) {
	var in struct {
		Mode string `json:"mode"`
	}
	if err := decodeArgs(args, &in); err != nil {
		return nil, err
	}
	switch in.Mode {
	case "", "powerdown", "halt", "reboot":
	default:
		return nil, &qgaError{Class: "GenericError", Desc: "Invalid parameter 'mode'"}
	}
	go powerOff(in.Mode)
	return noReply{}, nil
}

// openFlags maps fopen modes to open flags, as QEMU's agent does.
var openFlags = map[string]int{
	"r": os.O_RDONLY, "w": os.O_WRONLY | os.O_CREATE | os.O_TRUNC, "a": os.O_WRONLY | os.O_CREATE | os.O_APPEND,
	"r+": os.O_RDWR, "w+": os.O_RDWR | os.O_CREATE | os.O_TRUNC, "a+": os.O_RDWR | os.O_CREATE | os.O_APPEND,
}

// newFileMode is the mode of a file guest-file-open creates, whatever the
// umask: QEMU's agent creates it exclusively and then fchmods it.
const newFileMode = 0o666

func (a *agent) fileOpen(args json.RawMessage) (any, error) {
	var in struct {
		Path string `json:"path"`
		Mode string `json:"mode"`
	}
	if err := decodeArgs(args, &in); err != nil {
		return nil, err
	}
	if in.Mode == "" {
		in.Mode = "r"
	}
	flags, ok := openFlags[strings.ReplaceAll(in.Mode, "b", "")]
	if !ok {
		return nil, fmt.Errorf("invalid file open mode '%s'", in.Mode)
	}
	f, err := openAsQGA(in.Path, flags)
	if err != nil {
		return nil, fmt.Errorf("failed to open file '%s' (mode: '%s'): %w", in.Path, in.Mode, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.nextHandle++
	a.files[a.nextHandle] = f
	return a.nextHandle, nil
}

// openAsQGA opens path; a file it creates gets newFileMode.
func openAsQGA(path string, flags int) (*os.File, error) {
	if flags&os.O_CREATE == 0 {
		return os.OpenFile(path, flags, 0)
	}
	f, err := os.OpenFile(path, flags|os.O_EXCL, 0)
	if errors.Is(err, os.ErrExist) {
		return os.OpenFile(path, flags&^os.O_CREATE, 0)
	}
	if err != nil {
		return nil, err
	}
	if err := f.Chmod(newFileMode); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

func (a *agent) file(handle int64) (*os.File, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f, ok := a.files[handle]
	if !ok {
		return nil, fmt.Errorf("handle '%d' has not been found", handle)
	}
	return f, nil
}

// maxReadCount is QEMU's agent's limit on one guest-file-read.
const maxReadCount = 48 << 20

func (a *agent) fileRead(args json.RawMessage) (any, error) {
	var in struct {
		Handle int64  `json:"handle"`
		Count  *int64 `json:"count"`
	}
	if err := decodeArgs(args, &in); err != nil {
		return nil, err
	}
	count := int64(4096)
	if in.Count != nil {
		count = *in.Count
	}
	if count < 0 || count > maxReadCount {
		return nil, fmt.Errorf("value '%d' is invalid for argument count", count)
	}
	f, err := a.file(in.Handle)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, count)
	n, err := io.ReadFull(f, buf)
	eof := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
	if err != nil && !eof {
		return nil, fmt.Errorf("failed to read file: %w", err)
	}
	return map[string]any{"count": n, "buf-b64": base64.StdEncoding.EncodeToString(buf[:n]), "eof": eof}, nil
}

func (a *agent) fileWrite(args json.RawMessage) (any, error) {
	var in struct {
		Handle int64  `json:"handle"`
		Buf    string `json:"buf-b64"`
		Count  *int   `json:"count"`
	}
	if err := decodeArgs(args, &in); err != nil {
		return nil, err
	}
	data, err := base64.StdEncoding.DecodeString(in.Buf)
	if err != nil {
		return nil, fmt.Errorf("invalid base64 data: %w", err)
	}
	if in.Count != nil {
		if *in.Count < 0 || *in.Count > len(data) {
			return nil, fmt.Errorf("value '%d' is invalid for argument count", *in.Count)
		}
		data = data[:*in.Count]
	}
	f, err := a.file(in.Handle)
	if err != nil {
		return nil, err
	}
	n, err := f.Write(data)
	if err != nil {
		return nil, fmt.Errorf("failed to write to file: %w", err)
	}
	return map[string]any{"count": n, "eof": false}, nil
}

func (a *agent) fileSeek(args json.RawMessage) (any, error) {
	var in struct {
		Handle int64           `json:"handle"`
		Offset int64           `json:"offset"`
		Whence json.RawMessage `json:"whence"`
	}
	if err := decodeArgs(args, &in); err != nil {
		return nil, err
	}
	whence := 0
	var name string
	switch {
	case json.Unmarshal(in.Whence, &whence) == nil:
	case json.Unmarshal(in.Whence, &name) == nil:
		whence = map[string]int{"set": 0, "cur": 1, "end": 2}[name]
	}
	f, err := a.file(in.Handle)
	if err != nil {
		return nil, err
	}
	pos, err := f.Seek(in.Offset, whence)
	if err != nil {
		return nil, fmt.Errorf("failed to seek file: %w", err)
	}
	return map[string]any{"position": pos, "eof": false}, nil
}

func (a *agent) fileFlush(args json.RawMessage) (any, error) {
	var in struct {
		Handle int64 `json:"handle"`
	}
	if err := decodeArgs(args, &in); err != nil {
		return nil, err
	}
	f, err := a.file(in.Handle)
	if err != nil {
		return nil, err
	}
	return struct{}{}, f.Sync()
}

func (a *agent) fileClose(args json.RawMessage) (any, error) {
	var in struct {
		Handle int64 `json:"handle"`
	}
	if err := decodeArgs(args, &in); err != nil {
		return nil, err
	}
	a.mu.Lock()
	f, ok := a.files[in.Handle]
	delete(a.files, in.Handle)
	a.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("handle '%d' has not been found", in.Handle)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("failed to close handle: %w", err)
	}
	return struct{}{}, nil
}

// execution is a process guest-exec started.
type execution struct {
	done     chan struct{}
	out, err bytes.Buffer
	capture  bool
	exitCode int
	mu       sync.Mutex
}

func (a *agent) exec(args json.RawMessage) (any, error) {
	var in struct {
		Path          string   `json:"path"`
		Arg           []string `json:"arg"`
		Env           []string `json:"env"`
		InputData     string   `json:"input-data"`
		CaptureOutput bool     `json:"capture-output"`
	}
	if err := decodeArgs(args, &in); err != nil {
		return nil, err
	}
	input, err := base64.StdEncoding.DecodeString(in.InputData)
	if err != nil {
		return nil, fmt.Errorf("invalid base64 input-data: %w", err)
	}
	cmd := exec.Command(in.Path, in.Arg...)
	cmd.Env = in.Env
	cmd.Stdin = bytes.NewReader(input)
	e := &execution{done: make(chan struct{}), capture: in.CaptureOutput}
	if in.CaptureOutput {
		cmd.Stdout, cmd.Stderr = &e.out, &e.err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("guest-exec: %w", err)
	}
	pid := cmd.Process.Pid
	a.mu.Lock()
	a.execs[pid] = e
	a.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		e.mu.Lock()
		e.exitCode = cmd.ProcessState.ExitCode()
		e.mu.Unlock()
		close(e.done)
	}()
	return map[string]int{"pid": pid}, nil
}

func (a *agent) execStatus(args json.RawMessage) (any, error) {
	var in struct {
		PID int `json:"pid"`
	}
	if err := decodeArgs(args, &in); err != nil {
		return nil, err
	}
	a.mu.Lock()
	e, ok := a.execs[in.PID]
	a.mu.Unlock()
	if !ok {
		// QEMU's agent's own words.
		return nil, &qgaError{Class: "GenericError", Desc: "Invalid parameter 'pid'"}
	}
	select {
	case <-e.done:
	default:
		return map[string]any{"exited": false}, nil
	}
	a.mu.Lock()
	delete(a.execs, in.PID) // QEMU's agent forgets a reported process
	a.mu.Unlock()
	out := map[string]any{"exited": true, "exitcode": e.exitCode}
	if e.capture {
		out["out-data"] = base64.StdEncoding.EncodeToString(e.out.Bytes())
		out["err-data"] = base64.StdEncoding.EncodeToString(e.err.Bytes())
	}
	return out, nil
}
