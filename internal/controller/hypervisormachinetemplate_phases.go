package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim"
	"github.com/hyperfleet/hyperfleet/internal/controller/refusal"
	"github.com/hyperfleet/hyperfleet/internal/ipam"
	"github.com/hyperfleet/hyperfleet/internal/isolation"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/secretref"
	"github.com/hyperfleet/hyperfleet/internal/tenancy"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// The validation phases of a HypervisorMachineTemplate, in the order
// Reconcile runs them: the first that finds the template unusable records
// why (invalid) and ends the pass.

// invalid records the template as not valid for reason and ends the pass.
// Watches on the cluster, namespaces, Secrets and IPPools wake the
// template; looking again within waitForDependency also notices templates
// appearing on the hypervisor.
func (s *templateScope) invalid(reason hfv1.ConditionReason, msg string) (phase.Result, error) {
	s.validity = notReady(reason, msg)
	return phase.StopAndRequeue(waitForDependency), nil
}

// unreachable records a template whose check on a Ready cluster failed on
// the way (a dropped request, a 5xx from the API proxy) and ends the pass.
// No watch fires for such a blip: the cluster stays Ready, so the template
// looks again after transientRecheck, not waitForDependency, or its claims
// would wait a minute for a request that fails once.
func (s *templateScope) unreachable(msg string) (phase.Result, error) {
	s.validity = notReady(hfv1.ClusterUnavailableReason, msg)
	return phase.StopAndRequeue(transientRecheck), nil
}

// reportDeprecated tells a template stored with fields under their earlier
// spelling (templateId, appId, installationId: api/v1alpha1/spelling.go)
// to rename them, in one Normal DeprecatedField event per generation (per
// operator start: the requeues in between stay quiet). The fields still
// work, read under their new names, so nothing else changes; the API
// server refuses them on the template's next write that touches them.
func (r *HypervisorMachineTemplateReconciler) reportDeprecated(_ context.Context, s *templateScope) (phase.Result, error) {
	tmpl := s.tmpl
	key := client.ObjectKeyFromObject(tmpl).String()
	old := tmpl.OldSpecSpellings()
	if len(old) == 0 {
		r.deprecationsReported.Delete(key)
		return phase.Next(), nil
	}
	generation := fmt.Sprintf("%s/%d", tmpl.UID, tmpl.Generation)
	if was, ok := r.deprecationsReported.Swap(key, generation); ok && was == generation {
		return phase.Next(), nil
	}
	fields := make([]string, len(old))
	for i, o := range old {
		fields[i] = fmt.Sprintf("%s.%s is now %s: rename the field", strings.Join(o.Path, "."), o.Old, o.New)
	}
	r.Recorder.Event(tmpl, corev1.EventTypeNormal, "DeprecatedField",
		strings.Join(fields, "; ")+" (the stored template keeps working; a write that changes these fields must use the new spelling)")
	return phase.Next(), nil
}

// refuseUnsupported stops a template that sets a field this operator does
// not act on: nothing else matters until it is removed.
func (r *HypervisorMachineTemplateReconciler) refuseUnsupported(_ context.Context, s *templateScope) (phase.Result, error) {
	if ref := refusal.Template(r.Workloads, s.tmpl); ref != nil {
		return s.invalid(ref.Reason, ref.Message)
	}
	return phase.Next(), nil
}

// checkDHCPClient stops a template whose spec.network.dhcp asks the image's
// DHCP client for what it cannot be configured to do
// (vmspec.DHCPClientProblem): its VMs would boot and not get the address
// the template promises.
func (r *HypervisorMachineTemplateReconciler) checkDHCPClient(_ context.Context, s *templateScope) (phase.Result, error) {
	if msg := vmspec.DHCPClientProblem(s.tmpl); msg != "" {
		return s.invalid(hfv1.DHCPClientUnsupportedReason, msg)
	}
	return phase.Next(), nil
}

// loadCluster reads the template's HypervisorCluster.
func (r *HypervisorMachineTemplateReconciler) loadCluster(ctx context.Context, s *templateScope) (phase.Result, error) {
	name := s.tmpl.Spec.HypervisorClusterRef.Name
	cluster := &hfv1.HypervisorCluster{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, cluster); err != nil {
		if apierrors.IsNotFound(err) {
			return s.invalid(hfv1.ClusterUnavailableReason, fmt.Sprintf("spec.hypervisorClusterRef: HypervisorCluster %s does not exist", name))
		}
		return phase.Stop(), fmt.Errorf("read HypervisorCluster %s: %w", name, err)
	}
	s.cluster = cluster
	return phase.Next(), nil
}

// checkTenancy applies the cluster's admin allow-lists (docs/security.md).
// A namespace the cluster does not admit learns nothing about the cluster:
// the template is not validated against it, and what an earlier validation
// recorded (the resolved template, its node and storage, the hash over the
// cluster's settings) is removed from its status. A failed read is
// returned as an error (and retried) without touching the status.
func (r *HypervisorMachineTemplateReconciler) checkTenancy(ctx context.Context, s *templateScope) (phase.Result, error) {
	tmpl, cluster := s.tmpl, s.cluster
	rules, admitted, err := tenancy.RulesFor(ctx, r.Client, cluster, tmpl.Namespace)
	switch {
	case errors.Is(err, tenancy.ErrInvalidSelector):
		// The error quotes the cluster's selectors: log it, do not show
		// it to the tenant.
		ctrl.LoggerFrom(ctx).Error(err, "The cluster's allow-lists admit nobody", "HypervisorCluster", cluster.Name)
	case err != nil:
		return phase.Stop(), fmt.Errorf("apply the allow-lists of HypervisorCluster %s: %w", cluster.Name, err)
	}
	if err != nil || !admitted {
		tmpl.Status.ResolvedTemplate = nil
		tmpl.Status.TemplateHash = ""
		return s.invalid(hfv1.NamespaceNotAllowedReason, fmt.Sprintf(
			"HypervisorCluster %s does not admit namespace %s (its spec.allowedNamespaces and spec.tenancy); ask the cluster's owner to admit the namespace, or set spec.hypervisorClusterRef to another cluster",
			cluster.Name, tmpl.Namespace))
	}
	if problems := tenancy.Violations(tmpl, cluster, rules, r.Workloads.APIHosts(tmpl)); len(problems) > 0 {
		return s.invalid(hfv1.NotAllowedByClusterReason, fmt.Sprintf(
			"HypervisorCluster %s does not allow this template in namespace %s (spec.tenancy): %s; change the template, or ask the cluster's owner to allow these values",
			cluster.Name, tmpl.Namespace, strings.Join(problems, "; ")))
	}
	return phase.Next(), nil
}

// checkIsolation checks that the network isolation policy the template
// names (or its cluster's default) is one the cluster defines, and that
// its rules compile: a VM is never built without the policy it was meant
// to get. The policy's proxy addresses are resolved when a claim is
// placed, not here.
func (r *HypervisorMachineTemplateReconciler) checkIsolation(_ context.Context, s *templateScope) (phase.Result, error) {
	policy, ok, err := isolation.PolicyFor(s.tmpl, s.cluster)
	if err != nil {
		return s.invalid(hfv1.IsolationPolicyNotFoundReason, err.Error())
	}
	if ok {
		for i, e := range policy.Egress {
			for _, p := range e.Ports {
				if _, err := isolation.ParsePorts(p); err != nil {
					return s.invalid(hfv1.TemplateInvalidReason, fmt.Sprintf("isolation policy %s of HypervisorCluster %s: egress[%d]: %v; ask the cluster's owner to fix it", policy.Name, s.cluster.Name, i, err))
				}
			}
		}
	}
	return phase.Next(), nil
}

// checkIdentity checks what a template that attests needs of its cluster
// and of this operator (machineclaim.CheckTemplateIdentity).
func (r *HypervisorMachineTemplateReconciler) checkIdentity(_ context.Context, s *templateScope) (phase.Result, error) {
	if reason, msg := machineclaim.CheckTemplateIdentity(s.tmpl, s.cluster, r.Identity.Issuer != nil, r.Identity.Broker != nil); reason != "" {
		return s.invalid(reason, msg)
	}
	return phase.Next(), nil
}

// checkMetadata checks that spec.metadata can be put on a MachineClaim.
func (r *HypervisorMachineTemplateReconciler) checkMetadata(_ context.Context, s *templateScope) (phase.Result, error) {
	if msg := invalidClaimMetadata(s.tmpl.Spec.Metadata); msg != "" {
		return s.invalid(hfv1.TemplateInvalidReason, msg)
	}
	return phase.Next(), nil
}

// checkSecrets checks that every Secret key the template references
// exists.
func (r *HypervisorMachineTemplateReconciler) checkSecrets(ctx context.Context, s *templateScope) (phase.Result, error) {
	if msg := r.missingSecrets(ctx, s.tmpl); msg != "" {
		return s.invalid(hfv1.SecretNotFoundReason, msg)
	}
	return phase.Next(), nil
}

// resolveRunnerRelease resolves the runner version the template names
// (resolveRunner).
func (r *HypervisorMachineTemplateReconciler) resolveRunnerRelease(ctx context.Context, s *templateScope) (phase.Result, error) {
	if reason, msg := r.resolveRunner(ctx, s.tmpl); reason != "" {
		return s.invalid(hfv1.ConditionReason(reason), msg)
	}
	return phase.Next(), nil
}

// loadIPPool reads and parses the IPPools of a template with a static
// network: one, or an IPv4 and an IPv6 one (dual stack). Two pools of one
// family are refused here, as the API server cannot read the pools to
// refuse them at admission.
func (r *HypervisorMachineTemplateReconciler) loadIPPool(ctx context.Context, s *templateScope) (phase.Result, error) {
	field := "spec.network.ipPoolRef"
	if len(s.tmpl.Spec.Network.IPPoolRefs) > 0 {
		field = "spec.network.ipPoolRefs"
	}
	var pools []*ipam.Pool
	for _, name := range s.tmpl.Spec.Network.IPPoolNames() {
		obj := &hfv1.IPPool{}
		if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, obj); err != nil {
			return s.invalid(hfv1.TemplateInvalidReason, fmt.Sprintf("%s: IPPool %s: %v", field, name, err))
		}
		p, err := ipam.ParsePool(machineclaim.PoolSpec(obj))
		if err != nil {
			return s.invalid(hfv1.TemplateInvalidReason, fmt.Sprintf("%s: IPPool %s is invalid: %v", field, name, err))
		}
		pools = append(pools, p)
	}
	if msg := familyConflict(s.tmpl.Spec.Network.IPPoolNames(), pools); msg != "" {
		return s.invalid(hfv1.IPPoolFamilyConflictReason, msg)
	}
	s.pools = pools
	return phase.Next(), nil
}

// familyConflict says why pools (named names) cannot serve one dual-stack
// VM, empty when they can: a VM takes one address per family.
func familyConflict(names []string, pools []*ipam.Pool) string {
	if len(pools) != 2 || pools[0].Family != pools[1].Family {
		return ""
	}
	return fmt.Sprintf("spec.network.ipPoolRefs: IPPools %s and %s are both %s, but a dual-stack VM takes one address per family: name one IPv4 and one IPv6 IPPool (or one pool in ipPoolRef for a single-stack VM)",
		names[0], names[1], pools[0].Family)
}

// render computes the template's drift hash and checks that a VM's full
// cloud-init and agent configuration render: the hash renders without
// per-VM values, and a template whose VMs cannot render would fail every
// claim.
func (r *HypervisorMachineTemplateReconciler) render(_ context.Context, s *templateScope) (phase.Result, error) {
	tmpl, cluster := s.tmpl, s.cluster
	// The agent server's binaries are fixed at start; its CA may be read
	// later (AgentUnavailable until then), which the requeue of an
	// invalid template (waitForDependency) notices.
	if err := vmspec.CheckSource(tmpl, cluster); err != nil {
		return s.invalid(hfv1.TemplateInvalidReason, err.Error())
	}
	vars := vmspec.TemplateVars(r.Workloads, tmpl, cluster, s.pools)
	if err := vmspec.SetAgentVars(r.Workloads, tmpl, r.Agent, &vars); err != nil {
		return s.invalid(hfv1.AgentUnavailableReason, err.Error())
	}
	hash, err := vmspec.TemplateHash(r.Workloads, tmpl, cluster, s.pools, r.Agent)
	if err != nil {
		return s.invalid(hfv1.TemplateInvalidReason, err.Error())
	}
	if err := vmspec.CheckTemplate(r.Workloads, tmpl, cluster, s.pools, r.Agent); err != nil {
		return s.invalid(hfv1.TemplateInvalidReason, err.Error())
	}
	s.hash = hash
	return phase.Next(), nil
}

// checkOnHypervisor checks the template's source on its cluster: it
// exists, is a template, has the guest agent a template that attests
// needs, and sits on storage that can hold the linked clones it asks for.
func (r *HypervisorMachineTemplateReconciler) checkOnHypervisor(ctx context.Context, s *templateScope) (phase.Result, error) {
	cluster := s.cluster
	p, health, connected := r.Registry.Provider(cluster.Name)
	if !connected || !health.Ready {
		return s.invalid(hfv1.ClusterUnavailableReason, fmt.Sprintf("HypervisorCluster %s is not ready: %s", cluster.Name, health.Message))
	}
	kind, ok := provider.KindOf(cluster.Spec.Provider)
	if !ok {
		return s.invalid(hfv1.ClusterUnavailableReason, fmt.Sprintf("HypervisorCluster %s: spec.provider: no implementation for %q in this operator build", cluster.Name, cluster.Spec.Provider))
	}
	src := vmspec.Source(s.tmpl, cluster)
	info, err := p.ValidateTemplate(ctx, src)
	if err != nil {
		if provider.Classify(err) == provider.ClassTransient && !errors.Is(err, provider.ErrNotFound) {
			return s.unreachable(err.Error())
		}
		return s.invalid(templateProblemReason(err), err.Error())
	}
	if !info.GuestFiles {
		what := "the runner credential reaches"
		if machineclaim.Attests(s.tmpl) {
			what = "spec.attestation.method is join-token, and the join token reaches"
		}
		return s.invalid(hfv1.GuestAgentRequiredReason, fmt.Sprintf(
			"hypervisor template %s has no guest agent: %s only the running VM, through its guest agent, never its cloud-init, which can be read off the hypervisor's storage. %s",
			kind.DescribeTemplate(info), what, kind.Advice(provider.AdviceGuestAgent, info)))
	}
	if src.Linked && !info.LinkedCloneSupported {
		return s.invalid(hfv1.LinkedCloneUnsupportedReason, kind.Advice(provider.AdviceLinkedClone, info))
	}
	s.kind = kind
	s.info = info
	return phase.Next(), nil
}

// templateProblemReason is the condition reason of a template the
// provider refused: the provider's own (NotATemplate,
// LinkedCloneUnsupported ...), a few renamed to the API's.
func templateProblemReason(err error) hfv1.ConditionReason {
	reason := hfv1.ConditionReason(provider.ReasonOf(err))
	switch {
	case errors.Is(err, provider.ErrNotFound):
		return hfv1.TemplateNotFoundReason
	case provider.Classify(err) == provider.ClassTransient:
		return hfv1.ClusterUnavailableReason
	case reason == "ProviderError":
		return hfv1.TemplateInvalidReason
	}
	return reason
}

// recordValid records a template that passed every check: its hash and
// where it resolved to. It is validated again now and then: someone may
// delete the template on the hypervisor.
func (r *HypervisorMachineTemplateReconciler) recordValid(_ context.Context, s *templateScope) (phase.Result, error) {
	st, info := &s.tmpl.Status, s.info
	st.TemplateHash = s.hash
	resolved := s.kind.ResolvedTemplate(info)
	st.ResolvedTemplate = &resolved
	where := s.cluster.Name + "/" + info.Node
	if len(info.Nodes) > 0 {
		// A template with a copy on each of several nodes.
		where = fmt.Sprintf("%s, nodes %s,", s.cluster.Name, strings.Join(info.Nodes, ", "))
	}
	s.validity = isReady(fmt.Sprintf("Template %s on %s is valid", s.kind.DescribeTemplate(info), where))
	return phase.Recheck(10 * waitForDependency), nil
}

// invalidClaimMetadata says why spec.metadata cannot be put on a
// MachineClaim, "" if it can: the API server would refuse every claim a
// RunnerPool creates with it.
func invalidClaimMetadata(md *hfv1.ObjectMetadata) string {
	if md == nil {
		return ""
	}
	path := field.NewPath("spec", "metadata")
	errs := metav1validation.ValidateLabels(md.Labels, path.Child("labels"))
	errs = append(errs, apimachineryvalidation.ValidateAnnotations(md.Annotations, path.Child("annotations"))...)
	if len(errs) == 0 {
		return ""
	}
	return errs.ToAggregate().Error() + "; MachineClaims need valid Kubernetes labels and annotations"
}

// missingSecrets names every referenced Secret key that does not exist.
func (r *HypervisorMachineTemplateReconciler) missingSecrets(ctx context.Context, tmpl *hfv1.HypervisorMachineTemplate) string {
	refs := fieldindex.TemplateSecretRefs(r.Workloads, tmpl)
	var missing []string
	for _, f := range slices.Sorted(maps.Keys(refs)) {
		ref := refs[f]
		if _, err := secretref.Value(ctx, r.Client, f, tmpl.Namespace, ref.Name, ref.Key); err != nil {
			missing = append(missing, err.Error())
			ctrl.LoggerFrom(ctx).V(1).Info("Template Secret missing", "field", f, "Secret", klog.KRef(tmpl.Namespace, ref.Name))
		}
	}
	return strings.Join(missing, "; ")
}
