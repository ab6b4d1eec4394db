// Package metrics defines the Prometheus metrics of every HyperFleet
// controller; a CI platform's own (its API calls, its rate limits) are its
// back-end's (pkg/workload/github). They are registered on
// controller-runtime's registry, so the manager's /metrics endpoint serves
// them next to the controller-runtime ones; the manager's other packages
// declare theirs with this package's functions too (register.go).
package metrics

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

const namespace = "hyperfleet"

// phaseBuckets span a fast clone (under a second) to a slow full clone or
// boot (tens of minutes).
var phaseBuckets = []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600}

var (
	// ClaimPhaseSeconds is how long claims spent in a phase, observed when
	// they leave it.
	ClaimPhaseSeconds = NewHistogramVec("machineclaim_phase_duration_seconds",
		"Time MachineClaims spent in a phase, observed when they leave it.",
		phaseBuckets,
		"phase")

	// StandbyTransitions counts standby VMs suspended and resumed, and
	// the suspends and resumes the hypervisor refused for good.
	StandbyTransitions = NewCounterVec("standby_transitions_total",
		"Standby VMs suspended to disk (suspended) and resumed for a job (resumed), and suspends and resumes that failed for good (suspend_failed, resume_failed).",
		"event")

	// StandbyWaitSeconds is how long standby VMs stood by, suspended,
	// before their pool took them for a job.
	StandbyWaitSeconds = NewHistogram("standby_wait_duration_seconds",
		"How long a standby VM stood by, suspended to disk, before its RunnerPool took it for a job.",
		[]float64{1, 10, 60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400, 172800, 604800})

	// StandbyResumeSeconds is how long a standby VM taken for a job took
	// to be back: from the resume's request to its guest answering with
	// its addresses read again.
	StandbyResumeSeconds = NewHistogram("standby_resume_duration_seconds",
		"From the resume of a standby VM taken for a job to its guest answering, with its addresses read again.",
		[]float64{0.25, 0.5, 1, 2, 3, 5, 8, 13, 20, 30, 60, 120})

	// ClaimsStuck counts claims that overstayed their phase's bound
	// (internal/controller/machineclaim/stuck), by phase.
	ClaimsStuck = NewGaugeVec("claims_stuck",
		"MachineClaims whose Stuck condition is True (in their phase longer than the manager's bound), by phase.",
		"phase")

	// ClaimTransitions counts phase transitions.
	ClaimTransitions = NewCounterVec("machineclaim_transitions_total",
		"MachineClaim phase transitions, by the phase entered.",
		"phase")

	// ClaimErrors counts classified provisioning errors.
	ClaimErrors = NewCounterVec("machineclaim_errors_total",
		"Errors met while provisioning or deleting VMs, by class and reason.",
		"class", "reason")

	// ReservationsRejected counts VM reservation annotations the claim
	// controller refused to trust (bad signature, or a VM placement could
	// not have chosen for the claim): each is a tenant trying to point the
	// operator at a VM, or a template edited between reserve and clone.
	ReservationsRejected = NewCounter("vm_reservations_rejected_total",
		"VM reservation annotations on MachineClaims that were refused (signature or placement check failed).")

	// PlacementRecordsRejected counts placement records (what a claim's VM
	// was authorized to be) that did not verify when the claim went on
	// building its VM: each is a record removed, edited or copied by
	// someone other than the operator, and the claim failed.
	PlacementRecordsRejected = NewCounter("placement_records_rejected_total",
		"MachineClaim placement records that were refused (missing, unreadable or signature check failed); each failed its claim.")

	// ClaimsVanished counts claims that left the API server still carrying
	// the operator's finalizer, by the HypervisorCluster of the VM each
	// left behind: a delete that raced the finalizer's write removed them
	// although that write succeeded (kubernetes/kubernetes#77988), so no
	// deletion pass ran and the VM went to the orphan sweeper at once.
	// Bounded by the clusters.
	ClaimsVanished = NewCounterVec("claims_vanished_total",
		"MachineClaims the API server removed while they still carried the operator's finalizer (a delete racing the finalizer's write), by the HypervisorCluster of the VM handed to the orphan sweeper.",
		"hypervisor_cluster")

	// ClaimsForceDeleted counts claims a platform admin force-deleted
	// (annotation hyperfleet.io/force-delete), by the HypervisorCluster of
	// the VM each abandoned: each such VM was left to the orphan sweep
	// without a call to its hypervisor. Bounded by the clusters.
	ClaimsForceDeleted = NewCounterVec("claims_force_deleted_total",
		"MachineClaims force-deleted by a platform admin (annotation hyperfleet.io/force-delete): their VM abandoned without the hypervisor, by the VM's HypervisorCluster (empty when the claim recorded no VM).",
		"hypervisor_cluster")

	// ClaimsDisowned counts VMs a platform admin released from
	// management (annotation hyperfleet.io/disown), by HypervisorCluster:
	// each is a VM still running that HyperFleet no longer tracks.
	ClaimsDisowned = NewCounterVec("claims_disowned_total",
		"MachineClaims whose VM a platform admin released from HyperFleet's management without deleting it (annotation hyperfleet.io/disown), by the VM's HypervisorCluster (empty when the claim recorded no VM).",
		"hypervisor_cluster")

	// PowerOffToDestroyed is the time from a VM being seen powered off to
	// its VM destroyed and its claim gone.
	PowerOffToDestroyed = NewHistogram("vm_poweroff_to_destroyed_seconds",
		"Time from a VM being seen powered off to the VM destroyed and its claim released.",
		[]float64{0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 60, 120, 300})

	// PowerOffHints counts hints that a VM is about to stop
	// (docs/architecture.md, "Power-off hints"), by source (agent,
	// job-completed, runner-gone) and result: marked (the VM is read
	// directly for a while), duplicate, full (the in-transition set is at
	// its bound; the listing catches the VM), unknown (no running claim
	// has that VM), refused (an agent call whose token does not verify;
	// nothing was read).
	PowerOffHints = NewCounterVec("poweroff_hints_total",
		"Hints that a VM is about to power off, by source and result.",
		"source", "result")

	// ReadyHints counts the in-VM agents' hints that they run and wait for
	// the secrets the operator places in the VM (docs/security.md, "Power-off
	// notices"), by result: accepted (the claim was woken to look at its
	// VM now), unknown (no claim with a VM of that name and UID), refused
	// (the token does not verify; nothing was read).
	ReadyHints = NewCounterVec("ready_hints_total",
		"Hints from VMs' agents that they wait for their secrets, by result.",
		"result")

	// GuestSecretsDelivered counts the GuestSecrets documents placed in
	// running VMs through the hypervisor's guest channel, by what they
	// carry: runner-credential (direct mode), join-token or tpm (SPIFFE;
	// tpm: the enrollment proof).
	GuestSecretsDelivered = NewCounterVec("guest_secrets_delivered_total",
		"Secrets placed in running VMs through the hypervisor's guest channel, by content (runner-credential, join-token, tpm).",
		"content")

	// VMsInTransition is the number of VMs read one by one because a hint
	// said they are about to stop.
	VMsInTransition = NewGauge("vms_in_transition",
		"VMs whose power state is read directly (per-VM status) because a hint said they are about to stop.")

	// CreatedToCloneRequest is the operator's own overhead: claim created to
	// clone request sent.
	CreatedToCloneRequest = NewHistogram("machineclaim_created_to_clone_seconds",
		"Time from a MachineClaim's creation to its clone request being sent.",
		[]float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60})

	// APICalls counts hypervisor API calls.
	APICalls = NewCounterVec("hypervisor_api_calls_total",
		"Hypervisor API calls by cluster, method, endpoint template and HTTP status (0: no response).",
		"hypervisor_cluster", "method", "endpoint", "code")

	// APICallSeconds is the latency of hypervisor API calls.
	APICallSeconds = NewHistogramVec("hypervisor_api_call_duration_seconds",
		"Latency of hypervisor API calls by cluster and endpoint template.",
		[]float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
		"hypervisor_cluster", "endpoint")

	// CloneQueueDepth is how many VMs wait for a clone slot.
	CloneQueueDepth = NewGaugeVec("clone_queue_depth",
		"VMs waiting for a free clone slot, by cluster.",
		"hypervisor_cluster")

	// ClusterConnected is 1 while the operator reaches a cluster's API.
	ClusterConnected = NewGaugeVec("hypervisor_cluster_connected",
		"1 when the hypervisor cluster's API answers with the configured credentials, else 0.",
		"hypervisor_cluster")

	// IPPoolFree is how many addresses an IPPool has left.
	IPPoolFree = NewGaugeVec("ippool_free_addresses",
		"Addresses an IPPool can still hand out (0: exhausted).",
		"pool")

	// OrphansFound counts VMs the sweeper found owned by this install with
	// no live claim.
	OrphansFound = NewCounterVec("orphan_vms_found_total",
		"VMs owned by this install (marker verified) found without a live MachineClaim.",
		"hypervisor_cluster")

	// UnverifiedVMs is how many VMs carry this install's tag but an
	// ownership block that does not verify, as of the latest sweep.
	UnverifiedVMs = NewGaugeVec("unverified_vms",
		"VMs carrying this install's tag whose ownership block does not verify (never touched by the operator), as of the latest orphan sweep.",
		"hypervisor_cluster")

	// OrphansRemoved counts orphaned VMs the sweeper destroyed.
	OrphansRemoved = NewCounterVec("orphan_vms_removed_total",
		"Orphaned VMs destroyed by the sweeper (not counted in dry-run mode).",
		"hypervisor_cluster")

	// OrphanMediaFound counts cloud-init media (ISOs) named by this install
	// that the sweeper found without a live claim.
	OrphanMediaFound = NewCounterVec("orphan_isos_found_total",
		"Cloud-init ISOs named by this install found without a live MachineClaim.",
		"hypervisor_cluster")

	// OrphanMediaRemoved counts stray cloud-init media the sweeper deleted,
	// counted once the hypervisor no longer has them.
	OrphanMediaRemoved = NewCounterVec("orphan_isos_removed_total",
		"Stray cloud-init ISOs deleted by the sweeper, counted once gone (not in dry-run mode).",
		"hypervisor_cluster")

	// OrphanIsolationObjectsRemoved counts isolation objects (a Proxmox
	// security group, a libvirt filter) the sweeper deleted because no
	// claim's placement record needed them any more.
	OrphanIsolationObjectsRemoved = NewCounterVec("orphan_isolation_objects_removed_total",
		"Hypervisor objects of network isolation policies (written once per policy digest, shared by its VMs) deleted by the sweeper once no MachineClaim's placement needed them (not in dry-run mode).",
		"hypervisor_cluster")

	// OrphanRunnersFound counts CI runners named by this install whose
	// claim no longer exists.
	OrphanRunnersFound = NewCounterVec("orphan_runners_found_total",
		"CI runners named by this install found without a live MachineClaim.",
		"scope")

	// OrphanRunnersRemoved counts orphaned runners the sweeper removed.
	OrphanRunnersRemoved = NewCounterVec("orphan_runners_removed_total",
		"Orphaned CI runners removed by the sweeper (not in dry-run mode).",
		"scope")

	// RunnerCredentials counts single-use runner credentials issued, on
	// every CI platform. A platform's own metrics (its API calls, its rate
	// limits) are its back-end's (pkg/workload/<platform>), registered
	// through workload.Dependencies.Metrics.
	RunnerCredentials = NewCounterVec("runner_credentials_issued_total",
		"Single-use runner credentials issued to VMs, by method (jit-config, runner-token).",
		"method")

	// BrokerRequests counts the credential broker's answers
	// (internal/broker), by reason: Delivered, or why it refused.
	BrokerRequests = NewCounterVec("broker_requests_total",
		"Requests to the credential broker by attested VMs, by result: Delivered, or the reason of the refusal.",
		"reason")

	// TPMEnrollmentRequests counts the TPM enrollment endpoints' answers
	// (internal/tpmenroll), by endpoint (enroll, activate) and reason:
	// Challenged, Enrolled, or why it refused.
	TPMEnrollmentRequests = NewCounterVec("tpm_enrollment_requests_total",
		"Requests to the TPM DevID enrollment endpoints by VMs, by endpoint and result: Challenged, Enrolled, or the reason of the refusal.",
		"endpoint", "reason")

	// AttestationFailures counts claims whose VM failed to attest, by
	// method (join-token, tpm) and reason (AttestationFailed, TPMNotFound,
	// TPMEnrollmentRefused).
	AttestationFailures = NewCounterVec("attestation_failures_total",
		"MachineClaims whose VM failed to attest with SPIRE, by attestation method and reason.",
		"method", "reason")

	// SPIREBundleReads counts reads of SPIRE servers' trust bundles
	// (internal/identity), by trigger (periodic: older than a minute or
	// none yet; forced: an SVID presented to the broker did not verify)
	// and result (read, failed, or suppressed: a forced read not made
	// because one began less than --spire-forced-refresh-interval ago).
	SPIREBundleReads = NewCounterVec("spire_bundle_reads_total",
		"Reads of SPIRE servers' trust bundles, by trigger (periodic, forced) and result (read, failed, suppressed).",
		"trigger", "result")

	// IdentityMisuse counts VM identities found used by someone other
	// than their VM (docs/identity.md, "A stolen join token"), by reason:
	// BrokerProofInvalid (a valid SVID of a claim presented to the broker
	// without the proof the operator placed in that claim's VM) or
	// JoinTokenReused (the VM found its join token spent, and the SPIRE
	// server lists an agent that attested with it).
	IdentityMisuse = NewCounterVec("identity_misuse_total",
		"VM identities (join token, SVID) used by someone other than their VM, by reason (BrokerProofInvalid, JoinTokenReused).",
		"reason")

	// WebhookSecretReloads counts reads of the webhook Secret after it
	// changed, by result: loaded, invalid (the last valid secrets stay in
	// use), missing (deliveries are refused) or error (retried).
	WebhookSecretReloads = NewCounterVec("webhook_secret_reloads_total",
		"Reads of the GitHub webhook Secret, by result (loaded, invalid, missing, error).",
		"result")

	// WebhookConfirmations counts webhook events confirmed with the CI
	// platform's API before they changed demand (internal/demand), by why:
	// too_old, no_time, out_of_order (a completion of a job not recorded
	// in progress) or shared_secret (signed with the fallback secret, it
	// would take a job out of demand or name its runner). Each is one API
	// call on the routed pool's budget.
	WebhookConfirmations = NewCounterVec("webhook_event_confirmations_total",
		"Webhook events confirmed with the CI platform's API before they changed demand, by reason (too_old, no_time, out_of_order, shared_secret).",
		"reason")

	// DNSReady is 1 while the DNS service of a cluster's
	// spec.dns.dnsProvider answers with the configured key, else 0.
	DNSReady = NewGaugeVec("dns_ready",
		"1 while the DNS service of the cluster's spec.dns.dnsProvider answers for its zones with the configured key (DNSReady=True), else 0.",
		"hypervisor_cluster")

	// DNSUpdates counts the claim controller's registrations and removals
	// of VM records, by cluster, operation and result.
	DNSUpdates = NewCounterVec("dns_updates_total",
		"VM record registrations (op=register) and removals (op=remove) by the claim controller, by result (ok, or the failure's condition reason).",
		"hypervisor_cluster", "op", "result")

	// OrphanDNSFound and OrphanDNSRemoved count the DNS names carrying
	// this install's marker whose claim no longer exists.
	OrphanDNSFound = NewCounterVec("orphan_dns_records_found_total",
		"DNS names registered by this install found without a live MachineClaim.",
		"hypervisor_cluster")
	OrphanDNSRemoved = NewCounterVec("orphan_dns_records_removed_total",
		"DNS names of deleted claims whose records the sweeper removed (not in dry-run mode).",
		"hypervisor_cluster")

	// OrphanIdentitiesFound and OrphanIdentitiesRemoved count what claims
	// that no longer exist left on SPIRE servers (internal/sweeper,
	// spire.go), by cluster and kind: entry (registration and TPM alias
	// entries; found and removed) or agent (banned tpm_devid agents past
	// their certificates' lifetime; removed).
	OrphanIdentitiesFound = NewCounterVec("orphan_spire_objects_found_total",
		"SPIRE entries of this install found without a live MachineClaim, by kind.",
		"hypervisor_cluster", "kind")
	OrphanIdentitiesRemoved = NewCounterVec("orphan_spire_objects_removed_total",
		"SPIRE entries and banned TPM agents of deleted claims that the sweeper deleted (not in dry-run mode), by kind.",
		"hypervisor_cluster", "kind")

	// NetworkValidations counts the checks of claims' validations (DNS
	// forward and reverse lookups, ping, SSH), by cluster, check and
	// result; NetworkValidationSeconds is how long each check took.
	NetworkValidations = NewCounterVec("network_validation_total",
		"Checks of running VMs' DNS names and reachability from the operator (check=forward, reverse, ping, ssh), by result (passed, failed).",
		"hypervisor_cluster", "check", "result")
	NetworkValidationSeconds = NewHistogramVec("network_validation_duration_seconds",
		"How long one check of a VM's validation took (all its servers and addresses), by check.",
		[]float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120},
		"check")

	// RunnersDeregistered counts runners removed from the CI platform.
	RunnersDeregistered = NewCounter("runners_deregistered_total",
		"Runners removed from the CI platform when their claim went (already-gone runners included).")

	// RunnersSealed counts runners sealed to the job they took, on CI
	// platforms whose runner credential is multi-job (workload.Sealer),
	// by platform (workload type).
	RunnersSealed = NewCounterVec("runners_sealed_total",
		"Runners the operator paused at their first job, so that their multi-job credential gets no other job, by platform.",
		"platform")
)

// ProviderObserver feeds a provider's measurements for one cluster into the
// metrics above.
type ProviderObserver struct {
	Cluster string
}

var _ provider.Observer = ProviderObserver{}

// NewProviderObserver returns the observer of a new provider for cluster.
// A new provider has no VM waiting for a clone slot: the queue gauge
// starts at zero, so that it exists before the first wait.
func NewProviderObserver(cluster string) ProviderObserver {
	CloneQueueDepth.WithLabelValues(cluster).Set(0)
	return ProviderObserver{Cluster: cluster}
}

// APICall implements provider.Observer.
func (o ProviderObserver) APICall(method, endpoint string, code int, d time.Duration) {
	APICalls.WithLabelValues(o.Cluster, method, endpoint, strconv.Itoa(code)).Inc()
	APICallSeconds.WithLabelValues(o.Cluster, endpoint).Observe(d.Seconds())
}

// CloneQueue implements provider.Observer.
func (o ProviderObserver) CloneQueue(waiting int) {
	CloneQueueDepth.WithLabelValues(o.Cluster).Set(float64(waiting))
}

// SweepingCluster creates a cluster's orphan counters at zero when the
// sweeper looks at it, so that they exist before anything is counted: a
// counter whose series is born at 1 shows no increase(), and its first
// orphan would raise no alert.
func SweepingCluster(cluster string) {
	for _, c := range []*prometheus.CounterVec{OrphansFound, OrphansRemoved, OrphanMediaFound, OrphanMediaRemoved, OrphanIsolationObjectsRemoved} {
		c.WithLabelValues(cluster).Add(0)
	}
}

// SweepingDNS does the same for a cluster's orphan DNS record counters.
func SweepingDNS(cluster string) {
	OrphanDNSFound.WithLabelValues(cluster).Add(0)
	OrphanDNSRemoved.WithLabelValues(cluster).Add(0)
}

// SweepingRunnerScope does the same for a CI scope's orphan runner
// counters.
func SweepingRunnerScope(scope string) {
	OrphanRunnersFound.WithLabelValues(scope).Add(0)
	OrphanRunnersRemoved.WithLabelValues(scope).Add(0)
}

// ForgetCluster drops the per-cluster series of a deleted cluster.
func ForgetCluster(cluster string) {
	APICalls.DeletePartialMatch(prometheus.Labels{"hypervisor_cluster": cluster})
	APICallSeconds.DeletePartialMatch(prometheus.Labels{"hypervisor_cluster": cluster})
	CloneQueueDepth.DeleteLabelValues(cluster)
	ClusterConnected.DeleteLabelValues(cluster)
	OrphansFound.DeleteLabelValues(cluster)
	OrphansRemoved.DeleteLabelValues(cluster)
	UnverifiedVMs.DeleteLabelValues(cluster)
	OrphanMediaFound.DeleteLabelValues(cluster)
	OrphanMediaRemoved.DeleteLabelValues(cluster)
	OrphanIsolationObjectsRemoved.DeleteLabelValues(cluster)
	ClaimsForceDeleted.DeleteLabelValues(cluster)
	ClaimsDisowned.DeleteLabelValues(cluster)
	DNSReady.DeleteLabelValues(cluster)
	DNSUpdates.DeletePartialMatch(prometheus.Labels{"hypervisor_cluster": cluster})
	OrphanDNSFound.DeleteLabelValues(cluster)
	OrphanDNSRemoved.DeleteLabelValues(cluster)
	NetworkValidations.DeletePartialMatch(prometheus.Labels{"hypervisor_cluster": cluster})
}

// Namespace quotas (spec.tenancy[].limits, internal/quota): bounded by
// namespaces × clusters (× the five resources).
var (
	// QuotaUsage is what a namespace's VMs on a cluster use.
	QuotaUsage = NewGaugeVec("quota_usage",
		"What a namespace's VMs on a hypervisor cluster use of each resource its tenancy rule limits (machines, cpu cores, memory and disk bytes, devices), counted from their placement records as of the last placement decision or VM destroyed there.",
		"namespace", "hypervisor_cluster", "resource")
	// QuotaLimit is a namespace's limit on a cluster.
	QuotaLimit = NewGaugeVec("quota_limit",
		"A namespace's limit on a hypervisor cluster (spec.tenancy[].limits; the strictest of the rules that apply), by resource; absent when the resource is not limited.",
		"namespace", "hypervisor_cluster", "resource")
	// QuotaWaitingClaims is how many claims wait for quota.
	QuotaWaitingClaims = NewGaugeVec("quota_waiting_claims",
		"MachineClaims of a namespace waiting because placing their VM on the hypervisor cluster would exceed a limit of its tenancy rule (Provisioned False, reason QuotaExceeded).",
		"namespace", "hypervisor_cluster")
)
