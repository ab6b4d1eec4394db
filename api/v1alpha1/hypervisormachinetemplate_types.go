package v1alpha1

import (
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// HypervisorMachineTemplateSpec describes the VMs built from one hypervisor
// template: where they run, their size and network, how they prove who they
// are and how their CI runner is bootstrapped.
// +kubebuilder:validation:XValidation:rule="self.network.mode != 'cloud-init' || (has(self.cloudInit) && has(self.cloudInit.networkData))",message="network.mode cloud-init takes the network configuration from cloudInit.networkData: set it, or use mode dhcp or static"
// +kubebuilder:validation:XValidation:rule="!has(self.cloudInit) || !has(self.cloudInit.delivery) || self.cloudInit.delivery != 'proxmox' || self.network.mode != 'cloud-init'",message="network.mode cloud-init takes the network from cloudInit.networkData, which cloudInit.delivery proxmox cannot carry: use network.mode dhcp or static (Proxmox's ipconfig0), or delivery iso"
// +kubebuilder:validation:XValidation:rule="!has(self.cloudInit) || !has(self.cloudInit.delivery) || self.cloudInit.delivery != 'proxmox' || !has(self.network.dhcp) || !has(self.network.dhcp.clientIdentifier) || self.network.dhcp.clientIdentifier != 'hostname'",message="network.dhcp.clientIdentifier hostname needs a bootcmd in the VM's user-data, which cloudInit.delivery proxmox cannot carry: use clientIdentifier mac, or delivery iso"
// +kubebuilder:validation:XValidation:rule="!has(self.cloudInit) || !has(self.cloudInit.delivery) || self.cloudInit.delivery != 'proxmox' || !has(self.bootstrap.agentSource) || self.bootstrap.agentSource != 'Operator'",message="bootstrap.agentSource Operator downloads the agent from per-template user-data, which cloudInit.delivery proxmox cannot carry: use agentSource Image (the agent in the template's image), or delivery iso"
// +kubebuilder:validation:XValidation:rule="!(has(self.guest) && self.guest.os == 'windows') || has(self.bootstrap.github)",message="guest.os windows runs GitHub Actions runners only (the agent's Windows build has no GitLab, Buildkite or generic runner kind): use bootstrap.github, or a Linux template (remove guest)"
// +kubebuilder:validation:XValidation:rule="!(has(self.guest) && self.guest.os == 'windows') || !has(self.bootstrap.github) || (has(self.bootstrap.github.runner) && has(self.bootstrap.github.runner.os) && self.bootstrap.github.runner.os == 'win')",message="guest.os windows needs bootstrap.github.runner.os: win (the Windows runner package and labels): set it"
// +kubebuilder:validation:XValidation:rule="(has(self.guest) && self.guest.os == 'windows') || !has(self.bootstrap.github) || !has(self.bootstrap.github.runner) || !has(self.bootstrap.github.runner.os) || self.bootstrap.github.runner.os != 'win'",message="bootstrap.github.runner.os win needs a Windows template: set guest.os: windows (a cloudbase-init image, docs/windows.md), or os: linux"
// +kubebuilder:validation:XValidation:rule="!(has(self.guest) && self.guest.os == 'windows') || !has(self.attestation.method) || self.attestation.method == 'none'",message="guest.os windows cannot attest: the agent's Windows build runs no spire-agent and no TPM enrollment; set attestation.method: none, or use a Linux template"
// +kubebuilder:validation:XValidation:rule="!(has(self.guest) && self.guest.os == 'windows') || !has(self.cloudInit) || !has(self.cloudInit.delivery) || self.cloudInit.delivery == 'iso'",message="guest.os windows takes its user data from the NoCloud ISO (cloudbase-init's NoCloud service): set cloudInit.delivery: iso, or remove it"
// +kubebuilder:validation:XValidation:rule="!(has(self.guest) && self.guest.os == 'windows') || !has(self.cloudInit) || (!has(self.cloudInit.userData) && !has(self.cloudInit.networkData) && !has(self.cloudInit.metaData))",message="cloudInit.userData, networkData and metaData are not merged into a Windows VM's cloudbase-init data: bake your configuration into the Windows image (docs/windows.md), or remove guest"
// +kubebuilder:validation:XValidation:rule="!(has(self.guest) && self.guest.os == 'windows') || (self.network.mode == 'dhcp' && (!has(self.network.dhcp) || ((!has(self.network.dhcp.clientIdentifier) || self.network.dhcp.clientIdentifier == 'mac') && (!has(self.network.dhcp.requestStaticLease) || !self.network.dhcp.requestStaticLease) && !has(self.network.dhcp.leaseTime) && !has(self.network.dhcp.client) && (!has(self.network.dhcp.ipv6) || !self.network.dhcp.ipv6))))",message="guest.os windows takes its address from Windows' own DHCP client: use network.mode dhcp without dhcp.clientIdentifier hostname, requestStaticLease, leaseTime, client or ipv6 (they configure dhclient on Linux)"
// +kubebuilder:validation:XValidation:rule="!(has(self.guest) && self.guest.os == 'windows') || !has(self.bootstrap.agentSource) || self.bootstrap.agentSource == 'Image'",message="guest.os windows needs the agent in the image (C:\\Program Files\\HyperFleet\\hyperfleet-agent.exe): set bootstrap.agentSource: Image; the Operator download is not built for Windows"
type HypervisorMachineTemplateSpec struct {
	// hypervisorClusterRef names the cluster-scoped HypervisorCluster the VMs
	// are created on. Its allowedNamespaces must admit this namespace.
	// +required
	HypervisorClusterRef ObjectName `json:"hypervisorClusterRef"`

	// source is the hypervisor template VMs are cloned from.
	// +required
	Source MachineSource `json:"source"`

	// resources are the VM's CPU, memory and root disk size.
	// +required
	Resources MachineResources `json:"resources"`

	// network is the VM's network interface and addressing.
	// +optional
	// +kubebuilder:default={mode: dhcp}
	Network MachineNetwork `json:"network,omitempty"`

	// hardware is what the VMs get beyond resources: a CPU model and flags
	// (nested virtualization for KVM in jobs), passed-through devices
	// (GPUs and other PCI devices) and extra disks. Unset: the template's
	// own CPU, no device, no extra disk.
	// +optional
	Hardware *MachineHardware `json:"hardware,omitempty"`

	// attestation is how a VM proves its identity before it is given a
	// workload credential: none (default), join-token (SPIFFE identity
	// from SPIRE, then the credential broker; docs/identity.md) or tpm (the
	// same identity, attested by the VM's TPM through SPIRE's tpm_devid;
	// docs/identity.md, "TPM").
	// +optional
	// +kubebuilder:default={method: none}
	Attestation Attestation `json:"attestation,omitempty"`

	// bootstrap is how the CI runner inside the VM gets its single-use
	// credential.
	// +required
	Bootstrap Bootstrap `json:"bootstrap"`

	// guest is the VM's operating system and the program in the image that
	// consumes its user data. Unset: Linux with cloud-init. windows: the
	// image has cloudbase-init, which reads the same NoCloud ISO (its
	// NoCloud metadata service), and the agent runs as a Windows service
	// (docs/windows.md).
	// +optional
	Guest *Guest `json:"guest,omitempty"`

	// cloudInit is the user's own cloud-init, merged with what the operator
	// renders for each VM. Values are Go templates; see the docs for the
	// variables and the merge rules.
	// +optional
	CloudInit *CloudInit `json:"cloudInit,omitempty"`

	// metadata is added to every MachineClaim a RunnerPool creates from
	// this template (a MachineClaim written by hand carries the labels and
	// annotations its author gives it).
	// +optional
	Metadata *ObjectMetadata `json:"metadata,omitempty"`
}

// GuestOS is a VM's operating system.
// +kubebuilder:validation:Enum=linux;windows
type GuestOS string

const (
	// GuestLinux: cloud-init consumes the user data; the agent is a
	// systemd unit.
	GuestLinux GuestOS = "linux"
	// GuestWindows: cloudbase-init consumes the user data (MIME multipart:
	// a cloud-config part and a PowerShell part); the agent is a Windows
	// service.
	GuestWindows GuestOS = "windows"
)

// Guest is what runs inside the VM.
type Guest struct {
	// os is linux (default: cloud-init, systemd) or windows (cloudbase-init,
	// a Windows service; GitHub Actions runners only, with runner.os win,
	// attestation none, network mode dhcp, agentSource Image and no
	// cloudInit.userData, networkData or metaData; docs/windows.md).
	// +optional
	// +kubebuilder:default=linux
	OS GuestOS `json:"os,omitempty"`

	// jobMayEscalate accepts an image whose job user (the user the runner
	// runs jobs as, runner in docs/templates.md's image) can become root:
	// a sudo rule, a root-equivalent group such as docker, or root itself.
	// A job that becomes root reads the runner's credential from the
	// agent's and the runner's memory. Where that credential serves more
	// than one job on its platform (a GitHub registration token with
	// bootstrap.method runner-token, a GitLab runner token, a Buildkite
	// agent token), the VM's agent refuses to run the job unless this is
	// true: the job could copy the credential and run, or read, the
	// scope's other jobs with it. With a single-job credential (a GitHub
	// JIT configuration, a Buildkite job token) the job runs either way.
	// Set it only when every job of the pool's scope may see every other
	// (docs/templates.md, "The job user"). Linux guests; a Windows guest's
	// job runs as the service's account and is not checked.
	// +optional
	JobMayEscalate bool `json:"jobMayEscalate,omitempty"`
}

// CloneMode says whether a VM shares its template's base disk.
// +kubebuilder:validation:Enum=linked;full
type CloneMode string

const (
	// CloneModeLinked shares the template's base disk: fast, needs a storage
	// that supports linked clones (LVM-thin, ZFS, RBD, qcow2 on a directory).
	CloneModeLinked CloneMode = "linked"
	// CloneModeFull copies the whole disk: slower, works on any storage.
	CloneModeFull CloneMode = "full"
)

// MachineSource is the template a VM is cloned from: a one-of with one
// section per hypervisor kind, each named like the HypervisorCluster
// provider it is for. The template is refused when its section is not the
// kind of its cluster (docs/architecture.md, "A second hypervisor").
//
// proxmox stays a struct value (omitzero, not a pointer): the many callers
// that read tmpl.Spec.Source.Proxmox keep compiling and never meet a nil,
// and an unset section is its zero value, which names no template
// (provider.Kind.ReadsTemplate is false).
// +kubebuilder:validation:XValidation:rule="[has(self.proxmox), has(self.libvirt)].filter(x, x).size() == 1",message="set exactly one of source.proxmox and source.libvirt: the section of the template's HypervisorCluster provider"
type MachineSource struct {
	// proxmox names a Proxmox VE template (provider proxmox).
	// +optional
	Proxmox ProxmoxSource `json:"proxmox,omitzero"`

	// libvirt names a libvirt template domain (provider libvirt).
	// +optional
	Libvirt *LibvirtSource `json:"libvirt,omitempty"`
}

// DiskFormat is a disk image format for full clones.
// +kubebuilder:validation:Enum=raw;qcow2;vmdk
type DiskFormat string

// ProxmoxSource is a Proxmox VE template, named by id or by name.
// +kubebuilder:validation:XValidation:rule="[has(self.templateID) || has(self.templateId), has(self.templateName), has(self.templateSelector)].filter(x, x).size() == 1",message="set exactly one of source.proxmox.templateID, templateName and templateSelector"
// +kubebuilder:validation:XValidation:rule="!has(self.templateId)",message="spec.source.proxmox.templateId is now templateID: rename the field"
// +kubebuilder:validation:XValidation:rule="self.cloneMode == 'full' || (!has(self.storage) && !has(self.format))",message="storage and format apply only to full clones: remove them or set cloneMode: full"
type ProxmoxSource struct {
	// templateID is the VM id of the template, such as 9000.
	// +optional
	// +kubebuilder:validation:Minimum=100
	// +kubebuilder:validation:Maximum=999999999
	TemplateID *int32 `json:"templateID,omitempty"`

	// templateId is the earlier spelling of templateID, refused on new
	// writes; a template stored with it keeps working (read as
	// templateID) and is told to rename it in a DeprecatedField event.
	//
	// Deprecated: set templateID. Only the schema and that event read this
	// field: decoding folds it into TemplateID (api/v1alpha1/spelling.go).
	// +optional
	// +kubebuilder:validation:Minimum=100
	// +kubebuilder:validation:Maximum=999999999
	DeprecatedTemplateID *int32 `json:"templateId,omitempty"`

	// templateName is the name of the template. It must name exactly one
	// template on the cluster.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9]([-a-zA-Z0-9.]*[a-zA-Z0-9])?$`
	TemplateName string `json:"templateName,omitempty"`

	// templateSelector names a template by its Proxmox tags, one copy on
	// each node that holds one: clones are placed only on nodes with a
	// copy, each cloned from its own node's copy, so linked clones work on
	// local storage (local-lvm, local-zfs) on every such node. A node
	// with two templates carrying every tag is refused (the template is
	// not Ready, reason TemplateAmbiguous) rather than guessed.
	// +optional
	TemplateSelector *TemplateSelector `json:"templateSelector,omitempty"`

	// cloneMode is linked (default; shares the template's base disk) or full.
	// +optional
	// +kubebuilder:default=linked
	CloneMode CloneMode `json:"cloneMode,omitempty"`

	// storage is the target storage of a full clone; defaults to the
	// cluster's defaultStorage. Full clones only.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[a-zA-Z][-_a-zA-Z0-9]*$`
	Storage string `json:"storage,omitempty"`

	// format is the disk format of a full clone. Full clones only.
	// +optional
	Format DiskFormat `json:"format,omitempty"`

	// pool is the Proxmox resource pool new VMs are put in.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_][-A-Za-z0-9_]*$`
	Pool string `json:"pool,omitempty"`
}

// TemplateSelector selects templates by their tags.
type TemplateSelector struct {
	// matchTags are tags every selected template carries (Proxmox tags:
	// letters, digits and _ - + ., compared lower-cased).
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:Pattern=`^[a-zA-Z0-9_][-a-zA-Z0-9_+.]*$`
	// +listType=set
	MatchTags []string `json:"matchTags"`
}

// MachineResources size a VM.
// +kubebuilder:validation:XValidation:rule="quantity(string(self.memory)).compareTo(quantity('256Mi')) >= 0 && quantity(string(self.memory)).compareTo(quantity('4Ti')) <= 0",message="resources.memory must be between 256Mi and 4Ti"
// +kubebuilder:validation:XValidation:rule="!has(self.disk) || (quantity(string(self.disk)).compareTo(quantity('1Gi')) >= 0 && quantity(string(self.disk)).compareTo(quantity('64Ti')) <= 0)",message="resources.disk must be between 1Gi and 64Ti"
type MachineResources struct {
	// cpu is the number of virtual CPU cores.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=512
	CPU int32 `json:"cpu"`

	// memory is the VM's memory, such as 8Gi (256Mi to 4Ti).
	// +required
	Memory resource.Quantity `json:"memory"`

	// disk is the size the root disk is grown to, such as 50Gi. Unset keeps
	// the template's size; a disk is never shrunk.
	// +optional
	Disk *resource.Quantity `json:"disk,omitempty"`
}

// NetworkMode says how a VM gets its address.
// +kubebuilder:validation:Enum=dhcp;static;cloud-init
type NetworkMode string

const (
	// NetworkModeDHCP leaves addressing to a DHCP server.
	NetworkModeDHCP NetworkMode = "dhcp"
	// NetworkModeStatic gives each VM an address from an IPPool.
	NetworkModeStatic NetworkMode = "static"
	// NetworkModeCloudInit uses the template's cloudInit.networkData as is.
	NetworkModeCloudInit NetworkMode = "cloud-init"
)

// MachineNetwork is a VM's network interface and addressing.
// +kubebuilder:validation:XValidation:rule="self.mode != 'static' || has(self.ipPoolRef) || has(self.ipPoolRefs)",message="network.mode static needs network.ipPoolRef (one IPPool) or network.ipPoolRefs (an IPv4 and an IPv6 IPPool, for dual stack): name the IPPools that addresses come from"
// +kubebuilder:validation:XValidation:rule="self.mode == 'static' || !has(self.ipPoolRef)",message="network.ipPoolRef applies only to network.mode static"
// +kubebuilder:validation:XValidation:rule="self.mode == 'static' || !has(self.ipPoolRefs)",message="network.ipPoolRefs applies only to network.mode static"
// +kubebuilder:validation:XValidation:rule="!has(self.ipPoolRef) || !has(self.ipPoolRefs)",message="network.ipPoolRef and network.ipPoolRefs are exclusive: keep ipPoolRef for one IPPool, or list every IPPool (one IPv4, one IPv6) in ipPoolRefs"
// +kubebuilder:validation:XValidation:rule="self.mode == 'dhcp' || !has(self.dhcp)",message="network.dhcp applies only to network.mode dhcp"
type MachineNetwork struct {
	// mode is dhcp (default), static (an address from ipPoolRef, or one
	// from each pool of ipPoolRefs) or cloud-init (the template's
	// cloudInit.networkData, unchanged).
	// +optional
	// +kubebuilder:default=dhcp
	Mode NetworkMode `json:"mode,omitempty"`

	// bridge is the hypervisor bridge of the VM's first NIC; defaults to the
	// cluster's defaultBridge (or, unset, the hypervisor kind's default).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:Pattern=`^[a-zA-Z][-_.a-zA-Z0-9]*$`
	Bridge string `json:"bridge,omitempty"`

	// vlan tags the NIC's traffic with this 802.1Q VLAN id.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4094
	VLAN *int32 `json:"vlan,omitempty"`

	// model is the emulated NIC model.
	// +optional
	// +kubebuilder:default=virtio
	// +kubebuilder:validation:Enum=virtio;e1000;rtl8139;vmxnet3
	Model string `json:"model,omitempty"`

	// dhcp tunes DHCP; mode dhcp only.
	// +optional
	DHCP *DHCPOptions `json:"dhcp,omitempty"`

	// ipPoolRef names the cluster-scoped IPPool static addresses come from;
	// mode static only, where it or ipPoolRefs is required.
	// +optional
	IPPoolRef *ObjectName `json:"ipPoolRef,omitempty"`

	// ipPoolRefs names the IPPools of a dual-stack VM, one IPv4 and one
	// IPv6 pool (docs/networking.md, "Dual stack"): each VM gets an address
	// from each, configured on its one NIC. Mode static only; exclusive
	// with ipPoolRef. Two pools of one family are refused when the template
	// is validated (IPPoolFamilyConflict): the API server cannot read the
	// pools.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:XValidation:rule="self.size() < 2 || self[0].name != self[1].name",message="network.ipPoolRefs names one IPPool twice; name one IPv4 and one IPv6 IPPool"
	// +listType=atomic
	IPPoolRefs []ObjectName `json:"ipPoolRefs,omitempty"`

	// dns overrides the cluster's DNS settings for these VMs, field by field.
	// +optional
	DNS *DNSSettings `json:"dns,omitempty"`

	// hostname says how a VM's hostname is formed: name (default) is the
	// MachineClaim's name, namespace-name prefixes it with the claim's
	// namespace. Either is made a valid DNS label of at most 63 characters
	// (lower-cased; too long a name keeps its start and gets a hash suffix).
	// The FQDN appends the DNS domain.
	// +optional
	// +kubebuilder:default=name
	Hostname HostnameStrategy `json:"hostname,omitempty"`

	// proxy is the HTTP proxy the VMs reach the outside through: the
	// agent uses it for the runner download and its other HTTP calls, the
	// runner and its jobs get http_proxy, https_proxy and no_proxy, apt
	// gets Acquire::http(s)::Proxy and login shells the variables
	// (/etc/profile.d). The operator's own endpoints, loopback and
	// link-local addresses stay direct (docs/templates.md, "Proxy").
	// +optional
	Proxy *ProxySettings `json:"proxy,omitempty"`

	// isolationPolicy names the network isolation policy of the cluster
	// (its spec.network.isolation.policies, or default) the VMs are held
	// to; the cluster's spec.tenancy must allow it to the template's
	// namespace (isolationPolicies). Unset: the cluster's defaultPolicy. A
	// VM keeps the policy it was placed with: a later edit of this field
	// or of the policy reaches only VMs placed after it. Allowed only on a
	// cluster with spec.network.isolation.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	IsolationPolicy string `json:"isolationPolicy,omitempty"`
}

// ProxySettings is a template's HTTP proxy (spec.network.proxy).
// +kubebuilder:validation:XValidation:rule="has(self.httpProxy) || has(self.httpsProxy)",message="network.proxy names no proxy: set httpProxy, httpsProxy or both, such as httpsProxy: http://proxy.example.com:3128"
type ProxySettings struct {
	// httpProxy is the proxy of http:// URLs, http://host:port or
	// https://host:port. No credentials: they would rest in the VM's
	// seed; let the proxy admit the VMs' network instead.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=270
	// +kubebuilder:validation:XValidation:rule="!self.contains('@')",message="network.proxy.httpProxy holds credentials (user:password@); they would rest in the VM's seed: remove them and let the proxy admit the VMs' network"
	// +kubebuilder:validation:XValidation:rule="self.matches('^https?://[][A-Za-z0-9.:-]+/?$')",message="network.proxy.httpProxy must be http://host:port or https://host:port, such as http://proxy.example.com:3128, without a path"
	HTTPProxy string `json:"httpProxy,omitempty"`

	// httpsProxy is the proxy of https:// URLs (through CONNECT), as
	// httpProxy; usually the same URL.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=270
	// +kubebuilder:validation:XValidation:rule="!self.contains('@')",message="network.proxy.httpsProxy holds credentials (user:password@); they would rest in the VM's seed: remove them and let the proxy admit the VMs' network"
	// +kubebuilder:validation:XValidation:rule="self.matches('^https?://[][A-Za-z0-9.:-]+/?$')",message="network.proxy.httpsProxy must be http://host:port or https://host:port, such as http://proxy.example.com:3128, without a path"
	HTTPSProxy string `json:"httpsProxy,omitempty"`

	// noProxy are the hosts the VMs reach directly: a host name (its
	// subdomains too; a leading dot is allowed), an IP address or a CIDR
	// network, each optionally with :port, or * for every host. The
	// operator adds its own endpoints, loopback, link-local and a static
	// VM's subnets.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.all(e, e == '*' || e.matches('^[.]?[A-Za-z0-9[][][A-Za-z0-9.:/-]*$'))",message="each network.proxy.noProxy entry must be a host name, IP address or CIDR network (optionally :port), or *, such as .example.com, 10.0.0.0/8 or git.example.com:443"
	// +listType=atomic
	NoProxy []string `json:"noProxy,omitempty"`
}

// IPPoolNames are the IPPools a static network takes its addresses from:
// ipPoolRefs, else ipPoolRef; none in the other modes.
func (n *MachineNetwork) IPPoolNames() []string {
	if n.Mode != NetworkModeStatic {
		return nil
	}
	if len(n.IPPoolRefs) > 0 {
		names := make([]string, 0, len(n.IPPoolRefs))
		for _, r := range n.IPPoolRefs {
			names = append(names, r.Name)
		}
		return names
	}
	if n.IPPoolRef != nil {
		return []string{n.IPPoolRef.Name}
	}
	return nil
}

// HostnameStrategy says how a VM's hostname is derived from its claim.
// +kubebuilder:validation:Enum=name;namespace-name
type HostnameStrategy string

const (
	// HostnameFromName uses the MachineClaim's name.
	HostnameFromName HostnameStrategy = "name"
	// HostnameFromNamespaceAndName uses <namespace>-<name>.
	HostnameFromNamespaceAndName HostnameStrategy = "namespace-name"
)

// DHCPClientIdentifier says what a VM identifies itself with to the DHCP server.
// +kubebuilder:validation:Enum=mac;hostname
type DHCPClientIdentifier string

const (
	// DHCPClientIdentifierMAC leaves the identifier to the image's DHCP
	// client, asking for the NIC's MAC address where cloud-init can.
	DHCPClientIdentifierMAC DHCPClientIdentifier = "mac"
	// DHCPClientIdentifierHostname sends the VM's host name as option 61.
	DHCPClientIdentifierHostname DHCPClientIdentifier = "hostname"
)

// DHCPClient is the DHCP client of a template's image.
// +kubebuilder:validation:Enum=isc-dhcp-client;systemd-networkd
type DHCPClient string

const (
	// DHCPClientISC is isc-dhcp-client (dhclient), which ifupdown runs:
	// Debian 12's cloud images and docs/templates.md's recipe.
	DHCPClientISC DHCPClient = "isc-dhcp-client"
	// DHCPClientNetworkd is systemd-networkd, directly or under netplan:
	// Ubuntu's cloud images.
	DHCPClientNetworkd DHCPClient = "systemd-networkd"
)

// DHCPOptions tune how a VM asks for its address.
// +kubebuilder:validation:XValidation:rule="!has(self.clientIdentifier) || self.clientIdentifier != 'hostname' || !has(self.sendHostname) || self.sendHostname",message="network.dhcp.clientIdentifier hostname identifies the VM by its host name; it needs sendHostname true (the default)"
// +kubebuilder:validation:XValidation:rule="!has(self.requestStaticLease) || !self.requestStaticLease || !has(self.sendHostname) || self.sendHostname",message="network.dhcp.requestStaticLease asks for the address reserved for the VM's host name, which the VM must send: set sendHostname true (the default) or remove requestStaticLease"
// +kubebuilder:validation:XValidation:rule="!has(self.requestStaticLease) || !self.requestStaticLease || (has(self.clientIdentifier) && self.clientIdentifier == 'hostname')",message="network.dhcp.requestStaticLease needs clientIdentifier hostname, so that servers reserving by client identifier (ISC dhcpd, Kea) recognise the VM by its host name: set clientIdentifier: hostname"
// +kubebuilder:validation:XValidation:rule="!((has(self.requestStaticLease) && self.requestStaticLease) || has(self.leaseTime)) || has(self.client)",message="network.dhcp.requestStaticLease and network.dhcp.leaseTime are carried out by the image's DHCP client: set network.dhcp.client to it (isc-dhcp-client for ifupdown images such as Debian 12's)"
type DHCPOptions struct {
	// clientIdentifier is what the VM's DHCP client identifies itself
	// with (option 61). mac (the default) leaves it to the image's DHCP
	// client: the operator asks for the NIC's MAC address, which cloud-init
	// honours where it renders for netplan. hostname sends the VM's host
	// name: cloud-init's network config cannot say so, so the seed's
	// bootcmd configures isc-dhcp-client (ifupdown images such as Debian
	// 12's) and renews the lease with it before anything else runs; it
	// needs sendHostname true (docs/cloud-init.md).
	// +optional
	// +kubebuilder:default=mac
	ClientIdentifier DHCPClientIdentifier `json:"clientIdentifier,omitempty"`

	// sendHostname sends the VM's hostname with the request, so DHCP-driven
	// DNS can register it.
	// +optional
	// +kubebuilder:default=true
	SendHostname *bool `json:"sendHostname,omitempty"`

	// ipv6 also asks for an IPv6 address (DHCPv6 / SLAAC).
	// +optional
	IPv6 bool `json:"ipv6,omitempty"`

	// requestStaticLease makes the VM ask for the address the site's DHCP
	// server reserves for its host name, so that a VM of the same name gets
	// the same address every time. The VM sends its host name as option 12
	// (what dnsmasq's dhcp-host=<name>,<address> matches) and as its client
	// identifier, option 61 (what ISC dhcpd's and Kea's reservations by
	// client identifier match); the operator does not write the
	// reservation, the platform team's DHCP server holds it. Needs
	// clientIdentifier hostname, sendHostname true and client
	// isc-dhcp-client; other clients are refused when the template is
	// validated (reason DHCPClientUnsupported). docs/networking.md.
	// +optional
	RequestStaticLease bool `json:"requestStaticLease,omitempty"`

	// leaseTime is the lease time the VM's DHCP client asks for (option
	// 51), such as 30m, from 2m to 168h; fractions of a second are
	// dropped. A server grants at most its own maximum (dnsmasq: its
	// range's lease time). DHCPv4 only; unset leaves it to the server.
	// Needs client isc-dhcp-client, like requestStaticLease.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('2m') && duration(self) <= duration('168h')",message="network.dhcp.leaseTime must be between 2m and 168h"
	LeaseTime *metav1.Duration `json:"leaseTime,omitempty"`

	// client is the DHCP client of the template's image, which the
	// operator configures for requestStaticLease, leaseTime and
	// clientIdentifier hostname: isc-dhcp-client (ifupdown images such as
	// Debian 12's) or systemd-networkd (netplan and networkd images such as
	// Ubuntu's). Required with requestStaticLease or leaseTime. Only
	// isc-dhcp-client can do them: with systemd-networkd the template is
	// not Ready (reason DHCPClientUnsupported), before any VM boots.
	// +optional
	Client DHCPClient `json:"client,omitempty"`
}

// AttestationMethod is how a VM proves its identity.
// +kubebuilder:validation:Enum=none;join-token;tpm
type AttestationMethod string

const (
	// AttestationNone: no workload identity; the runner credential itself is
	// delivered in the VM's cloud-init.
	AttestationNone AttestationMethod = "none"
	// AttestationJoinToken: a single-use SPIRE join token attests the VM's
	// agent, which then fetches the runner credential over mTLS.
	AttestationJoinToken AttestationMethod = "join-token"
	// AttestationTPM: the VM's TPM attests its SPIRE agent.
	AttestationTPM AttestationMethod = "tpm"
)

// Attestation is how a VM proves its identity.
// +kubebuilder:validation:XValidation:rule="self.method == 'join-token' || !has(self.joinToken)",message="attestation.joinToken applies only to attestation.method join-token"
// +kubebuilder:validation:XValidation:rule="self.method == 'tpm' || !has(self.tpm)",message="attestation.tpm applies only to attestation.method tpm"
type Attestation struct {
	// method is none (default): no workload identity, the runner's
	// single-use credential is in the VM's cloud-init. join-token: the VM
	// gets a SPIFFE identity from the SPIRE server of its cluster's
	// spec.spire with a single-use join token, and only then fetches its
	// runner credential from the operator's credential broker; nothing in
	// its cloud-init can run a job (docs/identity.md). tpm: the same, but
	// the VM attests with its TPM 2.0 (SPIRE's tpm_devid node attestor,
	// with a DevID certificate the operator signs once the TPM proved its
	// keys by credential activation); needs the cluster's spec.spire.tpm
	// (else not Ready, TPMNotConfigured) and a TPM in the VM
	// (attestation.tpm.addVirtualTPM, or the template's own).
	// +optional
	// +kubebuilder:default=none
	Method AttestationMethod `json:"method,omitempty"`

	// joinToken tunes SPIRE join tokens; method join-token only.
	// +optional
	JoinToken *JoinTokenAttestation `json:"joinToken,omitempty"`

	// tpm tunes TPM attestation; method tpm only.
	// +optional
	TPM *TPMAttestation `json:"tpm,omitempty"`
}

// JoinTokenAttestation tunes SPIRE join tokens.
type JoinTokenAttestation struct {
	// ttl is how long a join token stays valid, counted from when the
	// operator creates it, before the VM is cloned; keep it just above the
	// time a VM needs to be cloned and to boot. Between 1m and 24h, and
	// within the cluster's spec.spire.joinTokenTTL bounds (1m to 1h unless
	// the platform team set others).
	// +optional
	// +kubebuilder:default="15m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m') && duration(self) <= duration('24h')",message="attestation.joinToken.ttl must be between 1m and 24h"
	TTL *metav1.Duration `json:"ttl,omitempty"`
}

// DefaultTPMDevicePath is the TPM device inside a VM when
// spec.attestation.tpm.devicePath is not given: the kernel's resource
// manager, which spire-agent and the HyperFleet agent share.
const DefaultTPMDevicePath = "/dev/tpmrm0"

// TPMAttestation tunes TPM attestation.
type TPMAttestation struct {
	// devicePath is the TPM device inside the VM.
	// +optional
	// +kubebuilder:default="/dev/tpmrm0"
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^/dev/[a-z0-9]+$`
	DevicePath string `json:"devicePath,omitempty"`

	// addVirtualTPM attaches a new virtual TPM 2.0 (Proxmox tpmstate0, on
	// the VM's boot disk storage) to each VM before its first start, so
	// that every VM has an endorsement key of its own; a tpmstate0 the
	// template has is replaced. When false the template must have a
	// tpmstate0 of version v2.0 and must never have been started since it
	// got it (a started one's state, endorsement key included, is copied
	// into every clone; docs/templates.md, "TPM").
	// +optional
	AddVirtualTPM bool `json:"addVirtualTPM,omitempty"`

	// ekCABundleRef selects a Secret key, in this namespace, with the PEM CA
	// certificates that sign the TPMs' endorsement keys. It narrows the
	// cluster's spec.spire.tpm.ekCABundleRef, never widens it: a VM's EK
	// certificate must chain to both.
	// +optional
	EKCABundleRef *LocalSecretKeySelector `json:"ekCABundleRef,omitempty"`
}

// BootstrapMethod is the kind of single-use credential a runner receives.
// +kubebuilder:validation:Enum=jit-config;runner-token
type BootstrapMethod string

const (
	// BootstrapJITConfig hands the runner a GitHub just-in-time runner
	// configuration: pre-registered, single-job, nothing else to exchange.
	BootstrapJITConfig BootstrapMethod = "jit-config"
	// BootstrapRunnerToken hands the runner a one-hour registration token
	// that it uses to register itself as an ephemeral runner.
	BootstrapRunnerToken BootstrapMethod = "runner-token"
)

// AgentSource says where a VM's HyperFleet agent binary comes from.
// +kubebuilder:validation:Enum=Image;Operator
type AgentSource string

const (
	// AgentSourceImage: the hypervisor template has the agent at
	// /usr/local/bin/hyperfleet-agent.
	AgentSourceImage AgentSource = "Image"
	// AgentSourceOperator: cloud-init downloads the agent from the
	// operator's agent server at first boot and installs it only if its
	// SHA-256 matches the one the operator computed.
	AgentSourceOperator AgentSource = "Operator"
)

// Bootstrap is the CI platform a template's VMs serve and how the VM's
// runner gets its credential: exactly one platform section.
// +kubebuilder:validation:XValidation:rule="[has(self.github), has(self.gitlab), has(self.buildkite), has(self.generic)].filter(x, x).size() == 1",message="spec.bootstrap needs exactly one CI platform section: bootstrap.github (GitHub Actions), bootstrap.gitlab (GitLab CI), bootstrap.buildkite (Buildkite) or bootstrap.generic (your own script, no CI platform)"
// +kubebuilder:validation:XValidation:rule="!has(self.gitlab) || !has(self.method) || self.method == 'jit-config'",message="bootstrap.method runner-token applies to GitHub only: a GitLab runner always gets a runner authentication token the operator creates; remove bootstrap.method"
// +kubebuilder:validation:XValidation:rule="!has(self.buildkite) || !has(self.method) || self.method == 'jit-config'",message="bootstrap.method runner-token applies to GitHub only: a Buildkite agent always gets a cluster agent token the operator creates for it; remove bootstrap.method"
type Bootstrap struct {
	// method is jit-config (default) or runner-token: the kind of GitHub
	// runner credential. GitLab runners always get a runner
	// authentication token the operator creates for them
	// (spec.bootstrap.gitlab); a generic template has no runner
	// credential and ignores it.
	// +optional
	// +kubebuilder:default=jit-config
	Method BootstrapMethod `json:"method,omitempty"`

	// agentSource is where the VM gets the HyperFleet agent
	// (/usr/local/bin/hyperfleet-agent), which runs the CI runner. Image
	// (default): the hypervisor template has it. Operator: cloud-init
	// downloads it at first boot from the operator's agent server (manager
	// flag --agent-server-addr), built for runner.os and runner.arch, and
	// installs it only if its SHA-256 matches; a VM whose download fails
	// powers off and is replaced. The template is not Ready (reason
	// AgentUnavailable) while the operator serves no such binary.
	// +optional
	// +kubebuilder:default=Image
	AgentSource AgentSource `json:"agentSource,omitempty"`

	// github is the GitHub Actions configuration: where runners register
	// and the operator's credentials for it. A template has exactly one CI
	// platform section (docs/architecture.md, "CI platforms as plug-ins").
	// +optional
	GitHub *GitHubBootstrap `json:"github,omitempty"`

	// buildkite is the Buildkite configuration: the organization and cluster
	// agents join and the operator's API token (docs/buildkite.md).
	// +optional
	Buildkite *BuildkiteBootstrap `json:"buildkite,omitempty"`

	// generic is a VM with no CI platform: HyperFleet's lifecycle and
	// identity around a script of yours, which the VM runs once; its exit
	// (or the ttl) ends the VM (docs/generic.md).
	// +optional
	Generic *GenericBootstrap `json:"generic,omitempty"`

	// gitlab is the GitLab CI configuration: the GitLab instance, where
	// runners are created (a project, a group or the whole instance) and the
	// operator's access token for it (docs/gitlab.md).
	// +optional
	GitLab *GitLabBootstrap `json:"gitlab,omitempty"`

	// httpTimeout bounds each call the operator makes to the CI platform. Between 1s and 5m.
	// +optional
	// +kubebuilder:default="30s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('5m')",message="bootstrap.httpTimeout must be between 1s and 5m"
	HTTPTimeout *metav1.Duration `json:"httpTimeout,omitempty"`
}

// GenericBootstrap is what a generic VM runs: no CI platform and no
// runner credential, but HyperFleet's lifecycle (one VM per claim,
// destroyed afterwards) and, with spec.attestation, its SPIFFE identity.
type GenericBootstrap struct {
	// script is run once by /bin/sh, as the agent's runner user, in
	// workDir, with HYPERFLEET_CLAIM (namespace/name), HYPERFLEET_CLAIM_UID,
	// HYPERFLEET_DEADLINE (when the ttl ends, RFC 3339) and, when the
	// template attests, SPIFFE_ENDPOINT_SOCKET (the Workload API of the
	// VM's spire-agent) in its environment. Its exit, whatever its status,
	// powers the VM off. The script is not a secret: it is in every VM's
	// cloud-init seed and in this object, which anyone who reads templates
	// in the namespace reads. A script that needs a secret fetches it with
	// the VM's SPIFFE identity (spec.attestation; the cluster's
	// spec.spire.secretStore), never from here. At most 64 KiB.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=65536
	Script string `json:"script"`

	// ttl is how long a VM may live, from its claim's creation: the
	// operator ends the claim then (reason max_lifetime), and the VM's
	// agent stops the script and powers off at the same moment as a
	// second line. Between 1m and 168h; default 1h. A pool's
	// spec.lifecycle.maxLifetime also applies: the sooner ends the VM.
	// +optional
	// +kubebuilder:default="1h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m') && duration(self) <= duration('168h')",message="bootstrap.generic.ttl must be between 1m and 168h"
	TTL *metav1.Duration `json:"ttl,omitempty"`

	// workDir is the script's working directory, emptied after it ran.
	// It may not be, contain or lie inside a system directory.
	// +optional
	// +kubebuilder:default="/var/lib/hyperfleet/work"
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^/[^\x00]*$`
	// +kubebuilder:validation:XValidation:rule="self == '/' || (!self.contains('//') && !self.endsWith('/') && !self.contains('/./') && !self.contains('/../') && !self.endsWith('/.') && !self.endsWith('/..'))",message="bootstrap.generic.workDir must be written plainly, without //, /./, /../ or a trailing /"
	// +kubebuilder:validation:XValidation:rule="self != '/' && (self.startsWith('/usr/local/') ? !['bin', 'etc', 'games', 'include', 'lib', 'lib64', 'libexec', 'man', 'sbin', 'share', 'src'].exists(d, self == '/usr/local/' + d || self.startsWith('/usr/local/' + d + '/')) : (!['/bin', '/boot', '/dev', '/etc', '/lib', '/lib32', '/lib64', '/libx32', '/proc', '/root', '/run', '/sbin', '/sys', '/usr'].exists(d, self == d || self.startsWith(d + '/') || d.startsWith(self + '/')) && !['/home', '/media', '/mnt', '/opt', '/srv', '/tmp', '/var', '/var/cache', '/var/lib', '/var/lib/cloud', '/var/log', '/var/tmp'].exists(d, self == d || d.startsWith(self + '/'))))",message="bootstrap.generic.workDir must not be, contain or (for /bin, /boot, /dev, /etc, /lib*, /proc, /root, /run, /sbin, /sys, /usr) lie inside a system directory: the agent empties it as root after the script; use a directory of its own such as /var/lib/hyperfleet/work (docs/security.md)"
	WorkDir string `json:"workDir,omitempty"`

	// arch is the VM's architecture in GitHub's naming (x64, arm64, arm):
	// which agent binary the operator serves with agentSource Operator.
	// +optional
	// +kubebuilder:default=x64
	Arch RunnerArch `json:"arch,omitempty"`
}

// DefaultGenericTTL is spec.bootstrap.generic.ttl's default.
const DefaultGenericTTL = time.Hour

// GitHubBootstrap is where runners register and with which credentials the
// operator asks GitHub for their single-use credentials.
// +kubebuilder:validation:XValidation:rule="[has(self.repository), has(self.organization), has(self.enterprise)].filter(x, x).size() == 1",message="set exactly one of bootstrap.github.repository (repository runners), bootstrap.github.organization (organization runners) and bootstrap.github.enterprise (enterprise runners)"
// +kubebuilder:validation:XValidation:rule="!has(self.runnerGroup) || has(self.organization) || has(self.enterprise)",message="bootstrap.github.runnerGroup applies only to organization and enterprise runners (GitHub has no runner groups for a repository): remove it or use bootstrap.github.organization"
// +kubebuilder:validation:XValidation:rule="has(self.owner) || has(self.enterprise)",message="bootstrap.github.owner is required for repository and organization runners: set it to the repository's owner or the organization"
// +kubebuilder:validation:XValidation:rule="!has(self.enterprise) || has(self.credentials.pat)",message="bootstrap.github.enterprise needs bootstrap.github.credentials.pat, a personal access token (classic) with the manage_runners:enterprise scope: GitHub Apps cannot manage enterprise runners; replace credentials.app with credentials.pat"
// +kubebuilder:validation:XValidation:rule="!has(self.enterprise) || (!has(self.registrationURLs) && !has(self.runnerURLs))",message="bootstrap.github.registrationURLs and runnerURLs have no enterprise form: remove them when bootstrap.github.enterprise is set (enterprise runners register with just-in-time configurations or apiBaseURL's enterprise endpoints)"
type GitHubBootstrap struct {
	// credentials are the operator's GitHub credentials, as Secret keys in
	// this namespace. They never reach a VM.
	// +required
	Credentials GitHubCredentials `json:"credentials"`

	// owner is the user or organization that owns the repository or is the
	// organization. Required for repository and organization runners;
	// unused for enterprise runners.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=39
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?$`
	Owner string `json:"owner,omitempty"`

	// repository is the repository name under owner, for repository runners.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=100
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.-]+$`
	Repository string `json:"repository,omitempty"`

	// organization is the organization, for organization runners.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=39
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?$`
	Organization string `json:"organization,omitempty"`

	// enterprise is the enterprise's slug, for enterprise runners: runners
	// register in the enterprise's runner group (runnerGroup, else Default)
	// and take jobs of the organizations that group allows. Each RunnerPool
	// of the template names one of those organizations (or a repository of
	// one) in spec.workload.github. Needs credentials.pat: a personal access
	// token (classic) with the manage_runners:enterprise scope, and repo
	// access to the organizations' repositories for reading their jobs.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=60
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?$`
	Enterprise string `json:"enterprise,omitempty"`

	// apiBaseURL is the GitHub REST API; for GitHub Enterprise Server use
	// https://<host>/api/v3.
	// +optional
	// +kubebuilder:default="https://api.github.com"
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() == 'https'",message="bootstrap.github.apiBaseURL must be an https:// URL, such as https://github.example.com/api/v3"
	APIBaseURL string `json:"apiBaseURL,omitempty"`

	// registrationURLs are the API URLs that issue registration tokens
	// (runner-token method), with {owner} and {repo} placeholders. The
	// defaults follow apiBaseURL.
	// +optional
	RegistrationURLs *ScopedURLs `json:"registrationURLs,omitempty"`

	// runnerURLs are the URLs a runner registers to (runner-token method),
	// with {owner} and {repo} placeholders. Defaults: https://github.com/{owner}/{repo}
	// and https://github.com/{owner}.
	// +optional
	RunnerURLs *ScopedURLs `json:"runnerURLs,omitempty"`

	// runnerGroup is the organization or enterprise runner group runners
	// join (default: Default); organization and enterprise runners only.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=100
	RunnerGroup string `json:"runnerGroup,omitempty"`

	// runner says where the runner software comes from and where it lives
	// inside the VM.
	// +optional
	Runner *RunnerSoftware `json:"runner,omitempty"`
}

// GitHubCredentials are either a GitHub App installation or a personal
// access token.
// +kubebuilder:validation:XValidation:rule="has(self.app) != has(self.pat)",message="set exactly one of bootstrap.github.credentials.app (GitHub App, recommended) and bootstrap.github.credentials.pat (personal access token)"
type GitHubCredentials struct {
	// app is a GitHub App installation: short-lived installation tokens,
	// fine-grained permissions. Recommended.
	// +optional
	App *GitHubAppCredentials `json:"app,omitempty"`

	// pat selects a personal access token.
	// +optional
	PAT *LocalSecretKeySelector `json:"pat,omitempty"`
}

// GitHubAppCredentials select a GitHub App's id, private key and
// installation id, each a Secret key in this namespace.
// +kubebuilder:validation:XValidation:rule="has(self.appID) || has(self.appId)",message="bootstrap.github.credentials.app needs appID: the Secret key holding the App's numeric id"
// +kubebuilder:validation:XValidation:rule="has(self.installationID) || has(self.installationId)",message="bootstrap.github.credentials.app needs installationID: the Secret key holding the installation's numeric id"
// +kubebuilder:validation:XValidation:rule="!has(self.appId)",message="spec.bootstrap.github.credentials.app.appId is now appID: rename the field"
// +kubebuilder:validation:XValidation:rule="!has(self.installationId)",message="spec.bootstrap.github.credentials.app.installationId is now installationID: rename the field"
type GitHubAppCredentials struct {
	// appID selects the App's numeric id. Required (the schema accepts the
	// earlier spelling appId in its place on stored templates only).
	// +optional
	AppID LocalSecretKeySelector `json:"appID,omitzero"`

	// appId is the earlier spelling of appID, refused on new writes; a
	// template stored with it keeps working and is told to rename it in a
	// DeprecatedField event.
	//
	// Deprecated: set appID. Only the schema and that event read this
	// field: decoding folds it into AppID (api/v1alpha1/spelling.go).
	// +optional
	DeprecatedAppID *LocalSecretKeySelector `json:"appId,omitempty"`

	// privateKey selects the App's PEM private key.
	// +required
	PrivateKey LocalSecretKeySelector `json:"privateKey"`

	// installationID selects the numeric id of the App's installation on
	// the owner. Required (the schema accepts the earlier spelling
	// installationId in its place on stored templates only).
	// +optional
	InstallationID LocalSecretKeySelector `json:"installationID,omitzero"`

	// installationId is the earlier spelling of installationID, refused on
	// new writes; a template stored with it keeps working and is told to
	// rename it in a DeprecatedField event.
	//
	// Deprecated: set installationID. Only the schema and that event read
	// this field: decoding folds it into InstallationID
	// (api/v1alpha1/spelling.go).
	// +optional
	DeprecatedInstallationID *LocalSecretKeySelector `json:"installationId,omitempty"`
}

// ScopedURLs are URL templates for repository and organization scope.
type ScopedURLs struct {
	// repository is the URL for repository scope, with {owner} and {repo}.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.startsWith('https://') && self.contains('{owner}') && self.contains('{repo}')",message="a repository URL template must start with https:// and contain {owner} and {repo}"
	Repository string `json:"repository,omitempty"`

	// organization is the URL for organization scope, with {owner}.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.startsWith('https://') && self.contains('{owner}')",message="an organization URL template must start with https:// and contain {owner}"
	Organization string `json:"organization,omitempty"`
}

// RunnerOS is the runner package's operating system, in GitHub's naming.
// +kubebuilder:validation:Enum=linux;win;osx
type RunnerOS string

// RunnerArch is the runner package's architecture, in GitHub's naming.
// +kubebuilder:validation:Enum=x64;arm64;arm
type RunnerArch string

// RunnerSoftware is the CI runner package and its place in the VM.
// +kubebuilder:validation:XValidation:rule="!(has(self.version) && has(self.downloadURL))",message="runner: set version (resolved from the platform's releases) or downloadURL with downloadSHA256 (pinned), not both"
// +kubebuilder:validation:XValidation:rule="!has(self.downloadURL) || has(self.downloadSHA256)",message="runner.downloadURL needs runner.downloadSHA256: give the package's SHA-256 (64 hex digits) so that the agent can check the download, or remove downloadURL and install the runner in the template"
// +kubebuilder:validation:XValidation:rule="has(self.downloadURL) || !has(self.downloadSHA256)",message="runner.downloadSHA256 applies only with runner.downloadURL: remove it, or set downloadURL"
type RunnerSoftware struct {
	// version is the runner release VMs get: "latest", or a release such as
	// 2.329.0. The operator resolves it from the CI platform's releases
	// (actions/runner under the template's GitHub API, so a GitHub
	// Enterprise Server that mirrors the repository works too), takes the
	// package's SHA-256 from the release, reports both in
	// status.runner and renders them into every VM; "latest" is looked up
	// again hourly, and a new release replaces idle VMs like any template
	// change. Unset, with no downloadURL, means the runner is already
	// installed in the template.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^(latest|[0-9]+\.[0-9]+\.[0-9]+)$`
	Version string `json:"version,omitempty"`

	// downloadURL is the runner package; {os} and {arch} are replaced by os
	// and arch. Unset means the runner is already installed in the template
	// (or comes from version).
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self.replace('{os}', 'linux').replace('{arch}', 'x64')) && self.startsWith('https://')",message="runner.downloadURL must be an https:// URL; {os} and {arch} may appear in it"
	DownloadURL string `json:"downloadURL,omitempty"`

	// downloadSHA256 is the package's SHA-256 checksum (64 hex digits);
	// required with downloadURL. The agent refuses a download that does not
	// match.
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-f0-9]{64}$`
	DownloadSHA256 string `json:"downloadSHA256,omitempty"`

	// installPath is where the runner is unpacked. It may not be, contain
	// or lie inside a system directory (docs/security.md). On a Windows
	// guest (spec.guest.os windows) it names a directory of the system
	// drive, /actions-runner being C:\actions-runner, and Windows' system
	// directories are refused when the template is rendered (docs/windows.md).
	// +optional
	// +kubebuilder:default="/opt/actions-runner"
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^/[^\x00]*$`
	// +kubebuilder:validation:XValidation:rule="self == '/' || (!self.contains('//') && !self.endsWith('/') && !self.contains('/./') && !self.contains('/../') && !self.endsWith('/.') && !self.endsWith('/..'))",message="bootstrap.github.runner.installPath must be written plainly, without //, /./, /../ or a trailing /"
	// +kubebuilder:validation:XValidation:rule="self != '/' && (self.startsWith('/usr/local/') ? !['bin', 'etc', 'games', 'include', 'lib', 'lib64', 'libexec', 'man', 'sbin', 'share', 'src'].exists(d, self == '/usr/local/' + d || self.startsWith('/usr/local/' + d + '/')) : (!['/bin', '/boot', '/dev', '/etc', '/lib', '/lib32', '/lib64', '/libx32', '/proc', '/root', '/run', '/sbin', '/sys', '/usr'].exists(d, self == d || self.startsWith(d + '/') || d.startsWith(self + '/')) && !['/home', '/media', '/mnt', '/opt', '/srv', '/tmp', '/var', '/var/cache', '/var/lib', '/var/lib/cloud', '/var/log', '/var/tmp'].exists(d, self == d || d.startsWith(self + '/'))))",message="bootstrap.github.runner.installPath must not be, contain or (for /bin, /boot, /dev, /etc, /lib*, /proc, /root, /run, /sbin, /sys, /usr) lie inside a system directory: the agent empties it as root after each job; use a directory of its own such as /opt/actions-runner or /var/lib/hyperfleet/work (docs/security.md)"
	InstallPath string `json:"installPath,omitempty"`

	// workDir is the runner's job working directory, wiped after the job.
	// It may not be, contain or lie inside a system directory. On a
	// Windows guest it is on the system drive, as installPath.
	// +optional
	// +kubebuilder:default="/var/lib/hyperfleet/work"
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^/[^\x00]*$`
	// +kubebuilder:validation:XValidation:rule="self == '/' || (!self.contains('//') && !self.endsWith('/') && !self.contains('/./') && !self.contains('/../') && !self.endsWith('/.') && !self.endsWith('/..'))",message="bootstrap.github.runner.workDir must be written plainly, without //, /./, /../ or a trailing /"
	// +kubebuilder:validation:XValidation:rule="self != '/' && (self.startsWith('/usr/local/') ? !['bin', 'etc', 'games', 'include', 'lib', 'lib64', 'libexec', 'man', 'sbin', 'share', 'src'].exists(d, self == '/usr/local/' + d || self.startsWith('/usr/local/' + d + '/')) : (!['/bin', '/boot', '/dev', '/etc', '/lib', '/lib32', '/lib64', '/libx32', '/proc', '/root', '/run', '/sbin', '/sys', '/usr'].exists(d, self == d || self.startsWith(d + '/') || d.startsWith(self + '/')) && !['/home', '/media', '/mnt', '/opt', '/srv', '/tmp', '/var', '/var/cache', '/var/lib', '/var/lib/cloud', '/var/log', '/var/tmp'].exists(d, self == d || d.startsWith(self + '/'))))",message="bootstrap.github.runner.workDir must not be, contain or (for /bin, /boot, /dev, /etc, /lib*, /proc, /root, /run, /sbin, /sys, /usr) lie inside a system directory: the agent empties it as root after each job; use a directory of its own such as /opt/actions-runner or /var/lib/hyperfleet/work (docs/security.md)"
	WorkDir string `json:"workDir,omitempty"`

	// configScript is the runner's registration script. On a Windows guest
	// a name ending .sh means the same name ending .cmd (the Windows
	// package's config.cmd).
	// +optional
	// +kubebuilder:default="config.sh"
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.-]+$`
	ConfigScript string `json:"configScript,omitempty"`

	// runScript is the runner's run script; on a Windows guest .sh means
	// .cmd, as for configScript (run.cmd).
	// +optional
	// +kubebuilder:default="run.sh"
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.-]+$`
	RunScript string `json:"runScript,omitempty"`

	// os is the VM's operating system in GitHub's naming: linux, or win
	// with spec.guest.os windows (and only then; docs/windows.md). osx
	// makes the template not Ready, with reason Unsupported.
	// +optional
	// +kubebuilder:default=linux
	OS RunnerOS `json:"os,omitempty"`

	// arch is the VM's architecture in GitHub's naming.
	// +optional
	// +kubebuilder:default=x64
	Arch RunnerArch `json:"arch,omitempty"`
}

// GitLabAccessLevel is which pipelines a GitLab runner takes jobs from.
// +kubebuilder:validation:Enum=not_protected;ref_protected
type GitLabAccessLevel string

const (
	// GitLabNotProtected: jobs of any branch or tag.
	GitLabNotProtected GitLabAccessLevel = "not_protected"
	// GitLabRefProtected: jobs of protected branches and tags only.
	GitLabRefProtected GitLabAccessLevel = "ref_protected"
)

// GitLabBootstrap is the GitLab instance a template's runners take jobs
// from, where the operator creates them and with which access token. The
// operator creates one runner per VM (POST /user/runners), hands its
// runner authentication token to the VM's gitlab-runner for one job and
// deletes the runner when the VM goes.
// +kubebuilder:validation:XValidation:rule="[has(self.project), has(self.group), has(self.instance) && self.instance].filter(x, x).size() == 1",message="set exactly one of bootstrap.gitlab.project (project runners), bootstrap.gitlab.group (group runners) and bootstrap.gitlab.instance: true (instance runners, administrator token)"
type GitLabBootstrap struct {
	// url is the GitLab instance: https://gitlab.com (default) or a
	// self-managed one, such as https://gitlab.example.com. The REST API
	// is its /api/v4.
	// +optional
	// +kubebuilder:default="https://gitlab.com"
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() == 'https' && !self.endsWith('/')",message="bootstrap.gitlab.url must be an https:// URL without a trailing /, such as https://gitlab.example.com"
	URL string `json:"url,omitempty"`

	// credentials are the operator's GitLab access token, as a Secret key in
	// this namespace. It never reaches a VM.
	// +required
	Credentials GitLabCredentials `json:"credentials"`

	// project is the full path of the project, such as acme/platform/app,
	// for project runners (the token needs Maintainer there).
	// +optional
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)+$`
	Project string `json:"project,omitempty"`

	// group is the full path of the group, such as acme or acme/platform,
	// for group runners serving its projects and subgroups (the token needs
	// Owner there).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$`
	Group string `json:"group,omitempty"`

	// instance: true makes instance runners, serving every project of the
	// instance (the token's user must be an administrator).
	// +optional
	Instance bool `json:"instance,omitempty"`

	// runner says where the gitlab-runner binary comes from and where jobs
	// run inside the VM.
	// +optional
	Runner *GitLabRunnerSoftware `json:"runner,omitempty"`

	// runUntagged lets runners take jobs without tags, in addition to the
	// jobs whose tags are all among theirs. Default false. A RunnerPool may
	// set its own (spec.workload.gitlab.runUntagged).
	// +optional
	RunUntagged bool `json:"runUntagged,omitempty"`

	// accessLevel is not_protected (default: jobs of any branch or tag) or
	// ref_protected (jobs of protected branches and tags only).
	// +optional
	// +kubebuilder:default=not_protected
	AccessLevel GitLabAccessLevel `json:"accessLevel,omitempty"`
}

// GitLabCredentials are the operator's GitLab access token.
type GitLabCredentials struct {
	// token selects a personal, group or project access token with the
	// scopes create_runner, manage_runner and read_api (or api), of a user
	// (or bot) that is Maintainer of the project, Owner of the group, or an
	// administrator for instance runners (docs/gitlab.md).
	// +required
	Token LocalSecretKeySelector `json:"token"`
}

// GitLabRunnerOS is the VM's operating system in gitlab-runner's naming.
// +kubebuilder:validation:Enum=linux
type GitLabRunnerOS string

// GitLabRunnerArch is the VM's architecture in gitlab-runner's naming.
// +kubebuilder:validation:Enum=amd64;arm64
type GitLabRunnerArch string

// GitLabRunnerSoftware is the gitlab-runner binary and where jobs run.
// +kubebuilder:validation:XValidation:rule="!has(self.downloadURL) || has(self.downloadSHA256)",message="bootstrap.gitlab.runner.downloadURL needs bootstrap.gitlab.runner.downloadSHA256: give the binary's SHA-256 (64 hex digits) so that the agent can check the download, or remove downloadURL and install gitlab-runner in the template"
// +kubebuilder:validation:XValidation:rule="has(self.downloadURL) || !has(self.downloadSHA256)",message="bootstrap.gitlab.runner.downloadSHA256 applies only with bootstrap.gitlab.runner.downloadURL: remove it, or set downloadURL"
type GitLabRunnerSoftware struct {
	// path is the gitlab-runner binary in the VM: installed there in the
	// template (default /usr/local/bin/gitlab-runner), or where the agent
	// puts the download of downloadURL.
	// +optional
	// +kubebuilder:default="/usr/local/bin/gitlab-runner"
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^/[^\x00]*[^/]$`
	// +kubebuilder:validation:XValidation:rule="!self.contains('//') && !self.contains('/./') && !self.contains('/../') && !self.endsWith('/.') && !self.endsWith('/..')",message="bootstrap.gitlab.runner.path must be written plainly, without //, /./ or /../"
	Path string `json:"path,omitempty"`

	// downloadURL is the gitlab-runner binary the agent downloads, such as
	// https://gitlab-runner-downloads.s3.amazonaws.com/v18.6.0/binaries/gitlab-runner-{os}-{arch};
	// {os} and {arch} are replaced by os and arch. Unset means the binary
	// is installed in the template at path.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self.replace('{os}', 'linux').replace('{arch}', 'amd64')) && self.startsWith('https://')",message="bootstrap.gitlab.runner.downloadURL must be an https:// URL; {os} and {arch} may appear in it"
	DownloadURL string `json:"downloadURL,omitempty"`

	// downloadSHA256 is the binary's SHA-256 (64 hex digits, as GitLab's
	// release.sha256 lists it); required with downloadURL. The agent
	// refuses a download that does not match.
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-f0-9]{64}$`
	DownloadSHA256 string `json:"downloadSHA256,omitempty"`

	// buildsDir is where the shell executor runs jobs (gitlab-runner's
	// --builds-dir), emptied after each job. It may not be, contain or lie
	// inside a system directory.
	// +optional
	// +kubebuilder:default="/var/lib/hyperfleet/builds"
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^/[^\x00]*$`
	// +kubebuilder:validation:XValidation:rule="self == '/' || (!self.contains('//') && !self.endsWith('/') && !self.contains('/./') && !self.contains('/../') && !self.endsWith('/.') && !self.endsWith('/..'))",message="bootstrap.gitlab.runner.buildsDir must be written plainly, without //, /./, /../ or a trailing /"
	// +kubebuilder:validation:XValidation:rule="self != '/' && (self.startsWith('/usr/local/') ? !['bin', 'etc', 'games', 'include', 'lib', 'lib64', 'libexec', 'man', 'sbin', 'share', 'src'].exists(d, self == '/usr/local/' + d || self.startsWith('/usr/local/' + d + '/')) : (!['/bin', '/boot', '/dev', '/etc', '/lib', '/lib32', '/lib64', '/libx32', '/proc', '/root', '/run', '/sbin', '/sys', '/usr'].exists(d, self == d || self.startsWith(d + '/') || d.startsWith(self + '/')) && !['/home', '/media', '/mnt', '/opt', '/srv', '/tmp', '/var', '/var/cache', '/var/lib', '/var/lib/cloud', '/var/log', '/var/tmp'].exists(d, self == d || d.startsWith(self + '/'))))",message="bootstrap.gitlab.runner.buildsDir must not be, contain or (for /bin, /boot, /dev, /etc, /lib*, /proc, /root, /run, /sbin, /sys, /usr) lie inside a system directory: the agent empties it as root after each job; use a directory of its own such as /var/lib/hyperfleet/builds (docs/security.md)"
	BuildsDir string `json:"buildsDir,omitempty"`

	// os is the VM's operating system in gitlab-runner's naming; only linux.
	// +optional
	// +kubebuilder:default=linux
	OS GitLabRunnerOS `json:"os,omitempty"`

	// arch is the VM's architecture in gitlab-runner's naming.
	// +optional
	// +kubebuilder:default=amd64
	Arch GitLabRunnerArch `json:"arch,omitempty"`
}

// CloudInitDelivery is how a VM's cloud-init data reaches it.
// +kubebuilder:validation:Enum=iso;proxmox
type CloudInitDelivery string

const (
	// CloudInitDeliveryISO: the operator renders a NoCloud ISO per VM,
	// uploads it to the cluster's spec.proxmox.isoStorage, attaches it as a
	// CD-ROM and deletes it once the guest is up.
	CloudInitDeliveryISO CloudInitDelivery = "iso"
	// CloudInitDeliveryProxmox: Proxmox's own cloud-init drive, generated
	// from the VM's ci* config fields, with the static kit as vendor-data;
	// the agent's configuration goes through the guest agent.
	CloudInitDeliveryProxmox CloudInitDelivery = "proxmox"
)

// CloudInit is the user's cloud-init for the VMs; the operator merges its
// own per-VM data into it.
// +kubebuilder:validation:XValidation:rule="!has(self.proxmox) || (has(self.delivery) && self.delivery == 'proxmox')",message="cloudInit.proxmox applies only to cloudInit.delivery proxmox: remove it, or set delivery: proxmox"
// +kubebuilder:validation:XValidation:rule="!has(self.delivery) || self.delivery != 'proxmox' || (!has(self.userData) && !has(self.networkData) && !has(self.metaData))",message="cloudInit.userData, networkData and metaData cannot reach a VM under cloudInit.delivery proxmox (Proxmox's drive has no place for them): put your cloud-config in a snippet named by cloudInit.proxmox.userSnippet, or use delivery iso"
type CloudInit struct {
	// delivery is how the cloud-init data reaches each VM. iso (the
	// default): a NoCloud ISO per VM on the cluster's spec.proxmox.isoStorage,
	// attached as a CD-ROM and deleted once the guest is up. proxmox:
	// Proxmox's own cloud-init drive, generated from the VM's ipconfig0,
	// nameserver, searchdomain, ciuser, sshkeys and cicustom fields, for
	// clusters without ISO-capable storage; the agent's unit comes from
	// the static kit (hyperfleet proxmox-kit) named by
	// cloudInit.proxmox.vendorSnippet or baked into the image, and the
	// agent's per-VM configuration through the guest agent. userData,
	// networkData and metaData cannot be used with it
	// (docs/cloud-init.md, "Delivery").
	// +optional
	// +kubebuilder:default=iso
	Delivery CloudInitDelivery `json:"delivery,omitempty"`

	// proxmox is what Proxmox's own cloud-init drive carries besides the
	// VM's name and network: delivery proxmox only.
	// +optional
	Proxmox *ProxmoxCloudInit `json:"proxmox,omitempty"`

	// userData is a #cloud-config document (a Go template).
	// +optional
	// +kubebuilder:validation:MaxLength=65536
	UserData string `json:"userData,omitempty"`

	// networkData is a network-config version 2 document (a Go template).
	// With network.mode cloud-init it is used as the VM's network config.
	// +optional
	// +kubebuilder:validation:MaxLength=16384
	NetworkData string `json:"networkData,omitempty"`

	// metaData is extra NoCloud meta-data (a Go template); instance-id and
	// local-hostname are always the operator's.
	// +optional
	// +kubebuilder:validation:MaxLength=8192
	MetaData string `json:"metaData,omitempty"`
}

// ProxmoxCloudInit is the part of Proxmox's own cloud-init drive a template
// chooses (docs/cloud-init.md, "Delivery"). Every value here becomes a VM
// config field, which anyone with VM.Audit on the VM can read: public keys
// and names only, never a secret.
// +kubebuilder:validation:XValidation:rule="!has(self.userSnippet) || (!has(self.user) && !has(self.sshAuthorizedKeys))",message="cloudInit.proxmox.userSnippet replaces Proxmox's generated user-data whole, so user and sshAuthorizedKeys would be lost: put the user and its keys in the snippet, or remove userSnippet"
type ProxmoxCloudInit struct {
	// driveStorage is the storage the VM's cloud-init drive (ide2
	// <storage>:cloudinit) is made on; it needs images content. Unset: the
	// storage of the VM's boot disk.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[a-zA-Z][-_a-zA-Z0-9]*$`
	DriveStorage string `json:"driveStorage,omitempty"`

	// user is the guest user Proxmox's drive creates (ciuser); unset keeps
	// the image's default user.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^[a-z_][a-z0-9_-]*$`
	User string `json:"user,omitempty"`

	// sshAuthorizedKeys are OpenSSH public keys (one line each) the user
	// (or the image's default user) accepts (sshkeys).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=2048
	// +kubebuilder:validation:items:Pattern=`^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com|sk-ecdsa-sha2-nistp256@openssh\.com) [A-Za-z0-9+/]+={0,3}( [ -~]*)?$`
	SSHAuthorizedKeys []string `json:"sshAuthorizedKeys,omitempty"`

	// vendorSnippet is the volume of the static kit HyperFleet's agent
	// needs (what "hyperfleet proxmox-kit" prints), placed by the platform
	// team on a storage with snippets content, such as
	// local:snippets/hyperfleet-kit.yaml (cicustom vendor=). Unset: the
	// template's image has the kit baked in. The operator never writes it:
	// Proxmox's API cannot write snippets.
	// +optional
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[a-zA-Z][-_a-zA-Z0-9]*:snippets/[a-zA-Z0-9_][-_.a-zA-Z0-9]*$`
	VendorSnippet string `json:"vendorSnippet,omitempty"`

	// userSnippet is the volume of the platform team's own user-data on a
	// storage with snippets content (cicustom user=). It replaces
	// Proxmox's generated user-data whole, and with it the host name and
	// FQDN (Proxmox's meta-data carries neither), user and keys: the
	// snippet sets what the VMs need of those.
	// +optional
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[a-zA-Z][-_a-zA-Z0-9]*:snippets/[a-zA-Z0-9_][-_.a-zA-Z0-9]*$`
	UserSnippet string `json:"userSnippet,omitempty"`
}

// ObjectMetadata is labels and annotations to stamp on created objects.
type ObjectMetadata struct {
	// labels are added to each MachineClaim a RunnerPool creates. Keys
	// under hyperfleet.io/ are HyperFleet's own and refused; a key or
	// value that is not a valid label makes the template not Ready
	// (TemplateInvalid).
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, !k.startsWith('hyperfleet.io/') && !k.contains('.hyperfleet.io/'))",message="metadata.labels must not set hyperfleet.io/ keys: HyperFleet sets those itself"
	Labels map[string]string `json:"labels,omitempty"`

	// annotations are added to each MachineClaim a RunnerPool creates.
	// Keys under hyperfleet.io/ are HyperFleet's own and refused; a key
	// that is not a valid annotation key makes the template not Ready
	// (TemplateInvalid).
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, !k.startsWith('hyperfleet.io/') && !k.contains('.hyperfleet.io/'))",message="metadata.annotations must not set hyperfleet.io/ keys (such as hyperfleet.io/fail-reason): HyperFleet sets those itself"
	Annotations map[string]string `json:"annotations,omitempty"`
}

// HypervisorMachineTemplateStatus is what the operator found when checking
// the template against its cluster.
type HypervisorMachineTemplateStatus struct {
	// conditions are Ready, Valid and ReusableCredential (True, a warning,
	// when the credential a VM receives can serve more than one job on
	// the CI platform's side).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// observedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// templateHash is a SHA-256 over everything that shapes a VM except
	// per-VM values; claims built from an older hash are stale.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	TemplateHash string `json:"templateHash,omitempty"`

	// resolvedTemplate is the template found on the hypervisor.
	// +optional
	ResolvedTemplate *ResolvedTemplate `json:"resolvedTemplate,omitempty"`

	// runner is the runner package spec.bootstrap.github.runner.version
	// resolved to: what every new VM downloads and checks.
	// +optional
	Runner *ResolvedRunner `json:"runner,omitempty"`
}

// ResolvedRunner is a runner release resolved for a template's platform.
type ResolvedRunner struct {
	// version is the release, such as 2.329.0.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	Version string `json:"version,omitempty"`

	// downloadURL is the package VMs download.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	DownloadURL string `json:"downloadURL,omitempty"`

	// downloadSHA256 is the package's SHA-256 as the release publishes it.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	DownloadSHA256 string `json:"downloadSHA256,omitempty"`

	// resolvedAt is when the release was last looked up.
	// +optional
	ResolvedAt *metav1.Time `json:"resolvedAt,omitempty"`
}

// ResolvedTemplate is the hypervisor template a HypervisorMachineTemplate points at.
type ResolvedTemplate struct {
	// vmID is the template's VM id.
	// +optional
	VMID int32 `json:"vmID,omitempty"`

	// vmId is the earlier spelling of vmID, as an earlier operator wrote
	// it: read when vmID is unset, replaced by vmID at the next status
	// write.
	//
	// Deprecated: the operator writes vmID. Only the schema and the
	// status write that moves it (OldStatusSpellings) read this field:
	// decoding folds it into VMID (api/v1alpha1/spelling.go).
	// +optional
	DeprecatedVMID int32 `json:"vmId,omitempty"`

	// node is the node that holds the template.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Node string `json:"node,omitempty"`

	// storage is the storage of the template's disk.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Storage string `json:"storage,omitempty"`
}

// HypervisorMachineTemplate describes a kind of VM: the hypervisor template
// it is cloned from, its size and network, its identity and how its CI
// runner is bootstrapped.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=hmt,categories=hyperfleet
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.hypervisorClusterRef.name`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="CPU",type=integer,JSONPath=`.spec.resources.cpu`
// +kubebuilder:printcolumn:name="Memory",type=string,JSONPath=`.spec.resources.memory`
// +kubebuilder:printcolumn:name="Network",type=string,JSONPath=`.spec.network.mode`,priority=1
// +kubebuilder:printcolumn:name="Bootstrap",type=string,JSONPath=`.spec.bootstrap.method`,priority=1
// +kubebuilder:printcolumn:name="Hash",type=string,JSONPath=`.status.templateHash`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type HypervisorMachineTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec describes the VMs.
	// +required
	Spec HypervisorMachineTemplateSpec `json:"spec"`

	// status is what the operator found.
	// +optional
	Status HypervisorMachineTemplateStatus `json:"status,omitempty"`
}

// HypervisorMachineTemplateList is a list of HypervisorMachineTemplate.
// +kubebuilder:object:root=true
type HypervisorMachineTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []HypervisorMachineTemplate `json:"items"`
}

func init() {
	SchemeBuilder.Register(&HypervisorMachineTemplate{}, &HypervisorMachineTemplateList{})
}
