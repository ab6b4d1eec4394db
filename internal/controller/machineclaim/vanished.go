package machineclaim

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// VanishedVMs takes the VM of a claim that left the API server while it
// still carried the operator's finalizer, to destroy it at once
// (internal/sweeper's Sweeper.Vanished).
type VanishedVMs interface {
	Vanished(ctx context.Context, cluster string, owner provider.Owner, progress provider.Progress)
}

// VanishedClaims hands the VMs of claims the API server removed while they
// still carried the finalizer to the orphan sweeper.
type VanishedClaims struct {
	// VMs takes such a VM (vanished.go); nil: such a VM waits for the
	// orphan sweep's grace period.
	VMs VanishedVMs
	// last are the last states of such claims, by name, until a
	// reconcile of the name hands their VM over.
	last sync.Map
}

// handler is the handler of the claims' DELETED events that finds
// the claims no deletion pass released (VanishedClaims.note) and queues their
// names: the hand-over itself waits for a reconcile of the name
// (VanishedClaims.handOver), which runs only after any pass of the claim still
// in flight, the pass that cloned its VM included, has ended.
func (v *VanishedClaims) handler() handler.EventHandler {
	return handler.Funcs{DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		// A tombstone (DeleteStateUnknown: the watch missed the deletion)
		// carries a state that may be older than the claim's last one, so
		// it proves nothing; such a claim's VM, if any, is the periodic
		// sweep's.
		if claim, ok := e.Object.(*hfv1.MachineClaim); ok && !e.DeleteStateUnknown && v.note(claim) {
			q.Add(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(claim)})
		}
	}}
}

// note checks a claim's last state as its DELETED event carries
// it, and keeps it when the claim vanished. A claim with finalizers is
// only marked deleted (deletionTimestamp) and leaves once they are
// removed; the event then carries the state before that last removal,
// deletionTimestamp set. A claim that was never marked deleted yet carries
// hyperfleet.io/vm-cleanup was removed by the API server itself: a delete
// that read the claim before the finalizer's write removes it when it
// lands after that write, although the write succeeded
// (kubernetes/kubernetes#77988, open in the API servers this project
// supports; property 7's test, TestFinalizerCleanupProperty in
// internal/controller, found it with claims deleted within milliseconds of
// their creation). No deletion pass runs for such a claim, and the pass
// that wrote the finalizer may have cloned its VM.
func (v *VanishedClaims) note(claim *hfv1.MachineClaim) bool {
	if !claim.DeletionTimestamp.IsZero() || !controllerutil.ContainsFinalizer(claim, hfv1.MachineClaimFinalizer) || v.VMs == nil {
		return false
	}
	v.last.Store(client.ObjectKeyFromObject(claim), claim)
	return true
}

// handOver gives the orphan sweeper, which destroys it without the
// grace period, the VM of a claim of this name that vanished (VanishedClaims.note).
// It runs first in every reconcile, whether the name is gone or taken by a
// new claim.
//
// The VM is the one the claim's status records, else the one its
// reservation annotation names if the annotation's signature verifies for
// the claim's UID (anyone who may edit a claim may write annotations). The
// sweeper still destroys it only if the VM's own ownership marker names
// that UID.
func (v *VanishedClaims) handOver(ctx context.Context, name types.NamespacedName, signer *ownership.Signer, memory *claimMemory) {
	last, ok := v.last.LoadAndDelete(name)
	if !ok {
		return
	}
	claim := last.(*hfv1.MachineClaim)
	log := ctrl.LoggerFrom(ctx).WithValues("MachineClaim", klog.KObj(claim), "uid", claim.UID)
	cluster, progress, ok := vanishedVM(claim, signer, memory)
	if !ok {
		log.Info("Claim removed by the API server while it still carried its finalizer; it recorded no VM")
		return
	}
	log.Info("Claim removed by the API server while it still carried its finalizer; its VM goes to the orphan sweeper",
		"HypervisorCluster", cluster, "vm", progress.ID)
	metrics.ClaimsVanished.WithLabelValues(cluster).Inc()
	v.VMs.Vanished(ctx, cluster, vmspec.Owner(claim), progress)
}

// vanishedVM is the VM a vanished claim may have left: its status's, else
// its reservation's when the reservation's signature verifies.
func vanishedVM(claim *hfv1.MachineClaim, signer *ownership.Signer, memory *claimMemory) (cluster string, p provider.Progress, ok bool) {
	if ref := claim.Status.VMRef; ref != nil {
		p = memory.progressOf(claim)
		return ref.HypervisorCluster, p, true
	}
	v, found := claim.Annotations[hfv1.VMReservationAnnotation]
	if !found || signer == nil {
		return "", p, false
	}
	reserved, err := Parse(v)
	if err != nil {
		return "", p, false
	}
	verify := signer.VerifyReservation
	if reserved.Legacy {
		verify = signer.VerifyLegacyReservation
	}
	if !verify(reserved.reservation(claim), reserved.Sig) {
		return "", p, false
	}
	return reserved.Ref.HypervisorCluster, provider.Progress{ID: provider.ID(reserved.Ref.ID()), Node: reserved.Ref.Node}, true
}
