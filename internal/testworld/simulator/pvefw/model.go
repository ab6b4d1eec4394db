package pvefw

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
)

// Policies and rule actions.
const (
	Accept = "ACCEPT"
	Drop   = "DROP"
	Reject = "REJECT"
)

// Rule types.
const (
	TypeIn    = "in"
	TypeOut   = "out"
	TypeGroup = "group"
)

// ClusterOptions are the datacenter's firewall options (cluster.fw
// [OPTIONS]) the VM ruleset depends on.
type ClusterOptions struct {
	// Enable is the datacenter switch: without it nothing is filtered.
	Enable bool
	// Ebtables (default on) adds the layer-2 filter; nil is the default.
	Ebtables *bool
}

// Rule is one firewall rule, as the API stores it. Action is ACCEPT, DROP
// or REJECT, or a security group's name for type group.
type Rule struct {
	Type, Action string
	Enable       bool
	Source, Dest string
	Proto        string
	DPort, SPort string
	ICMPType     string
	Iface        string
	Comment      string
}

// Group is a cluster-level security group.
type Group struct {
	Name    string
	Comment string
	Rules   []Rule
}

// IPSetEntry is one member of an IPSet: an address or a network.
type IPSetEntry struct {
	CIDR    string
	NoMatch bool
	Comment string
}

// IPSet is a named set of addresses, at cluster or VM level.
type IPSet struct {
	Name    string
	Comment string
	Entries []IPSetEntry
}

// VMOptions are a VM's firewall options (<vmid>.fw [OPTIONS]). The
// pointers are options whose unset value differs from both 0 and 1 in
// pve-firewall's ruleset generator (unset means on).
type VMOptions struct {
	Enable    bool
	PolicyIn  string // "" is DROP
	PolicyOut string // "" is ACCEPT
	IPFilter  bool
	MACFilter *bool
	DHCP      *bool
	NDP       *bool
	Radv      bool
}

// Cluster is the datacenter's firewall configuration.
type Cluster struct {
	Options ClusterOptions
	Groups  []Group
	IPSets  []IPSet
}

// VM is one VM's NIC and firewall configuration, with the tap its NIC is on.
type VM struct {
	VMID int
	// NetID is the NIC's key ("net0"), Tap its interface on the bridge.
	NetID, Tap string
	// MAC is the NIC's address in the VM config; Firewall its firewall=1.
	MAC      string
	Firewall bool
	Options  VMOptions
	Rules    []Rule
	IPSets   []IPSet
}

// on reads an option whose unset value means on.
func on(b *bool) bool { return b == nil || *b }

// Name patterns and limits of Firewall.pm.
var (
	GroupNameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9\-\_]+$`)
	IPSetNameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9\-\_]+$`)
)

// Name lengths of Firewall.pm ($max_group_name_length, $max_ipset_name_length).
const (
	MaxGroupName = 18
	MaxIPSetName = 64
)

// protocols are the protocol names the simulator accepts (those of
// /etc/protocols a rule is likely to name) with their numbers.
var protocols = map[string]int{
	"icmp": 1, "igmp": 2, "tcp": 6, "udp": 17, "gre": 47, "esp": 50, "ah": 51,
	"icmpv6": 58, "ipv6-icmp": 58, "sctp": 132, "udplite": 136,
}

// withPorts are $PROTOCOLS_WITH_PORTS.
var withPorts = map[string]bool{"udp": true, "17": true, "udplite": true, "136": true, "tcp": true, "6": true,
	"dccp": true, "33": true, "sctp": true, "132": true}

func isICMP(proto string) bool {
	return proto == "icmp" || proto == "icmpv6" || proto == "ipv6-icmp" || proto == "1" || proto == "58"
}

// ProtoNumber resolves a rule's proto.
func ProtoNumber(proto string) (int, error) {
	if n, ok := protocols[strings.ToLower(proto)]; ok {
		return n, nil
	}
	n, err := strconv.Atoi(proto)
	if err != nil || n < 0 || n > 255 {
		return 0, fmt.Errorf("unknown protocol '%s'", proto)
	}
	return n, nil
}

// PortRange is a port or an inclusive range.
type PortRange struct{ Lo, Hi int }

// ParsePorts parses a dport/sport value: numbers and ranges "a:b" separated
// by commas. Service names are refused (the simulator has no
// /etc/services).
func ParsePorts(spec string) ([]PortRange, error) {
	var out []PortRange
	for _, item := range strings.Split(spec, ",") {
		lo, hi, isRange := strings.Cut(item, ":")
		a, err := portNumber(lo)
		if err != nil {
			return nil, err
		}
		b := a
		if isRange {
			if b, err = portNumber(hi); err != nil {
				return nil, err
			}
			if a >= b {
				return nil, fmt.Errorf("invalid port range '%s'", item)
			}
		}
		out = append(out, PortRange{a, b})
	}
	return out, nil
}

func portNumber(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("invalid port '%s' (service names are not supported by the simulator)", s)
	}
	if n < 0 || n > 65535 {
		return 0, fmt.Errorf("invalid port '%s'", s)
	}
	return n, nil
}

// AddrItem is one element of a source/dest list: a network (addresses are
// /32 or /128), a range, or an IPSet reference with its scope ("", "dc",
// "guest").
type AddrItem struct {
	Prefix   netip.Prefix
	From, To netip.Addr
	Set      string
	Scope    string
}

// ipVersion is 4, 6 or 0 (an IPSet: either).
func (a AddrItem) ipVersion() int {
	switch {
	case a.Set != "":
		return 0
	case a.From.IsValid():
		if a.From.Is4() {
			return 4
		}
		return 6
	case a.Prefix.Addr().Is4():
		return 4
	default:
		return 6
	}
}

var ipsetRefRE = regexp.MustCompile(`^\+(guest/|dc/)?([A-Za-z][A-Za-z0-9\-\_]+)$`)

// ParseAddressList parses a rule's source or dest: one IPSet reference, or
// a comma-separated list of addresses, networks and ranges of one IP
// version. It returns the items and the IP version (0 for an IPSet).
// Aliases are refused (the simulator has none).
func ParseAddressList(spec string) ([]AddrItem, int, error) {
	if strings.HasPrefix(spec, "+") {
		m := ipsetRefRE.FindStringSubmatch(spec)
		if m == nil {
			return nil, 0, fmt.Errorf("invalid ipset name '%s'", spec)
		}
		return []AddrItem{{Set: m[2], Scope: strings.TrimSuffix(m[1], "/")}}, 0, nil
	}
	var items []AddrItem
	ver := 0
	for _, el := range strings.Split(spec, ",") {
		var it AddrItem
		if from, to, ok := strings.Cut(el, "-"); ok && !strings.Contains(el, "/") {
			a, err1 := netip.ParseAddr(from)
			b, err2 := netip.ParseAddr(to)
			if err1 != nil || err2 != nil || a.Is4() != b.Is4() || b.Less(a) {
				return nil, 0, fmt.Errorf("invalid IP address range '%s'", el)
			}
			it = AddrItem{From: a, To: b}
		} else {
			p, err := ParseCIDR(el)
			if err != nil {
				if IPSetNameRE.MatchString(el) {
					return nil, 0, fmt.Errorf("aliases are not supported by the simulator ('%s')", el)
				}
				return nil, 0, err
			}
			it = AddrItem{Prefix: p}
		}
		v := it.ipVersion()
		if ver != 0 && v != ver {
			return nil, 0, fmt.Errorf("detected mixed ipv4/ipv6 addresses in address list '%s'", spec)
		}
		ver = v
		items = append(items, it)
	}
	return items, ver, nil
}

// ParseCIDR parses an address (a /32 or /128) or a network, as
// parse_ip_or_cidr accepts them; the host bits of a network are cleared.
func ParseCIDR(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("value does not look like a valid IP address or CIDR network")
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("value does not look like a valid IP address or CIDR network")
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// CanonicalCIDR is how the API stores an IPSet entry: host bits cleared
// (clean_cidr), an address without /32 or /128 (parse_ip_or_cidr), IPv6
// compressed.
func CanonicalCIDR(s string) (string, error) {
	p, err := ParseCIDR(s)
	if err != nil {
		return "", err
	}
	if p.IsSingleIP() {
		return p.Addr().String(), nil
	}
	return p.String(), nil
}

// VerifyRule checks a rule as verify_rule does for env "vm" or "group", and
// the simulator's own limits; it returns the errors by parameter.
func VerifyRule(r Rule, env string) map[string]string {
	errs := map[string]string{}
	add := func(k, msg string) {
		if _, ok := errs[k]; !ok {
			errs[k] = msg
		}
	}
	switch r.Type {
	case "":
		add("type", "missing property")
	case TypeIn, TypeOut:
		if r.Action != Accept && r.Action != Drop && r.Action != Reject {
			add("action", fmt.Sprintf("unknown action '%s'", r.Action))
		}
	case TypeGroup:
		if env == "group" {
			add("type", "security groups not allowed")
		} else if !GroupNameRE.MatchString(r.Action) {
			add("action", "invalid characters in security group name")
		}
	default:
		add("type", fmt.Sprintf("invalid rule type '%s' for rule_env '%s'", r.Type, env))
	}
	if r.Action == "" {
		add("action", "missing property")
	}
	if r.Iface != "" {
		if env == "group" {
			add("type", "parameter -i not allowed for this rule type")
		} else if !regexp.MustCompile(`^net\d+$`).MatchString(r.Iface) {
			add("iface", "value does not match the regex pattern 'net\\d+'")
		}
	}
	if r.Proto != "" {
		if _, err := ProtoNumber(r.Proto); err != nil {
			add("proto", err.Error())
		}
	}
	for _, pp := range []struct{ name, v string }{{"dport", r.DPort}, {"sport", r.SPort}} {
		if pp.v == "" {
			continue
		}
		if r.Proto == "" {
			add("proto", fmt.Sprintf("missing property - '%s' requires this property", pp.name))
			continue
		}
		if pp.name == "dport" && isICMP(r.Proto) {
			continue // dport is the ICMP type
		}
		if !withPorts[r.Proto] {
			add(pp.name, fmt.Sprintf("protocol '%s' does not support ports", r.Proto))
			continue
		}
		if _, err := ParsePorts(pp.v); err != nil {
			add(pp.name, err.Error())
		}
	}
	if r.ICMPType != "" {
		if !isICMP(r.Proto) {
			add("proto", "missing property - 'icmp-type' requires this property")
		} else if r.DPort != "" {
			add("icmp-type", "'icmp-type' cannot be specified together with 'dport'")
		}
	}
	ver := 0
	for _, a := range []struct{ name, v string }{{"source", r.Source}, {"dest", r.Dest}} {
		if a.v == "" {
			continue
		}
		_, v, err := ParseAddressList(a.v)
		if err != nil {
			add(a.name, err.Error())
			continue
		}
		if v != 0 && ver != 0 && v != ver {
			add(a.name, "detected mixed ipv4/ipv6 addresses in rule")
		}
		if v != 0 {
			ver = v
		}
	}
	return errs
}

// LinkLocal is the IPv6 link-local address derived from a MAC (modified
// EUI-64, mac_to_linklocal).
func LinkLocal(mac string) (netip.Addr, error) {
	parts := strings.Split(mac, ":")
	if len(parts) != 6 {
		return netip.Addr{}, fmt.Errorf("invalid MAC address %q", mac)
	}
	var b [6]byte
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 16, 8)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("invalid MAC address %q", mac)
		}
		b[i] = byte(n)
	}
	a := [16]byte{0: 0xfe, 1: 0x80, 8: b[0] ^ 0x02, 9: b[1], 10: b[2], 11: 0xff, 12: 0xfe, 13: b[3], 14: b[4], 15: b[5]}
	return netip.AddrFrom16(a), nil
}
