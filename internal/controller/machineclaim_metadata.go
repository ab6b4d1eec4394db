package controller

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// claimMetadata holds a reconcile's changes to a claim's metadata
// (finalizer, standard labels, VM reservation) until one patch writes them.
//
// Why: a new claim needs its finalizer and its reserved VM id on the API
// server before the clone request, and each API write on the way adds to
// the claim -> clone latency. Changes made in memory during the pass are
// written once: right before the clone when a VM id was just reserved
// (with the reservation), otherwise at the end of the pass.
type claimMetadata struct {
	// stored is the claim as the API server last returned it.
	stored *hfv1.MachineClaim
}

func newClaimMetadata(claim *hfv1.MachineClaim) *claimMetadata {
	return &claimMetadata{stored: claim.DeepCopy()}
}

// flush writes the metadata changes, if any, with an optimistic lock: a
// claim read from a stale cache must not overwrite a newer reservation.
// It patches a copy so that the in-memory status (patched later) stays.
func (m *claimMetadata) flush(ctx context.Context, c client.Client, claim *hfv1.MachineClaim) error {
	if m.clean(claim) {
		return nil
	}
	if claim.ResourceVersion != m.stored.ResourceVersion {
		// Another write of this pass (the finalizer's removal at the end
		// of a claim) came after the last flush: it decided the metadata.
		return nil
	}
	obj := m.stored.DeepCopy()
	want := claim.DeepCopy()
	obj.Finalizers, obj.Labels, obj.Annotations = want.Finalizers, want.Labels, want.Annotations
	if err := c.Patch(ctx, obj, client.MergeFromWithOptions(m.stored, client.MergeFromWithOptimisticLock{})); err != nil {
		return err
	}
	claim.ResourceVersion = obj.ResourceVersion
	m.stored = obj
	return nil
}

// clean reports whether the claim's metadata is as stored.
func (m *claimMetadata) clean(claim *hfv1.MachineClaim) bool {
	return equality.Semantic.DeepEqual(m.stored.Finalizers, claim.Finalizers) &&
		equality.Semantic.DeepEqual(m.stored.Labels, claim.Labels) &&
		equality.Semantic.DeepEqual(m.stored.Annotations, claim.Annotations)
}

// setStandardMetadata adds the finalizer and the standard labels (the
// cluster label when cluster is known) in memory; claimMetadata.flush
// writes them before any VM exists.
func setStandardMetadata(claim *hfv1.MachineClaim, cluster string) {
	controllerutil.AddFinalizer(claim, hfv1.MachineClaimFinalizer)
	labels := claim.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[hfv1.ManagedByLabel] = hfv1.ManagedByValue
	labels[hfv1.MachineTemplateLabel] = claim.Spec.TemplateRef.Name
	if claim.Spec.RunnerPoolRef != nil {
		labels[hfv1.RunnerPoolLabel] = claim.Spec.RunnerPoolRef.Name
	}
	if cluster != "" {
		labels[hfv1.HypervisorClusterLabel] = cluster
	}
	claim.SetLabels(labels)
}

// setReservation records a reserved VM in the claim's annotation (in
// memory; claimMetadata.flush writes it).
func setReservation(claim *hfv1.MachineClaim, cluster string, p provider.Progress) {
	if claim.Annotations == nil {
		claim.Annotations = map[string]string{}
	}
	claim.Annotations[hfv1.VMReservationAnnotation] = fmt.Sprintf("%s/%s/%d", cluster, p.Node, p.VMID)
}

// parseReservation reads a VMReservationAnnotation value.
func parseReservation(v string) (*hfv1.VMReference, error) {
	parts := strings.Split(v, "/")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" {
		return nil, fmt.Errorf("%q is not <HypervisorCluster>/<node>/<vmid>", v)
	}
	id, err := strconv.ParseInt(parts[2], 10, 32)
	if err != nil || id <= 0 {
		return nil, fmt.Errorf("%q: VM id %q is not a positive number", v, parts[2])
	}
	return &hfv1.VMReference{HypervisorCluster: parts[0], Node: parts[1], VMID: int32(id)}, nil
}

// restoreReservation puts a reserved VM back into a claim's status when the
// operator stopped after its clone request and before the status write
// that records the VM: the claim then continues that clone (or deletes
// that VM) instead of placing a second one. It only applies to claims that
// have not yet recorded a VM of their own.
func restoreReservation(ctx context.Context, claim *hfv1.MachineClaim) {
	v, ok := claim.Annotations[hfv1.VMReservationAnnotation]
	if !ok || claim.Status.VMRef != nil {
		return
	}
	switch claim.Status.Phase {
	case "", hfv1.MachineClaimPending, hfv1.MachineClaimProvisioning:
	default:
		return
	}
	ref, err := parseReservation(v)
	if err != nil {
		ctrl.LoggerFrom(ctx).Info("Ignoring an unreadable VM reservation annotation", "annotation", hfv1.VMReservationAnnotation, "err", err.Error())
		return
	}
	ctrl.LoggerFrom(ctx).Info("Continuing with the VM reserved before the last clone request", "cluster", ref.HypervisorCluster, "node", ref.Node, "vmid", ref.VMID)
	claim.Status.VMRef = ref
}
