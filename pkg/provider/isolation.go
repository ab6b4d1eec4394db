package provider

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Isolation is the network policy a VM's first interface is held to by the
// hypervisor itself (Proxmox VE's firewall, libvirt's nwfilter), so that a
// job in the VM reaches only what the platform team allowed, whatever it
// does inside the guest. The operator compiles it from the cluster's
// policy the claim was placed with (internal/isolation); a provider only
// writes it. nil in a VMSpec means no isolation.
//
// Traffic is judged in order: anti-spoofing first (the VM may send only
// from its MAC address and from Addresses, or an address it was leased
// inside AddressSubnets), then the first rule of its direction that
// matches, then drop. Replies to allowed connections pass (the hypervisors'
// firewalls track connections), as does the VM's own DHCP when DHCP is set.
type Isolation struct {
	// Policy is the policy's name in its cluster, for names and messages.
	Policy string
	// Egress are the connections the VM may open, in order.
	Egress []FirewallRule
	// Ingress are the connections others may open to the VM, in order.
	Ingress []FirewallRule
	// DHCP says the VM gets addresses by DHCP (and IPv6 router
	// advertisements): the firewall lets its DHCP and neighbour discovery
	// through.
	DHCP bool
	// Addresses are the VM's own static addresses (IP literals, no
	// prefix): the sources it may send from, besides a DHCP address.
	Addresses []string
	// AddressSubnets are the networks (CIDRs) an address the guest reports
	// must lie in to be allowed as a source: another VM's or a service's
	// address never is.
	AddressSubnets []string
}

// FirewallAction is what a rule does with the traffic it matches.
type FirewallAction string

// The actions of a FirewallRule.
const (
	FirewallAccept FirewallAction = "accept"
	FirewallDrop   FirewallAction = "drop"
)

// Protocols a FirewallRule may match; empty matches every protocol.
const (
	ProtocolTCP    = "tcp"
	ProtocolUDP    = "udp"
	ProtocolICMP   = "icmp"
	ProtocolICMPv6 = "icmpv6"
)

// FirewallRule is one rule of an Isolation.
type FirewallRule struct {
	// Action is accept or drop.
	Action FirewallAction `json:"action"`
	// CIDR is the other end: the destination of egress, the source of
	// ingress (an address or a network, IPv4 or IPv6); empty is any.
	CIDR string `json:"cidr,omitempty"`
	// Protocol is tcp, udp, icmp or icmpv6; empty is any.
	Protocol string `json:"protocol,omitempty"`
	// Ports are destination ports (tcp and udp only); empty is any.
	Ports []PortRange `json:"ports,omitempty"`
	// Comment says why the rule is there; hypervisors keep it with the
	// rule, where an administrator reads it.
	Comment string `json:"comment,omitempty"`
}

// PortRange is an inclusive range of ports; From == To for one port.
type PortRange struct {
	From uint16 `json:"from"`
	To   uint16 `json:"to"`
}

// String is the range as firewalls write it: "443" or "8000:8100".
func (r PortRange) String() string {
	if r.From == r.To {
		return strconv.Itoa(int(r.From))
	}
	return strconv.Itoa(int(r.From)) + ":" + strconv.Itoa(int(r.To))
}

// Check reports the first thing about i no hypervisor could enforce as
// written, nil for a well-formed policy: the operator compiles only
// well-formed ones, so an error here is a bug worth a clear message.
func (i *Isolation) Check() error {
	for dir, rules := range map[string][]FirewallRule{"egress": i.Egress, "ingress": i.Ingress} {
		for n, r := range rules {
			if err := r.check(); err != nil {
				return fmt.Errorf("isolation policy %s: %s rule %d: %w", i.Policy, dir, n, err)
			}
		}
	}
	for _, a := range i.Addresses {
		if _, err := netip.ParseAddr(a); err != nil {
			return fmt.Errorf("isolation policy %s: address %q: %w", i.Policy, a, err)
		}
	}
	for _, s := range i.AddressSubnets {
		if _, err := netip.ParsePrefix(s); err != nil {
			return fmt.Errorf("isolation policy %s: address subnet %q: %w", i.Policy, s, err)
		}
	}
	return nil
}

func (r FirewallRule) check() error {
	if r.Action != FirewallAccept && r.Action != FirewallDrop {
		return fmt.Errorf("action %q is neither accept nor drop", r.Action)
	}
	if r.CIDR != "" {
		if _, err := ParseCIDR(r.CIDR); err != nil {
			return err
		}
	}
	switch r.Protocol {
	case "", ProtocolTCP, ProtocolUDP, ProtocolICMP, ProtocolICMPv6:
	default:
		return fmt.Errorf("protocol %q is not tcp, udp, icmp or icmpv6", r.Protocol)
	}
	if len(r.Ports) > 0 && r.Protocol != ProtocolTCP && r.Protocol != ProtocolUDP {
		return fmt.Errorf("ports need protocol tcp or udp, not %q", r.Protocol)
	}
	for _, p := range r.Ports {
		if p.From == 0 || p.From > p.To {
			return fmt.Errorf("port range %d-%d is empty or starts at 0", p.From, p.To)
		}
	}
	return nil
}

// ParseCIDR reads an address or a network, as a FirewallRule's CIDR holds
// it: a bare address is its own /32 or /128.
func ParseCIDR(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return p, fmt.Errorf("cidr %q: %w", s, err)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("cidr %q: %w", s, err)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// RulesDigest identifies the policy's rules (not the VM's addresses): 12
// hex characters of a SHA-256 over them. Hypervisor objects written from
// the rules alone (a Proxmox security group, a libvirt filter) are named
// with it, so that an edited policy writes new objects and never changes
// the VMs placed with the old one.
func (i *Isolation) RulesDigest() string {
	raw, err := json.Marshal(struct {
		Egress, Ingress []FirewallRule
		DHCP            bool
	}{i.Egress, i.Ingress, i.DHCP})
	if err != nil {
		// Strings, numbers and bools: nothing json.Marshal refuses.
		panic(fmt.Sprintf("encode isolation rules: %v", err))
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:6])
}

// AllowsAddress reports whether a VM under i may send from a, an address
// its guest reported: one of its static Addresses, or one inside
// AddressSubnets.
func (i *Isolation) AllowsAddress(a netip.Addr) bool {
	a = a.Unmap()
	if slices.ContainsFunc(i.Addresses, func(s string) bool {
		b, err := netip.ParseAddr(s)
		return err == nil && b == a
	}) {
		return true
	}
	return slices.ContainsFunc(i.AddressSubnets, func(s string) bool {
		p, err := netip.ParsePrefix(s)
		return err == nil && p.Contains(a)
	})
}

// IsolationObjects is implemented by a provider that writes hypervisor
// objects shared by the VMs of one policy's rules, named by its
// RulesDigest (a Proxmox VE security group, a libvirt filter). The orphan
// sweeper removes those that no claim's placement record needs any more,
// under its usual grace period.
type IsolationObjects interface {
	// ListIsolationObjects lists the objects of this install.
	ListIsolationObjects(ctx context.Context) ([]IsolationObject, error)
	// DeleteIsolationObject deletes one listed object; one already gone is
	// not an error. ErrInUse when the provider sees a VM that still uses
	// it (it then deletes nothing).
	DeleteIsolationObject(ctx context.Context, o IsolationObject) error
}

// IsolationObject is one object an IsolationObjects provider wrote.
type IsolationObject struct {
	// ID is the hypervisor's name of it.
	ID string
	// Digest is as much of the RulesDigest it was written from as its
	// name holds (a prefix).
	Digest string
}

// For reports whether o was written for rules with digest (a full
// RulesDigest).
func (o IsolationObject) For(digest string) bool {
	return o.Digest != "" && strings.HasPrefix(digest, o.Digest)
}
