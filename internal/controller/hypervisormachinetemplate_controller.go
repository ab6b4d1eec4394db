package controller

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/claimidentity"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/ipam"
	"github.com/hyperfleet/hyperfleet/internal/patch"
	"github.com/hyperfleet/hyperfleet/internal/secretref"
	"github.com/hyperfleet/hyperfleet/internal/tenancy"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// HypervisorMachineTemplateReconciler validates each template against its
// cluster and computes its drift hash (docs/architecture.md, "Template
// drift hash").
type HypervisorMachineTemplateReconciler struct {
	Client   client.Client
	Registry *hypervisors.Registry
	Recorder record.EventRecorder
	// Agent finds the agent binaries the operator serves; nil when it
	// serves none (templates with agentSource Operator are then not Ready).
	Agent vmspec.AgentLocator
	// Runners resolves the runner version a template names to a package
	// and its checksum; nil when the workload side publishes no releases
	// (templates that name a version are then not Ready).
	Runners RunnerReleaseSource
	// Workloads are the CI platform back-ends that read the templates'
	// runner software and credentials.
	Workloads *workload.Backends
	// Identity says whether this operator can give VMs SPIFFE identities:
	// it holds an identity issuer and runs the credential broker.
	Identity IdentitySupport
}

// IdentitySupport is what templates that attest with SPIRE need of the
// operator itself.
type IdentitySupport struct {
	// Issuer issues join tokens and entries; nil without one.
	Issuer *identity.Issuer
	// Broker is the credential broker; nil when none runs.
	Broker BrokerEndpoint
}

// SetupWithManager registers the controller.
func (r *HypervisorMachineTemplateReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&hfv1.HypervisorMachineTemplate{}).
		Watches(&hfv1.HypervisorCluster{}, handler.EnqueueRequestsFromMapFunc(r.templatesForCluster)).
		WatchesMetadata(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.templatesForSecret)).
		Watches(&hfv1.IPPool{}, handler.EnqueueRequestsFromMapFunc(r.templatesForPool)).
		// A RunnerPool's scope decides the ReusableCredential condition;
		// its frequent status writes do not concern the template.
		Watches(&hfv1.RunnerPool{}, handler.EnqueueRequestsFromMapFunc(templateOfRunnerPool),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// A namespace's labels decide which allow-list entries apply.
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(r.templatesForNamespace)).
		Watches(&hfv1.MachineClaim{}, handler.EnqueueRequestsFromMapFunc(r.deletedTemplateOfClaim)).
		Named("hypervisormachinetemplate").
		Complete(r)
}

func (r *HypervisorMachineTemplateReconciler) templatesForCluster(ctx context.Context, o client.Object) []reconcile.Request {
	return r.templateRequests(ctx, client.MatchingFields{templateClusterIndex: o.GetName()})
}

func (r *HypervisorMachineTemplateReconciler) templatesForPool(ctx context.Context, o client.Object) []reconcile.Request {
	return r.templateRequests(ctx, client.MatchingFields{templatePoolIndex: o.GetName()})
}

func (r *HypervisorMachineTemplateReconciler) templatesForNamespace(ctx context.Context, o client.Object) []reconcile.Request {
	return r.templateRequests(ctx, client.InNamespace(o.GetName()))
}

func (r *HypervisorMachineTemplateReconciler) templatesForSecret(ctx context.Context, o client.Object) []reconcile.Request {
	return r.templateRequests(ctx, client.InNamespace(o.GetNamespace()), client.MatchingFields{templateSecretIndex: o.GetName()})
}

func (r *HypervisorMachineTemplateReconciler) templateRequests(ctx context.Context, opts ...client.ListOption) []reconcile.Request {
	var list hfv1.HypervisorMachineTemplateList
	if err := r.Client.List(ctx, &list, opts...); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "List templates")
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return out
}

// Reconcile implements reconcile.Reconciler.
func (r *HypervisorMachineTemplateReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	tmpl := &hfv1.HypervisorMachineTemplate{}
	if err := r.Client.Get(ctx, req.NamespacedName, tmpl); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	// Optimistic lock: a stale copy must not drop a finalizer added since
	// (a merge patch replaces the whole list).
	h := patch.NewHelper(r.Client, tmpl, patch.WithOptimisticLock())
	if !tmpl.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, h, tmpl)
	}
	if wrote, err := templateInUse(tmpl).ensureFinalizer(ctx, h); wrote || err != nil {
		return ctrl.Result{}, err
	}
	before := tmpl.DeepCopy()
	result, err := r.validate(ctx, tmpl)
	r.reportReusableCredential(ctx, tmpl)
	if perr := h.PatchStatus(ctx, tmpl); perr != nil {
		return ctrl.Result{}, perr
	}
	r.recordTransition(before, tmpl)
	return result, err
}

// templateInUse is the template as its claims use it.
func templateInUse(tmpl *hfv1.HypervisorMachineTemplate) inUse {
	return inUse{obj: tmpl, conditions: &tmpl.Status.Conditions, finalizer: hfv1.HypervisorMachineTemplateFinalizer, usage: "MachineClaims built from this template"}
}

// usesTemplate reports whether a claim began to use its template and may
// need it again: it has a VM (recorded, or reserved and not ended), or a
// runner registered with the template's credentials. A claim that did not
// waits for its template as for any missing one.
func usesTemplate(c *hfv1.MachineClaim) bool {
	if !controllerutil.ContainsFinalizer(c, hfv1.MachineClaimFinalizer) {
		return false
	}
	b := c.Status.Bootstrap
	return c.Status.VMRef != nil || (c.Annotations[hfv1.VMReservationAnnotation] != "" && !c.Ended()) ||
		(b != nil && (b.RunnerName != "" || b.RunnerID != 0))
}

// reconcileDelete holds a deleted template while claims use it (their VMs
// are built from it, their runners removed with its credentials): it is
// not validated any more, no new VM is built from it, and it goes once
// the last of them is gone.
func (r *HypervisorMachineTemplateReconciler) reconcileDelete(ctx context.Context, h *patch.Helper, tmpl *hfv1.HypervisorMachineTemplate) (ctrl.Result, error) {
	var claims hfv1.MachineClaimList
	if err := r.Client.List(ctx, &claims, client.InNamespace(tmpl.Namespace), client.MatchingFields{claimTemplateIndex: tmpl.Name}); err != nil {
		return ctrl.Result{}, err
	}
	held, err := templateInUse(tmpl).releaseWhenUnused(ctx, h, r.Recorder, claimNames(claims.Items, usesTemplate))
	if err != nil || !held {
		return ctrl.Result{}, err
	}
	// The claims' watch wakes the template when one lets go; this is the
	// safety net.
	return ctrl.Result{RequeueAfter: waitForDependency}, nil
}

// deletedTemplateOfClaim wakes a claim's template while it is being
// deleted, so that it goes as soon as its last claim lets go; a template
// in use is not revalidated for every claim's status write.
func (r *HypervisorMachineTemplateReconciler) deletedTemplateOfClaim(ctx context.Context, o client.Object) []reconcile.Request {
	c := o.(*hfv1.MachineClaim)
	key := client.ObjectKey{Namespace: c.Namespace, Name: c.Spec.TemplateRef.Name}
	var tmpl hfv1.HypervisorMachineTemplate
	if err := r.Client.Get(ctx, key, &tmpl); err != nil || tmpl.DeletionTimestamp.IsZero() {
		return nil
	}
	return []reconcile.Request{{NamespacedName: key}}
}

// recordTransition emits an event when validity changes.
func (r *HypervisorMachineTemplateReconciler) recordTransition(before, after *hfv1.HypervisorMachineTemplate) {
	was := hfv1.FindCondition(before.Status.Conditions, hfv1.HypervisorMachineTemplateValidCondition)
	now := hfv1.FindCondition(after.Status.Conditions, hfv1.HypervisorMachineTemplateValidCondition)
	if now == nil || (was != nil && was.Status == now.Status && was.Reason == now.Reason) {
		return
	}
	if now.Status == metav1.ConditionTrue {
		r.Recorder.Eventf(after, corev1.EventTypeNormal, "Validated", "%s (hash %s)", now.Message, shortHash(after.Status.TemplateHash))
	} else {
		r.Recorder.Event(after, corev1.EventTypeWarning, now.Reason, conditions.Truncate(now.Message, 1024))
	}
}

func (r *HypervisorMachineTemplateReconciler) validate(ctx context.Context, tmpl *hfv1.HypervisorMachineTemplate) (ctrl.Result, error) {
	invalid := func(reason hfv1.ConditionReason, msg string) (ctrl.Result, error) {
		return markTemplateInvalid(tmpl, reason, msg), nil
	}

	// Fields accepted but not acted on come first: nothing else matters
	// until they are removed.
	if ref := templateRefusal(r.Workloads, tmpl); ref != nil {
		return invalid(ref.reason, ref.message)
	}
	cluster := &hfv1.HypervisorCluster{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: tmpl.Spec.HypervisorClusterRef.Name}, cluster); err != nil {
		if apierrors.IsNotFound(err) {
			return invalid(hfv1.ClusterUnavailableReason, fmt.Sprintf("spec.hypervisorClusterRef: HypervisorCluster %s does not exist", tmpl.Spec.HypervisorClusterRef.Name))
		}
		return ctrl.Result{}, err
	}
	if res, done, err := r.checkTenancy(ctx, tmpl, cluster); done || err != nil {
		return res, err
	}
	if reason, msg := claimidentity.CheckTemplate(tmpl, cluster, r.Identity.Issuer != nil, r.Identity.Broker != nil); reason != "" {
		return invalid(reason, msg)
	}
	if msg := invalidClaimMetadata(tmpl.Spec.Metadata); msg != "" {
		return invalid(hfv1.TemplateInvalidReason, msg)
	}
	if msg := r.missingSecrets(ctx, tmpl); msg != "" {
		return invalid(hfv1.SecretNotFoundReason, msg)
	}
	if reason, msg := r.resolveRunner(ctx, tmpl); reason != "" {
		return invalid(hfv1.ConditionReason(reason), msg)
	}
	var pool *ipam.Pool
	if ref := tmpl.Spec.Network.IPPoolRef; ref != nil && tmpl.Spec.Network.Mode == hfv1.NetworkModeStatic {
		obj := &hfv1.IPPool{}
		if err := r.Client.Get(ctx, client.ObjectKey{Name: ref.Name}, obj); err != nil {
			return invalid(hfv1.TemplateInvalidReason, fmt.Sprintf("spec.network.ipPoolRef: IPPool %s: %v", ref.Name, err))
		}
		p, err := ipam.ParsePool(ipamSpec(obj))
		if err != nil {
			return invalid(hfv1.TemplateInvalidReason, fmt.Sprintf("spec.network.ipPoolRef: IPPool %s is invalid: %v", ref.Name, err))
		}
		pool = p
	}
	// The agent server is configured at start: only a restart changes the
	// answer, and every template is reconciled then.
	vars := vmspec.TemplateVars(r.Workloads, tmpl, cluster, pool)
	if err := vmspec.SetAgentVars(r.Workloads, tmpl, r.Agent, &vars); err != nil {
		return invalid(hfv1.AgentUnavailableReason, err.Error())
	}
	hash, err := vmspec.TemplateHash(r.Workloads, tmpl, cluster, pool, r.Agent)
	if err != nil {
		return invalid(hfv1.TemplateInvalidReason, err.Error())
	}
	// The hash renders without per-VM values; a VM's full cloud-init and
	// agent configuration must render too, or every claim would fail.
	if err := vmspec.CheckTemplate(r.Workloads, tmpl, cluster, pool, r.Agent); err != nil {
		return invalid(hfv1.TemplateInvalidReason, err.Error())
	}
	p, health, connected := r.Registry.Provider(cluster.Name)
	if !connected || !health.Ready {
		return invalid(hfv1.ClusterUnavailableReason, fmt.Sprintf("HypervisorCluster %s is not ready: %s", cluster.Name, health.Message))
	}
	src := vmspec.Source(tmpl)
	info, err := p.ValidateTemplate(ctx, src)
	if err != nil {
		// The provider's reasons (NotATemplate, LinkedCloneUnsupported ...)
		// are the condition's reasons; a few are renamed to the API's.
		reason := hfv1.ConditionReason(provider.ReasonOf(err))
		switch {
		case errors.Is(err, provider.ErrNotFound):
			reason = hfv1.TemplateNotFoundReason
		case provider.Classify(err) == provider.ClassTransient:
			reason = hfv1.ClusterUnavailableReason
		case reason == "ProviderError":
			reason = hfv1.TemplateInvalidReason
		}
		return invalid(reason, err.Error())
	}
	if !info.GuestFiles {
		what := "the runner credential reaches"
		if claimidentity.Attests(tmpl) {
			what = "spec.attestation.method is join-token, and the join token reaches"
		}
		return invalid(hfv1.GuestAgentRequiredReason, fmt.Sprintf(
			"hypervisor template %d has no guest agent: %s only the running VM, through its guest agent, never its cloud-init, which can be read off the hypervisor's storage. Enable it on the template (Proxmox VE: qm set %d --agent enabled=1, with qemu-guest-agent in the image; docs/templates.md)",
			info.ID, what, info.ID))
	}
	if src.Linked && !info.LinkedCloneSupported {
		return invalid(hfv1.LinkedCloneUnsupportedReason, fmt.Sprintf(
			"spec.source.proxmox.cloneMode: template %d is on storage %s, which cannot hold linked clones; use cloneMode: full or move the template to LVM-thin, ZFS, RBD or qcow2 on a directory",
			info.ID, strings.Join(info.Storages, ", ")))
	}
	tmpl.Status.TemplateHash = hash
	tmpl.Status.ResolvedTemplate = &hfv1.ResolvedTemplate{VMID: int32(info.ID), Node: info.Node}
	if len(info.Storages) > 0 {
		tmpl.Status.ResolvedTemplate.Storage = info.Storages[0]
	}
	msg := fmt.Sprintf("Template %d (%s) on %s/%s is valid", info.ID, info.Name, cluster.Name, info.Node)
	conditions.Set(&tmpl.Status.Conditions, tmpl.Generation, hfv1.HypervisorMachineTemplateValidCondition, metav1.ConditionTrue, hfv1.ReadyReason, msg)
	conditions.Set(&tmpl.Status.Conditions, tmpl.Generation, hfv1.ReadyCondition, metav1.ConditionTrue, hfv1.ReadyReason, msg)
	tmpl.Status.ObservedGeneration = tmpl.Generation
	// Re-validate now and then: someone may delete the template on the
	// hypervisor.
	return ctrl.Result{RequeueAfter: 10 * waitForDependency}, nil
}

// checkTenancy applies the cluster's admin allow-lists (docs/security.md).
// A namespace the cluster does not admit learns nothing about the cluster:
// the template is not validated against it, and what an earlier validation
// recorded (the resolved template, its node and storage, the hash over the
// cluster's settings) is removed from its status. done is true when the
// template is invalid and res is the result to return; a failed read is
// returned as err (and retried) without touching the status.
func (r *HypervisorMachineTemplateReconciler) checkTenancy(ctx context.Context, tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster) (res ctrl.Result, done bool, err error) {
	invalid := func(reason hfv1.ConditionReason, msg string) (ctrl.Result, bool, error) {
		return markTemplateInvalid(tmpl, reason, msg), true, nil
	}
	rules, admitted, err := tenancy.RulesFor(ctx, r.Client, cluster, tmpl.Namespace)
	switch {
	case errors.Is(err, tenancy.ErrInvalidSelector):
		// The error quotes the cluster's selectors: log it, do not show
		// it to the tenant.
		ctrl.LoggerFrom(ctx).Error(err, "The cluster's allow-lists admit nobody", "HypervisorCluster", cluster.Name)
	case err != nil:
		return ctrl.Result{}, false, fmt.Errorf("apply the allow-lists of HypervisorCluster %s: %w", cluster.Name, err)
	}
	if err != nil || !admitted {
		tmpl.Status.ResolvedTemplate = nil
		tmpl.Status.TemplateHash = ""
		return invalid(hfv1.NamespaceNotAllowedReason, fmt.Sprintf(
			"HypervisorCluster %s does not admit namespace %s (its spec.allowedNamespaces and spec.tenancy); ask the cluster's owner to admit the namespace, or set spec.hypervisorClusterRef to another cluster",
			cluster.Name, tmpl.Namespace))
	}
	if problems := tenancy.Violations(tmpl, cluster, rules); len(problems) > 0 {
		return invalid(hfv1.NotAllowedByClusterReason, fmt.Sprintf(
			"HypervisorCluster %s does not allow this template in namespace %s (spec.tenancy): %s; change the template, or ask the cluster's owner to allow these values",
			cluster.Name, tmpl.Namespace, strings.Join(problems, "; ")))
	}
	return ctrl.Result{}, false, nil
}

// markTemplateInvalid sets Valid and Ready to False with reason and msg.
// Watches on the cluster, namespaces and Secrets wake the template; the
// periodic look returned also notices templates appearing on the
// hypervisor.
func markTemplateInvalid(tmpl *hfv1.HypervisorMachineTemplate, reason hfv1.ConditionReason, msg string) ctrl.Result {
	conditions.Set(&tmpl.Status.Conditions, tmpl.Generation, hfv1.HypervisorMachineTemplateValidCondition, metav1.ConditionFalse, reason, msg)
	conditions.Set(&tmpl.Status.Conditions, tmpl.Generation, hfv1.ReadyCondition, metav1.ConditionFalse, reason, msg)
	tmpl.Status.ObservedGeneration = tmpl.Generation
	return ctrl.Result{RequeueAfter: waitForDependency}
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
	refs := templateSecretRefs(r.Workloads, tmpl)
	fields := make([]string, 0, len(refs))
	for f := range refs {
		fields = append(fields, f)
	}
	sort.Strings(fields)
	var missing []string
	for _, f := range fields {
		ref := refs[f]
		if _, err := secretref.Value(ctx, r.Client, f, tmpl.Namespace, ref.Name, ref.Key); err != nil {
			missing = append(missing, err.Error())
			ctrl.LoggerFrom(ctx).V(1).Info("Template Secret missing", "field", f, "Secret", klog.KRef(tmpl.Namespace, ref.Name))
		}
	}
	return strings.Join(missing, "; ")
}

func shortHash(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}
