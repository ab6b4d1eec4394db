package proxmox

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// inventories draws what a Proxmox VE cluster of two nodes holds that a
// machine template may name: templates and plain VMs at distinct ids, on
// either node, their names from a small set so that several share one.
var inventories = rapid.Custom(func(t *rapid.T) []proxmoxsim.TemplateConfig {
	ids := rapid.SliceOfNDistinct(rapid.IntRange(9000, 9015), 1, 6, rapid.ID[int]).Draw(t, "ids")
	var out []proxmoxsim.TemplateConfig
	for i, id := range ids {
		out = append(out, proxmoxsim.TemplateConfig{
			VMID: id, Node: rapid.SampledFrom([]string{"pve1", "pve2"}).Draw(t, fmt.Sprint("node ", i)),
			Name:    rapid.SampledFrom([]string{"debian-12-ci", "ubuntu-24-ci", "windows-ci"}).Draw(t, fmt.Sprint("name ", i)),
			Storage: "local-lvm", DiskSize: 32 << 30, Cores: 2, MemoryMiB: 2048, Agent: true, CloudInitStorage: "local-lvm",
			NotTemplate: rapid.IntRange(0, 4).Draw(t, fmt.Sprint("plain VM ", i)) == 0,
		})
	}
	return out
})

// Feature: hyperfleet-operator, Property 4: Template Reference Resolution
//
// TestTemplateReferenceProperty: on a cluster with a generated inventory
// of templates and plain VMs, a machine template's reference by id or by
// name (of what exists, what does not, a name several templates share, a
// plain VM) resolves to exactly the one template it names, with that
// template's id, name and node, or is refused as a configuration error
// whose reason says which case it is and whose message names the field to
// fix (spec.source.proxmox.templateID or templateName).
func TestTemplateReferenceProperty(t *testing.T) {
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		inv := inventories.Draw(rt, "inventory")
		e := newEnv(t, func(sim *proxmoxsim.Config, _ *provider.ClusterConfig) {
			sim.Nodes = append(sim.Nodes, proxmoxsim.NodeConfig{Name: "pve2", CPUs: 16, Memory: 64 << 30, MemoryUsed: 2 << 30, Disk: 100 << 30, IP: "192.0.2.12"})
			sim.Templates = inv
		})
		var src TemplateRef
		if rapid.Bool().Draw(rt, "by id") {
			src.ID = rapid.IntRange(9000, 9016).Draw(rt, "id")
		} else {
			src.Name = rapid.SampledFrom([]string{"debian-12-ci", "ubuntu-24-ci", "windows-ci", "missing"}).Draw(rt, "name")
		}

		// What the reference names, by the cluster's inventory.
		var want []proxmoxsim.TemplateConfig
		for _, c := range inv {
			if src.ID != 0 && c.VMID == src.ID || src.ID == 0 && c.Name == src.Name && !c.NotTemplate {
				want = append(want, c)
			}
		}
		field, reason := fieldTemplateName, ""
		switch {
		case src.ID != 0:
			field = fieldTemplateID
			switch {
			case len(want) == 0:
				reason = "TemplateNotFound"
			case want[0].NotTemplate:
				reason = "NotATemplate"
			}
		case len(want) == 0:
			reason = "TemplateNotFound"
		case len(want) > 1:
			reason = "TemplateAmbiguous"
		}

		info, err := e.p.ValidateTemplate(t.Context(), provider.TemplateSource{Settings: src})
		if reason != "" {
			if err == nil {
				rt.Fatalf("reference %+v resolved to %+v; want refused (%s)", src, info, reason)
			}
			if provider.Classify(err) != provider.ClassConfiguration || provider.ReasonOf(err) != reason || !strings.Contains(err.Error(), field) {
				rt.Fatalf("reference %+v: %s error, reason %s: %v; want a configuration error, reason %s, naming %s", src, provider.Classify(err), provider.ReasonOf(err), err, reason, field)
			}
			if reason == "TemplateAmbiguous" {
				ids := make([]string, 0, len(want))
				for _, c := range want {
					ids = append(ids, fmt.Sprint(c.VMID))
				}
				sort.Strings(ids)
				if !strings.Contains(err.Error(), strings.Join(ids, " ")) {
					rt.Fatalf("ambiguity error %q does not list the ids %v", err, ids)
				}
			}
			return
		}
		if err != nil {
			rt.Fatalf("reference %+v to %+v refused: %v", src, want[0], err)
		}
		if info.ID != want[0].VMID || info.Name != want[0].Name || info.Node != want[0].Node {
			rt.Fatalf("reference %+v resolved to id %d %q on %s; want %d %q on %s", src, info.ID, info.Name, info.Node, want[0].VMID, want[0].Name, want[0].Node)
		}
		if !slices.Contains(info.Storages, "local-lvm") {
			rt.Fatalf("template %d: storages %v", info.ID, info.Storages)
		}
	})
}
