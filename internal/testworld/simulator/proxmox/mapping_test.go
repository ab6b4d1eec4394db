package proxmoxsim

import (
	"net/http"
	"reflect"
	"strconv"
	"testing"
)

// mappingEnv is a two-node simulator with mappings gpu (two devices on
// pve1, one on pve2), solo (one device on pve1) and far (pve2 only).
func mappingEnv(t *testing.T, mutate func(*Config)) *simEnv {
	t.Helper()
	e := newEnv(t, func(cfg *Config) {
		cfg.Nodes = append(cfg.Nodes, NodeConfig{Name: "pve2"})
		if mutate != nil {
			mutate(cfg)
		}
	})
	for _, m := range []PCIMapping{
		{ID: "gpu", Description: "L4", Devices: []PCIDevice{
			{Node: "pve1", Path: "0000:01:00.0", IOMMUGroup: 11}, {Node: "pve1", Path: "0000:02:00.0", IOMMUGroup: 12},
			{Node: "pve2", Path: "0000:01:00.0", IOMMUGroup: 11}}},
		{ID: "solo", Devices: []PCIDevice{{Node: "pve1", Path: "0000:03:00.0"}}},
		{ID: "far", Devices: []PCIDevice{{Node: "pve2", Path: "0000:04:00.0"}}},
	} {
		if err := e.sim.SetPCIMapping(m); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// TestPCIMappingList: the listing as PCI.pm's index returns it, each
// mapping only to a caller with a Mapping privilege on it.
func TestPCIMappingList(t *testing.T) {
	cases := []struct {
		name  string
		privs Privileges
		want  []string
	}{
		{"Mapping.Use on /mapping/pci", Privileges{"/mapping/pci": {"Mapping.Use"}}, []string{"far", "gpu", "solo"}},
		{"Mapping.Audit on one mapping", Privileges{"/mapping/pci/gpu": {"Mapping.Audit"}}, []string{"gpu"}},
		{"Mapping.Modify on one mapping", Privileges{"/mapping/pci/solo": {"Mapping.Modify"}}, []string{"solo"}},
		{"no Mapping privilege", Privileges{"/": {"VM.Audit", "Sys.Audit"}}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := mappingEnv(t, func(cfg *Config) {
				cfg.Users = append(cfg.Users, UserConfig{ID: "hf@pve", Privileges: Privileges{"/": {"Administrator"}},
					Tokens: []TokenConfig{{ID: "op", Secret: "s", Privileges: c.privs}}})
			})
			e.auth = "PVEAPIToken=hf@pve!op=s"
			var got []string
			for _, m := range e.mustOK(e.call(http.MethodGet, "/cluster/mapping/pci", nil)).dataList(t) {
				got = append(got, m["id"].(string))
				if m["id"] == "gpu" {
					want := []any{"id=10de:2230,iommugroup=11,node=pve1,path=0000:01:00.0",
						"id=10de:2230,iommugroup=12,node=pve1,path=0000:02:00.0", "id=10de:2230,iommugroup=11,node=pve2,path=0000:01:00.0"}
					if !reflect.DeepEqual(m["map"], want) || m["description"] != "L4" || m["digest"] == "" {
						t.Errorf("gpu = %v", m)
					}
				}
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("listed %v, want %v", got, c.want)
			}
		})
	}
}

// TestHostPCIPrivileges: a hostpciN mapping wants Mapping.Use on the
// mapping and VM.Config.HWType on the VM (check_hostpci_perm); the
// mapping need not exist to be written.
func TestHostPCIPrivileges(t *testing.T) {
	cases := []struct {
		name   string
		privs  Privileges
		value  string
		status string
	}{
		{"without Mapping.Use", Privileges{"/": {"VM.Config.HWType"}}, "mapping=gpu", "403 Permission check failed (/mapping/pci/gpu, Mapping.Use)"},
		{"Mapping.Use on another mapping", Privileges{"/": {"VM.Config.HWType"}, "/mapping/pci/solo": {"Mapping.Use"}}, "mapping=gpu",
			"403 Permission check failed (/mapping/pci/gpu, Mapping.Use)"},
		{"without VM.Config.HWType", Privileges{"/": {"VM.Config.CPU", "Mapping.Use"}}, "mapping=gpu,pcie=1", "403 Permission check failed (/vms/101, VM.Config.HWType)"},
		{"both", Privileges{"/": {"VM.Config.HWType"}, "/mapping/pci/gpu": {"Mapping.Use"}}, "mapping=gpu,pcie=1", "200 OK"},
		{"a mapping that does not exist", Privileges{"/": {"VM.Config.HWType", "Mapping.Use"}}, "mapping=nope", "200 OK"},
		{"an option it does not know", Privileges{"/": {"VM.Config.HWType", "Mapping.Use"}}, "mapping=gpu,bogus=1", "400 Parameter verification failed."},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := mappingEnv(t, func(cfg *Config) {
				cfg.Users = append(cfg.Users, UserConfig{ID: "hf@pve", Privileges: Privileges{"/": {"Administrator"}},
					Tokens: []TokenConfig{{ID: "op", Secret: "s", Privileges: c.privs}}})
			})
			e.wantExit(e.clone("101", nil), "OK")
			e.auth = "PVEAPIToken=hf@pve!op=s"
			if r := e.call(http.MethodPut, "/nodes/pve1/qemu/101/config", form("hostpci0", c.value)); r.status != c.status {
				t.Fatalf("status %q, want %q (%s)", r.status, c.status, r.raw)
			}
		})
	}
}

// TestHostPCIStart: a start takes a free device of the mapping on the
// VM's node, and fails as vm_start does when there is none; a stop frees
// the device.
func TestHostPCIStart(t *testing.T) {
	type vmDef struct {
		hostpci []string // hostpci0.., in order
		machine string
	}
	cases := []struct {
		name string
		vms  []vmDef
		// exits are each VM's start task's exit status, in order.
		exits []string
		inUse map[string][]int
	}{
		{"two devices for two VMs, none for the third",
			[]vmDef{{hostpci: []string{"mapping=gpu"}}, {hostpci: []string{"mapping=gpu"}}, {hostpci: []string{"mapping=gpu"}}},
			[]string{"OK", "OK", "could not find a free device for 'hostpci0'"},
			map[string][]int{"pve1/0000:01:00.0": {101}, "pve1/0000:02:00.0": {102}}},
		{"one VM takes both devices",
			[]vmDef{{hostpci: []string{"mapping=gpu", "mapping=gpu"}}, {hostpci: []string{"mapping=gpu"}}},
			[]string{"OK", "could not find a free device for 'hostpci0'"},
			map[string][]int{"pve1/0000:01:00.0": {101}, "pve1/0000:02:00.0": {101}}},
		{"a mapping of one device is reserved by the running VM",
			[]vmDef{{hostpci: []string{"mapping=solo"}}, {hostpci: []string{"mapping=solo"}}},
			[]string{"OK", "PCI device '0000:03:00.0' already in use by VMID '101'"},
			map[string][]int{"pve1/0000:03:00.0": {101}}},
		{"a single device twice in one VM",
			[]vmDef{{hostpci: []string{"mapping=solo", "mapping=solo"}}},
			[]string{"device '0000:03:00.0' assigned more than once"}, map[string][]int{}},
		{"no entry on the VM's node",
			[]vmDef{{hostpci: []string{"mapping=far"}}, {hostpci: []string{"mapping=nope"}}},
			[]string{"PCI device mapping not found for 'far'", "PCI device mapping not found for 'nope'"}, map[string][]int{}},
		{"pcie wants q35",
			[]vmDef{{hostpci: []string{"mapping=gpu,pcie=1"}}, {hostpci: []string{"mapping=gpu,pcie=1"}, machine: "pc-q35-9.0"}},
			[]string{"q35 machine model is not enabled", "OK"}, map[string][]int{"pve1/0000:01:00.0": {102}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := mappingEnv(t, nil)
			for i, d := range c.vms {
				id := strconv.Itoa(101 + i)
				e.wantExit(e.clone(id, nil), "OK")
				p := form()
				for j, v := range d.hostpci {
					p.Set("hostpci"+strconv.Itoa(j), v)
				}
				if d.machine != "" {
					p.Set("machine", d.machine)
				}
				e.mustOK(e.call(http.MethodPut, "/nodes/pve1/qemu/"+id+"/config", p))
			}
			for i, want := range c.exits {
				e.wantExit(e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/"+strconv.Itoa(101+i)+"/status/start", nil)), want)
			}
			if got := e.sim.PCIDevicesInUse(); !reflect.DeepEqual(got, c.inUse) {
				t.Errorf("in use %v, want %v", got, c.inUse)
			}
			// Every VM stopped: every device free again.
			for i, exit := range c.exits {
				if exit == "OK" {
					e.wantExit(e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/"+strconv.Itoa(101+i)+"/status/stop", nil)), "OK")
				}
			}
			if got := e.sim.PCIDevicesInUse(); len(got) != 0 {
				t.Errorf("after the stops, in use %v", got)
			}
		})
	}
}
