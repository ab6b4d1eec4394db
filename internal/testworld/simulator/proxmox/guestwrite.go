package proxmoxsim

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/qemu"
)

// maxFileWriteContent is qemu-server's limit on file-write's content
// (maxLength 60 KiB, under pveproxy's 64 KiB body limit).
const maxFileWriteContent = 60 * 1024

// newGuestFileMode is the mode QEMU's guest agent gives a file that
// guest-file-open creates: 0666 whatever the umask (qga's
// safe_open_or_create). An existing file keeps its mode.
const newGuestFileMode fs.FileMode = 0o666

// guestFile is a file written into a simulated guest that runs no guest
// program (its stand-in file system is this map).
type guestFile struct {
	content []byte
	mode    fs.FileMode
}

// handleAgentFileWrite is POST .../agent/file-write: qemu-server's
// agent_available checks, then guest-file-open (mode wb), guest-file-write
// and guest-file-close. encode (default 1) has qemu-server base64 the
// content itself; with 0 the content must be base64 already, which the
// guest agent decodes. Where the file lands:
//
//   - a real guest: its own QEMU guest agent is asked, command by command;
//   - a guest run by the guest hook: under its VM directory's root (the
//     HF_SIM_ROOT of GuestConfig.WriteFiles), where the parent directory
//     must exist, as in a guest (/run is there from every boot on, emptied
//     like a tmpfs);
//   - any other VM: a per-VM map that its next stop empties, with every
//     directory taken to exist.
func (s *Simulator) handleAgentFileWrite(q *apiRequest) (any, error) {
	v, err := s.agentReadyLocked(q)
	if err != nil {
		return nil, err
	}
	// With encode (the default) qemu-server encodes the content for the
	// agent, which decodes it: the file holds the content as sent.
	file, content := q.params["file"], []byte(q.params["content"])
	if q.params["encode"] == "0" {
		if content, err = base64.StdEncoding.DecodeString(q.params["content"]); err != nil {
			return nil, fileWriteFailed(v.vmid, "guest-file-write", "Invalid Base64 data")
		}
	}
	if sock := s.real.agentSocketLocked(v.vmid); sock != "" {
		return realFileWrite(v.vmid, sock, file, content), nil
	}
	if s.guest != nil {
		return nil, s.guest.writeFile(v.vmid, file, content)
	}
	if !path.IsAbs(file) {
		return nil, fileWriteFailed(v.vmid, "guest-file-open", fmt.Sprintf("failed to open file '%s' (mode: 'wb'): No such file or directory", file))
	}
	if v.guestFiles == nil {
		v.guestFiles = map[string]guestFile{}
	}
	mode := newGuestFileMode
	if old, ok := v.guestFiles[file]; ok {
		mode = old.mode
	}
	v.guestFiles[file] = guestFile{content: content, mode: mode}
	return nil, nil
}

// fileWriteFailed is the error of a guest agent command that failed, as
// qemu-server's mon_cmd reports it.
func fileWriteFailed(vmid int, cmd, desc string) error {
	return serverError("VM %d qmp command '%s' failed - %s", vmid, cmd, desc)
}

// writeFile writes content at file (a guest path) under the VM's root as
// the guest agent would: a new file is created 0666, an existing one
// truncated and keeps its mode, a missing directory fails.
func (g *guestRunner) writeFile(vmid int, file string, content []byte) error {
	dst := filepath.Join(g.rootDir(vmid), filepath.FromSlash(path.Clean("/"+file)))
	openFailed := func(err error) error {
		desc := err.Error()
		var errno syscall.Errno
		if errors.As(err, &errno) {
			desc = errno.Error()
		}
		// strerror's capital: "No such file or directory".
		if desc != "" {
			desc = strings.ToUpper(desc[:1]) + desc[1:]
		}
		return fileWriteFailed(vmid, "guest-file-open", fmt.Sprintf("failed to open file '%s' (mode: 'wb'): %s", file, desc))
	}
	if !path.IsAbs(file) {
		return openFailed(syscall.ENOENT)
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0)
	switch {
	case err == nil:
		if err := f.Chmod(newGuestFileMode); err != nil {
			_ = f.Close()
			return openFailed(err)
		}
	case errors.Is(err, fs.ErrExist):
		if f, err = os.OpenFile(dst, os.O_WRONLY|os.O_TRUNC, 0); err != nil {
			return openFailed(err)
		}
	default:
		return openFailed(err)
	}
	_, werr := f.Write(content)
	cerr := f.Close()
	if werr != nil {
		return fileWriteFailed(vmid, "guest-file-write", werr.Error())
	}
	if cerr != nil {
		return fileWriteFailed(vmid, "guest-file-close", cerr.Error())
	}
	return nil
}

// rootDir is the directory standing in for the guest's root file system
// (HF_SIM_ROOT with GuestConfig.WriteFiles).
func (g *guestRunner) rootDir(vmid int) string {
	return filepath.Join(g.baseDir, fmt.Sprintf("vm-%d", vmid), "root")
}

// resetRun gives a booting guest an empty /run, as its tmpfs is.
func (g *guestRunner) resetRun(vmid int) error {
	run := filepath.Join(g.rootDir(vmid), "run")
	if err := os.RemoveAll(run); err != nil {
		return err
	}
	return os.MkdirAll(run, 0o755)
}

// realFileWrite has a real guest's QEMU guest agent write the file, with
// the three commands qemu-server sends.
func realFileWrite(vmid int, socket, file string, content []byte) liveAnswer {
	return func(ctx context.Context) (any, error) {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		call := func(cmd string, args, out any) error {
			err := qemu.AgentCall(ctx, socket, cmd, args, out)
			var ce *qemu.CommandError
			switch {
			case err == nil:
				return nil
			case errors.As(err, &ce):
				return fileWriteFailed(vmid, cmd, ce.Desc)
			case qemu.IsTimeout(err):
				return fileWriteFailed(vmid, cmd, "got timeout")
			}
			return serverError("VM %d is not running", vmid)
		}
		var handle int64
		if err := call("guest-file-open", map[string]any{"path": file, "mode": "wb"}, &handle); err != nil {
			return nil, err
		}
		werr := call("guest-file-write", map[string]any{"handle": handle, "buf-b64": base64.StdEncoding.EncodeToString(content)}, nil)
		if err := call("guest-file-close", map[string]any{"handle": handle}, nil); werr == nil {
			werr = err
		}
		return nil, werr
	}
}

// GuestFile returns a file written into the guest of vmid (with
// agent/file-write or by the guest itself) and its mode: from a real
// guest through its guest agent, from a guest hook's VM under its root,
// from the simulated guest's map otherwise. A missing file is an error
// wrapping fs.ErrNotExist.
func (s *Simulator) GuestFile(ctx context.Context, vmid int, file string) ([]byte, fs.FileMode, error) {
	s.mu.Lock()
	v := s.vms[vmid]
	sock := s.real.agentSocketLocked(vmid)
	var (
		stored guestFile
		ok     bool
		root   string
	)
	if v != nil {
		stored, ok = v.guestFiles[file]
	}
	if s.guest != nil {
		root = s.guest.rootDir(vmid)
	}
	s.mu.Unlock()
	switch {
	case v == nil:
		return nil, 0, fmt.Errorf("VM %d does not exist: %w", vmid, fs.ErrNotExist)
	case sock != "":
		return realGuestFile(ctx, vmid, sock, file)
	case root != "":
		dst := filepath.Join(root, filepath.FromSlash(path.Clean("/"+file)))
		fi, err := os.Stat(dst)
		if err != nil {
			return nil, 0, err
		}
		b, err := os.ReadFile(dst)
		return b, fi.Mode().Perm(), err
	case !ok:
		return nil, 0, fmt.Errorf("VM %d: %s: %w", vmid, file, fs.ErrNotExist)
	}
	return append([]byte(nil), stored.content...), stored.mode, nil
}

// realGuestFile reads a file and its mode in a real guest (guest-exec of
// stat and base64, which qm guest exec would run).
func realGuestFile(ctx context.Context, vmid int, socket, file string) ([]byte, fs.FileMode, error) {
	res, err := qemu.AgentExec(ctx, socket, "/bin/sh", "-c", `stat -c %a "$1" && base64 -w0 "$1"`, "sh", file)
	if err != nil {
		return nil, 0, fmt.Errorf("VM %d: %w", vmid, err)
	}
	if res.ExitCode != 0 {
		return nil, 0, fmt.Errorf("VM %d: %s: %s: %w", vmid, file, res.Stderr, fs.ErrNotExist)
	}
	var mode uint32
	var b64 string
	if _, err := fmt.Sscanf(res.Stdout, "%o\n%s", &mode, &b64); err != nil {
		return nil, 0, fmt.Errorf("VM %d: read %s: %q: %w", vmid, file, res.Stdout, err)
	}
	b, err := base64.StdEncoding.DecodeString(b64)
	return b, fs.FileMode(mode), err
}

// fileWritePath is POST .../agent/file-write's path, with the VM id.
var fileWritePath = regexp.MustCompile(`/nodes/[^/]+/qemu/([0-9]+)/agent/file-write$`)

// FileWriteRequest is, for a request hook that sees requests before the
// simulator (such as the tests' record of what the operator wrote into
// guests), the VM and the content of an agent/file-write request, as the
// guest would receive it; ok is false for any other request. It reads the
// request's body and puts it back for the simulator.
func FileWriteRequest(r *http.Request) (vmid int, content []byte, ok bool) {
	m := fileWritePath.FindStringSubmatch(r.URL.Path)
	if r.Method != http.MethodPost || m == nil {
		return 0, nil, false
	}
	params, ok := hookParams(r)
	if !ok {
		return 0, nil, false
	}
	content = []byte(params["content"])
	if params["encode"] == "0" {
		var err error
		if content, err = base64.StdEncoding.DecodeString(params["content"]); err != nil {
			return 0, nil, false
		}
	}
	vmid, _ = strconv.Atoi(m[1])
	return vmid, content, true
}

// clonePath is POST .../qemu/{vmid}/clone's path.
var clonePath = regexp.MustCompile(`/nodes/[^/]+/qemu/[0-9]+/clone$`)

// CloneRequest is, for a request hook, the new VM's id and name of a clone
// request (whether or not the simulator then makes the VM); ok is false for
// any other request. A hook sees every clone, however short-lived the VM:
// a poll of the simulator's state can miss a VM that lives less than one
// poll, as a loaded machine's can. It reads the request's body and puts it
// back for the simulator.
func CloneRequest(r *http.Request) (newid int, name string, ok bool) {
	if r.Method != http.MethodPost || !clonePath.MatchString(r.URL.Path) {
		return 0, "", false
	}
	params, ok := hookParams(r)
	if !ok {
		return 0, "", false
	}
	newid, err := strconv.Atoi(params["newid"])
	if err != nil {
		return 0, "", false
	}
	return newid, params["name"], true
}

// hookParams reads a request's parameters (a JSON or form body, as the
// simulator accepts them) for a request hook, and puts the body back.
func hookParams(r *http.Request) (map[string]string, bool) {
	if r.Body == nil {
		return nil, false
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	_ = r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return nil, false
	}
	params := map[string]string{}
	var js map[string]any
	if json.Unmarshal(body, &js) == nil {
		for k, v := range js {
			params[k] = fmt.Sprint(v)
		}
	} else if form, err := url.ParseQuery(string(body)); err == nil {
		for k := range form {
			params[k] = form.Get(k)
		}
	}
	return params, true
}
