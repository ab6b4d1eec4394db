package proxmox

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	proxmox "github.com/luthermonson/go-proxmox"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// isolationSpec is testSpec held to a policy: web egress with more ports
// than one Proxmox rule may list, a management drop, the operator's ping.
func isolationSpec(name, uid string) *provider.VMSpec {
	spec := testSpec(name, uid)
	var ports []provider.PortRange
	for p := uint16(8000); p < 8020; p++ {
		ports = append(ports, provider.PortRange{From: p, To: p})
	}
	spec.Isolation = &provider.Isolation{Policy: "web", DHCP: true, AddressSubnets: []string{"10.99.0.0/24"},
		Egress: []provider.FirewallRule{
			{Action: provider.FirewallAccept, CIDR: "198.51.100.5", Protocol: provider.ProtocolTCP, Ports: []provider.PortRange{{From: 9443, To: 9443}}, Comment: "the operator's agent server"},
			{Action: provider.FirewallDrop, CIDR: "10.0.0.0/24", Comment: "management network"},
			{Action: provider.FirewallAccept, CIDR: "0.0.0.0/0", Protocol: provider.ProtocolTCP, Ports: ports, Comment: "policy egress"},
		},
		Ingress: []provider.FirewallRule{{Action: provider.FirewallAccept, CIDR: "198.51.100.5", Protocol: provider.ProtocolICMP, Comment: "the operator's ping check"}},
	}
	return spec
}

// get reads path through the provider's own API client.
func get[T any](t *testing.T, e *env, path string) T {
	t.Helper()
	var out T
	if err := e.p.api.call(context.Background(), http.MethodGet, path, nil, nil, &out); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return out
}

// TestIsolatedVM: a VM with Isolation is built with its policy's security
// group (built whole, rules in order, ports split where Proxmox's limit
// asks), its firewall options, exactly its one group rule (the template's
// copied rules gone), its leased address in ipfilter-net0 and firewall=1
// on net0; a second VM of the same rules shares the group; a leased
// address outside the subnets is never allowed; Probe says whether the
// datacenter firewall would apply any of it; the sweep's listing and
// deletion see the group.
func TestIsolatedVM(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.p.cfg.Isolated = true
	info, err := e.p.Probe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(info.IsolationProblem, "datacenter firewall") {
		t.Fatalf("Probe with the datacenter firewall off: IsolationProblem %q", info.IsolationProblem)
	}
	if err := e.p.api.call(ctx, http.MethodPut, "/cluster/firewall/options", nil, map[string]any{"enable": 1}, nil); err != nil {
		t.Fatal(err)
	}
	if info, err = e.p.Probe(ctx); err != nil || info.IsolationProblem != "" {
		t.Fatalf("Probe with the datacenter firewall on: %q, %v", info.IsolationProblem, err)
	}
	// The template carries a rule and an ipfilter entry of its own, which
	// a clone copies: neither may survive into an isolated VM.
	tmplFW := "/nodes/pve1/qemu/9000/firewall"
	for _, c := range []struct {
		path string
		body map[string]any
	}{
		{tmplFW + "/rules", map[string]any{"type": "in", "action": "ACCEPT", "enable": 1}},
		{tmplFW + "/ipset", map[string]any{"name": ipfilterSet}},
		{tmplFW + "/ipset/" + ipfilterSet, map[string]any{"cidr": "10.99.0.200"}},
	} {
		if err := e.p.api.call(ctx, http.MethodPost, c.path, nil, c.body, nil); err != nil {
			t.Fatalf("POST %s: %v", c.path, err)
		}
	}

	spec := isolationSpec("iso-a", "uid-iso-a")
	out := e.ensure(e.p, spec, provider.Progress{}, provider.PhaseRunning, 200)
	vmid := vmidOf(t, out.res.Progress.ID)
	final, _ := e.p.groupName(spec.Isolation.RulesDigest())
	groups := get[[]*proxmox.FirewallSecurityGroup](t, e, "/cluster/firewall/groups")
	if len(groups) != 1 || groups[0].Group != final {
		t.Fatalf("security groups %+v, want only %s", groups, final)
	}
	rules := get[[]*proxmox.FirewallRule](t, e, "/cluster/firewall/groups/"+final)
	var got []string
	for _, r := range rules {
		got = append(got, fmt.Sprintf("%d %s %s %s%s %s %s %d", r.Pos, r.Type, r.Action, r.Dest, r.Source, r.Proto, r.Dport, r.Enable))
	}
	want := []string{
		"0 out ACCEPT 198.51.100.5 tcp 9443 1",
		"1 out DROP 10.0.0.0/24   1",
		"2 out ACCEPT 0.0.0.0/0 tcp 8000,8001,8002,8003,8004,8005,8006,8007,8008,8009,8010,8011,8012,8013,8014 1",
		"3 out ACCEPT 0.0.0.0/0 tcp 8015,8016,8017,8018,8019 1",
		"4 in ACCEPT 198.51.100.5 icmp  1",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("group rules:\n got %q\nwant %q", got, want)
	}
	vmFW := fmt.Sprintf("/nodes/%s/qemu/%d/firewall", out.res.Progress.Node, vmid)
	opts := get[map[string]any](t, e, vmFW+"/options")
	for k, v := range map[string]string{"enable": "1", "policy_in": "DROP", "policy_out": "DROP", "ipfilter": "1", "macfilter": "1", "dhcp": "1", "radv": "0"} {
		if fmt.Sprint(opts[k]) != v {
			t.Errorf("VM firewall option %s = %v, want %s (all: %v)", k, opts[k], v, opts)
		}
	}
	vmRules := get[[]*proxmox.FirewallRule](t, e, vmFW+"/rules")
	if len(vmRules) != 1 || vmRules[0].Type != "group" || vmRules[0].Action != final || vmRules[0].Enable != 1 {
		t.Fatalf("VM rules %+v, want only GROUP %s", vmRules, final)
	}
	entries := get[[]*proxmox.FirewallIPSetEntry](t, e, vmFW+"/ipset/"+ipfilterSet)
	var cidrs []string
	for _, en := range entries {
		cidrs = append(cidrs, en.CIDR)
	}
	if !slices.ContainsFunc(out.res.Addresses, func(a string) bool { return slices.Contains(cidrs, a) }) || slices.Contains(cidrs, "10.99.0.200") {
		t.Fatalf("ipfilter-net0 %v: want the VM's leased address of %v, and not the template's", cidrs, out.res.Addresses)
	}
	cfg, err := e.p.api.config(ctx, out.res.Progress.Node, vmid)
	if err != nil || !strings.Contains(cfg["net0"], "firewall=1") {
		t.Fatalf("net0 %q (%v): want firewall=1", cfg["net0"], err)
	}

	// The same rules: the same group. Other subnets: no address allowed.
	spec2 := isolationSpec("iso-b", "uid-iso-b")
	spec2.Isolation.AddressSubnets = []string{"192.0.2.0/24"}
	out2 := e.ensure(e.p, spec2, provider.Progress{}, provider.PhaseRunning, 200)
	if groups := get[[]*proxmox.FirewallSecurityGroup](t, e, "/cluster/firewall/groups"); len(groups) != 1 {
		t.Fatalf("a second VM of the same rules made another group: %+v", groups)
	}
	vmFW2 := fmt.Sprintf("/nodes/%s/qemu/%d/firewall", out2.res.Progress.Node, vmidOf(t, out2.res.Progress.ID))
	if entries := get[[]*proxmox.FirewallIPSetEntry](t, e, vmFW2+"/ipset/"+ipfilterSet); len(entries) != 0 {
		t.Fatalf("an address outside the VM subnets was allowed: %+v", entries)
	}

	objects, err := e.p.ListIsolationObjects(ctx)
	if err != nil || len(objects) != 1 || objects[0].ID != final || !objects[0].For(spec.Isolation.RulesDigest()) {
		t.Fatalf("ListIsolationObjects: %+v, %v", objects, err)
	}
	if err := e.p.DeleteIsolationObject(ctx, provider.IsolationObject{ID: "hfforeign000000000"}); err == nil {
		t.Fatal("a group not named by this install was deleted")
	}
	if err := e.p.DeleteIsolationObject(ctx, objects[0]); err != nil {
		t.Fatal(err)
	}
	if groups := get[[]*proxmox.FirewallSecurityGroup](t, e, "/cluster/firewall/groups"); len(groups) != 0 {
		t.Fatalf("the group survived its deletion: %+v", groups)
	}
}

// TestIsolationGroupStaging: a group left half-built under its staging
// name (an operator stopped between its rules) is built again from the
// start, and only the whole group carries the final name.
func TestIsolationGroupStaging(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	spec := isolationSpec("iso-s", "uid-iso-s")
	final, staging := e.p.groupName(spec.Isolation.RulesDigest())
	if len(final) != 18 || len(staging) != 18 {
		t.Fatalf("group names %q, %q: want Proxmox's 18 characters", final, staging)
	}
	if err := e.p.api.call(ctx, http.MethodPost, "/cluster/firewall/groups", nil, map[string]any{"group": staging}, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.p.api.call(ctx, http.MethodPost, "/cluster/firewall/groups/"+staging, nil, map[string]any{"type": "out", "action": "ACCEPT", "enable": 1}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.ensureGroup(ctx, spec.Isolation); err != nil {
		t.Fatal(err)
	}
	groups := get[[]*proxmox.FirewallSecurityGroup](t, e, "/cluster/firewall/groups")
	if len(groups) != 1 || groups[0].Group != final {
		t.Fatalf("groups %+v, want only %s", groups, final)
	}
	if rules := get[[]*proxmox.FirewallRule](t, e, "/cluster/firewall/groups/"+final); len(rules) != len(groupRules(spec.Isolation)) {
		t.Fatalf("group %s has %d rules, want %d", final, len(rules), len(groupRules(spec.Isolation)))
	}
}

// TestPortLists: pve-firewall's multiport limit of 15 numbers, a range
// counting two.
func TestPortLists(t *testing.T) {
	r := func(a, b uint16) provider.PortRange { return provider.PortRange{From: a, To: b} }
	cases := []struct {
		ports []provider.PortRange
		want  []string
	}{
		{nil, []string{""}},
		{[]provider.PortRange{r(443, 443), r(8000, 8100)}, []string{"443,8000:8100"}},
		{[]provider.PortRange{r(1, 2), r(3, 4), r(5, 6), r(7, 8), r(9, 10), r(11, 12), r(13, 14), r(15, 15), r(16, 17)}, []string{"1:2,3:4,5:6,7:8,9:10,11:12,13:14,15", "16:17"}},
	}
	for _, c := range cases {
		if got := portLists(c.ports); !slices.Equal(got, c.want) {
			t.Errorf("portLists(%v) = %q, want %q", c.ports, got, c.want)
		}
	}
}
