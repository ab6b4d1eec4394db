package machineclaim

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/ipam"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	fakeprovider "github.com/hyperfleet/hyperfleet/pkg/provider/fake"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// adminPool is the IPPool of the admin actions' table: 10.9.0.0/29, its
// first address held by the claim under test.
const adminPool = "pool-a"

// adminAddress is the claim's address in adminPool.
var adminAddress = netip.MustParseAddr("10.9.0.1")

// adminIPAM is an allocator with adminPool rebuilt from what the claim
// records.
func adminIPAM(t *testing.T, claim *hfv1.MachineClaim) *ipam.Manager {
	t.Helper()
	m := ipam.NewManager()
	pool, err := ipam.ParsePool(ipam.Spec{Addresses: []string{"10.9.0.0/29"}, Prefix: 29})
	if err != nil {
		t.Fatal(err)
	}
	m.SetPool(adminPool, pool)
	var held []ipam.Allocation
	if claim.Status.Network != nil {
		held = append(held, ipam.Allocation{Owner: string(claim.UID), Address: adminAddress})
	}
	if _, err := m.Rebuild(adminPool, held); err != nil {
		t.Fatal(err)
	}
	return m
}

// ippool is adminPool's object, excluding what excluded lists.
func ippool(excluded ...string) *hfv1.IPPool {
	return &hfv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: adminPool},
		Spec: hfv1.IPPoolSpec{Addresses: []string{"10.9.0.0/29"}, Prefix: 29, ExcludedAddresses: excluded}}
}

// withAddress records adminAddress as the claim's.
func withAddress(c *hfv1.MachineClaim) *hfv1.MachineClaim {
	c.Status.Network = &hfv1.MachineNetworkStatus{IPAllocations: []hfv1.IPAllocation{{PoolRef: adminPool, Address: adminAddress.String() + "/29"}}}
	return c
}

// runningClaimOn is a claim whose VM vmid runs on cluster, with its
// finalizer, labels and runner.
func runningClaimOn(cluster string, vmid int32) *hfv1.MachineClaim {
	c := placedClaimOn(cluster, vmid)
	c.Status.End = nil
	setStandardMetadata(c, cluster)
	c.Status.Conditions = []metav1.Condition{{Type: string(hfv1.MachineClaimProvisionedCondition), Status: metav1.ConditionTrue,
		Reason: string(hfv1.ReadyReason), LastTransitionTime: metav1.NewTime(unitEpoch)}}
	c.Status.Bootstrap = &hfv1.BootstrapStatus{RunnerName: "runner-1", RunnerID: 7}
	return c
}

func annotate(c *hfv1.MachineClaim, key, value string) *hfv1.MachineClaim {
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	c.Annotations[key] = value
	return c
}

func deleting(c *hfv1.MachineClaim) *hfv1.MachineClaim {
	c.DeletionTimestamp = &metav1.Time{Time: unitEpoch}
	return c
}

// disownedClaim is a claim whose VM was disowned in an earlier pass and
// that still holds adminAddress.
func disownedClaim() *hfv1.MachineClaim {
	c := withAddress(runningClaimOn(unitCluster, 1001))
	c.Status.VMRef, c.Status.Bootstrap = nil, nil
	c.Status.End = &hfv1.MachineClaimEnd{Reason: hfv1.EndDisowned, StartedAt: metav1.NewTime(unitEpoch)}
	c.Status.Conditions = append(c.Status.Conditions, metav1.Condition{Type: string(hfv1.MachineClaimFinalizedCondition),
		Status: metav1.ConditionTrue, Reason: string(hfv1.DisownedReason), LastTransitionTime: metav1.NewTime(unitEpoch)})
	return c
}

// taggedVM puts on hv a VM of the claim as the claim's own configuration
// left it: its marker, the install's tags and another tag, stopped.
func taggedVM(t *testing.T, hv *fakeprovider.Cluster, signer *ownership.Signer, claim *hfv1.MachineClaim, vmid int) {
	t.Helper()
	o := vmspec.Owner(claim)
	desc := signer.ForCluster(ownership.ClusterIdentity{Name: unitCluster}).Description("CI runner", ownership.Record{
		Namespace: o.Namespace, Name: o.Name, UID: o.UID, Pool: o.Pool, VMID: vmid, CreatedAt: o.CreatedAt})
	if _, err := hv.AddForeignVM(fakeprovider.ForeignVM{VMID: vmid, Name: claim.Name, Description: desc, Tags: append(signer.Tags(), "team-a")}); err != nil {
		t.Fatal(err)
	}
}

// TestAdminActions runs the claim's phase lists for a platform admin's
// force-delete and disownment (admin.go) from a starting state each, one
// or more Reconciles on controller-runtime's fake client with the
// in-memory hypervisor behind the registry, and checks what the claim, the
// hypervisor, the allocator, the CI platform, the events and the metrics
// end with.
func TestAdminActions(t *testing.T) {
	type world struct {
		r   *Reconciler
		hv  *fakeprovider.Cluster
		ci  *ciDouble
		got *hfv1.MachineClaim // nil when the claim is gone
	}
	for name, tc := range map[string]struct {
		claim func() *hfv1.MachineClaim
		objs  []client.Object
		// release is the CI platform's answer to a runner's removal.
		release error
		setup   func(t *testing.T, w *world, claim *hfv1.MachineClaim)
		passes  int
		// wantGone: the claim no longer exists; wantDeleting: it is being
		// deleted (held by its finalizer).
		wantGone, wantDeleting bool
		wantRequeue            time.Duration
		wantConditions         map[hfv1.ConditionType]hfv1.ConditionReason
		wantEvents             []string
		// wantHeld: the allocator still holds adminAddress for the claim.
		wantHeld bool
		// wantReleases is how often the runner's removal was asked for.
		wantReleases int
		check        func(t *testing.T, w *world, claim *hfv1.MachineClaim)
	}{
		"force-delete: a claim not being deleted is deleted": {
			claim: func() *hfv1.MachineClaim {
				return annotate(runningClaimOn(unitCluster, 1001), hfv1.ForceDeleteAnnotation, "pve-a burned down")
			},
			passes: 1, wantDeleting: true,
			wantConditions: map[hfv1.ConditionType]hfv1.ConditionReason{hfv1.MachineClaimEndingCondition: hfv1.ForceDeletedReason},
		},
		"force-delete: the claim goes without its cluster, releasing runner and address": {
			claim: func() *hfv1.MachineClaim {
				return withAddress(deleting(annotate(runningClaimOn("pve-gone", 1001), hfv1.ForceDeleteAnnotation, "pve-gone is decommissioned")))
			},
			passes: 1, wantGone: true, wantReleases: 1,
			wantEvents: []string{"Warning ForceDeleted", "Normal AddressReleased", "Normal RunnerRemoved"},
			check: func(t *testing.T, w *world, claim *hfv1.MachineClaim) {
				t.Helper()
				if got := testutil.ToFloat64(metrics.ClaimsForceDeleted.WithLabelValues("pve-gone")); got != 1 {
					t.Errorf("hyperfleet_claims_force_deleted_total{cluster=pve-gone} = %v, want 1", got)
				}
			},
		},
		"force-delete: a claim stuck deleting its VM abandons it without a call": {
			claim: func() *hfv1.MachineClaim {
				c := deleting(annotate(placedClaimOn(unitCluster, 1001), hfv1.ForceDeleteAnnotation, "stuck"))
				c.Finalizers = []string{hfv1.MachineClaimFinalizer}
				return c
			},
			setup: func(t *testing.T, w *world, claim *hfv1.MachineClaim) {
				taggedVM(t, w.hv, w.r.Signer, claim, 1001)
			},
			passes: 1, wantGone: true, wantEvents: []string{"Warning ForceDeleted"},
			check: func(t *testing.T, w *world, claim *hfv1.MachineClaim) {
				t.Helper()
				// Untouched: still the claim's, for the orphan sweep.
				vm, ok := w.hv.VM(1001)
				if !ok || !strings.Contains(vm.Description, "uid: "+string(claim.UID)) || !strings.Contains(strings.Join(vm.Tags, ";"), "hyperfleet") {
					t.Errorf("the abandoned VM was touched: %+v (exists %v)", vm, ok)
				}
			},
		},
		"force-delete does not release the address of a disowned VM": {
			claim: func() *hfv1.MachineClaim {
				return deleting(annotate(disownedClaim(), hfv1.ForceDeleteAnnotation, "get rid of it"))
			},
			objs:   []client.Object{ippool()},
			passes: 1, wantDeleting: true, wantRequeue: addressRecheck, wantHeld: true,
			wantConditions: map[hfv1.ConditionType]hfv1.ConditionReason{hfv1.MachineClaimEndingCondition: hfv1.AddressNotExcludedReason},
			wantEvents:     []string{"Warning AddressNotExcluded"},
		},
		"disown: the VM is released and kept, the claim ends and goes": {
			claim: func() *hfv1.MachineClaim {
				return annotate(runningClaimOn(unitCluster, 1001), hfv1.DisownAnnotation, "keep for forensics")
			},
			objs: []client.Object{worldCluster()},
			setup: func(t *testing.T, w *world, claim *hfv1.MachineClaim) {
				taggedVM(t, w.hv, w.r.Signer, claim, 1001)
			},
			passes: 2, wantGone: true, wantReleases: 1,
			wantEvents: []string{"Normal Disowned", "Normal RunnerRemoved"},
			check: func(t *testing.T, w *world, claim *hfv1.MachineClaim) {
				t.Helper()
				vm, ok := w.hv.VM(1001)
				if !ok {
					t.Fatal("the disowned VM was destroyed")
				}
				if strings.Contains(vm.Description, "BEGIN HYPERFLEET OWNERSHIP") || strings.Join(vm.Tags, ";") != "team-a" {
					t.Errorf("the disowned VM keeps HyperFleet's marks: tags %v, description %q", vm.Tags, vm.Description)
				}
				if !w.r.Signer.ForCluster(ownership.ClusterIdentity{Name: unitCluster}).Released(vm.Description, string(claim.UID), 1001) {
					t.Errorf("the disowned VM's description does not say whose it was: %q", vm.Description)
				}
				if got := testutil.ToFloat64(metrics.ClaimsDisowned.WithLabelValues(unitCluster)); got < 1 {
					t.Errorf("hyperfleet_claims_disowned_total{cluster=%s} = %v, want at least 1", unitCluster, got)
				}
			},
		},
		"disown: the claim holds the VM's address until it is excluded from its pool": {
			claim: func() *hfv1.MachineClaim {
				return withAddress(annotate(runningClaimOn(unitCluster, 1001), hfv1.DisownAnnotation, "debug the network"))
			},
			objs: []client.Object{worldCluster(), ippool("10.9.0.7/32")},
			setup: func(t *testing.T, w *world, claim *hfv1.MachineClaim) {
				taggedVM(t, w.hv, w.r.Signer, claim, 1001)
			},
			passes: 2, wantRequeue: addressRecheck, wantHeld: true, wantReleases: 1,
			wantConditions: map[hfv1.ConditionType]hfv1.ConditionReason{
				hfv1.MachineClaimFinalizedCondition: hfv1.DisownedReason, hfv1.MachineClaimEndingCondition: hfv1.AddressNotExcludedReason,
			},
			wantEvents: []string{"Normal Disowned", "Warning AddressNotExcluded"},
			check: func(t *testing.T, w *world, claim *hfv1.MachineClaim) {
				t.Helper()
				ending := hfv1.FindCondition(w.got.Status.Conditions, hfv1.MachineClaimEndingCondition)
				for _, want := range []string{"10.9.0.1/32", "spec.excludedAddresses of IPPool " + adminPool, `"path":"/spec/excludedAddresses/-"`} {
					if !strings.Contains(ending.Message, want) {
						t.Errorf("Ending message %q does not say %q", ending.Message, want)
					}
				}
				if w.got.Status.VMRef != nil || w.got.Status.Phase != hfv1.MachineClaimTerminating {
					t.Errorf("vmRef %+v, phase %s; want none and Terminating", w.got.Status.VMRef, w.got.Status.Phase)
				}
				// Excluded: the claim lets the address go and ends.
				pool := &hfv1.IPPool{}
				if err := w.r.Client.Get(context.Background(), client.ObjectKey{Name: adminPool}, pool); err != nil {
					t.Fatal(err)
				}
				pool.Spec.ExcludedAddresses = append(pool.Spec.ExcludedAddresses, "10.9.0.1/32")
				if err := w.r.Client.Update(context.Background(), pool); err != nil {
					t.Fatal(err)
				}
				for range 2 {
					if _, err := w.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(claim)}); err != nil {
						t.Fatal(err)
					}
				}
				if err := w.r.Client.Get(context.Background(), client.ObjectKeyFromObject(claim), &hfv1.MachineClaim{}); !apierrors.IsNotFound(err) {
					t.Errorf("the claim whose address was excluded is still there: %v", err)
				}
				if owner, held := w.r.IPAM.Owner(adminPool, adminAddress); held {
					t.Errorf("the excluded address is still held by %s", owner)
				}
			},
		},
		"disown: a VM whose marker does not verify is left alone, and the address with it": {
			claim: func() *hfv1.MachineClaim {
				return withAddress(annotate(runningClaimOn(unitCluster, 1001), hfv1.DisownAnnotation, "keep it"))
			},
			setup: func(t *testing.T, w *world, _ *hfv1.MachineClaim) {
				if _, err := w.hv.AddForeignVM(fakeprovider.ForeignVM{VMID: 1001, Name: "admin-vm", Tags: []string{"hyperfleet"}}); err != nil {
					t.Fatal(err)
				}
			},
			passes: 1, wantRequeue: ownershipRecheck, wantHeld: true,
			wantConditions: map[hfv1.ConditionType]hfv1.ConditionReason{
				hfv1.MachineClaimEndingCondition: hfv1.OwnershipMismatchReason, hfv1.MachineClaimOwnershipVerifiedCondition: hfv1.OwnershipMismatchReason,
			},
			wantEvents: []string{"Warning OwnershipMismatch"},
			check: func(t *testing.T, w *world, _ *hfv1.MachineClaim) {
				t.Helper()
				if vm, _ := w.hv.VM(1001); vm.Name != "admin-vm" || strings.Join(vm.Tags, ";") != "hyperfleet" {
					t.Errorf("the VM that is not the claim's was changed: %+v", vm)
				}
				if hfv1.FindCondition(w.got.Status.Conditions, hfv1.MachineClaimFinalizedCondition) != nil {
					t.Error("Finalized is set although nothing was disowned")
				}
			},
		},
		"disown: waits for a cluster that is not connected, and says force-delete is the way out": {
			claim: func() *hfv1.MachineClaim {
				return annotate(runningClaimOn("pve-gone", 1001), hfv1.DisownAnnotation, "keep it")
			},
			passes: 1, wantRequeue: 2 * time.Second,
			wantConditions: map[hfv1.ConditionType]hfv1.ConditionReason{hfv1.MachineClaimEndingCondition: hfv1.ClusterUnavailableReason},
			check: func(t *testing.T, w *world, _ *hfv1.MachineClaim) {
				t.Helper()
				if c := hfv1.FindCondition(w.got.Status.Conditions, hfv1.MachineClaimEndingCondition); !strings.Contains(c.Message, hfv1.ForceDeleteAnnotation) {
					t.Errorf("Ending message %q does not name %s", c.Message, hfv1.ForceDeleteAnnotation)
				}
			},
		},
		"disown: a busy runner is left to finish its job": {
			claim: func() *hfv1.MachineClaim {
				return annotate(runningClaimOn(unitCluster, 1001), hfv1.DisownAnnotation, "keep it")
			},
			release: workload.ErrRunnerBusy,
			setup: func(t *testing.T, w *world, claim *hfv1.MachineClaim) {
				taggedVM(t, w.hv, w.r.Signer, claim, 1001)
			},
			passes: 2, wantGone: true, wantReleases: 1,
			wantEvents: []string{"Normal Disowned", "Normal RunnerBusy"},
		},
		"disown: a claim without a VM releases its address at once": {
			claim: func() *hfv1.MachineClaim {
				c := withAddress(annotate(runningClaimOn(unitCluster, 1001), hfv1.DisownAnnotation, "nothing to keep"))
				c.Status.VMRef = nil
				return c
			},
			passes: 2, wantGone: true, wantReleases: 1,
			wantEvents: []string{"Normal Disowned", "Normal AddressReleased"},
		},
		"disown: a VM that is gone is confirmed gone and its address released": {
			claim: func() *hfv1.MachineClaim {
				return withAddress(annotate(runningClaimOn(unitCluster, 1001), hfv1.DisownAnnotation, "too late"))
			},
			passes: 2, wantGone: true, wantReleases: 1,
			wantEvents: []string{"Normal VMDeleted", "Normal Disowned", "Normal AddressReleased"},
		},
		"an admin annotation without a reason is ignored, with a warning": {
			claim: func() *hfv1.MachineClaim {
				return annotate(runningClaimOn(unitCluster, 1001), hfv1.DisownAnnotation, "  ")
			},
			objs:   []client.Object{worldCluster()},
			passes: 1, wantRequeue: guestRetry,
			wantConditions: map[hfv1.ConditionType]hfv1.ConditionReason{hfv1.MachineClaimProvisionedCondition: hfv1.ReadyReason},
			wantEvents:     []string{"Warning InvalidAdminAnnotation"},
			check: func(t *testing.T, w *world, _ *hfv1.MachineClaim) {
				t.Helper()
				if w.got.Status.End != nil || w.got.Status.VMRef == nil {
					t.Errorf("the claim acted on an annotation without a reason: end %+v, vmRef %+v", w.got.Status.End, w.got.Status.VMRef)
				}
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			r, hv, _, rec := serviceWorld(t)
			claim := tc.claim()
			w := &world{r: r, hv: hv, ci: &ciDouble{release: tc.release}}
			r.CI = w.ci
			r.IPAM = adminIPAM(t, claim)
			// The template: its credentials remove the claim's runner.
			r.Client = claimWorld(t, append([]client.Object{claim.DeepCopy(), readyTemplate()}, tc.objs...)...)
			if tc.setup != nil {
				tc.setup(t, w, claim)
			}
			ctx := context.Background()
			var res ctrl.Result
			var events []string
			for i := range tc.passes {
				var err error
				if res, err = r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(claim)}); err != nil {
					t.Fatalf("pass %d: %v", i, err)
				}
				events = append(events, drainEvents(rec)...)
			}
			for _, want := range tc.wantEvents {
				if !hasEvent(events, want) {
					t.Errorf("events %q, want one %q", events, want)
				}
			}
			got := &hfv1.MachineClaim{}
			err := r.Client.Get(ctx, client.ObjectKeyFromObject(claim), got)
			switch {
			case tc.wantGone:
				if !apierrors.IsNotFound(err) {
					t.Fatalf("the claim is still there (%v): %+v", err, got.Status)
				}
			case err != nil:
				t.Fatal(err)
			default:
				w.got = got
				if tc.wantDeleting == got.DeletionTimestamp.IsZero() {
					t.Errorf("deletionTimestamp %v, want the claim deleted: %v", got.DeletionTimestamp, tc.wantDeleting)
				}
				if res.RequeueAfter != tc.wantRequeue {
					t.Errorf("requeue after %s, want %s", res.RequeueAfter, tc.wantRequeue)
				}
				for typ, reason := range tc.wantConditions {
					if c := hfv1.FindCondition(got.Status.Conditions, typ); c == nil || c.Reason != string(reason) {
						t.Errorf("%s = %+v, want reason %s", typ, c, reason)
					}
				}
			}
			if owner, held := r.IPAM.Owner(adminPool, adminAddress); held != tc.wantHeld || held && owner != string(claim.UID) {
				t.Errorf("adminAddress held by %q (%v), want held by the claim: %v", owner, held, tc.wantHeld)
			}
			if _, releases := w.ci.calls(); releases != tc.wantReleases {
				t.Errorf("runner removals asked for: %d, want %d", releases, tc.wantReleases)
			}
			if tc.check != nil {
				tc.check(t, w, claim)
			}
		})
	}
}

// TestAdminPhases: which phase list a claim runs, by its annotations and
// whether its VM was disowned: a disowned claim keeps the disownment list
// whatever happens to its annotations, and a force-delete goes before a
// disownment not done yet.
func TestAdminPhases(t *testing.T) {
	r := &Reconciler{}
	for name, tc := range map[string]struct {
		claim *hfv1.MachineClaim
		want  int // the length of the list; 0: no admin list
	}{
		"none":                                {claim: runningClaimOn(unitCluster, 1001)},
		"force-delete, not deleted":           {claim: annotate(runningClaimOn(unitCluster, 1001), hfv1.ForceDeleteAnnotation, "x"), want: 1},
		"force-delete, deleted":               {claim: deleting(annotate(runningClaimOn(unitCluster, 1001), hfv1.ForceDeleteAnnotation, "x")), want: 5},
		"disown":                              {claim: annotate(runningClaimOn(unitCluster, 1001), hfv1.DisownAnnotation, "x"), want: 7},
		"both, not disowned yet":              {claim: annotate(annotate(runningClaimOn(unitCluster, 1001), hfv1.DisownAnnotation, "x"), hfv1.ForceDeleteAnnotation, "y"), want: 1},
		"disowned, annotation removed":        {claim: disownedClaim(), want: 7},
		"disowned, force-delete added":        {claim: deleting(annotate(disownedClaim(), hfv1.ForceDeleteAnnotation, "y")), want: 7},
		"force-delete with an empty reason":   {claim: annotate(runningClaimOn(unitCluster, 1001), hfv1.ForceDeleteAnnotation, "")},
		"disown with a reason over the bound": {claim: annotate(runningClaimOn(unitCluster, 1001), hfv1.DisownAnnotation, strings.Repeat("é", hfv1.MaxAdminReasonLength+1))},
	} {
		t.Run(name, func(t *testing.T) {
			if got := len(r.adminPhases(tc.claim)); got != tc.want {
				t.Errorf("admin phase list of %d phases, want %d", got, tc.want)
			}
		})
	}
	if _, _, err := annotate(runningClaimOn(unitCluster, 1001), hfv1.DisownAnnotation, strings.Repeat("é", hfv1.MaxAdminReasonLength)).AdminReason(hfv1.DisownAnnotation); err != nil {
		t.Errorf("a reason of %d characters (%d bytes) is refused: %v", hfv1.MaxAdminReasonLength, 2*hfv1.MaxAdminReasonLength, err)
	}
	if _, _, err := annotate(runningClaimOn(unitCluster, 1001), hfv1.DisownAnnotation, "").AdminReason(hfv1.DisownAnnotation); err == nil ||
		!strings.Contains(err.Error(), "metadata.annotations["+hfv1.DisownAnnotation+"]") {
		t.Errorf("an empty reason: %v, want an error naming the annotation", err)
	}
}

// TestDisownedClaimsOfPool: a change of an IPPool wakes the disowned claims
// that hold one of its addresses (the admin may have excluded it), and no
// other claim.
func TestDisownedClaimsOfPool(t *testing.T) {
	disowned := disownedClaim()
	running := withAddress(runningClaimOn(unitCluster, 1002))
	running.Name, running.UID = "runner-2", "uid-runner-2"
	elsewhere := disownedClaim()
	elsewhere.Name, elsewhere.UID = "runner-3", "uid-runner-3"
	elsewhere.Status.Network.IPAllocations[0].PoolRef = "pool-b"
	r := &Reconciler{Client: claimWorld(t, disowned, running, elsewhere)}
	got := r.disownedClaimsOfPool(context.Background(), ippool())
	if len(got) != 1 || got[0].NamespacedName != client.ObjectKeyFromObject(disowned) {
		t.Errorf("woken %v, want only %s", got, client.ObjectKeyFromObject(disowned))
	}
}
