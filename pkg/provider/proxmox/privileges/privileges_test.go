package privileges

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestTableWellFormed: every row names its Proxmox source, appears once,
// and checks only privileges its version has (VM.Monitor is gone in 9,
// VM.GuestAgent.* do not exist in 8).
//
// Mutation: giving PVE 9's file-write row VM.Monitor fails this test.
func TestTableWellFormed(t *testing.T) {
	seen := map[string]bool{}
	for _, e := range Table {
		key := e.Method + " " + e.Path
		if seen[key] {
			t.Errorf("%s: two rows", key)
		}
		seen[key] = true
		if !strings.Contains(e.Source, ".pm ") {
			t.Errorf("%s: source %q names no Proxmox file and method", key, e.Source)
		}
		for _, v := range Versions {
			for _, c := range append(e.Checks[v], filterChecks(e)...) {
				for _, p := range c.Privs {
					if !slices.Contains(Known(v), p) {
						t.Errorf("%s: PVE %d has no privilege %s", key, v, p)
					}
				}
			}
		}
	}
	for _, v := range Versions {
		if len(Sources[v]) == 0 {
			t.Errorf("PVE %d: no sources", v)
		}
		for _, s := range Sources[v] {
			if len(s.Commit) != 40 || s.Repo == "" || s.Package == "" {
				t.Errorf("PVE %d: source %+v", v, s)
			}
		}
	}
}

func filterChecks(e Endpoint) []Check {
	var out []Check
	for _, f := range e.Filters {
		out = append(out, f.Check)
	}
	return out
}

func row(t *testing.T, method, path string) *Endpoint {
	t.Helper()
	e, ok := Lookup(method, path)
	if !ok {
		t.Fatalf("no row %s %s", method, path)
	}
	return e
}

// TestNeeds pins the handler rules against what qemu-server and
// pve-storage check, case by case.
//
// Mutation: classifying ipconfig<n> as VM.Config.Network only (optionNeed)
// fails the cloud-init options case; dropping the storage check of a
// suspend to disk (suspendNeeds) fails both suspend-to-disk cases.
func TestNeeds(t *testing.T) {
	vm := map[string]string{"vmid": "1000", "node": "pve1"}
	template := map[string]string{
		"scsi0":     "local-lvm:base-9000-disk-0,size=32G",
		"ide2":      "local-lvm:vm-9000-cloudinit,media=cdrom",
		"tpmstate0": "local-lvm:base-9000-disk-1,size=4M,version=v2.0",
		"net0":      "virtio=BC:24:11:00:00:01,bridge=vmbr0",
	}
	cases := []struct {
		name   string
		v      Version
		method string
		path   string
		call   Call
		want   []Need
	}{
		{"clone: source, new id or pool, disks, bridges", PVE9, "POST", "/nodes/{node}/qemu/{vmid}/clone",
			Call{Vars: map[string]string{"vmid": "9000"}, Params: map[string]string{"newid": "1000", "pool": "ci"}, Config: template},
			[]Need{
				{Path: "/vms/9000", Privs: []string{"VM.Clone"}},
				{Path: "/vms/1000", Privs: []string{"VM.Allocate"}, OrPath: "/pool/ci", Bare: true},
				{Path: "/storage/local-lvm", Privs: []string{"Datastore.AllocateSpace"}},
				{Path: "/storage/local-lvm", Privs: []string{"Datastore.AllocateSpace"}},
				{Path: "/sdn/zones/localnetwork/vmbr0", Privs: []string{"SDN.Use"}},
			}},
		{"clone to another storage", PVE8, "POST", "/nodes/{node}/qemu/{vmid}/clone",
			Call{Vars: map[string]string{"vmid": "9000"}, Params: map[string]string{"newid": "1000", "storage": "fast"}, Config: map[string]string{"scsi0": "local-lvm:base-9000-disk-0"}},
			[]Need{
				{Path: "/vms/9000", Privs: []string{"VM.Clone"}},
				{Path: "/vms/1000", Privs: []string{"VM.Allocate"}, Bare: true},
				{Path: "/storage/fast", Privs: []string{"Datastore.AllocateSpace"}},
			}},
		{"config: ISO replaces the cloud-init drive, resources, tagged net", PVE9, "PUT", "/nodes/{node}/qemu/{vmid}/config",
			Call{Vars: vm, Params: map[string]string{"cores": "4", "ide2": "local:iso/x.iso,media=cdrom", "net0": "virtio,bridge=vmbr0,tag=20", "tags": "ci"},
				Config: map[string]string{"ide2": "local-lvm:vm-1000-cloudinit,media=cdrom"}},
			[]Need{
				{Path: "/vms/1000", Privs: configPrivs, Any: true},
				{Path: "/vms/1000", Privs: []string{"VM.Config.CPU"}},
				{Path: "/vms/1000", Privs: []string{"VM.Config.Network"}},
				{Path: "/storage/local", Privs: []string{"Datastore.AllocateSpace", "Datastore.Audit"}, Any: true},
				{Path: "/sdn/zones/localnetwork/vmbr0/20", Privs: []string{"SDN.Use"}},
				{Path: "/vms/1000", Privs: []string{"VM.Config.Cloudinit", "VM.Config.CDROM"}},
				{Path: "/vms/1000", Privs: []string{"VM.Config.CDROM"}},
				{Path: "/vms/1000", Privs: []string{"VM.Config.Options"}},
			}},
		{"config: cloud-init options, a drive removed, a new TPM state", PVE8, "PUT", "/nodes/{node}/qemu/{vmid}/config",
			Call{Vars: vm, Params: map[string]string{"delete": "ide2", "ipconfig0": "ip=dhcp", "tpmstate0": "local-lvm:1,version=v2.0"},
				Config: map[string]string{"ide2": "local-lvm:vm-1000-cloudinit,media=cdrom"}},
			[]Need{
				{Path: "/vms/1000", Privs: configPrivs, Any: true},
				{Path: "/vms/1000", Privs: []string{"VM.Config.Cloudinit", "VM.Config.Network"}, Any: true},
				{Path: "/storage/local-lvm", Privs: []string{"Datastore.AllocateSpace"}},
				{Path: "/vms/1000", Privs: []string{"VM.Config.Cloudinit", "VM.Config.CDROM"}},
				{Path: "/vms/1000", Privs: []string{"VM.Config.Disk"}},
			}},
		{"resize: the disk's storage", PVE9, "PUT", "/nodes/{node}/qemu/{vmid}/resize",
			Call{Vars: vm, Params: map[string]string{"disk": "scsi0", "size": "40G"}, Config: map[string]string{"scsi0": "local-lvm:vm-1000-disk-0,size=32G"}},
			[]Need{{Path: "/vms/1000", Privs: []string{"VM.Config.Disk"}}, {Path: "/storage/local-lvm", Privs: []string{"Datastore.AllocateSpace"}}}},
		{"ISO deletion", PVE8, "DELETE", "/nodes/{node}/storage/{storage}/content/{volume}",
			Call{Vars: map[string]string{"storage": "local", "volume": "local:iso/x.iso"}},
			[]Need{{Path: "/storage/local", Privs: []string{"Datastore.Allocate"}}}},
		{"suspend to disk: the VM's disks and the storage find_vmstate_storage picks", PVE9, "POST", "/nodes/{node}/qemu/{vmid}/status/suspend",
			Call{Vars: vm, Params: map[string]string{"todisk": "1"}, StateStorage: func() string { return "local-lvm" }},
			[]Need{
				{Path: "/vms/1000", Privs: []string{"VM.PowerMgmt"}},
				{Path: "/vms/1000", Privs: []string{"VM.Config.Disk"}},
				{Path: "/storage/local-lvm", Privs: []string{"Datastore.AllocateSpace"}},
			}},
		{"suspend to disk: statestorage wins", PVE8, "POST", "/nodes/{node}/qemu/{vmid}/status/suspend",
			Call{Vars: vm, Params: map[string]string{"todisk": "1", "statestorage": "fast"}, StateStorage: func() string { return "local-lvm" }},
			[]Need{
				{Path: "/vms/1000", Privs: []string{"VM.PowerMgmt"}},
				{Path: "/vms/1000", Privs: []string{"VM.Config.Disk"}},
				{Path: "/storage/fast", Privs: []string{"Datastore.AllocateSpace"}},
			}},
		{"pause: VM.PowerMgmt alone", PVE9, "POST", "/nodes/{node}/qemu/{vmid}/status/suspend",
			Call{Vars: vm, Params: map[string]string{"todisk": "0"}, StateStorage: func() string { return "local-lvm" }},
			[]Need{{Path: "/vms/1000", Privs: []string{"VM.PowerMgmt"}}}},
		{"resume: VM.PowerMgmt alone", PVE9, "POST", "/nodes/{node}/qemu/{vmid}/status/resume",
			Call{Vars: vm}, []Need{{Path: "/vms/1000", Privs: []string{"VM.PowerMgmt"}}}},
		{"config: a saved state deleted", PVE9, "PUT", "/nodes/{node}/qemu/{vmid}/config",
			Call{Vars: vm, Params: map[string]string{"delete": "vmstate"},
				Config: map[string]string{"vmstate": "local:1000/vm-1000-state-suspend-2026-01-02.raw", "lock": "suspended"}},
			[]Need{
				{Path: "/vms/1000", Privs: configPrivs, Any: true},
				{Path: "/vms/1000", Privs: []string{"VM.Config.Disk", "VM.PowerMgmt"}},
				{Path: "/storage/local", Privs: []string{"Datastore.AllocateSpace"}},
			}},
		{"config: another VM's saved state is only dropped", PVE8, "PUT", "/nodes/{node}/qemu/{vmid}/config",
			Call{Vars: vm, Params: map[string]string{"delete": "vmstate"}, Config: map[string]string{"vmstate": "local-lvm:vm-999-state-suspend-2026-01-02"}},
			[]Need{
				{Path: "/vms/1000", Privs: configPrivs, Any: true},
				{Path: "/vms/1000", Privs: []string{"VM.Config.Disk", "VM.PowerMgmt"}},
			}},
		{"guest agent on PVE 8", PVE8, "POST", "/nodes/{node}/qemu/{vmid}/agent/file-write",
			Call{Vars: vm}, []Need{{Path: "/vms/1000", Privs: []string{"VM.Monitor"}}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := row(t, c.method, c.path).Needs(c.v, c.call)
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("needs:\n got %+v\nwant %+v", got, c.want)
			}
		})
	}
}

// TestRole: all-of privileges all count; an any-of check adds its first
// privilege only when the role holds none of them yet, whatever the order.
func TestRole(t *testing.T) {
	got := Role([]Need{
		{Path: "/storage/local", Privs: []string{"Datastore.Audit", "Datastore.AllocateSpace"}, Any: true},
		{Path: "/vms/1", Privs: []string{"VM.GuestAgent.FileWrite", "VM.GuestAgent.Unrestricted"}, Any: true},
		{Path: "/storage/local-lvm", Privs: []string{"Datastore.AllocateSpace"}},
		{Path: "/vms/1", Privs: []string{"VM.Config.Cloudinit", "VM.Config.CDROM"}},
	})
	want := []string{"Datastore.AllocateSpace", "VM.Config.CDROM", "VM.Config.Cloudinit", "VM.GuestAgent.FileWrite"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Role = %v, want %v", got, want)
	}
}

func TestParseDenied(t *testing.T) {
	for msg, want := range map[string][]string{
		"Permission check failed (/vms/100, VM.Allocate)":                                        {"/vms/100", "VM.Allocate"},
		"Permission check failed (/vms/1, VM.GuestAgent.FileWrite|VM.GuestAgent.Unrestricted)\n": {"/vms/1", "VM.GuestAgent.FileWrite", "VM.GuestAgent.Unrestricted"},
		"Permission check failed (/sdn/zones/localnetwork/vmbr0/20, SDN.Use)":                    {"/sdn/zones/localnetwork/vmbr0/20", "SDN.Use"},
	} {
		path, privs, ok := ParseDenied(msg)
		if !ok || !reflect.DeepEqual(append([]string{path}, privs...), want) {
			t.Errorf("%q: %q %v %v", msg, path, privs, ok)
		}
	}
	for _, msg := range []string{"Permission check failed (user != root@pam)", "Permission check failed", "VM is locked"} {
		if _, _, ok := ParseDenied(msg); ok {
			t.Errorf("%q parsed", msg)
		}
	}
	if got := Fix("VM.Config.Cloudinit"); got != "pveum role modify HyperFleet --append --privs VM.Config.Cloudinit" {
		t.Errorf("Fix: %q", got)
	}
}

// FuzzParseDenied: any message parses without panicking, and what parses
// has a path and at least one privilege.
func FuzzParseDenied(f *testing.F) {
	f.Add("Permission check failed (/vms/100, VM.Allocate)")
	f.Add("Permission check failed (/, A|B)")
	f.Add("Permission check failed (/x, |)")
	f.Fuzz(func(t *testing.T, msg string) {
		path, privs, ok := ParseDenied(msg)
		if ok && (path == "" || len(privs) == 0) {
			t.Fatalf("%q: path %q privs %v", msg, path, privs)
		}
	})
}
