package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ConditionType names a condition of a HyperFleet object (the Type of a
// metav1.Condition). Typed, so that a reason can never stand in for a type.
type ConditionType string

// ConditionReason is a condition's reason, also used as an event's reason.
type ConditionReason string

// FindCondition returns the condition of type t in conds, or nil.
func FindCondition(conds []metav1.Condition, t ConditionType) *metav1.Condition {
	return meta.FindStatusCondition(conds, string(t))
}

// IsConditionTrue reports whether conds has condition t with status True.
func IsConditionTrue(conds []metav1.Condition, t ConditionType) bool {
	return meta.IsStatusConditionTrue(conds, string(t))
}

// IsConditionFalse reports whether conds has condition t with status False.
func IsConditionFalse(conds []metav1.Condition, t ConditionType) bool {
	return meta.IsStatusConditionFalse(conds, string(t))
}

// HasReason reports whether c exists and has reason r.
func HasReason(c *metav1.Condition, r ConditionReason) bool { return c != nil && c.Reason == string(r) }

// Condition types. Every kind reports Ready; the others say which part of
// the work is or is not done so that `kubectl describe` explains a wait.
const (
	// ReadyCondition summarises an object: True when it is usable.
	ReadyCondition ConditionType = "Ready"

	// HypervisorClusterConnectedCondition is True when the operator reached
	// the hypervisor's API with the configured credentials and trust.
	HypervisorClusterConnectedCondition ConditionType = "Connected"
	// HypervisorClusterTLSVerifiedCondition is False when the cluster is
	// reached with certificate verification switched off (tls.insecureSkipVerify).
	HypervisorClusterTLSVerifiedCondition ConditionType = "TLSVerified"
	// HypervisorClusterTenancyRestrictedCondition is False while the
	// cluster admits every namespace (spec.allowedNamespaces unset or {})
	// or has no admin allow-lists (spec.tenancy unset): tenants then choose
	// bridges, VLANs, templates, storages and resource pools freely.
	HypervisorClusterTenancyRestrictedCondition ConditionType = "TenancyRestricted"
	// HypervisorClusterUnverifiedVMsCondition is True while VMs carry this
	// install's tag but an ownership block that does not verify (lost or
	// removed key, block copied from another cluster, edited or forged);
	// the operator never touches them (docs/security.md, "Ownership keys").
	HypervisorClusterUnverifiedVMsCondition ConditionType = "UnverifiedVMs"

	// HypervisorClusterSPIREConnectedCondition is True when the operator
	// reached the SPIRE Server API configured in spec.spire and read its
	// trust bundle; absent without spec.spire. It does not affect Ready:
	// only templates that attest with SPIRE need it.
	HypervisorClusterSPIREConnectedCondition ConditionType = "SPIREConnected"

	// HypervisorClusterDNSReadyCondition is True when the DNS service of
	// spec.dns.dnsProvider works as far as can be checked without a
	// change: for rfc2136, its server answered a query for each of its
	// zones signed with the configured key; for the external-dns types,
	// the DNSEndpoint CRD is installed and the operator may write
	// DNSEndpoints in their namespace. Absent without a dnsProvider. It does not
	// affect Ready: VMs are created and deleted whether their names can be
	// registered or not (docs/networking.md, "DNS registration").
	HypervisorClusterDNSReadyCondition ConditionType = "DNSReady"

	// HypervisorClusterIsolationEnforcedCondition is True when the
	// cluster's VMs are held to spec.network.isolation and the hypervisor
	// enforces it (for Proxmox VE, its datacenter firewall is enabled);
	// False while isolation is unset (reason NotConfigured) or the
	// hypervisor would not enforce it (reason NotEnforced). It does not
	// affect Ready: a VM built while it is False carries its rules and is
	// held to them once the firewall is on.
	HypervisorClusterIsolationEnforcedCondition ConditionType = "IsolationEnforced"

	// HypervisorMachineTemplateValidCondition is True when the template was
	// checked against its cluster: it sets no field the operator does not
	// act on, the source exists and is a template, the clone mode is
	// possible on its storage, referenced Secrets exist, and a VM's whole
	// cloud-init renders with placeholder credentials.
	HypervisorMachineTemplateValidCondition ConditionType = "Valid"
	// HypervisorMachineTemplateReusableCredentialCondition is True (a
	// warning) when the credential a VM of the template receives can serve
	// more than one job on the CI platform's side: a GitHub registration
	// token (bootstrap.method runner-token) of any scope, a GitLab runner
	// authentication token, a Buildkite agent token. Its message says what
	// the credential allows, what limits it and, where there is one, the
	// single-job method to use.
	HypervisorMachineTemplateReusableCredentialCondition ConditionType = "ReusableCredential"

	// RunnerPoolScalingCondition is True while the pool is changing size.
	RunnerPoolScalingCondition ConditionType = "Scaling"
	// RunnerPoolCapacityCondition is False when the pool cannot serve its
	// demand (at maxReplicas, cluster unavailable, addresses exhausted ...).
	RunnerPoolCapacityCondition ConditionType = "CapacityAvailable"
	// RunnerPoolScopeVerifiedCondition is True when the template's
	// credentials were shown to manage runners in the pool's scope
	// (repository or organization). Only such pools receive jobs and
	// create VMs; see docs/security.md.
	RunnerPoolScopeVerifiedCondition ConditionType = "ScopeVerified"
	// RunnerPoolReplacementBackoffCondition is True while the pool waits
	// before replacing claims that kept failing (docs/runnerpool.md).
	RunnerPoolReplacementBackoffCondition ConditionType = "ReplacementBackoff"
	// RunnerPoolWebhookSecretSharedCondition is True while the webhook
	// deliveries about the pool's owner are verified with the shared
	// fallback secret, which other owners hold too (docs/security.md,
	// "Webhook intake"); False when the owner has its own key, or when no
	// key verifies them (they are refused).
	RunnerPoolWebhookSecretSharedCondition ConditionType = "WebhookSecretShared"
	// RunnerPoolSchedulesValidCondition is False when a schedule of
	// spec.scaling.schedules cannot be used (its cron fields out of range,
	// an unknown time zone, no start in five years); that schedule opens no
	// window, the others work. Unset without schedules.
	RunnerPoolSchedulesValidCondition ConditionType = "SchedulesValid"
	// RunnerPoolStandbyCondition says whether the pool's standby tier
	// (spec.standby) is kept: True with its counts, False with why it is
	// not (StandbyUnsupported); absent for a pool without one.
	RunnerPoolStandbyCondition ConditionType = "Standby"
	// RunnerPoolListeningCondition is True while the leader's listener
	// holds a message session of the pool's runner scale set
	// (spec.workload.github.scaleSet) and so learns of its jobs without a
	// webhook; False with the reason it does not (ScaleSetInUse,
	// ScaleSetRefused, SessionConflict, ListenerFailed, ScopeNotVerified,
	// a refusal of the pool). Unset for a pool without a scale set.
	RunnerPoolListeningCondition ConditionType = "Listening"

	// MachineClaimProvisionedCondition is True once the VM exists, is
	// configured and has been started.
	MachineClaimProvisionedCondition ConditionType = "Provisioned"
	// MachineClaimBootstrappedCondition is True once the workload side
	// (a registered CI runner) reports the VM ready for work.
	MachineClaimBootstrappedCondition ConditionType = "Bootstrapped"
	// MachineClaimEndingCondition is True once the claim was asked to end
	// or began to: its reason says which step it is at (RunnerBusy while a
	// job keeps the VM, DeletingVM, VMDeleted, RetainedForDebugging,
	// Finished ...), and Ready is False with the same reason.
	MachineClaimEndingCondition ConditionType = "Ending"
	// MachineClaimAttestedCondition is True once the VM's spire-agent
	// attested to the SPIRE server with its join token; present only for
	// claims whose template attests (spec.attestation.method join-token).
	MachineClaimAttestedCondition ConditionType = "Attested"
	// MachineClaimStuckCondition is True when a claim has made no progress
	// in its current phase for longer than expected.
	MachineClaimStuckCondition ConditionType = "Stuck"
	// MachineClaimOwnershipVerifiedCondition is False when the VM recorded in
	// status does not carry this operator's valid ownership marker; such a
	// VM is never modified or destroyed.
	MachineClaimOwnershipVerifiedCondition ConditionType = "OwnershipVerified"
	// MachineClaimFinalizedCondition is True once the claim's VM was
	// released from HyperFleet's management without being deleted (a
	// platform admin's annotation hyperfleet.io/disown, reason Disowned):
	// the VM keeps running with its tags and ownership block stripped, and
	// nothing of HyperFleet touches it again. It never turns False.
	MachineClaimFinalizedCondition ConditionType = "Finalized"
	// MachineClaimDNSRegisteredCondition is True once the VM's name and
	// addresses are registered in its cluster's DNS service (the message
	// names them; with the external-dns types, once its DNSEndpoint is
	// written, which external-dns then publishes); False with the reason of the failure, which never holds
	// the VM back, or once the records were removed as the claim ended.
	// Present only on clusters with spec.dns.registerVMs.
	MachineClaimDNSRegisteredCondition ConditionType = "DNSRegistered"
	// MachineClaimNetworkValidatedCondition is True when the last
	// validation of the running VM passed (its FQDN resolves to its
	// addresses at every DNS server, its addresses answer ping and SSH, as
	// configured); False with the reason of the first failed check;
	// Unknown while the first validation runs. Present only on clusters
	// with spec.dns.validation or spec.network.validation; it does not
	// affect Ready unless onFailure is FailClaim, which fails the claim.
	MachineClaimNetworkValidatedCondition ConditionType = "NetworkValidated"

	// IPPoolExhaustedCondition is True when no address is left to allocate.
	IPPoolExhaustedCondition ConditionType = "Exhausted"
)

// Condition reasons. Every condition carries one.
const (
	// ReconcilingReason: the controller has not finished its first pass.
	ReconcilingReason ConditionReason = "Reconciling"
	// ReadyReason: everything the object needs is in place.
	ReadyReason ConditionReason = "Ready"
	// ScheduleInvalidReason: a RunnerPool's spec.scaling.schedules entry
	// cannot be used; the message names it and the error.
	ScheduleInvalidReason ConditionReason = "ScheduleInvalid"
	// ListeningReason: the listener holds the scale set's message session.
	ListeningReason ConditionReason = "Listening"
	// ListenerStartingReason: the listener is creating or adopting the
	// scale set and opening its session.
	ListenerStartingReason ConditionReason = "ListenerStarting"
	// ScaleSetInUseReason: an older RunnerPool names the same scale set of
	// the same scope; a scale set has one listener.
	ScaleSetInUseReason ConditionReason = "ScaleSetInUse"
	// ScaleSetRefusedReason: GitHub refused to create, adopt or update the
	// scale set (an unknown runner group, a name taken by a scale set of
	// another group, credentials that may not manage it).
	ScaleSetRefusedReason ConditionReason = "ScaleSetRefused"
	// SessionConflictReason: another listener (another install, or an
	// earlier leader whose session has not expired) holds the scale set's
	// message session; the listener waits for it.
	SessionConflictReason ConditionReason = "SessionConflict"
	// ListenerFailedReason: the listener stopped on an error and is
	// started again after a backoff.
	ListenerFailedReason ConditionReason = "ListenerFailed"
	// OrganizationRegistrationTokenReason: VMs receive a registration token
	// that registers any number of runners anywhere in an organization.
	//
	// Deprecated: no longer set; a reusable credential of any scope and
	// platform is MultiJobCredentialReason.
	OrganizationRegistrationTokenReason ConditionReason = "OrganizationRegistrationToken"
	// MultiJobCredentialReason: the credential a VM receives can serve more
	// than one job on the CI platform's side (the condition's message says
	// how, and what limits it).
	MultiJobCredentialReason ConditionReason = "MultiJobCredential"
	// SingleUseCredentialReason: VMs receive nothing reusable beyond their
	// own runner.
	SingleUseCredentialReason ConditionReason = "SingleUseCredential"

	// UnreachableReason: the hypervisor API did not answer.
	UnreachableReason ConditionReason = "Unreachable"
	// AuthenticationFailedReason: the hypervisor or GitHub refused the credentials.
	AuthenticationFailedReason ConditionReason = "AuthenticationFailed"
	// SecretNotFoundReason: a referenced Secret or key does not exist.
	SecretNotFoundReason ConditionReason = "SecretNotFound"
	// JobNotBindableReason: the claim names a job (Buildkite's
	// spec.workloadConfig.buildkite.jobID) that is not a queued job of its
	// own pool, or that the CI platform no longer offers; it gets no
	// credential.
	JobNotBindableReason ConditionReason = "JobNotBindable"
	// OwnershipNotVerifiedReason: VMs with this install's tag whose
	// ownership block does not verify exist (UnverifiedVMs True).
	OwnershipNotVerifiedReason ConditionReason = "OwnershipNotVerified"
	// AllVerifiedReason: every tagged VM checked has a verifying block
	// (UnverifiedVMs False).
	AllVerifiedReason ConditionReason = "AllVerified"
	// InsecureTLSReason: certificate verification is switched off by the user.
	InsecureTLSReason ConditionReason = "InsecureSkipVerify"
	// NamespaceNotAllowedReason: the cluster's allowedNamespaces excludes the object's namespace.
	NamespaceNotAllowedReason ConditionReason = "NamespaceNotAllowed"
	// NotAllowedByClusterReason: the template uses a bridge, VLAN, Proxmox
	// template, storage, resource pool, snippet, DNS domain or CI platform
	// API host that no spec.tenancy entry of its cluster allows to its
	// namespace (on a RunnerPool's ScopeVerified: its template's API host,
	// so the pool's scope is not checked there and the pool gets no job).
	NotAllowedByClusterReason ConditionReason = "NotAllowedByCluster"
	// RestrictedReason: the cluster admits selected namespaces only and
	// limits what they use (spec.allowedNamespaces and spec.tenancy).
	RestrictedReason ConditionReason = "Restricted"
	// AllNamespacesAdmittedReason: spec.allowedNamespaces is unset or {}.
	AllNamespacesAdmittedReason ConditionReason = "AllNamespacesAdmitted"
	// NoAllowListsReason: spec.tenancy is unset.
	NoAllowListsReason ConditionReason = "NoAllowLists"

	// IsolationActiveReason: the cluster's VMs are held to
	// spec.network.isolation and the hypervisor enforces it.
	IsolationActiveReason ConditionReason = "Enforced"
	// IsolationNotConfiguredReason: spec.network.isolation is unset, so
	// the cluster's VMs share their bridge unfiltered.
	IsolationNotConfiguredReason ConditionReason = "NotConfigured"
	// IsolationNotEnforcedReason: the hypervisor would not enforce the
	// VMs' isolation (Proxmox VE: the datacenter firewall, cluster.fw's
	// enable, is off; libvirt: a host lacks the clean-traffic filter).
	IsolationNotEnforcedReason ConditionReason = "NotEnforced"
	// IsolationPolicyNotFoundReason: a template names an isolation policy
	// its cluster does not define, or names one on a cluster without
	// spec.network.isolation.
	IsolationPolicyNotFoundReason ConditionReason = "IsolationPolicyNotFound"
	// IsolationUnsupportedReason: the VM's network cannot be isolated by
	// its hypervisor (such as a libvirt interface on QEMU's user-mode
	// network): the VM is not built open.
	IsolationUnsupportedReason ConditionReason = "IsolationUnsupported"

	// TemplateNotFoundReason: the hypervisor has no such template.
	TemplateNotFoundReason ConditionReason = "TemplateNotFound"
	// NotATemplateReason: the source VM is not marked as a template.
	NotATemplateReason ConditionReason = "NotATemplate"
	// LinkedCloneUnsupportedReason: the template's storage cannot hold linked clones.
	LinkedCloneUnsupportedReason ConditionReason = "LinkedCloneUnsupported"
	// IPPoolFamilyConflictReason: spec.network.ipPoolRefs names two IPPools
	// of one address family; a dual-stack VM takes one IPv4 and one IPv6
	// address.
	IPPoolFamilyConflictReason ConditionReason = "IPPoolFamilyConflict"
	// TemplateInvalidReason: the template fails validation for another reason.
	TemplateInvalidReason ConditionReason = "TemplateInvalid"
	// InvalidTLSReason: the CA bundle or fingerprint cannot be used.
	InvalidTLSReason ConditionReason = "InvalidTLS"
	// InvalidClientCertificateReason: spec.credentials.clientCert's Secret
	// holds no usable certificate, or a private key that does not match it.
	InvalidClientCertificateReason ConditionReason = "InvalidClientCertificate"
	// ClientCertificateRefusedReason: the TLS proxy in front of the
	// hypervisor API refused the client certificate, or got none.
	ClientCertificateRefusedReason ConditionReason = "ClientCertificateRefused"
	// InUseReason: a deleted HypervisorCluster, HypervisorMachineTemplate
	// or IPPool is still used by claims (VMs on the cluster, VMs built from
	// the template, addresses from the pool); it stays, Terminating, until
	// they are gone. The message names them.
	InUseReason ConditionReason = "InUse"
	// ClusterUnavailableReason: the referenced HypervisorCluster is not Ready.
	ClusterUnavailableReason ConditionReason = "ClusterUnavailable"
	// NotImplementedReason: the object names a workload type for which
	// this operator build registers no back-end (the operator binary
	// registers every type the API takes; a trimmed build may not), or
	// the hypervisor lacks an API call the operator needs. The object is
	// not Ready, and nothing is built from it, until that changes; the
	// condition's message names the field and the way out
	// (docs/troubleshooting.md).
	NotImplementedReason ConditionReason = "NotImplemented"
	// UnsupportedReason: the object sets a value the operator will not act
	// on in this combination (for example a Windows runner, which the
	// Linux-only agent cannot run). The message names the field and the fix.
	UnsupportedReason ConditionReason = "Unsupported"
	// DHCPClientUnsupportedReason: the template's spec.network.dhcp asks
	// for something (requestStaticLease, leaseTime, clientIdentifier
	// hostname) that the image's DHCP client (spec.network.dhcp.client)
	// cannot be configured to do through the operator's cloud-init.
	DHCPClientUnsupportedReason ConditionReason = "DHCPClientUnsupported"
	// SPIRENotConfiguredReason: the template attests with SPIRE but its
	// HypervisorCluster has no spec.spire.
	SPIRENotConfiguredReason ConditionReason = "SPIRENotConfigured"
	// TPMNotConfiguredReason: the template attests with its VMs' TPMs but
	// its cluster has no spec.spire.tpm (the EK CAs and the DevID CA).
	TPMNotConfiguredReason ConditionReason = "TPMNotConfigured"
	// TPMNotFoundReason (MachineClaim Attested False): the VM of a claim
	// whose template attests with its TPM has none; the claim fails.
	TPMNotFoundReason ConditionReason = "TPMNotFound"
	// TPMEnrollmentRefusedReason: the operator refused the TPM enrollment
	// of a claim's VM (a Warning event on the claim, with why), and, when
	// the VM's agent gave up on it, the Attested condition's reason as the
	// claim fails.
	TPMEnrollmentRefusedReason ConditionReason = "TPMEnrollmentRefused"
	// SPIREUnavailableReason: the operator cannot reach, or is not an
	// admin of, the SPIRE server of the cluster's spec.spire.
	SPIREUnavailableReason ConditionReason = "SPIREUnavailable"
	// JoinTokenTTLNotAllowedReason: the template's
	// spec.attestation.joinToken.ttl is outside its cluster's
	// spec.spire.joinTokenTTL bounds.
	JoinTokenTTLNotAllowedReason ConditionReason = "JoinTokenTTLNotAllowed"
	// BrokerUnavailableReason: the template attests with SPIRE and its
	// cluster has no spec.spire.secretStore, but this operator runs no
	// credential broker (its agent server is not configured) for the VM to
	// fetch its runner credential from.
	BrokerUnavailableReason ConditionReason = "BrokerUnavailable"
	// AttestationPendingReason: the VM's spire-agent has not attested yet.
	AttestationPendingReason ConditionReason = "AttestationPending"
	// AttestedReason: the VM's spire-agent attested.
	AttestedReason ConditionReason = "Attested"
	// AttestationFailedReason: the VM's spire-agent did not attest within
	// the cluster's spec.spire.attestationDeadline, or its join token
	// expired unused; the claim fails and its VM is destroyed.
	AttestationFailedReason ConditionReason = "AttestationFailed"
	// IdentityStolenReason: the VM's identity (its join token or its
	// X509-SVID) was used by someone other than the VM
	// (status.identity.misuse says how it was found). The claim fails
	// without a credential being handed out, and the SPIRE agent that
	// attested with the join token is evicted.
	IdentityStolenReason ConditionReason = "IdentityStolen"
	// JobUserCanEscalateReason: the VM's agent refused to run the job (its
	// power-off notice said so): the image's job user can become root and
	// the template's credential serves more than one job. The claim fails.
	JobUserCanEscalateReason ConditionReason = "JobUserCanEscalate"
	// GuestAgentRequiredReason: the VM's secrets (its runner credential,
	// or its SPIRE join token) reach only the running VM, through the
	// hypervisor's guest channel; its hypervisor template has none (for
	// Proxmox: no QEMU guest agent, agent: 1).
	GuestAgentRequiredReason ConditionReason = "GuestAgentRequired"
	// CredentialDeliveredReason: the VM's runner credential was placed in
	// the running VM through the hypervisor's guest channel; the claim
	// waits for its runner to come online.
	CredentialDeliveredReason ConditionReason = "CredentialDelivered"
	// CredentialNotDeliveredReason: the runner credential could not be
	// placed in the running VM yet (its guest not ready, the CI platform
	// or the hypervisor unavailable); retried.
	CredentialNotDeliveredReason ConditionReason = "CredentialNotDelivered"
	// CredentialStoredReason: the VM's runner credential is in the
	// cluster's secrets store (spec.spire.secretStore) for the VM to read
	// once; the claim waits for its runner to come online.
	CredentialStoredReason ConditionReason = "CredentialStored"
	// SecretStoreUnavailableReason: the cluster's secrets store could not
	// be reached or answered with a server error; retried with backoff.
	SecretStoreUnavailableReason ConditionReason = "SecretStoreUnavailable"
	// SecretStoreDeniedReason: the cluster's secrets store refused the
	// operator's request: its token (spec.spire.secretStore.tokenRef) or
	// the token's policy, or a setting of spec.spire.secretStore, is wrong.
	SecretStoreDeniedReason ConditionReason = "SecretStoreDenied"
	// CredentialIssueFailedReason: the CI platform did not issue the runner
	// credential the operator was to write to the secrets store; retried.
	CredentialIssueFailedReason ConditionReason = "CredentialIssueFailed"
	// AgentUnavailableReason: the template takes the agent from the
	// operator (bootstrap.agentSource Operator), but the operator serves no
	// agent binary for the template's runner os and arch, or its agent
	// server waits for the CA file VMs are to trust.
	AgentUnavailableReason ConditionReason = "AgentUnavailable"

	// MaxMachinesReachedReason: the cluster's spec.limits.maxMachines VMs
	// exist or are being created; a claim waits for one to be deleted.
	MaxMachinesReachedReason ConditionReason = "MaxMachinesReached"
	// QuotaExceededReason: placing the VM would take the claim's namespace
	// over a limit of its tenancy rule (spec.tenancy[].limits) on the
	// cluster; the claim waits until the namespace's usage falls.
	QuotaExceededReason ConditionReason = "QuotaExceeded"
	// InsufficientCapacityReason: no allowed node has the memory, or a
	// storage the room, for the VM; the claim waits for capacity.
	InsufficientCapacityReason ConditionReason = "InsufficientCapacity"

	// AtMaxReplicasReason: demand exceeds the pool's maxReplicas.
	AtMaxReplicasReason ConditionReason = "AtMaxReplicas"
	// InvalidSpecReason: an IPPool's spec cannot be parsed (overlapping or
	// malformed ranges); the message names the field.
	InvalidSpecReason ConditionReason = "InvalidSpec"
	// IPPoolExhaustedReason: no static address is left for a new VM.
	IPPoolExhaustedReason ConditionReason = "IPPoolExhausted"
	// RateLimitedReason: the CI platform's API rate limit holds work back.
	RateLimitedReason ConditionReason = "RateLimited"
	// DemandIncreasedReason and DemandDecreasedReason explain scaling.
	DemandIncreasedReason ConditionReason = "DemandIncreased"
	DemandDecreasedReason ConditionReason = "DemandDecreased"
	// StableReason: the pool has the size its demand needs.
	StableReason ConditionReason = "Stable"
	// ReplacingStaleReason: VMs built from an older template are being
	// replaced (template drift).
	ReplacingStaleReason ConditionReason = "ReplacingStaleVMs"
	// WaitingForTerminationReason: room under maxReplicas is held by VMs
	// still being destroyed.
	WaitingForTerminationReason ConditionReason = "WaitingForTermination"
	// WaitingForStandbyReason: room under maxReplicas that demand needs is
	// held by standby VMs still being built; each is taken for a job once
	// it is suspended.
	WaitingForStandbyReason ConditionReason = "WaitingForStandby"
	// StandbyUnsupportedReason: the pool's template is one whose VMs
	// cannot stand by yet (its VMs attest with SPIRE: their join token or
	// TPM enrollment is issued at the build, for the build); the pool keeps
	// no standby tier.
	StandbyUnsupportedReason ConditionReason = "StandbyUnsupported"
	// StandbyNotRefilledReason: the pool's standby tier is short of its
	// size because maxReplicas leaves no room beside its runners.
	StandbyNotRefilledReason ConditionReason = "StandbyNotRefilled"
	// TemplateNotReadyReason: the pool's template is missing or not valid.
	TemplateNotReadyReason ConditionReason = "TemplateNotReady"
	// RunnerOnlineReason: the VM's runner is registered and connected.
	RunnerOnlineReason ConditionReason = "RunnerOnline"
	// ScriptRunningReason: a generic VM (spec.bootstrap.generic) is up and
	// runs its template's script; it has no runner to come online.
	ScriptRunningReason ConditionReason = "ScriptRunning"
	// WaitingForJobReason: a warm VM of a platform that binds every VM to
	// one job (Buildkite) is up and stands by with no credential until its
	// RunnerPool binds it a queued job; the pool counts it as idle.
	WaitingForJobReason ConditionReason = "WaitingForJob"
	// SuspendingReason: a standby VM (spec.standby) is up and being
	// suspended to disk, with no credential.
	SuspendingReason ConditionReason = "Suspending"
	// StandingByReason: a standby VM is suspended to disk, with no
	// credential, until its RunnerPool takes it for a job.
	StandingByReason ConditionReason = "StandingBy"
	// ResumingReason: a VM taken from its pool's standby tier for a job is
	// being resumed; its addresses are read again and its credential
	// placed once its guest answers.
	ResumingReason ConditionReason = "Resuming"
	// StandbyFailedReason: the hypervisor refused for good to suspend a
	// standby VM or to resume it (the message says why); the claim fails
	// and its pool replaces it.
	StandbyFailedReason ConditionReason = "StandbyFailed"
	// RetainedReason: a failed VM is kept, stopped, for debugging.
	RetainedReason ConditionReason = "RetainedForDebugging"

	// BuildingVMReason: the claim's VM is being built: cloned, configured,
	// started, then waited for until its guest agent answers. The step in
	// flight is not written into the status (one write per hypervisor task
	// was most of a job's Kubernetes writes): it is in the operator's log
	// and, once the claim overstays its phase's bound, in the Stuck
	// condition.
	BuildingVMReason ConditionReason = "BuildingVM"
	// WaitingForRunnerReason: the VM is up; the claim waits for its
	// workload to report it ready.
	WaitingForRunnerReason ConditionReason = "WaitingForRunner"
	// ProvisioningFailedReason: the hypervisor refused or failed a step.
	ProvisioningFailedReason ConditionReason = "ProvisioningFailed"
	// OwnershipMismatchReason: the VM's ownership marker does not verify.
	OwnershipMismatchReason ConditionReason = "OwnershipMismatch"
	// RunnerBusyReason: the claim's runner is running a job; the VM stays
	// until the job ends.
	RunnerBusyReason ConditionReason = "RunnerBusy"
	// PhaseTimeoutReason: a claim stayed in one phase for too long.
	PhaseTimeoutReason ConditionReason = "PhaseTimeout"
	// ReservationRejectedReason: a claim's VM reservation annotation was
	// not trusted (its signature or its placement did not check out).
	ReservationRejectedReason ConditionReason = "ReservationRejected"
	// PlacementRecordRejectedReason: the record of what a claim's VM was
	// authorized to be (annotation hyperfleet.io/placement) is missing or
	// does not verify; the claim fails rather than build its VM from
	// values nobody authorized.
	PlacementRecordRejectedReason ConditionReason = "PlacementRecordRejected"

	// ScopeVerifiedReason: the credentials manage runners in the scope.
	ScopeVerifiedReason ConditionReason = "CredentialsReachScope"
	// ScopeNotReachableReason: the credentials cannot see the scope or
	// lack the runner permission there; the pool gets no job and no VM.
	ScopeNotReachableReason ConditionReason = "ScopeNotReachable"
	// ScopeCheckFailedReason: the scope could not be checked (the CI
	// platform was unavailable or rate-limited); it is checked again.
	ScopeCheckFailedReason ConditionReason = "ScopeCheckFailed"
	// ScopeNotVerifiedReason (CapacityAvailable): no VM is created until
	// ScopeVerified is True.
	ScopeNotVerifiedReason ConditionReason = "ScopeNotVerified"
	// AmbiguousJobRoutingReason (event): a job was covered by several
	// equally specific verified pools and none was scaled for it.
	AmbiguousJobRoutingReason ConditionReason = "AmbiguousJobRouting"

	// SharedWebhookSecretReason (WebhookSecretShared True): the owner's
	// deliveries verify with the shared fallback secret.
	SharedWebhookSecretReason ConditionReason = "SharedWebhookSecret"
	// OwnWebhookSecretReason (WebhookSecretShared False): the owner has
	// its own key.
	OwnWebhookSecretReason ConditionReason = "OwnWebhookSecret"
	// NoWebhookSecretReason (WebhookSecretShared False): no key verifies
	// the owner's deliveries; they are refused and only the resync
	// records its jobs.
	NoWebhookSecretReason ConditionReason = "NoWebhookSecret"

	// ConsecutiveFailuresReason (ReplacementBackoff True): the pool's last
	// claims failed before their runner came online; replacements wait.
	ConsecutiveFailuresReason ConditionReason = "ConsecutiveFailures"
	// NoRecentFailuresReason (ReplacementBackoff False).
	NoRecentFailuresReason ConditionReason = "NoRecentFailures"

	// Reasons a claim ends (MachineClaimEndRequest and MachineClaimEnd;
	// EndReason.ConditionReason maps one to the other).
	JobCompletedReason     ConditionReason = "JobCompleted"
	IdleTimeoutReason      ConditionReason = "IdleTimeout"
	MaxLifetimeReason      ConditionReason = "MaxLifetime"
	JobTimeoutReason       ConditionReason = "JobTimeout"
	BootstrapTimeoutReason ConditionReason = "BootstrapTimeout"
	DriftReplacedReason    ConditionReason = "DriftReplaced"
	ScaledDownReason       ConditionReason = "ScaledDown"
	// StandbyExpiredReason: a standby VM reached its pool's
	// standby.maxAge.
	StandbyExpiredReason ConditionReason = "StandbyExpired"
	OrphanedReason       ConditionReason = "Orphaned"
	DeletedReason        ConditionReason = "Deleted"
	// VMPoweredOffReason: the claim's VM powered off on its own.
	VMPoweredOffReason ConditionReason = "VMPoweredOff"
	// VMGoneReason: the claim's VM no longer exists on its cluster.
	VMGoneReason ConditionReason = "VMGone"
	// EndedReason: the claim ended for a reason this version does not name.
	EndedReason ConditionReason = "Ended"

	// Steps of a claim's way to its VM (Provisioned False) and out of it
	// (Ending True).
	// CreatedReason: the claim waits to be provisioned.
	CreatedReason ConditionReason = "Created"
	// QueuedReason: the VM waits for a clone slot, a clone retry, or a
	// clone at its VM id that it cannot yet tell is its own.
	QueuedReason ConditionReason = "Queued"
	// DeletingVMReason: the claim's VM is being destroyed.
	DeletingVMReason ConditionReason = "DeletingVM"
	// VMDeletedReason: the claim's VM was destroyed.
	VMDeletedReason ConditionReason = "VMDeleted"
	// FailedDeleteReason: destroying the claim's VM failed; it is retried.
	FailedDeleteReason ConditionReason = "FailedDelete"
	// RetainingReason: a failed VM is being made safe to keep.
	RetainingReason ConditionReason = "Retaining"
	// RunnerRemovedReason: the claim's runner was deregistered.
	RunnerRemovedReason ConditionReason = "RunnerRemoved"
	// RunnerNotRemovedReason: deregistering the claim's runner failed.
	RunnerNotRemovedReason ConditionReason = "RunnerNotRemoved"
	// RunnerStateUnknownReason: the claim's runner took a job and the CI
	// platform cannot be asked whether it still runs it.
	RunnerStateUnknownReason ConditionReason = "RunnerStateUnknown"
	// FinishedReason: the VM is gone; the claim is kept as history.
	FinishedReason ConditionReason = "Finished"

	// Reasons of a platform admin's actions on a claim (annotations
	// hyperfleet.io/force-delete and hyperfleet.io/disown; see
	// machineclaim_admin.go).
	// ForceDeletedReason (Ending True, and a warning event when the claim
	// goes): a platform admin force-deleted the claim; its VM is abandoned
	// without a call to the hypervisor, and its runner, identity and
	// addresses are released.
	ForceDeletedReason ConditionReason = "ForceDeleted"
	// DisowningReason (Ending True): the claim's VM is being released from
	// HyperFleet's management (its cloud-init media removed, then its tags
	// and ownership block stripped).
	DisowningReason ConditionReason = "Disowning"
	// DisownedReason (Finalized True, Provisioned False, and an event): the
	// claim's VM was released from HyperFleet's management and left as it
	// was; it is no longer HyperFleet's.
	DisownedReason ConditionReason = "Disowned"
	// FailedDisownReason (Ending True, and a warning event): releasing the
	// claim's VM from management failed; it is retried.
	FailedDisownReason ConditionReason = "FailedDisown"
	// AddressNotExcludedReason (Ending True, and a warning event): the
	// disowned VM keeps its static address, so the claim holds it until a
	// platform admin adds it to its IPPool's spec.excludedAddresses; the
	// message names the address and the pool.
	AddressNotExcludedReason ConditionReason = "AddressNotExcluded"
	// InvalidAdminAnnotationReason (a warning event): the annotation
	// hyperfleet.io/force-delete or hyperfleet.io/disown is set without a
	// usable reason (empty or too long) and is ignored.
	InvalidAdminAnnotationReason ConditionReason = "InvalidAdminAnnotation"

	// DNSServerUnreachableReason (DNSReady, DNSRegistered False): the DNS
	// server of spec.dns.dnsProvider did not answer in time, or refused the
	// connection.
	DNSServerUnreachableReason ConditionReason = "DNSServerUnreachable"
	// DNSRecordsRemovedReason (DNSRegistered False): the claim ended and
	// its records were removed.
	DNSRecordsRemovedReason ConditionReason = "DNSRecordsRemoved"
	// DNSRemoveAbandonedReason (DNSRegistered False, and a warning event):
	// the records of an ending claim could not be removed after a few
	// attempts; the claim went on without them and the DNS sweep removes
	// them once the DNS server takes updates again.
	DNSRemoveAbandonedReason ConditionReason = "DNSRemoveAbandoned"
	// DNSNotRegisteredReason (DNSRegistered False): the VM has no address
	// or name to register yet.
	DNSNotRegisteredReason ConditionReason = "DNSNotRegistered"
	// AddressOutsideVMSubnetsReason (DNSRegistered, NetworkValidated
	// False): the VM has no address the operator may vouch for: no static
	// address of its own, and none of the addresses its guest agent reports
	// is in the cluster's spec.network.vmSubnets. Nothing is registered or
	// probed; the message names the addresses left out.
	AddressOutsideVMSubnetsReason ConditionReason = "AddressOutsideVMSubnets"

	// ValidatingReason (NetworkValidated Unknown): the claim's first
	// validation is running.
	ValidatingReason ConditionReason = "Validating"
	// NetworkValidatedReason (NetworkValidated True): every configured
	// check passed.
	NetworkValidatedReason ConditionReason = "Validated"
	// ValidationNotPossibleReason (NetworkValidated False): a DNS check is
	// configured but the VM has no FQDN (no dns.domain) or the cluster
	// configures no DNS server (spec.dns.servers; a template's
	// network.dns.servers are its VMs' resolvers only, never checked).
	ValidationNotPossibleReason ConditionReason = "ValidationNotPossible"
	// DNSLookupFailedReason (NetworkValidated False): a DNS server did not
	// answer, or its A and AAAA records of the FQDN are not exactly the
	// VM's addresses.
	DNSLookupFailedReason ConditionReason = "DNSLookupFailed"
	// ReverseLookupMismatchReason (NetworkValidated False): a DNS server's
	// PTR record of one of the VM's addresses is missing or names another
	// host (dns.validation.validateReverse).
	ReverseLookupMismatchReason ConditionReason = "ReverseLookupMismatch"
	// PingFailedReason (NetworkValidated False): an address of the VM did
	// not answer ICMP echo within network.validation.timeoutSeconds.
	PingFailedReason ConditionReason = "PingFailed"
	// PingNotPermittedReason (NetworkValidated False): the operator may not
	// open an ICMP socket (neither net.ipv4.ping_group_range covers its
	// group nor does it have CAP_NET_RAW).
	PingNotPermittedReason ConditionReason = "PingNotPermitted"
	// SSHUnreachableReason (NetworkValidated False): no SSH server
	// answered with its host key on network.validation.sshPort of an
	// address of the VM.
	SSHUnreachableReason ConditionReason = "SSHUnreachable"
	// NetworkValidationFailedReason (Ending True, and a warning event): a
	// validation failed on a cluster whose onFailure is FailClaim; the
	// claim ended as Failed.
	NetworkValidationFailedReason ConditionReason = "NetworkValidationFailed"

	// NoProgressReason (Stuck True): the claim stayed in its phase longer
	// than the manager's bound for that phase.
	NoProgressReason ConditionReason = "NoProgress"
	// ProgressingReason (Stuck False).
	ProgressingReason ConditionReason = "Progressing"
)

// Standard labels and annotations stamped on every object the operator
// creates, so that ownership can be traced with a label selector.
const (
	// ManagedByLabel marks objects created by HyperFleet; its value is ManagedByValue.
	ManagedByLabel = "hyperfleet.io/managed-by"
	// ManagedByValue is the value of ManagedByLabel.
	ManagedByValue = "hyperfleet"
	// RunnerPoolLabel names the RunnerPool a MachineClaim belongs to.
	RunnerPoolLabel = "hyperfleet.io/runner-pool"
	// MachineTemplateLabel names the HypervisorMachineTemplate a claim was built from.
	MachineTemplateLabel = "hyperfleet.io/machine-template"
	// HypervisorClusterLabel names the HypervisorCluster a claim's VM lives on.
	HypervisorClusterLabel = "hyperfleet.io/hypervisor-cluster"
	// TemplateHashLabel carries the template hash a claim was built from.
	TemplateHashLabel = "hyperfleet.io/template-hash"
	// FinishedLabel marks a claim whose VM and everything else it held
	// are released, its finalizer removed: it goes with the next
	// collection deletion of its namespace's finished claims. Its value
	// is FinishedLabelValue.
	FinishedLabel = "hyperfleet.io/finished"
	// FinishedLabelValue is the value of FinishedLabel.
	FinishedLabelValue = "true"
	// CIJobStateLabel mirrors a CIJob's status.state so that controllers can
	// select the jobs still waiting for a runner.
	CIJobStateLabel = "hyperfleet.io/job-state"

	// VMReservationAnnotation is where an earlier operator recorded the
	// VM a claim was about to create, as
	// "<HypervisorCluster>/<node>/<signature>/<provider ID>", in its one
	// write before the clone request. This operator stores status.vmRef in
	// that write instead (with status.placementRecord), and reads the
	// annotation of the claims an earlier one placed: only while
	// status.vmRef is still empty (that operator stopped between the clone
	// request and its status write), so that a clone is continued, never
	// repeated. It is trusted only when the signature (an HMAC with the
	// install's ownership key over the claim's UID, cluster, node and VM
	// id) verifies and the VM is one placement could have chosen for the
	// claim; see docs/security.md.
	VMReservationAnnotation = "hyperfleet.io/vm-reservation"
	// PlacementAnnotation is where an earlier operator recorded a claim's
	// placement record, now status.placementRecord (what the claim's VM
	// was authorized to be, signed); it is read for the claims such an
	// operator placed, with the same checks. See docs/security.md, "The
	// placement record".
	PlacementAnnotation = "hyperfleet.io/placement"

	// MachineClaimFinalizer holds a claim until its VM and everything
	// allocated for it are gone.
	MachineClaimFinalizer = "hyperfleet.io/vm-cleanup"
	// HypervisorClusterFinalizer holds a cluster until no claim has a VM on
	// it, so deleting a cluster never strands VMs the operator can no
	// longer reach.
	HypervisorClusterFinalizer = "hyperfleet.io/vms-released"
	// HypervisorMachineTemplateFinalizer holds a template until no claim
	// that began to use it (a VM placed, reserved or still to be torn down)
	// is left, so that deleting a template never leaves a claim without the
	// cloud-init and credentials its VM and runner need.
	HypervisorMachineTemplateFinalizer = "hyperfleet.io/claims-released"
	// IPPoolFinalizer holds an IPPool until no claim records an address
	// from it: an address is free again only once its VM is gone.
	IPPoolFinalizer = "hyperfleet.io/addresses-released"
)
