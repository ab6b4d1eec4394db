package proxmoxsim

import (
	"context"
	"encoding/base64"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// startVM150 clones template 9000 to VM 150 and starts it; with zero
// latencies its guest agent answers once the clock has run its events.
func startVM150(e *simEnv) {
	e.t.Helper()
	e.wantExit(e.clone("150", nil), "OK")
	e.wantExit(e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/150/status/start", nil)), "OK")
	e.clock.Advance(time.Second)
}

func fileWrite(e *simEnv, vmid, file, content string, encode bool) apiResp {
	e.t.Helper()
	p := form("file", file, "content", content)
	if !encode {
		p.Set("encode", "0")
	}
	return e.call(http.MethodPost, "/nodes/pve1/qemu/"+vmid+"/agent/file-write", p)
}

// TestAgentFileWrite: agent/file-write follows qemu-server (the agent's
// checks first, content up to 60 KiB, encode) and the guest agent (a new
// file 0666, an existing one keeps its mode); a simulated guest without a
// program keeps the file until the VM stops.
func TestAgentFileWrite(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	e.wantExit(e.clone("150", nil), "OK")
	if r := fileWrite(e, "150", "/run/x", "a", true); r.code != 500 || !strings.Contains(r.status, "VM 150 is not running") {
		t.Fatalf("file-write into a stopped VM: %s", r.status)
	}
	e.mustOK(e.call(http.MethodPut, "/nodes/pve1/qemu/150/config", form("agent", "0")))
	if r := fileWrite(e, "150", "/run/x", "a", true); r.code != 500 || !strings.Contains(r.status, "No QEMU guest agent configured") {
		t.Fatalf("file-write without a guest agent: %s", r.status)
	}
	e.mustOK(e.call(http.MethodPut, "/nodes/pve1/qemu/150/config", form("agent", "1")))
	e.wantExit(e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/150/status/start", nil)), "OK")
	e.clock.Advance(time.Second)

	if r := fileWrite(e, "150", "/run/hyperfleet/token", "secret-1", true); r.code != 200 {
		t.Fatalf("file-write: %s %s", r.status, r.raw)
	}
	b, mode, err := e.sim.GuestFile(ctx, 150, "/run/hyperfleet/token")
	if err != nil || string(b) != "secret-1" || mode != 0o666 {
		t.Fatalf("guest file %q mode %o, %v; want secret-1, 0666", b, mode, err)
	}
	raw := []byte{0, 1, 2, 0xff}
	if r := fileWrite(e, "150", "/run/hyperfleet/token", base64.StdEncoding.EncodeToString(raw), false); r.code != 200 {
		t.Fatalf("file-write encode=0: %s", r.status)
	}
	if b, _, _ := e.sim.GuestFile(ctx, 150, "/run/hyperfleet/token"); string(b) != string(raw) {
		t.Fatalf("encode=0 wrote %q", b)
	}
	if r := fileWrite(e, "150", "/run/x", "not base64!", false); r.code != 500 || !strings.Contains(r.status, "guest-file-write") {
		t.Fatalf("file-write of bad base64: %s", r.status)
	}
	if r := fileWrite(e, "150", "/run/x", strings.Repeat("a", maxFileWriteContent+1), true); r.code != 400 || r.errors()["content"] == nil {
		t.Fatalf("file-write of %d characters: %s %v", maxFileWriteContent+1, r.status, r.errors())
	}
	for _, st := range e.sim.State().Storages {
		for _, v := range st.Volumes {
			if strings.Contains(string(v.Data), "secret-1") {
				t.Errorf("the guest file is at rest in %s", v.VolID)
			}
		}
	}
	e.mustOK(e.call(http.MethodPost, "/nodes/pve1/qemu/150/status/stop", nil))
	e.clock.Advance(time.Second)
	if _, _, err := e.sim.GuestFile(ctx, 150, "/run/hyperfleet/token"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after a stop the guest file is still there: %v", err)
	}
}

// TestAgentFileWriteGuestHook: in a guest run by the guest hook the file
// lands under its root (HF_SIM_ROOT), where its directory must exist: /run
// is there (empty) from every boot on, anything below it only once the
// guest made it; a file the guest made keeps its mode.
func TestAgentFileWriteGuestHook(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.Guest.Command = []string{"/bin/sleep", "3600"}
		c.Guest.WorkDir = t.TempDir()
	})
	if _, err := os.Stat("/bin/sleep"); err != nil {
		t.Fatalf("the guest hook needs /bin/sleep: %v", err)
	}
	ctx := context.Background()
	startVM150(e)
	root := e.sim.guest.rootDir(150)
	r := fileWrite(e, "150", "/run/hyperfleet/token", "secret-1", true)
	if r.code != 500 || !strings.Contains(r.status, "qmp command 'guest-file-open' failed - failed to open file '/run/hyperfleet/token' (mode: 'wb'): No such file or directory") {
		t.Fatalf("file-write into a missing directory: %s", r.status)
	}
	if err := os.Mkdir(filepath.Join(root, "run", "hyperfleet"), 0o700); err != nil {
		t.Fatal(err)
	}
	if r := fileWrite(e, "150", "/run/hyperfleet/token", "secret-1", true); r.code != 200 {
		t.Fatalf("file-write: %s", r.status)
	}
	b, mode, err := e.sim.GuestFile(ctx, 150, "/run/hyperfleet/token")
	if err != nil || string(b) != "secret-1" || mode != 0o666 {
		t.Fatalf("guest file %q mode %o, %v; want secret-1 created 0666", b, mode, err)
	}
	// The guest tightens it; a later write keeps that mode.
	if err := os.Chmod(filepath.Join(root, "run", "hyperfleet", "token"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := fileWrite(e, "150", "/run/hyperfleet/token", "two", true); r.code != 200 {
		t.Fatalf("second file-write: %s", r.status)
	}
	if b, mode, _ := e.sim.GuestFile(ctx, 150, "/run/hyperfleet/token"); string(b) != "two" || mode != 0o600 {
		t.Fatalf("overwritten file %q mode %o; want two, 0600", b, mode)
	}
	// A new boot has an empty /run.
	e.mustOK(e.call(http.MethodPost, "/nodes/pve1/qemu/150/status/stop", nil))
	e.clock.Advance(time.Second)
	e.wantExit(e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/150/status/start", nil)), "OK")
	e.clock.Advance(time.Second)
	if _, err := os.Stat(filepath.Join(root, "run", "hyperfleet")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("/run kept its content across a reboot: %v", err)
	}
}
