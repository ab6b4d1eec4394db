package pvefw

import (
	"strings"
	"testing"
)

func off() *bool { b := false; return &b }

func in(action string, f func(*Rule)) Rule {
	r := Rule{Type: TypeIn, Action: action, Enable: true}
	if f != nil {
		f(&r)
	}
	return r
}

func out(action string, f func(*Rule)) Rule {
	r := Rule{Type: TypeOut, Action: action, Enable: true}
	if f != nil {
		f(&r)
	}
	return r
}

func tcp(port string) func(*Rule) { return func(r *Rule) { r.Proto, r.DPort = "tcp", port } }

// TestRuleTable loads each case's compiled ruleset into a lab (a bridge and
// three VMs, a, b and c, in network namespaces) and sends real packets:
// each probe's verdict is what pve-firewall would do with it.
func TestRuleTable(t *testing.T) {
	l := newLab(t)
	enabled := ClusterOptions{Enable: true}
	cases := []struct {
		name    string
		cluster Cluster
		vms     func() []VM
		probes  []probe
	}{
		{
			name:    "datacenter firewall off: nothing is filtered",
			cluster: Cluster{},
			vms:     func() []VM { return []VM{l.vm("a", VMOptions{}, nil)} },
			probes:  []probe{{from: "b", to: "a", port: 80, want: vAccept}},
		},
		{
			name:    "NIC without firewall=1 or VM firewall disabled: unfiltered",
			cluster: Cluster{Options: enabled},
			vms: func() []VM {
				a := l.vm("a", VMOptions{}, nil)
				a.Firewall = false
				b := l.vm("b", VMOptions{}, nil)
				b.Options.Enable = false
				return []VM{a, b}
			},
			probes: []probe{{from: "c", to: "a", port: 80, want: vAccept}, {from: "c", to: "b", port: 80, want: vAccept}},
		},
		{
			name:    "defaults: policy_in DROP, policy_out ACCEPT, replies established",
			cluster: Cluster{Options: enabled},
			vms:     func() []VM { return []VM{l.vm("a", VMOptions{}, nil)} },
			probes: []probe{
				{from: "b", to: "a", port: 80, want: vDrop},
				{from: "host", to: "a", port: 80, want: vDrop},
				{from: "a", to: "b", port: 80, want: vAccept},
				{from: "a", to: "host", port: 80, want: vAccept},
				{from: "a", to: "b", port: 80, v6: true, want: vAccept},
				{from: "b", to: "a", proto: "udp", port: 5353, want: vDrop},
			},
		},
		{
			name:    "IN rules in order: source, ports, REJECT, policy REJECT",
			cluster: Cluster{Options: enabled},
			vms: func() []VM {
				return []VM{l.vm("a", VMOptions{PolicyIn: Reject}, []Rule{
					in(Reject, func(r *Rule) { r.Proto, r.DPort, r.Source = "tcp", "80", "10.77.0.13" }),
					in(Accept, func(r *Rule) { r.Proto, r.DPort, r.Source = "tcp", "80,440:445", "10.77.0.12,10.77.0.13" }),
					in(Drop, func(r *Rule) { r.Proto, r.DPort = "tcp", "22" }),
					in(Accept, func(r *Rule) { r.Proto, r.DPort, r.Enable = "tcp", "22", false }),
					in(Accept, func(r *Rule) { r.Proto, r.DPort, r.Source = "udp", "5353", "10.77.0.0/24" }),
				})}
			},
			probes: []probe{
				{from: "b", to: "a", port: 80, want: vAccept},
				{from: "b", to: "a", port: 443, want: vAccept},
				{from: "c", to: "a", port: 80, want: vReject},
				{from: "b", to: "a", port: 22, want: vDrop},
				{from: "host", to: "a", port: 443, want: vDrop}, // a REJECT on the namespace's own output drops
				{from: "b", to: "a", port: 80, v6: true, want: vReject},
				{from: "b", to: "a", proto: "udp", port: 5353, want: vAccept},
			},
		},
		{
			name: "security group: IN and OUT rules, ACCEPT ends the chain, DROP in the group is final",
			cluster: Cluster{Options: enabled, Groups: []Group{{Name: "hf-pool", Rules: []Rule{
				in(Accept, tcp("22")),
				out(Drop, func(r *Rule) { r.Dest = "10.77.0.13" }),
				out(Accept, tcp("80")),
			}}}},
			vms: func() []VM {
				return []VM{l.vm("a", VMOptions{PolicyOut: Drop}, []Rule{
					{Type: TypeGroup, Action: "hf-pool", Enable: true},
					out(Accept, tcp("443")),
				})}
			},
			probes: []probe{
				{from: "b", to: "a", port: 22, want: vAccept},
				{from: "b", to: "a", port: 80, want: vDrop},
				{from: "a", to: "b", port: 80, want: vAccept},
				{from: "a", to: "c", port: 80, want: vDrop},
				{from: "a", to: "b", port: 443, want: vAccept},
				{from: "a", to: "b", port: 22, want: vDrop},
			},
		},
		{
			name:    "VM to VM: the sender's OUT, then the receiver's IN",
			cluster: Cluster{Options: enabled},
			vms: func() []VM {
				return []VM{
					l.vm("a", VMOptions{}, []Rule{out(Drop, func(r *Rule) { r.Dest, r.Proto, r.DPort = "10.77.0.12", "tcp", "443" })}),
					l.vm("b", VMOptions{}, []Rule{in(Accept, tcp("80,443"))}),
				}
			},
			probes: []probe{
				{from: "a", to: "b", port: 80, want: vAccept},
				{from: "a", to: "b", port: 443, want: vDrop},
				{from: "a", to: "b", port: 22, want: vDrop},
				{from: "c", to: "b", port: 443, want: vAccept},
			},
		},
		{
			name: "IPSets: the VM's before the cluster's, dc/ scope, nomatch",
			cluster: Cluster{Options: enabled, IPSets: []IPSet{
				{Name: "peers", Entries: []IPSetEntry{{CIDR: "10.77.0.13"}}},
				{Name: "lan", Entries: []IPSetEntry{{CIDR: "10.77.0.0/24"}, {CIDR: "10.77.0.12", NoMatch: true}, {CIDR: "10.77.0.1"}}},
			}},
			vms: func() []VM {
				return []VM{l.vm("a", VMOptions{}, []Rule{
					in(Accept, func(r *Rule) { r.Proto, r.DPort, r.Source = "tcp", "80", "+peers" }),
					in(Accept, func(r *Rule) { r.Proto, r.DPort, r.Source = "tcp", "443", "+dc/peers" }),
					in(Accept, func(r *Rule) { r.Proto, r.DPort, r.Source = "tcp", "22", "+lan" }),
				}, IPSet{Name: "peers", Entries: []IPSetEntry{{CIDR: "10.77.0.12"}}})}
			},
			probes: []probe{
				{from: "b", to: "a", port: 80, want: vAccept},
				{from: "c", to: "a", port: 80, want: vDrop},
				{from: "c", to: "a", port: 443, want: vAccept},
				{from: "b", to: "a", port: 443, want: vDrop},
				{from: "c", to: "a", port: 22, want: vAccept},
				{from: "b", to: "a", port: 22, want: vDrop},
				{from: "host", to: "a", port: 22, want: vAccept},
			},
		},
		{
			name:    "ipfilter with the VM's addresses: spoofed sources dropped",
			cluster: Cluster{Options: enabled},
			vms: func() []VM {
				return []VM{l.vm("a", VMOptions{IPFilter: true}, nil,
					IPSet{Name: "ipfilter-net0", Entries: []IPSetEntry{{CIDR: "10.77.0.11"}, {CIDR: "fd77::11"}}})}
			},
			probes: []probe{
				{from: "a", to: "b", port: 80, want: vAccept},
				{from: "a", to: "b", port: 80, v6: true, want: vAccept},
				{from: "a", to: "b", port: 80, src: spoofIP4, want: vDrop},
				{from: "a", to: "host", proto: "udp", port: 5353, src: spoofIP4, want: vDrop},
			},
		},
		{
			name:    "ipfilter without a set: only DHCP (and link-local IPv6) leave the VM",
			cluster: Cluster{Options: enabled},
			vms:     func() []VM { return []VM{l.vm("a", VMOptions{IPFilter: true}, nil)} },
			probes: []probe{
				{from: "a", to: "b", port: 80, want: vDrop},
				{from: "a", to: "b", port: 80, v6: true, want: vDrop},
				{from: "a", to: "host", proto: "udp", port: 67, sport: 68, want: vAccept},
				{from: "a", to: "host", proto: "udp", port: 5353, want: vDrop},
			},
		},
		{
			name:    "dhcp=0: no DHCP exception",
			cluster: Cluster{Options: enabled},
			vms:     func() []VM { return []VM{l.vm("a", VMOptions{IPFilter: true, DHCP: off()}, nil)} },
			probes:  []probe{{from: "a", to: "host", proto: "udp", port: 67, sport: 68, want: vDrop}},
		},
		{
			name:    "macfilter: a NIC whose configured MAC is not the one it sends from",
			cluster: Cluster{Options: enabled},
			vms: func() []VM {
				c := l.vm("c", VMOptions{}, nil)
				c.MAC = "02:00:00:00:00:99"
				d := l.vm("b", VMOptions{MACFilter: off()}, nil)
				d.MAC = "02:00:00:00:00:98"
				return []VM{c, d}
			},
			probes: []probe{
				{from: "c", to: "a", port: 80, want: vDrop},
				{from: "b", to: "a", port: 80, want: vAccept},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			comp, err := Compile(tc.cluster, tc.vms())
			if err != nil {
				t.Fatal(err)
			}
			if len(comp.Warnings) > 0 {
				t.Errorf("warnings: %v", comp.Warnings)
			}
			if err := Apply(l.hub, "br0", comp.Ruleset); err != nil {
				t.Fatalf("%v\n%s", err, numbered(comp.Ruleset))
			}
			failed := false
			for _, p := range tc.probes {
				if got := l.run(p); got != p.want {
					t.Errorf("%s: got %s, want %s", p, got, p.want)
					failed = true
				}
			}
			if failed {
				loaded, _ := Loaded(l.hub)
				t.Logf("ruleset:\n%s", loaded)
			}
		})
	}
}

func numbered(s string) string {
	lines := strings.Split(s, "\n")
	for i := range lines {
		lines[i] = strings.Repeat(" ", 3-len(itoa(i+1))) + itoa(i+1) + " " + lines[i]
	}
	return strings.Join(lines, "\n")
}

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}
