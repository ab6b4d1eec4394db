package machineclaim

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/ipam"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/tenancy"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
)

// errAddressWait means the claim must wait for its pool before it can get
// an address; the claim's condition says why.
var errAddressWait = errors.New("waiting for an address")

// addressService gives claims' VMs their static addresses from IPPools
// (network mode static) and returns them when the VMs are gone.
type addressService struct {
	ipam     *ipam.Manager
	client   client.Client
	recorder record.EventRecorder
}

// addresses is the claims' address service.
func (r *Reconciler) addresses() addressService {
	return addressService{ipam: r.IPAM, client: r.Client, recorder: r.Recorder}
}

// forClaim returns the claim's addresses, one from each IPPool of
// its template (spec.network.ipPoolRef, or ipPoolRefs for dual stack), in
// spec order, allocating the missing ones and recording them in status.
// fresh is true when some were allocated now: the caller persists them
// before anything uses them, so a restart never hands one out twice.
//
// The addresses of one call are all or nothing: when a pool cannot give
// one, those this call allocated from the other pools are released again
// (they were never recorded), so a claim waiting for its IPv6 address
// holds no IPv4 address meanwhile. Addresses recorded by an earlier pass
// stay: a VM may be using them.
func (ad addressService) forClaim(ctx context.Context, s *claimScope, tmpl *hfv1.HypervisorMachineTemplate) ([]vmspec.StaticAddr, bool, error) {
	claim := s.claim
	field := "spec.network.ipPoolRef"
	if len(tmpl.Spec.Network.IPPoolRefs) > 0 {
		field = "spec.network.ipPoolRefs"
	}
	var addrs []vmspec.StaticAddr
	var fresh []hfv1.IPAllocation
	for _, name := range tmpl.Spec.Network.IPPoolNames() {
		addr, alloc, err := ad.fromPool(ctx, s, tmpl, field, name)
		if err != nil {
			ad.releaseUnrecorded(ctx, claim, fresh)
			return nil, false, err
		}
		addrs = append(addrs, addr)
		if alloc != nil {
			fresh = append(fresh, *alloc)
		}
	}
	if len(fresh) == 0 {
		return addrs, false, nil
	}
	if claim.Status.Network == nil {
		claim.Status.Network = &hfv1.MachineNetworkStatus{}
	}
	claim.Status.Network.IPAllocations = append(claim.Status.Network.IPAllocations, fresh...)
	for _, a := range fresh {
		ad.recorder.Eventf(claim, corev1.EventTypeNormal, "AddressAllocated", "Allocated %s from IPPool %s", a.Address, a.PoolRef)
	}
	return addrs, true, nil
}

// fromPool returns the claim's address from the IPPool name (its
// template's field), allocating one on first use; alloc is the new
// allocation to record, nil when the claim's status already records it.
func (ad addressService) fromPool(ctx context.Context, s *claimScope, tmpl *hfv1.HypervisorMachineTemplate, field, name string) (vmspec.StaticAddr, *hfv1.IPAllocation, error) {
	claim := s.claim
	poolObj := &hfv1.IPPool{}
	if err := ad.client.Get(ctx, client.ObjectKey{Name: name}, poolObj); err != nil {
		return vmspec.StaticAddr{}, nil, s.waitForAddress(string(hfv1.IPPoolExhaustedReason), fmt.Sprintf("%s of template %s: IPPool %s: %v", field, tmpl.Name, name, err))
	}
	recorded := recordedAllocation(claim, name)
	if !poolObj.DeletionTimestamp.IsZero() && recorded == nil {
		return vmspec.StaticAddr{}, nil, s.waitForAddress("IPPoolNotReady", fmt.Sprintf("IPPool %s (%s of template %s) is being deleted and gives no new addresses; point the template at another pool", name, field, tmpl.Name))
	}
	allowed, err := tenancy.SelectorAdmits(ctx, ad.client, poolObj.Spec.AllowedNamespaces, claim.Namespace)
	if err != nil || !allowed {
		return vmspec.StaticAddr{}, nil, s.waitForAddress(string(hfv1.NamespaceNotAllowedReason),
			fmt.Sprintf("IPPool %s does not admit namespace %s (spec.allowedNamespaces)", name, claim.Namespace))
	}
	pool, err := ipam.ParsePool(PoolSpec(poolObj))
	if err != nil {
		return vmspec.StaticAddr{}, nil, s.waitForAddress(string(hfv1.InvalidSpecReason), fmt.Sprintf("IPPool %s is invalid: %v", name, err))
	}
	if recorded != nil {
		addr, err := ipam.ParseAllocatedAddress(recorded.Address)
		return vmspec.StaticAddr{IP: addr, Pool: pool}, nil, err
	}
	addr, err := ad.ipam.Allocate(name, string(claim.UID))
	switch {
	case errors.Is(err, ipam.ErrExhausted):
		ad.recorder.Eventf(claim, corev1.EventTypeWarning, string(hfv1.IPPoolExhaustedReason), "IPPool %s has no free address", name)
		return vmspec.StaticAddr{}, nil, s.waitForAddress(string(hfv1.IPPoolExhaustedReason), fmt.Sprintf("IPPool %s has no free address; the claim waits for one", name))
	case err != nil:
		return vmspec.StaticAddr{}, nil, s.waitForAddress("IPPoolNotReady", fmt.Sprintf("IPPool %s: %v", name, err))
	}
	alloc := &hfv1.IPAllocation{PoolRef: name, Address: pool.WithPrefix(addr).String()}
	if gw := pool.Gateway(); gw.IsValid() {
		alloc.Gateway = gw.String()
	}
	return vmspec.StaticAddr{IP: addr, Pool: pool}, alloc, nil
}

// releaseUnrecorded gives back addresses allocated in this pass and never
// recorded: the claim's other pool could not give its address.
func (ad addressService) releaseUnrecorded(ctx context.Context, claim *hfv1.MachineClaim, allocs []hfv1.IPAllocation) {
	for _, a := range allocs {
		addr, err := ipam.ParseAllocatedAddress(a.Address)
		if err == nil {
			err = ad.ipam.Release(a.PoolRef, string(claim.UID), addr)
		}
		if err != nil {
			// Still held in memory for the claim: its next pass gets the
			// same address back (Allocate is idempotent per owner), and
			// its end frees it (ReleaseOwnerEverywhere).
			ctrl.LoggerFrom(ctx).Error(err, "Release an unrecorded address", "pool", a.PoolRef, "address", a.Address)
		}
	}
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

// waitForAddress records why the claim waits for an address.
func (s *claimScope) waitForAddress(reason, msg string) error {
	s.facts.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.ConditionReason(reason), msg)
	return errAddressWait
}

// release returns the claim's addresses to their pools once its VM
// is confirmed gone (never while it may exist: docs/security.md, "Absence
// and release"). It frees what the claim's status records and then
// everything the allocator holds for the claim's UID: an address allocated
// in memory whose status write failed is recorded nowhere else.
func (ad addressService) release(ctx context.Context, claim *hfv1.MachineClaim) {
	if ad.ipam == nil {
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
			if err := ad.ipam.Release(a.PoolRef, string(claim.UID), addr); err != nil && !errors.Is(err, ipam.ErrUnknownPool) && !errors.Is(err, ipam.ErrNotRebuilt) {
				ctrl.LoggerFrom(ctx).Error(err, "Release address", "pool", a.PoolRef, "address", a.Address)
				continue
			}
			ad.recorder.Eventf(claim, corev1.EventTypeNormal, "AddressReleased", "Released %s to IPPool %s", a.Address, a.PoolRef)
		}
		claim.Status.Network.IPAllocations = nil
	}
	for _, rel := range ad.ipam.ReleaseOwnerEverywhere(string(claim.UID)) {
		ctrl.LoggerFrom(ctx).Info("Released an address the claim's status never recorded", "pool", rel.Pool, "address", rel.Address.String())
		ad.recorder.Eventf(claim, corev1.EventTypeNormal, "AddressReleased", "Released %s to IPPool %s (allocated but never recorded in status)", rel.Address, rel.Pool)
	}
}

// exclusionNeeded says what an admin must do so that the pool of a no
// longer hands its address out ("" when nothing: the pool's current spec
// excludes it). An error means the pool could not be read.
func (ad addressService) exclusionNeeded(ctx context.Context, a hfv1.IPAllocation) (string, error) {
	addr, err := ipam.ParseAllocatedAddress(a.Address)
	if err != nil {
		// Not an address: no pool hands it out.
		return "", nil //nolint:nilerr // an unreadable record holds nothing
	}
	exclusion := netip.PrefixFrom(addr, addr.BitLen()).String()
	pool := &hfv1.IPPool{}
	switch err := ad.client.Get(ctx, client.ObjectKey{Name: a.PoolRef}, pool); {
	case apierrors.IsNotFound(err):
		// A pool created again under this name would hand it out.
		return fmt.Sprintf("IPPool %s does not exist; if it is created again, give it %s in spec.excludedAddresses", a.PoolRef, exclusion), nil
	case err != nil:
		return "", fmt.Errorf("read IPPool %s: %w", a.PoolRef, err)
	}
	parsed, err := ipam.ParsePool(PoolSpec(pool))
	if err == nil && !parsed.Contains(addr) {
		return "", nil
	}
	patch := fmt.Sprintf(`kubectl patch ippool %s --type=json -p '[{"op":"add","path":"/spec/excludedAddresses/-","value":"%s"}]'`, a.PoolRef, exclusion)
	if len(pool.Spec.ExcludedAddresses) == 0 {
		patch = fmt.Sprintf(`kubectl patch ippool %s --type=merge -p '{"spec":{"excludedAddresses":["%s"]}}'`, a.PoolRef, exclusion)
	}
	return fmt.Sprintf("add %s to spec.excludedAddresses of IPPool %s (%s)", exclusion, a.PoolRef, patch), nil
}

// PoolSpec is an IPPool as the allocator reads it. The IPPool and template
// controllers validate a pool with the same parse the claims allocate from.
func PoolSpec(p *hfv1.IPPool) ipam.Spec {
	return ipam.Spec{
		Addresses: p.Spec.Addresses, ExcludedAddresses: p.Spec.ExcludedAddresses, Prefix: p.Spec.Prefix,
		Gateways: p.Spec.Gateways, Nameservers: p.Spec.Nameservers, SearchDomains: p.Spec.SearchDomains,
	}
}

// ensureAddress allocates the claim's static addresses (network mode
// static: one, or an IPv4 and an IPv6 one) and has them stored before any
// VM is built with them.
func (r *Reconciler) ensureAddress(ctx context.Context, s *claimScope) (phase.Result, error) {
	if s.tmpl.Spec.Network.Mode != hfv1.NetworkModeStatic {
		return phase.Next(), nil
	}
	_, fresh, err := r.addresses().forClaim(ctx, s, s.tmpl)
	switch {
	case errors.Is(err, errAddressWait):
		return phase.StopAndRequeue(10 * time.Second), nil
	case err != nil:
		return r.provisionError(ctx, s, err)
	case fresh:
		// Persist the allocation (the scope's status write) before any VM
		// is built with it.
		return phase.StopAndRequeue(time.Millisecond), nil
	}
	return phase.Next(), nil
}
