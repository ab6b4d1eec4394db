package v1alpha1

import "k8s.io/apimachinery/pkg/api/resource"

// LibvirtClusterSettings are the settings of a HypervisorCluster that only
// libvirt has (spec.libvirt, provider libvirt): the hosts whose libvirtd
// the operator speaks to, the storage pools and the network its VMs use.
// A qemu+tls host authenticates with spec.credentials.clientCert and
// verifies libvirtd's certificate with spec.tls.caBundleRef; a qemu+ssh
// host with ssh.
// +kubebuilder:validation:XValidation:rule="!has(self.ssh) || self.hosts.exists(h, h.uri.startsWith('qemu+ssh://'))",message="spec.libvirt.ssh is used only by qemu+ssh:// hosts: remove it or give a host a qemu+ssh:// uri",fieldPath=".ssh"
// +kubebuilder:validation:XValidation:rule="has(self.ssh) || !self.hosts.exists(h, h.uri.startsWith('qemu+ssh://'))",message="a qemu+ssh:// host needs spec.libvirt.ssh: set ssh.privateKeyRef and ssh.knownHostsRef",fieldPath=".ssh"
type LibvirtClusterSettings struct {
	// hosts are the libvirt hosts VMs are placed on.
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.all(h, self.exists_one(o, o.name == h.name))",message="spec.libvirt.hosts must not name a host twice"
	// +listType=atomic
	Hosts []LibvirtHost `json:"hosts"`

	// volumePool is the libvirt storage pool that receives the VMs' disks:
	// qcow2 overlays on the template's volume (linked clones, which need a
	// directory-like pool holding qcow2 volumes) or full copies.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9_][-_.a-zA-Z0-9]*$`
	VolumePool string `json:"volumePool"`

	// mediaPool is the storage pool that receives each VM's cloud-init ISO
	// (deleted once the guest is up). Unset: volumePool.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9_][-_.a-zA-Z0-9]*$`
	MediaPool string `json:"mediaPool,omitempty"`

	// network is the libvirt network of a VM's first interface when neither
	// its template (network.bridge) nor the cluster (spec.defaultBridge)
	// names a host bridge. Unset: the interface the template domain has.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9_][-_.a-zA-Z0-9]*$`
	Network string `json:"network,omitempty"`

	// fullCopies makes every clone a full copy of the template's disk
	// instead of a qcow2 overlay on it: for pools that cannot hold
	// overlays (logical, disk, iSCSI).
	// +optional
	FullCopies bool `json:"fullCopies,omitempty"`

	// ssh authenticates the operator to qemu+ssh:// hosts; required when a
	// host uses qemu+ssh, refused otherwise.
	// +optional
	SSH *LibvirtSSH `json:"ssh,omitempty"`
	// devices are the host PCI devices templates may pass through
	// (spec.hardware.devices), by mapping name: libvirt's counterpart of
	// Proxmox VE's PCI resource mappings. Entries sharing a name are one
	// mapping's devices; a VM asking for a device of it is placed on a
	// host with one that no other VM holds. The devices must be bound to
	// vfio-pci on their host (docs/templates.md, "GPU jobs").
	// +optional
	// +kubebuilder:validation:MaxItems=256
	// +listType=map
	// +listMapKey=host
	// +listMapKey=address
	Devices []LibvirtDevice `json:"devices,omitempty"`
}

// LibvirtDevice is one host PCI device of a device mapping.
type LibvirtDevice struct {
	// name is the mapping's name, as templates name it in
	// spec.hardware.devices[].mapping.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[a-zA-Z][-_a-zA-Z0-9]*$`
	Name string `json:"name"`

	// host is the spec.libvirt.hosts name of the host holding the device.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Host string `json:"host"`

	// address is the device's PCI address on the host, such as
	// 0000:01:00.0 (domain:bus:slot.function, lspci -D).
	// +required
	// +kubebuilder:validation:MaxLength=12
	// +kubebuilder:validation:Pattern=`^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$`
	Address string `json:"address"`
}

// LibvirtHost is one host whose libvirtd the operator speaks to.
// +kubebuilder:validation:XValidation:rule="self.uri.matches('^qemu[+](tls|ssh)://([^/?#@]+@)?[^/?#@:]+(:[0-9]+)?/system([?]socket=/[^&#]+)?$') || self.uri.matches('^qemu:///system[?]socket=/[^&#]+$')",message="spec.libvirt.hosts uri must be qemu+tls://host[:port]/system, qemu+ssh://[user@]host[:port]/system or qemu:///system?socket=/absolute/path",fieldPath=".uri"
type LibvirtHost struct {
	// name is the host's name in placement, in a VM's status (node) and in
	// spec.nodes: a DNS label, unique among the hosts.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// uri is how to reach the host's libvirtd: qemu+tls://host[:port]/system
	// (spec.credentials.clientCert, spec.tls.caBundleRef),
	// qemu+ssh://[user@]host[:port]/system (spec.libvirt.ssh) or
	// qemu:///system?socket=/path for a socket the operator's pod mounts.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	URI string `json:"uri"`

	// reservedMemory is memory placement keeps free on the host for its own
	// use, such as 4Gi. Unset: none.
	// +optional
	ReservedMemory *resource.Quantity `json:"reservedMemory,omitempty"`
}

// LibvirtSSH is the key the operator logs in to qemu+ssh hosts with and
// the host keys it trusts.
type LibvirtSSH struct {
	// privateKeyRef selects the PEM private key (unencrypted) the operator
	// logs in with.
	// +required
	PrivateKeyRef SecretKeySelector `json:"privateKeyRef"`

	// knownHostsRef selects known_hosts lines that verify the hosts' keys:
	// a host whose key is not among them is refused.
	// +required
	KnownHostsRef SecretKeySelector `json:"knownHostsRef"`
}

// LibvirtSource is a libvirt template: an inactive domain whose one disk
// is a volume of a storage pool, defined on every host that may run its
// clones (or only on host).
type LibvirtSource struct {
	// domain is the template domain's name (virsh list --all).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9]([-_a-zA-Z0-9.]*[a-zA-Z0-9])?$`
	Domain string `json:"domain"`

	// host, when set, is the only host (a spec.libvirt.hosts name) that
	// holds the template; clones are placed there. Unset: every host that
	// defines a domain of that name.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Host string `json:"host,omitempty"`
}
