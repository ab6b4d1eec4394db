package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MachineClaimSpec asks for one single-use VM.
// +kubebuilder:validation:XValidation:rule="has(self.runnerPoolRef) == has(oldSelf.runnerPoolRef)",message="spec.runnerPoolRef is immutable: it cannot be added or removed after creation"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.end) || has(self.end)",message="spec.end cannot be removed once set: the claim is already ending; delete the claim instead"
// +kubebuilder:validation:XValidation:rule="!has(self.standby) || !self.standby || has(self.runnerPoolRef)",message="spec.standby needs spec.runnerPoolRef: only a RunnerPool resumes a standby VM for a job; remove spec.standby"
// +kubebuilder:validation:XValidation:rule="!has(self.standby) || !self.standby || (has(oldSelf.standby) && oldSelf.standby)",message="spec.standby can only be cleared: a claim resumed from the standby tier does not go back to it"
type MachineClaimSpec struct {
	// templateRef names the HypervisorMachineTemplate, in this namespace,
	// the VM is built from. Immutable.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.templateRef is immutable: delete the claim and create a new one"
	TemplateRef ObjectName `json:"templateRef"`

	// runnerPoolRef names the RunnerPool, in this namespace, that created
	// the claim; unset for a claim made by hand. Immutable.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.runnerPoolRef is immutable"
	RunnerPoolRef *ObjectName `json:"runnerPoolRef,omitempty"`

	// workloadConfig is the CI runner this VM runs. Unset: the platform of
	// the template's spec.bootstrap section (a GitHub Actions runner of its
	// repository or organization, with its pool's labels; or, for
	// bootstrap.generic, its script). The type must be the platform of
	// the template's spec.bootstrap section (generic needs
	// bootstrap.generic, gitlab-ci bootstrap.gitlab, buildkite
	// bootstrap.buildkite); otherwise the claim waits, reason InvalidSpec,
	// and no VM is created.
	// +optional
	WorkloadConfig *WorkloadConfig `json:"workloadConfig,omitempty"`

	// end is the claim's RunnerPool asking the claim to end: its runner is
	// removed (waiting while it runs a job, unless the reason is a hard
	// limit), then its VM is destroyed. Written by the operator only (the
	// admission policy in config/admission refuses anyone else); to end a
	// claim by hand, delete it. It may be changed (a hard limit overtakes
	// a soft reason) but not removed.
	// +optional
	End *MachineClaimEndRequest `json:"end,omitempty"`

	// standby puts the claim's VM in its RunnerPool's standby tier: it is
	// built and booted as any VM, then suspended to disk with no
	// credential, and waits. Its RunnerPool clears the field to take the
	// VM for a job: the VM is resumed, made fresh, and given its
	// credential then. Written by the operator only (its RunnerPool sets
	// it at creation and clears it once); it cannot be set again.
	// +optional
	Standby bool `json:"standby,omitempty"`
}

// MachineClaimEndRequest is a RunnerPool's request that one of its claims
// end.
type MachineClaimEndRequest struct {
	// reason is why the pool ends the claim; it becomes the runner's
	// outcome (hyperfleet_runner_outcomes_total). max_lifetime and
	// job_timeout are hard limits: they do not wait for a busy runner (the
	// pool cancelled its job first).
	// +required
	// +kubebuilder:validation:Enum=job_completed;idle_timeout;max_lifetime;job_timeout;bootstrap_timeout;drift_replaced;scaled_down;orphaned;standby_expired
	Reason EndReason `json:"reason"`

	// message explains the reason to people.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`

	// fail ends the claim as Failed instead of Terminating: its VM is kept
	// stopped for debugging when the pool retains failed VMs
	// (spec.lifecycle.failedRetention), and the failure counts towards the
	// pool's replacement backoff.
	// +optional
	Fail bool `json:"fail,omitempty"`

	// requestedAt is when the pool asked.
	// +required
	RequestedAt metav1.Time `json:"requestedAt"`
}

// MachineClaimEnd records how a claim ended, once it began to.
type MachineClaimEnd struct {
	// reason is why the claim ended.
	// +required
	Reason EndReason `json:"reason"`

	// message explains the reason to people.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`

	// failed is true when the claim failed (provisioning failed for good,
	// the VM's ownership did not verify, or its pool failed it): a failed
	// claim keeps its VM stopped when its pool retains failed VMs.
	// +optional
	Failed bool `json:"failed,omitempty"`

	// startedAt is when the claim began to end.
	// +required
	StartedAt metav1.Time `json:"startedAt"`

	// finishedAt is when the claim's VM was gone and the claim was kept as
	// history (its pool's spec.lifecycle.history); unset otherwise.
	// +optional
	FinishedAt *metav1.Time `json:"finishedAt,omitempty"`
}

// WorkloadConfig is the CI runner of one VM.
// +kubebuilder:validation:XValidation:rule="self.type != 'github-actions' || has(self.github)",message="workloadConfig.type github-actions needs workloadConfig.github"
// +kubebuilder:validation:XValidation:rule="self.type == 'github-actions' || !has(self.github)",message="workloadConfig.github applies only to workloadConfig.type github-actions"
// +kubebuilder:validation:XValidation:rule="self.type == 'gitlab-ci' || !has(self.gitlab)",message="workloadConfig.gitlab applies only to workloadConfig.type gitlab-ci"
// +kubebuilder:validation:XValidation:rule="self.type == 'buildkite' || !has(self.buildkite)",message="workloadConfig.buildkite applies only to workloadConfig.type buildkite"
type WorkloadConfig struct {
	// type is the CI platform: github-actions, gitlab-ci, buildkite or
	// generic.
	// +required
	Type WorkloadType `json:"type"`

	// github is the GitHub Actions runner of this VM.
	// +optional
	GitHub *GitHubRunnerConfig `json:"github,omitempty"`

	// buildkite is the Buildkite agent of this VM; unset takes its pool's
	// queue and tags.
	// +optional
	Buildkite *BuildkiteAgentConfig `json:"buildkite,omitempty"`

	// gitlab is the GitLab CI runner of this VM; unset takes its pool's
	// tags and the template's runUntagged.
	// +optional
	GitLab *GitLabRunnerConfig `json:"gitlab,omitempty"`
}

// GitLabRunnerConfig is one GitLab runner. Its description on GitLab is the
// claim's name.
type GitLabRunnerConfig struct {
	// tags are the runner's tags; empty for its pool's.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:Pattern=`^[^,\s]+$`
	// +listType=set
	Tags []string `json:"tags,omitempty"`

	// runUntagged lets the runner take jobs without tags; defaults to its
	// pool's, else the template's.
	// +optional
	RunUntagged *bool `json:"runUntagged,omitempty"`
}

// GitHubRunnerConfig is one GitHub Actions runner.
type GitHubRunnerConfig struct {
	// runnerName is the runner's name on GitHub; defaults to the claim's
	// name. Unique within the repository or organization.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9._-]+$`
	RunnerName string `json:"runnerName,omitempty"`

	// labels are the runner's labels; self-hosted and hyperfleet are added.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:Pattern=`^[^,\s]+$`
	// +listType=set
	Labels []string `json:"labels,omitempty"`

	// runnerGroup is the organization runner group the runner joins.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=100
	RunnerGroup string `json:"runnerGroup,omitempty"`
}

// MachineClaimPhase is a one-word summary of a claim's state for display.
// Controllers decide on conditions and status fields, never on the phase.
// +kubebuilder:validation:Enum=Pending;Provisioning;Standby;Bootstrapping;Ready;Draining;Terminating;Failed;Finished
type MachineClaimPhase string

const (
	// MachineClaimPending: accepted, waiting for capacity or prerequisites.
	MachineClaimPending MachineClaimPhase = "Pending"
	// MachineClaimProvisioning: the VM is being cloned, configured, started.
	MachineClaimProvisioning MachineClaimPhase = "Provisioning"
	// MachineClaimStandby: the VM is in its pool's standby tier,
	// suspended to disk (or being suspended), with no credential.
	MachineClaimStandby MachineClaimPhase = "Standby"
	// MachineClaimBootstrapping: the guest is up; its runner is registering.
	MachineClaimBootstrapping MachineClaimPhase = "Bootstrapping"
	// MachineClaimReady: the runner is registered (idle or running a job).
	MachineClaimReady MachineClaimPhase = "Ready"
	// MachineClaimDraining: no new job will be taken; waiting for the current one.
	MachineClaimDraining MachineClaimPhase = "Draining"
	// MachineClaimTerminating: the VM and what was allocated for it are being removed.
	MachineClaimTerminating MachineClaimPhase = "Terminating"
	// MachineClaimFailed: the claim cannot succeed; see its conditions.
	MachineClaimFailed MachineClaimPhase = "Failed"
	// MachineClaimFinished: the VM is gone; the claim is kept as history
	// (its RunnerPool's spec.lifecycle.history) and then deleted.
	MachineClaimFinished MachineClaimPhase = "Finished"
)

// RunnerState is a runner's state on the CI platform as last observed.
// +kubebuilder:validation:Enum=offline;idle;busy
type RunnerState string

const (
	// RunnerStateOffline: registered but not connected (not started yet).
	RunnerStateOffline RunnerState = "offline"
	// RunnerStateIdle: connected, waiting for a job.
	RunnerStateIdle RunnerState = "idle"
	// RunnerStateBusy: running a job.
	RunnerStateBusy RunnerState = "busy"
)

// MachineClaimStatus is the state of the claim's VM.
type MachineClaimStatus struct {
	// phase summarises the claim's state for display. It is derived from
	// the other fields at the end of every reconcile (end, the conditions,
	// vmRef); nothing decides anything from it.
	// +optional
	Phase MachineClaimPhase `json:"phase,omitempty"`

	// conditions are Ready (summarised from the others), Provisioned,
	// Bootstrapped, Ending, OwnershipVerified, Stuck, DNSRegistered (on a
	// cluster with dns.registerVMs), NetworkValidated (on a cluster with
	// dns.validation or network.validation) and, once a platform admin disowned the
	// claim's VM, Finalized.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// observedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// vmRef is the VM made for this claim. It is written before the
	// operator waits on the hypervisor, so a restart never makes a second VM.
	// +optional
	VMRef *VMReference `json:"vmRef,omitempty"`

	// placementRecord is what the claim's VM was authorized to be when it
	// was placed (the hypervisor template, clone mode, storage, network,
	// resources, cloud-init files and DNS domain the cluster's allow-lists
	// admitted), as signed JSON, written with reservation. Every later
	// step builds the VM from it rather than from the template's current
	// values; a claim whose record does not verify fails. It is written
	// with vmRef in the one status write before the clone request. Claims
	// placed by an earlier operator carry it in the hyperfleet.io/placement
	// annotation instead.
	// +optional
	// +kubebuilder:validation:MaxLength=8192
	PlacementRecord string `json:"placementRecord,omitempty"`

	// task was the hypervisor task in flight for this claim. The operator
	// no longer writes it (one status write per hypervisor task): it keeps
	// the task in memory, and after a restart the provider reads where the
	// VM stands. A task an older operator wrote is followed once and
	// cleared by the next status write. The task in flight is in the
	// operator's log and, for a stuck claim, in the Stuck condition.
	// +optional
	Task *TaskReference `json:"task,omitempty"`

	// network is the VM's addressing.
	// +optional
	Network *MachineNetworkStatus `json:"network,omitempty"`

	// bootstrap is the VM's runner and identity.
	// +optional
	Bootstrap *BootstrapStatus `json:"bootstrap,omitempty"`

	// identity is the VM's SPIFFE identity and its issuance, for templates
	// with spec.attestation.method join-token.
	// +optional
	Identity *IdentityStatus `json:"identity,omitempty"`

	// networkValidation is the outcome of the last DNS and network
	// validation of a running VM, on clusters with spec.dns.validation or
	// spec.network.validation.
	// +optional
	NetworkValidation *NetworkValidationStatus `json:"networkValidation,omitempty"`

	// templateHash is the template hash the VM was built from.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	TemplateHash string `json:"templateHash,omitempty"`

	// phaseTimes records when the claim entered each phase.
	// +optional
	PhaseTimes *PhaseTimes `json:"phaseTimes,omitempty"`

	// end records how the claim ended, once it began to.
	// +optional
	End *MachineClaimEnd `json:"end,omitempty"`

	// standby is the VM's time in its pool's standby tier; unset for a VM
	// that never stood by.
	// +optional
	Standby *StandbyStatus `json:"standby,omitempty"`

	// terminationReason says why the VM is being or was removed, for
	// display (status.end holds the same as typed fields): a code
	// (job_completed, idle_timeout, max_lifetime, job_timeout,
	// bootstrap_timeout, drift_replaced, scaled_down, powered_off, failed,
	// deleted, disowned), a colon and an explanation.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	TerminationReason string `json:"terminationReason,omitempty"`
}

// VMReference locates a VM on a hypervisor.
// +kubebuilder:validation:XValidation:rule="has(self.providerID) || has(self.vmID) || has(self.vmId)",message="status.vmRef needs providerID: the provider's id of the VM"
type VMReference struct {
	// hypervisorCluster is the HypervisorCluster's name.
	// +required
	// +kubebuilder:validation:MaxLength=253
	HypervisorCluster string `json:"hypervisorCluster"`

	// providerID is the VM's id on its hypervisor, written by the provider
	// that created the VM and opaque to everything else, like Cluster API's
	// providerID: proxmox://<vmid> on Proxmox VE. The operator finds,
	// deletes and matches the VM by it (docs/architecture.md, "A second
	// hypervisor").
	// +optional
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[a-z][a-z0-9+.-]*://[^\s]+$`
	ProviderID string `json:"providerID,omitempty"`

	// vmID mirrors the Proxmox VM id of a proxmox:// providerID, for
	// scripts that read it; other hypervisors leave it empty. A claim
	// written before providerID existed has only vmID (or its earlier
	// spelling vmId), then always a Proxmox VM id: the operator reads it as
	// proxmox://<vmID> and adds providerID at its next status write.
	// +optional
	// +kubebuilder:validation:Minimum=100
	// +kubebuilder:validation:Maximum=999999999
	VMID int32 `json:"vmID,omitempty"`

	// vmId is the earlier spelling of vmID, as an earlier operator wrote it:
	// read when vmID is unset, replaced by vmID at the next status write.
	//
	// Deprecated: the operator writes vmID. Only the schema and the status
	// write that moves it (OldStatusSpellings) read this field: decoding
	// folds it into VMID (api/v1alpha1/spelling.go).
	// +optional
	// +kubebuilder:validation:Minimum=100
	// +kubebuilder:validation:Maximum=999999999
	DeprecatedVMID int32 `json:"vmId,omitempty"`

	// node is the node the VM was last seen on: a hint the provider
	// corrects when the VM moved.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Node string `json:"node,omitempty"`
}

// TaskReference is a hypervisor task the operator is waiting for.
type TaskReference struct {
	// id is the task's id (a Proxmox UPID).
	// +required
	// +kubebuilder:validation:MaxLength=512
	ID string `json:"id"`

	// operation is what the task does, such as clone, start or destroy.
	// +required
	// +kubebuilder:validation:MaxLength=32
	Operation string `json:"operation"`

	// startTime is when the operator started the task.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
}

// MachineNetworkStatus is a VM's addressing.
type MachineNetworkStatus struct {
	// addresses are the VM's IP addresses, as reported by its guest agent or
	// allocated from an IPPool (with prefix length).
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=64
	// +listType=atomic
	Addresses []string `json:"addresses,omitempty"`

	// macAddress is the first NIC's MAC address.
	// +optional
	// +kubebuilder:validation:MaxLength=17
	MACAddress string `json:"macAddress,omitempty"`

	// hostname is the VM's host name.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Hostname string `json:"hostname,omitempty"`

	// fqdn is the VM's fully qualified domain name.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	FQDN string `json:"fqdn,omitempty"`

	// ipAllocations are the static addresses allocated to this claim; they
	// are released only once the VM is gone.
	// +optional
	// +kubebuilder:validation:MaxItems=4
	// +listType=atomic
	IPAllocations []IPAllocation `json:"ipAllocations,omitempty"`
}

// IPAllocation is one address allocated from an IPPool.
type IPAllocation struct {
	// poolRef is the IPPool's name.
	// +required
	// +kubebuilder:validation:MaxLength=253
	PoolRef string `json:"poolRef"`

	// address is the allocated address with its prefix length, such as 10.0.0.5/24.
	// +required
	// +kubebuilder:validation:MaxLength=64
	Address string `json:"address"`

	// gateway is the pool's gateway for the address's family.
	// +optional
	// +kubebuilder:validation:MaxLength=45
	Gateway string `json:"gateway,omitempty"`
}

// BootstrapStatus is a VM's runner and workload identity. It never holds a
// credential, only what identifies one.
// +kubebuilder:validation:XValidation:rule="!((has(self.jobID) || has(self.jobId)) && has(self.jobKey))",message="set at most one of jobID (a platform's numeric job id) and jobKey (the id of a job whose platform does not number them)"
type BootstrapStatus struct {
	// runnerName is the runner's name on the CI platform.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	RunnerName string `json:"runnerName,omitempty"`

	// runnerID is the runner's id on the CI platform.
	// +optional
	RunnerID int64 `json:"runnerID,omitempty"`

	// runnerId is the earlier spelling of runnerID, as an earlier operator
	// wrote it: read when runnerID is unset, replaced by runnerID at the
	// next status write.
	//
	// Deprecated: the operator writes runnerID. Only the schema and the
	// status write that moves it (OldStatusSpellings) read this field:
	// decoding folds it into RunnerID (api/v1alpha1/spelling.go).
	// +optional
	DeprecatedRunnerID int64 `json:"runnerId,omitempty"`

	// spiffeID is the VM's SPIFFE ID when attestation is on.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	SPIFFEID string `json:"spiffeID,omitempty"`

	// spiffeId is the earlier spelling of spiffeID, as an earlier operator
	// wrote it: read when spiffeID is unset, replaced by spiffeID at the
	// next status write.
	//
	// Deprecated: the operator writes spiffeID. Only the schema and the
	// status write that moves it (OldStatusSpellings) read this field:
	// decoding folds it into SPIFFEID (api/v1alpha1/spelling.go).
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	DeprecatedSPIFFEID string `json:"spiffeId,omitempty"`

	// credentialIssuedAt is when the single-use runner credential was issued.
	// +optional
	CredentialIssuedAt *metav1.Time `json:"credentialIssuedAt,omitempty"`

	// credentialExpiresAt is when it stops being usable.
	// +optional
	CredentialExpiresAt *metav1.Time `json:"credentialExpiresAt,omitempty"`

	// credentialRequestedAt is when the operator began to issue the runner
	// credential it places in the running VM (templates that do not
	// attest). Set before the credential is issued: a restart that lost
	// an issued, undelivered credential finds it here and replaces its
	// runner instead of leaving it usable.
	// +optional
	CredentialRequestedAt *metav1.Time `json:"credentialRequestedAt,omitempty"`

	// credentialDeliveredAt is when the runner credential was written into
	// the running VM through the hypervisor's guest channel (for Proxmox
	// the QEMU guest agent). It is never on the VM's cloud-init medium or
	// disk.
	// +optional
	CredentialDeliveredAt *metav1.Time `json:"credentialDeliveredAt,omitempty"`

	// runnerState is the runner's state on the CI platform as last
	// observed (runner list resync, or the job's webhooks).
	// +optional
	RunnerState RunnerState `json:"runnerState,omitempty"`

	// registeredAt is when the runner was first seen online; an idle
	// runner's idleTimeout counts from here.
	// +optional
	RegisteredAt *metav1.Time `json:"registeredAt,omitempty"`

	// runnerSealedAt is when the operator sealed the runner to the job it
	// took: on a CI platform whose runner credential any process may poll
	// with for more jobs (a GitLab runner authentication token), the
	// runner is paused as soon as its first job is seen, so the platform
	// gives it no other job while that one runs on (docs/gitlab.md). Unset
	// while no job was seen, and on platforms whose runner credential
	// serves one job only.
	// +optional
	RunnerSealedAt *metav1.Time `json:"runnerSealedAt,omitempty"`

	// jobID is the CI job the runner took, as the CI platform reports it,
	// when the platform numbers its jobs (GitHub Actions, GitLab CI). At
	// most one of jobID and jobKey is set.
	// +optional
	JobID int64 `json:"jobID,omitempty"`

	// jobId is the earlier spelling of jobID, as an earlier operator wrote
	// it: read when jobID is unset, replaced by jobID at the next status
	// write.
	//
	// Deprecated: the operator writes jobID. Only the schema and the status
	// write that moves it (OldStatusSpellings) read this field: decoding
	// folds it into JobID (api/v1alpha1/spelling.go).
	// +optional
	DeprecatedJobID int64 `json:"jobId,omitempty"`

	// jobKey is the CI job the runner took when its platform does not
	// number its jobs (a Buildkite job's UUID).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?$`
	JobKey string `json:"jobKey,omitempty"`

	// jobStartedAt is when the runner took the job.
	// +optional
	JobStartedAt *metav1.Time `json:"jobStartedAt,omitempty"`

	// jobRepository is the repository of the job the runner took (owner/name,
	// or a GitLab project's or Buildkite pipeline's path), kept after the
	// job's record is collected: the VM's time is charged to it
	// (hyperfleet_vm_seconds_total, docs/operations.md).
	// +optional
	// +kubebuilder:validation:MaxLength=140
	JobRepository string `json:"jobRepository,omitempty"`

	// jobConclusion is the platform's conclusion of the job once it ended,
	// such as success, failure or cancelled.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	JobConclusion string `json:"jobConclusion,omitempty"`
}

// PhaseTimes records when a claim entered each phase.
type PhaseTimes struct {
	// pending is when the claim entered phase Pending: its creation time
	// when the operator's first pass already found it provisioning (its
	// template was valid before the claim was first seen).
	// +optional
	Pending *metav1.Time `json:"pending,omitempty"`
	// provisioning is when the claim entered phase Provisioning.
	// +optional
	Provisioning *metav1.Time `json:"provisioning,omitempty"`
	// standby is when the claim entered phase Standby.
	// +optional
	Standby *metav1.Time `json:"standby,omitempty"`
	// bootstrapping is when the claim entered phase Bootstrapping.
	// +optional
	Bootstrapping *metav1.Time `json:"bootstrapping,omitempty"`
	// ready is when the claim entered phase Ready.
	// +optional
	Ready *metav1.Time `json:"ready,omitempty"`
	// draining is when the claim entered phase Draining.
	// +optional
	Draining *metav1.Time `json:"draining,omitempty"`
	// terminating is when the claim entered phase Terminating.
	// +optional
	Terminating *metav1.Time `json:"terminating,omitempty"`
	// failed is when the claim entered phase Failed.
	// +optional
	Failed *metav1.Time `json:"failed,omitempty"`
	// finished is when the claim entered phase Finished.
	// +optional
	Finished *metav1.Time `json:"finished,omitempty"`
}

// MachineClaim is one single-use VM: HyperFleet clones it, boots it, hands
// its runner a single-use credential and destroys it when its job is done.
// RunnerPools create claims; a claim can also be made by hand.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=hmc,categories=hyperfleet
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,description="Why the claim is not Ready, or Ready"
// +kubebuilder:printcolumn:name="VM",type=string,JSONPath=`.status.vmRef.providerID`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.vmRef.node`
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.runnerPoolRef.name`,priority=1
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.status.vmRef.hypervisorCluster`,priority=1
// +kubebuilder:printcolumn:name="Template",type=string,JSONPath=`.spec.templateRef.name`,priority=1
// +kubebuilder:printcolumn:name="Runner",type=string,JSONPath=`.status.bootstrap.runnerName`,priority=1
// +kubebuilder:printcolumn:name="Address",type=string,JSONPath=`.status.network.addresses[0]`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MachineClaim struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the VM asked for.
	// +required
	Spec MachineClaimSpec `json:"spec"`

	// status is the VM's state.
	// +optional
	Status MachineClaimStatus `json:"status,omitempty"`
}

// MachineClaimList is a list of MachineClaim.
// +kubebuilder:object:root=true
type MachineClaimList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MachineClaim `json:"items"`
}

func init() {
	SchemeBuilder.Register(&MachineClaim{}, &MachineClaimList{})
}

// StandbyStatus is a standby VM's suspend and resume.
type StandbyStatus struct {
	// suspendedAt is when the VM was found suspended to disk, ready to be
	// resumed: the standby tier's maxAge counts from it.
	// +optional
	SuspendedAt *metav1.Time `json:"suspendedAt,omitempty"`

	// resumedAt is when its resume was asked for, after the RunnerPool
	// took it for a job: its lifecycle limits (bootstrapTimeout,
	// maxLifetime) count from it.
	// +optional
	ResumedAt *metav1.Time `json:"resumedAt,omitempty"`
}

// Suspended reports whether the claim's VM was suspended and not resumed
// since.
func (c *MachineClaim) Suspended() bool {
	st := c.Status.Standby
	return st != nil && st.SuspendedAt != nil && st.ResumedAt == nil
}
