package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IPPoolSpec is a set of static addresses handed out to VMs one at a time.
// Address entries take three forms, as in MetalLB: a CIDR (10.0.0.0/24, every
// address in it), a range of two addresses of one family (10.0.0.10-10.0.0.50,
// both included), or a single address written as /32 or /128.
// +kubebuilder:validation:XValidation:rule="!self.addresses.all(a, (a.contains('-') ? (size(a.split('-')) == 2 && isIP(a.split('-')[0]) && isIP(a.split('-')[1]) && ip(a.split('-')[0]).family() == ip(a.split('-')[1]).family()) : isCIDR(a))) || self.addresses.all(a, (a.contains('-') ? ip(a.split('-')[0]).family() : cidr(a).ip().family()) == (self.addresses[0].contains('-') ? ip(self.addresses[0].split('-')[0]).family() : cidr(self.addresses[0]).ip().family()))",message="all addresses of an IPPool must be of one IP family; create one pool per family"
// +kubebuilder:validation:XValidation:rule="!self.addresses.all(a, (a.contains('-') ? (size(a.split('-')) == 2 && isIP(a.split('-')[0]) && isIP(a.split('-')[1]) && ip(a.split('-')[0]).family() == ip(a.split('-')[1]).family()) : isCIDR(a))) || (self.addresses[0].contains('-') ? ip(self.addresses[0].split('-')[0]).family() : cidr(self.addresses[0]).ip().family()) == 6 || self.prefix <= 32",message="prefix must be at most 32 for an IPv4 pool"
// +kubebuilder:validation:XValidation:rule="!has(self.gateways) || !self.addresses.all(a, (a.contains('-') ? (size(a.split('-')) == 2 && isIP(a.split('-')[0]) && isIP(a.split('-')[1]) && ip(a.split('-')[0]).family() == ip(a.split('-')[1]).family()) : isCIDR(a))) || self.gateways.all(g, !isIP(g) || ip(g).family() == (self.addresses[0].contains('-') ? ip(self.addresses[0].split('-')[0]).family() : cidr(self.addresses[0]).ip().family()))",message="gateways must be of the same IP family as the pool's addresses"
type IPPoolSpec struct {
	// addresses are the address entries the pool hands out.
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=91
	// +kubebuilder:validation:XValidation:rule="self.all(a, (a.contains('-') ? (size(a.split('-')) == 2 && isIP(a.split('-')[0]) && isIP(a.split('-')[1]) && ip(a.split('-')[0]).family() == ip(a.split('-')[1]).family()) : isCIDR(a)))",message="each address must be a CIDR (10.0.0.0/24), a range of two addresses of one family (10.0.0.10-10.0.0.50), or a single address with /32 (IPv4) or /128 (IPv6)"
	// +listType=atomic
	Addresses []string `json:"addresses"`

	// excludedAddresses are never handed out, in the same forms as addresses
	// (for example the gateway or addresses used by hand).
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=91
	// +kubebuilder:validation:XValidation:rule="self.all(a, (a.contains('-') ? (size(a.split('-')) == 2 && isIP(a.split('-')[0]) && isIP(a.split('-')[1]) && ip(a.split('-')[0]).family() == ip(a.split('-')[1]).family()) : isCIDR(a)))",message="each excluded address must be a CIDR, a range of two addresses of one family (a-b), or a single address with /32 (IPv4) or /128 (IPv6)"
	// +listType=atomic
	ExcludedAddresses []string `json:"excludedAddresses,omitempty"`

	// prefix is the prefix length configured on the VM's interface with its
	// address, such as 24 (1 to 32 for IPv4, 1 to 128 for IPv6).
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=128
	Prefix int32 `json:"prefix"`

	// gateways are the default gateways of VMs using the pool.
	// +optional
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:items:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="self.all(g, isIP(g))",message="each gateway must be an IPv4 or IPv6 address"
	// +listType=atomic
	Gateways []string `json:"gateways,omitempty"`

	// nameservers are the DNS resolvers of VMs using the pool; they take
	// precedence over the cluster's and template's dns.servers.
	// +optional
	// +kubebuilder:validation:MaxItems=3
	// +kubebuilder:validation:items:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="self.all(s, isIP(s))",message="each nameserver must be an IPv4 or IPv6 address"
	// +listType=atomic
	Nameservers []string `json:"nameservers,omitempty"`

	// searchDomains are the DNS search domains of VMs using the pool.
	// +optional
	// +kubebuilder:validation:MaxItems=6
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +listType=atomic
	SearchDomains []string `json:"searchDomains,omitempty"`

	// allowedNamespaces selects the namespaces whose templates may take
	// addresses from this pool. Unset admits every namespace.
	// +optional
	AllowedNamespaces *metav1.LabelSelector `json:"allowedNamespaces,omitempty"`
}

// IPPoolStatus counts the pool's addresses.
type IPPoolStatus struct {
	// conditions are Ready and Exhausted.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// observedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// total counts the addresses the pool can hand out (entries minus
	// exclusions), capped at 2^63-1 for very large IPv6 pools.
	// +optional
	Total int64 `json:"total"`

	// allocated counts the addresses held by MachineClaims.
	// +optional
	Allocated int64 `json:"allocated"`

	// free counts the addresses left.
	// +optional
	Free int64 `json:"free"`
}

// IPPool is a cluster-wide set of static addresses for VMs whose template
// uses network mode static. An address belongs to at most one claim and is
// released only once that claim's VM is gone.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=hip,categories=hyperfleet
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Total",type=integer,JSONPath=`.status.total`
// +kubebuilder:printcolumn:name="Allocated",type=integer,JSONPath=`.status.allocated`
// +kubebuilder:printcolumn:name="Free",type=integer,JSONPath=`.status.free`
// +kubebuilder:printcolumn:name="Prefix",type=integer,JSONPath=`.spec.prefix`,priority=1
// +kubebuilder:printcolumn:name="Addresses",type=string,JSONPath=`.spec.addresses`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type IPPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the pool's addresses and network settings.
	// +required
	Spec IPPoolSpec `json:"spec"`

	// status counts the pool's addresses.
	// +optional
	Status IPPoolStatus `json:"status,omitempty"`
}

// IPPoolList is a list of IPPool.
// +kubebuilder:object:root=true
type IPPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IPPool `json:"items"`
}

func init() {
	SchemeBuilder.Register(&IPPool{}, &IPPoolList{})
}
