package proxmox

import (
	"bytes"
	"strings"
	"testing"

	"github.com/diskfs/go-diskfs/filesystem/iso9660"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestNoSecretLeaks: once a VM runs, neither the Proxmox credentials nor
// the workload secret in the cloud-init user-data is anywhere in the
// hypervisor's stored state, in what the Observer received, or in the logs.
// While the guest boots the secret is on storage (the check can find it).
func TestNoSecretLeaks(t *testing.T) {
	for _, auth := range []string{"token", "password"} {
		t.Run(auth, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.cfg
			if auth == "password" {
				cfg.TokenID, cfg.TokenSecret, cfg.Username, cfg.Password = "", "", opUser, opPassword
			}
			p := e.newProvider(cfg)
			spec := testSpec("runner-k", "uid-kkkk")
			secret := workloadSecret("uid-kkkk")

			d := e.ensure(p, spec, provider.Progress{}, provider.PhaseBooting, 60)
			if !strings.Contains(e.stateJSON(), secret) {
				t.Fatal("the workload secret is not on storage while booting; the check below proves nothing")
			}
			d = e.ensure(p, spec, d.prog, provider.PhaseRunning, 200)

			state := e.stateJSON()
			var observed bytes.Buffer
			for _, c := range e.obs.snapshot() {
				observed.WriteString(c.method + " " + c.endpoint + "\n")
			}
			logs := e.logs.String()
			if logs == "" {
				t.Fatal("nothing was logged; the log check proves nothing")
			}
			for _, s := range []string{secret, opTokenSecret, opPassword} {
				for where, text := range map[string]string{"simulator state": state, "observer": observed.String(), "logs": logs} {
					if strings.Contains(text, s) {
						t.Errorf("%s contains secret %q", where, s)
					}
				}
			}
			// Neither the marker's signature nor cloud-init payloads are logged.
			for _, s := range []string{"signature:", "#cloud-config", "instance-id"} {
				if strings.Contains(logs, s) {
					t.Errorf("logs contain %q", s)
				}
			}
		})
	}
}

// TestBuildISO reads the NoCloud image back with go-diskfs: label cidata,
// the three files with their exact contents.
func TestBuildISO(t *testing.T) {
	files := map[string][]byte{
		"user-data":      []byte("#cloud-config\nruncmd: [echo hi]\n"),
		"meta-data":      []byte("instance-id: x\n"),
		"network-config": []byte("version: 2\n"),
	}
	img, err := buildISO(files)
	if err != nil {
		t.Fatal(err)
	}
	fsys, err := iso9660.Read(&memImage{data: img}, int64(len(img)), 0, 2048)
	if err != nil {
		t.Fatal(err)
	}
	// go-diskfs pads the identifier with NULs; blkid reads it as a C string.
	if label := strings.TrimRight(fsys.Label(), "\x00 "); label != "cidata" {
		t.Fatalf("volume label %q, want cidata", label)
	}
	for name, want := range files {
		f, err := fsys.OpenFile("/"+name, 0)
		if err != nil {
			t.Fatalf("open %s: %v", name, err)
		}
		var got bytes.Buffer
		if _, err := got.ReadFrom(f); err != nil {
			t.Fatal(err)
		}
		if got.String() != string(want) {
			t.Fatalf("%s = %q, want %q", name, got.String(), want)
		}
	}
	defaults := noCloudFiles(&provider.VMSpec{Name: "vm-a", Owner: provider.Owner{UID: "u1"}}, provider.CloudInit{}, 1234)
	if string(defaults["meta-data"]) != "instance-id: u1-1234\nlocal-hostname: vm-a\n" || len(defaults["user-data"]) == 0 {
		t.Fatalf("default seed files: %q", defaults)
	}
	if _, ok := defaults["network-config"]; ok {
		t.Fatal("network-config without a network config")
	}
}
