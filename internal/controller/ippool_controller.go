package controller

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim"
	"github.com/hyperfleet/hyperfleet/internal/ipam"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/patch"
	"github.com/hyperfleet/hyperfleet/internal/phase"
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

// ipPoolScope is one reconcile of one IPPool: the pool, what its phases
// found, and the patch helper its close writes with.
type ipPoolScope struct {
	pool  *hfv1.IPPool
	patch *patch.Helper
	// parsed is the pool's spec as the allocator holds it (parseSpec);
	// invalid is why the spec cannot be used, when it cannot.
	parsed  *ipam.Pool
	invalid error
	// counts are the allocator's totals (countAddresses); nil when this
	// pass did not count.
	counts *ipam.Counts
	// hold is the in-use hold of a deleted pool (holdWhileUsed).
	hold *readiness
}

// Reconcile implements reconcile.Reconciler: it opens the pool's scope,
// runs the deletion or the normal phases, and closes the scope, which
// derives the status and writes the pool once.
func (r *IPPoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, err error) {
	pool := &hfv1.IPPool{}
	ctx, done, err := ippoolInUse(pool).open(ctx, r.Client, req, "IPPool", func() { r.forget(req.Name) })
	if done {
		return ctrl.Result{}, err
	}
	s := r.newIPPoolScope(pool)
	defer func() { res, err = r.closeIPPoolScope(ctx, s, res, err) }()

	if !pool.DeletionTimestamp.IsZero() {
		return phase.Run(ctx, s, r.holdWhileUsed, r.forgetReleased)
	}
	return phase.Run(ctx, s, r.parseSpec, r.loadAllocator, r.rebuildAllocations, r.countAddresses)
}

// newIPPoolScope opens the scope of one reconcile. Its patch carries an
// optimistic lock: a copy from a stale cache must not drop a finalizer
// added since (a merge patch replaces the whole list).
func (r *IPPoolReconciler) newIPPoolScope(pool *hfv1.IPPool) *ipPoolScope {
	return &ipPoolScope{pool: pool, patch: patch.NewHelper(r.Client, pool, patch.WithOptimisticLock())}
}

// closeIPPoolScope derives the pool's status from what the phases found
// (its counts, IPPoolExhausted, then Ready) and writes it once
// (writeScope). A pool the pass let go is not written again.
func (r *IPPoolReconciler) closeIPPoolScope(ctx context.Context, s *ipPoolScope, res ctrl.Result, err error) (ctrl.Result, error) {
	pool := s.pool
	if released(pool, hfv1.IPPoolFinalizer) {
		return res, err
	}
	st, gen := &pool.Status, pool.Generation
	if c := s.counts; c != nil {
		st.Total, st.Allocated, st.Free = c.Total, c.Allocated, c.Free
		metrics.IPPoolFree.WithLabelValues(pool.Name).Set(float64(c.Free))
		if c.Free == 0 {
			conditions.Set(&st.Conditions, gen, hfv1.IPPoolExhaustedCondition, metav1.ConditionTrue, hfv1.IPPoolExhaustedReason,
				fmt.Sprintf("All %d addresses are allocated; new static-address claims wait. Add addresses to spec.addresses or free some", c.Total))
		} else {
			conditions.Set(&st.Conditions, gen, hfv1.IPPoolExhaustedCondition, metav1.ConditionFalse, hfv1.ReadyReason,
				fmt.Sprintf("%d of %d addresses free", c.Free, c.Total))
		}
	}
	s.readiness().setOn(&st.Conditions, gen)
	if perr := writeScope(ctx, s.patch, pool, &st.ObservedGeneration, err); perr != nil {
		return ctrl.Result{}, errors.Join(err, perr)
	}
	return res, err
}

// readiness is the pool's Ready as the pass found it: held by claims
// while deleted, its spec invalid, or its counts; nil when the pass ended
// before any of those (a failed read).
func (s *ipPoolScope) readiness() *readiness {
	switch {
	case s.hold != nil:
		return s.hold
	case s.invalid != nil:
		return notReady(hfv1.InvalidSpecReason, s.invalid.Error())
	case s.counts != nil:
		msg := fmt.Sprintf("%d of %d addresses allocated", s.counts.Allocated, s.counts.Total)
		if len(s.parsed.Warnings) > 0 {
			msg += "; warnings: " + fmt.Sprint(s.parsed.Warnings)
		}
		return isReady(msg)
	}
	return nil
}

// forget drops what memory holds about a pool that is gone.
func (r *IPPoolReconciler) forget(name string) {
	r.IPAM.RemovePool(name)
	metrics.IPPoolFree.DeleteLabelValues(name)
}

// parseSpec reads the pool's spec. An invalid one stops the pass and
// leaves the allocator with the last valid spec: claims holding its
// addresses keep them, new claims wait until the spec is fixed.
func (r *IPPoolReconciler) parseSpec(_ context.Context, s *ipPoolScope) (phase.Result, error) {
	parsed, err := ipam.ParsePool(machineclaim.PoolSpec(s.pool))
	if err != nil {
		s.invalid = err
		r.Recorder.Event(s.pool, corev1.EventTypeWarning, string(hfv1.InvalidSpecReason), conditions.Truncate(err.Error(), 1024))
		return phase.Stop(), nil
	}
	s.parsed = parsed
	return phase.Next(), nil
}

// loadAllocator gives the allocator the pool's spec; an address held
// that the new spec no longer contains is a conflict the pool reports.
func (r *IPPoolReconciler) loadAllocator(_ context.Context, s *ipPoolScope) (phase.Result, error) {
	for _, c := range r.IPAM.SetPool(s.pool.Name, s.parsed) {
		r.Recorder.Event(s.pool, corev1.EventTypeWarning, "AllocationConflict", c.String())
	}
	return phase.Next(), nil
}

// rebuildAllocations gives a pool the allocator has not rebuilt yet (the
// first pass after a start) the allocations the claims' status records,
// before any claim gets an address from it.
func (r *IPPoolReconciler) rebuildAllocations(ctx context.Context, s *ipPoolScope) (phase.Result, error) {
	name := s.pool.Name
	if r.IPAM.Rebuilt(name) {
		return phase.Next(), nil
	}
	allocs, err := r.recordedAllocations(ctx, name)
	if err != nil {
		return phase.Stop(), err
	}
	conflicts, err := r.IPAM.Rebuild(name, allocs)
	if err != nil {
		return phase.Stop(), fmt.Errorf("rebuild the allocations of IPPool %s: %w", name, err)
	}
	for _, c := range conflicts {
		r.Recorder.Event(s.pool, corev1.EventTypeWarning, "AllocationConflict", c.String())
	}
	ctrl.LoggerFrom(ctx).Info("IPPool allocations rebuilt from claims", "allocations", len(allocs), "conflicts", len(conflicts))
	return phase.Next(), nil
}

// countAddresses records the allocator's totals for the status.
func (r *IPPoolReconciler) countAddresses(_ context.Context, s *ipPoolScope) (phase.Result, error) {
	counts, err := r.IPAM.Counts(s.pool.Name)
	if err != nil {
		return phase.Stop(), fmt.Errorf("count the addresses of IPPool %s: %w", s.pool.Name, err)
	}
	s.counts = &counts
	return phase.Next(), nil
}

// ippoolInUse is the pool as claims' addresses use it.
func ippoolInUse(pool *hfv1.IPPool) inUse {
	return inUse{obj: pool, conditions: &pool.Status.Conditions, finalizer: hfv1.IPPoolFinalizer, usage: "MachineClaims holding addresses from this pool"}
}

// holdWhileUsed holds a deleted pool while claims record addresses from
// it: an address is released only once its VM is gone (docs/security.md,
// "Absence and release"), and a claim still being built needs the pool's
// prefix, gateway and nameservers for its VM's network-config. The
// allocator keeps the pool meanwhile (releases go on; staticAddress gives
// no new claim an address from it).
func (r *IPPoolReconciler) holdWhileUsed(ctx context.Context, s *ipPoolScope) (phase.Result, error) {
	var claims hfv1.MachineClaimList
	if err := r.Client.List(ctx, &claims, client.MatchingFields{fieldindex.ClaimIPPool: s.pool.Name}); err != nil {
		return phase.Stop(), fmt.Errorf("list the claims holding addresses from IPPool %s: %w", s.pool.Name, err)
	}
	hold, err := ippoolInUse(s.pool).releaseWhenUnused(ctx, s.patch, r.Recorder, claimNames(claims.Items, func(*hfv1.MachineClaim) bool { return true }))
	if err != nil || hold != nil {
		s.hold = hold
		return phase.Stop(), err
	}
	return phase.Next(), nil
}

// forgetReleased drops a pool its deletion let go from the allocator.
func (r *IPPoolReconciler) forgetReleased(_ context.Context, s *ipPoolScope) (phase.Result, error) {
	r.forget(s.pool.Name)
	return phase.Stop(), nil
}

// recordedAllocations reads every allocation from the pool that a claim's
// status records.
func (r *IPPoolReconciler) recordedAllocations(ctx context.Context, pool string) ([]ipam.Allocation, error) {
	var claims hfv1.MachineClaimList
	if err := r.Client.List(ctx, &claims); err != nil {
		return nil, fmt.Errorf("list claims to rebuild the allocations of IPPool %s: %w", pool, err)
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
