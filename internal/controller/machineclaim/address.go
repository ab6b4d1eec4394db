package machineclaim

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/ipam"
	"github.com/hyperfleet/hyperfleet/internal/tenancy"
)

// errAddressWait means the claim must wait for its pool before it can get
// an address; the claim's condition says why.
var errAddressWait = errors.New("waiting for an address")

// staticAddress returns the claim's address from its template's pool,
// allocating one (and recording it in status) on first use. The address is
// recorded before anything uses it, so a restart never hands it out twice.
func (r *Reconciler) staticAddress(ctx context.Context, s *claimScope, tmpl *hfv1.HypervisorMachineTemplate) (netip.Addr, *ipam.Pool, bool, error) {
	claim := s.claim
	ref := tmpl.Spec.Network.IPPoolRef
	poolObj := &hfv1.IPPool{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: ref.Name}, poolObj); err != nil {
		return netip.Addr{}, nil, false, r.waitForAddress(s, string(hfv1.IPPoolExhaustedReason), fmt.Sprintf("spec.network.ipPoolRef of template %s: IPPool %s: %v", tmpl.Name, ref.Name, err))
	}
	recorded := recordedAllocation(claim, ref.Name)
	if !poolObj.DeletionTimestamp.IsZero() && recorded == nil {
		return netip.Addr{}, nil, false, r.waitForAddress(s, "IPPoolNotReady", fmt.Sprintf("IPPool %s (spec.network.ipPoolRef of template %s) is being deleted and gives no new addresses; point the template at another pool", ref.Name, tmpl.Name))
	}
	allowed, err := tenancy.SelectorAdmits(ctx, r.Client, poolObj.Spec.AllowedNamespaces, claim.Namespace)
	if err != nil || !allowed {
		return netip.Addr{}, nil, false, r.waitForAddress(s, string(hfv1.NamespaceNotAllowedReason),
			fmt.Sprintf("IPPool %s does not admit namespace %s (spec.allowedNamespaces)", ref.Name, claim.Namespace))
	}
	pool, err := ipam.ParsePool(PoolSpec(poolObj))
	if err != nil {
		return netip.Addr{}, nil, false, r.waitForAddress(s, string(hfv1.InvalidSpecReason), fmt.Sprintf("IPPool %s is invalid: %v", ref.Name, err))
	}
	if recorded != nil {
		addr, err := ipam.ParseAllocatedAddress(recorded.Address)
		return addr, pool, false, err
	}
	addr, err := r.IPAM.Allocate(ref.Name, string(claim.UID))
	switch {
	case errors.Is(err, ipam.ErrExhausted):
		r.Recorder.Eventf(claim, corev1.EventTypeWarning, string(hfv1.IPPoolExhaustedReason), "IPPool %s has no free address", ref.Name)
		return netip.Addr{}, nil, false, r.waitForAddress(s, string(hfv1.IPPoolExhaustedReason), fmt.Sprintf("IPPool %s has no free address; the claim waits for one", ref.Name))
	case err != nil:
		return netip.Addr{}, nil, false, r.waitForAddress(s, "IPPoolNotReady", fmt.Sprintf("IPPool %s: %v", ref.Name, err))
	}
	if claim.Status.Network == nil {
		claim.Status.Network = &hfv1.MachineNetworkStatus{}
	}
	alloc := hfv1.IPAllocation{PoolRef: ref.Name, Address: pool.WithPrefix(addr).String()}
	if gw := pool.Gateway(); gw.IsValid() {
		alloc.Gateway = gw.String()
	}
	claim.Status.Network.IPAllocations = append(claim.Status.Network.IPAllocations, alloc)
	r.Recorder.Eventf(claim, corev1.EventTypeNormal, "AddressAllocated", "Allocated %s from IPPool %s", alloc.Address, ref.Name)
	// fresh: the caller persists the allocation before using it.
	return addr, pool, true, nil
}

// recordedAllocation is the claim's address from pool as its status
// records it; nil when it has none.
func recordedAllocation(claim *hfv1.MachineClaim, pool string) *hfv1.IPAllocation {
	if claim.Status.Network == nil {
		return nil
	}
	for i, a := range claim.Status.Network.IPAllocations {
		if a.PoolRef == pool {
			return &claim.Status.Network.IPAllocations[i]
		}
	}
	return nil
}

func (r *Reconciler) waitForAddress(s *claimScope, reason, msg string) error {
	s.facts.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.ConditionReason(reason), msg)
	return errAddressWait
}

// releaseAddresses returns the claim's addresses to their pools once its VM
// is confirmed gone (never while it may exist: docs/security.md, "Absence
// and release"). It frees what the claim's status records and then
// everything the allocator holds for the claim's UID: an address allocated
// in memory whose status write failed is recorded nowhere else.
func (r *Reconciler) releaseAddresses(ctx context.Context, claim *hfv1.MachineClaim) {
	if r.IPAM == nil {
		return
	}
	if claim.Status.Network != nil {
		for _, a := range claim.Status.Network.IPAllocations {
			addr, err := ipam.ParseAllocatedAddress(a.Address)
			if err != nil {
				continue
			}
			// A pool not loaded yet rebuilds from the claims that still
			// record addresses, so dropping the record releases it too.
			if err := r.IPAM.Release(a.PoolRef, string(claim.UID), addr); err != nil && !errors.Is(err, ipam.ErrUnknownPool) && !errors.Is(err, ipam.ErrNotRebuilt) {
				ctrl.LoggerFrom(ctx).Error(err, "Release address", "pool", a.PoolRef, "address", a.Address)
				continue
			}
			r.Recorder.Eventf(claim, corev1.EventTypeNormal, "AddressReleased", "Released %s to IPPool %s", a.Address, a.PoolRef)
		}
		claim.Status.Network.IPAllocations = nil
	}
	for _, rel := range r.IPAM.ReleaseOwnerEverywhere(string(claim.UID)) {
		ctrl.LoggerFrom(ctx).Info("Released an address the claim's status never recorded", "pool", rel.Pool, "address", rel.Address.String())
		r.Recorder.Eventf(claim, corev1.EventTypeNormal, "AddressReleased", "Released %s to IPPool %s (allocated but never recorded in status)", rel.Address, rel.Pool)
	}
}

// PoolSpec is an IPPool as the allocator reads it. The IPPool and template
// controllers validate a pool with the same parse the claims allocate from.
func PoolSpec(p *hfv1.IPPool) ipam.Spec {
	return ipam.Spec{
		Addresses: p.Spec.Addresses, ExcludedAddresses: p.Spec.ExcludedAddresses, Prefix: p.Spec.Prefix,
		Gateways: p.Spec.Gateways, Nameservers: p.Spec.Nameservers, SearchDomains: p.Spec.SearchDomains,
	}
}
