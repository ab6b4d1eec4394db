package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/ipam"
	"github.com/hyperfleet/hyperfleet/internal/patch"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// templateWorkers is how many templates are validated at once (one
// template is never reconciled twice at once).
const templateWorkers = 4

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

	// deprecationsReported keeps the generation ("UID/generation") whose
	// old spellings each template was told about (reportDeprecated).
	deprecationsReported sync.Map // namespace/name -> string
}

// IdentitySupport is what templates that attest with SPIRE need of the
// operator itself.
type IdentitySupport struct {
	// Issuer issues join tokens and entries; nil without one.
	Issuer *identity.Issuer
	// Broker is the credential broker; nil when none runs.
	Broker machineclaim.BrokerEndpoint
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
		// Templates of different clusters validated at once: one whose
		// cluster hangs (not yet marked down) must not hold up the others'.
		WithOptions(controller.Options{MaxConcurrentReconciles: templateWorkers}).
		Complete(r)
}

func (r *HypervisorMachineTemplateReconciler) templatesForCluster(ctx context.Context, o client.Object) []reconcile.Request {
	return r.templateRequests(ctx, client.MatchingFields{fieldindex.TemplateCluster: o.GetName()})
}

func (r *HypervisorMachineTemplateReconciler) templatesForPool(ctx context.Context, o client.Object) []reconcile.Request {
	return r.templateRequests(ctx, client.MatchingFields{fieldindex.TemplatePool: o.GetName()})
}

func (r *HypervisorMachineTemplateReconciler) templatesForNamespace(ctx context.Context, o client.Object) []reconcile.Request {
	return r.templateRequests(ctx, client.InNamespace(o.GetName()))
}

func (r *HypervisorMachineTemplateReconciler) templatesForSecret(ctx context.Context, o client.Object) []reconcile.Request {
	return r.templateRequests(ctx, client.InNamespace(o.GetNamespace()), client.MatchingFields{fieldindex.TemplateSecret: o.GetName()})
}

func (r *HypervisorMachineTemplateReconciler) templateRequests(ctx context.Context, opts ...client.ListOption) []reconcile.Request {
	var list hfv1.HypervisorMachineTemplateList
	return listRequests(ctx, r.Client, &list, func() []hfv1.HypervisorMachineTemplate { return list.Items }, "templates", opts...)
}

// templateScope is one reconcile of one template: the template, what its
// phases loaded and found, and the patch helper its close writes with.
type templateScope struct {
	tmpl  *hfv1.HypervisorMachineTemplate
	patch *patch.Helper
	// wasValid is the Valid condition as read: the close emits an event
	// when validity changes.
	wasValid *metav1.Condition
	// cluster (loadCluster), pools (loadIPPool, in spec order; none
	// without a static network), hash (render) and info
	// (checkOnHypervisor) are what the validation loaded and found so far.
	cluster *hfv1.HypervisorCluster
	pools   []*ipam.Pool
	hash    string
	info    *provider.TemplateInfo
	// kind is the hypervisor kind of the template's cluster, which
	// describes info and advises on it.
	kind provider.Kind
	// validity is the outcome of the validation (Valid, and Ready with
	// it); nil when the pass ended before one (a failed read).
	validity *readiness
	// hold is the in-use hold of a deleted template (holdWhileUsed).
	hold *readiness
}

// Reconcile implements reconcile.Reconciler: it opens the template's
// scope, runs the deletion or the validation phases, and closes the scope,
// which derives the status and writes the template once.
func (r *HypervisorMachineTemplateReconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, err error) {
	tmpl := &hfv1.HypervisorMachineTemplate{}
	ctx, done, err := templateInUse(tmpl).open(ctx, r.Client, req, "HypervisorMachineTemplate",
		func() { r.deprecationsReported.Delete(req.String()) })
	if done {
		return ctrl.Result{}, err
	}
	s := r.newTemplateScope(tmpl)
	defer func() { res, err = r.closeTemplateScope(ctx, s, res, err) }()

	if !tmpl.DeletionTimestamp.IsZero() {
		return phase.Run(ctx, s, r.holdWhileUsed)
	}
	// The credential's reach is reported whatever the validation finds.
	return phase.Run(ctx, s, r.reportDeprecated, r.reportReusableCredential, r.refuseUnsupported, r.checkDHCPClient, r.loadCluster, r.checkTenancy, r.checkIsolation, r.checkIdentity,
		r.checkMetadata, r.checkSecrets, r.resolveRunnerRelease, r.loadIPPool, r.render, r.checkOnHypervisor, r.recordValid)
}

// newTemplateScope opens the scope of one reconcile. Its patch carries an
// optimistic lock: a copy from a stale cache must not drop a finalizer
// added since (a merge patch replaces the whole list).
func (r *HypervisorMachineTemplateReconciler) newTemplateScope(tmpl *hfv1.HypervisorMachineTemplate) *templateScope {
	return &templateScope{
		tmpl:     tmpl,
		patch:    patch.NewHelper(r.Client, tmpl, patch.WithOptimisticLock()),
		wasValid: hfv1.FindCondition(tmpl.Status.Conditions, hfv1.HypervisorMachineTemplateValidCondition).DeepCopy(),
	}
}

// closeTemplateScope sets Valid and Ready from the validation's outcome
// (Ready says the in-use hold of a deleted template instead), writes the
// template once (writeScope) and then emits the event of a change of
// validity. A template the pass let go is not written again.
func (r *HypervisorMachineTemplateReconciler) closeTemplateScope(ctx context.Context, s *templateScope, res ctrl.Result, err error) (ctrl.Result, error) {
	tmpl := s.tmpl
	if released(tmpl, hfv1.HypervisorMachineTemplateFinalizer) {
		return res, err
	}
	conds, gen := &tmpl.Status.Conditions, tmpl.Generation
	if v := s.validity; v != nil {
		conditions.Set(conds, gen, hfv1.HypervisorMachineTemplateValidCondition, v.status, v.reason, v.message)
	}
	cmp.Or(s.hold, s.validity).setOn(conds, gen)
	if perr := writeScope(ctx, s.patch, tmpl, &tmpl.Status.ObservedGeneration, err); perr != nil {
		return ctrl.Result{}, errors.Join(err, perr)
	}
	r.recordTransition(s.wasValid, tmpl)
	return res, err
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

// holdWhileUsed holds a deleted template while claims use it (their VMs
// are built from it, their runners removed with its credentials): it is
// not validated any more, no new VM is built from it, and it goes once
// the last of them is gone.
func (r *HypervisorMachineTemplateReconciler) holdWhileUsed(ctx context.Context, s *templateScope) (phase.Result, error) {
	tmpl := s.tmpl
	var claims hfv1.MachineClaimList
	if err := r.Client.List(ctx, &claims, client.InNamespace(tmpl.Namespace), client.MatchingFields{fieldindex.ClaimTemplate: tmpl.Name}); err != nil {
		return phase.Stop(), fmt.Errorf("list the claims of HypervisorMachineTemplate %s: %w", tmpl.Name, err)
	}
	hold, err := templateInUse(tmpl).releaseWhenUnused(ctx, s.patch, r.Recorder, claimNames(claims.Items, usesTemplate))
	if err != nil || hold == nil {
		return phase.Stop(), err
	}
	s.hold = hold
	// The claims' watch wakes the template when one lets go; this is the
	// safety net.
	return phase.StopAndRequeue(waitForDependency), nil
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

// recordTransition emits an event when validity changed from was.
func (r *HypervisorMachineTemplateReconciler) recordTransition(was *metav1.Condition, tmpl *hfv1.HypervisorMachineTemplate) {
	now := hfv1.FindCondition(tmpl.Status.Conditions, hfv1.HypervisorMachineTemplateValidCondition)
	if now == nil || (was != nil && was.Status == now.Status && was.Reason == now.Reason) {
		return
	}
	if now.Status == metav1.ConditionTrue {
		r.Recorder.Eventf(tmpl, corev1.EventTypeNormal, "Validated", "%s (hash %s)", now.Message, shortHash(tmpl.Status.TemplateHash))
	} else {
		r.Recorder.Event(tmpl, corev1.EventTypeWarning, now.Reason, conditions.Truncate(now.Message, 1024))
	}
}

func shortHash(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}
