// Package vmspec is what a claim's VM is made of: its hypervisor-neutral
// provider.VMSpec (host name, MAC, resources, network, template source), the
// cloud-init variables of its template and of the claim (vars.go), the
// render check with placeholder credentials (render_check.go), and the
// template drift hash over both (templatehash.go).
package vmspec

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// maxHostnameLength is the DNS label limit (RFC 1035).
const maxHostnameLength = 63

// Hostname returns the claim's VM hostname: a valid DNS label derived
// from the claim's name (and namespace, by the template's strategy). Names
// that do not fit keep their start and get a hash of the full name, so two
// long names never collide on their common prefix.
func Hostname(claim *hfv1.MachineClaim, strategy hfv1.HostnameStrategy) string {
	full := claim.Name
	if strategy == hfv1.HostnameFromNamespaceAndName {
		full = claim.Namespace + "-" + claim.Name
	}
	var b strings.Builder
	for _, r := range strings.ToLower(full) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			// '.' is legal in claim names but separates DNS labels.
			b.WriteByte('-')
		}
	}
	label := strings.Trim(b.String(), "-")
	if len(label) > maxHostnameLength {
		sum := sha256.Sum256([]byte(full))
		label = strings.TrimRight(label[:maxHostnameLength-9], "-") + "-" + hex.EncodeToString(sum[:4])
	}
	if label == "" {
		sum := sha256.Sum256([]byte(full))
		label = "vm-" + hex.EncodeToString(sum[:4])
	}
	return label
}

// FQDN appends the DNS domain, if any.
func FQDN(hostname, domain string) string {
	domain = strings.Trim(domain, ".")
	if domain == "" {
		return ""
	}
	return hostname + "." + domain
}

// MAC derives a stable, locally administered unicast MAC address from
// the claim's UID, so network-config can name the interface before the VM
// exists and a retried clone gets the same address.
func MAC(uid string) string {
	sum := sha256.Sum256([]byte("hyperfleet-mac:" + uid))
	mac := net.HardwareAddr{0x02, sum[0], sum[1], sum[2], sum[3], sum[4]}
	return mac.String()
}

// DNS merges the cluster's DNS settings with the template's, field
// by field (the template wins).
func DNS(cluster *hfv1.HypervisorCluster, tmpl *hfv1.HypervisorMachineTemplate) hfv1.DNSSettings {
	var out hfv1.DNSSettings
	if d := cluster.Spec.DNS; d != nil {
		out = d.DNSSettings
	}
	if d := tmpl.Spec.Network.DNS; d != nil {
		if d.Domain != "" {
			out.Domain = d.Domain
		}
		if len(d.Servers) > 0 {
			out.Servers = d.Servers
		}
		if len(d.Search) > 0 {
			out.Search = d.Search
		}
	}
	return out
}

// Source converts the template's source into the provider's terms: what
// the hypervisor kind of its cluster reads from its own sections
// (provider.TemplateKind, Kind.ReadSource), with the TPM its VMs need. A
// template no registered kind reads has an empty source, which every
// provider refuses.
func Source(tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster) provider.TemplateSource {
	var out provider.TemplateSource
	if kind, ok := provider.TemplateKind(tmpl, cluster); ok {
		out = kind.ReadSource(tmpl)
	}
	out.TPM = TPM(tmpl)
	out.Hardware = Hardware(tmpl, cluster)
	return out
}

// CheckSource refuses a template whose source section is not the kind of
// its cluster (spec.source.proxmox on a libvirt cluster, say): the schema
// allows exactly one section, but only the cluster says which. A cluster
// of a kind this build does not register is refused elsewhere
// (UnknownProvider).
func CheckSource(tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster) error {
	kind, ok := provider.KindOf(cluster.Spec.Provider)
	if !ok || kind.ReadsTemplate(tmpl) {
		return nil
	}
	return fmt.Errorf("spec.source: HypervisorCluster %s is of provider %s, and the template sets no spec.source.%s: name the template in spec.source.%s instead of another hypervisor's section",
		cluster.Name, cluster.Spec.Provider, cluster.Spec.Provider, cluster.Spec.Provider)
}

// TPM is the TPM the template's VMs need: a TPM 2.0 under attestation
// method tpm (added to each VM when spec.attestation.tpm.addVirtualTPM is
// set, else the template's own), nil under every other method.
func TPM(tmpl *hfv1.HypervisorMachineTemplate) *provider.VMTPM {
	a := tmpl.Spec.Attestation
	if a.Method != hfv1.AttestationTPM {
		return nil
	}
	return &provider.VMTPM{Add: a.TPM != nil && a.TPM.AddVirtualTPM}
}

// For builds the VM spec of a claim around its rendered cloud-init.
func For(claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, ci provider.CloudInitSource) (*provider.VMSpec, error) {
	res := tmpl.Spec.Resources
	spec := &provider.VMSpec{
		Owner:       Owner(claim),
		Name:        Hostname(claim, tmpl.Spec.Network.Hostname),
		Description: fmt.Sprintf("HyperFleet VM of MachineClaim %s/%s (template %s)", claim.Namespace, claim.Name, tmpl.Name),
		Source:      Source(tmpl, cluster),
		CPUCores:    int(res.CPU),
		MemoryBytes: res.Memory.Value(),
		Network: provider.NetworkSpec{
			Bridge:     tmpl.Spec.Network.Bridge,
			Model:      tmpl.Spec.Network.Model,
			MACAddress: MAC(string(claim.UID)),
		},
		CloudInit:      ci,
		TPM:            TPM(tmpl),
		SuspendsToDisk: claim.Spec.Standby,
	}
	if spec.Network.Bridge == "" {
		spec.Network.Bridge = cluster.Spec.DefaultBridge
	}
	if tmpl.Spec.Network.VLAN != nil {
		spec.Network.VLAN = int(*tmpl.Spec.Network.VLAN)
	}
	if res.Disk != nil {
		spec.DiskBytes = res.Disk.Value()
	}
	spec.MemoryHint = spec.MemoryBytes
	spec.Hardware = Hardware(tmpl, cluster)
	return spec, nil
}

// Hardware is the template's spec.hardware as a VM gets it: nil when it
// asks for nothing. An extra disk that names no storage gets the
// cluster's defaultStorage (the kind's own default when that is unset
// too), so that the tenancy check and the placement record see the
// storage the disk goes to.
func Hardware(tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster) *provider.Hardware {
	h := tmpl.Spec.Hardware
	if h == nil {
		return nil
	}
	hw := &provider.Hardware{CPUType: h.CPUType, CPUFlags: slices.Clone(h.CPUFlags), NestedVirtualization: h.NestedVirtualization}
	for _, d := range h.Devices {
		hw.Devices = append(hw.Devices, d.Mapping)
	}
	for _, d := range h.ExtraDisks {
		hw.ExtraDisks = append(hw.ExtraDisks, provider.Disk{Bytes: d.Size.Value(), Storage: cmp.Or(d.Storage, cluster.Spec.DefaultStorage)})
	}
	if hw.IsZero() {
		return nil
	}
	return hw
}

// maxRunnerNameLength is the limit on runner names, less the mark
// internal/workloads appends to a default name (ownership.Signer.RunnerName), so
// the mark never cuts the UID part off.
const maxRunnerNameLength = ownership.MaxRunnerNameLength - ownership.RunnerMarkLength

// DefaultRunnerName is a claim's default runner name: its host name and the
// first eight characters of its UID. Runner names must be unique in a
// repository or organization; claims of the same name in two namespaces
// (or a claim re-created under an old name) must not collide, and a
// deterministic name lets a restarted operator find a runner it
// registered but did not get to record.
func DefaultRunnerName(claim *hfv1.MachineClaim, hostname string) string {
	uid := strings.ReplaceAll(string(claim.UID), "-", "")
	if len(uid) > 8 {
		uid = uid[:8]
	}
	if uid == "" {
		return hostname
	}
	base := hostname
	if len(base) > maxRunnerNameLength-len(uid)-1 {
		base = strings.TrimRight(base[:maxRunnerNameLength-len(uid)-1], "-")
	}
	return base + "-" + uid
}

// Owner is the claim as the provider's ownership marker names it.
func Owner(claim *hfv1.MachineClaim) provider.Owner {
	o := provider.Owner{
		Namespace: claim.Namespace,
		Name:      claim.Name,
		UID:       string(claim.UID),
		CreatedAt: claim.CreationTimestamp.UTC(),
	}
	if claim.Spec.RunnerPoolRef != nil {
		o.Pool = claim.Spec.RunnerPoolRef.Name
	}
	return o
}

// UsesNativeDelivery says whether tmpl's VMs on cluster get their
// cloud-init through the hypervisor's own delivery (its kind reads a
// native cloud-init section from tmpl): such a seed cannot carry the
// agent's configuration, which then goes the guest secrets' way.
func UsesNativeDelivery(tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster) bool {
	if tmpl == nil || cluster == nil {
		return false
	}
	kind, ok := provider.TemplateKind(tmpl, cluster)
	return ok && kind.NativeCloudInit(tmpl) != nil
}

// Native is the hypervisor's own cloud-init of a claim's VM whose template
// uses its kind's own delivery (nil otherwise): what the kind of its
// cluster (provider.TemplateKind) reads from its section (Kind.NativeCloudInit: user, keys, files on the
// hypervisor, seed storage) and, from the claim's variables v (ClaimVars),
// its address (DHCP, or the IPPool's with its prefix length and gateway)
// and its resolver. A hypervisor's single search domain both completes the
// host name to the FQDN and is the resolver's search list, so the DNS
// domain comes first when one is set, then the search domains
// (docs/cloud-init.md, "Delivery").
func Native(tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, dns hfv1.DNSSettings, v cloudinit.Vars) *provider.NativeCloudInit {
	kind, ok := provider.TemplateKind(tmpl, cluster)
	if !ok {
		return nil
	}
	n := kind.NativeCloudInit(tmpl)
	if n == nil {
		return nil
	}
	n.Nameservers = slices.Clone([]string(v.DNSServers))
	switch {
	case v.NetworkMode == cloudinit.NetworkStatic && v.StaticIP != "":
		ip, err := netip.ParseAddr(v.StaticIP)
		if err != nil {
			break
		}
		cidr := netip.PrefixFrom(ip, v.NetmaskBits).String()
		if ip.Is4() {
			n.IPv4, n.Gateway4 = cidr, v.Gateway
		} else {
			n.IPv6, n.Gateway6 = cidr, v.Gateway
		}
		// A dual-stack VM's second address: ipconfig0's ip6= and gw6=.
		if ip6, err := netip.ParseAddr(v.StaticIPv6); err == nil {
			n.IPv6, n.Gateway6 = netip.PrefixFrom(ip6, v.NetmaskBitsIPv6).String(), v.GatewayIPv6
		}
	default:
		n.IPv4 = "dhcp"
		if v.IPv6 {
			n.IPv6 = "dhcp"
		}
	}
	if dns.Domain != "" {
		n.SearchDomains = append(n.SearchDomains, dns.Domain)
	}
	for _, d := range []string(v.SearchDomains) {
		if !slices.Contains(n.SearchDomains, d) {
			n.SearchDomains = append(n.SearchDomains, d)
		}
	}
	return n
}
