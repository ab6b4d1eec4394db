//go:build guest

package guest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/qemu"
)

// pve is a minimal Proxmox API client: form parameters in, data out.
type pve struct {
	t    *testing.T
	base string
}

func (c pve) call(method, path string, form url.Values) (json.RawMessage, error) {
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.base+"/api2/json"+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "PVEAPIToken=root@pam!sim=00000000-0000-0000-0000-000000000000")
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	return c.do(req)
}

func (c pve) do(req *http.Request) (json.RawMessage, error) {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s %s: %s", req.Method, req.URL.Path, resp.Status)
	}
	var out struct {
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, err)
	}
	return out.Data, nil
}

func (c pve) must(method, path string, form url.Values) json.RawMessage {
	c.t.Helper()
	data, err := c.call(method, path, form)
	if err != nil {
		c.t.Fatal(err)
	}
	return data
}

// task waits for the task a call returned and fails unless it is OK.
func (c pve) task(data json.RawMessage, timeout time.Duration) {
	c.t.Helper()
	var upid string
	if err := json.Unmarshal(data, &upid); err != nil {
		c.t.Fatalf("no UPID in %s", data)
	}
	deadline := time.Now().Add(timeout)
	for {
		var st struct{ Status, Exitstatus string }
		_ = json.Unmarshal(c.must("GET", "/nodes/pve1/tasks/"+upid+"/status", nil), &st)
		if st.Status == "stopped" {
			if st.Exitstatus != "OK" {
				c.t.Fatalf("task %s: %s", upid, st.Exitstatus)
			}
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("task %s still running after %s", upid, timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (c pve) status(vmid int) (status string, pid int) {
	c.t.Helper()
	var st struct {
		Status string `json:"status"`
		PID    int    `json:"pid"`
	}
	_ = json.Unmarshal(c.must("GET", fmt.Sprintf("/nodes/pve1/qemu/%d/status/current", vmid), nil), &st)
	return st.Status, st.PID
}

func (c pve) upload(name string, data []byte) {
	c.t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	_ = mw.WriteField("content", "iso")
	fw, _ := mw.CreateFormFile("filename", name)
	_, _ = fw.Write(data)
	_ = mw.Close()
	req, _ := http.NewRequest("POST", c.base+"/api2/json/nodes/pve1/storage/local/upload", &buf)
	req.Header.Set("Authorization", "PVEAPIToken=root@pam!sim=00000000-0000-0000-0000-000000000000")
	req.Header.Set("Content-Type", mw.FormDataContentType())
	data2, err := c.do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	c.task(data2, time.Minute)
}

// eventually polls f every second until it returns nil.
func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(time.Second)
	}
}

// seedUserData is cloud-init user-data for the API test: a file, a line on
// the console from runcmd, and from the second boot on a power-off of the
// guest's own (bootcmd runs at every boot).
const seedUserData = `#cloud-config
write_files:
  - path: /var/lib/hyperfleet-test/hello
    content: "written by cloud-init\n"
bootcmd:
  - [sh, -c, 'if [ -e /var/lib/hyperfleet-test/booted ]; then echo "hyperfleet-test: powering off" >/dev/ttyS0; systemctl --no-block poweroff; fi']
runcmd:
  - [sh, -c, 'touch /var/lib/hyperfleet-test/booted; echo "hyperfleet-test: runcmd ran, $(cat /var/lib/hyperfleet-test/hello)" >/dev/ttyS0']
`

// startGuestSimulator starts a Proxmox simulator alone (no operator) whose
// template boots the guest image under QEMU, one core and 1 GiB, without
// latency, its guests' files under workDir, and returns a client of its
// API and the simulator; the test's cleanup stops both.
func startGuestSimulator(t *testing.T, workDir string) (pve, *proxmoxsim.Simulator) {
	t.Helper()
	cfg := proxmoxsim.DefaultConfig()
	cfg.Latency = proxmoxsim.Latency{}
	cfg.AuthFailureDelay = 0
	cfg.Templates[0].GuestImage = &image
	cfg.Templates[0].Cores, cfg.Templates[0].MemoryMiB = 1, 1024
	cfg.Guest.WorkDir = workDir
	sim, err := proxmoxsim.New(cfg, proxmoxsim.WithAdmin(true))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sim)
	t.Cleanup(func() {
		srv.Close()
		if err := sim.Close(); err != nil {
			t.Errorf("close simulator: %v", err)
		}
	})
	return pve{t: t, base: srv.URL}, sim
}

// TestRealGuestThroughTheProxmoxAPI drives one real guest through the
// simulator's API as the operator would: linked clone, NoCloud ISO, start,
// guest agent, ACPI shutdown, hard stop, a power-off of the guest's own,
// destroy.
func TestRealGuestThroughTheProxmoxAPI(t *testing.T) {
	workDir := t.TempDir()
	c, sim := startGuestSimulator(t, workDir)

	c.task(c.must("POST", "/nodes/pve1/qemu/9000/clone", url.Values{"newid": {"101"}, "name": {"guest-101"}}), time.Minute)
	var conf map[string]any
	_ = json.Unmarshal(c.must("GET", "/nodes/pve1/qemu/101/config", nil), &conf)
	mac := strings.ToLower(strings.TrimPrefix(strings.Split(conf["net0"].(string), ",")[0], "virtio="))
	network := fmt.Sprintf("version: 2\nethernets:\n  eth0:\n    match:\n      macaddress: %s\n    set-name: eth0\n    dhcp4: true\n", mac)
	iso := filepath.Join(t.TempDir(), "seed.iso")
	if err := qemu.WriteNoCloudISO(iso, map[string][]byte{
		"user-data": []byte(seedUserData), "network-config": []byte(network),
		"meta-data": []byte("instance-id: guest-101\nlocal-hostname: guest-101\n"),
	}); err != nil {
		t.Fatal(err)
	}
	isoData, _ := os.ReadFile(iso)
	c.upload("seed-101.iso", isoData)
	c.task(c.must("POST", "/nodes/pve1/qemu/101/config", url.Values{"ide2": {"local:iso/seed-101.iso,media=cdrom"}}), time.Minute)

	// Boot 1: cloud-init, the guest agent, the ACPI power button.
	start := time.Now()
	c.task(c.must("POST", "/nodes/pve1/qemu/101/status/start", nil), time.Minute)
	leased := ""
	for _, v := range sim.VMs() {
		if v.VMID == 101 {
			leased = v.IPv4
		}
	}
	eventually(t, 5*time.Minute, "the guest agent reports eth0 with its MAC and leased address", func() error {
		data, err := c.call("GET", "/nodes/pve1/qemu/101/agent/network-get-interfaces", nil)
		if err != nil {
			return err
		}
		var res struct {
			Result []struct {
				Name string `json:"name"`
				HW   string `json:"hardware-address"`
				IPs  []struct {
					IP string `json:"ip-address"`
				} `json:"ip-addresses"`
			} `json:"result"`
		}
		if err := json.Unmarshal(data, &res); err != nil {
			return err
		}
		for _, i := range res.Result {
			for _, ip := range i.IPs {
				if i.Name == "eth0" && i.HW == mac && ip.IP == leased {
					return nil
				}
			}
		}
		return fmt.Errorf("interfaces %s", data)
	})
	t.Logf("boot 1: guest agent reports %s on eth0 (%s) after %s", leased, mac, time.Since(start).Round(time.Second))
	var osInfo struct {
		Result struct {
			ID        string `json:"id"`
			VersionID string `json:"version-id"`
		} `json:"result"`
	}
	_ = json.Unmarshal(c.must("GET", "/nodes/pve1/qemu/101/agent/get-osinfo", nil), &osInfo)
	if osInfo.Result.ID != "debian" || osInfo.Result.VersionID != "12" {
		t.Errorf("get-osinfo: %+v, want debian 12", osInfo.Result)
	}
	eventually(t, 5*time.Minute, "cloud-init's runcmd and write_files ran", func() error {
		console, err := sim.Console(101)
		if err != nil {
			return err
		}
		if !bytes.Contains(console, []byte("hyperfleet-test: runcmd ran, written by cloud-init")) {
			return fmt.Errorf("not on the console yet")
		}
		return nil
	})
	var host struct {
		Result struct {
			HostName string `json:"host-name"`
		} `json:"result"`
	}
	_ = json.Unmarshal(c.must("GET", "/nodes/pve1/qemu/101/agent/get-host-name", nil), &host)
	if host.Result.HostName != "guest-101" {
		t.Errorf("host name %q, want guest-101 from the seed's meta-data", host.Result.HostName)
	}
	t.Logf("boot 1: cloud-init done after %s", time.Since(start).Round(time.Second))
	// The operator ejects the ISO once the guest is up.
	c.task(c.must("POST", "/nodes/pve1/qemu/101/config", url.Values{"ide2": {"none,media=cdrom"}}), time.Minute)
	eventually(t, 30*time.Second, "the ejected seed's file removed", func() error {
		if _, err := os.Stat(filepath.Join(workDir, "vm-101", "ide2.iso")); err == nil {
			return fmt.Errorf("still there")
		}
		return nil
	})
	c.task(c.must("POST", "/nodes/pve1/qemu/101/status/shutdown", url.Values{"timeout": {"300"}}), 6*time.Minute)
	if st, _ := c.status(101); st != "stopped" {
		t.Fatalf("after shutdown the VM is %s", st)
	}
	t.Logf("boot 1: powered off by the ACPI button after %s", time.Since(start).Round(time.Second))

	// The seed again: cloud-init (and its bootcmd) runs only with a
	// datasource.
	c.task(c.must("POST", "/nodes/pve1/qemu/101/config", url.Values{"ide2": {"local:iso/seed-101.iso,media=cdrom"}}), time.Minute)

	// Boot 2: a hard stop kills QEMU at once.
	c.task(c.must("POST", "/nodes/pve1/qemu/101/status/start", nil), time.Minute)
	st, pid := c.status(101)
	if st != "running" || pid == 0 {
		t.Fatalf("after start: %s, pid %d", st, pid)
	}
	c.task(c.must("POST", "/nodes/pve1/qemu/101/status/stop", nil), time.Minute)
	eventually(t, 30*time.Second, "QEMU gone after stop", func() error {
		if syscall.Kill(pid, 0) == nil {
			return fmt.Errorf("QEMU %d still runs", pid)
		}
		return nil
	})

	// Boot 3: the guest powers itself off (bootcmd); the VM stops with
	// no task, as on Proxmox.
	start = time.Now()
	c.task(c.must("POST", "/nodes/pve1/qemu/101/status/start", nil), time.Minute)
	tasks := len(sim.State().Tasks)
	eventually(t, 5*time.Minute, "the guest powered itself off", func() error {
		if st, _ := c.status(101); st != "stopped" {
			return fmt.Errorf("VM %s", st)
		}
		return nil
	})
	if n := len(sim.State().Tasks); n != tasks {
		t.Errorf("%d tasks appeared while the guest powered itself off", n-tasks)
	}
	console, _ := sim.Console(101)
	if !bytes.Contains(console, []byte("hyperfleet-test: powering off")) {
		t.Errorf("the console does not show the guest's own power-off")
	}
	t.Logf("boot 3: the guest powered itself off after %s", time.Since(start).Round(time.Second))

	c.task(c.must("DELETE", "/nodes/pve1/qemu/101", nil), time.Minute)
	if _, err := sim.Console(101); err == nil {
		t.Errorf("the console of a destroyed VM is still readable")
	}
	if entries, _ := os.ReadDir(workDir); len(entries) != 0 {
		t.Errorf("left in the guest work dir after destroy: %v", entries)
	}
}
