package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Reasons for claims that are specific to the claim controller.
// callAgainNow is the requeue for a provider that asks to be called again
// at once.
const callAgainNow = 10 * time.Millisecond

const (
	templateNotFoundReason = "TemplateNotFound"
	templateNotReadyReason = hfv1.TemplateNotReadyReason
	queuedReason           = "Queued"
	configuringReason      = "Configuring"
	vmPoweredOffReason     = "VMPoweredOff"
	vmGoneReason           = "VMGone"
	vmDeletedReason        = "VMDeleted"
	deletingVMReason       = "DeletingVM"
)

// reconcileProvision drives a claim from Pending to Bootstrapping and
// watches a running VM for power-off. metadata holds the pass's metadata
// changes; it is flushed before the clone request.
func (r *MachineClaimReconciler) reconcileProvision(ctx context.Context, claim *hfv1.MachineClaim, metadata *claimMetadata) (ctrl.Result, error) {
	tmpl, cluster, wait := r.dependencies(ctx, claim)
	if wait != nil {
		return *wait, nil
	}
	// The cluster label, now that the cluster is known (written with the
	// pass's other metadata changes).
	setStandardMetadata(claim, cluster.Name)
	p, health, connected := r.Registry.Provider(cluster.Name)
	if !connected || !health.Ready {
		msg := fmt.Sprintf("Waiting for HypervisorCluster %s: %s", cluster.Name, health.Message)
		if claim.Status.VMRef == nil {
			msg = "New VMs are paused. " + msg
		}
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.ClusterUnavailableReason, msg)
		r.syncReady(claim)
		// The cluster controller wakes the claim when the cluster is back.
		return ctrl.Result{RequeueAfter: waitForDependency}, nil
	}

	switch claim.Status.Phase {
	case hfv1.MachineClaimBootstrapping, hfv1.MachineClaimReady, hfv1.MachineClaimDraining:
		return r.watchRunning(ctx, claim)
	}

	var addr staticAddr
	if tmpl.Spec.Network.Mode == hfv1.NetworkModeStatic {
		ip, pool, fresh, err := r.staticAddress(ctx, claim, tmpl)
		switch {
		case errors.Is(err, errAddressWait):
			return ctrl.Result{RequeueAfter: 10 * time.Second}, nil
		case err != nil:
			return r.provisionError(ctx, claim, err)
		case fresh:
			// Persist the allocation (deferred status patch) before any
			// VM is built with it.
			return ctrl.Result{RequeueAfter: time.Millisecond}, nil
		}
		addr = staticAddr{ip: ip, pool: pool}
	}
	ci := &claimCloudInit{r: r, claim: claim, tmpl: tmpl, cluster: cluster, addr: addr}
	spec, err := vmSpecFor(claim, tmpl, cluster, ci)
	if err != nil {
		return r.provisionError(ctx, claim, err)
	}
	prev := progressOf(claim)
	if claim.Status.VMRef == nil {
		claim.Status.TemplateHash = tmpl.Status.TemplateHash
	}
	res, err := p.EnsureVM(ctx, spec, prev)
	if err != nil {
		return r.provisionError(ctx, claim, err)
	}
	r.attempts.Delete(claim.UID)
	r.recordProgress(ctx, claim, cluster.Name, prev, res.Progress)
	if claim.Status.Phase == hfv1.MachineClaimPending {
		r.enterPhase(ctx, claim, hfv1.MachineClaimProvisioning, "Provisioning", fmt.Sprintf("Creating VM %d on %s/%s", res.Progress.VMID, cluster.Name, res.Progress.Node))
	}
	if res.Phase == provider.PhasePlaced && res.RetryAfter <= 0 && prev.VMID != res.Progress.VMID {
		// A fresh reservation: store it with the finalizer in one write
		// (the only one before the clone request), then clone in this
		// same pass instead of waiting for that write's watch event. The
		// status recording the VM follows at the end of the pass; until
		// it lands the annotation stands in for it (restoreReservation).
		// If the write fails, the next pass starts over from the stored
		// state.
		r.setReservation(claim, cluster.Name, res.Progress)
		if err := metadata.flush(ctx, r.Client, claim); err != nil {
			return ctrl.Result{}, fmt.Errorf("record VM id %d before cloning: %w", res.Progress.VMID, err)
		}
		ctrl.LoggerFrom(ctx).V(1).Info("Recorded the VM reservation", "vmid", res.Progress.VMID, "node", res.Progress.Node)
		prev = res.Progress
		if res, err = p.EnsureVM(ctx, spec, prev); err != nil {
			return r.provisionError(ctx, claim, err)
		}
		r.recordProgress(ctx, claim, cluster.Name, prev, res.Progress)
	}
	retry := res.RetryAfter
	if retry <= 0 {
		// "Call again now": the status patch below usually wakes the
		// claim first; this only covers a coalesced event.
		retry = callAgainNow
	}
	msg := res.Message
	switch res.Phase {
	case provider.PhasePlaced, provider.PhaseQueued:
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, queuedReason, orDefault(msg, "Waiting for a clone slot"))
	case provider.PhaseCloning:
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.CloningReason, orDefault(msg, "Cloning the template"))
	case provider.PhaseConfiguring:
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, configuringReason, orDefault(msg, "Configuring the VM"))
	case provider.PhaseStarting:
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.StartingReason, orDefault(msg, "Starting the VM"))
	case provider.PhaseBooting:
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.WaitingForGuestReason, orDefault(msg, "Waiting for the guest agent"))
	case provider.PhaseRunning:
		claim.Status.Network = networkStatus(claim, tmpl, cluster, res)
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimProvisionedCondition, metav1.ConditionTrue, hfv1.ReadyReason,
			fmt.Sprintf("VM %d runs on %s/%s with addresses %s", res.Progress.VMID, cluster.Name, res.Progress.Node, strings.Join(res.Addresses, ", ")))
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimOwnershipVerifiedCondition, metav1.ConditionTrue, hfv1.ReadyReason, "The VM carries this operator's verified ownership marker")
		r.Recorder.Eventf(claim, corev1.EventTypeNormal, "Provisioned", "VM %d is up on %s/%s", res.Progress.VMID, cluster.Name, res.Progress.Node)
		r.enterPhase(ctx, claim, hfv1.MachineClaimBootstrapping, hfv1.WaitingForRunnerReason, "Waiting for the workload to report the runner online")
		r.syncReady(claim)
		return ctrl.Result{RequeueAfter: resyncRunning()}, nil
	case provider.PhaseStopped:
		return r.startTermination(ctx, claim, vmPoweredOffReason, fmt.Sprintf("VM %d powered off before it was ready", res.Progress.VMID))
	}
	r.syncReady(claim)
	return ctrl.Result{RequeueAfter: retry}, nil
}

// dependencies loads the claim's template and cluster. A non-nil result
// means the claim must wait; its conditions say why.
func (r *MachineClaimReconciler) dependencies(ctx context.Context, claim *hfv1.MachineClaim) (*hfv1.HypervisorMachineTemplate, *hfv1.HypervisorCluster, *ctrl.Result) {
	waitFor := func(reason, msg string) (*hfv1.HypervisorMachineTemplate, *hfv1.HypervisorCluster, *ctrl.Result) {
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, reason, msg)
		r.syncReady(claim)
		return nil, nil, &ctrl.Result{RequeueAfter: waitForDependency}
	}
	tmpl := &hfv1.HypervisorMachineTemplate{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: claim.Spec.TemplateRef.Name}, tmpl); err != nil {
		if apierrors.IsNotFound(err) {
			return waitFor(templateNotFoundReason, fmt.Sprintf("spec.templateRef: HypervisorMachineTemplate %s/%s does not exist; create it or fix the name", claim.Namespace, claim.Spec.TemplateRef.Name))
		}
		return waitFor(templateNotFoundReason, fmt.Sprintf("read HypervisorMachineTemplate %s: %v", claim.Spec.TemplateRef.Name, err))
	}
	// A claim that already has a VM keeps working with the template it was
	// built from, even if the template has since become invalid.
	if claim.Status.VMRef == nil {
		ready := meta.FindStatusCondition(tmpl.Status.Conditions, hfv1.ReadyCondition)
		if ready == nil || ready.Status != metav1.ConditionTrue || tmpl.Status.ObservedGeneration != tmpl.Generation {
			msg := "it has not been validated yet"
			if ready != nil && ready.Status == metav1.ConditionFalse {
				msg = ready.Reason + ": " + ready.Message
			}
			return waitFor(templateNotReadyReason, fmt.Sprintf("HypervisorMachineTemplate %s is not ready: %s", tmpl.Name, msg))
		}
	}
	clusterName := tmpl.Spec.HypervisorClusterRef.Name
	if claim.Status.VMRef != nil {
		clusterName = claim.Status.VMRef.HypervisorCluster
	}
	cluster := &hfv1.HypervisorCluster{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: clusterName}, cluster); err != nil {
		return waitFor(hfv1.ClusterUnavailableReason, fmt.Sprintf("HypervisorCluster %s (from template %s): %v", clusterName, tmpl.Name, err))
	}
	if claim.Status.VMRef == nil {
		// Checked again here, not only when the template was validated: a
		// cluster's owner may narrow what it admits between the template's
		// last validation and this claim's placement.
		rules, admitted, err := tenancyRulesFor(ctx, r.Client, cluster, claim.Namespace)
		if err != nil {
			return waitFor(hfv1.NamespaceNotAllowedReason, err.Error())
		}
		if !admitted {
			return waitFor(hfv1.NamespaceNotAllowedReason, fmt.Sprintf("HypervisorCluster %s does not admit namespace %s (spec.allowedNamespaces and spec.tenancy); ask its owner to admit it or use another cluster", cluster.Name, claim.Namespace))
		}
		if problems := tenancyViolations(tmpl, cluster, rules); len(problems) > 0 {
			return waitFor(hfv1.NotAllowedByClusterReason, fmt.Sprintf("HypervisorCluster %s does not allow template %s in namespace %s (spec.tenancy): %s", cluster.Name, tmpl.Name, claim.Namespace, strings.Join(problems, "; ")))
		}
	}
	return tmpl, cluster, nil
}

// selectorAdmits applies an allowedNamespaces selector: unset or empty
// admits every namespace.
func selectorAdmits(ctx context.Context, c client.Reader, selector *metav1.LabelSelector, namespace string) (bool, error) {
	if selector == nil {
		return true, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(selector)
	if err != nil {
		return false, fmt.Errorf("spec.allowedNamespaces is not a valid selector: %w", err)
	}
	if sel.Empty() {
		return true, nil
	}
	var ns corev1.Namespace
	if err := c.Get(ctx, client.ObjectKey{Name: namespace}, &ns); err != nil {
		return false, fmt.Errorf("read namespace %s: %w", namespace, err)
	}
	return sel.Matches(labels.Set(ns.Labels)), nil
}

// watchRunning checks a running claim's VM against the latest listing of
// its cluster: a VM that powered off or vanished ends the claim.
func (r *MachineClaimReconciler) watchRunning(ctx context.Context, claim *hfv1.MachineClaim) (ctrl.Result, error) {
	ref := claim.Status.VMRef
	if ref == nil {
		return r.startTermination(ctx, claim, vmGoneReason, "The claim lost its VM reference")
	}
	if l := r.Registry.Listing(ref.HypervisorCluster); l != nil {
		vm, found := l.VM(int(ref.VMID))
		if !found || vm.Power == provider.PowerStopped {
			// The batch listing's power state can lag the hypervisor by
			// its refresh interval (10 s on Proxmox): confirm with one
			// per-VM read before ending the claim.
			if res, handled, err := r.confirmStopped(ctx, claim); handled || err != nil {
				return res, err
			}
		}
	}
	if res, handled, err := r.observeWorkload(ctx, claim); handled || err != nil {
		return res, err
	}
	if claim.Status.Phase == hfv1.MachineClaimBootstrapping && meta.IsStatusConditionTrue(claim.Status.Conditions, hfv1.MachineClaimBootstrappedCondition) {
		r.enterPhase(ctx, claim, hfv1.MachineClaimReady, hfv1.ReadyReason, "The workload reports the VM ready")
	}
	r.syncReady(claim)
	return ctrl.Result{RequeueAfter: resyncRunning()}, nil
}

// confirmStopped reads the claim's VM directly; if it is gone or powered
// off the claim terminates (handled is true).
func (r *MachineClaimReconciler) confirmStopped(ctx context.Context, claim *hfv1.MachineClaim) (ctrl.Result, bool, error) {
	ref := claim.Status.VMRef
	p, _, connected := r.Registry.Provider(ref.HypervisorCluster)
	if !connected {
		return ctrl.Result{}, false, nil
	}
	vm, err := p.GetVM(ctx, provider.VMRef{VMID: int(ref.VMID), Node: ref.Node})
	switch {
	case errors.Is(err, provider.ErrNotFound):
		res, err := r.startTermination(ctx, claim, vmGoneReason, fmt.Sprintf("VM %d no longer exists on %s", ref.VMID, ref.HypervisorCluster))
		return res, true, err
	case err != nil:
		ctrl.LoggerFrom(ctx).Info("Could not confirm the VM's power state; checking again later", "err", err.Error())
		return ctrl.Result{RequeueAfter: r.backoff(claim)}, true, nil
	case vm.Power == provider.PowerStopped:
		res, err := r.startTermination(ctx, claim, vmPoweredOffReason, fmt.Sprintf("VM %d powered off", ref.VMID))
		return res, true, err
	}
	return ctrl.Result{}, false, nil
}

// startTermination moves a claim to Terminating and starts deleting its VM
// at once, without waiting for another pass.
func (r *MachineClaimReconciler) startTermination(ctx context.Context, claim *hfv1.MachineClaim, reason, msg string) (ctrl.Result, error) {
	claim.Status.TerminationReason = truncate(reason+": "+msg, 1024)
	r.enterPhase(ctx, claim, hfv1.MachineClaimTerminating, reason, msg)
	return r.reconcileTerminate(ctx, claim)
}

// reconcileTerminate destroys the VM of a Terminating claim, then deletes
// the claim: a VM that powered off has done its job.
func (r *MachineClaimReconciler) reconcileTerminate(ctx context.Context, claim *hfv1.MachineClaim) (ctrl.Result, error) {
	done, result, err := r.deleteVM(ctx, claim)
	if err != nil || !done {
		return result, err
	}
	if done, result := r.releaseRunner(ctx, claim); !done {
		return result, nil
	}
	if t := claim.Status.PhaseTimes; t != nil && t.Terminating != nil {
		metrics.PowerOffToDestroyed.Observe(r.Clock.Since(t.Terminating.Time).Seconds())
	}
	res, err := r.finish(ctx, claim)
	if err != nil {
		return res, fmt.Errorf("end MachineClaim after its VM was destroyed: %w", err)
	}
	return res, nil
}

// reconcileFailed removes the VM of a failed claim (unless its ownership
// does not verify) and keeps the claim for inspection.
func (r *MachineClaimReconciler) reconcileFailed(ctx context.Context, claim *hfv1.MachineClaim) (ctrl.Result, error) {
	if claim.Status.VMRef == nil || meta.IsStatusConditionFalse(claim.Status.Conditions, hfv1.MachineClaimOwnershipVerifiedCondition) {
		return ctrl.Result{}, nil
	}
	if retained, result := r.retainFailedVM(ctx, claim); retained {
		return result, nil
	}
	_, result, err := r.deleteVM(ctx, claim)
	return result, err
}

// reconcileDelete runs the finalizer: the VM (and its ISO) must be gone
// before the claim may go.
func (r *MachineClaimReconciler) reconcileDelete(ctx context.Context, claim *hfv1.MachineClaim) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(claim, hfv1.MachineClaimFinalizer) {
		return ctrl.Result{}, nil
	}
	if claim.Status.Phase != hfv1.MachineClaimTerminating && claim.Status.Phase != hfv1.MachineClaimFailed {
		// A runner in the middle of a job keeps its VM (docs/architecture.md,
		// "Teardown never kills a busy runner"):
		// remove the runner first, which GitHub refuses while it is busy.
		// A hard limit does not wait: its pool cancelled the job first.
		if !hardLimit(claim) {
			if drained, result := r.drainRunner(ctx, claim); !drained {
				return result, nil
			}
		}
		reason := orDefault(claim.Annotations[hfv1.TerminationReasonAnnotation], string(scaling.Deleted)+": the MachineClaim was deleted")
		if claim.Status.TerminationReason == "" {
			claim.Status.TerminationReason = truncate(reason, 1024)
		}
		code, msg := splitReason(reason)
		r.enterPhase(ctx, claim, hfv1.MachineClaimTerminating, camelReason(code), msg)
	}
	if done, result, err := r.deleteVM(ctx, claim); err != nil || !done {
		return result, err
	}
	if done, result := r.releaseRunner(ctx, claim); !done {
		return result, nil
	}
	if err := r.removeFinalizer(ctx, claim); err != nil {
		return ctrl.Result{}, err
	}
	r.countOutcome(claim)
	r.attempts.Delete(claim.UID)
	return ctrl.Result{}, nil
}

// deleteVM advances the deletion of the claim's VM by one step. It reports
// done once no VM is left to delete.
func (r *MachineClaimReconciler) deleteVM(ctx context.Context, claim *hfv1.MachineClaim) (bool, ctrl.Result, error) {
	ref := claim.Status.VMRef
	if ref == nil || ref.VMID == 0 {
		r.releaseAddresses(ctx, claim)
		return true, ctrl.Result{}, nil
	}
	p, health, connected := r.Registry.Provider(ref.HypervisorCluster)
	if !connected {
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.ClusterUnavailableReason,
			fmt.Sprintf("Cannot delete VM %d yet: HypervisorCluster %s is not connected: %s", ref.VMID, ref.HypervisorCluster, health.Message))
		r.syncReady(claim)
		return false, ctrl.Result{RequeueAfter: r.backoff(claim)}, nil
	}
	prev := progressOf(claim)
	res, err := p.DeleteVM(ctx, ownerOf(claim), prev)
	switch {
	case errors.Is(err, provider.ErrNotOwned):
		return false, r.keepForAdmin(ctx, claim, err), nil
	case err != nil:
		class, reason := provider.Classify(err), provider.ReasonOf(err)
		metrics.ClaimErrors.WithLabelValues(string(class), reason).Inc()
		msg := fmt.Sprintf("Deleting VM %d failed (%s, will retry): %v", ref.VMID, class, err)
		if meta.FindStatusCondition(claim.Status.Conditions, hfv1.ReadyCondition) == nil ||
			meta.FindStatusCondition(claim.Status.Conditions, hfv1.ReadyCondition).Reason != reason {
			r.Recorder.Event(claim, corev1.EventTypeWarning, "FailedDelete", truncate(msg, 1024))
		}
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.ReadyCondition, metav1.ConditionFalse, reason, msg)
		return false, ctrl.Result{RequeueAfter: r.backoff(claim)}, nil
	}
	r.attempts.Delete(claim.UID)
	if !res.Done {
		r.recordProgress(ctx, claim, ref.HypervisorCluster, prev, res.Progress)
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.ReadyCondition, metav1.ConditionFalse, deletingVMReason, orDefault(res.Message, fmt.Sprintf("Deleting VM %d", ref.VMID)))
		retry := res.RetryAfter
		if retry <= 0 {
			retry = callAgainNow
		}
		return false, ctrl.Result{RequeueAfter: retry}, nil
	}
	r.Recorder.Eventf(claim, corev1.EventTypeNormal, vmDeletedReason, "VM %d on %s destroyed and its cloud-init ISO removed", ref.VMID, ref.HypervisorCluster)
	claim.Status.VMRef, claim.Status.Task = nil, nil
	r.releaseAddresses(ctx, claim)
	setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, vmDeletedReason, fmt.Sprintf("VM %d was destroyed", ref.VMID))
	setCondition(&claim.Status.Conditions, claim.Generation, hfv1.ReadyCondition, metav1.ConditionFalse, vmDeletedReason, fmt.Sprintf("VM %d was destroyed", ref.VMID))
	return true, ctrl.Result{}, nil
}

// ownershipRecheck is how often a claim held by keepForAdmin reads its VM
// again. The cluster poller wakes it sooner when the VM leaves the listing.
const ownershipRecheck = 10 * time.Minute

// keepForAdmin handles a VM whose ownership marker does not verify at
// deletion. The VM is never touched, and since it may be the claim's own VM
// with a damaged marker (still running with the claim's address), nothing
// is released either: the claim keeps its VM reference, its addresses and
// its finalizer until the VM is gone or an admin removes the finalizer
// (docs/operations.md, docs/security.md "Absence and release").
func (r *MachineClaimReconciler) keepForAdmin(ctx context.Context, claim *hfv1.MachineClaim, err error) ctrl.Result {
	ref := claim.Status.VMRef
	msg := fmt.Sprintf("VM %d on HypervisorCluster %s does not carry this claim's verified ownership marker (%v). HyperFleet neither touches it nor releases this claim's addresses while it may exist. "+
		"An admin must check VM %d by hand: once it is deleted the claim finishes on its own; if it is someone else's VM, delete this MachineClaim and remove its finalizer %s",
		ref.VMID, ref.HypervisorCluster, err, ref.VMID, hfv1.MachineClaimFinalizer)
	if c := meta.FindStatusCondition(claim.Status.Conditions, hfv1.ReadyCondition); c == nil || c.Reason != hfv1.OwnershipMismatchReason {
		r.Recorder.Event(claim, corev1.EventTypeWarning, hfv1.OwnershipMismatchReason, truncate(msg, 1024))
		ctrl.LoggerFrom(ctx).Info("VM ownership does not verify; keeping the claim's finalizer and addresses for an admin", "vmid", ref.VMID, "cluster", ref.HypervisorCluster, "err", err.Error())
	}
	msg = truncate(msg, 32768)
	setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimOwnershipVerifiedCondition, metav1.ConditionFalse, hfv1.OwnershipMismatchReason, msg)
	setCondition(&claim.Status.Conditions, claim.Generation, hfv1.ReadyCondition, metav1.ConditionFalse, hfv1.OwnershipMismatchReason, msg)
	return ctrl.Result{RequeueAfter: ownershipRecheck}
}

// provisionError surfaces a classified error (docs/architecture.md,
// "Classified errors") and chooses how to go on.
func (r *MachineClaimReconciler) provisionError(ctx context.Context, claim *hfv1.MachineClaim, err error) (ctrl.Result, error) {
	class, reason := provider.Classify(err), provider.ReasonOf(err)
	if errors.Is(err, errRender) {
		class, reason = provider.ClassConfiguration, "InvalidCloudInit"
	}
	if wait, limited := retryAfterWorkload(err, r.Clock.Now()); limited {
		// The CI platform's rate limit: wait for it without counting a
		// failure; the claim says until when.
		metrics.ClaimErrors.WithLabelValues(string(provider.ClassResource), hfv1.RateLimitedReason).Inc()
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.RateLimitedReason,
			fmt.Sprintf("Waiting %s for the CI platform's rate limit: %v", wait.Round(time.Second), err))
		r.syncReady(claim)
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	metrics.ClaimErrors.WithLabelValues(string(class), reason).Inc()
	msg := fmt.Sprintf("%s error: %v", class, err)
	cond := meta.FindStatusCondition(claim.Status.Conditions, hfv1.MachineClaimProvisionedCondition)
	changed := cond == nil || cond.Reason != reason
	ctrl.LoggerFrom(ctx).Info("Provisioning step failed", "class", class, "reason", reason, "err", err.Error())

	switch {
	case errors.Is(err, provider.ErrNotOwned):
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimOwnershipVerifiedCondition, metav1.ConditionFalse, hfv1.OwnershipMismatchReason,
			"The VM recorded for this claim does not carry its verified ownership marker; it is never modified or destroyed: "+err.Error())
		r.fail(ctx, claim, hfv1.OwnershipMismatchReason, msg)
		return ctrl.Result{}, nil
	case class == provider.ClassPermanent:
		r.fail(ctx, claim, hfv1.ProvisioningFailedReason, msg)
		return r.reconcileFailed(ctx, claim)
	}
	setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, reason, msg)
	r.syncReady(claim)
	if changed {
		r.Recorder.Event(claim, corev1.EventTypeWarning, "FailedProvision", truncate(msg, 1024))
	}
	switch class {
	case provider.ClassConfiguration:
		// The user must act; a spec or Secret change wakes the claim.
		return ctrl.Result{RequeueAfter: 5 * time.Minute}, nil
	case provider.ClassResource:
		return ctrl.Result{RequeueAfter: 30 * time.Second}, nil
	default:
		return ctrl.Result{RequeueAfter: r.backoff(claim)}, nil
	}
}

// fail moves a claim to Failed.
func (r *MachineClaimReconciler) fail(ctx context.Context, claim *hfv1.MachineClaim, reason, msg string) {
	claim.Status.TerminationReason = truncate(reason+": "+msg, 1024)
	setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, reason, msg)
	r.enterPhase(ctx, claim, hfv1.MachineClaimFailed, reason, msg)
}

// defaultMaxRetryDelay caps a claim's transient-failure backoff unless
// MachineClaimReconciler.MaxRetryDelay says otherwise.
const defaultMaxRetryDelay = 5 * time.Minute

// backoff returns the next retry delay of a claim's transient failures:
// 2s, 4s, 8s ... capped at MaxRetryDelay (5 minutes by default).
func (r *MachineClaimReconciler) backoff(claim *hfv1.MachineClaim) time.Duration {
	n := 0
	if v, ok := r.attempts.Load(claim.UID); ok {
		n = v.(int)
	}
	r.attempts.Store(claim.UID, n+1)
	limit := r.MaxRetryDelay
	if limit <= 0 {
		limit = defaultMaxRetryDelay
	}
	d := 2 * time.Second
	for i := 0; i < n && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// progressOf is the provider progress persisted in the claim's status.
func progressOf(claim *hfv1.MachineClaim) provider.Progress {
	var p provider.Progress
	if ref := claim.Status.VMRef; ref != nil {
		p.VMID, p.Node = int(ref.VMID), ref.Node
	}
	if t := claim.Status.Task; t != nil {
		p.Task = &provider.Task{ID: t.ID, Operation: t.Operation}
		if t.StartTime != nil {
			p.Task.StartTime = t.StartTime.Time
		}
	}
	return p
}

// recordProgress writes the provider's progress into the claim's status
// (persisted by the deferred patch before anything waits on it).
func (r *MachineClaimReconciler) recordProgress(ctx context.Context, claim *hfv1.MachineClaim, cluster string, prev, next provider.Progress) {
	if next.VMID == 0 {
		claim.Status.VMRef = nil
	} else {
		claim.Status.VMRef = &hfv1.VMReference{HypervisorCluster: cluster, VMID: int32(next.VMID), Node: next.Node}
	}
	claim.Status.Task = nil
	if t := next.Task; t != nil {
		claim.Status.Task = &hfv1.TaskReference{ID: t.ID, Operation: t.Operation}
		if !t.StartTime.IsZero() {
			claim.Status.Task.StartTime = &metav1.Time{Time: t.StartTime}
		}
		if t.Operation == "clone" && (prev.Task == nil || prev.Task.ID != t.ID) {
			metrics.CreatedToCloneRequest.Observe(r.Clock.Since(claim.CreationTimestamp.Time).Seconds())
			r.Recorder.Eventf(claim, corev1.EventTypeNormal, "CloneStarted", "Cloning VM %d on %s/%s", next.VMID, cluster, next.Node)
		}
	}
	if prev.VMID != 0 && next.VMID != 0 && prev.VMID != next.VMID {
		ctrl.LoggerFrom(ctx).Info("VM id changed (the previous one was taken)", "previousVMID", prev.VMID, "vmid", next.VMID)
	}
}

// networkStatus is what the claim reports about its VM's network.
func networkStatus(claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, res *provider.EnsureResult) *hfv1.MachineNetworkStatus {
	host := hostnameFor(claim, tmpl.Spec.Network.Hostname)
	st := &hfv1.MachineNetworkStatus{
		Addresses:  res.Addresses,
		MACAddress: res.MACAddress,
		Hostname:   host,
		FQDN:       fqdnFor(host, effectiveDNS(cluster, tmpl).Domain),
	}
	if claim.Status.Network != nil {
		st.IPAllocations = claim.Status.Network.IPAllocations
	}
	if len(st.Addresses) > 16 {
		st.Addresses = st.Addresses[:16]
	}
	return st
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
