package why

import (
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// maxClaimLinks bounds the claims printed in a chain; the blocker is
// chosen from all of them.
const maxClaimLinks = 10

// explainPool answers for a RunnerPool: why its jobs wait.
func explainPool(w *World, t Target) Report {
	r := Report{Target: t.String()}
	pool, err := uniquePool(w, t)
	if err != "" {
		r.Blocked = &Blocker{Reason: ReasonRunnerPoolNotFound, Object: "RunnerPool " + t.Name, Field: "metadata.name", Message: err,
			Fix: "check the name and namespace (-n)", Doc: doc("why-is-my-job-not-running")}
		return r
	}
	links, b, verdict := walkPool(w, pool)
	r.Chain, r.Blocked, r.Verdict = links, b, verdict
	return r
}

// uniquePool finds the pool t names; the message says why not.
func uniquePool(w *World, t Target) (*hfv1.RunnerPool, string) {
	var found []*hfv1.RunnerPool
	for i := range w.Pools {
		p := &w.Pools[i]
		if p.Name == t.Name && (t.Namespace == "" || p.Namespace == t.Namespace) {
			found = append(found, p)
		}
	}
	switch len(found) {
	case 0:
		return nil, fmt.Sprintf("no RunnerPool %s%s", t.Name, suffix(" in namespace ", t.Namespace, ""))
	case 1:
		return found[0], ""
	}
	var names []string
	for _, p := range found {
		names = append(names, nsName(p.Namespace, p.Name))
	}
	return nil, "several RunnerPools have that name: " + strings.Join(names, ", ") + "; give one with -n"
}

// walkPool builds the chain from pool to its VMs and finds the first
// thing that blocks it, in the order demand meets them: the pool itself,
// its scope, its template, the template's cluster, its capacity, then
// its claims. verdict describes the pool when nothing blocks.
func walkPool(w *World, pool *hfv1.RunnerPool) (links []Link, b *Blocker, verdict string) {
	links = append(links, poolLink(pool))
	links = append(links, placementLinks(pool)...)
	tmpl := findTemplate(w, pool.Namespace, pool.Spec.TemplateRef.Name)
	var cluster *hfv1.HypervisorCluster
	if tmpl != nil {
		links = append(links, templateLink(tmpl))
		if cluster = findCluster(w, tmpl.Spec.HypervisorClusterRef.Name); cluster != nil {
			links = append(links, clusterLink(cluster))
		}
	}
	claims := liveClaims(w, pool)
	for i, c := range claims {
		if i == maxClaimLinks {
			links = append(links, Link{Kind: "MachineClaim", Name: "...", State: fmt.Sprintf("and %d more", len(claims)-maxClaimLinks)})
			break
		}
		links = append(links, claimLink(w, c))
	}
	for _, check := range []func() *Blocker{
		func() *Blocker { return poolDeleting(pool) },
		func() *Blocker { return scopeBlocker(pool) },
		func() *Blocker { return overflowed(pool, templateBlocker(pool, tmpl)) },
		func() *Blocker { return overflowed(pool, clusterBlocker(tmpl, cluster)) },
		func() *Blocker { return overflowed(pool, capacityBlocker(w, pool, tmpl, claims)) },
		func() *Blocker { return poolNotReady(pool) },
		func() *Blocker { return claimsBlocker(w, claims) },
	} {
		if b = check(); b != nil {
			return links, b, ""
		}
	}
	return links, nil, poolVerdict(pool, claims)
}

// poolVerdict describes a pool nothing blocks.
func poolVerdict(pool *hfv1.RunnerPool, claims []*hfv1.MachineClaim) string {
	st := pool.Status
	switch {
	case st.PendingJobs == 0:
		return fmt.Sprintf("nothing blocks the pool: no job waits (%d ready, %d busy)", st.ReadyReplicas, st.BusyReplicas)
	case st.StartingReplicas > 0 || len(claims) > int(st.ReadyReplicas):
		return fmt.Sprintf("%d VMs are starting for %s; nothing blocks them yet", st.StartingReplicas, plural(int(st.PendingJobs), "waiting job"))
	}
	return fmt.Sprintf("%s wait; the pool wants %d VMs and has %d: it scales on its next pass", plural(int(st.PendingJobs), "job"), st.DesiredReplicas, st.Replicas)
}

func poolLink(pool *hfv1.RunnerPool) Link {
	st := pool.Status
	state := fmt.Sprintf("%s; replicas %d (ready %d, busy %d, starting %d) of min %d, max %d; desired %d; queued jobs %d",
		condSummary(pool.Status.Conditions, hfv1.ReadyCondition), st.Replicas, st.ReadyReplicas, st.BusyReplicas, st.StartingReplicas,
		pool.Spec.Scaling.MinReplicas, pool.Spec.Scaling.MaxReplicas, st.DesiredReplicas, st.PendingJobs)
	if c := hfv1.FindCondition(st.Conditions, hfv1.RunnerPoolCapacityCondition); c != nil && c.Status == metav1.ConditionFalse {
		state += "; CapacityAvailable False (" + c.Reason + ")"
	}
	return Link{Kind: "RunnerPool", Name: nsName(pool.Namespace, pool.Name), State: state}
}

// placementLinks are the rows of status.placement of a pool with
// spec.placement: each template, its cluster, the VMs it holds and
// whether it takes new ones, and why not.
func placementLinks(pool *hfv1.RunnerPool) []Link {
	var links []Link
	for _, t := range pool.Status.Placement {
		state := fmt.Sprintf("%s on HypervisorCluster %s; %s", t.State, t.HypervisorCluster, plural(int(t.Machines), "VM"))
		if t.Message != "" {
			state += ": " + t.Message
		}
		links = append(links, Link{Kind: "Placement", Name: nsName(pool.Namespace, t.Name), State: state})
	}
	return links
}

// overflowed drops a blocker of the pool's templateRef (its template,
// cluster or capacity) while another template of spec.placement takes the
// pool's new VMs (status.placement): the pool builds them there.
func overflowed(pool *hfv1.RunnerPool, b *Blocker) *Blocker {
	if b == nil {
		return nil
	}
	for i, t := range pool.Status.Placement {
		if i > 0 && t.State == hfv1.TemplateAvailable {
			return nil
		}
	}
	return b
}

func templateLink(t *hfv1.HypervisorMachineTemplate) Link {
	state := condSummary(t.Status.Conditions, hfv1.HypervisorMachineTemplateValidCondition)
	return Link{Kind: "HypervisorMachineTemplate", Name: nsName(t.Namespace, t.Name), State: state + "; cluster " + t.Spec.HypervisorClusterRef.Name}
}

func clusterLink(c *hfv1.HypervisorCluster) Link {
	return Link{Kind: "HypervisorCluster", Name: c.Name, State: fmt.Sprintf("%s; %s; %d of %d nodes connected",
		condSummary(c.Status.Conditions, hfv1.ReadyCondition), condSummary(c.Status.Conditions, hfv1.HypervisorClusterConnectedCondition),
		c.Status.ConnectedNodes, len(c.Status.Nodes))}
}

// condSummary prints "Type Status (Reason)", or "Type unknown".
func condSummary(conds []metav1.Condition, t hfv1.ConditionType) string {
	c := hfv1.FindCondition(conds, t)
	if c == nil {
		return string(t) + " not reported yet"
	}
	return fmt.Sprintf("%s %s (%s)", t, c.Status, c.Reason)
}

func condField(t hfv1.ConditionType) string { return "status.conditions[type=" + string(t) + "]" }

// falseCond is condition t when it is False.
func falseCond(conds []metav1.Condition, t hfv1.ConditionType) *metav1.Condition {
	if c := hfv1.FindCondition(conds, t); c != nil && c.Status == metav1.ConditionFalse {
		return c
	}
	return nil
}

func poolDeleting(pool *hfv1.RunnerPool) *Blocker {
	if pool.DeletionTimestamp.IsZero() {
		return nil
	}
	return &Blocker{Reason: ReasonRunnerPoolDeleting, Object: "RunnerPool " + nsName(pool.Namespace, pool.Name), Field: "metadata.deletionTimestamp",
		Message: "the pool is being deleted: it takes no job and creates no VM", Fix: "recreate the pool once it is gone, or route the jobs to another pool",
		Doc: doc("why-is-my-job-not-running")}
}

// scopeBlocker: a pool whose scope is not verified gets no job and no VM
// (internal/demand/router.go, rule 4). A check that failed on the CI
// platform's rate limit is the rate-limit family.
func scopeBlocker(pool *hfv1.RunnerPool) *Blocker {
	c := falseCond(pool.Status.Conditions, hfv1.RunnerPoolScopeVerifiedCondition)
	if c == nil {
		return nil
	}
	b := &Blocker{Reason: c.Reason, Object: "RunnerPool " + nsName(pool.Namespace, pool.Name), Field: condField(hfv1.RunnerPoolScopeVerifiedCondition),
		Message: c.Message, Doc: doc(c.Reason)}
	switch {
	case c.Reason == string(hfv1.ScopeCheckFailedReason) && strings.Contains(strings.ToLower(c.Message), "rate limit"):
		b.Reason, b.Doc = string(hfv1.RateLimitedReason), doc(string(hfv1.RateLimitedReason))
		b.Fix = "wait for the CI platform's rate limit to reset (the check is repeated), or give the template's credentials a larger limit (a GitHub App rather than a PAT)"
	case c.Reason == string(hfv1.ScopeCheckFailedReason):
		b.Fix = "the CI platform did not answer the scope check; it is repeated: check the platform's status and the operator's egress"
	case c.Reason == string(hfv1.TemplateNotReadyReason):
		b.Fix = "create the pool's template (spec.templateRef)"
	default:
		b.Fix = "give the template's credentials the runner-management permission on the pool's repository or organization, or fix the pool's scope"
	}
	return b
}

// templateBlocker: a missing or invalid template builds no VM.
func templateBlocker(pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate) *Blocker {
	if tmpl == nil {
		return &Blocker{Reason: string(hfv1.TemplateNotReadyReason), Object: "RunnerPool " + nsName(pool.Namespace, pool.Name), Field: "spec.templateRef",
			Message: fmt.Sprintf("HypervisorMachineTemplate %s does not exist", nsName(pool.Namespace, pool.Spec.TemplateRef.Name)),
			Fix:     "create the template or fix spec.templateRef.name", Doc: doc(string(hfv1.TemplateNotReadyReason))}
	}
	c := falseCond(tmpl.Status.Conditions, hfv1.HypervisorMachineTemplateValidCondition)
	field := condField(hfv1.HypervisorMachineTemplateValidCondition)
	if c == nil {
		c, field = falseCond(tmpl.Status.Conditions, hfv1.ReadyCondition), condField(hfv1.ReadyCondition)
	}
	if c == nil || c.Reason == string(hfv1.ClusterUnavailableReason) {
		// A template waiting for its cluster is the cluster's blocker.
		return nil
	}
	return &Blocker{Reason: c.Reason, Object: "HypervisorMachineTemplate " + nsName(tmpl.Namespace, tmpl.Name), Field: field, Message: c.Message,
		Fix: "fix the template as its condition's message says; it is validated again on every change", Doc: doc(c.Reason)}
}

// clusterBlocker: a cluster that is missing, not connected or not Ready
// builds no VM.
func clusterBlocker(tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster) *Blocker {
	if tmpl == nil {
		return nil
	}
	if cluster == nil {
		return &Blocker{Reason: ReasonClusterNotFound, Object: "HypervisorMachineTemplate " + nsName(tmpl.Namespace, tmpl.Name), Field: "spec.hypervisorClusterRef",
			Message: fmt.Sprintf("HypervisorCluster %s does not exist", tmpl.Spec.HypervisorClusterRef.Name),
			Fix:     "create the HypervisorCluster or fix the template's spec.hypervisorClusterRef.name", Doc: doc(string(hfv1.ClusterUnavailableReason))}
	}
	for _, t := range []hfv1.ConditionType{hfv1.HypervisorClusterConnectedCondition, hfv1.ReadyCondition} {
		if c := falseCond(cluster.Status.Conditions, t); c != nil {
			return &Blocker{Reason: c.Reason, Object: "HypervisorCluster " + cluster.Name, Field: condField(t), Message: c.Message,
				Fix: "the cluster is down for HyperFleet: fix what its condition names (endpoint, credentials, TLS); claims wait and go on once it is Ready",
				Doc: doc(c.Reason)}
		}
	}
	return nil
}

// poolNotReady: the pool's Ready False for a reason none of the checks
// before named (a refused field, an invalid spec).
func poolNotReady(pool *hfv1.RunnerPool) *Blocker {
	c := falseCond(pool.Status.Conditions, hfv1.ReadyCondition)
	if c == nil {
		return nil
	}
	return &Blocker{Reason: c.Reason, Object: "RunnerPool " + nsName(pool.Namespace, pool.Name), Field: condField(hfv1.ReadyCondition), Message: c.Message,
		Fix: "fix what the condition's message names", Doc: doc(c.Reason)}
}

func findPool(w *World, ns, name string) *hfv1.RunnerPool {
	for i := range w.Pools {
		if w.Pools[i].Namespace == ns && w.Pools[i].Name == name {
			return &w.Pools[i]
		}
	}
	return nil
}

func findTemplate(w *World, ns, name string) *hfv1.HypervisorMachineTemplate {
	for i := range w.Templates {
		if w.Templates[i].Namespace == ns && w.Templates[i].Name == name {
			return &w.Templates[i]
		}
	}
	return nil
}

func findCluster(w *World, name string) *hfv1.HypervisorCluster {
	for i := range w.Clusters {
		if w.Clusters[i].Name == name {
			return &w.Clusters[i]
		}
	}
	return nil
}

// liveClaims are pool's claims that have not ended.
func liveClaims(w *World, pool *hfv1.RunnerPool) []*hfv1.MachineClaim {
	var out []*hfv1.MachineClaim
	for i := range w.Claims {
		c := &w.Claims[i]
		if c.Namespace == pool.Namespace && c.Spec.RunnerPoolRef != nil && c.Spec.RunnerPoolRef.Name == pool.Name && !c.Ended() {
			out = append(out, c)
		}
	}
	return out
}

// claimOfRunner is the claim whose runner has that name.
func claimOfRunner(w *World, ns, runner string) *hfv1.MachineClaim {
	for i := range w.Claims {
		c := &w.Claims[i]
		if runner != "" && c.Namespace == ns && c.Status.Bootstrap != nil && c.Status.Bootstrap.RunnerName == runner {
			return c
		}
	}
	return nil
}
