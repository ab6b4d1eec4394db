package proxmoxsim

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
)

// TestGuestImageMarker covers what needs no QEMU: marking a template as a
// real guest (config, admin API), clones inheriting the mark, a start
// that fails the way qm start fails when QEMU cannot run, unmarking, the
// console endpoint, and the host address guests use.
func TestGuestImageMarker(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.Guest.WorkDir = t.TempDir()
		c.Guest.QEMU = QEMUConfig{Binary: "hyperfleet-no-such-qemu", Img: "hyperfleet-no-such-qemu-img"}
	}, WithAdmin(true))
	admin := func(method, path, body string) (int, string) {
		req, _ := http.NewRequest(method, e.srv.URL+"/_sim/"+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	imageOf := func(vmid int) *GuestImage {
		for _, v := range e.sim.VMs() {
			if v.VMID == vmid {
				return v.GuestImage
			}
		}
		t.Fatalf("VM %d not in the state", vmid)
		return nil
	}

	if code, body := admin(http.MethodPut, "vms/9000/guest-image", `{"disk":"/images/disk.raw"}`); code != http.StatusBadRequest || !strings.Contains(body, "needs disk, kernel and initrd") {
		t.Errorf("an image without kernel: %d %s, want 400", code, body)
	}
	img := `{"disk":"/images/disk.raw","format":"raw","kernel":"/images/vmlinuz","initrd":"/images/initrd.img"}`
	if code, body := admin(http.MethodPut, "vms/9000/guest-image", img); code != http.StatusOK {
		t.Fatalf("mark 9000: %d %s", code, body)
	}
	e.wantExit(e.clone("101", form("name", "real")), "OK")
	if got := imageOf(101); got == nil || got.Disk != "/images/disk.raw" {
		t.Fatalf("the clone's guest image is %+v, want the template's", got)
	}
	start := e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/101/status/start", nil))
	st := e.task(start)
	if exit, _ := st["exitstatus"].(string); !strings.HasPrefix(exit, "start failed: ") || !strings.Contains(exit, "hyperfleet-no-such-qemu") {
		t.Errorf("start without QEMU: task exit %q, want a start failure naming the program", exit)
	}
	if cur := e.mustOK(e.call(http.MethodGet, "/nodes/pve1/qemu/101/status/current", nil)).dataMap(t); cur["status"] != "stopped" {
		t.Errorf("after a failed start the VM is %v", cur["status"])
	}

	if code, body := admin(http.MethodDelete, "vms/9000/guest-image", ""); code != http.StatusOK {
		t.Fatalf("unmark 9000: %d %s", code, body)
	}
	e.wantExit(e.clone("102", nil), "OK")
	if got := imageOf(102); got != nil {
		t.Errorf("a clone of the unmarked template has guest image %+v", got)
	}
	e.wantExit(e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/102/status/start", nil)), "OK")
	if code, body := admin(http.MethodGet, "vms/102/console", ""); code != http.StatusNotFound || !strings.Contains(body, "has not booted a guest") {
		t.Errorf("console of a VM without a guest: %d %s, want 404", code, body)
	}
	if code, _ := admin(http.MethodGet, "vms/999/console", ""); code != http.StatusNotFound {
		t.Errorf("console of a missing VM: %d, want 404", code)
	}
	if got := e.sim.GuestHostAddress(); got != "10.99.0.2" {
		t.Errorf("GuestHostAddress %q, want 10.99.0.2 (the .2 of guest.addressRange's network)", got)
	}
}

func TestGuestImageConfigValidated(t *testing.T) {
	cfg := testConfig()
	cfg.Templates[0].GuestImage = &GuestImage{Disk: "/d.raw", Kernel: "/k", Initrd: "/i", Format: "vmdk"}
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "template 9000: guestImage format") {
		t.Errorf("New with a vmdk guest image: %v, want a format error", err)
	}
}

// TestCPUModel: a VM's cpu option gives QEMU its type, with or without the
// cputype key and its flags; without one, qemu-server's default, kvm64.
func TestCPUModel(t *testing.T) {
	for option, want := range map[string]string{
		"":                                "kvm64",
		"host":                            "host",
		"qemu64":                          "qemu64",
		"cputype=kvm64,flags=+aes":        "kvm64",
		"x86-64-v2-AES,flags=-pcid":       "x86-64-v2-AES",
		"cputype=Skylake-Client,hidden=1": "Skylake-Client",
	} {
		if got := cpuModel(option); got != want {
			t.Errorf("cpuModel(%q) = %q, want %q", option, got, want)
		}
	}
}
