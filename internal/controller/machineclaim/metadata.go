package machineclaim

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

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

// set records what spec's VM was authorized to be, with the
// DNS domain of its name (its placement record, signed with the install's
// key: reservation_placement.go), in the claim's status, which
// writeReservation stores with status.vmRef before the clone request.
func (rv reservations) set(claim *hfv1.MachineClaim, cluster string, spec *provider.VMSpec, dnsDomain string) {
	RecordPlacement(claim, rv.signer, cluster, spec, dnsDomain)
}

// checkReservation puts a reserved VM back into the status of a claim
// whose operator stopped between its clone request and the status write
// that records the VM, if the reservation is trusted (reservation.go).
// An error means the check could not be made: the pass ends and retries
// instead of placing a second VM.
func (r *Reconciler) checkReservation(ctx context.Context, s *claimScope) (phase.Result, error) {
	if err := r.reservations().restore(ctx, s); err != nil {
		return phase.Stop(), err
	}
	return phase.Next(), nil
}

// ensureMetadata adds the finalizer and the standard labels (in memory;
// the scope writes them, or ensureVM before its clone request).
func (r *Reconciler) ensureMetadata(ctx context.Context, s *claimScope) (phase.Result, error) {
	if s.claim.IsFinished() {
		return phase.Stop(), nil
	}
	setStandardMetadata(s.claim, r.clusterOf(ctx, s.claim))
	return phase.Next(), nil
}

// clusterOf names the claim's HypervisorCluster: where its VM is, else
// where its template points (empty when the template is missing).
func (r *Reconciler) clusterOf(ctx context.Context, claim *hfv1.MachineClaim) string {
	if ref := claim.Status.VMRef; ref != nil {
		return ref.HypervisorCluster
	}
	tmpl := &hfv1.HypervisorMachineTemplate{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: claim.Spec.TemplateRef.Name}, tmpl); err != nil {
		return ""
	}
	return tmpl.Spec.HypervisorClusterRef.Name
}
