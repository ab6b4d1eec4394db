package proxmoxsim

import (
	"bytes"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/qemu"
)

// TestResumableSeed: a resumed guest is given its seed by the simulator,
// not by cloud-init, so only seeds whose every effect applySeed carries
// out resume: the operator's own cloud-config (host name, bootcmd,
// write_files, runcmd) with DHCP on one NIC. Anything else (a static
// address, packages, users, a MIME document, write_files that append)
// boots cold, with the reason logged.
//
// Mutation: resumableSeed without the network-config check (dhcpOnly
// always true) lets the static seed resume and fails this test; so does
// dropping the append check. The old tests had no resume path.
func TestResumableSeed(t *testing.T) {
	operator := readSeed(t, "dhcp-mac-jit-config")
	cases := map[string]struct {
		seed    seedDoc
		wantWhy string
	}{
		"the operator's DHCP seed":    {operator, ""},
		"the agent from the operator": {readSeed(t, "agent-from-operator"), ""},
		"a SPIFFE join token seed":    {readSeed(t, "spiffe-join-token"), ""},
		"a static address":            {readSeed(t, "static-ipv4"), "network-config"},
		"a user's packages":           {seedDoc{userData: append(append([]byte{}, operator.userData...), "packages: [git]\n"...), networkConfig: operator.networkConfig}, "packages"},
		"a MIME document":             {readSeed(t, "user-mime-multipart"), "single cloud-config"},
		"a file appended to":          {seedDoc{userData: []byte("#cloud-config\nwrite_files:\n  - path: /etc/x\n    content: y\n    append: true\n"), networkConfig: operator.networkConfig}, "append"},
		"no network-config at all":    {seedDoc{userData: operator.userData}, ""},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			why := resumableSeed(&c.seed)
			if (why == "") != (c.wantWhy == "") || !strings.Contains(why, c.wantWhy) {
				t.Errorf("resumableSeed = %q, want a reason containing %q (empty: resumes)", why, c.wantWhy)
			}
		})
	}
}

// readSeed reads a seed of internal/cloudinit's golden files: what the
// operator renders.
func readSeed(t *testing.T, name string) seedDoc {
	t.Helper()
	dir := filepath.Join("..", "..", "..", "cloudinit", "testdata", name)
	var s seedDoc
	for file, dst := range map[string]*[]byte{"user-data": &s.userData, "meta-data": &s.metaData, "network-config": &s.networkConfig} {
		data, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		*dst = data
	}
	if len(s.userData) == 0 {
		t.Fatalf("no user-data in %s", dir)
	}
	return s
}

// TestResumeDecision: a clone of a template whose image has a saved
// state resumes it only when nothing of the VM contradicts the saved
// machine: the same cores, memory and CPU type, no TPM, no tap network,
// and a NoCloud seed applySeed carries out. Each other case boots cold
// with its reason (logged at Warn).
//
// Mutation: resumeLocked without the machine comparison resumes the
// 2-core VM and fails this test; without the TPM case, the VM with
// tpmstate0 resumes and fails it.
func TestResumeDecision(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Guest.WorkDir = t.TempDir() }, WithAdmin(true))
	seed := filepath.Join(t.TempDir(), "seed.iso")
	op := readSeed(t, "dhcp-mac-jit-config")
	if err := qemu.WriteNoCloudISO(seed, map[string][]byte{"user-data": op.userData, "meta-data": op.metaData, "network-config": op.networkConfig}); err != nil {
		t.Fatal(err)
	}
	iso, err := os.ReadFile(seed)
	if err != nil {
		t.Fatal(err)
	}
	e.mustOK(e.upload("pve1", "local", "iso", "seed.iso", iso, nil))
	state := &GuestState{File: "/cache/state", Disk: "/cache/disk.qcow2", Cores: 1, MemoryMiB: 1024, CPU: "kvm64"}
	req, _ := http.NewRequest(http.MethodPut, e.srv.URL+"/_sim/vms/9000/guest-image",
		strings.NewReader(`{"disk":"/images/disk.raw","kernel":"/k","initrd":"/i","state":{"file":"/cache/state","disk":"/cache/disk.qcow2","cores":1,"memoryMiB":1024,"cpu":"kvm64"}}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("mark 9000 with a state: %s", resp.Status)
	}
	base := []string{"cores", "1", "memory", "1024", "cpu", "kvm64", "ide2", "local:iso/seed.iso,media=cdrom"}
	cases := []struct {
		name    string
		config  []string
		wantWhy string
	}{
		{"the saved machine, the operator's seed", nil, ""},
		{"two cores", []string{"cores", "2"}, "machine"},
		{"more memory", []string{"memory", "2048"}, "machine"},
		{"another CPU type", []string{"cpu", "host"}, "machine"},
		{"a TPM", []string{"tpmstate0", "local-lvm:vm-1-disk-1,version=v2.0,size=4M"}, "TPM"},
		{"Proxmox's cloud-init drive", []string{"ide0", "local-lvm:vm-1-cloudinit,media=cdrom"}, "cloud-init drive"},
		{"no seed", []string{"ide2", "none,media=cdrom"}, "no seed"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := strconv.Itoa(200 + i)
			e.wantExit(e.clone(id, nil), "OK")
			kv := map[string]string{}
			for j := 0; j+1 < len(base); j += 2 {
				kv[base[j]] = base[j+1]
			}
			for j := 0; j+1 < len(c.config); j += 2 {
				kv[c.config[j]] = c.config[j+1]
			}
			e.sim.mu.Lock()
			defer e.sim.mu.Unlock()
			v := e.sim.vms[200+i]
			maps.Copy(v.conf, kv)
			r, err := e.sim.realGuestsLocked()
			if err != nil {
				t.Fatal(err)
			}
			st, sd, why := r.resumeLocked(v)
			if (why == "") != (c.wantWhy == "") || !strings.Contains(why, c.wantWhy) {
				t.Fatalf("resumeLocked: reason %q, want one containing %q (empty: resumes)", why, c.wantWhy)
			}
			if why == "" && (st == nil || *st != *state || sd == nil || !bytes.Equal(sd.userData, op.userData)) {
				t.Errorf("resumes %+v with seed %v, want the template's state and the VM's seed", st, sd)
			}
		})
	}
}
