// Package isolation compiles a HypervisorCluster's network isolation
// (spec.network.isolation; docs/networking.md, "Isolation") into the
// hypervisor-neutral firewall a VM's interface is held to
// (provider.Isolation): which policy a template's VMs get (PolicyFor), and
// its rules with what every policy allows and denies (Compile). What each
// hypervisor makes of the result is its provider's.
package isolation

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// ErrPolicyNotFound marks a template that names a policy its cluster does
// not define (or any policy on a cluster without isolation).
var ErrPolicyNotFound = errors.New("isolation policy not found")

// Operator is what every policy lets a VM reach of the operator at the
// cluster's operatorCIDRs.
type Operator struct {
	// Ports are the TCP ports of the operator's endpoints VMs call: the
	// agent server's, which also serves the credential broker and the
	// ready hints. Empty: the operator serves VMs nothing.
	Ports []uint16
}

// OperatorFromURL is the Operator whose endpoints VMs reach at rawURL (the
// agent server's URL as VMs use it); empty rawURL serves nothing.
func OperatorFromURL(rawURL string) (Operator, error) {
	if rawURL == "" {
		return Operator{}, nil
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return Operator{}, fmt.Errorf("agent server URL %q: %w", rawURL, err)
	}
	port, err := portOf(u)
	if err != nil {
		return Operator{}, fmt.Errorf("agent server URL %q: %w", rawURL, err)
	}
	return Operator{Ports: []uint16{port}}, nil
}

// Resolver resolves the host name of a template's proxy to the addresses
// its VMs are let through to (net.Resolver in the operator).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// PolicyFor returns the name and definition of the policy tmpl's VMs get
// on cluster: the one it names, else the cluster's defaultPolicy. ok is
// false when the cluster has no isolation (its VMs are not isolated; a
// template naming a policy there is ErrPolicyNotFound). The built-in
// default policy, unless the cluster defines one of that name, is
// returned as an IsolationPolicy allowing egress anywhere.
func PolicyFor(tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster) (p hfv1.IsolationPolicy, ok bool, err error) {
	iso := clusterIsolation(cluster)
	named := tmpl.Spec.Network.IsolationPolicy
	if iso == nil {
		if named != "" {
			return p, false, fmt.Errorf("%w: spec.network.isolationPolicy names %s, but HypervisorCluster %s has no spec.network.isolation: remove isolationPolicy, or ask the cluster's owner to define the policy", ErrPolicyNotFound, named, cluster.Name)
		}
		return p, false, nil
	}
	name := cmp.Or(named, iso.DefaultPolicy, hfv1.DefaultIsolationPolicy)
	if i := slices.IndexFunc(iso.Policies, func(p hfv1.IsolationPolicy) bool { return p.Name == name }); i >= 0 {
		return iso.Policies[i], true, nil
	}
	if name == hfv1.DefaultIsolationPolicy {
		return BuiltinDefault(), true, nil
	}
	return p, false, fmt.Errorf("%w: spec.network.isolationPolicy names %s, which HypervisorCluster %s does not define (its policies: %s): name one of them, or leave it unset for the cluster's default",
		ErrPolicyNotFound, name, cluster.Name, policyNames(iso))
}

// PolicyName is the name of the policy tmpl's VMs get on cluster (as
// PolicyFor picks it), empty when the cluster has no isolation.
func PolicyName(tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster) string {
	iso := clusterIsolation(cluster)
	if iso == nil {
		return ""
	}
	return cmp.Or(tmpl.Spec.Network.IsolationPolicy, iso.DefaultPolicy, hfv1.DefaultIsolationPolicy)
}

// DefaultPolicyName is the policy of cluster's templates that name none,
// empty when the cluster has no isolation.
func DefaultPolicyName(cluster *hfv1.HypervisorCluster) string {
	iso := clusterIsolation(cluster)
	if iso == nil {
		return ""
	}
	return cmp.Or(iso.DefaultPolicy, hfv1.DefaultIsolationPolicy)
}

// BuiltinDefault is the policy named default of a cluster that defines
// none of that name: egress anywhere, on every protocol, that the denied
// networks leave.
func BuiltinDefault() hfv1.IsolationPolicy {
	return hfv1.IsolationPolicy{Name: hfv1.DefaultIsolationPolicy, Egress: []hfv1.EgressRule{
		{CIDRs: []string{"0.0.0.0/0", "::/0"}, Protocol: hfv1.IsolationAny},
	}}
}

func clusterIsolation(cluster *hfv1.HypervisorCluster) *hfv1.NetworkIsolation {
	if cluster.Spec.Network == nil {
		return nil
	}
	return cluster.Spec.Network.Isolation
}

func policyNames(iso *hfv1.NetworkIsolation) string {
	names := []string{}
	for _, p := range iso.Policies {
		names = append(names, p.Name)
	}
	if !slices.Contains(names, hfv1.DefaultIsolationPolicy) {
		names = append(names, hfv1.DefaultIsolationPolicy+" (built in)")
	}
	return strings.Join(names, ", ")
}

// Compile returns the firewall of tmpl's VMs on cluster, nil when the
// cluster has no isolation. Its rules, in order:
//
//  1. egress to the operator (operatorCIDRs) on op's ports, to the
//     cluster's SPIRE server (templates that attest), and DNS to the
//     cluster's dns.servers: the platform team's own endpoints;
//  2. drop to managementCIDRs and to the VMs' networks (vmSubnets): no
//     policy, DNS server or proxy of a tenant's reaches them;
//  3. DNS to anywhere when the cluster names no DNS servers (the VMs'
//     resolvers come from DHCP), and the template's HTTP proxy;
//  4. the policy's egress;
//
// then drop. Ingress: ICMP, and the SSH port when network validation
// checks it, from operatorCIDRs; then drop. The VM may send from its
// static addresses (the caller adds them: provider.Isolation.Addresses) and
// from a leased address in vmSubnets. The host names of the proxy and of
// the SPIRE server are resolved with res now: the VM keeps the addresses
// of its placement.
func Compile(ctx context.Context, tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, op Operator, res Resolver) (*provider.Isolation, error) {
	policy, ok, err := PolicyFor(tmpl, cluster)
	if err != nil || !ok {
		return nil, err
	}
	iso := clusterIsolation(cluster)
	out := &provider.Isolation{Policy: policy.Name, DHCP: tmpl.Spec.Network.Mode != hfv1.NetworkModeStatic}
	if n := cluster.Spec.Network; n != nil {
		out.AddressSubnets = slices.Clone(n.VMSubnets)
	}

	for _, c := range iso.OperatorCIDRs {
		if len(op.Ports) > 0 {
			out.Egress = append(out.Egress, provider.FirewallRule{Action: provider.FirewallAccept, CIDR: c, Protocol: provider.ProtocolTCP, Ports: ranges(op.Ports), Comment: "the operator's agent server"})
		}
	}
	spire, err := spireRules(ctx, tmpl, cluster, res)
	if err != nil {
		return nil, err
	}
	out.Egress = append(out.Egress, spire...)
	var servers []string
	if d := cluster.Spec.DNS; d != nil {
		servers = d.Servers
	}
	for _, s := range servers {
		out.Egress = append(out.Egress, dnsRules(s)...)
	}
	for _, c := range iso.ManagementCIDRs {
		out.Egress = append(out.Egress, provider.FirewallRule{Action: provider.FirewallDrop, CIDR: c, Comment: "management network"})
	}
	for _, c := range out.AddressSubnets {
		out.Egress = append(out.Egress, provider.FirewallRule{Action: provider.FirewallDrop, CIDR: c, Comment: "other VMs"})
	}
	if len(servers) == 0 {
		out.Egress = append(out.Egress, dnsRules("")...)
	}
	proxies, err := proxyRules(ctx, tmpl.Spec.Network.Proxy, res)
	if err != nil {
		return nil, err
	}
	out.Egress = append(out.Egress, proxies...)
	for i, e := range policy.Egress {
		rules, err := egressRules(e)
		if err != nil {
			return nil, fmt.Errorf("isolation policy %s: egress[%d]: %w", policy.Name, i, err)
		}
		out.Egress = append(out.Egress, rules...)
	}

	for _, c := range iso.OperatorCIDRs {
		out.Ingress = append(out.Ingress, provider.FirewallRule{Action: provider.FirewallAccept, CIDR: c, Protocol: icmpOf(c), Comment: "the operator's ping check"})
		if port, ok := sshPort(cluster); ok {
			out.Ingress = append(out.Ingress, provider.FirewallRule{Action: provider.FirewallAccept, CIDR: c, Protocol: provider.ProtocolTCP, Ports: ranges([]uint16{port}), Comment: "the operator's SSH check"})
		}
	}
	if err := out.Check(); err != nil {
		return nil, err
	}
	return out, nil
}

// spireRules allow TCP to the cluster's SPIRE server (spec.spire's
// serverAddress), which the spire-agents of a template that attests
// attest to; a template without attestation needs none.
func spireRules(ctx context.Context, tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, res Resolver) ([]provider.FirewallRule, error) {
	if m := tmpl.Spec.Attestation.Method; m == "" || m == hfv1.AttestationNone {
		return nil, nil
	}
	if cluster.Spec.SPIRE == nil || cluster.Spec.SPIRE.ServerAddress == "" {
		return nil, nil
	}
	host, portText, err := net.SplitHostPort(cluster.Spec.SPIRE.ServerAddress)
	if err != nil {
		return nil, fmt.Errorf("spec.spire.serverAddress %q: %w", cluster.Spec.SPIRE.ServerAddress, err)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil || port == 0 {
		return nil, fmt.Errorf("spec.spire.serverAddress %q: port %q is not a TCP port", cluster.Spec.SPIRE.ServerAddress, portText)
	}
	addrs, err := resolve(ctx, host, res)
	if err != nil {
		return nil, fmt.Errorf("spec.spire.serverAddress %q: resolve its host to let the VMs through: %w", cluster.Spec.SPIRE.ServerAddress, err)
	}
	var out []provider.FirewallRule
	for _, a := range addrs {
		out = append(out, provider.FirewallRule{Action: provider.FirewallAccept, CIDR: a.String(), Protocol: provider.ProtocolTCP, Ports: ranges([]uint16{uint16(port)}), Comment: "the cluster's SPIRE server"})
	}
	return out, nil
}

// dnsRules allow DNS (UDP and TCP port 53) to server, or anywhere when
// server is empty.
func dnsRules(server string) []provider.FirewallRule {
	port := ranges([]uint16{53})
	return []provider.FirewallRule{
		{Action: provider.FirewallAccept, CIDR: server, Protocol: provider.ProtocolUDP, Ports: port, Comment: "DNS"},
		{Action: provider.FirewallAccept, CIDR: server, Protocol: provider.ProtocolTCP, Ports: port, Comment: "DNS"},
	}
}

// proxyRules allow TCP to the addresses and port of each proxy URL.
func proxyRules(ctx context.Context, p *hfv1.ProxySettings, res Resolver) ([]provider.FirewallRule, error) {
	if p == nil {
		return nil, nil
	}
	var out []provider.FirewallRule
	seen := map[string]bool{}
	for _, raw := range []string{p.HTTPProxy, p.HTTPSProxy} {
		if raw == "" || seen[raw] {
			continue
		}
		seen[raw] = true
		u, err := url.Parse(raw)
		if err != nil {
			return nil, fmt.Errorf("spec.network.proxy %q: %w", raw, err)
		}
		port, err := portOf(u)
		if err != nil {
			return nil, fmt.Errorf("spec.network.proxy %q: %w", raw, err)
		}
		addrs, err := resolve(ctx, u.Hostname(), res)
		if err != nil {
			return nil, fmt.Errorf("spec.network.proxy %q: resolve its host to let the VMs through: %w", raw, err)
		}
		for _, a := range addrs {
			out = append(out, provider.FirewallRule{Action: provider.FirewallAccept, CIDR: a.String(), Protocol: provider.ProtocolTCP, Ports: ranges([]uint16{port}), Comment: "the template's HTTP proxy"})
		}
	}
	return out, nil
}

func resolve(ctx context.Context, host string, res Resolver) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a.Unmap()}, nil
	}
	if res == nil {
		return nil, fmt.Errorf("no resolver for host %s", host)
	}
	addrs, err := res.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, a.Unmap())
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), nil
}

// portOf is u's port, or its scheme's.
func portOf(u *url.URL) (uint16, error) {
	if p := u.Port(); p != "" {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return 0, fmt.Errorf("port %q is not a TCP port", p)
		}
		return uint16(n), nil
	}
	switch u.Scheme {
	case "http":
		return 80, nil
	case "https":
		return 443, nil
	}
	return 0, fmt.Errorf("scheme %q has no default port", u.Scheme)
}

// egressRules are one accept rule per destination of e.
func egressRules(e hfv1.EgressRule) ([]provider.FirewallRule, error) {
	proto := ""
	switch e.Protocol {
	case hfv1.IsolationTCP, "":
		proto = provider.ProtocolTCP
	case hfv1.IsolationUDP:
		proto = provider.ProtocolUDP
	case hfv1.IsolationICMP, hfv1.IsolationAny:
	default:
		return nil, fmt.Errorf("protocol %q is not TCP, UDP, ICMP or Any", e.Protocol)
	}
	var ports []provider.PortRange
	for _, p := range e.Ports {
		r, err := ParsePorts(p)
		if err != nil {
			return nil, err
		}
		ports = append(ports, r)
	}
	out := make([]provider.FirewallRule, 0, len(e.CIDRs))
	for _, c := range e.CIDRs {
		pr := proto
		if e.Protocol == hfv1.IsolationICMP {
			pr = icmpOf(c)
		}
		out = append(out, provider.FirewallRule{Action: provider.FirewallAccept, CIDR: c, Protocol: pr, Ports: ports, Comment: "policy egress"})
	}
	return out, nil
}

// ParsePorts reads an egress port entry: "443" or "8000-8100".
func ParsePorts(s string) (provider.PortRange, error) {
	from, to, isRange := strings.Cut(s, "-")
	if !isRange {
		to = from
	}
	a, errA := strconv.ParseUint(from, 10, 16)
	b, errB := strconv.ParseUint(to, 10, 16)
	if errA != nil || errB != nil || a == 0 || a > b {
		return provider.PortRange{}, fmt.Errorf("port %q is not a port (1-65535) or a range such as 8000-8100", s)
	}
	return provider.PortRange{From: uint16(a), To: uint16(b)}, nil
}

// icmpOf is the ICMP protocol of cidr's family.
func icmpOf(cidr string) string {
	if p, err := provider.ParseCIDR(cidr); err == nil && p.Addr().Is6() {
		return provider.ProtocolICMPv6
	}
	return provider.ProtocolICMP
}

// sshPort is the port network validation's SSH check connects to, when
// it runs.
func sshPort(cluster *hfv1.HypervisorCluster) (uint16, bool) {
	n := cluster.Spec.Network
	if n == nil || n.Validation == nil || !n.Validation.SSHTest || (n.Validation.Enabled != nil && !*n.Validation.Enabled) {
		return 0, false
	}
	return uint16(cmp.Or(n.Validation.SSHPort, int32(hfv1.DefaultSSHPort))), true
}

func ranges(ports []uint16) []provider.PortRange {
	out := make([]provider.PortRange, 0, len(ports))
	for _, p := range ports {
		out = append(out, provider.PortRange{From: p, To: p})
	}
	return out
}

// WithAddresses returns iso with the VM's static addresses added as the
// sources it may send from; nil stays nil.
func WithAddresses(iso *provider.Isolation, addrs []vmspec.StaticAddr) *provider.Isolation {
	if iso == nil || len(addrs) == 0 {
		return iso
	}
	out := *iso
	out.Addresses = slices.Clone(iso.Addresses)
	for _, a := range addrs {
		if s := a.IP.String(); !slices.Contains(out.Addresses, s) {
			out.Addresses = append(out.Addresses, s)
		}
	}
	return &out
}

// NetResolver is the operator's Resolver: the system's.
var NetResolver Resolver = net.DefaultResolver
