package machineclaim

import (
	"context"
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller/refusal"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/tenancy"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// loadDependencies loads the claim's template and cluster into the scope.
// A claim still to be placed waits (its Provisioned condition says why)
// while either is missing, the template is not Ready or is being deleted,
// or the cluster does not admit it. A placed claim needs only its VM's
// cluster: it is built from its placement record, and observing, ending
// and deleting its VM need no template (a template deleted anyway leaves
// s.tmpl nil; checkTemplate decides what that means).
func (r *Reconciler) loadDependencies(ctx context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	waitFor := func(reason hfv1.ConditionReason, msg string) (phase.Result, error) {
		s.facts.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, reason, msg)
		return phase.StopAndRequeue(waitForDependency), nil
	}
	tmpl := &hfv1.HypervisorMachineTemplate{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: claim.Spec.TemplateRef.Name}, tmpl)
	switch {
	case apierrors.IsNotFound(err) && claim.Status.VMRef != nil:
		tmpl = nil
	case apierrors.IsNotFound(err):
		return waitFor(hfv1.TemplateNotFoundReason, fmt.Sprintf("spec.templateRef: HypervisorMachineTemplate %s/%s does not exist; create it or fix the name", claim.Namespace, claim.Spec.TemplateRef.Name))
	case err != nil:
		return waitFor(hfv1.TemplateNotFoundReason, fmt.Sprintf("read HypervisorMachineTemplate %s: %v", claim.Spec.TemplateRef.Name, err))
	}
	// A claim that already has a VM keeps working with what it was placed
	// with, even if the template has since become invalid.
	if claim.Status.VMRef == nil {
		if msg := notReadyForNewVMs(tmpl); msg != "" {
			return waitFor(hfv1.TemplateNotReadyReason, msg)
		}
	}
	var clusterName string
	if ref := claim.Status.VMRef; ref != nil {
		clusterName = ref.HypervisorCluster
	} else {
		clusterName = tmpl.Spec.HypervisorClusterRef.Name
	}
	cluster := &hfv1.HypervisorCluster{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: clusterName}, cluster); err != nil {
		return waitFor(hfv1.ClusterUnavailableReason, fmt.Sprintf("HypervisorCluster %s (of template %s): %v", clusterName, claim.Spec.TemplateRef.Name, err))
	}
	if claim.Status.VMRef == nil {
		// Checked again here, not only when the template was validated: a
		// cluster's owner may narrow what it admits between the template's
		// last validation and this claim's placement.
		rules, admitted, err := tenancy.RulesFor(ctx, r.Client, cluster, claim.Namespace)
		if err != nil {
			return waitFor(hfv1.NamespaceNotAllowedReason, err.Error())
		}
		if !admitted {
			return waitFor(hfv1.NamespaceNotAllowedReason, fmt.Sprintf("HypervisorCluster %s does not admit namespace %s (spec.allowedNamespaces and spec.tenancy); ask its owner to admit it or use another cluster", cluster.Name, claim.Namespace))
		}
		if problems := tenancy.Violations(tmpl, cluster, rules, r.workloads().APIHosts(tmpl)); len(problems) > 0 {
			return waitFor(hfv1.NotAllowedByClusterReason, fmt.Sprintf("HypervisorCluster %s does not allow template %s in namespace %s (spec.tenancy): %s", cluster.Name, tmpl.Name, claim.Namespace, strings.Join(problems, "; ")))
		}
	}
	s.tmpl, s.cluster = tmpl, cluster
	// The cluster label, now that the cluster is known (written with the
	// pass's other metadata changes).
	setStandardMetadata(claim, cluster.Name)
	return phase.Next(), nil
}

// notReadyForNewVMs says why no new VM may be built from tmpl, "" when one
// may: it must be Ready for its current generation and not being deleted.
func notReadyForNewVMs(tmpl *hfv1.HypervisorMachineTemplate) string {
	if !tmpl.DeletionTimestamp.IsZero() {
		return fmt.Sprintf("HypervisorMachineTemplate %s is being deleted; no new VM is built from it", tmpl.Name)
	}
	ready := hfv1.FindCondition(tmpl.Status.Conditions, hfv1.ReadyCondition)
	if ready != nil && ready.Status == metav1.ConditionTrue && tmpl.Status.ObservedGeneration == tmpl.Generation {
		return ""
	}
	msg := "it has not been validated yet"
	if ready != nil && ready.Status == metav1.ConditionFalse {
		msg = ready.Reason + ": " + ready.Message
	}
	return fmt.Sprintf("HypervisorMachineTemplate %s is not ready: %s", tmpl.Name, msg)
}

// checkTemplate fails a claim whose VM is still being built but whose
// template was deleted anyway (its finalizer removed by hand, or deleted
// before templates had one): the VM's cloud-init and runner credential come
// from the template, so the VM can never be finished, and it is destroyed.
// A running claim never gets here: checkRunning ends each of its passes,
// so it still sees its VM power off and ends without the template.
func (r *Reconciler) checkTemplate(_ context.Context, s *claimScope) (phase.Result, error) {
	if s.tmpl != nil {
		return phase.Next(), nil
	}
	claim := s.claim
	s.fail(claimEnd{reason: hfv1.EndFailed, condition: hfv1.TemplateNotFoundReason, message: fmt.Sprintf(
		"spec.templateRef: HypervisorMachineTemplate %s/%s was deleted before VM %s was built; without its cloud-init and credentials the VM cannot be finished and is destroyed",
		claim.Namespace, claim.Spec.TemplateRef.Name, claim.Status.VMRef.ID())})
	return phase.Stop(), nil
}

// loadProvider puts the cluster's provider into the scope. A claim
// still to be built waits for a cluster that is not connected and Ready
// (new VMs are paused), and for one whose spec changed since its
// controller last applied it (spec.limits.maxMachines, allowed nodes,
// credentials: the registry's provider was connected with the previous
// generation's, so a VM placed now would be held to the old ones); a
// running one goes on without it, since its workload is observed without
// the hypervisor and the cluster controller wakes it when the cluster is
// back.
func (r *Reconciler) loadProvider(ctx context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	p, health, connected := r.Registry.Provider(s.cluster.Name)
	if connected && health.Ready {
		if msg := specNotApplied(s.cluster); msg != "" && claim.Status.VMRef == nil {
			ctrl.LoggerFrom(ctx).V(1).Info("Waiting for the HypervisorCluster controller to apply the cluster's spec before placing", "cluster", s.cluster.Name,
				"generation", s.cluster.Generation, "observedGeneration", s.cluster.Status.ObservedGeneration)
			s.facts.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.ClusterUnavailableReason, "New VMs wait: "+msg)
			return phase.StopAndRequeue(specCatchUp), nil
		}
		s.provider = p
		return phase.Next(), nil
	}
	if s.facts.isTrue(claim, hfv1.MachineClaimProvisionedCondition) {
		return phase.Next(), nil
	}
	msg := fmt.Sprintf("Waiting for HypervisorCluster %s: %s", s.cluster.Name, health.Message)
	if claim.Status.VMRef == nil {
		msg = "New VMs are paused. " + msg
	}
	s.facts.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.ClusterUnavailableReason, msg)
	return phase.StopAndRequeue(waitForDependency), nil
}

// specNotApplied says that cluster's spec changed since its controller
// last applied it (status.observedGeneration behind metadata.generation),
// "" when it has. A cluster never reconciled (observedGeneration 0) is
// not connected either, which loadProvider reports first.
func specNotApplied(cluster *hfv1.HypervisorCluster) string {
	og := cluster.Status.ObservedGeneration
	if og == 0 || og >= cluster.Generation {
		return ""
	}
	return fmt.Sprintf("HypervisorCluster %s has a spec change (generation %d) its controller has not applied yet (status.observedGeneration %d)",
		cluster.Name, cluster.Generation, og)
}

// checkRunning checks a running claim's VM against the latest listing of
// its cluster (a VM that powered off or vanished ends the claim) and folds
// in what the CI platform says about its runner. It ends every pass of a
// running claim.
func (r *Reconciler) checkRunning(ctx context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	if !s.facts.isTrue(claim, hfv1.MachineClaimProvisionedCondition) {
		return phase.Next(), nil
	}
	ref := claim.Status.VMRef
	if ref == nil {
		s.beginEnd(claimEnd{reason: hfv1.EndPoweredOff, condition: hfv1.VMGoneReason, message: "The claim lost its VM reference"})
		return phase.Stop(), nil
	}
	read := false
	if l := r.Registry.Listing(ref.HypervisorCluster); l != nil {
		vm, found := l.VM(provider.ID(ref.ID()))
		if !found || vm.Power == provider.PowerStopped {
			// The batch listing's power state can lag the hypervisor by
			// its refresh interval (10 s on Proxmox): confirm with one
			// per-VM read before ending the claim.
			ctrl.LoggerFrom(ctx).V(1).Info("The cluster's listing shows the VM stopped or gone; reading it directly",
				"vm", ref.ID(), "listed", found, "power", vm.Power, "listingAt", l.At)
			if res, err := r.confirmStopped(ctx, s); res.Stopped() || err != nil {
				return res, err
			}
			read = true
		}
	}
	workloadRes, err := r.runner().observeWorkload(ctx, s)
	if workloadRes.Stopped() || err != nil {
		return workloadRes, err
	}
	// A hint (the agent's notice, the runner gone) says the VM is about to
	// stop: read it directly instead of waiting up to a listing refresh.
	res, poll, err := r.pollInTransition(ctx, s, read)
	if res.Stopped() || err != nil {
		return res, err
	}
	if poll > 0 {
		return phase.StopAndRequeue(poll).Sooner(workloadRes.After()), nil
	}
	return phase.StopAndRequeue(resyncRunning()).Sooner(workloadRes.After()), nil
}

// confirmStopped reads the claim's VM directly; if it is gone or powered
// off the claim ends (the pass stops, and the end list runs), and a read
// that failed stops the pass to be retried.
func (r *Reconciler) confirmStopped(ctx context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	ref := claim.Status.VMRef
	p, _, connected := r.Registry.Provider(ref.HypervisorCluster)
	if !connected {
		return phase.Next(), nil
	}
	vm, err := p.GetVM(ctx, vmRefOf(ref))
	switch {
	case errors.Is(err, provider.ErrNotFound):
		s.beginEnd(claimEnd{reason: hfv1.EndPoweredOff, condition: hfv1.VMGoneReason,
			message: fmt.Sprintf("VM %s no longer exists on %s", ref.ID(), ref.HypervisorCluster)})
		return phase.Stop(), nil
	case err != nil:
		ctrl.LoggerFrom(ctx).Info("Could not confirm the VM's power state; checking again later", "err", err.Error())
		return phase.StopAndRequeue(s.backoff()), nil
	case vm.Power == provider.PowerStopped:
		r.endPoweredOff(ctx, s, fmt.Sprintf("VM %s powered off", ref.ID()))
		return phase.Stop(), nil
	}
	return phase.Next(), nil
}

// checkSupported stops a claim that sets a field this operator does
// not act on, before anything is built; a spec change wakes it.
func (r *Reconciler) checkSupported(_ context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	if ref := refusal.Claim(r.workloads(), claim); ref != nil && claim.Status.VMRef == nil {
		s.facts.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, ref.Reason, ref.Message)
		return phase.Stop(), nil
	}
	return phase.Next(), nil
}

// checkPlatformSection stops a claim still to be built whose
// spec.workloadConfig names a workload type its template has no section
// for (a generic claim of a GitHub template, or the reverse): its VM would
// get the template's platform's agent config but the claim's treatment,
// and never do its work. A template change wakes it.
func (r *Reconciler) checkPlatformSection(_ context.Context, s *claimScope) (phase.Result, error) {
	claim, wc := s.claim, s.claim.Spec.WorkloadConfig
	if wc == nil || s.tmpl == nil || claim.Status.VMRef != nil {
		return phase.Next(), nil
	}
	be, ok := r.workloads().For(wc.Type)
	if !ok {
		return phase.Next(), nil
	}
	if _, reads := be.Template(s.tmpl); reads {
		return phase.Next(), nil
	}
	field := be.TemplateField()
	s.facts.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.InvalidSpecReason, fmt.Sprintf(
		"spec.workloadConfig.type is %s, but HypervisorMachineTemplate %s has no %s; use a template of that platform (or a RunnerPool whose workload.type matches its template)",
		wc.Type, s.tmpl.Name, field))
	return phase.StopAndRequeue(waitForDependency), nil
}
