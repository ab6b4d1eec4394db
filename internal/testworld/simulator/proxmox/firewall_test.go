package proxmoxsim

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestFirewallAPI walks the firewall endpoints with pve-firewall's answers:
// shapes, the order rules and entries are kept in, and its errors.
func TestFirewallAPI(t *testing.T) {
	e := newEnv(t, nil)
	const vmfw = "/nodes/pve1/qemu/9000/firewall"
	steps := []struct {
		method, path string
		params       url.Values
		want         string // status line ("200 OK" ...) or a prefix of it
		body         string // a substring of the body, if any
	}{
		{"GET", "/cluster/firewall/options", nil, "200", `"digest":`},
		{"PUT", "/cluster/firewall/options", form("enable", "1", "policy_in", "DROP"), "200", ""},
		{"GET", "/cluster/firewall/options", nil, "200", `"enable":1`},
		{"PUT", "/cluster/firewall/options", form("delete", "nope"), "400", `"delete":"no such option 'nope'"`},
		{"PUT", "/cluster/firewall/options", form("enable", "0", "digest", "0000"), "500 detected modified configuration - file changed by other user? Try again.", ""},
		{"PUT", "/cluster/firewall/options", form("policy_in", "ALLOW"), "400", `value 'ALLOW' does not have a value in the enumeration`},

		{"POST", "/cluster/firewall/groups", form("group", "hf-0123456789abcdef"), "400", `"group":"value may only be 18 characters long"`},
		{"POST", "/cluster/firewall/groups", form("group", "9pool"), "400", `"group":"value does not match the regex pattern"`},
		{"POST", "/cluster/firewall/groups", form("group", "hf-pool", "comment", "pool ci"), "200", ""},
		{"POST", "/cluster/firewall/groups", form("group", "hf-pool"), "400", `"group":"Security group 'hf-pool' already exists"`},
		{"GET", "/cluster/firewall/groups", nil, "200", `"comment":"pool ci","digest":"`},
		{"POST", "/cluster/firewall/groups/hf-pool", form("type", "in", "action", "ACCEPT", "proto", "tcp", "dport", "22", "enable", "1"), "200", ""},
		{"POST", "/cluster/firewall/groups/hf-pool", form("type", "out", "action", "DROP", "dest", "10.0.0.0/8"), "200", ""},
		// create_rule prepends; a rule sent without enable is disabled.
		{"GET", "/cluster/firewall/groups/hf-pool", nil, "200", `"action":"DROP","dest":"10.0.0.0/8","digest":"`},
		{"GET", "/cluster/firewall/groups/hf-pool/0", nil, "200", `"enable":0,"ipversion":4,"pos":0,"type":"out"`},
		{"GET", "/cluster/firewall/groups/hf-pool/1", nil, "200", `"dport":"22"`},
		{"GET", "/cluster/firewall/groups/hf-pool/2", nil, "500 no rule at position 2", ""},
		{"POST", "/cluster/firewall/groups/hf-pool", form("type", "group", "action", "other"), "400", `"type":"security groups not allowed"`},
		{"POST", "/cluster/firewall/groups/hf-pool", form("type", "in", "action", "ACCEPT", "macro", "SSH"), "400", `"macro":"macros are not supported by the simulator`},
		{"POST", "/cluster/firewall/groups/hf-pool", form("type", "in", "action", "ACCEPT", "dport", "22"), "400", `"proto":"missing property - 'dport' requires this property"`},
		{"POST", "/cluster/firewall/groups/hf-pool", form("type", "in", "action", "ACCEPT", "source", "10.0.0.1,fd00::1"), "400", `mixed ipv4/ipv6`},
		{"PUT", "/cluster/firewall/groups/hf-pool/1", form("moveto", "0"), "200", ""},
		{"GET", "/cluster/firewall/groups/hf-pool/0", nil, "200", `"dport":"22"`},
		{"PUT", "/cluster/firewall/groups/hf-pool/1", form("delete", "action"), "400", `"delete":"unable to delete required property 'action'"`},
		{"DELETE", "/cluster/firewall/groups/hf-pool", nil, "500 Security group 'hf-pool' is not empty", ""},
		{"GET", "/cluster/firewall/groups/nope", nil, "500 no such security group 'nope'", ""},

		{"GET", vmfw + "/options", nil, "200", `{"data":{"digest":"`},
		{"PUT", vmfw + "/options", form("enable", "1", "ipfilter", "1", "policy_in", "DROP", "macfilter", "0"), "200", ""},
		{"GET", vmfw + "/options", nil, "200", `"enable":1,"ipfilter":1,"macfilter":0,"policy_in":"DROP"`},
		{"PUT", vmfw + "/options", form("dhcp", "yes"), "400", `"dhcp":"type check ('boolean') failed - got 'yes'"`},
		{"POST", vmfw + "/rules", form("type", "group", "action", "hf-pool", "enable", "1"), "200", ""},
		{"POST", vmfw + "/rules", form("type", "in", "action", "ACCEPT", "source", "+peers"), "400", `"source":"no such ipset 'peers'"`},
		{"POST", vmfw + "/rules", form("type", "in", "action", "ACCEPT", "iface", "eth0"), "400", `"iface":"value does not match the regex pattern 'net\\d+'"`},
		{"GET", vmfw + "/rules", nil, "200", `"action":"hf-pool"`},
		{"POST", vmfw + "/ipset", form("name", "ipfilter-net0", "comment", "own"), "200", ""},
		{"POST", vmfw + "/ipset", form("name", "ipfilter-net0"), "400", `"name":"IPSet 'ipfilter-net0' already exists"`},
		{"POST", vmfw + "/ipset/ipfilter-net0", form("cidr", "10.99.0.10/32"), "200", ""},
		{"POST", vmfw + "/ipset/ipfilter-net0", form("cidr", "10.99.0.77/24", "nomatch", "1"), "200", ""},
		{"POST", vmfw + "/ipset/ipfilter-net0", form("cidr", "10.99.0.10"), "400", `"cidr":"address '10.99.0.10' already exists"`},
		{"POST", vmfw + "/ipset/ipfilter-net0", form("cidr", "0.0.0.0/0"), "400", `"cidr":"a zero prefix is not allowed in ipset entries"`},
		{"GET", vmfw + "/ipset/ipfilter-net0", nil, "200", `[{"cidr":"10.99.0.0/24","digest":"`},
		{"GET", vmfw + "/ipset/ipfilter-net0/10.99.0.0%2F24", nil, "200", `"nomatch":1`},
		{"PUT", vmfw + "/ipset/ipfilter-net0/10.99.0.0%2F24", form("comment", "lan"), "200", ""},
		{"GET", vmfw + "/ipset/ipfilter-net0/10.99.0.0%2F24", nil, "200", `{"data":{"cidr":"10.99.0.0/24","comment":"lan","digest":"`},
		{"GET", vmfw + "/ipset/ipfilter-net0/10.1.1.1", nil, "400", `"cidr":"no such IP/Network"`},
		{"DELETE", vmfw + "/ipset/ipfilter-net0", nil, "500 IPSet 'ipfilter-net0' is not empty", ""},
		{"GET", vmfw + "/ipset", nil, "200", `"comment":"own"`},
		{"GET", vmfw + "/ipset/nope", nil, "500 no such IPSet 'nope'", ""},
	}
	for i, s := range steps {
		r := e.call(s.method, s.path, s.params)
		if !strings.HasPrefix(r.status, s.want) || !strings.Contains(string(r.raw), s.body) {
			t.Fatalf("step %d %s %s %v: got %s %s, want %s with %s", i, s.method, s.path, s.params, r.status, r.raw, s.want, s.body)
		}
	}

	// What the compiler is given: template 9000's NIC has no firewall=1,
	// so nothing of the VM is filtered until it does.
	comp, err := e.sim.FirewallRuleset()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(comp.Ruleset, "vm9000") {
		t.Fatalf("a NIC without firewall=1 was compiled:\n%s", comp.Ruleset)
	}
	e.mustOK(e.call("PUT", "/nodes/pve1/qemu/9000/config", form("net0", "virtio=BC:24:11:00:00:01,bridge=vmbr0,firewall=1")))
	comp, _ = e.sim.FirewallRuleset()
	for _, want := range []string{`iifname "hf9000" jump vm9000_net0_out`, "jump group0_in", "10.99.0.10", "fe80::be24:11ff:fe00:1"} {
		if !strings.Contains(comp.Ruleset, want) {
			t.Fatalf("ruleset lacks %q:\n%s", want, comp.Ruleset)
		}
	}
}

// TestFirewallCloneAndDestroy: a clone gets a copy of its source's
// firewall config (clone_vmfw_conf), a destroy removes the VM's
// (remove_vmfw_conf).
func TestFirewallCloneAndDestroy(t *testing.T) {
	e := newEnv(t, nil)
	e.mustOK(e.call("PUT", "/nodes/pve1/qemu/9000/firewall/options", form("enable", "1")))
	e.mustOK(e.call("POST", "/nodes/pve1/qemu/9000/firewall/rules", form("type", "in", "action", "ACCEPT", "proto", "tcp", "dport", "22")))
	e.wantExit(e.clone("150", nil), "OK")
	if r := e.mustOK(e.call("GET", "/nodes/pve1/qemu/150/firewall/rules", nil)); !strings.Contains(string(r.raw), `"dport":"22"`) {
		t.Fatalf("clone's rules: %s", r.raw)
	}
	e.mustOK(e.call("PUT", "/nodes/pve1/qemu/150/firewall/options", form("ipfilter", "1")))
	if r := e.mustOK(e.call("GET", "/nodes/pve1/qemu/9000/firewall/options", nil)); strings.Contains(string(r.raw), "ipfilter") {
		t.Fatalf("the clone's options are the source's: %s", r.raw)
	}
	e.wantExit(e.upid(e.call("DELETE", "/nodes/pve1/qemu/150", nil)), "OK")
	if r := e.mustOK(e.call("GET", "/nodes/pve1/qemu/150/firewall/rules", nil)); string(r.raw) != `{"data":[]}` {
		t.Fatalf("a destroyed VM's rules: %s", r.raw)
	}
}

// TestFirewallPrivileges: the rows of pve-firewall's permission checks.
func TestFirewallPrivileges(t *testing.T) {
	cases := []struct {
		name         string
		privs        []string
		method, path string
		params       []string
		wantStatus   string
	}{
		{"VM rules want VM.Config.Network", []string{"VM.Audit", "VM.Config.Options"}, "POST", "/nodes/pve1/qemu/9000/firewall/rules",
			[]string{"type", "in", "action", "ACCEPT"}, "403 Permission check failed (/vms/9000, VM.Config.Network)"},
		{"VM options read with VM.Audit", []string{"VM.Audit"}, "GET", "/nodes/pve1/qemu/9000/firewall/options", nil, ""},
		{"VM ipset reads want VM.Audit", []string{"VM.Config.Network"}, "GET", "/nodes/pve1/qemu/9000/firewall/ipset", nil,
			"403 Permission check failed (/vms/9000, VM.Audit)"},
		{"VM ipset entries with VM.Config.Network", []string{"VM.Config.Network"}, "POST", "/nodes/pve1/qemu/9000/firewall/ipset",
			[]string{"name", "ipfilter-net0"}, ""},
		{"groups want Sys.Modify on /", []string{"VM.Config.Network", "Sys.Audit"}, "POST", "/cluster/firewall/groups",
			[]string{"group", "hf-x"}, "403 Permission check failed (/, Sys.Modify)"},
		{"the group list is open to all", nil, "GET", "/cluster/firewall/groups", nil, ""},
		{"group rules read with Sys.Audit", []string{"VM.Audit"}, "GET", "/cluster/firewall/groups/x", nil,
			"403 Permission check failed (/, Sys.Audit)"},
		{"datacenter options want Sys.Modify", []string{"Sys.Audit"}, "PUT", "/cluster/firewall/options",
			[]string{"enable", "1"}, "403 Permission check failed (/, Sys.Modify)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, func(cfg *Config) {
				cfg.Users = append(cfg.Users, UserConfig{ID: "hf@pve", Privileges: Privileges{"/": {"Administrator"}},
					Tokens: []TokenConfig{{ID: "op", Secret: "s", Privileges: Privileges{"/": c.privs}}}})
			})
			e.auth = "PVEAPIToken=hf@pve!op=s"
			r := e.call(c.method, c.path, form(c.params...))
			switch {
			case c.wantStatus == "" && r.code != http.StatusOK:
				t.Fatalf("got %s: %s", r.status, r.raw)
			case c.wantStatus != "" && r.status != c.wantStatus:
				t.Fatalf("status %q, want %q", r.status, c.wantStatus)
			}
		})
	}
}
