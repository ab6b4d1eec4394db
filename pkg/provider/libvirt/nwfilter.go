package libvirt

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// opFilter names the write that defines a VM's network filter.
const opFilter = "define-nwfilter"

// cleanTraffic is libvirt's own filter against MAC, IP and ARP spoofing
// (Debian ships it in libvirt-daemon-config-nwfilter). It passes only
// IPv4 and ARP: a VM under it sends and receives no IPv6 at all.
const cleanTraffic = "clean-traffic"

// Priorities of a filter's rules: libvirt orders a filter tree's iptables
// rules by priority (-1000 to 1000, lower first), so the policy's order is
// written as rising priorities. Replies to accepted connections and the
// VM's DHCP come first, the policy's rules from rulePriority on, the final
// drop last.
const (
	establishedPriority = 100
	dhcpPriority        = 110
	rulePriority        = 200
	dropPriority        = 1000
)

// maxFilterRules is how many rules of one direction fit between
// rulePriority and the final drop.
const maxFilterRules = dropPriority - rulePriority - 1

// maxRuleComment is the longest comment libvirt keeps with a rule.
const maxRuleComment = 256

// filterName is the name of the network filter written from iso's rules:
// one per install and rules digest, shared by every VM with the same
// rules, so an edited policy writes a new filter and never changes the VMs
// placed with the old one.
func (p *Provider) filterName(iso *provider.Isolation) string {
	return "hf-" + p.signer.OperatorID() + "-" + iso.RulesDigest()
}

var filterNamePattern = regexp.MustCompile(`^hf-([a-z0-9][a-z0-9-]*)-([0-9a-f]{12})$`)

// ownFilter says whether name is a filter name this install writes
// (filterName); an operator id that is a prefix of another install's does
// not make that install's filters its own.
func (p *Provider) ownFilter(name string) bool {
	m := filterNamePattern.FindStringSubmatch(name)
	return m != nil && m[1] == p.signer.OperatorID()
}

// unsupported is the error of a VM whose isolation cannot be enforced:
// it is refused, never built open.
func unsupported(format string, args ...any) error {
	return provider.Errorf(provider.ClassConfiguration, "IsolationUnsupported", format, args...)
}

// checkIsolation refuses an isolation this provider cannot write: a
// malformed one, more rules than priorities, or static addresses beside
// DHCP (libvirt either learns a VM's addresses from its DHCP leases or is
// given them, never both).
func checkIsolation(iso *provider.Isolation) error {
	if err := iso.Check(); err != nil {
		return unsupported("%w", err)
	}
	if len(iso.Egress) > maxFilterRules || len(iso.Ingress) > maxFilterRules {
		return unsupported("isolation policy %s: %d egress and %d ingress rules; a libvirt filter holds at most %d a direction",
			iso.Policy, len(iso.Egress), len(iso.Ingress), maxFilterRules)
	}
	if iso.DHCP && len(iso.Addresses) > 0 {
		return unsupported("isolation policy %s: static addresses %v beside DHCP; libvirt's clean-traffic learns a VM's addresses from DHCP or is given them, not both",
			iso.Policy, iso.Addresses)
	}
	return nil
}

// isolateInterface puts the filterref of filter on d's first interface,
// with the parameters clean-traffic takes: the VM's addresses learnt from
// its DHCP leases (CTRL_IP_LEARNING dhcp), else its static addresses. It
// refuses a domain whose traffic the filter would not hold: no interface,
// more than one (the others would be open), or one that is neither a
// libvirt network's nor a bridge's (QEMU's user-mode network never passes
// the host's firewall).
func isolateInterface(d *libvirtxml.Domain, iso *provider.Isolation, filter string) error {
	if d.Devices == nil || len(d.Devices.Interfaces) == 0 {
		return unsupported("isolation policy %s: the VM has no network interface to hold to it", iso.Policy)
	}
	if n := len(d.Devices.Interfaces); n > 1 {
		return unsupported("isolation policy %s: the VM has %d network interfaces; only the first would be filtered", iso.Policy, n)
	}
	nic := &d.Devices.Interfaces[0]
	if nic.Source == nil || nic.Source.Network == nil && nic.Source.Bridge == nil {
		return unsupported("isolation policy %s: the VM's interface is of type %s; libvirt filters only interfaces on a network or a bridge",
			iso.Policy, interfaceType(nic))
	}
	ref := &libvirtxml.DomainInterfaceFilterRef{Filter: filter}
	if iso.DHCP {
		ref.Parameters = append(ref.Parameters, libvirtxml.DomainInterfaceFilterParam{Name: "CTRL_IP_LEARNING", Value: "dhcp"})
	} else {
		// Nothing learnt: the VM sends only from these (none: no IP
		// traffic at all).
		ref.Parameters = append(ref.Parameters, libvirtxml.DomainInterfaceFilterParam{Name: "CTRL_IP_LEARNING", Value: "none"})
		for _, a := range iso.Addresses {
			ref.Parameters = append(ref.Parameters, libvirtxml.DomainInterfaceFilterParam{Name: "IP", Value: a})
		}
	}
	nic.FilterRef = ref
	return nil
}

// interfaceType names a domain interface's type as its XML does.
func interfaceType(nic *libvirtxml.DomainInterface) string {
	s := nic.Source
	switch {
	case s == nil:
		return "unknown"
	case s.User != nil:
		return "user"
	case s.Ethernet != nil:
		return "ethernet"
	case s.Direct != nil:
		return "direct"
	case s.VHostUser != nil:
		return "vhostuser"
	case s.Hostdev != nil:
		return "hostdev"
	}
	return "other"
}

// filterRefOf is the filter d's first interface references, empty when
// none.
func filterRefOf(d *libvirtxml.Domain) string {
	if d.Devices == nil || len(d.Devices.Interfaces) == 0 || d.Devices.Interfaces[0].FilterRef == nil {
		return ""
	}
	return d.Devices.Interfaces[0].FilterRef.Filter
}

// filterXML is the network filter written from iso's rules: clean-traffic
// (the VM sends only from its MAC and its addresses), replies to accepted
// connections, the VM's DHCP when it uses DHCP, the egress (direction out,
// from the VM) and ingress (direction in, to the VM) rules in order, each
// accepting a connection's first packet (state NEW) or dropping, then
// drop.
func filterXML(name string, iso *provider.Isolation) (*libvirtxml.NWFilter, error) {
	f := &libvirtxml.NWFilter{Name: name, Chain: "root",
		Entries: []libvirtxml.NWFilterEntry{{Ref: &libvirtxml.NWFilterRef{Filter: cleanTraffic}}}}
	add := func(r *libvirtxml.NWFilterRule) { f.Entries = append(f.Entries, libvirtxml.NWFilterEntry{Rule: r}) }
	for _, e := range []struct{ dir, state string }{{"in", "ESTABLISHED"}, {"out", "ESTABLISHED,RELATED"}} {
		state := libvirtxml.NWFilterField{Str: e.state}
		add(&libvirtxml.NWFilterRule{Action: "accept", Direction: e.dir, Priority: establishedPriority,
			All: &libvirtxml.NWFilterRuleAll{NWFilterRuleCommonIP: libvirtxml.NWFilterRuleCommonIP{State: state}}})
		add(&libvirtxml.NWFilterRule{Action: "accept", Direction: e.dir, Priority: establishedPriority,
			AllIPv6: &libvirtxml.NWFilterRuleAllIPv6{NWFilterRuleCommonIP: libvirtxml.NWFilterRuleCommonIP{State: state}}})
	}
	if iso.DHCP {
		// Its requests and the server's answers, which connection
		// tracking does not pair (a broadcast request, an answer from
		// the server's address).
		for _, e := range []struct {
			dir      string
			from, to uint
		}{{"out", 68, 67}, {"in", 67, 68}} {
			add(&libvirtxml.NWFilterRule{Action: "accept", Direction: e.dir, Priority: dhcpPriority, StateMatch: "false",
				UDP: &libvirtxml.NWFilterRuleUDP{NWFilterRuleCommonPort: libvirtxml.NWFilterRuleCommonPort{
					SrcPortStart: uintField(e.from), DstPortStart: uintField(e.to)}}})
		}
	}
	for _, d := range []struct {
		dir   string
		rules []provider.FirewallRule
	}{{"out", iso.Egress}, {"in", iso.Ingress}} {
		for i, r := range d.rules {
			rules, err := filterRules(r, d.dir, rulePriority+i)
			if err != nil {
				return nil, unsupported("isolation policy %s: %s rule %d: %w", iso.Policy, d.dir, i, err)
			}
			for _, fr := range rules {
				add(fr)
			}
		}
	}
	add(&libvirtxml.NWFilterRule{Action: "drop", Direction: "inout", Priority: dropPriority, StateMatch: "false", All: &libvirtxml.NWFilterRuleAll{}})
	add(&libvirtxml.NWFilterRule{Action: "drop", Direction: "inout", Priority: dropPriority, StateMatch: "false", AllIPv6: &libvirtxml.NWFilterRuleAllIPv6{}})
	return f, nil
}

// uintField is a number as libvirt reads it back: libvirtxml writes a
// Uint field in hexadecimal, which libvirt refuses for masks.
func uintField(n uint) libvirtxml.NWFilterField {
	return libvirtxml.NWFilterField{Str: strconv.FormatUint(uint64(n), 10)}
}

// filterRules are the libvirt rules of one policy rule: one for each
// address family it may match (IPv4 rules become iptables rules, IPv6
// ones ip6tables rules) and each of its port ranges. An accept matches a
// connection's first packet, its replies pass as established; a drop
// matches every packet not already accepted.
func filterRules(r provider.FirewallRule, dir string, priority int) ([]*libvirtxml.NWFilterRule, error) {
	families := []int{4, 6}
	var peer netip.Prefix
	if r.CIDR != "" {
		var err error
		if peer, err = provider.ParseCIDR(r.CIDR); err != nil {
			return nil, err
		}
		families = []int{4}
		if peer.Addr().Is6() {
			families = []int{6}
		}
	}
	switch r.Protocol {
	case provider.ProtocolICMP:
		families = slices.DeleteFunc(families, func(f int) bool { return f == 6 })
	case provider.ProtocolICMPv6:
		families = slices.DeleteFunc(families, func(f int) bool { return f == 4 })
	}
	if len(families) == 0 {
		return nil, fmt.Errorf("protocol %s never matches traffic of %s", r.Protocol, r.CIDR)
	}
	ip := libvirtxml.NWFilterRuleCommonIP{}
	if peer.IsValid() {
		addr, mask := libvirtxml.NWFilterField{Str: peer.Addr().String()}, uintField(uint(peer.Bits()))
		// The other end: the destination of what the VM sends, the
		// source of what it receives.
		if dir == "out" {
			ip.DstIPAddr, ip.DstIPMask = addr, mask
		} else {
			ip.SrcIPAddr, ip.SrcIPMask = addr, mask
		}
	}
	rule := libvirtxml.NWFilterRule{Action: string(r.Action), Direction: dir, Priority: priority}
	if r.Action == provider.FirewallAccept {
		ip.State = libvirtxml.NWFilterField{Str: "NEW"}
	} else {
		rule.StateMatch = "false"
	}
	ports := []libvirtxml.NWFilterRuleCommonPort{{}}
	if len(r.Ports) > 0 {
		ports = nil
		for _, pr := range r.Ports {
			ports = append(ports, libvirtxml.NWFilterRuleCommonPort{DstPortStart: uintField(uint(pr.From)), DstPortEnd: uintField(uint(pr.To))})
		}
	}
	comment := r.Comment
	if len(comment) > maxRuleComment {
		comment = comment[:maxRuleComment]
	}
	var out []*libvirtxml.NWFilterRule
	for _, fam := range families {
		for _, port := range ports {
			fr := rule
			v6 := fam == 6
			switch r.Protocol {
			case provider.ProtocolTCP:
				if v6 {
					fr.TCPIPv6 = &libvirtxml.NWFilterRuleTCPIPv6{NWFilterRuleCommonIP: ip, NWFilterRuleCommonPort: port, Comment: comment}
				} else {
					fr.TCP = &libvirtxml.NWFilterRuleTCP{NWFilterRuleCommonIP: ip, NWFilterRuleCommonPort: port, Comment: comment}
				}
			case provider.ProtocolUDP:
				if v6 {
					fr.UDPIPv6 = &libvirtxml.NWFilterRuleUDPIPv6{NWFilterRuleCommonIP: ip, NWFilterRuleCommonPort: port, Comment: comment}
				} else {
					fr.UDP = &libvirtxml.NWFilterRuleUDP{NWFilterRuleCommonIP: ip, NWFilterRuleCommonPort: port, Comment: comment}
				}
			case provider.ProtocolICMP:
				fr.ICMP = &libvirtxml.NWFilterRuleICMP{NWFilterRuleCommonIP: ip, Comment: comment}
			case provider.ProtocolICMPv6:
				fr.ICMPv6 = &libvirtxml.NWFilterRuleICMPIPv6{NWFilterRuleCommonIP: ip, Comment: comment}
			case "":
				if v6 {
					fr.AllIPv6 = &libvirtxml.NWFilterRuleAllIPv6{NWFilterRuleCommonIP: ip, Comment: comment}
				} else {
					fr.All = &libvirtxml.NWFilterRuleAll{NWFilterRuleCommonIP: ip, Comment: comment}
				}
			default:
				return nil, fmt.Errorf("protocol %q is not tcp, udp, icmp or icmpv6", r.Protocol)
			}
			out = append(out, &fr)
		}
	}
	return out, nil
}

// ensureFilter makes sure h defines the filter of iso; defined says this
// call wrote it (one write). A filter of that name is the same rules
// (its name is their digest) and is left as it is.
func (p *Provider) ensureFilter(h *host, iso *provider.Isolation) (defined bool, err error) {
	name := p.filterName(iso)
	l, err := h.client()
	if err != nil {
		return false, err
	}
	if _, err := l.NwfilterLookupByName(name); err == nil {
		return false, nil
	} else if !isCode(err, golibvirt.ErrNoNwfilter) {
		return false, filterError(fmt.Errorf("look up network filter %s on host %s: %w", name, h.Name, err))
	}
	f, err := filterXML(name, iso)
	if err != nil {
		return false, err
	}
	doc, err := f.Marshal()
	if err != nil {
		return false, fmt.Errorf("render network filter %s: %w", name, err)
	}
	if _, err := l.NwfilterDefineXML(doc); err != nil {
		return false, filterError(fmt.Errorf("define network filter %s on host %s: %w", name, h.Name, err))
	}
	return true, nil
}

// filterError classifies a failed filter call: a host whose libvirtd has
// no nwfilter driver cannot isolate a VM, which no retry changes.
func filterError(err error) error {
	if isCode(err, golibvirt.ErrNoSupport) {
		return provider.Errorf(provider.ClassConfiguration, "IsolationUnsupported", "%w; the host's libvirtd needs its nwfilter driver", err)
	}
	return classify(err)
}

// pendingFilter records that owner's VM, being built, uses filter: the
// sweep leaves it until the VM's domain references it.
func (p *Provider) pendingFilter(o provider.Owner, filter string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.filters[o.UID] = filter
}

// sweepFilters undefines the filters of this install on h that nothing
// references any more: no domain's interface (of any install, running or
// defined), no other filter, no VM this process is building. Every other
// filter is left alone, whoever wrote it. libvirt itself refuses to
// undefine a filter a running domain uses.
func (p *Provider) sweepFilters(h *host) error {
	l, err := h.client()
	if err != nil {
		return err
	}
	filters, _, err := l.ConnectListAllNwfilters(1, 0)
	if err != nil {
		return filterError(fmt.Errorf("list the network filters of host %s: %w", h.Name, err))
	}
	var candidates []golibvirt.Nwfilter
	for _, f := range filters {
		if p.ownFilter(f.Name) {
			candidates = append(candidates, f)
		}
	}
	if len(candidates) == 0 {
		return nil
	}
	used, err := referencedFilters(l, h, filters)
	if err != nil {
		return err
	}
	p.mu.Lock()
	for _, name := range p.filters {
		used[name] = true
	}
	p.mu.Unlock()
	for _, f := range candidates {
		if used[f.Name] {
			continue
		}
		if err := l.NwfilterUndefine(f); err != nil && !isCode(err, golibvirt.ErrNoNwfilter) {
			return filterError(fmt.Errorf("undefine the unused network filter %s on host %s: %w", f.Name, h.Name, err))
		}
	}
	return nil
}

// referencedFilters are the filters h's domains (their definitions and,
// running, their live state) and its filters reference.
func referencedFilters(l *golibvirt.Libvirt, h *host, filters []golibvirt.Nwfilter) (map[string]bool, error) {
	used := map[string]bool{}
	doms, _, err := l.ConnectListAllDomains(1, 0)
	if err != nil {
		return nil, classify(fmt.Errorf("list the domains of host %s: %w", h.Name, err))
	}
	for _, dom := range doms {
		for _, flags := range []golibvirt.DomainXMLFlags{0, golibvirt.DomainXMLInactive} {
			doc, err := l.DomainGetXMLDesc(dom, flags)
			if isCode(err, golibvirt.ErrNoDomain) {
				break // undefined since the listing
			}
			if err != nil {
				return nil, classify(fmt.Errorf("read domain %s on host %s: %w", dom.Name, h.Name, err))
			}
			x, err := parseDomain(doc)
			if err != nil {
				return nil, err
			}
			if x.Devices == nil {
				continue
			}
			for _, nic := range x.Devices.Interfaces {
				if nic.FilterRef != nil {
					used[nic.FilterRef.Filter] = true
				}
			}
		}
	}
	for _, f := range filters {
		doc, err := l.NwfilterGetXMLDesc(f, 0)
		if isCode(err, golibvirt.ErrNoNwfilter) {
			continue
		}
		if err != nil {
			return nil, filterError(fmt.Errorf("read network filter %s on host %s: %w", f.Name, h.Name, err))
		}
		var x libvirtxml.NWFilter
		if err := x.Unmarshal(doc); err != nil {
			return nil, fmt.Errorf("parse network filter %s on host %s: %w", f.Name, h.Name, err)
		}
		for _, e := range x.Entries {
			if e.Ref != nil {
				used[e.Ref.Filter] = true
			}
		}
	}
	return used, nil
}
