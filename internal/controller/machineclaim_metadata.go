package controller

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/reservation"
	"github.com/hyperfleet/hyperfleet/internal/tenancy"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// setStandardMetadata adds the finalizer and the standard labels (the
// cluster label when cluster is known) in memory; the claim's scope writes
// them (its patch), or ensureVM before its clone request, so before any VM
// exists.
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

// setReservation records a reserved VM and what spec's VM was authorized
// to be (its placement record) in the claim's annotations, each signed
// with the install's key (internal/reservation).
func (r *MachineClaimReconciler) setReservation(claim *hfv1.MachineClaim, cluster string, p provider.Progress, spec *provider.VMSpec) {
	reservation.Annotate(claim, r.Signer, cluster, p)
	reservation.RecordPlacement(claim, r.Signer, cluster, spec)
}

// restoreReservation puts a reserved VM back into the status of a claim
// whose operator stopped between its clone request and the status write
// that records the VM, if the reservation is trusted (internal/reservation).
// An error means the check could not be made: the pass ends and retries
// instead of placing a second VM.
func (r *MachineClaimReconciler) restoreReservation(ctx context.Context, s *claimScope) (ctrl.Result, bool, error) {
	err := r.reservations().Restore(ctx, s.claim)
	return ctrl.Result{}, err == nil, err
}

// reservations checks reservations with this reconciler's signer and the
// clusters' tenancy.
func (r *MachineClaimReconciler) reservations() *reservation.Checker {
	return &reservation.Checker{Client: r.Client, Signer: r.Signer, Recorder: r.Recorder,
		Admits: func(ctx context.Context, cluster *hfv1.HypervisorCluster, namespace string) (bool, error) {
			_, admitted, err := tenancy.RulesFor(ctx, r.Client, cluster, namespace)
			return admitted, err
		}}
}
