package libvirt

import (
	"strconv"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// testIsolation allows HTTPS to one address and ping from a network, and
// drops the rest of 10/8 explicitly.
func testIsolation() *provider.Isolation {
	return &provider.Isolation{Policy: "ci", DHCP: true,
		Egress: []provider.FirewallRule{
			{Action: provider.FirewallAccept, CIDR: "10.0.0.5", Protocol: provider.ProtocolTCP, Ports: []provider.PortRange{{From: 443, To: 443}}, Comment: "git"},
			{Action: provider.FirewallDrop, CIDR: "10.0.0.0/8"},
			{Action: provider.FirewallAccept, Protocol: provider.ProtocolUDP, Ports: []provider.PortRange{{From: 53, To: 53}, {From: 8000, To: 8100}}},
		},
		Ingress: []provider.FirewallRule{{Action: provider.FirewallAccept, CIDR: "192.168.0.0/16", Protocol: provider.ProtocolICMP}},
	}
}

// filterRound renders iso's filter and reads it back as libvirt would
// be given it.
func filterRound(t *testing.T, iso *provider.Isolation) *libvirtxml.NWFilter {
	t.Helper()
	f, err := filterXML("hf-unit-"+iso.RulesDigest(), iso)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := f.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var back libvirtxml.NWFilter
	if err := back.Unmarshal(doc); err != nil {
		t.Fatalf("%v\n%s", err, doc)
	}
	return &back
}

// describe is one rule in a few words, for comparison.
func describe(r *libvirtxml.NWFilterRule) string {
	var b strings.Builder
	b.WriteString(r.Action + " " + r.Direction)
	if r.StateMatch != "" {
		b.WriteString(" statematch=" + r.StateMatch)
	}
	ip := func(proto string, c libvirtxml.NWFilterRuleCommonIP, port *libvirtxml.NWFilterRuleCommonPort) {
		b.WriteString(" " + proto)
		for _, f := range []struct {
			name string
			v    libvirtxml.NWFilterField
		}{{"src", c.SrcIPAddr}, {"srcmask", c.SrcIPMask}, {"dst", c.DstIPAddr}, {"dstmask", c.DstIPMask}, {"state", c.State}} {
			if s := fieldString(f.v); s != "" {
				b.WriteString(" " + f.name + "=" + s)
			}
		}
		if port != nil {
			for _, f := range []struct {
				name string
				v    libvirtxml.NWFilterField
			}{{"sport", port.SrcPortStart}, {"dport", port.DstPortStart}, {"dportend", port.DstPortEnd}} {
				if s := fieldString(f.v); s != "" {
					b.WriteString(" " + f.name + "=" + s)
				}
			}
		}
	}
	switch {
	case r.TCP != nil:
		ip("tcp", r.TCP.NWFilterRuleCommonIP, &r.TCP.NWFilterRuleCommonPort)
	case r.UDP != nil:
		ip("udp", r.UDP.NWFilterRuleCommonIP, &r.UDP.NWFilterRuleCommonPort)
	case r.ICMP != nil:
		ip("icmp", r.ICMP.NWFilterRuleCommonIP, nil)
	case r.All != nil:
		ip("all", r.All.NWFilterRuleCommonIP, nil)
	case r.TCPIPv6 != nil:
		ip("tcp-ipv6", r.TCPIPv6.NWFilterRuleCommonIP, &r.TCPIPv6.NWFilterRuleCommonPort)
	case r.UDPIPv6 != nil:
		ip("udp-ipv6", r.UDPIPv6.NWFilterRuleCommonIP, &r.UDPIPv6.NWFilterRuleCommonPort)
	case r.ICMPv6 != nil:
		ip("icmpv6", r.ICMPv6.NWFilterRuleCommonIP, nil)
	case r.AllIPv6 != nil:
		ip("all-ipv6", r.AllIPv6.NWFilterRuleCommonIP, nil)
	default:
		b.WriteString(" ?")
	}
	return b.String()
}

func fieldString(f libvirtxml.NWFilterField) string {
	switch {
	case f.Var != "":
		return "$" + f.Var
	case f.Uint != nil:
		return strconv.FormatUint(uint64(*f.Uint), 10)
	}
	return f.Str
}

// rulesOf lists f's rules by rising priority, as libvirt orders them,
// each with its priority.
func rulesOf(f *libvirtxml.NWFilter) (refs []string, rules []string, priorities []int) {
	for _, e := range f.Entries {
		if e.Ref != nil {
			refs = append(refs, e.Ref.Filter)
		}
		if e.Rule != nil {
			rules = append(rules, describe(e.Rule))
			priorities = append(priorities, e.Rule.Priority)
		}
	}
	return refs, rules, priorities
}

func TestFilterXML(t *testing.T) {
	refs, rules, priorities := rulesOf(filterRound(t, testIsolation()))
	if len(refs) != 1 || refs[0] != cleanTraffic {
		t.Errorf("filter references %v, want clean-traffic (anti-spoofing) alone", refs)
	}
	want := []string{
		"accept in all state=ESTABLISHED",
		"accept in all-ipv6 state=ESTABLISHED",
		"accept out all state=ESTABLISHED,RELATED",
		"accept out all-ipv6 state=ESTABLISHED,RELATED",
		"accept out statematch=false udp sport=68 dport=67",
		"accept in statematch=false udp sport=67 dport=68",
		"accept out tcp dst=10.0.0.5 dstmask=32 state=NEW dport=443 dportend=443",
		"drop out statematch=false all dst=10.0.0.0 dstmask=8",
		"accept out udp state=NEW dport=53 dportend=53",
		"accept out udp state=NEW dport=8000 dportend=8100",
		"accept out udp-ipv6 state=NEW dport=53 dportend=53",
		"accept out udp-ipv6 state=NEW dport=8000 dportend=8100",
		"accept in icmp src=192.168.0.0 srcmask=16 state=NEW",
		"drop inout statematch=false all",
		"drop inout statematch=false all-ipv6",
	}
	if strings.Join(rules, "\n") != strings.Join(want, "\n") {
		t.Errorf("rules:\n%s\nwant:\n%s", strings.Join(rules, "\n"), strings.Join(want, "\n"))
	}
	// The policy's order is the priorities' order, per direction; the
	// replies and DHCP come before, the drop after.
	wantPrio := []int{100, 100, 100, 100, 110, 110, 200, 201, 202, 202, 202, 202, 200, 1000, 1000}
	for i := range wantPrio {
		if i < len(priorities) && priorities[i] != wantPrio[i] {
			t.Errorf("rule %d (%s) has priority %d, want %d", i, rules[i], priorities[i], wantPrio[i])
		}
	}
}

func TestFilterXMLWithoutDHCPAndIPv6(t *testing.T) {
	iso := &provider.Isolation{Policy: "v6", Addresses: []string{"10.1.0.9"},
		Egress: []provider.FirewallRule{
			{Action: provider.FirewallAccept, CIDR: "2001:db8::/32", Protocol: provider.ProtocolTCP},
			{Action: provider.FirewallAccept, Protocol: provider.ProtocolICMPv6},
		}}
	_, rules, _ := rulesOf(filterRound(t, iso))
	got := strings.Join(rules, "\n")
	for _, want := range []string{"accept out tcp-ipv6 dst=2001:db8:: dstmask=32 state=NEW", "accept out icmpv6 state=NEW"} {
		if !strings.Contains(got, want) {
			t.Errorf("rules lack %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "sport=68") || strings.Contains(got, "accept out tcp dst") {
		t.Errorf("a filter without DHCP lets DHCP through, or an IPv6 rule became an IPv4 one:\n%s", got)
	}
}

func TestFilterXMLRefusesARuleNoFamilyMatches(t *testing.T) {
	iso := &provider.Isolation{Policy: "odd", DHCP: true,
		Egress: []provider.FirewallRule{{Action: provider.FirewallAccept, CIDR: "2001:db8::1", Protocol: provider.ProtocolICMP}}}
	if _, err := filterXML("hf-unit-x", iso); provider.ReasonOf(err) != "IsolationUnsupported" {
		t.Errorf("icmp to an IPv6 address: %v, want IsolationUnsupported", err)
	}
}

// nicDomain is a domain with the given interfaces.
func nicDomain(nics ...libvirtxml.DomainInterface) *libvirtxml.Domain {
	return &libvirtxml.Domain{Name: "vm", Devices: &libvirtxml.DomainDeviceList{Interfaces: nics}}
}

func networkNIC(network string) libvirtxml.DomainInterface {
	return libvirtxml.DomainInterface{Source: &libvirtxml.DomainInterfaceSource{Network: &libvirtxml.DomainInterfaceSourceNetwork{Network: network}}}
}

func TestIsolateInterface(t *testing.T) {
	d := nicDomain(networkNIC("default"))
	if err := isolateInterface(d, testIsolation(), "hf-unit-f"); err != nil {
		t.Fatal(err)
	}
	doc, err := d.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(doc, `<filterref filter="hf-unit-f">`) || !strings.Contains(doc, `<parameter name="CTRL_IP_LEARNING" value="dhcp">`) {
		t.Errorf("DHCP: interface XML lacks the filterref learning from DHCP:\n%s", doc)
	}
	static := &provider.Isolation{Policy: "static", Addresses: []string{"10.1.0.9", "10.1.0.10"}}
	d = nicDomain(libvirtxml.DomainInterface{Source: &libvirtxml.DomainInterfaceSource{Bridge: &libvirtxml.DomainInterfaceSourceBridge{Bridge: "br0"}}})
	if err := isolateInterface(d, static, "hf-unit-g"); err != nil {
		t.Fatal(err)
	}
	ref := d.Devices.Interfaces[0].FilterRef
	var params []string
	for _, p := range ref.Parameters {
		params = append(params, p.Name+"="+p.Value)
	}
	if ref.Filter != "hf-unit-g" || strings.Join(params, ",") != "CTRL_IP_LEARNING=none,IP=10.1.0.9,IP=10.1.0.10" {
		t.Errorf("static addresses: filterref %s %v", ref.Filter, params)
	}

	user := libvirtxml.DomainInterface{Source: &libvirtxml.DomainInterfaceSource{User: &libvirtxml.DomainInterfaceSourceUser{}}}
	for name, d := range map[string]*libvirtxml.Domain{
		"user-mode":      nicDomain(user),
		"no interface":   nicDomain(),
		"two interfaces": nicDomain(networkNIC("a"), networkNIC("b")),
	} {
		err := isolateInterface(d, testIsolation(), "hf-unit-f")
		if provider.Classify(err) != provider.ClassConfiguration || provider.ReasonOf(err) != "IsolationUnsupported" {
			t.Errorf("%s: %v, want ClassConfiguration IsolationUnsupported", name, err)
		}
		if len(d.Devices.Interfaces) > 0 && d.Devices.Interfaces[0].FilterRef != nil {
			t.Errorf("%s: refused but filtered anyway", name)
		}
	}
}

func TestCheckIsolation(t *testing.T) {
	both := testIsolation()
	both.Addresses = []string{"10.0.0.9"}
	bad := testIsolation()
	bad.Egress[0].Action = "reject"
	for name, iso := range map[string]*provider.Isolation{"DHCP and static addresses": both, "malformed": bad} {
		if err := checkIsolation(iso); provider.ReasonOf(err) != "IsolationUnsupported" {
			t.Errorf("%s: %v, want IsolationUnsupported", name, err)
		}
	}
	if err := checkIsolation(testIsolation()); err != nil {
		t.Errorf("a well-formed policy: %v", err)
	}
}

// TestCheckIsolable: a VM is refused before its clone when the interface
// its configuration gives it cannot be filtered, and accepted when the
// cluster's network replaces the template's user-mode interface.
func TestCheckIsolable(t *testing.T) {
	user := nicDomain(libvirtxml.DomainInterface{Source: &libvirtxml.DomainInterfaceSource{User: &libvirtxml.DomainInterfaceSourceUser{}}})
	spec := &provider.VMSpec{Isolation: testIsolation()}
	if err := testProvider(t, nil).checkIsolable(spec, user); provider.ReasonOf(err) != "IsolationUnsupported" {
		t.Errorf("user-mode interface: %v, want IsolationUnsupported", err)
	}
	if user.Devices.Interfaces[0].FilterRef != nil || user.Devices.Interfaces[0].Source.User == nil {
		t.Error("the check changed the definition it was given")
	}
	withNetwork := testProvider(t, func(_ *provider.ClusterConfig, s *ClusterSettings) { s.Network = "jobs" })
	if err := withNetwork.checkIsolable(spec, user); err != nil {
		t.Errorf("user-mode template on a cluster network: %v", err)
	}
	if err := withNetwork.checkIsolable(&provider.VMSpec{}, nicDomain()); err != nil {
		t.Errorf("no isolation: %v", err)
	}
}

func TestFilterNames(t *testing.T) {
	p := testProvider(t, nil)
	name := p.filterName(testIsolation())
	if name != "hf-unit-"+testIsolation().RulesDigest() || !p.ownFilter(name) {
		t.Errorf("filter name %q, own %v", name, p.ownFilter(name))
	}
	edited := testIsolation()
	edited.Egress[0].Ports[0] = provider.PortRange{From: 8443, To: 8443}
	if p.filterName(edited) == name {
		t.Error("an edited policy names the same filter")
	}
	for _, other := range []string{
		"hf-other-" + testIsolation().RulesDigest(), "hf-unit-x-" + testIsolation().RulesDigest(), "hf-unit-abc", "clean-traffic",
		name + "0", p.isoName(1, "u"), "hf-unit-1-0123456789ab",
	} {
		if p.ownFilter(other) {
			t.Errorf("ownFilter(%q) takes another's filter for the install's", other)
		}
	}
}
