package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/ipam"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/patch"
)

// IPPoolReconciler loads each IPPool into the in-memory allocator, rebuilds
// its allocations from the claims' status before the first allocation
// (docs/architecture.md, "Static IP pools") and reports its counts.
type IPPoolReconciler struct {
	Client   client.Client
	IPAM     *ipam.Manager
	Recorder record.EventRecorder
}

// SetupWithManager registers the controller.
func (r *IPPoolReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&hfv1.IPPool{}).
		Watches(&hfv1.MachineClaim{}, handler.EnqueueRequestsFromMapFunc(poolsOfClaim)).
		Named("ippool").
		Complete(r)
}

// poolsOfClaim wakes the pools a claim holds addresses from, so counts
// follow allocations and releases.
func poolsOfClaim(_ context.Context, o client.Object) []reconcile.Request {
	c := o.(*hfv1.MachineClaim)
	if c.Status.Network == nil {
		return nil
	}
	var out []reconcile.Request
	for _, a := range c.Status.Network.IPAllocations {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKey{Name: a.PoolRef}})
	}
	return out
}

// ipamSpec converts the API type for the ipam package.
func ipamSpec(p *hfv1.IPPool) ipam.Spec {
	return ipam.Spec{
		Addresses: p.Spec.Addresses, ExcludedAddresses: p.Spec.ExcludedAddresses, Prefix: p.Spec.Prefix,
		Gateways: p.Spec.Gateways, Nameservers: p.Spec.Nameservers, SearchDomains: p.Spec.SearchDomains,
	}
}

// Reconcile implements reconcile.Reconciler.
func (r *IPPoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pool := &hfv1.IPPool{}
	if err := r.Client.Get(ctx, req.NamespacedName, pool); err != nil {
		if apierrors.IsNotFound(err) {
			r.IPAM.RemovePool(req.Name)
			metrics.IPPoolFree.DeleteLabelValues(req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	// Optimistic lock: a stale copy must not drop a finalizer added since
	// (a merge patch replaces the whole list).
	h := patch.NewHelper(r.Client, pool, patch.WithOptimisticLock())
	if !pool.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, h, pool)
	}
	if wrote, err := ippoolInUse(pool).ensureFinalizer(ctx, h); wrote || err != nil {
		return ctrl.Result{}, err
	}
	defer func() {
		if err := h.PatchStatus(ctx, pool); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Patch IPPool status")
		}
	}()
	gen := pool.Generation
	pool.Status.ObservedGeneration = gen

	parsed, err := ipam.ParsePool(ipamSpec(pool))
	if err != nil {
		// Keep the last valid spec in the allocator: claims holding its
		// addresses keep them, new claims wait until the spec is fixed.
		conditions.Set(&pool.Status.Conditions, gen, hfv1.ReadyCondition, metav1.ConditionFalse, hfv1.InvalidSpecReason, err.Error())
		r.Recorder.Event(pool, corev1.EventTypeWarning, string(hfv1.InvalidSpecReason), conditions.Truncate(err.Error(), 1024))
		return ctrl.Result{}, nil
	}
	for _, c := range r.IPAM.SetPool(pool.Name, parsed) {
		r.Recorder.Event(pool, corev1.EventTypeWarning, "AllocationConflict", c.String())
	}
	if !r.IPAM.Rebuilt(pool.Name) {
		allocs, err := r.recordedAllocations(ctx, pool.Name)
		if err != nil {
			return ctrl.Result{}, err
		}
		conflicts, err := r.IPAM.Rebuild(pool.Name, allocs)
		if err != nil {
			return ctrl.Result{}, err
		}
		for _, c := range conflicts {
			r.Recorder.Event(pool, corev1.EventTypeWarning, "AllocationConflict", c.String())
		}
		ctrl.LoggerFrom(ctx).Info("IPPool allocations rebuilt from claims", "allocations", len(allocs), "conflicts", len(conflicts))
	}
	counts, err := r.IPAM.Counts(pool.Name)
	if err != nil {
		return ctrl.Result{}, err
	}
	pool.Status.Total, pool.Status.Allocated, pool.Status.Free = counts.Total, counts.Allocated, counts.Free
	metrics.IPPoolFree.WithLabelValues(pool.Name).Set(float64(counts.Free))
	if counts.Free == 0 {
		conditions.Set(&pool.Status.Conditions, gen, hfv1.IPPoolExhaustedCondition, metav1.ConditionTrue, hfv1.IPPoolExhaustedReason,
			fmt.Sprintf("All %d addresses are allocated; new static-address claims wait. Add addresses to spec.addresses or free some", counts.Total))
	} else {
		conditions.Set(&pool.Status.Conditions, gen, hfv1.IPPoolExhaustedCondition, metav1.ConditionFalse, hfv1.ReadyReason,
			fmt.Sprintf("%d of %d addresses free", counts.Free, counts.Total))
	}
	msg := fmt.Sprintf("%d of %d addresses allocated", counts.Allocated, counts.Total)
	if len(parsed.Warnings) > 0 {
		msg += "; warnings: " + fmt.Sprint(parsed.Warnings)
	}
	conditions.Set(&pool.Status.Conditions, gen, hfv1.ReadyCondition, metav1.ConditionTrue, hfv1.ReadyReason, msg)
	return ctrl.Result{}, nil
}

// ippoolInUse is the pool as claims' addresses use it.
func ippoolInUse(pool *hfv1.IPPool) inUse {
	return inUse{obj: pool, conditions: &pool.Status.Conditions, finalizer: hfv1.IPPoolFinalizer, usage: "MachineClaims holding addresses from this pool"}
}

// reconcileDelete holds a deleted pool while claims record addresses from
// it: an address is released only once its VM is gone (docs/security.md,
// "Absence and release"), and a claim still being built needs the pool's
// prefix, gateway and nameservers for its VM's network-config. The
// allocator keeps the pool meanwhile (releases go on; staticAddress gives
// no new claim an address from it) and forgets it when it goes.
func (r *IPPoolReconciler) reconcileDelete(ctx context.Context, h *patch.Helper, pool *hfv1.IPPool) (ctrl.Result, error) {
	var claims hfv1.MachineClaimList
	if err := r.Client.List(ctx, &claims, client.MatchingFields{claimIPPoolIndex: pool.Name}); err != nil {
		return ctrl.Result{}, err
	}
	held, err := ippoolInUse(pool).releaseWhenUnused(ctx, h, r.Recorder, claimNames(claims.Items, func(*hfv1.MachineClaim) bool { return true }))
	if err != nil || held {
		return ctrl.Result{}, err
	}
	r.IPAM.RemovePool(pool.Name)
	metrics.IPPoolFree.DeleteLabelValues(pool.Name)
	return ctrl.Result{}, nil
}

// recordedAllocations reads every allocation from the pool that a claim's
// status records.
func (r *IPPoolReconciler) recordedAllocations(ctx context.Context, pool string) ([]ipam.Allocation, error) {
	var claims hfv1.MachineClaimList
	if err := r.Client.List(ctx, &claims); err != nil {
		return nil, err
	}
	var out []ipam.Allocation
	for i := range claims.Items {
		c := &claims.Items[i]
		if c.Status.Network == nil {
			continue
		}
		for _, a := range c.Status.Network.IPAllocations {
			if a.PoolRef != pool {
				continue
			}
			addr, err := ipam.ParseAllocatedAddress(a.Address)
			if err != nil {
				ctrl.LoggerFrom(ctx).Info("Ignoring an unreadable allocation", "MachineClaim", client.ObjectKeyFromObject(c), "address", a.Address)
				continue
			}
			out = append(out, ipam.Allocation{Owner: string(c.UID), Address: addr})
		}
	}
	return out, nil
}
