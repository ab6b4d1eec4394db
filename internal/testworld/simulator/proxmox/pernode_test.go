package proxmoxsim

import (
	"net/http"
	"strings"
	"testing"
)

// TestTemplateCopyPerNode: templates made per node on a node-local
// storage carry their tags, lower-case and ';'-separated in
// /cluster/resources as Proxmox lists them; each copy clones, linked, on
// its own node, and a clone of it to another node is refused as
// qemu-server refuses it, whatever a full clone's target storage (the
// source's volumes decide).
func TestTemplateCopyPerNode(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.Nodes = append(c.Nodes, NodeConfig{Name: "pve2", CPUs: 16, Memory: 64 << 30})
		c.Storages = append(c.Storages, StorageConfig{ID: "ceph", Type: "rbd", Content: []string{"images"}, Shared: true, Capacity: 1 << 40})
		c.Templates = []TemplateConfig{
			{VMID: 9001, Node: "pve1", Name: "debian-12-ci", Storage: "local-lvm", Tags: "CI,Debian12"},
			{VMID: 9002, Node: "pve2", Name: "debian-12-ci", Storage: "local-lvm", Tags: "debian12;ci"},
		}
	})
	templates := 0
	for _, r := range e.mustOK(e.call(http.MethodGet, "/cluster/resources", form("type", "vm"))).dataList(t) {
		if r["template"] != float64(1) {
			continue
		}
		templates++
		if r["tags"] != "ci;debian12" {
			t.Errorf("template %v lists tags %v, want ci;debian12", r["vmid"], r["tags"])
		}
	}
	if templates != 2 {
		t.Errorf("/cluster/resources lists %d templates, want 2", templates)
	}
	e.wantExit(e.upid(e.call(http.MethodPost, "/nodes/pve2/qemu/9002/clone", form("newid", "200"))), "OK")
	for _, tc := range []struct{ name, node, vmid string }{
		{"linked", "pve1", "9001"}, {"full to shared storage", "pve2", "9002"},
	} {
		params := form("newid", "201", "target", map[string]string{"pve1": "pve2", "pve2": "pve1"}[tc.node])
		if tc.name != "linked" {
			params.Set("full", "1")
			params.Set("storage", "ceph")
		}
		r := e.call(http.MethodPost, "/nodes/"+tc.node+"/qemu/"+tc.vmid+"/clone", params)
		if r.code != http.StatusInternalServerError || !strings.Contains(r.status, "(VM uses local storage)") {
			t.Errorf("%s clone of %s to another node: %s %s, want qemu-server's refusal", tc.name, tc.vmid, r.status, r.raw)
		}
	}
	for _, v := range e.sim.VMs() {
		if v.VMID == 200 && v.Node != "pve2" {
			t.Errorf("the clone of pve2's copy is on %s", v.Node)
		}
	}
}
