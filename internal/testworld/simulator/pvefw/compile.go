package pvefw

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Table is the name of the nftables tables (one "bridge", one "inet") the
// ruleset defines.
const Table = "hyperfleet_pvefw"

// Packet mark bits the tables hand each other (see doc.go). pve-firewall
// uses the top bit of the mark for its accept mark; these sit below it.
const (
	markEstablished = 0x01000000
	markInvalid     = 0x02000000
	markAccept      = 0x04000000 // a group's ACCEPT (PVEFW-SET-ACCEPT-MARK)
	markReject      = 0x08000000 // reject this packet at the inet hook
	markLocalOut    = 0x10000000 // sent by the namespace itself: no reject
	markAll         = 0x1f000000
)

// Compiled is a ruleset and what the compiler skipped.
type Compiled struct {
	// Ruleset is nft -f input that atomically replaces both tables (or
	// removes them when nothing is filtered).
	Ruleset string
	// Warnings are rules skipped the way pve-firewall skips them (a
	// missing IPSet or group), one line each.
	Warnings []string
}

// compiler holds one compilation's state.
type compiler struct {
	c        Cluster
	sets     []string // set definitions
	setNames map[string]string
	groups   map[string]string // group name -> chain base
	chains   []string
	warnings []string
}

// Compile turns the configuration into an nftables ruleset with
// pve-firewall's semantics for VMs on one bridge.
func Compile(c Cluster, vms []VM) (Compiled, error) {
	k := &compiler{c: c, setNames: map[string]string{}, groups: map[string]string{}}
	var b strings.Builder
	// The add-then-delete idiom replaces a table in one transaction
	// whether or not it existed.
	for _, fam := range []string{"bridge", "inet"} {
		fmt.Fprintf(&b, "add table %s %s\ndelete table %s %s\n", fam, Table, fam, Table)
	}
	if !c.Options.Enable {
		return Compiled{Ruleset: b.String()}, nil
	}
	vms = append([]VM(nil), vms...)
	sort.Slice(vms, func(i, j int) bool { return vms[i].Tap < vms[j].Tap })
	var fwbr []string
	for _, vm := range vms {
		if !vm.Firewall || vm.Tap == "" {
			continue
		}
		tap := strconv.Quote(vm.Tap)
		fwbr = append(fwbr,
			fmt.Sprintf("meta protocol { ip, ip6 } iifname %s meta mark & 0x%x == 0x%x drop", tap, markInvalid, markInvalid),
			fmt.Sprintf("meta protocol { ip, ip6 } oifname %s meta mark & 0x%x == 0x%x drop", tap, markInvalid, markInvalid),
			fmt.Sprintf("meta protocol { ip, ip6 } iifname %s meta mark & 0x%x == 0x%x accept", tap, markEstablished, markEstablished),
			fmt.Sprintf("meta protocol { ip, ip6 } oifname %s meta mark & 0x%x == 0x%x accept", tap, markEstablished, markEstablished))
	}
	for _, vm := range vms {
		if !vm.Firewall || vm.Tap == "" || !vm.Options.Enable {
			continue
		}
		rules, err := k.vmChains(vm)
		if err != nil {
			return Compiled{}, fmt.Errorf("pvefw: VM %d: %w", vm.VMID, err)
		}
		fwbr = append(fwbr, rules...)
	}
	fmt.Fprintf(&b, "table bridge %s {\n", Table)
	for _, s := range k.sets {
		b.WriteString(s)
	}
	b.WriteString(chain("fwbr", "", fwbr))
	for _, hook := range []string{"forward", "input"} {
		b.WriteString(chain("hook_"+hook, "type filter hook "+hook+" priority -200; policy accept;", []string{"jump fwbr"}))
	}
	b.WriteString(chain("hook_output", "type filter hook output priority -200; policy accept;", []string{
		fmt.Sprintf("meta mark set meta mark | 0x%x", markLocalOut), "jump fwbr"}))
	b.WriteString(chain("mark_reject", "", []string{
		fmt.Sprintf("meta mark & 0x%x == 0x%x drop", markLocalOut, markLocalOut),
		fmt.Sprintf("meta mark set meta mark | 0x%x accept", markReject)}))
	// PVEFW-Drop and PVEFW-Reject: the critical ICMP errors pass a DROP
	// or REJECT policy.
	critical := []string{
		"meta protocol ip icmp type time-exceeded accept",
		"meta protocol ip icmp type destination-unreachable icmp code frag-needed accept",
	}
	b.WriteString(chain("policy_drop", "", append(append([]string(nil), critical...), "drop")))
	b.WriteString(chain("policy_reject", "", append(append([]string(nil), critical...), "jump mark_reject")))
	for _, ch := range k.chains {
		b.WriteString(ch)
	}
	b.WriteString("}\n")

	fmt.Fprintf(&b, "table inet %s {\n", Table)
	ct := []string{
		fmt.Sprintf("meta mark set meta mark & 0x%x", ^uint32(markAll)),
		fmt.Sprintf("ct state invalid meta mark set meta mark | 0x%x", markInvalid),
		fmt.Sprintf("ct state established,related meta mark set meta mark | 0x%x", markEstablished),
	}
	b.WriteString(chain("ct_prerouting", "type filter hook prerouting priority -150; policy accept;", ct))
	b.WriteString(chain("ct_output", "type filter hook output priority -150; policy accept;", ct))
	// PVEFW-reject.
	b.WriteString(chain("do_reject", "", []string{
		"meta protocol ip ip saddr 224.0.0.0/4 drop",
		"meta l4proto tcp reject with tcp reset",
		"meta l4proto { icmp, ipv6-icmp } drop",
		"meta l4proto udp reject with icmpx type port-unreachable",
		"meta nfproto ipv4 reject with icmp type host-prohibited",
		"reject with icmpv6 type admin-prohibited",
	}))
	for _, hook := range []string{"forward", "input"} {
		b.WriteString(chain("reject_"+hook, "type filter hook "+hook+" priority 0; policy accept;", []string{
			fmt.Sprintf("meta mark & 0x%x == 0x%x jump do_reject", markReject, markReject)}))
	}
	b.WriteString("}\n")
	return Compiled{Ruleset: b.String(), Warnings: k.warnings}, nil
}

func chain(name, base string, rules []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  chain %s {\n", name)
	if base != "" {
		fmt.Fprintf(&b, "    %s\n", base)
	}
	for _, r := range rules {
		fmt.Fprintf(&b, "    %s\n", r)
	}
	b.WriteString("  }\n")
	return b.String()
}

// direction is a VM chain's direction.
type direction int

const (
	dirOut direction = iota // from the VM
	dirIn                   // to the VM
)

func (d direction) String() string {
	if d == dirOut {
		return "out"
	}
	return "in"
}

// verdict renders a rule action for a VM chain of direction d: an OUT
// ACCEPT returns to fwbr (the receiver's IN chain comes next), as
// PVEFW-SET-ACCEPT-MARK does.
func verdict(action string, d direction) string {
	switch action {
	case Accept:
		if d == dirOut {
			return "return"
		}
		return "accept"
	case Reject:
		return "jump mark_reject"
	default:
		return "drop"
	}
}

var ipVersions = []int{4, 6}

func famOf(v int) string {
	if v == 4 {
		return "ip"
	}
	return "ip6"
}

// vmChains adds the VM's chains (and the layer-2 filter) and returns the
// fwbr rules that send its traffic there.
func (k *compiler) vmChains(vm VM) ([]string, error) {
	o := vm.Options
	mac := strings.ToLower(vm.MAC)
	base := fmt.Sprintf("vm%d_%s", vm.VMID, vm.NetID)
	tap := strconv.Quote(vm.Tap)
	var jumps []string

	// ebtables (compile_ebtables_filter): non-IP frames from the VM.
	if k.c.Options.Ebtables == nil || *k.c.Options.Ebtables {
		var l2 []string
		if mac != "" && on(o.MACFilter) {
			l2 = append(l2, fmt.Sprintf("ether saddr != %s drop", mac))
		}
		if set := findSet(vm.IPSets, "ipfilter-"+vm.NetID); set != nil {
			var ips []string
			for _, e := range set.Entries {
				if p, err := ParseCIDR(e.CIDR); err == nil && p.Addr().Is4() {
					ips = append(ips, p.String())
				}
			}
			if len(ips) == 0 {
				l2 = append(l2, "meta protocol arp drop")
			} else {
				l2 = append(l2, fmt.Sprintf("meta protocol arp arp saddr ip != { %s } drop", strings.Join(ips, ", ")))
			}
		}
		if len(l2) > 0 {
			k.chains = append(k.chains, chain(base+"_l2", "", l2))
			jumps = append(jumps, fmt.Sprintf("meta protocol != { ip, ip6 } iifname %s jump %s_l2", tap, base))
		}
	}

	// ipfilter-netX: the explicit set, or an implicit empty one with the
	// ipfilter option; either holds the MAC's link-local address and
	// excludes the rest of fe80::/10 (compile_ipsets).
	var ipfilter map[int]string
	if set := findSet(vm.IPSets, "ipfilter-"+vm.NetID); set != nil || o.IPFilter {
		entries := []IPSetEntry{}
		if set != nil {
			entries = append(entries, set.Entries...)
		}
		if ll, err := LinkLocal(mac); err == nil {
			entries = append(entries, IPSetEntry{CIDR: ll.String()}, IPSetEntry{CIDR: "fe80::/10", NoMatch: true})
		}
		ipfilter = map[int]string{}
		for _, v := range ipVersions {
			ipfilter[v] = k.defineSet(fmt.Sprintf("%s_ipfilter_v%d", base, v), v, entries)
		}
	}

	for _, d := range []direction{dirOut, dirIn} {
		var r []string
		// DHCP (unless dhcp=0).
		if on(o.DHCP) {
			if d == dirOut {
				r = append(r, "meta protocol ip udp sport 68 udp dport 67 return", "meta protocol ip6 udp sport 546 udp dport 547 return")
			} else {
				r = append(r, "meta protocol ip udp sport 67 udp dport 68 accept", "meta protocol ip6 udp sport 547 udp dport 546 accept")
			}
		}
		if d == dirOut {
			if mac != "" && on(o.MACFilter) {
				r = append(r, fmt.Sprintf("ether saddr != %s drop", mac))
			}
			if !o.Radv {
				r = append(r, "meta protocol ip6 icmpv6 type nd-router-advert drop")
			}
			for _, v := range ipVersions {
				if set, ok := ipfilter[v]; ok {
					r = append(r, fmt.Sprintf("meta protocol %s %s saddr != @%s drop", famOf(v), famOf(v), set))
				}
			}
		}
		// NDP (unless ndp=0); a VM sends router advertisements only with radv.
		if on(o.NDP) {
			types := []string{"nd-router-solicit", "nd-neighbor-solicit", "nd-neighbor-advert"}
			if d == dirIn || o.Radv {
				types = append(types, "nd-router-advert")
			}
			r = append(r, fmt.Sprintf("meta protocol ip6 icmpv6 type { %s } %s", strings.Join(types, ", "), verdict(Accept, d)))
		}
		for i, rule := range vm.Rules {
			if !rule.Enable || (rule.Iface != "" && rule.Iface != vm.NetID) {
				continue
			}
			if rule.Type == TypeGroup {
				g, ok := k.group(rule.Action)
				if !ok {
					k.warnings = append(k.warnings, fmt.Sprintf("VM %d rule %d: no such security group '%s'", vm.VMID, i, rule.Action))
					continue
				}
				r = append(r, fmt.Sprintf("jump %s_%s", g, d),
					fmt.Sprintf("meta mark & 0x%x == 0x%x %s", markAccept, markAccept, verdict(Accept, d)))
				continue
			}
			if rule.Type != d.String() {
				continue
			}
			lines, err := k.rule(rule, vm.IPSets, base, verdict(rule.Action, d))
			if err != nil {
				k.warnings = append(k.warnings, fmt.Sprintf("VM %d rule %d: %v", vm.VMID, i, err))
				continue
			}
			r = append(r, lines...)
		}
		policy := o.PolicyOut
		if d == dirIn {
			policy = o.PolicyIn
		}
		switch {
		case policy == Drop || (policy == "" && d == dirIn):
			r = append(r, "jump policy_drop")
		case policy == Reject:
			r = append(r, "jump policy_reject")
		default:
			r = append(r, verdict(Accept, d))
		}
		name := fmt.Sprintf("%s_%s", base, d)
		k.chains = append(k.chains, chain(name, "", r))
		iface := "iifname"
		if d == dirIn {
			iface = "oifname"
		}
		jumps = append(jumps, fmt.Sprintf("meta protocol { ip, ip6 } %s %s jump %s", iface, tap, name))
	}
	return jumps, nil
}

// group compiles a security group's chains once (generate_group_rules):
// each starts by clearing the accept mark; an ACCEPT sets it.
func (k *compiler) group(name string) (string, bool) {
	if base, ok := k.groups[name]; ok {
		return base, true
	}
	var g *Group
	for i := range k.c.Groups {
		if k.c.Groups[i].Name == name {
			g = &k.c.Groups[i]
		}
	}
	if g == nil {
		return "", false
	}
	base := fmt.Sprintf("group%d", len(k.groups))
	k.groups[name] = base
	for _, d := range []direction{dirIn, dirOut} {
		r := []string{fmt.Sprintf("meta mark set meta mark & 0x%x", ^uint32(markAccept))}
		for i, rule := range g.Rules {
			if !rule.Enable || rule.Type != d.String() {
				continue
			}
			v := verdict(rule.Action, d)
			if rule.Action == Accept {
				v = fmt.Sprintf("meta mark set meta mark | 0x%x return", markAccept)
			}
			lines, err := k.rule(rule, nil, "", v)
			if err != nil {
				k.warnings = append(k.warnings, fmt.Sprintf("group %s rule %d: %v", name, i, err))
				continue
			}
			r = append(r, lines...)
		}
		k.chains = append(k.chains, fmt.Sprintf("  # security group %s, %s\n", name, d)+chain(fmt.Sprintf("%s_%s", base, d), "", r))
	}
	return base, true
}

func findSet(sets []IPSet, name string) *IPSet {
	for i := range sets {
		if sets[i].Name == name {
			return &sets[i]
		}
	}
	return nil
}

// defineSet adds a named interval set of version v holding what entries
// match, and returns its name.
func (k *compiler) defineSet(name string, v int, entries []IPSetEntry) string {
	var rs []entryRange
	for _, e := range entries {
		p, err := ParseCIDR(e.CIDR)
		if err != nil || p.Addr().Is4() != (v == 4) {
			continue
		}
		rs = append(rs, entryRange{p: p, nomatch: e.NoMatch})
	}
	typ := "ipv4_addr"
	if v == 6 {
		typ = "ipv6_addr"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "  set %s {\n    type %s\n    flags interval\n", name, typ)
	if spans := effective(rs); len(spans) > 0 {
		els := make([]string, len(spans))
		for i, s := range spans {
			els[i] = s.String()
		}
		fmt.Fprintf(&b, "    elements = { %s }\n", strings.Join(els, ", "))
	}
	b.WriteString("  }\n")
	k.sets = append(k.sets, b.String())
	return name
}

// setRef resolves +name for version v: the VM's set, then the cluster's
// (ipt_gen_src_or_dst_match; "guest" and "dc" restrict the scope).
func (k *compiler) setRef(item AddrItem, vmSets []IPSet, vmKey string, v int) (string, error) {
	if item.Scope != "dc" && vmSets != nil {
		if s := findSet(vmSets, item.Set); s != nil {
			return k.namedSet(vmKey+"_"+item.Set, v, s.Entries), nil
		}
	}
	if item.Scope != "guest" {
		if s := findSet(k.c.IPSets, item.Set); s != nil {
			return k.namedSet("dc_"+item.Set, v, s.Entries), nil
		}
	}
	return "", fmt.Errorf("no such ipset '%s'", item.Set)
}

// namedSet defines a set for an IPSet once per version. nft set names are
// identifiers: the IPSet's name is kept readable, hyphens hex-escaped.
func (k *compiler) namedSet(key string, v int, entries []IPSetEntry) string {
	key = fmt.Sprintf("%s_v%d", key, v)
	if n, ok := k.setNames[key]; ok {
		return n
	}
	name := "set_" + strings.ReplaceAll(strings.ReplaceAll(key, "_", "_5f"), "-", "_2d")
	k.setNames[key] = name
	return k.defineSet(name, v, entries)
}

// icmpTypes maps pve-firewall's (iptables') ICMP type names to nft's.
var icmpTypes = map[int]map[string]string{
	4: {"echo-reply": "echo-reply", "destination-unreachable": "destination-unreachable", "source-quench": "source-quench",
		"redirect": "redirect", "echo-request": "echo-request", "router-advertisement": "router-advertisement",
		"router-solicitation": "router-solicitation", "time-exceeded": "time-exceeded", "ttl-exceeded": "time-exceeded",
		"parameter-problem": "parameter-problem", "timestamp-request": "timestamp-request", "timestamp-reply": "timestamp-reply",
		"address-mask-request": "address-mask-request", "address-mask-reply": "address-mask-reply"},
	6: {"destination-unreachable": "destination-unreachable", "packet-too-big": "packet-too-big",
		"time-exceeded": "time-exceeded", "ttl-exceeded": "time-exceeded", "parameter-problem": "parameter-problem",
		"echo-request": "echo-request", "echo-reply": "echo-reply", "router-solicitation": "nd-router-solicit",
		"router-advertisement": "nd-router-advert", "neighbour-solicitation": "nd-neighbor-solicit",
		"neighbor-solicitation": "nd-neighbor-solicit", "neighbour-advertisement": "nd-neighbor-advert",
		"neighbor-advertisement": "nd-neighbor-advert", "redirect": "nd-redirect"},
}

// rule renders one in/out rule as nft rules (one per IP version it
// applies to), each ending in verdict.
func (k *compiler) rule(r Rule, vmSets []IPSet, vmKey, verdict string) ([]string, error) {
	if errs := VerifyRule(r, "vm"); len(errs) > 0 {
		keys := make([]string, 0, len(errs))
		for k := range errs {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		return nil, fmt.Errorf("%s: %s", keys[0], errs[keys[0]])
	}
	var src, dst []AddrItem
	ver := 0
	if r.Source != "" {
		src, ver, _ = ParseAddressList(r.Source)
	}
	if r.Dest != "" {
		var v int
		dst, v, _ = ParseAddressList(r.Dest)
		if v != 0 {
			ver = v
		}
	}
	proto := -1
	if r.Proto != "" {
		proto, _ = ProtoNumber(r.Proto)
		switch proto {
		case 1:
			ver = 4
		case 58:
			ver = 6
		}
	}
	var out []string
	for _, v := range ipVersions {
		if ver != 0 && ver != v {
			continue
		}
		fam := famOf(v)
		m := []string{"meta protocol " + fam}
		for _, sd := range []struct {
			items []AddrItem
			dir   string
		}{{src, "saddr"}, {dst, "daddr"}} {
			if len(sd.items) == 0 {
				continue
			}
			if sd.items[0].Set != "" {
				name, err := k.setRef(sd.items[0], vmSets, vmKey, v)
				if err != nil {
					return nil, err
				}
				m = append(m, fmt.Sprintf("%s %s @%s", fam, sd.dir, name))
				continue
			}
			var spans []span
			for _, it := range sd.items {
				if it.Set != "" {
					continue
				}
				if it.From.IsValid() {
					spans = append(spans, span{it.From, it.To})
				} else {
					spans = append(spans, span{it.Prefix.Addr(), lastAddr(it.Prefix)})
				}
			}
			els := []string{}
			for _, s := range merge(spans) {
				els = append(els, s.String())
			}
			m = append(m, fmt.Sprintf("%s %s { %s }", fam, sd.dir, strings.Join(els, ", ")))
		}
		if proto >= 0 {
			m = append(m, fmt.Sprintf("meta l4proto %d", proto))
			if isICMP(r.Proto) {
				typ := r.ICMPType
				if typ == "" {
					typ = r.DPort
				}
				if typ != "" {
					name, ok := icmpTypes[v][typ]
					if !ok {
						n, err := strconv.Atoi(typ)
						if err != nil || n < 0 || n > 255 {
							return nil, fmt.Errorf("icmp type '%s' is not supported by the simulator", typ)
						}
						name = typ
					}
					kw := "icmp"
					if v == 6 {
						kw = "icmpv6"
					}
					m = append(m, fmt.Sprintf("%s type %s", kw, name))
				}
			} else {
				for _, pp := range []struct{ spec, field string }{{r.SPort, "sport"}, {r.DPort, "dport"}} {
					if pp.spec == "" {
						continue
					}
					ports, _ := ParsePorts(pp.spec)
					els := make([]string, len(ports))
					for i, p := range ports {
						els[i] = strconv.Itoa(p.Lo)
						if p.Hi != p.Lo {
							els[i] = fmt.Sprintf("%d-%d", p.Lo, p.Hi)
						}
					}
					m = append(m, fmt.Sprintf("th %s { %s }", pp.field, strings.Join(els, ", ")))
				}
			}
		}
		out = append(out, strings.Join(m, " ")+" "+verdict)
	}
	return out, nil
}
