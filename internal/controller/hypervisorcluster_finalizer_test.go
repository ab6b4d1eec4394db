package controller

import (
	"context"
	"slices"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
)

// TestClusterFinalizerRemovalUsesOptimisticLock: a HypervisorCluster read
// before someone added another finalizer is not allowed to drop it when
// its own finalizer goes: the removal gets a conflict.
func TestClusterFinalizerRemovalUsesOptimisticLock(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	if err := hfv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	cluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: "pve", Finalizers: []string{hfv1.HypervisorClusterFinalizer}}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(cluster).
		WithIndex(&hfv1.MachineClaim{}, fieldindex.ClaimCluster, func(client.Object) []string { return nil }).Build()
	stale := &hfv1.HypervisorCluster{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(cluster), stale); err != nil {
		t.Fatal(err)
	}
	current := stale.DeepCopy()
	current.Finalizers = append(current.Finalizers, "example.com/keep")
	if err := c.Update(ctx, current); err != nil {
		t.Fatal(err)
	}
	r := &HypervisorClusterReconciler{Client: c, Registry: hypervisors.NewRegistry()}
	if _, err := r.holdWhileUsed(ctx, r.newClusterScope(stale)); !apierrors.IsConflict(err) {
		t.Fatalf("finalizer removal from a stale copy: %v, want a conflict", err)
	}
	got := &hfv1.HypervisorCluster{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(cluster), got); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Finalizers, []string{hfv1.HypervisorClusterFinalizer, "example.com/keep"}) {
		t.Fatalf("finalizers after the stale removal: %v", got.Finalizers)
	}
	if _, err := r.holdWhileUsed(ctx, r.newClusterScope(got)); err != nil {
		t.Fatalf("finalizer removal from the current copy: %v", err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(cluster), got); err != nil || !slices.Equal(got.Finalizers, []string{"example.com/keep"}) {
		t.Fatalf("finalizers after the removal: %v (%v)", got.Finalizers, err)
	}
}
