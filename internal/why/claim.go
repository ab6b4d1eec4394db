package why

import (
	"fmt"
	"regexp"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// fixes says what to do about each reason a pool's CapacityAvailable or a
// claim's Provisioned or Bootstrapped condition holds a VM back with
// (internal/controller/runnerpool_status.go setCapacity,
// internal/controller/runnerpool_claims.go, internal/controller/machineclaim).
var fixes = map[string]string{
	string(hfv1.AtMaxReplicasReason):         "raise the pool's spec.scaling.maxReplicas, or wait for a busy runner to finish its job",
	string(hfv1.WaitingForTerminationReason): "wait: VMs being destroyed still count against maxReplicas; if it lasts, see their Ending condition",
	string(hfv1.WaitingForStandbyReason):     "wait: standby VMs being built hold room under maxReplicas and are taken for jobs once suspended; raise maxReplicas or lower spec.standby.size if it lasts",
	string(hfv1.MaxMachinesReachedReason):    "the cluster's quota: raise the HypervisorCluster's spec.limits.maxMachines, or end VMs on it",
	string(hfv1.QuotaExceededReason):         "the namespace's quota on the cluster: raise the limit the message names in the HypervisorCluster's spec.tenancy, make the template's VMs smaller, or end VMs of the namespace on the cluster; the claim is placed once a VM of the namespace there is destroyed",
	string(hfv1.InsufficientCapacityReason):  "no allowed node has the memory or storage for the VM: free capacity on the cluster, allow more nodes, or make the template's VMs smaller",
	string(hfv1.IPPoolExhaustedReason):       "no static address is left: add addresses to the IPPool or end VMs holding them",
	string(hfv1.RateLimitedReason):           "the CI platform's rate limit: wait until it resets (the message says when), or give the template's credentials a larger limit (a GitHub App rather than a PAT)",
	string(hfv1.ClusterUnavailableReason):    "the hypervisor cluster is down for HyperFleet: fix what the HypervisorCluster's Ready and Connected conditions name",
	string(hfv1.NamespaceNotAllowedReason):   "ask the platform admin to admit the namespace in the HypervisorCluster's spec.allowedNamespaces",
	string(hfv1.TemplateNotReadyReason):      "fix the template as its Valid condition says",
	string(hfv1.TemplateInvalidReason):       "fix the template as its Valid condition says",
	string(hfv1.ConsecutiveFailuresReason):   "the pool's last VMs failed before their runner came online: read why in the pool's events and the failed claims' Ending condition, fix the template or image; replacements resume with backoff",
	string(hfv1.ScopeNotVerifiedReason):      "wait for the pool's scope check (ScopeVerified condition); if it fails, fix the credentials' permissions",
	string(hfv1.ProvisioningFailedReason):    "the hypervisor refused or failed a step: read the claim's message and the hypervisor's task log",
	string(hfv1.QueuedReason):                "the VM waits for a clone slot (the cluster's spec.limits); it goes on as earlier clones finish",
	string(hfv1.NoProgressReason):            "the claim overstayed its phase: the message names the step and the hypervisor's task; look at the task on the hypervisor, or delete the claim to replace it",
	string(hfv1.BuildingVMReason):            "the hypervisor's task is in flight: wait; if the claim becomes Stuck, look at the task on the hypervisor",
}

// quotaField finds the limit a QuotaExceeded message names
// (internal/quota Exceeded: "spec.tenancy[1].limits.memory").
var quotaField = regexp.MustCompile(`spec\.tenancy\[\d+\]\.limits\.[a-z]+`)

// credentialReasons are the Bootstrapped False reasons that say the VM's
// runner credential has not reached it (internal/controller/machineclaim
// guestsecrets.go and the secrets store path).
var credentialReasons = map[string]string{
	string(hfv1.CredentialNotDeliveredReason):  "the credential could not be placed in the VM yet (guest agent not answering, the CI platform or hypervisor unavailable); it is retried: check the VM's guest agent",
	string(hfv1.SecretStoreUnavailableReason):  "the cluster's secrets store (spec.spire.secretStore) is unreachable; it is retried: check the store",
	string(hfv1.SecretStoreDeniedReason):       "the secrets store refused the operator: fix spec.spire.secretStore.tokenRef or the token's policy",
	string(hfv1.CredentialIssueFailedReason):   "the CI platform did not issue the runner credential: check the template's credentials and the platform's status",
	string(hfv1.GuestAgentRequiredReason):      "the hypervisor template has no guest agent channel: add one as the HypervisorMachineTemplate's status says for its hypervisor, and rebuild the template",
	string(hfv1.AgentUnavailableReason):        "the operator serves no agent for the template's runner OS and architecture: see the template's condition",
	string(hfv1.BrokerUnavailableReason):       "the operator runs no credential broker: configure its agent server, or a secrets store on the cluster",
	string(hfv1.JobNotBindableReason):          "the job the claim names is no queued job of its pool any more: the claim gets no credential and is replaced",
	string(hfv1.AttestationPendingReason):      "the VM's spire-agent has not attested yet: check the VM's boot and its access to the SPIRE server",
	string(hfv1.AttestationFailedReason):       "the VM's spire-agent did not attest in time: check the SPIRE server and the VM's network",
	string(hfv1.TPMEnrollmentRefusedReason):    "the operator refused the VM's TPM enrollment: see the claim's events",
	string(hfv1.SecretNotFoundReason):          "a Secret the template names is missing: create it",
	string(hfv1.AuthenticationFailedReason):    "the CI platform refused the template's credentials: rotate them",
	string(hfv1.NotAllowedByClusterReason):     "the cluster's spec.tenancy does not allow what the template uses",
	string(hfv1.JobUserCanEscalateReason):      "the image's job user can become root and the credential serves several jobs: use a single-job credential or drop the user's sudo",
	string(hfv1.ReservationRejectedReason):     "the claim's VM reservation did not verify: delete the claim",
	string(hfv1.PlacementRecordRejectedReason): "the claim's placement record did not verify: delete the claim",
}

// capacityBlocker reads the pool's CapacityAvailable condition. Reasons a
// starting claim reported are answered with that claim, which names the
// cluster, node or address pool; the others with the pool.
func capacityBlocker(w *World, pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate, claims []*hfv1.MachineClaim) *Blocker {
	c := falseCond(pool.Status.Conditions, hfv1.RunnerPoolCapacityCondition)
	if c == nil {
		return nil
	}
	for _, claim := range claims {
		if p := falseCond(claim.Status.Conditions, hfv1.MachineClaimProvisionedCondition); p != nil && p.Reason == c.Reason {
			return claimBlocker(w, claim)
		}
	}
	b := &Blocker{Reason: c.Reason, Object: "RunnerPool " + nsName(pool.Namespace, pool.Name), Field: condField(hfv1.RunnerPoolCapacityCondition),
		Message: c.Message, Fix: fixes[c.Reason], Doc: doc(c.Reason)}
	switch c.Reason {
	case string(hfv1.AtMaxReplicasReason):
		b.Field = "spec.scaling.maxReplicas, status.replicas (" + condField(hfv1.RunnerPoolCapacityCondition) + ")"
		b.Message = fmt.Sprintf("status.replicas %d of spec.scaling.maxReplicas %d (busy %d), %d jobs queued: %s",
			pool.Status.Replicas, pool.Spec.Scaling.MaxReplicas, pool.Status.BusyReplicas, pool.Status.PendingJobs, c.Message)
	case string(hfv1.MaxMachinesReachedReason):
		if tmpl != nil {
			b.Fix = fmt.Sprintf("the cluster's quota: raise spec.limits.maxMachines of HypervisorCluster %s, or end VMs on it", tmpl.Spec.HypervisorClusterRef.Name)
		}
	}
	if b.Fix == "" {
		b.Fix = "fix what the condition's message names"
	}
	return b
}

// claimsBlocker is the first blocker among the pool's live claims, the
// most telling first: a claim stuck on the hypervisor's task, then one
// held back by a quota, capacity, a rate limit or its cluster, then one
// whose credential has not arrived, then one still being built.
func claimsBlocker(w *World, claims []*hfv1.MachineClaim) *Blocker {
	var best *Blocker
	bestRank := 0
	for _, c := range claims {
		if b := claimBlocker(w, c); b != nil {
			if r := rank(b.Reason); best == nil || r < bestRank {
				best, bestRank = b, r
			}
		}
	}
	return best
}

func rank(reason string) int {
	switch reason {
	case string(hfv1.NoProgressReason):
		return 0
	case string(hfv1.BuildingVMReason), string(hfv1.QueuedReason):
		return 3
	}
	if _, ok := credentialReasons[reason]; ok {
		return 2
	}
	return 1
}

// claimBlocker is why claim has no runner serving jobs yet; nil when it
// is on its way without a hitch, or serves.
func claimBlocker(_ *World, c *hfv1.MachineClaim) *Blocker {
	obj := "MachineClaim " + nsName(c.Namespace, c.Name)
	if s := hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimStuckCondition); s != nil && s.Status == metav1.ConditionTrue {
		b := &Blocker{Reason: s.Reason, Object: obj, Field: condField(hfv1.MachineClaimStuckCondition), Message: s.Message, Fix: fixes[string(hfv1.NoProgressReason)], Doc: doc(s.Reason)}
		if t := c.Status.Task; t != nil {
			b.Field += ", status.task"
			b.Message += fmt.Sprintf(" (hypervisor task %s: %s)", t.ID, t.Operation)
		}
		return b
	}
	if p := falseCond(c.Status.Conditions, hfv1.MachineClaimProvisionedCondition); p != nil {
		switch p.Reason {
		case string(hfv1.CreatedReason):
			return nil
		case string(hfv1.BuildingVMReason):
			if c.Status.Task == nil {
				return nil
			}
			return &Blocker{Reason: p.Reason, Object: obj, Field: "status.task, " + condField(hfv1.MachineClaimProvisionedCondition),
				Message: fmt.Sprintf("waiting on the hypervisor's task %s (%s)%s", c.Status.Task.ID, c.Status.Task.Operation, taskAge(c)),
				Fix:     fixes[p.Reason], Doc: doc(p.Reason)}
		}
		fix := fixes[p.Reason]
		if fix == "" {
			fix = "fix what the condition's message names"
		}
		if p.Reason == string(hfv1.MaxMachinesReachedReason) && c.Status.VMRef != nil {
			fix = fmt.Sprintf("the cluster's quota: raise spec.limits.maxMachines of HypervisorCluster %s, or end VMs on it", c.Status.VMRef.HypervisorCluster)
		}
		field := condField(hfv1.MachineClaimProvisionedCondition)
		if p.Reason == string(hfv1.QuotaExceededReason) {
			if limit := quotaField.FindString(p.Message); limit != "" {
				// The limit the claim waits for, as the claim
				// controller's message names it (internal/quota).
				field += ", " + limit
				fix = fmt.Sprintf("the namespace's quota on the cluster: raise %s (the message gives the limit, the namespace's usage and this VM's need), make the template's VMs smaller, or end VMs of namespace %s on the cluster; the claim is placed once one of them is destroyed",
					limit, c.Namespace)
			}
		}
		return &Blocker{Reason: p.Reason, Object: obj, Field: field, Message: p.Message, Fix: fix, Doc: doc(p.Reason)}
	}
	for _, t := range []hfv1.ConditionType{hfv1.MachineClaimAttestedCondition, hfv1.MachineClaimBootstrappedCondition} {
		if b := falseCond(c.Status.Conditions, t); b != nil {
			if fix, ok := credentialReasons[b.Reason]; ok {
				return &Blocker{Reason: b.Reason, Object: obj, Field: condField(t), Message: b.Message, Fix: fix, Doc: doc(b.Reason)}
			}
		}
	}
	return nil
}

func taskAge(c *hfv1.MachineClaim) string {
	if c.Status.Task.StartTime == nil {
		return ""
	}
	return " since " + c.Status.Task.StartTime.UTC().Format("15:04:05Z")
}

// claimLink describes a claim and its VM.
func claimLink(w *World, c *hfv1.MachineClaim) Link {
	parts := []string{string(c.Status.Phase)}
	if parts[0] == "" {
		parts[0] = "Pending"
	}
	for _, t := range []hfv1.ConditionType{hfv1.MachineClaimProvisionedCondition, hfv1.MachineClaimBootstrappedCondition} {
		if cond := falseCond(c.Status.Conditions, t); cond != nil {
			parts = append(parts, fmt.Sprintf("%s False (%s)", t, cond.Reason))
			break
		}
	}
	if b := c.Status.Bootstrap; b != nil && b.RunnerName != "" {
		parts = append(parts, fmt.Sprintf("runner %s %s", b.RunnerName, b.RunnerState))
	}
	if v := c.Status.VMRef; v != nil {
		vm := "VM"
		if v.VMID != 0 {
			vm += fmt.Sprintf(" %d", v.VMID)
		}
		parts = append(parts, vm+" on "+strings.Trim(v.HypervisorCluster+"/"+v.Node, "/"))
	} else {
		parts = append(parts, "no VM yet")
	}
	if !c.CreationTimestamp.IsZero() {
		parts = append(parts, "age "+age(w.Now, c.CreationTimestamp.Time))
	}
	return Link{Kind: "MachineClaim", Name: nsName(c.Namespace, c.Name), State: strings.Join(parts, "; ")}
}

// explainClaim answers for a claim: its pool, template and cluster, and
// what holds it.
func explainClaim(w *World, t Target) Report {
	r := Report{Target: t.String()}
	var found []*hfv1.MachineClaim
	for i := range w.Claims {
		c := &w.Claims[i]
		if c.Name == t.Name && (t.Namespace == "" || c.Namespace == t.Namespace) {
			found = append(found, c)
		}
	}
	if len(found) != 1 {
		msg := fmt.Sprintf("no MachineClaim %s%s", t.Name, suffix(" in namespace ", t.Namespace, ""))
		if len(found) > 1 {
			msg = "several MachineClaims have that name; give one with -n"
		}
		r.Blocked = &Blocker{Reason: "MachineClaimNotFound", Object: "MachineClaim " + t.Name, Field: "metadata.name", Message: msg,
			Fix: "check the name and namespace (-n)", Doc: doc("why-is-my-job-not-running")}
		return r
	}
	c := found[0]
	r.Chain = append(r.Chain, claimLink(w, c))
	if c.Spec.RunnerPoolRef != nil {
		if pool := findPool(w, c.Namespace, c.Spec.RunnerPoolRef.Name); pool != nil {
			r.Chain = append(r.Chain, poolLink(pool))
		}
	}
	tmpl := findTemplate(w, c.Namespace, c.Spec.TemplateRef.Name)
	var cluster *hfv1.HypervisorCluster
	if tmpl != nil {
		r.Chain = append(r.Chain, templateLink(tmpl))
		if cluster = findCluster(w, tmpl.Spec.HypervisorClusterRef.Name); cluster != nil {
			r.Chain = append(r.Chain, clusterLink(cluster))
		}
	}
	if c.Ended() {
		r.Verdict = fmt.Sprintf("the claim ended: %s%s", c.Status.End.Reason, suffix(" (", c.Status.End.Message, ")"))
		return r
	}
	if r.Blocked = claimBlocker(w, c); r.Blocked != nil {
		return r
	}
	if r.Blocked = clusterBlocker(tmpl, cluster); r.Blocked != nil {
		return r
	}
	switch {
	case hfv1.IsConditionTrue(c.Status.Conditions, hfv1.ReadyCondition):
		r.Verdict = "the claim's runner is ready"
	default:
		r.Verdict = "the claim is on its way (phase " + string(c.Status.Phase) + "); nothing holds it"
	}
	return r
}
