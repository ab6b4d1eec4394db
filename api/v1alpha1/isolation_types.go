package v1alpha1

// DefaultIsolationPolicy is the policy a cluster's VMs get when
// spec.network.isolation names no defaultPolicy, and the one a cluster
// has even when it defines no policy of that name: egress anywhere but
// the management networks and the other VMs.
const DefaultIsolationPolicy = "default"

// NetworkIsolation holds a cluster's VMs to network policies the platform
// team owns, enforced by the hypervisor itself (Proxmox VE's firewall,
// libvirt's nwfilter) on each VM's network interface, outside the guest:
// a job in a VM is hostile and does what it wants inside it
// (docs/networking.md, "Isolation"). Once it is set, every VM the
// operator builds on the cluster is isolated: by the policy its template
// names (spec.network.isolationPolicy), else by defaultPolicy.
//
// Every policy denies, whatever it allows: other VMs (vmSubnets and the
// VMs' IPPools), managementCIDRs, any source address or MAC address the VM
// was not given, and every connection into the VM but the operator's
// checks (from operatorCIDRs). Every policy allows DNS, the template's
// HTTP proxy, the operator's agent server and credential broker (at
// operatorCIDRs) and, for templates that attest, the cluster's SPIRE
// server (spec.spire).
// +kubebuilder:validation:XValidation:rule="!has(self.defaultPolicy) || self.defaultPolicy == 'default' || (has(self.policies) && self.policies.exists(p, p.name == self.defaultPolicy))",message="network.isolation.defaultPolicy names no policy of network.isolation.policies: add the policy, or set defaultPolicy to one listed (or default, the built-in policy)",fieldPath=".defaultPolicy"
type NetworkIsolation struct {
	// operatorCIDRs are the addresses VMs reach the operator at (its agent
	// server and credential broker, usually a load balancer's or a node's
	// address) and the operator's checks come from (network validation's
	// ping and SSH): the only addresses a VM may connect to on the agent
	// server's port, and the only ones that may connect into a VM.
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=49
	// +kubebuilder:validation:XValidation:rule="self.all(s, isCIDR(s) || isIP(s))",message="each of network.isolation.operatorCIDRs must be an address or a CIDR, such as 192.0.2.5 or 192.0.2.0/28"
	// +listType=set
	OperatorCIDRs []string `json:"operatorCIDRs"`

	// managementCIDRs are networks no VM may reach, whatever its policy
	// allows: the hypervisors' management addresses, the Kubernetes API,
	// storage and backup networks. Checked before every policy's egress.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=49
	// +kubebuilder:validation:XValidation:rule="self.all(s, isCIDR(s) || isIP(s))",message="each of network.isolation.managementCIDRs must be an address or a CIDR, such as 10.0.0.0/24"
	// +listType=set
	ManagementCIDRs []string `json:"managementCIDRs,omitempty"`

	// defaultPolicy is the policy of templates that name none (default:
	// default, the built-in policy that allows egress anywhere but the
	// denied networks, unless policies defines one of that name).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	DefaultPolicy string `json:"defaultPolicy,omitempty"`

	// policies are the named policies templates choose from
	// (spec.network.isolationPolicy), within what spec.tenancy allows
	// their namespace (isolationPolicies).
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +listType=map
	// +listMapKey=name
	Policies []IsolationPolicy `json:"policies,omitempty"`
}

// IsolationPolicy is what a VM may connect to besides what every policy
// allows (DNS, the proxy, the operator).
type IsolationPolicy struct {
	// name identifies the policy in templates and tenancy rules.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// egress are the destinations the VMs may open connections to, after
	// the denied networks: a policy without egress reaches only DNS, its
	// proxy and the operator.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	Egress []EgressRule `json:"egress,omitempty"`
}

// IsolationProtocol is the protocol an egress rule allows.
// +kubebuilder:validation:Enum=TCP;UDP;ICMP;Any
type IsolationProtocol string

// The protocols of an EgressRule.
const (
	IsolationTCP  IsolationProtocol = "TCP"
	IsolationUDP  IsolationProtocol = "UDP"
	IsolationICMP IsolationProtocol = "ICMP"
	IsolationAny  IsolationProtocol = "Any"
)

// EgressRule allows connections to networks, by protocol and port.
// +kubebuilder:validation:XValidation:rule="!has(self.ports) || size(self.ports) == 0 || self.protocol == 'TCP' || self.protocol == 'UDP'",message="egress ports need protocol TCP or UDP: remove ports, or set the protocol"
type EgressRule struct {
	// cidrs are the destinations: addresses or networks, IPv4 or IPv6
	// (0.0.0.0/0 and ::/0 for anywhere).
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=49
	// +kubebuilder:validation:XValidation:rule="self.all(s, isCIDR(s) || isIP(s))",message="each egress cidrs entry must be an address or a CIDR, such as 203.0.113.0/24 or 0.0.0.0/0"
	// +listType=set
	CIDRs []string `json:"cidrs"`

	// protocol is TCP (default), UDP, ICMP or Any.
	// +optional
	// +kubebuilder:default=TCP
	Protocol IsolationProtocol `json:"protocol,omitempty"`

	// ports are destination ports or ranges, such as 443 or 8000-8100;
	// empty allows every port. TCP and UDP only.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=11
	// +kubebuilder:validation:items:Pattern=`^[0-9]{1,5}(-[0-9]{1,5})?$`
	// +listType=atomic
	Ports []string `json:"ports,omitempty"`
}
