// The admin actions are a platform admin's two ways to take a claim out of
// its lifecycle, each asked for with an annotation whose value is the
// admin's reason (api/v1alpha1/machineclaim_admin.go; the admission policy
// of config/admission lets only holders of the verb of the same name write
// them):
//
//   - force-delete (hyperfleet.io/force-delete), for a claim whose
//     hypervisor is gone for good: the claim is deleted, its VM abandoned
//     without a call to the hypervisor, its runner, identity and static
//     addresses released and its finalizer removed. A VM that comes back
//     still carries its verified marker for a claim that no longer exists,
//     so the orphan sweep destroys it after its grace period;
//   - disownment (hyperfleet.io/disown), to keep a VM: the VM's cloud-init
//     media are removed and its tags, ownership block and clone name
//     stripped (provider.Provider.DisownVM), it keeps running, its runner
//     is removed unless busy, its identity released, and the claim ends
//     (Finalized=True, reason Disowned). Its static addresses stay the
//     claim's until a platform admin excludes them from their IPPool: the
//     VM still uses them.
//
// See docs/troubleshooting.md, "A claim stuck because its hypervisor is
// gone" and "Keeping a VM: disownment", and docs/security.md, "Platform
// admins' actions on claims".

package machineclaim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// addressRecheck is how often a disowned claim looks again whether its
// addresses were excluded from their pools, behind the IPPool watch that
// wakes it when a pool's spec changes (disownedClaimsOfPool).
const addressRecheck = 30 * time.Second

// adminPhases is the phase list of a claim a platform admin took out of its
// lifecycle, nil for any other claim. A claim whose VM was disowned keeps
// the disownment list whatever its annotations say later: the VM still
// uses the claim's static addresses. A force-delete goes before a
// disownment not done yet: it is the way out when the hypervisor, which a
// disownment needs, cannot be reached.
func (r *Reconciler) adminPhases(claim *hfv1.MachineClaim) []phase.Func[*claimScope] {
	deleting := !claim.DeletionTimestamp.IsZero()
	_, force := claim.ForceDeleteRequested()
	_, disown := claim.DisownRequested()
	switch {
	case claim.Disowned() || disown && !force:
		return []phase.Func[*claimScope]{r.checkReservation, r.beginDisown, r.releaseDisownedVM, r.releaseDisownedRunner,
			r.Identity.release, r.holdDisownedAddresses, r.finishDisowned}
	case force && deleting:
		return []phase.Func[*claimScope]{r.checkFinalizer, r.beginForceDelete, r.releaseRunner, r.Identity.release, r.releaseForced}
	case force:
		return []phase.Func[*claimScope]{r.requestDeletion}
	}
	return nil
}

// checkAdminAnnotations reports an admin annotation whose value is not a
// usable reason (the admission policy refuses such values; without the
// policy anyone may write one): the claim goes on as if it were not set.
func (r *Reconciler) checkAdminAnnotations(ctx context.Context, s *claimScope) (phase.Result, error) {
	for _, key := range []string{hfv1.ForceDeleteAnnotation, hfv1.DisownAnnotation} {
		if _, set, err := s.claim.AdminReason(key); set && err != nil {
			msg := err.Error() + "; the annotation is ignored until then"
			r.Recorder.Event(s.claim, corev1.EventTypeWarning, string(hfv1.InvalidAdminAnnotationReason), msg)
			ctrl.LoggerFrom(ctx).Info("Ignoring an admin annotation without a usable reason", "annotation", key, "err", err.Error())
		}
	}
	return phase.Next(), nil
}

// --- Force-delete ---

// requestDeletion deletes a claim a platform admin force-deleted; its
// deletion brings the force-delete list (adminPhases).
func (r *Reconciler) requestDeletion(ctx context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	reason, _ := claim.ForceDeleteRequested()
	ctrl.LoggerFrom(ctx).Info("Deleting the MachineClaim a platform admin force-deleted", "reason", reason)
	uid := claim.UID
	if err := r.Client.Delete(ctx, claim, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil {
		return phase.Stop(), fmt.Errorf("delete MachineClaim %s/%s, force-deleted by annotation %s: %w", claim.Namespace, claim.Name, hfv1.ForceDeleteAnnotation, err)
	}
	s.facts.ending(hfv1.ForceDeletedReason, fmt.Sprintf("Force-deleted by a platform admin (annotation %s: %q); deleting the claim", hfv1.ForceDeleteAnnotation, reason))
	return phase.Stop(), nil
}

// beginForceDelete ends a force-deleted claim without waiting for its
// runner or its VM: nothing on the hypervisor is asked for, ever again.
func (r *Reconciler) beginForceDelete(_ context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	reason, _ := claim.ForceDeleteRequested()
	msg := fmt.Sprintf("Force-deleted by a platform admin (annotation %s: %q): %s is abandoned, not destroyed; the claim's runner, identity and static addresses are released",
		hfv1.ForceDeleteAnnotation, reason, abandonedVM(claim))
	if !claim.Ended() {
		s.beginEnd(claimEnd{reason: hfv1.EndDeleted, condition: hfv1.ForceDeletedReason, code: string(hfv1.EndDeleted), message: msg})
	}
	s.facts.ending(hfv1.ForceDeletedReason, msg)
	return phase.Next(), nil
}

// releaseForced lets a force-deleted claim go, its runner and identity
// released: the finalizer first, then what memory holds for the claim (its
// addresses, its VM's hint), the event, the metric and the log line, so
// that each is done once, by the pass that removed the finalizer.
func (r *Reconciler) releaseForced(ctx context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	ref := claim.Status.VMRef
	reason, _ := claim.ForceDeleteRequested()
	vm := abandonedVM(claim)
	addrs := recordedAddresses(claim)
	if err := r.removeFinalizer(ctx, s); err != nil {
		return phase.Stop(), err
	}
	r.PowerOff.forgetTransition(ref, r.Clock.Now())
	// The admin asserted that the VM is gone for good: its addresses go
	// back to their pools although nothing confirmed its absence
	// (docs/troubleshooting.md says when that is safe).
	r.addresses().release(ctx, claim)
	cluster := clusterOfRecord(claim)
	metrics.ClaimsForceDeleted.WithLabelValues(cluster).Inc()
	msg := fmt.Sprintf("Force-deleted by a platform admin (annotation %s: %q): %s was abandoned, not destroyed, and the addresses %s released. "+
		"If its hypervisor comes back, the orphan sweeper destroys the VM after its grace period: its ownership marker names this claim, which no longer exists",
		hfv1.ForceDeleteAnnotation, reason, vm, addrs)
	r.Recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.ForceDeletedReason), conditions.Truncate(msg, 1024))
	ctrl.LoggerFrom(ctx).Info("MachineClaim force-deleted; its VM was abandoned without the hypervisor", "vm", ref.ID(), "cluster", cluster,
		"addresses", addrs, "reason", reason)
	r.countOutcome(claim)
	r.memory.succeeded(claim.UID)
	return phase.Stop(), nil
}

// abandonedVM names, for a message, the VM a force-delete abandons: the
// one status records, else the one reserved before a clone request whose
// status write never came (unverified: it is only named), else none.
func abandonedVM(claim *hfv1.MachineClaim) string {
	if ref := claim.Status.VMRef; ref != nil {
		return fmt.Sprintf("VM %s on HypervisorCluster %s", ref.ID(), ref.HypervisorCluster)
	}
	if v, ok := claim.Annotations[hfv1.VMReservationAnnotation]; ok {
		if reserved, err := Parse(v); err == nil {
			return fmt.Sprintf("the VM reserved in annotation %s (%s on HypervisorCluster %s), if it was cloned,",
				hfv1.VMReservationAnnotation, reserved.Ref.ID(), reserved.Ref.HypervisorCluster)
		}
	}
	return "no VM (none was recorded)"
}

// clusterOfRecord is the HypervisorCluster of the claim's VM as the claim
// records it, for metrics: its VM reference, else its cluster label.
func clusterOfRecord(claim *hfv1.MachineClaim) string {
	if ref := claim.Status.VMRef; ref != nil {
		return ref.HypervisorCluster
	}
	return claim.Labels[hfv1.HypervisorClusterLabel]
}

// recordedAddresses lists the claim's static addresses for a message.
func recordedAddresses(claim *hfv1.MachineClaim) string {
	var out []string
	if n := claim.Status.Network; n != nil {
		for _, a := range n.IPAllocations {
			out = append(out, fmt.Sprintf("%s (IPPool %s)", a.Address, a.PoolRef))
		}
	}
	if len(out) == 0 {
		return "(none)"
	}
	return strings.Join(out, ", ")
}

// --- Disownment ---

// beginDisown ends the claim, recording the admin's reason, unless it has
// ended already (a failed claim keeps its failure). A finished claim, or a
// deleted one without the finalizer, holds nothing.
func (r *Reconciler) beginDisown(_ context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	if claim.IsFinished() || !claim.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(claim, hfv1.MachineClaimFinalizer) {
		return phase.Stop(), nil
	}
	if !claim.Ended() {
		reason, _ := claim.DisownRequested()
		s.beginEnd(claimEnd{reason: hfv1.EndDisowned, condition: hfv1.DisowningReason, message: fmt.Sprintf(
			"Disowned by a platform admin (annotation %s: %q): the VM is released from HyperFleet's management and kept", hfv1.DisownAnnotation, reason)})
	}
	return phase.Next(), nil
}

// releaseDisownedVM releases the claim's VM from management: its
// cloud-init media removed, then its HyperFleet marks stripped
// (provider.Provider.DisownVM), one provider step per pass, and records it
// (disowned). A VM that is gone is confirmed gone as at any deletion
// (deleteVM); one whose marker does not verify is left alone, and so are
// the claim's addresses (disownRefused).
func (r *Reconciler) releaseDisownedVM(ctx context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	if claim.Disowned() {
		return phase.Next(), nil
	}
	ref := claim.Status.VMRef
	if ref.ID() == "" {
		r.disowned(ctx, s, nil, nil)
		return phase.Next(), nil
	}
	p, health, connected := r.Registry.Provider(ref.HypervisorCluster)
	if !connected {
		s.facts.ending(hfv1.ClusterUnavailableReason, fmt.Sprintf(
			"Cannot disown VM %s yet: HypervisorCluster %s is not connected: %s. If it is gone for good, force-delete the claim instead (annotation %s)",
			ref.ID(), ref.HypervisorCluster, health.Message, hfv1.ForceDeleteAnnotation))
		return phase.StopAndRequeue(s.backoff()), nil
	}
	owner, prev := vmspec.Owner(claim), r.memory.progressOf(claim)
	media, err := p.RemoveCloudInitMedia(ctx, owner, prev)
	switch {
	case errors.Is(err, provider.ErrNotOwned):
		// Released by an earlier pass whose status write was lost, or not
		// the claim's VM: DisownVM tells which.
	case err != nil:
		return r.disownFailed(ctx, s, err)
	default:
		r.memory.keepTask(claim, media.Progress.Task)
		if !media.Done {
			s.facts.ending(hfv1.DisowningReason, fmt.Sprintf("Releasing VM %s from HyperFleet's management: %s", ref.ID(), media.Message))
			return phase.StopAndRequeue(CallAgain(media.RetryAfter)), nil
		}
	}
	res, err := p.DisownVM(ctx, owner, vmRefOf(ref))
	switch {
	case errors.Is(err, provider.ErrNotOwned):
		return r.disownRefused(ctx, s, err)
	case errors.Is(err, provider.ErrNotFound):
		// Nothing is left to keep: the VM's absence is confirmed as at
		// any deletion, which releases its addresses.
		if done, result := r.deleteVM(ctx, s); !done {
			return phase.StopAndRequeue(result.RequeueAfter), nil
		}
		r.disowned(ctx, s, ref, nil)
		return phase.Next(), nil
	case err != nil:
		return r.disownFailed(ctx, s, err)
	case !res.Done:
		s.facts.ending(hfv1.DisowningReason, fmt.Sprintf("Releasing VM %s from HyperFleet's management: %s", ref.ID(), res.Message))
		return phase.StopAndRequeue(CallAgain(res.RetryAfter)), nil
	}
	r.memory.succeeded(claim.UID)
	r.disowned(ctx, s, ref, res)
	return phase.Next(), nil
}

// disowned records that the claim's VM at ref is no longer HyperFleet's
// (Finalized True, reason Disowned), with the event, the metric and the log
// line: res is what DisownVM removed; ref nil means the claim had no VM,
// res nil that its VM was gone. The claim forgets the VM: nothing of
// HyperFleet reads it again.
func (r *Reconciler) disowned(ctx context.Context, s *claimScope, ref *hfv1.VMReference, res *provider.DisownResult) {
	claim := s.claim
	reason, _ := claim.DisownRequested()
	cluster := clusterOfRecord(claim)
	var msg string
	switch {
	case ref == nil:
		msg = "No VM was recorded for this claim: nothing was released from HyperFleet's management"
		// Addresses are persisted before any VM is built with them: with
		// no VM, none is in use.
		r.addresses().release(ctx, claim)
	case res == nil:
		msg = fmt.Sprintf("VM %s on HypervisorCluster %s no longer exists: nothing was left to keep", ref.ID(), ref.HypervisorCluster)
	default:
		removed := "nothing: an earlier pass had released it"
		if len(res.Removed) > 0 {
			removed = strings.Join(res.Removed, ", ")
		}
		msg = fmt.Sprintf("VM %s on HypervisorCluster %s was released from HyperFleet's management and left as it was (removed: %s). "+
			"HyperFleet no longer reads, stops or destroys it; delete it by hand when it is no longer needed", ref.ID(), ref.HypervisorCluster, removed)
		r.PowerOff.forgetTransition(ref, r.Clock.Now())
		claim.Status.VMRef, claim.Status.Task = nil, nil
		r.memory.forgetProgress(claim)
	}
	s.facts.record(hfv1.MachineClaimFinalizedCondition, metav1.ConditionTrue, hfv1.DisownedReason, msg)
	s.facts.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.DisownedReason, msg)
	s.facts.ending(hfv1.DisownedReason, msg)
	r.Recorder.Event(claim, corev1.EventTypeNormal, string(hfv1.DisownedReason),
		conditions.Truncate(fmt.Sprintf("%s (annotation %s: %q)", msg, hfv1.DisownAnnotation, reason), 1024))
	metrics.ClaimsDisowned.WithLabelValues(cluster).Inc()
	ctrl.LoggerFrom(ctx).Info("Released the claim's VM from management", "vm", ref.ID(), "cluster", cluster, "reason", reason)
}

// disownRefused leaves a VM whose ownership marker does not verify alone,
// and the claim's addresses with it (it may be the claim's own VM with a
// damaged marker, still using them), as keepForAdmin does at a deletion.
func (r *Reconciler) disownRefused(ctx context.Context, s *claimScope, err error) (phase.Result, error) {
	s.ownershipUnverified(ctx, err, fmt.Sprintf(", so it cannot be disowned: HyperFleet changes nothing on it and keeps this claim's addresses while it may exist. "+
		"An admin checks VM %s by hand; to let the claim go without touching the VM, force-delete it (annotation %s), which releases the addresses",
		s.claim.Status.VMRef.ID(), hfv1.ForceDeleteAnnotation), "VM ownership does not verify; not disowning it")
	return phase.StopAndRequeue(ownershipRecheck), nil
}

// disownFailed reports a failed step of the release and retries it with
// the claim's backoff.
func (r *Reconciler) disownFailed(ctx context.Context, s *claimScope, err error) (phase.Result, error) {
	claim := s.claim
	class, reason := provider.Classify(err), provider.ReasonOf(err)
	metrics.ClaimErrors.WithLabelValues(string(class), reason).Inc()
	msg := fmt.Sprintf("Releasing VM %s from HyperFleet's management failed (%s, %s, will retry): %v", claim.Status.VMRef.ID(), class, reason, err)
	if s.facts.endingReason(claim) != string(hfv1.FailedDisownReason) {
		r.Recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.FailedDisownReason), conditions.Truncate(msg, 1024))
		ctrl.LoggerFrom(ctx).Info("Releasing the VM from management failed", "err", err.Error(), "class", class)
	}
	s.facts.ending(hfv1.FailedDisownReason, msg)
	return phase.StopAndRequeue(s.backoff()), nil
}

// releaseDisownedRunner removes the runner of a disowned VM unless it runs
// a job: a busy runner is left to finish it (a JIT runner deregisters
// itself after its one job), and the claim forgets it.
func (r *Reconciler) releaseDisownedRunner(ctx context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	if !r.runner().registered(s) {
		return phase.Next(), nil
	}
	st := claim.Status.Bootstrap
	err := r.runner().remove(ctx, s, "; its VM was disowned")
	if errors.Is(err, workload.ErrRunnerBusy) {
		r.Recorder.Eventf(claim, corev1.EventTypeNormal, string(hfv1.RunnerBusyReason),
			"Runner %s runs a job on the disowned VM: it is left registered to finish it and deregisters itself after its one job", st.RunnerName)
		st.RunnerID, st.RunnerName, st.RunnerState = 0, "", ""
		return phase.Next(), nil
	}
	if err == nil {
		return phase.Next(), nil
	}
	if done, wait := r.runner().settleRemoval(ctx, s, err); !done {
		return phase.StopAndRequeue(wait), nil
	}
	return phase.Next(), nil
}

// holdDisownedAddresses keeps the static addresses of a disowned VM the
// claim's until each is out of its IPPool (an admin added it to
// spec.excludedAddresses): the VM still uses it, so the pool must never
// hand it out again, also after a restart, which rebuilds the pools from
// what claims record. Then the claim lets go of them.
func (r *Reconciler) holdDisownedAddresses(ctx context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	if claim.Status.Network == nil || len(claim.Status.Network.IPAllocations) == 0 {
		return phase.Next(), nil
	}
	var held []string
	for _, a := range claim.Status.Network.IPAllocations {
		fix, err := r.addresses().exclusionNeeded(ctx, a)
		if err != nil {
			s.facts.ending(hfv1.AddressNotExcludedReason, fmt.Sprintf("Cannot check whether %s is excluded from IPPool %s yet: %v", a.Address, a.PoolRef, err))
			return phase.StopAndRequeue(s.backoff()), nil
		}
		if fix != "" {
			held = append(held, fix)
		}
	}
	if len(held) > 0 {
		msg := fmt.Sprintf("The disowned VM keeps using its static addresses, so this claim holds them and no other claim can get them: %s. The claim finishes once each is excluded",
			strings.Join(held, "; "))
		if s.facts.endingReason(claim) != string(hfv1.AddressNotExcludedReason) {
			r.Recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.AddressNotExcludedReason), conditions.Truncate(msg, 1024))
		}
		s.facts.ending(hfv1.AddressNotExcludedReason, msg)
		return phase.StopAndRequeue(addressRecheck), nil
	}
	// Every address is out of its pool now, so none can be handed out
	// again: the claim lets go of them.
	r.addresses().release(ctx, claim)
	return phase.Next(), nil
}

// disownedClaimsOfPool wakes the disowned claims that hold an address of
// an IPPool whose spec changed: an admin may have excluded it.
func (r *Reconciler) disownedClaimsOfPool(ctx context.Context, o client.Object) []reconcile.Request {
	var list hfv1.MachineClaimList
	if err := r.Client.List(ctx, &list, client.MatchingFields{fieldindex.ClaimIPPool: o.GetName()}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "List claims of IPPool", "IPPool", klog.KObj(o))
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		if c := &list.Items[i]; c.Disowned() {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(c)})
		}
	}
	return out
}

// finishDisowned ends a disowned claim the way every claim ends: a deleted
// one lets go (its finalizer removed), any other is finished, kept as
// history or deleted (finish).
func (r *Reconciler) finishDisowned(ctx context.Context, s *claimScope) (phase.Result, error) {
	if !s.claim.DeletionTimestamp.IsZero() {
		return r.releaseFinalizer(ctx, s)
	}
	if err := r.finish(ctx, s); err != nil {
		return phase.Stop(), fmt.Errorf("end the disowned MachineClaim: %w", err)
	}
	return phase.Stop(), nil
}
