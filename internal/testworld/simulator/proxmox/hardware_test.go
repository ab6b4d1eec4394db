package proxmoxsim

import (
	"net/http"
	"strings"
	"testing"
)

// hardwareWorld is the default cluster with a second node and two more
// image storages: scratch (20 GiB, on pve1 only) and remote (pve2 only).
func hardwareWorld(version int) func(*Config) {
	return func(cfg *Config) {
		cfg.PVEVersion = version
		cfg.Nodes = append(cfg.Nodes, NodeConfig{Name: "pve2", CPUs: 8, Memory: 32 << 30, Disk: 100 << 30, IP: "192.0.2.12"})
		cfg.Storages = append(cfg.Storages,
			StorageConfig{ID: "scratch", Type: "lvm", Content: []string{"images"}, Capacity: 20 << 30, Nodes: []string{"pve1"}},
			StorageConfig{ID: "remote", Type: "lvmthin", Content: []string{"images"}, Capacity: 100 << 30, Nodes: []string{"pve2"}})
	}
}

// TestHardwareConfig: a config write's cpu option is checked as
// qemu-server's pve-vm-cpu-conf format (validate_vm_cpu_conf,
// src/PVE/QemuServer/CPUConfig.pm: stable-bookworm lines 311-337 against
// @supported_cpu_flags line 164 and $cpu_vendor_list line 80; master lines
// 474-503 against CPUFlags.pm line 19), a 400 naming cpu; a new disk
// "<storage>:<GiB>" is allocated on the storage, which must hold images
// (Qemu.pm $check_storage_access, stable-bookworm lines 177-182, master
// 186-191) and be on the VM's node, and must have the room.
func TestHardwareConfig(t *testing.T) {
	cases := []struct {
		version    int
		name       string
		params     []string
		wantStatus string // "" is a success; else a prefix of the status line
		wantError  string // a fragment of the parameter error or status
	}{
		{8, "host", []string{"cpu", "host"}, "", ""},
		{8, "host with VM-specific flags", []string{"cpu", "cputype=host,flags=+aes;-pcid"}, "", ""},
		{8, "nested-virt is PVE 9's", []string{"cpu", "cputype=host,flags=+nested-virt"}, "400", "VM-specific CPU flags must be a subset of"},
		{8, "vmx is no VM-specific flag", []string{"cpu", "cputype=host,flags=+vmx"}, "400", "VM-specific CPU flags must be a subset of"},
		{8, "a model PVE 8 lacks", []string{"cpu", "EPYC-Turin"}, "400", "Built-in cputype 'EPYC-Turin' is not defined"},
		{8, "no custom model defined", []string{"cpu", "custom-avx"}, "400", "Custom cputype 'avx' not found"},
		{9, "nested-virt", []string{"cpu", "cputype=x86-64-v2-AES,flags=+nested-virt"}, "", ""},
		{9, "a model PVE 9 added", []string{"cpu", "EPYC-Turin"}, "", ""},
		{9, "svm is no VM-specific flag", []string{"cpu", "cputype=host,flags=+svm"}, "400", "subset of: aes, amd-no-ssb, amd-ssbd, hv-evmcs, hv-tlbflush, ibpb, md-clear, nested-virt"},
		{9, "a new disk", []string{"scsi1", "scratch:8"}, "", ""},
		{9, "a new disk on a storage without images", []string{"scsi1", "local:8"}, "400", "storage 'local' does not support vm images"},
		{9, "a new disk on another node's storage", []string{"scsi1", "remote:8"}, "500", "storage 'remote' is not available on node 'pve1'"},
		{8, "a new disk larger than the storage's room", []string{"scsi1", "scratch:21"}, "500", "no space left on storage 'scratch'"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, hardwareWorld(c.version))
			e.wantExit(e.clone("150", nil), "OK")
			r := e.call(http.MethodPut, "/nodes/pve1/qemu/150/config", form(c.params...))
			if c.wantStatus == "" {
				e.mustOK(r)
				conf := e.mustOK(e.call(http.MethodGet, "/nodes/pve1/qemu/150/config", nil)).dataMap(t)
				if c.params[0] == "cpu" && conf["cpu"] != c.params[1] {
					t.Fatalf("cpu %v, want %q", conf["cpu"], c.params[1])
				}
				if c.params[0] == "scsi1" {
					disk, _ := conf["scsi1"].(string)
					if !strings.HasPrefix(disk, "scratch:vm-150-disk-") || !strings.Contains(disk, "size=8G") {
						t.Fatalf("scsi1 %q, want a new 8G volume of VM 150 on scratch", disk)
					}
					vols := e.mustOK(e.call(http.MethodGet, "/nodes/pve1/storage/scratch/content", nil)).dataList(t)
					if len(vols) != 1 {
						t.Fatalf("scratch holds %v, want the one new volume", vols)
					}
				}
				return
			}
			got := r.status + " " + string(r.raw)
			if !strings.HasPrefix(r.status, c.wantStatus) || !strings.Contains(got, c.wantError) {
				t.Fatalf("answer %q, want %s with %q", got, c.wantStatus, c.wantError)
			}
			conf := e.mustOK(e.call(http.MethodGet, "/nodes/pve1/qemu/150/config", nil)).dataMap(t)
			if _, ok := conf[c.params[0]]; ok && c.params[0] != "cpu" {
				t.Fatalf("refused %s was written: %v", c.params[0], conf[c.params[0]])
			}
		})
	}
}

// TestHardwarePrivileges: the privileges qemu-server checks for the
// hardware a template asks for. cpu is in $cpuoptions (Qemu.pm,
// stable-bookworm line 744, master 789), which
// $check_vm_modify_config_perm (stable-bookworm lines 949-963, master
// 995-1009) answers with VM.Config.CPU; a new disk wants
// Datastore.AllocateSpace on its storage ($check_storage_access,
// stable-bookworm line 180, master 189) and VM.Config.Disk on the VM
// ($check_drive_perms, stable-bookworm lines 2174-2187, master 2273-2286).
func TestHardwarePrivileges(t *testing.T) {
	cases := []struct {
		version    int
		name       string
		privs      []string
		params     []string
		wantStatus string
	}{
		{8, "cpu wants VM.Config.CPU", []string{"VM.Config.Options"}, []string{"cpu", "host"}, "403 Permission check failed (/vms/150, VM.Config.CPU)"},
		{9, "cpu with VM.Config.CPU", []string{"VM.Config.CPU"}, []string{"cpu", "cputype=host,flags=+nested-virt"}, ""},
		{8, "a new disk wants Datastore.AllocateSpace", []string{"VM.Config.Disk"}, []string{"scsi1", "scratch:1"}, "403 Permission check failed (/storage/scratch, Datastore.AllocateSpace)"},
		{9, "a new disk wants VM.Config.Disk", []string{"VM.Config.CDROM", "Datastore.AllocateSpace"}, []string{"scsi1", "scratch:1"}, "403 Permission check failed (/vms/150, VM.Config.Disk)"},
		{9, "a new disk with both", []string{"VM.Config.Disk", "Datastore.AllocateSpace"}, []string{"scsi1", "scratch:1"}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, func(cfg *Config) {
				hardwareWorld(c.version)(cfg)
				cfg.Users = append(cfg.Users, UserConfig{ID: "hf@pve", Privileges: Privileges{"/": {"Administrator"}},
					Tokens: []TokenConfig{{ID: "op", Secret: "s", Privileges: Privileges{"/": c.privs}}}})
			})
			e.wantExit(e.clone("150", nil), "OK")
			e.auth = "PVEAPIToken=hf@pve!op=s"
			r := e.call(http.MethodPut, "/nodes/pve1/qemu/150/config", form(c.params...))
			switch {
			case c.wantStatus == "" && r.code != http.StatusOK:
				t.Fatalf("refused: %s", r.status)
			case c.wantStatus != "" && r.status != c.wantStatus:
				t.Fatalf("status %q, want %q", r.status, c.wantStatus)
			}
		})
	}
}
