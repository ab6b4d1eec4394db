package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// ValidationFailurePolicy says what a failed validation does to a claim.
// +kubebuilder:validation:Enum=Report;FailClaim
type ValidationFailurePolicy string

const (
	// ValidationReport reports a failed check (the claim's NetworkValidated
	// condition, a warning event, the metrics) and leaves the claim running.
	ValidationReport ValidationFailurePolicy = "Report"
	// ValidationFailClaim also fails the claim: it ends as Failed and its VM
	// is released like that of any failed claim.
	ValidationFailClaim ValidationFailurePolicy = "FailClaim"
)

// Defaults of the validation settings; the CRD's default markers are the
// same numbers.
const (
	DefaultDNSValidationTimeoutSeconds     = 10
	DefaultNetworkValidationTimeoutSeconds = 30
	DefaultValidationInterval              = 5 * 60 // seconds
	DefaultSSHPort                         = 22
)

// DNSValidation checks each running VM's name in DNS from the operator: its
// FQDN must resolve to exactly its addresses at every configured DNS
// server (docs/networking.md, "DNS and network validation").
// +kubebuilder:validation:XValidation:rule="!has(self.validateInterval) || duration(self.validateInterval) == duration('0s') || (duration(self.validateInterval) >= duration('1m') && duration(self.validateInterval) <= duration('24h'))",message="dns.validation.validateInterval must be 0s (validate once) or between 1m and 24h",fieldPath=".validateInterval"
// +kubebuilder:validation:XValidation:rule="!has(self.validateOnReady) || self.validateOnReady || !has(self.validateInterval) || duration(self.validateInterval) > duration('0s')",message="dns.validation never validates with validateOnReady false and validateInterval 0s: set validateOnReady true or an interval"
type DNSValidation struct {
	// enabled turns the DNS checks on (default true once validation is
	// set).
	// +optional
	// +kubebuilder:default=true
	Enabled *bool `json:"enabled,omitempty"`

	// validateOnReady validates a claim as soon as its VM runs and reports
	// an address (default true); false waits validateInterval first. It
	// schedules every check of the claim, the network ones too.
	// +optional
	// +kubebuilder:default=true
	ValidateOnReady *bool `json:"validateOnReady,omitempty"`

	// validateInterval is how often a running claim is validated again
	// (default 5m; 0s validates once). It schedules every check of the
	// claim, the network ones too.
	// +optional
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	ValidateInterval *metav1.Duration `json:"validateInterval,omitempty"`

	// validateReverse also checks that each address's PTR record at every
	// server names the VM's FQDN.
	// +optional
	ValidateReverse bool `json:"validateReverse,omitempty"`

	// timeoutSeconds bounds each DNS query (default 10).
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=60
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`

	// onFailure is what a failed DNS check does: Report (default) or
	// FailClaim, which ends the claim as Failed.
	// +optional
	// +kubebuilder:default=Report
	OnFailure ValidationFailurePolicy `json:"onFailure,omitempty"`
}

// ClusterNetworkSettings are network settings for the VMs of a cluster.
// +kubebuilder:validation:XValidation:rule="!has(self.isolation) || (has(self.vmSubnets) && size(self.vmSubnets) > 0)",message="network.isolation needs network.vmSubnets: the subnets the VMs get their addresses in (an isolated VM may send only from its static addresses or a lease inside them, and no VM reaches them)",fieldPath=".vmSubnets"
type ClusterNetworkSettings struct {
	// vmSubnets are the subnets the cluster's VMs get their addresses in
	// (CIDRs, IPv4 or IPv6, such as 192.0.2.0/24 or 2001:db8:10::/64). An
	// address a VM's guest agent reports is registered in DNS
	// (dns.registerVMs) and probed by the validation only when it lies in
	// one of them: a guest can report any address, another VM's or an
	// internal service's. A VM's static addresses from an IPPool, which the
	// operator assigned itself, need no entry. Unset: only static addresses
	// are registered and probed, and a VM on DHCP is neither (its claim's
	// DNSRegistered and NetworkValidated conditions say so, reason
	// AddressOutsideVMSubnets).
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=49
	// +kubebuilder:validation:XValidation:rule="self.all(s, isCIDR(s))",message="each of network.vmSubnets must be a CIDR such as 192.0.2.0/24 or 2001:db8:10::/64"
	// +kubebuilder:validation:XValidation:rule="self.all(s, !isCIDR(s) || cidr(s).prefixLength() > 0)",message="network.vmSubnets must not hold 0.0.0.0/0 or ::/0, which would trust every address a guest reports: list the subnets the VMs get their addresses in"
	// +listType=set
	VMSubnets []string `json:"vmSubnets,omitempty"`

	// validation checks that each running VM answers from the operator's
	// network: ICMP echo and, optionally, an SSH server.
	// +optional
	Validation *NetworkValidation `json:"validation,omitempty"`

	// isolation holds the cluster's VMs to the platform team's network
	// policies, enforced by the hypervisor on each VM's interface: no VM
	// reaches another, the management networks or anything its policy
	// does not allow, nor sends from an address it was not given
	// (docs/networking.md, "Isolation"). Unset: VMs share their bridge
	// unfiltered, and the cluster's IsolationEnforced condition says so.
	// +optional
	Isolation *NetworkIsolation `json:"isolation,omitempty"`
}

// NetworkValidation checks each running VM's reachability from the
// operator (docs/networking.md, "DNS and network validation"). The checks
// run on the schedule of dns.validation (its defaults when unset).
// +kubebuilder:validation:XValidation:rule="(has(self.enabled) && !self.enabled) || !has(self.pingTest) || self.pingTest || (has(self.sshTest) && self.sshTest)",message="network.validation checks nothing with pingTest and sshTest both false: set one of them to true, or enabled: false"
type NetworkValidation struct {
	// enabled turns the network checks on (default true once validation
	// is set).
	// +optional
	// +kubebuilder:default=true
	Enabled *bool `json:"enabled,omitempty"`

	// pingTest sends ICMP echo requests to each of the VM's addresses
	// (default true). The operator needs an ICMP socket: see
	// docs/networking.md for the pod's ping_group_range or CAP_NET_RAW.
	// +optional
	// +kubebuilder:default=true
	PingTest *bool `json:"pingTest,omitempty"`

	// sshTest connects to sshPort on each of the VM's addresses and reads
	// the SSH server's host key (no login). A VM is validated as soon as
	// it reports an address, often before its SSH server has started, so
	// a refused or unanswered connection is tried again every second until
	// timeoutSeconds.
	// +optional
	SSHTest bool `json:"sshTest,omitempty"`

	// sshPort is the port sshTest connects to (default 22).
	// +optional
	// +kubebuilder:default=22
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	SSHPort int32 `json:"sshPort,omitempty"`

	// timeoutSeconds bounds each check of one address (default 30).
	// +optional
	// +kubebuilder:default=30
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=120
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`

	// onFailure is what a failed network check does: Report (default) or
	// FailClaim, which ends the claim as Failed.
	// +optional
	// +kubebuilder:default=Report
	OnFailure ValidationFailurePolicy `json:"onFailure,omitempty"`
}

// NetworkCheck names one kind of validation check.
// +kubebuilder:validation:Enum=forward;reverse;ping;ssh
type NetworkCheck string

const (
	// CheckForward: the FQDN's A and AAAA records at every server are
	// exactly the VM's addresses.
	CheckForward NetworkCheck = "forward"
	// CheckReverse: each address's PTR record at every server names the FQDN.
	CheckReverse NetworkCheck = "reverse"
	// CheckPing: each address answers ICMP echo.
	CheckPing NetworkCheck = "ping"
	// CheckSSH: an SSH server answers on each address with its host key.
	CheckSSH NetworkCheck = "ssh"
)

// NetworkCheckResult is the outcome of one kind of check.
type NetworkCheckResult struct {
	// check is the kind of check.
	// +required
	Check NetworkCheck `json:"check"`

	// passed is true when the check passed for every server and address.
	// +required
	Passed bool `json:"passed"`

	// message says what was checked and, on failure, what was wrong.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}

// NetworkValidationStatus is the outcome of a claim's last validation.
type NetworkValidationStatus struct {
	// lastValidated is when the last validation finished.
	// +optional
	LastValidated *metav1.Time `json:"lastValidated,omitempty"`

	// checks are the last validation's results, one per kind of check.
	// +optional
	// +kubebuilder:validation:MaxItems=4
	// +listType=map
	// +listMapKey=check
	Checks []NetworkCheckResult `json:"checks,omitempty"`
}
