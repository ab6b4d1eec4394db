package machineclaim

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
	fakeprovider "github.com/hyperfleet/hyperfleet/pkg/provider/fake"
)

// claimWorld is a fake API server holding objs, with the manager's field
// indexes and the status subresource of the kinds the claim writes.
func claimWorld(t *testing.T, objs ...client.Object) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := hfv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithStatusSubresource(&hfv1.MachineClaim{}, &hfv1.HypervisorMachineTemplate{}, &hfv1.HypervisorCluster{}, &hfv1.CIJob{})
	for _, ix := range fieldindex.All(ciPlatforms) {
		b = b.WithIndex(ix.Obj, ix.Field, ix.Extract)
	}
	return b.Build()
}

// worldCluster is the HypervisorCluster object of serviceWorld's cluster.
func worldCluster() *hfv1.HypervisorCluster {
	return &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: unitCluster}}
}

// readyTemplate is a template validated for its generation.
func readyTemplate() *hfv1.HypervisorMachineTemplate {
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "debian", Generation: 1}}
	tmpl.Spec.HypervisorClusterRef.Name = unitCluster
	tmpl.Status.ObservedGeneration = 1
	tmpl.Status.Conditions = []metav1.Condition{{Type: string(hfv1.ReadyCondition), Status: metav1.ConditionTrue, Reason: string(hfv1.ReadyReason), LastTransitionTime: metav1.NewTime(unitEpoch)}}
	return tmpl
}

// TestReconcileMachineClaim runs the claim's phase lists from a starting
// state each (docs/architecture.md, "The claim's reconcile"), one
// Reconcile on controller-runtime's fake client with the manager's field
// indexes, the in-memory hypervisor behind the registry and a fake clock,
// and checks the Result, the conditions, the events and the phase it ends
// with, or that the claim is gone. The rows whose claim ends during the
// pass show the end list running in that same pass.
func TestReconcileMachineClaim(t *testing.T) {
	provisioned := metav1.Condition{Type: string(hfv1.MachineClaimProvisionedCondition), Status: metav1.ConditionTrue, Reason: string(hfv1.ReadyReason), LastTransitionTime: metav1.NewTime(unitEpoch)}
	for name, tc := range map[string]struct {
		claim func() *hfv1.MachineClaim
		// objs are the other objects in the API server.
		objs []client.Object
		// listing puts an empty VM listing of the cluster in the registry.
		listing bool
		// setup prepares the hypervisor.
		setup func(t *testing.T, r *Reconciler, hv *fakeprovider.Cluster, claim *hfv1.MachineClaim)
		want  ctrl.Result
		// wantGone: the claim is deleted by the pass.
		wantGone  bool
		wantPhase hfv1.MachineClaimPhase
		// wantConditions are reasons by condition type.
		wantConditions map[hfv1.ConditionType]hfv1.ConditionReason
		wantEvent      string
	}{
		"build list: the template is missing": {
			claim: func() *hfv1.MachineClaim {
				c := unitClaim("runner-1", 0)
				c.Spec.TemplateRef.Name = "debian"
				return &c
			},
			want: ctrl.Result{RequeueAfter: waitForDependency}, wantPhase: hfv1.MachineClaimPending,
			wantConditions: map[hfv1.ConditionType]hfv1.ConditionReason{hfv1.MachineClaimProvisionedCondition: hfv1.TemplateNotFoundReason},
		},
		"build list: the template is not ready": {
			claim: func() *hfv1.MachineClaim {
				c := unitClaim("runner-1", 0)
				c.Spec.TemplateRef.Name = "debian"
				return &c
			},
			objs: []client.Object{func() client.Object { t := readyTemplate(); t.Status.Conditions = nil; return t }(), worldCluster()},
			want: ctrl.Result{RequeueAfter: waitForDependency}, wantPhase: hfv1.MachineClaimPending,
			wantConditions: map[hfv1.ConditionType]hfv1.ConditionReason{hfv1.MachineClaimProvisionedCondition: hfv1.TemplateNotReadyReason},
		},
		"build list: new VMs are paused while the cluster is not connected": {
			claim: func() *hfv1.MachineClaim {
				c := unitClaim("runner-1", 0)
				c.Spec.TemplateRef.Name = "debian"
				return &c
			},
			objs: []client.Object{func() client.Object { t := readyTemplate(); t.Spec.HypervisorClusterRef.Name = "pve-b"; return t }(),
				&hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: "pve-b"}}},
			want: ctrl.Result{RequeueAfter: waitForDependency}, wantPhase: hfv1.MachineClaimPending,
			wantConditions: map[hfv1.ConditionType]hfv1.ConditionReason{hfv1.MachineClaimProvisionedCondition: hfv1.ClusterUnavailableReason},
		},
		"running list: the VM vanished, so the claim ends and goes in the same pass": {
			claim: func() *hfv1.MachineClaim {
				c := placedClaimOn(unitCluster, 1001)
				c.Status.End = nil
				setStandardMetadata(c, unitCluster)
				c.Status.Conditions = []metav1.Condition{provisioned}
				return c
			},
			objs: []client.Object{worldCluster()}, listing: true,
			wantGone: true, wantEvent: "Normal VMDeleted",
		},
		"running list: a running VM is watched, its credential issued and offered to its guest": {
			claim: func() *hfv1.MachineClaim {
				c := placedClaimOn(unitCluster, 1001)
				c.Status.End = nil
				setStandardMetadata(c, unitCluster)
				c.Status.Conditions = []metav1.Condition{provisioned}
				return c
			},
			objs: []client.Object{worldCluster()},
			// No listing yet: nothing says the VM stopped. The running
			// resync is cut short by ensureSecrets' wish to look again:
			// no VM of the fake cluster takes the credential yet.
			want:           ctrl.Result{RequeueAfter: guestRetry},
			wantPhase:      hfv1.MachineClaimBootstrapping,
			wantConditions: map[hfv1.ConditionType]hfv1.ConditionReason{hfv1.MachineClaimProvisionedCondition: hfv1.ReadyReason},
		},
		"end list: an ended claim's VM is destroyed over passes": {
			claim: func() *hfv1.MachineClaim {
				c := placedClaimOn(unitCluster, 1001)
				c.Finalizers = []string{hfv1.MachineClaimFinalizer}
				return c
			},
			objs: []client.Object{worldCluster()},
			setup: func(t *testing.T, r *Reconciler, hv *fakeprovider.Cluster, claim *hfv1.MachineClaim) {
				ownedVM(t, hv, r.Signer, claim, 1001)
			},
			want: ctrl.Result{RequeueAfter: time.Second}, wantPhase: hfv1.MachineClaimTerminating,
			wantConditions: map[hfv1.ConditionType]hfv1.ConditionReason{hfv1.MachineClaimEndingCondition: hfv1.DeletingVMReason},
		},
		"prefix: the pool's failure request fails the claim, the end list keeps it": {
			claim: func() *hfv1.MachineClaim {
				c := unitClaim("runner-1", 0)
				c.Spec.TemplateRef.Name = "debian"
				c.Finalizers = []string{hfv1.MachineClaimFinalizer}
				c.Spec.End = &hfv1.MachineClaimEndRequest{Reason: hfv1.EndFailed, Message: "bootstrap timeout", Fail: true}
				return &c
			},
			wantPhase:      hfv1.MachineClaimFailed,
			wantConditions: map[hfv1.ConditionType]hfv1.ConditionReason{hfv1.MachineClaimEndingCondition: hfv1.EndFailed.ConditionReason()},
		},
		"deletion list: a deleted claim without a VM lets go": {
			claim: func() *hfv1.MachineClaim {
				c := unitClaim("runner-1", 0)
				c.Spec.TemplateRef.Name = "debian"
				c.Finalizers = []string{hfv1.MachineClaimFinalizer}
				c.DeletionTimestamp = &metav1.Time{Time: unitEpoch}
				return &c
			},
			wantGone: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			r, hv, _, rec := serviceWorld(t)
			claim := tc.claim()
			r.CI = &ciDouble{}
			r.Client = claimWorld(t, append([]client.Object{claim.DeepCopy()}, tc.objs...)...)
			if tc.listing {
				r.Registry.SetListing(unitCluster, nil, unitEpoch)
			}
			if tc.setup != nil {
				tc.setup(t, r, hv, claim)
			}
			ctx := context.Background()
			res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(claim)})
			if err != nil {
				t.Fatalf("Reconcile: %v", err)
			}
			events := drainEvents(rec)
			if tc.wantEvent != "" && !hasEvent(events, tc.wantEvent) {
				t.Errorf("events %q, want one %q", events, tc.wantEvent)
			}
			got := &hfv1.MachineClaim{}
			err = r.Client.Get(ctx, client.ObjectKeyFromObject(claim), got)
			if tc.wantGone {
				// Deleted: gone, or held by its finalizer for the
				// deletion list of the next pass.
				if !apierrors.IsNotFound(err) && (err != nil || got.DeletionTimestamp.IsZero()) {
					t.Fatalf("the claim is not deleted (%v): %+v", err, got.Status)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res != tc.want {
				t.Errorf("Result = %+v, want %+v", res, tc.want)
			}
			if got.Status.Phase != tc.wantPhase {
				t.Errorf("phase %q, want %q (conditions %+v)", got.Status.Phase, tc.wantPhase, got.Status.Conditions)
			}
			for typ, reason := range tc.wantConditions {
				if c := hfv1.FindCondition(got.Status.Conditions, typ); c == nil || c.Reason != string(reason) {
					t.Errorf("%s = %+v, want reason %s", typ, c, reason)
				}
			}
		})
	}
}
