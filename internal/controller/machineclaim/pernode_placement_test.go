package machineclaim

import (
	"testing"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestSelectorTemplateClaim: a claim of a template naming its Proxmox
// template by tags, allowed by a tenancy tag entry, gets a VM cloned on a
// node holding a copy from that node's own copy (never across nodes: the
// copies are on each node's local storage), and its signed placement
// record names the selector, not one copy.
func TestSelectorTemplateClaim(t *testing.T) {
	copyIDs := map[string]string{simNode: "9101", "pve2": "9102"}
	w := newSimWorld(t, simOptions{
		sim: func(c *proxmoxsim.Config) {
			c.Nodes = append(c.Nodes,
				proxmoxsim.NodeConfig{Name: "pve2", CPUs: 16, Memory: 64 << 30},
				proxmoxsim.NodeConfig{Name: "pve3", CPUs: 16, Memory: 512 << 30})
			for node, id := range map[string]int{simNode: 9101, "pve2": 9102} {
				c.Templates = append(c.Templates, proxmoxsim.TemplateConfig{VMID: id, Node: node, Name: "debian-12-ci", Storage: authorizedStorage,
					DiskSize: 32 << 30, Cores: 1, MemoryMiB: 1024, Agent: true, Tags: "ci;Debian12"})
			}
		},
		cluster: func(c *hfv1.HypervisorCluster) {
			c.Spec.Tenancy[0].Templates = append(c.Spec.Tenancy[0].Templates, hfv1.AllowedTemplate{Tag: "debian12"})
		},
		provider: func(cfg *provider.ClusterConfig) { cfg.Nodes = []string{simNode, "pve2", "pve3"} },
	})
	for _, name := range []string{"kit.yaml", "team-a.yaml"} {
		for _, node := range []string{"pve2", "pve3"} {
			if _, err := w.sim.PutSnippet("local", node, name, []byte("#cloud-config\n")); err != nil {
				t.Fatal(err)
			}
		}
	}
	w.editTemplate(func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Spec.Source.Proxmox = hfv1.ProxmoxSource{TemplateSelector: &hfv1.TemplateSelector{MatchTags: []string{"debian12", "CI"}},
			CloneMode: hfv1.CloneModeLinked, Pool: authorizedPool}
	})
	got := w.runUntil(w.newClaim("runner-1"), "a running VM", provisioned)
	vm := w.vmOf(got)
	if copyIDs[vm.Node] == "" {
		t.Fatalf("VM %d is on %s, which holds no copy", vm.VMID, vm.Node)
	}
	clones := w.clonesSent()
	if len(clones) != 1 || clones[0]["source"] != copyIDs[vm.Node] || clones[0]["target"] != "" || clones[0]["full"] != "0" {
		t.Fatalf("clone requests %v, want one linked clone of %s's copy %s on its own node", clones, vm.Node, copyIDs[vm.Node])
	}
	p, _, err := ParsePlacement(got.Status.PlacementRecord)
	if err != nil || p.Template != "tags:ci,debian12" || !p.LinkedClone {
		t.Fatalf("placement record %+v (%v), want the selector tags:ci,debian12, linked", p, err)
	}
}
