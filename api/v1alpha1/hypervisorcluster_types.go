package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// HypervisorProvider names a hypervisor implementation.
// +kubebuilder:validation:Enum=proxmox;libvirt
type HypervisorProvider string

const (
	// ProviderProxmox is Proxmox VE.
	ProviderProxmox HypervisorProvider = "proxmox"
	// ProviderLibvirt is plain KVM/QEMU hosts managed by libvirt.
	ProviderLibvirt HypervisorProvider = "libvirt"
)

// HypervisorClusterSpec says how to reach one hypervisor cluster and how VMs
// are placed on it. The fields at its top level are shared by every
// hypervisor; what only one kind of hypervisor has is in that kind's own
// section (spec.proxmox, spec.libvirt), which is allowed only with that
// provider. endpoint and credentials are optional in the schema because
// libvirt has neither an HTTP API nor tokens; provider proxmox still
// requires both.
// +kubebuilder:validation:XValidation:rule="!has(self.proxmox) || self.provider == 'proxmox'",message="spec.proxmox holds Proxmox VE settings and is allowed only with provider proxmox: remove spec.proxmox or set provider: proxmox",fieldPath=".proxmox"
// +kubebuilder:validation:XValidation:rule="!has(self.libvirt) || self.provider == 'libvirt'",message="spec.libvirt holds libvirt settings and is allowed only with provider libvirt: remove spec.libvirt or set provider: libvirt",fieldPath=".libvirt"
// +kubebuilder:validation:XValidation:rule="self.provider != 'libvirt' || has(self.libvirt)",message="provider libvirt needs spec.libvirt: set spec.libvirt.hosts and spec.libvirt.volumePool",fieldPath=".libvirt"
// +kubebuilder:validation:XValidation:rule="self.provider != 'proxmox' || has(self.endpoint)",message="provider proxmox needs spec.endpoint: set the API's https:// URL, such as https://pve.example.com:8006/api2/json",fieldPath=".endpoint"
// +kubebuilder:validation:XValidation:rule="self.provider != 'proxmox' || (has(self.credentials) && (has(self.credentials.tokenID) || has(self.credentials.tokenId) || has(self.credentials.username)))",message="provider proxmox needs spec.credentials: set exactly one credential pair: tokenID with tokenSecret (API token), or username with password",fieldPath=".credentials"
// +kubebuilder:validation:XValidation:rule="self.provider != 'libvirt' || !has(self.credentials) || (!has(self.credentials.tokenID) && !has(self.credentials.tokenId) && !has(self.credentials.tokenSecret) && !has(self.credentials.username) && !has(self.credentials.password))",message="spec.credentials of a libvirt cluster holds only clientCert (libvirt authenticates with a TLS client certificate, or with spec.libvirt.ssh): remove tokenID, tokenSecret, username and password",fieldPath=".credentials"
// +kubebuilder:validation:XValidation:rule="!has(self.vmidRange) || !has(self.proxmox) || !has(self.proxmox.vmidRange)",message="vmidRange is set twice: remove the deprecated spec.vmidRange and keep spec.proxmox.vmidRange",fieldPath=".vmidRange"
// +kubebuilder:validation:XValidation:rule="!has(self.isoStorage) || !has(self.proxmox) || !has(self.proxmox.isoStorage)",message="isoStorage is set twice: remove the deprecated spec.isoStorage and keep spec.proxmox.isoStorage",fieldPath=".isoStorage"
type HypervisorClusterSpec struct {
	// provider is the hypervisor implementation: proxmox (Proxmox VE) or
	// libvirt (KVM/QEMU hosts managed by libvirt). It cannot be changed: create a new HypervisorCluster instead.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="provider is immutable; create a new HypervisorCluster for another hypervisor"
	Provider HypervisorProvider `json:"provider"`

	// endpoint is the hypervisor API's base URL, for Proxmox VE
	// https://<host>:8006/api2/json. Only https is accepted: the API carries
	// credentials. Required with provider proxmox; libvirt reaches its
	// hosts by spec.libvirt.hosts instead.
	// +optional
	// +kubebuilder:validation:MinLength=9
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() == 'https' && url(self).getHostname() != ''",message="endpoint must be an https:// URL with a host, such as https://pve.example.com:8006/api2/json"
	Endpoint string `json:"endpoint,omitempty"`

	// credentials authenticate the operator to the hypervisor API. Set either
	// tokenId and tokenSecret (a Proxmox API token, recommended) or username
	// and password. They stay in the operator and never reach a VM.
	// Required with provider proxmox. A libvirt cluster sets at most
	// clientCert (its TLS client certificate for qemu+tls hosts).
	// +optional
	Credentials HypervisorCredentials `json:"credentials,omitzero"`

	// tls says how the operator trusts the API's certificate. Without it the
	// system trust store is used. Proxmox nodes usually present a certificate
	// signed by the cluster's own CA: give caBundleRef or pin the
	// certificate's SHA-256 fingerprint.
	// +optional
	TLS *HypervisorTLS `json:"tls,omitempty"`

	// nodes restricts placement to these hypervisor nodes. Empty means every
	// online node of the cluster.
	// +optional
	// +kubebuilder:validation:MaxItems=128
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="self.all(n, self.exists_one(m, m == n))",message="nodes must not list a node twice"
	// +listType=atomic
	Nodes []string `json:"nodes,omitempty"`

	// defaultStorage is the storage that full clones are written to when the
	// template does not name one (for example local-lvm).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[a-zA-Z][-_a-zA-Z0-9]*$`
	DefaultStorage string `json:"defaultStorage,omitempty"`

	// defaultBridge is the network bridge VMs attach to when the template
	// does not name one. Unset: the hypervisor kind's own default (Proxmox
	// VE: vmbr0; libvirt: spec.libvirt.network, else the template domain's
	// interface).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:Pattern=`^[a-zA-Z][-_.a-zA-Z0-9]*$`
	DefaultBridge string `json:"defaultBridge,omitempty"`

	// proxmox holds the settings only Proxmox VE has (VM ids, the storage
	// of the cloud-init ISOs). Set it only with provider proxmox; every
	// other field of the spec means the same on every hypervisor
	// (docs/architecture.md, "A second hypervisor").
	// +optional
	Proxmox *ProxmoxClusterSettings `json:"proxmox,omitempty"`

	// libvirt holds the settings only libvirt has (its hosts, storage pools
	// and network). Required with provider libvirt, allowed only with it.
	// +optional
	Libvirt *LibvirtClusterSettings `json:"libvirt,omitempty"`

	// vmidRange is the block of VM ids the operator allocates from.
	//
	// Deprecated: set spec.proxmox.vmidRange instead; this field is still
	// read when that one is unset, and the two may not both be set.
	// +optional
	VMIDRange *VMIDRange `json:"vmidRange,omitempty"`

	// isoStorage is the storage that receives the cloud-init ISOs.
	//
	// Deprecated: set spec.proxmox.isoStorage instead; this field is still
	// read when that one is unset, and the two may not both be set.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[a-zA-Z][-_a-zA-Z0-9]*$`
	ISOStorage string `json:"isoStorage,omitempty"`

	// limits bound the load the operator puts on this cluster.
	// +optional
	Limits *HypervisorLimits `json:"limits,omitempty"`

	// dns holds the name-resolution settings given to VMs on this cluster,
	// and the DNS service their names are registered in (registerVMs,
	// dnsProvider). A template's own dns settings take precedence field by
	// field.
	// +optional
	DNS *ClusterDNSSettings `json:"dns,omitempty"`

	// network holds the checks of the VMs' reachability from the operator
	// (validation).
	// +optional
	Network *ClusterNetworkSettings `json:"network,omitempty"`

	// tags are extra hypervisor tags set on every VM the operator creates,
	// on top of the operator's own ownership tags. Proxmox tags allow only
	// letters, digits and _ - + . (no '/', ':' or '='); they are stored
	// lower-cased.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:Pattern=`^[a-zA-Z0-9_][-a-zA-Z0-9_+.]*$`
	// +listType=set
	Tags []string `json:"tags,omitempty"`

	// allowedNamespaces selects the namespaces whose templates may use this
	// cluster. Unset admits every namespace; an empty selector ({}) too.
	// +optional
	AllowedNamespaces *metav1.LabelSelector `json:"allowedNamespaces,omitempty"`

	// tenancy is the admin's allow-list of what tenant namespaces may use
	// on this cluster. A template in namespace N is valid only if one entry
	// whose namespaceSelector selects N allows every value the template
	// uses: its Proxmox template, bridge, VLAN, full-clone storage and
	// resource pool. When entries exist, a namespace no entry selects may
	// not use the cluster at all (NamespaceNotAllowed). Unset allows
	// everything to every admitted namespace, and the cluster reports
	// TenancyRestricted=False until it is set (docs/security.md).
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	Tenancy []TenancyRule `json:"tenancy,omitempty"`

	// spire connects the cluster's VMs to a SPIRE server, for templates
	// whose spec.attestation.method is join-token (docs/identity.md).
	// Unset: such templates are not Ready here (SPIRENotConfigured).
	// +optional
	SPIRE *SPIREConfig `json:"spire,omitempty"`

	// pollInterval is how often the operator reads the cluster's VM list
	// (one request per cluster, whatever the number of VMs) to detect
	// powered-off VMs and orphans.
	// +optional
	// +kubebuilder:default="5s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('5m')",message="pollInterval must be between 1s and 5m"
	PollInterval *metav1.Duration `json:"pollInterval,omitempty"`

	// probeTimeout bounds each probe of the cluster's API (the reads of
	// its version, nodes and storages that decide Connected). A Ready
	// cluster is marked down after three failed probes in a row, a
	// second apart, so a cluster that stops answering (a network
	// partition, a hung API proxy) is seen about three probeTimeouts in,
	// and its pools' overflow templates take new VMs from then on
	// (docs/runnerpool.md, "Overflow across clusters"). The VM list and
	// every other call keep the API's own request timeout (30 s). Raise
	// it for a cluster whose API answers slowly (far away, or under
	// heavy load): a probe that times out counts as a failure.
	// +optional
	// +kubebuilder:default="10s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('30s')",message="probeTimeout must be between 1s and 30s (the API's request timeout)"
	ProbeTimeout *metav1.Duration `json:"probeTimeout,omitempty"`
}

// TenancyRule is what the namespaces it selects may use on a cluster. A
// list left out allows only the cluster's default for that value (see each
// field), so a forgotten field never opens the cluster up.
type TenancyRule struct {
	// namespaceSelector selects, by their labels, the namespaces this entry
	// is for; {} selects every namespace.
	// +required
	NamespaceSelector metav1.LabelSelector `json:"namespaceSelector"`

	// templates are the Proxmox templates these namespaces may clone. An id
	// entry matches a template's source.proxmox.templateId, a name entry its
	// source.proxmox.templateName (names are not resolved to ids, so a
	// template named by id needs an id entry and the other way round).
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	Templates []AllowedTemplate `json:"templates"`

	// bridges are the bridges (network.bridge) these namespaces may attach
	// VMs to. Left out: only the cluster's default (defaultBridge, or the
	// hypervisor kind's own when that is unset).
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=15
	// +kubebuilder:validation:items:Pattern=`^[a-zA-Z][-_.a-zA-Z0-9]*$`
	// +listType=set
	Bridges []string `json:"bridges,omitempty"`

	// vlans are the VLAN id ranges (network.vlan) these namespaces may tag
	// VM traffic with. Left out: untagged only. When set, a template must
	// set network.vlan inside one of the ranges: untagged traffic on a
	// VLAN-aware bridge reaches its native VLAN, so allowing it takes an
	// entry without vlans.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	VLANs []VLANRange `json:"vlans,omitempty"`

	// storages are the storages full clones may be written to
	// (source.proxmox.storage, or the cluster's defaultStorage when that is
	// unset). Left out: a template may not name a storage other than the
	// cluster's defaultStorage. Linked clones, and full clones with no
	// target storage, stay on the allowed template's own storage.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:Pattern=`^[a-zA-Z][-_a-zA-Z0-9]*$`
	// +listType=set
	Storages []string `json:"storages,omitempty"`

	// resourcePools are the Proxmox resource pools (source.proxmox.pool)
	// these namespaces may put VMs in. Left out: none. A template that
	// names no pool needs no entry here.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9_][-A-Za-z0-9_]*$`
	// +listType=set
	ResourcePools []string `json:"resourcePools,omitempty"`

	// snippets are the snippet volumes (such as
	// local:snippets/hyperfleet-kit.yaml) these namespaces' templates may
	// name in spec.cloudInit.proxmox.vendorSnippet and userSnippet: a VM
	// boots with the file it names, so a namespace that could name any
	// would read another team's. Left out: none. A template's
	// cloudInit.proxmox.driveStorage must be one of storages.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=255
	// +kubebuilder:validation:items:Pattern=`^[a-zA-Z][-_a-zA-Z0-9]*:snippets/[a-zA-Z0-9_][-_.a-zA-Z0-9]*$`
	// +listType=set
	Snippets []string `json:"snippets,omitempty"`

	// apiHosts are the CI platform API hosts, besides the platforms' public
	// services (api.github.com, gitlab.com, api.buildkite.com and
	// agent.buildkite.com, always allowed), that these namespaces'
	// templates may name in the URLs the operator calls with their
	// credentials (spec.bootstrap.github.apiBaseURL and registrationURLs,
	// spec.bootstrap.gitlab.url, spec.bootstrap.buildkite.apiURL and
	// agentEndpoint): a GitHub Enterprise Server, a self-managed GitLab.
	// Each is a host name or IP address with an optional port, such as
	// ghes.example.com or gitlab.example.com:8443 (port 443 is the
	// default). Left out: the public services only. A pool's scope is
	// verified against, and takes jobs from, its template's API host only
	// (docs/security.md, "The API host is part of the scope").
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=261
	// +kubebuilder:validation:items:Pattern=`^([a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:.]+\])(:[0-9]{1,5})?$`
	// +listType=set
	APIHosts []string `json:"apiHosts,omitempty"`

	// dnsDomains are the DNS domains these namespaces' templates may give
	// their VMs (spec.network.dns.domain, under which a VM's name is
	// registered and validated): each allows itself and every domain
	// below it. Left out: only the cluster's own dns.domain, so that no
	// tenant registers its VMs' addresses under another team's names.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +listType=set
	DNSDomains []string `json:"dnsDomains,omitempty"`

	// isolationPolicies are the network isolation policies
	// (spec.network.isolation.policies, or default for the built-in one)
	// these namespaces' templates may name in spec.network.isolationPolicy.
	// Left out: only the cluster's defaultPolicy, which a template gets by
	// naming none.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +listType=set
	IsolationPolicies []string `json:"isolationPolicies,omitempty"`

	// cpuTypes are the CPU models (spec.hardware.cpuType) these
	// namespaces' templates may ask for. Left out: none; a template then
	// keeps its Proxmox template's or libvirt domain's own CPU.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:Pattern=`^[a-zA-Z0-9][-_.a-zA-Z0-9]*$`
	// +listType=set
	CPUTypes []string `json:"cpuTypes,omitempty"`

	// cpuFlags are the CPU flags (spec.hardware.cpuFlags, with their + or
	// -) these namespaces' templates may set, and nested-virt for
	// spec.hardware.nestedVirtualization. Left out: none.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:Pattern=`^([+-][a-z0-9][-_.a-z0-9]*|nested-virt)$`
	// +listType=set
	CPUFlags []string `json:"cpuFlags,omitempty"`

	// devices are the device mappings (spec.hardware.devices[].mapping)
	// these namespaces' templates may take devices of. Left out: none.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:Pattern=`^[a-zA-Z][-_a-zA-Z0-9]*$`
	// +listType=set
	Devices []string `json:"devices,omitempty"`

	// limits cap what each namespace this entry selects may hold on the
	// cluster at once (VMs, vCPUs, memory, disk, devices), counted from
	// its claims' signed placement records. Unset: no cap beyond the
	// cluster's (spec.limits.maxMachines, capacity).
	// +optional
	Limits *TenantLimits `json:"limits,omitempty"`
}

// AllowedTemplate names one Proxmox template, by VM id or by name, or
// every template carrying a tag.
// +kubebuilder:validation:XValidation:rule="[has(self.id), has(self.name), has(self.tag)].filter(x, x).size() == 1",message="set exactly one of id, name and tag in a tenancy templates entry"
type AllowedTemplate struct {
	// id is the template's VM id, matched against source.proxmox.templateId.
	// +optional
	// +kubebuilder:validation:Minimum=100
	// +kubebuilder:validation:Maximum=999999999
	ID *int32 `json:"id,omitempty"`

	// name is the template's name, matched against
	// source.proxmox.templateName.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9]([-a-zA-Z0-9.]*[a-zA-Z0-9])?$`
	Name string `json:"name,omitempty"`
	// tag allows a template named by source.proxmox.templateSelector
	// whose matchTags include it: every template the selector can pick
	// then carries this tag, which the platform team gives only to the
	// templates it allows.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9_][-a-zA-Z0-9_+.]*$`
	Tag string `json:"tag,omitempty"`
}

// VLANRange is an inclusive range of 802.1Q VLAN ids.
// +kubebuilder:validation:XValidation:rule="self.start <= self.end",message="a tenancy vlans range must have start <= end"
type VLANRange struct {
	// start is the first VLAN id of the range.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4094
	Start int32 `json:"start"`

	// end is the last VLAN id of the range.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4094
	End int32 `json:"end"`
}

// HypervisorCredentials holds references to the hypervisor API credentials.
// Its own rule refuses a partial or a second pair; whether a pair is
// required is the provider's (rules on HypervisorClusterSpec).
// +kubebuilder:validation:XValidation:rule="((has(self.tokenID) || has(self.tokenId)) && has(self.tokenSecret) && !has(self.username) && !has(self.password)) || (!has(self.tokenID) && !has(self.tokenId) && !has(self.tokenSecret) && has(self.username) && has(self.password)) || (!has(self.tokenID) && !has(self.tokenId) && !has(self.tokenSecret) && !has(self.username) && !has(self.password))",message="set exactly one credential pair: tokenID with tokenSecret (API token), or username with password"
// +kubebuilder:validation:XValidation:rule="!has(self.tokenId)",message="spec.credentials.tokenId is now tokenID: rename the field"
type HypervisorCredentials struct {
	// tokenID selects the API token id, such as hyperfleet@pve!operator.
	// +optional
	TokenID *SecretKeySelector `json:"tokenID,omitempty"`

	// tokenId is the earlier spelling of tokenID, refused on new writes; a
	// cluster stored with it keeps working (read as tokenID) and is told to
	// rename it in a DeprecatedField event.
	//
	// Deprecated: set tokenID. Only the schema and that event read this
	// field: decoding folds it into TokenID (api/v1alpha1/spelling.go).
	// +optional
	DeprecatedTokenID *SecretKeySelector `json:"tokenId,omitempty"`

	// tokenSecret selects the API token's secret (a UUID).
	// +optional
	TokenSecret *SecretKeySelector `json:"tokenSecret,omitempty"`

	// username selects the user name with realm, such as root@pam.
	// +optional
	Username *SecretKeySelector `json:"username,omitempty"`

	// password selects the user's password.
	// +optional
	Password *SecretKeySelector `json:"password,omitempty"`

	// clientCert selects a TLS client certificate and its private key, for
	// an API behind a TLS-terminating proxy that verifies client
	// certificates (mutual TLS). It is presented in addition to the API
	// token or the username and password above, never instead of them.
	// Unset: no client certificate is sent.
	// +optional
	ClientCert *ClientCertificateSelector `json:"clientCert,omitempty"`
}

// ClientCertificateSelector selects a PEM certificate and its PEM private
// key in one Secret. The default keys are those of a Secret of type
// kubernetes.io/tls (as cert-manager writes them); any other Secret works
// with certificateKey and privateKeyKey set to its keys.
// +kubebuilder:validation:XValidation:rule="!has(self.certificateKey) || !has(self.privateKeyKey) || self.certificateKey != self.privateKeyKey",message="credentials.clientCert: certificateKey and privateKeyKey must name two different keys of the Secret (a kubernetes.io/tls Secret has tls.crt and tls.key)"
type ClientCertificateSelector struct {
	// name of the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`

	// namespace of the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespace string `json:"namespace"`

	// certificateKey is the Secret key holding the client certificate in
	// PEM, followed by any intermediate CA certificates the proxy needs to
	// build the chain. Default tls.crt.
	// +optional
	// +kubebuilder:default="tls.crt"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	CertificateKey string `json:"certificateKey,omitempty"`

	// privateKeyKey is the Secret key holding the certificate's private key
	// in PEM (PKCS #1, PKCS #8 or SEC 1, unencrypted). Default tls.key.
	// +optional
	// +kubebuilder:default="tls.key"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	PrivateKeyKey string `json:"privateKeyKey,omitempty"`
}

// Secret keys of a kubernetes.io/tls Secret: the defaults of
// ClientCertificateSelector's certificateKey and privateKeyKey. The CRD's
// defaults (markers above) must be the same strings.
const (
	DefaultClientCertificateKey = "tls.crt"
	DefaultClientPrivateKeyKey  = "tls.key"
)

// HypervisorTLS says how the API's certificate is trusted.
// +kubebuilder:validation:XValidation:rule="[has(self.caBundleRef), has(self.fingerprintSHA256), has(self.insecureSkipVerify) && self.insecureSkipVerify].filter(x, x).size() <= 1",message="set at most one of tls.caBundleRef, tls.fingerprintSHA256 and tls.insecureSkipVerify=true"
type HypervisorTLS struct {
	// caBundleRef selects a Secret key holding PEM CA certificates that sign
	// the API's certificate (for Proxmox, /etc/pve/pve-root-ca.pem).
	// +optional
	CABundleRef *SecretKeySelector `json:"caBundleRef,omitempty"`

	// fingerprintSHA256 pins the API certificate by its SHA-256 fingerprint,
	// as Proxmox shows it: 32 colon-separated hex bytes.
	// +optional
	// +kubebuilder:validation:Pattern=`^([0-9A-Fa-f]{2}:){31}[0-9A-Fa-f]{2}$`
	FingerprintSHA256 string `json:"fingerprintSHA256,omitempty"`

	// insecureSkipVerify switches certificate verification off. Only for
	// throw-away labs: anyone on the path can read the credentials. The
	// cluster reports TLSVerified=False while it is set.
	// +optional
	InsecureSkipVerify bool `json:"insecureSkipVerify,omitempty"`
}

// ProxmoxClusterSettings are the settings of a HypervisorCluster that only
// Proxmox VE has.
type ProxmoxClusterSettings struct {
	// vmidRange is the block of VM ids the operator allocates from. Keep it
	// apart from ids used by hand or by other tools. Unset: every id Proxmox
	// allows (100-999999999).
	// +optional
	VMIDRange *VMIDRange `json:"vmidRange,omitempty"`

	// isoStorage is an iso-capable, file-based storage on every allowed node
	// that receives each VM's NoCloud cloud-init ISO. The ISO is deleted
	// once the guest is up and always when the VM is deleted. Unset: local.
	// (The default is the operator's, DefaultISOStorage, not the schema's:
	// a schema default would make a cluster that still sets the deprecated
	// spec.isoStorage set it twice as soon as it adds this section.)
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[a-zA-Z][-_a-zA-Z0-9]*$`
	ISOStorage string `json:"isoStorage,omitempty"`
}

// DefaultISOStorage is the storage that receives the cloud-init ISOs of a
// Proxmox cluster that names none (spec.proxmox.isoStorage): the storage
// every Proxmox VE node has.
const DefaultISOStorage = "local"

// VMIDRange is an inclusive block of hypervisor VM ids.
// +kubebuilder:validation:XValidation:rule="self.start <= self.end",message="vmidRange.start must not be greater than vmidRange.end"
type VMIDRange struct {
	// start is the first id of the block.
	// +required
	// +kubebuilder:validation:Minimum=100
	// +kubebuilder:validation:Maximum=999999999
	Start int32 `json:"start"`

	// end is the last id of the block.
	// +required
	// +kubebuilder:validation:Minimum=100
	// +kubebuilder:validation:Maximum=999999999
	End int32 `json:"end"`
}

// DefaultClonesPerNode and DefaultClonesPerStorage are the clone limits
// of a cluster whose spec.limits, or the field in it, is unset. The CRD's
// defaults (markers below) must be the same numbers; a test holds them
// together.
const (
	DefaultClonesPerNode    = 4
	DefaultClonesPerStorage = 4
)

// HypervisorLimits bound the operator's load on a cluster. Proxmox clones
// queue on storage locks and fail after a 10 s wait, so a few concurrent
// clones per node and storage are faster than many.
type HypervisorLimits struct {
	// clonesPerNode is the most clones in flight on one node (default 4,
	// also when limits is unset).
	// +optional
	// +kubebuilder:default=4
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=32
	ClonesPerNode int32 `json:"clonesPerNode,omitempty"`

	// clonesPerStorage is the most clones in flight onto one storage
	// (default 4, also when limits is unset).
	// +optional
	// +kubebuilder:default=4
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=32
	ClonesPerStorage int32 `json:"clonesPerStorage,omitempty"`

	// maxMachines caps the VMs the operator keeps on this cluster at once:
	// the VMs carrying this install's tag plus those being created. A claim
	// over the cap waits (Provisioned=False, reason MaxMachinesReached) and
	// goes on when one of the VMs is deleted. Unset means no cap beyond the
	// cluster's capacity.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	MaxMachines *int32 `json:"maxMachines,omitempty"`
}

// ClusterDNSSettings are DNS settings for the VMs of a cluster.
// +kubebuilder:validation:XValidation:rule="!has(self.registerVMs) || !self.registerVMs || has(self.dnsProvider)",message="dns.registerVMs needs dns.dnsProvider: say which DNS service receives the records"
// +kubebuilder:validation:XValidation:rule="!has(self.dnsProvider) || has(self.dnsProvider.zone) || has(self.domain)",message="dns.dnsProvider needs a zone: set dns.dnsProvider.zone, or dns.domain (the zone then defaults to it)"
type ClusterDNSSettings struct {
	DNSSettings `json:",inline"`

	// registerVMs publishes each VM's addresses under its FQDN
	// (status.network.fqdn of its MachineClaim) through dnsProvider: an A
	// or AAAA record each, and a PTR each in dnsProvider.reverseZones. The
	// records are removed when the claim ends; a failure to write them
	// never holds a VM back (the claim's DNSRegistered condition says
	// what went wrong).
	// +optional
	RegisterVMs bool `json:"registerVMs,omitempty"`

	// dnsProvider is the DNS service VMs are registered in. It is checked
	// (the cluster's DNSReady condition) also while registerVMs is false,
	// so that a set-up can be tried before VMs are registered.
	// +optional
	DNSProvider *DNSProvider `json:"dnsProvider,omitempty"`

	// validation checks each running VM's FQDN at the DNS servers
	// (servers, or the template's network.dns.servers) from the operator:
	// the claim's NetworkValidated condition and status.networkValidation.
	// +optional
	Validation *DNSValidation `json:"validation,omitempty"`
}

// DNSProviderType says how HyperFleet publishes records: rfc2136, by
// dynamic update to the DNS servers itself, or external-dns, as DNSEndpoint
// objects an external-dns publishes. route53 and cloudflare are refused on
// new writes (HyperFleet never talked to those services itself: they were
// external-dns with a label); a cluster stored with one keeps working as
// external-dns with that label and is told to move.
// +kubebuilder:validation:Enum=rfc2136;external-dns;route53;cloudflare
type DNSProviderType string

// DefaultDNSTTLSeconds is the TTL of registered records when
// dnsProvider.ttlSeconds is unset; the CRD's default marker is the same
// number.
const DefaultDNSTTLSeconds = 300

// DNSProvider is a DNS service that receives VM records.
// +kubebuilder:validation:XValidation:rule="self.type != 'rfc2136' || has(self.rfc2136)",message="dns.dnsProvider.type rfc2136 needs dns.dnsProvider.rfc2136 with the server's address (host:port)"
// +kubebuilder:validation:XValidation:rule="!has(self.rfc2136) || self.type == 'rfc2136'",message="dns.dnsProvider.rfc2136 is only for type rfc2136: remove it or set type: rfc2136"
// +kubebuilder:validation:XValidation:rule="self.type != 'rfc2136' || (has(self.credentials) && self.credentials.exists(c, c.name == 'tsigKey'))",message="dns.dnsProvider.type rfc2136 needs a credential named tsigKey: the Secret key holding the TSIG key (name, algorithm and secret; see docs/networking.md)"
// +kubebuilder:validation:XValidation:rule="!has(self.externalDNS) || self.type != 'rfc2136'",message="dns.dnsProvider.externalDNS is for type external-dns (records handed to external-dns): remove it or change the type"
// +kubebuilder:validation:XValidation:rule="self.type == 'rfc2136' || !has(self.credentials) || size(self.credentials) == 0",message="dns.dnsProvider.credentials are for type rfc2136 only: with external-dns, external-dns holds the DNS service's credentials and HyperFleet needs none; remove them"
// +kubebuilder:validation:XValidation:rule="self.type != 'route53' && self.type != 'cloudflare'",message="dns.dnsProvider.type route53 and cloudflare are external-dns under another name (HyperFleet never talks to those services): set type: external-dns and externalDNS.labelValue to the same word, for the external-dns that runs with that provider"
type DNSProvider struct {
	// type is the DNS service. rfc2136: HyperFleet updates the zones
	// itself, by dynamic update signed with TSIG (settings in rfc2136,
	// the key in credentials). external-dns: HyperFleet writes a
	// DNSEndpoint object (externaldns.k8s.io/v1alpha1) per VM and
	// external-dns, which the platform team runs with the provider of its
	// choice, publishes it (docs/networking.md, "DNS registration through
	// external-dns"). route53 and cloudflare are refused on new writes:
	// use external-dns with externalDNS.labelValue.
	// +required
	Type DNSProviderType `json:"type"`

	// zone is the DNS zone records are written to; defaults to dns.domain.
	// A VM's FQDN must be a name below it.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^([a-zA-Z0-9_]([-a-zA-Z0-9_]*[a-zA-Z0-9_])?\.)*[a-zA-Z0-9_]([-a-zA-Z0-9_]*[a-zA-Z0-9_])?\.?$`
	Zone string `json:"zone,omitempty"`

	// reverseZones are the in-addr.arpa and ip6.arpa zones PTR records are
	// written to, such as 2.0.192.in-addr.arpa; an address in none of them
	// gets no PTR.
	// +optional
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.all(z, z.lowerAscii().endsWith('.in-addr.arpa') || z.lowerAscii().endsWith('.in-addr.arpa.') || z.lowerAscii().endsWith('.ip6.arpa') || z.lowerAscii().endsWith('.ip6.arpa.'))",message="each of dns.dnsProvider.reverseZones must be a zone below in-addr.arpa or ip6.arpa, such as 2.0.192.in-addr.arpa"
	// +listType=set
	ReverseZones []string `json:"reverseZones,omitempty"`

	// ttlSeconds is the TTL of every record written, in seconds (default
	// 300).
	// +optional
	// +kubebuilder:default=300
	// +kubebuilder:validation:Minimum=5
	// +kubebuilder:validation:Maximum=86400
	TTLSeconds int32 `json:"ttlSeconds,omitempty"`

	// rfc2136 are the settings of type rfc2136: the DNS server that takes
	// the dynamic updates. Its TSIG key is the credential named tsigKey.
	// +optional
	RFC2136 *RFC2136Settings `json:"rfc2136,omitempty"`

	// externalDNS are the settings of type external-dns: where HyperFleet
	// writes the DNSEndpoint objects that external-dns publishes, and how
	// they are labelled. Optional: without it they go to the operator's own
	// namespace, labelled hyperfleet.io/dns-provider=external-dns.
	// +optional
	ExternalDNS *ExternalDNSSettings `json:"externalDNS,omitempty"`

	// credentials selects the service's credentials by name: tsigKey for
	// rfc2136, a Secret key holding the TSIG key as BIND's key clause
	// (key "name" { algorithm hmac-sha256; secret "..."; };, as
	// tsig-keygen prints it) or as name:secret or algorithm:name:secret.
	// The external-dns types take none: external-dns holds the DNS
	// service's credentials.
	// +optional
	// +kubebuilder:validation:MaxItems=8
	// +listType=map
	// +listMapKey=name
	Credentials []NamedSecretKeySelector `json:"credentials,omitempty"`
}

// DNS transports of dynamic updates.
const (
	DNSTransportTCP = "tcp"
	DNSTransportUDP = "udp"
)

// RFC2136Settings are the DNS server VMs are registered on by dynamic
// update (RFC 2136) signed with TSIG (RFC 8945).
type RFC2136Settings struct {
	// server is the primary DNS server of the zones, as host:port (an IPv6
	// address in brackets), such as ns1.example.com:53 or [2001:db8::53]:53.
	// +required
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=261
	// +kubebuilder:validation:Pattern=`^(\[[0-9a-fA-F:.]+\]|[a-zA-Z0-9]([-a-zA-Z0-9.]*[a-zA-Z0-9])?):[0-9]{1,5}$`
	Server string `json:"server"`

	// transport is tcp (the default) or udp. Updates with several
	// addresses and a TSIG signature can outgrow a UDP message, and TCP
	// is not open to spoofed answers; zone transfers (the sweep) always
	// use TCP.
	// +optional
	// +kubebuilder:default=tcp
	// +kubebuilder:validation:Enum=tcp;udp
	Transport string `json:"transport,omitempty"`
}

// ExternalDNSSettings say where the DNSEndpoint objects of a cluster's VMs
// go, for external-dns to publish.
type ExternalDNSSettings struct {
	// namespace is where HyperFleet writes the cluster's DNSEndpoints, one
	// per VM; it must exist. Default: the operator's namespace. Keep it a
	// namespace only the platform team writes to: external-dns publishes
	// whatever DNSEndpoint it finds there, and HyperFleet trusts the
	// labels of the ones it wrote.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespace string `json:"namespace,omitempty"`

	// labelValue is the value of the label hyperfleet.io/dns-provider on
	// the cluster's DNSEndpoints (default external-dns), for an
	// external-dns run with --label-filter=hyperfleet.io/dns-provider=<labelValue>:
	// set it, such as route53, when several external-dns instances each
	// publish to their own DNS service.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	LabelValue string `json:"labelValue,omitempty"`
}

// NamedSecretKeySelector is a SecretKeySelector under a name that says what
// the value is.
type NamedSecretKeySelector struct {
	// name says what the value is for, such as accessKeyId.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-zA-Z][a-zA-Z0-9]*$`
	Name string `json:"name"`

	// secretKeyRef selects the value.
	// +required
	SecretKeyRef SecretKeySelector `json:"secretKeyRef"`
}

// HypervisorClusterStatus is what the operator observed of the cluster.
type HypervisorClusterStatus struct {
	// conditions are Ready, Connected, TLSVerified, TenancyRestricted, IsolationEnforced,
	// UnverifiedVMs, SPIREConnected and, with dns.dnsProvider, DNSReady.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// observedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// version is the hypervisor's software version, such as 9.2.1.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Version string `json:"version,omitempty"`

	// connectedNodes counts the allowed nodes that are online.
	// +optional
	ConnectedNodes int32 `json:"connectedNodes,omitempty"`

	// nodes is the capacity of each allowed node.
	// +optional
	// +kubebuilder:validation:MaxItems=128
	// +listType=map
	// +listMapKey=name
	Nodes []NodeStatus `json:"nodes,omitempty"`

	// availableResources is the free capacity over all online allowed
	// nodes: their CPUs, their free memory, and the free space of the
	// storages that hold VM disks (content images; a shared storage counted
	// once) minus what full clones being created are promised. Placement
	// uses the same free space: a VM whose boot disk does not fit on its
	// storage waits (reason InsufficientCapacity).
	// +optional
	AvailableResources *ResourceAmounts `json:"availableResources,omitempty"`

	// lastPollTime is when the operator last read the cluster's VM list.
	// +optional
	LastPollTime *metav1.Time `json:"lastPollTime,omitempty"`
}

// NodeState is a hypervisor node's state.
// +kubebuilder:validation:Enum=online;offline;unknown
type NodeState string

// NodeStatus is one hypervisor node's state and capacity.
type NodeStatus struct {
	// name is the node's name.
	// +required
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`

	// state is online, offline or unknown.
	// +required
	State NodeState `json:"state"`

	// capacity is the node's total CPU and memory.
	// +optional
	Capacity ResourceAmounts `json:"capacity,omitempty"`

	// allocated is what running VMs use, plus what the operator reserved for
	// VMs being created.
	// +optional
	Allocated ResourceAmounts `json:"allocated,omitempty"`
}

// ResourceAmounts is an amount of CPU, memory and storage.
type ResourceAmounts struct {
	// cpu is a number of logical CPUs.
	// +optional
	CPU int64 `json:"cpu,omitempty"`

	// memory is an amount of memory.
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`

	// storage is an amount of disk space.
	// +optional
	Storage *resource.Quantity `json:"storage,omitempty"`
}

// HypervisorCluster is a hypervisor (a Proxmox VE cluster) that HyperFleet
// creates VMs on: how to reach it, with which credentials, and where VMs go.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=hvc,categories=hyperfleet
// +kubebuilder:printcolumn:name="Provider",type=string,JSONPath=`.spec.provider`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.connectedNodes`
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.status.version`
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.spec.endpoint`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type HypervisorCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired connection and placement settings.
	// +required
	Spec HypervisorClusterSpec `json:"spec"`

	// status is what the operator observed.
	// +optional
	Status HypervisorClusterStatus `json:"status,omitempty"`
}

// HypervisorClusterList is a list of HypervisorCluster.
// +kubebuilder:object:root=true
type HypervisorClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []HypervisorCluster `json:"items"`
}

func init() {
	SchemeBuilder.Register(&HypervisorCluster{}, &HypervisorClusterList{})
}
