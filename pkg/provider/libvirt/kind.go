package libvirt

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Kind is libvirt as a hypervisor kind (spec.provider libvirt): the only
// code that reads a cluster's spec.libvirt and a template's
// source.libvirt, and speaks of domains, storage pools and virsh. The
// binary's main registers it (provider.Register(hfv1.ProviderLibvirt,
// libvirt.Kind)).
var Kind provider.Kind = hypervisorKind{}

// hypervisorKind implements provider.Kind; it holds nothing.
type hypervisorKind struct{}

// Machine numbers of a libvirt cluster. libvirt has no VM ids of its own:
// the number lives in the domain's metadata and in its keyed name, which
// is unique per install (ownership.Signer.VMName), so installs sharing a
// host never collide and no range needs keeping apart from anyone's. The
// block only bounds how many VMs one install numbers at once on the
// cluster.
const (
	firstMachineNumber = 1
	lastMachineNumber  = 65535
)

// Secret fields of spec.libvirt, as SectionSecretRefs names them and
// ReadSectionSecrets takes them back.
const (
	fieldSSHPrivateKey = "spec.libvirt.ssh.privateKeyRef"
	fieldSSHKnownHosts = "spec.libvirt.ssh.knownHostsRef"
)

// New implements provider.Factory.
func (hypervisorKind) New(cfg provider.ClusterConfig, deps provider.Deps) (provider.Provider, error) {
	return Factory.New(cfg, deps)
}

// ReadCluster sets the hosts, pools, network, copy mode and device
// mappings of spec.libvirt, and the machine-number block. A VM whose template names no
// bridge joins the cluster's spec.defaultBridge (a host bridge; the shared
// code fills it into the VM's spec), else spec.libvirt.network, else keeps
// the template domain's interface. The ssh Secrets are filled in by
// ReadSectionSecrets, after the shared code read them.
func (hypervisorKind) ReadCluster(cluster *hfv1.HypervisorCluster, cfg *provider.ClusterConfig) error {
	l := cluster.Spec.Libvirt
	if l == nil {
		return provider.Errorf(provider.ClassConfiguration, "InvalidSettings", "HypervisorCluster %q: provider libvirt needs spec.libvirt: set its hosts and volumePool", cluster.Name)
	}
	s := &ClusterSettings{VolumePool: l.VolumePool, MediaPool: l.MediaPool, Network: l.Network, FullCopies: l.FullCopies}
	for _, h := range l.Hosts {
		host := Host{Name: h.Name, URI: h.URI}
		if h.ReservedMemory != nil {
			host.ReservedMemoryBytes = h.ReservedMemory.Value()
		}
		s.Hosts = append(s.Hosts, host)
	}
	for _, d := range l.Devices {
		s.Devices = append(s.Devices, Device{Mapping: d.Name, Host: d.Host, Address: d.Address})
	}
	cfg.Settings = s
	cfg.VMIDStart, cfg.VMIDEnd = firstMachineNumber, lastMachineNumber
	return nil
}

// SectionSecretRefs lists the Secret keys spec.libvirt references, by the
// field that selects each: the ssh key and known hosts.
func (hypervisorKind) SectionSecretRefs(cluster *hfv1.HypervisorCluster) map[string]*hfv1.SecretKeySelector {
	l := cluster.Spec.Libvirt
	if l == nil || l.SSH == nil {
		return nil
	}
	return map[string]*hfv1.SecretKeySelector{fieldSSHPrivateKey: &l.SSH.PrivateKeyRef, fieldSSHKnownHosts: &l.SSH.KnownHostsRef}
}

// ReadSectionSecrets sets in cfg's settings (ReadCluster's) the values of
// the Secret keys SectionSecretRefs listed, by field.
func (hypervisorKind) ReadSectionSecrets(cfg *provider.ClusterConfig, values map[string][]byte) error {
	s, ok := cfg.Settings.(*ClusterSettings)
	if !ok || s == nil {
		return fmt.Errorf("HypervisorCluster %q: spec.libvirt was not read before its Secrets (settings of type %T)", cfg.Name, cfg.Settings)
	}
	s.SSHPrivateKey, s.SSHKnownHosts = values[fieldSSHPrivateKey], values[fieldSSHKnownHosts]
	return nil
}

// MovedFields implements provider.Kind: spec.libvirt replaced no field.
func (hypervisorKind) MovedFields(*hfv1.HypervisorCluster) []provider.MovedField { return nil }

// ReadsTemplate implements provider.Kind: source.libvirt names a domain.
func (hypervisorKind) ReadsTemplate(tmpl *hfv1.HypervisorMachineTemplate) bool {
	src := tmpl.Spec.Source.Libvirt
	return src != nil && src.Domain != ""
}

// ReadSource implements provider.Kind: the template domain, linked (a
// qcow2 overlay) unless the cluster's spec.libvirt.fullCopies says
// otherwise, which the provider applies itself (ClusterSettings).
func (hypervisorKind) ReadSource(tmpl *hfv1.HypervisorMachineTemplate) provider.TemplateSource {
	ref := &TemplateRef{}
	if src := tmpl.Spec.Source.Libvirt; src != nil {
		ref.Domain, ref.Host = src.Domain, src.Host
	}
	return provider.TemplateSource{Linked: true, Settings: ref}
}

// NativeCloudInit implements provider.Kind: libvirt has no cloud-init of
// its own, so a template on it always uses the NoCloud ISO.
func (hypervisorKind) NativeCloudInit(*hfv1.HypervisorMachineTemplate) *provider.NativeCloudInit {
	return nil
}

// HashInput implements provider.Kind: source.libvirt as JSON; there is no
// native part.
func (hypervisorKind) HashInput(tmpl *hfv1.HypervisorMachineTemplate) (source, native json.RawMessage, err error) {
	raw, err := json.Marshal(tmpl.Spec.Source.Libvirt)
	if err != nil {
		return nil, nil, fmt.Errorf("encode spec.source.libvirt: %w", err)
	}
	return raw, nil, nil
}

// TenancyViolations implements provider.Kind with the rule's neutral
// lists: its templates' name entries are domain names (an id entry names
// a Proxmox VM id, which no domain has), its storages must hold the
// cluster's volumePool and mediaPool, its bridges the cluster's network
// (a template's own network.bridge is checked by the shared code). The
// pools and network are the cluster's, so they are checked only when the
// rule lists storages or bridges at all: an admin who lists none has not
// restricted them.
func (hypervisorKind) TenancyViolations(tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, rule *hfv1.TenancyRule) []string {
	var out []string
	if v := domainViolation(tmpl.Spec.Source.Libvirt, rule); v != "" {
		out = append(out, v)
	}
	l := cluster.Spec.Libvirt
	if l == nil {
		return out
	}
	if len(rule.Storages) > 0 {
		for _, pool := range []struct{ field, name string }{{"volumePool", l.VolumePool}, {"mediaPool", l.MediaPool}} {
			if pool.name != "" && !slices.Contains(rule.Storages, pool.name) {
				out = append(out, fmt.Sprintf("the cluster's spec.libvirt.%s %s is not allowed; allowed storages: %s", pool.field, pool.name, strings.Join(rule.Storages, ", ")))
			}
		}
	}
	if len(rule.Bridges) > 0 && l.Network != "" && !slices.Contains(rule.Bridges, l.Network) {
		out = append(out, fmt.Sprintf("the cluster's spec.libvirt.network %s is not allowed; allowed bridges and networks: %s", l.Network, strings.Join(rule.Bridges, ", ")))
	}
	return out
}

// domainViolation checks the template domain against the rule's name
// entries.
func domainViolation(src *hfv1.LibvirtSource, rule *hfv1.TenancyRule) string {
	var domain string
	if src != nil {
		domain = src.Domain
	}
	var names []string
	for _, t := range rule.Templates {
		if t.Name == "" {
			continue
		}
		if t.Name == domain {
			return ""
		}
		names = append(names, t.Name)
	}
	allowed := "none"
	if len(names) > 0 {
		allowed = strings.Join(names, ", ")
	}
	return fmt.Sprintf("spec.source.libvirt.domain %q is not allowed; allowed domains (tenancy templates name entries): %s", domain, allowed)
}

// DescribeTemplate implements provider.Kind: the domain's name, and the
// host it was found on.
func (hypervisorKind) DescribeTemplate(info *provider.TemplateInfo) string {
	if info.Node == "" {
		return info.Name
	}
	return fmt.Sprintf("%s (on host %s)", info.Name, info.Node)
}

// Advice implements provider.Kind, with virsh and libvirt's storage
// pools.
func (hypervisorKind) Advice(topic provider.AdviceTopic, info *provider.TemplateInfo) string {
	switch topic {
	case provider.AdviceGuestAgent:
		return fmt.Sprintf("Give the template domain the guest agent's channel (virsh edit %s: a <channel type='unix'> with <target type='virtio' name='org.qemu.guest_agent.0'/>), with qemu-guest-agent in the image; docs/templates.md", info.Name)
	case provider.AdviceLinkedClone:
		return fmt.Sprintf("template domain %s has its disk in pool %s, which cannot hold the qcow2 overlays of linked clones: move the template's volume to a directory-like pool of qcow2 volumes (virsh vol-clone, virsh edit %s), or set spec.libvirt.fullCopies on the cluster",
			info.Name, strings.Join(info.Storages, ", "), info.Name)
	}
	return ""
}

// ResolvedTemplate implements provider.Kind: the host and the pool of the
// template's disk. VMID is left zero: a domain has no VM id.
func (hypervisorKind) ResolvedTemplate(info *provider.TemplateInfo) hfv1.ResolvedTemplate {
	out := hfv1.ResolvedTemplate{Node: info.Node}
	if len(info.Storages) > 0 {
		out.Storage = info.Storages[0]
	}
	return out
}
