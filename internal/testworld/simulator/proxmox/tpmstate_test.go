package proxmoxsim

import (
	"net/http"
	"strings"
	"testing"
)

// tpmEnv has template 9000 (local-lvm) and a plain VM 100 without TPM,
// and a directory storage "dir" holding images next to "local".
func tpmEnv(t *testing.T, templateTPM string) *simEnv {
	t.Helper()
	return newEnv(t, func(c *Config) {
		c.Storages = append(c.Storages, StorageConfig{ID: "dir", Type: "dir", Content: []string{"images"}, Capacity: 100 << 30, Path: "/srv/dir"})
		c.Templates[0].TPMVersion = templateTPM
		c.Templates = append(c.Templates, TemplateConfig{VMID: 100, Node: "pve1", Name: "plain", Storage: "local-lvm", NotTemplate: true})
	})
}

func (e *simEnv) config(vmid string) map[string]any {
	e.t.Helper()
	return e.mustOK(e.call(http.MethodGet, "/nodes/pve1/qemu/"+vmid+"/config", nil)).dataMap(e.t)
}

// TestTPMStateAllocation: "<storage>:<n>" allocates a 4 MiB raw volume
// named like any disk, whatever n says, and the config shows it with its
// size and version; the volume is listed on the storage and freed with
// the VM.
func TestTPMStateAllocation(t *testing.T) {
	e := tpmEnv(t, "")
	e.mustOK(e.call(http.MethodPut, "/nodes/pve1/qemu/100/config", form("tpmstate0", "local-lvm:1,version=v2.0")))
	got := e.config("100")["tpmstate0"]
	// VM 100's boot disk is vm-100-disk-0: the state takes the next name.
	if got != "local-lvm:vm-100-disk-1,size=4M,version=v2.0" {
		t.Fatalf("tpmstate0 = %v, want local-lvm:vm-100-disk-1,size=4M,version=v2.0", got)
	}
	vols := e.mustOK(e.call(http.MethodGet, "/nodes/pve1/storage/local-lvm/content", form("vmid", "100"))).dataList(t)
	found := false
	for _, v := range vols {
		if v["volid"] == "local-lvm:vm-100-disk-1" {
			found = true
			if v["size"] != float64(4<<20) || v["format"] != "raw" {
				t.Errorf("TPM volume %v: want size 4 MiB, format raw", v)
			}
		}
	}
	if !found {
		t.Fatalf("no TPM volume on local-lvm: %v", vols)
	}
	// On a directory storage the volume is a raw file, whatever size.
	e.mustOK(e.call(http.MethodPut, "/nodes/pve1/qemu/100/config", form("delete", "tpmstate0")))
	e.mustOK(e.call(http.MethodPut, "/nodes/pve1/qemu/100/config", form("tpmstate0", "dir:8,version=v2.0")))
	if got := e.config("100")["tpmstate0"]; got != "dir:100/vm-100-disk-0.raw,size=4M,version=v2.0" {
		t.Fatalf("tpmstate0 on dir = %v", got)
	}
	// The deleted state became unused0, as qemu-server keeps a replaced
	// or deleted disk; destroy frees it and the new one.
	if got := e.config("100")["unused0"]; got != "local-lvm:vm-100-disk-1" {
		t.Fatalf("unused0 = %v, want the deleted TPM state", got)
	}
	e.wantExit(e.upid(e.call(http.MethodDelete, "/nodes/pve1/qemu/100", nil)), "OK")
	for _, st := range []string{"local-lvm", "dir"} {
		if vols := e.mustOK(e.call(http.MethodGet, "/nodes/pve1/storage/"+st+"/content", form("vmid", "100"))).dataList(t); len(vols) != 0 {
			t.Errorf("volumes of VM 100 left on %s after destroy: %v", st, vols)
		}
	}
}

// TestTPMStateDefaultVersion: without version= the state is v1.2, as
// qemu-server's $tpmversion_fmt says, and the config shows no version.
func TestTPMStateDefaultVersion(t *testing.T) {
	e := tpmEnv(t, "")
	e.mustOK(e.call(http.MethodPut, "/nodes/pve1/qemu/100/config", form("tpmstate0", "local-lvm:1")))
	v := e.config("100")["tpmstate0"].(string)
	if v != "local-lvm:vm-100-disk-1,size=4M" || tpmVersion(v) != "v1.2" {
		t.Fatalf("tpmstate0 = %q (version %s), want local-lvm:vm-100-disk-1,size=4M (v1.2)", v, tpmVersion(v))
	}
	// The version of an existing state never changes.
	r := e.call(http.MethodPut, "/nodes/pve1/qemu/100/config", form("tpmstate0", v+",version=v2.0"))
	if r.code != 500 || !strings.Contains(r.status, "cannot change TPM state version after creation") {
		t.Fatalf("version change: %s %s", r.status, r.raw)
	}
}

// TestTPMStateRefusals: what Proxmox's parameter check and storage
// access check answer.
func TestTPMStateRefusals(t *testing.T) {
	e := tpmEnv(t, "")
	cases := []struct {
		value, param, msg string
	}{
		{"local-lvm:1,version=v3.0", "tpmstate0", "invalid format - format error\nversion: value 'v3.0' does not have a value in the enumeration 'v1.2, v2.0'\n"},
		{"local-lvm:1,version=v2.0,media=cdrom", "tpmstate0", "invalid format - format error\nmedia: property is not defined in schema and the schema does not allow additional properties\n"},
		{"version=v2.0", "tpmstate0", "invalid format - format error\nfile: property is missing and it is not optional\n"},
		{"local:1,version=v2.0", "storage", "storage 'local' does not support vm images"},
	}
	for _, tc := range cases {
		r := e.call(http.MethodPut, "/nodes/pve1/qemu/100/config", form("tpmstate0", tc.value))
		if r.code != 400 || r.errors()[tc.param] != tc.msg {
			t.Errorf("tpmstate0=%q: got %s %v, want 400 with %s: %q", tc.value, r.status, r.errors(), tc.param, tc.msg)
		}
	}
	if _, ok := e.config("100")["tpmstate0"]; ok {
		t.Fatal("a refused tpmstate0 reached the config")
	}
}

// TestTPMStateClone: a clone copies the template's TPM state in full in
// either mode, content included (a state manufactured before the
// template was made carries its endorsement key into every clone), to
// the full clone's target storage or the template's.
func TestTPMStateClone(t *testing.T) {
	e := tpmEnv(t, "v2.0")
	tmplTPM := e.config("9000")["tpmstate0"].(string)
	if tmplTPM != "local-lvm:base-9000-disk-1,size=4M,version=v2.0" {
		t.Fatalf("template tpmstate0 = %q", tmplTPM)
	}
	// Stand for a state manufactured before the VM became a template.
	e.sim.mu.Lock()
	_, vol := e.sim.findVolumeLocked("local-lvm:base-9000-disk-1", "pve1")
	vol.data = []byte("manufactured state")
	e.sim.mu.Unlock()

	e.wantExit(e.clone("201", form("full", "0")), "OK")
	e.wantExit(e.clone("202", form("full", "1", "storage", "dir")), "OK")
	for vmid, want := range map[string]string{
		// Disks are cloned in key order: scsi0 first (qemu-server sorts).
		"201": "local-lvm:vm-201-disk-1,size=4M,version=v2.0",
		"202": "dir:202/vm-202-disk-1.raw,size=4M,version=v2.0",
	} {
		if got := e.config(vmid)["tpmstate0"]; got != want {
			t.Errorf("clone %s: tpmstate0 = %v, want %s", vmid, got, want)
		}
		id := map[string]int{"201": 201, "202": 202}[vmid]
		state, ok := e.sim.TPMState(id)
		if !ok || string(state) != "manufactured state" {
			t.Errorf("clone %s: TPM state %q (%v), want the template's copied", vmid, state, ok)
		}
	}
	// The linked clone's boot disk is linked; its TPM state is a copy.
	e.sim.mu.Lock()
	_, boot := e.sim.findVolumeLocked("local-lvm:vm-201-disk-0", "pve1")
	_, state := e.sim.findVolumeLocked("local-lvm:vm-201-disk-1", "pve1")
	e.sim.mu.Unlock()
	if boot == nil || !boot.linked || state == nil || state.linked || state.size != 4<<20 {
		t.Fatalf("linked clone: boot disk %+v, TPM state %+v: want a linked disk and a full 4 MiB copy", boot, state)
	}
}
