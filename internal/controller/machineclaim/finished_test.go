package machineclaim

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// finishedClaim is a claim of namespace ns as finish leaves it: labelled
// finished, its finalizer removed.
func finishedClaim(ns, name string) *hfv1.MachineClaim {
	c := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	markFinished(c)
	return c
}

// TestFinishedClaimsGoInOneDeletion: claims that finish while a collection
// deletion of their namespace's finished claims is on its way are left to
// one more deletion, sent by the caller of the running one once it
// returns: ten claims finishing together cost two DELETE requests, not
// ten, and every one of them is gone when the first caller returns. Each
// caller returns without error.
//
// Mutation: sending a deletion per caller (no running map in
// deleteFinished) fails it (ten requests); returning from the running
// deletion without the follow-up (again ignored) leaves the claims
// labelled after the first request read the namespace (here: all but the
// first caller's, since the first request read the namespace before the
// others finished).
func TestFinishedClaimsGoInOneDeletion(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := hfv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	const n = 10
	var requests atomic.Int32
	sent := make(chan struct{})
	arrived := make(chan struct{}, n)
	release := make(chan struct{})
	kube := fake.NewClientBuilder().WithScheme(scheme).WithInterceptorFuncs(interceptor.Funcs{
		DeleteAllOf: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteAllOfOption) error {
			if requests.Add(1) > 1 {
				return c.DeleteAllOf(ctx, obj, opts...)
			}
			// The first request reads the namespace's finished claims as
			// it is sent, and deletes what it read only once the other
			// claims finished and their callers returned: a request on
			// its way when they finish.
			var read hfv1.MachineClaimList
			if err := c.List(ctx, &read, client.InNamespace("ci"), client.MatchingLabels{hfv1.FinishedLabel: hfv1.FinishedLabelValue}); err != nil {
				return err
			}
			close(sent)
			<-release
			for i := range read.Items {
				if err := c.Delete(ctx, &read.Items[i]); err != nil {
					return err
				}
			}
			return nil
		},
	}).Build()
	r := &Reconciler{Client: kube}
	ctx := context.Background()
	create := func(i int) {
		if err := kube.Create(ctx, finishedClaim("ci", fmt.Sprintf("claim-%d", i))); err != nil {
			t.Error(err)
		}
	}
	create(0)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	wg.Add(1)
	go func() {
		defer wg.Done()
		errs <- r.deleteFinished(ctx, "ci")
	}()
	<-sent
	for i := 1; i < n; i++ {
		create(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- r.deleteFinished(ctx, "ci")
			arrived <- struct{}{}
		}()
	}
	for i := 1; i < n; i++ {
		<-arrived
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a caller of deleteFinished: %v", err)
		}
	}
	if got := requests.Load(); got != 2 {
		t.Errorf("%d claims finishing together sent %d collection deletions, want 2 (the one on its way and one after it)", n, got)
	}
	var left hfv1.MachineClaimList
	if err := kube.List(ctx, &left); err != nil {
		t.Fatal(err)
	}
	if len(left.Items) != 0 {
		t.Errorf("%d finished claims left after the deletions returned", len(left.Items))
	}
}

// TestFinishedLabelDeletesNothingByItself: a claim that still carries its
// finalizer, labelled finished by someone else, is only marked for
// deletion by the collection deletion: its deletion pass then tears it
// down as any deleted claim's. A finished claim whose deletion was lost (a
// restart between the label and the deletion) goes with its next
// reconcile.
func TestFinishedLabelDeletesNothingByItself(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := hfv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	live := finishedClaim("ci", "live")
	live.Finalizers = []string{hfv1.MachineClaimFinalizer}
	lost := finishedClaim("ci", "lost")
	kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(live, lost).Build()
	r := &Reconciler{Client: kube}
	ctx := context.Background()
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(lost)}); err != nil {
		t.Fatal(err)
	}
	if err := kube.Get(ctx, client.ObjectKeyFromObject(lost), &hfv1.MachineClaim{}); !apierrors.IsNotFound(err) {
		t.Errorf("a finished claim whose deletion was lost, after its reconcile: %v, want NotFound", err)
	}
	got := &hfv1.MachineClaim{}
	if err := kube.Get(ctx, client.ObjectKeyFromObject(live), got); err != nil {
		t.Fatalf("a labelled claim with its finalizer: %v, want it kept until its deletion pass releases it", err)
	}
	if got.DeletionTimestamp.IsZero() || len(got.Finalizers) != 1 {
		t.Errorf("a labelled claim with its finalizer: deletionTimestamp %v, finalizers %v; want marked for deletion, finalizer kept", got.DeletionTimestamp, got.Finalizers)
	}
}
