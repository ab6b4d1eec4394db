package proxmoxsim

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox/privileges"
)

// TestPrivilegesByVersion: the simulated version picks the column of the
// privilege table (pkg/provider/proxmox/privileges) every route is checked
// against, and a refusal is RPCEnvironment.pm's "Permission check failed
// (<path>, <privilege>)": the first missing privilege of an all-of check,
// the whole list joined by '|' for an any-of one.
//
// Mutation: giving the agent's file-write the PVE 8 check on both versions
// (table.go) fails the PVE 9 rows; dropping check_drive_perms's old-value
// check (resolve.go configNeeds) fails the cloud-init drive row; dropping
// the simulator's StateStorage (auth.go needsLocked) fails the state
// storage row.
func TestPrivilegesByVersion(t *testing.T) {
	cases := []struct {
		version      int
		name         string
		privs        []string
		method, path string
		params       []string
		wantStatus   string // "" is a success
	}{
		{8, "file-write wants VM.Monitor", []string{"VM.GuestAgent.FileWrite"}, "POST", "/nodes/pve1/qemu/9000/agent/file-write",
			[]string{"file", "/x", "content", "y"}, "403 Permission check failed (/vms/9000, VM.Monitor)"},
		{9, "file-write wants a guest agent privilege", []string{"VM.Monitor"}, "POST", "/nodes/pve1/qemu/9000/agent/file-write",
			[]string{"file", "/x", "content", "y"}, "403 Permission check failed (/vms/9000, VM.GuestAgent.FileWrite|VM.GuestAgent.Unrestricted)"},
		{9, "agent reads want VM.GuestAgent.Audit", []string{"VM.Monitor"}, "GET", "/nodes/pve1/qemu/9000/agent/network-get-interfaces",
			nil, "403 Permission check failed (/vms/9000, VM.GuestAgent.Audit|VM.GuestAgent.Unrestricted)"},
		{8, "replacing a cloud-init drive wants VM.Config.Cloudinit", []string{"VM.Config.CDROM", "Datastore.AllocateSpace"}, "PUT", "/nodes/pve1/qemu/9000/config",
			[]string{"ide2", "none,media=cdrom"}, "403 Permission check failed (/vms/9000, VM.Config.Cloudinit)"},
		{9, "replacing a cloud-init drive with both privileges", []string{"VM.Config.CDROM", "VM.Config.Cloudinit"}, "PUT", "/nodes/pve1/qemu/9000/config",
			[]string{"ide2", "none,media=cdrom"}, ""},
		{9, "a tagged interface wants SDN.Use on the VLAN", []string{"VM.Config.Network"}, "PUT", "/nodes/pve1/qemu/9000/config",
			[]string{"net0", "virtio,bridge=vmbr0,tag=20"}, "403 Permission check failed (/sdn/zones/localnetwork/vmbr0/20, SDN.Use)"},
		{9, "ci options pass with VM.Config.Network", []string{"VM.Config.Network"}, "PUT", "/nodes/pve1/qemu/9000/config",
			[]string{"ciuser", "ci"}, ""},
		{9, "deleting an ISO wants Datastore.Allocate", []string{"Datastore.AllocateTemplate", "Datastore.AllocateSpace"}, "DELETE", "/nodes/pve1/storage/local/content/local:iso/x.iso",
			nil, "403 Permission check failed (/storage/local, Datastore.Allocate)"},
		{9, "a suspend to disk wants VM.Config.Disk", []string{"VM.PowerMgmt"}, "POST", "/nodes/pve1/qemu/9000/status/suspend",
			[]string{"todisk", "1"}, "403 Permission check failed (/vms/9000, VM.Config.Disk)"},
		{8, "a suspend to disk wants the state storage", []string{"VM.PowerMgmt", "VM.Config.Disk"}, "POST", "/nodes/pve1/qemu/9000/status/suspend",
			[]string{"todisk", "1"}, "403 Permission check failed (/storage/local-lvm, Datastore.AllocateSpace)"},
		{9, "a suspend to disk wants the statestorage given", []string{"VM.PowerMgmt", "VM.Config.Disk", "Datastore.AllocateSpace"}, "POST", "/nodes/pve1/qemu/9000/status/suspend",
			[]string{"todisk", "1", "statestorage", "local"}, ""},
		{9, "a pause wants VM.PowerMgmt alone", []string{"VM.PowerMgmt"}, "POST", "/nodes/pve1/qemu/9000/status/suspend",
			nil, ""},
		{8, "a resume wants VM.PowerMgmt", []string{"VM.Config.Disk"}, "POST", "/nodes/pve1/qemu/9000/status/resume",
			nil, "403 Permission check failed (/vms/9000, VM.PowerMgmt)"},
		{9, "deleting a saved state wants VM.PowerMgmt", []string{"VM.Config.Disk", "Datastore.AllocateSpace"}, "PUT", "/nodes/pve1/qemu/9000/config",
			[]string{"delete", "vmstate"}, "403 Permission check failed (/vms/9000, VM.PowerMgmt)"},
		{8, "a clone needs Datastore.AllocateSpace on the template's disks", []string{"VM.Clone", "VM.Allocate"}, "POST", "/nodes/pve1/qemu/9000/clone",
			[]string{"newid", "150"}, "403 Permission check failed (/storage/local-lvm, Datastore.AllocateSpace)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, func(cfg *Config) {
				cfg.PVEVersion = c.version
				cfg.Users = append(cfg.Users, UserConfig{ID: "hf@pve", Privileges: Privileges{"/": {"Administrator"}},
					Tokens: []TokenConfig{{ID: "op", Secret: "s", Privileges: Privileges{"/": c.privs}}}})
			})
			e.auth = "PVEAPIToken=hf@pve!op=s"
			r := e.call(c.method, c.path, form(c.params...))
			switch {
			case c.wantStatus == "" && r.code == http.StatusForbidden:
				t.Fatalf("refused: %s", r.status)
			case c.wantStatus != "" && r.status != c.wantStatus:
				t.Fatalf("status %q, want %q", r.status, c.wantStatus)
			}
		})
	}
}

// TestVersionReported: /version follows the simulated version, and a
// version the simulator does not model is refused.
func TestVersionReported(t *testing.T) {
	for v, want := range map[int]string{8: pve8Version, 9: pveVersion, 0: pveVersion} {
		e := newEnv(t, func(c *Config) { c.PVEVersion = v })
		if got := e.call("GET", "/version", nil).dataMap(t)["version"]; got != want {
			t.Errorf("PVE %d: version %v, want %s", v, got, want)
		}
	}
	cfg := testConfig()
	cfg.PVEVersion = 7
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "pveVersion 7") {
		t.Errorf("PVE 7: %v", err)
	}
}

// TestEveryRouteHasARow: each route is bound to its row of the table, and a
// route without one makes New fail instead of going unchecked.
func TestEveryRouteHasARow(t *testing.T) {
	for _, rt := range apiRoutes() {
		if _, ok := privileges.Lookup(rt.method, tablePath(rt.pattern)); !ok {
			t.Errorf("%s %s has no row", rt.method, rt.pattern)
		}
	}
	extra := append(apiRoutes(), newRoute(http.MethodGet, "/cluster/unknown", classOther, sch(), nil))
	if err := bindPrivileges(extra); err == nil || !strings.Contains(err.Error(), "/cluster/unknown") {
		t.Errorf("a route without a row: %v", err)
	}
}

// TestCallLog: WithCallLog hands every authenticated call's checks and
// filters to the log, refused ones too.
func TestCallLog(t *testing.T) {
	var mu sync.Mutex
	var recs []CallRecord
	e := newEnv(t, nil, WithCallLog(func(r CallRecord) {
		mu.Lock()
		defer mu.Unlock()
		recs = append(recs, r)
	}))
	e.call("GET", "/cluster/resources", nil)
	e.call("DELETE", "/nodes/pve1/qemu/9000", nil)
	mu.Lock()
	defer mu.Unlock()
	if len(recs) != 2 || recs[0].Path != "/cluster/resources" || len(recs[0].Filters) == 0 ||
		recs[1].Method != "DELETE" || len(recs[1].Needs) != 1 || recs[1].Needs[0].Privs[0] != "VM.Allocate" {
		t.Fatalf("records: %+v", recs)
	}
}
