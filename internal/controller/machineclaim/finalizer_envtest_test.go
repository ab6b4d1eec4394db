package machineclaim

import (
	"context"
	"os"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// apiServer is the real kube-apiserver of the tests that need one (a
// write's optimistic lock); it starts on first use, so the package's unit
// tests run without it.
var apiServer testenv.Lazy

func TestMain(m *testing.M) { os.Exit(apiServer.Main(m)) }

// getClaim reads claim's current version.
func getClaim(ctx context.Context, c client.Client, claim *hfv1.MachineClaim) (*hfv1.MachineClaim, error) {
	out := &hfv1.MachineClaim{}
	err := c.Get(ctx, client.ObjectKeyFromObject(claim), out)
	return out, err
}

// TestRemoveFinalizerUsesOptimisticLock: removing the claim finalizer from
// a stale copy fails with a conflict instead of dropping a finalizer added
// since; from a current copy it removes only its own.
func TestRemoveFinalizerUsesOptimisticLock(t *testing.T) {
	ctx := context.Background()
	env := apiServer.Get(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "finalizer-lock"}}
	if err := env.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, ns) })
	const other = "example.com/keep"
	claim := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "c", Finalizers: []string{hfv1.MachineClaimFinalizer}},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: "none"}},
	}
	if err := env.Client.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		var c hfv1.MachineClaim
		if env.Client.Get(ctx, client.ObjectKeyFromObject(claim), &c) == nil {
			c.Finalizers = nil
			_ = env.Client.Update(ctx, &c)
			_ = env.Client.Delete(ctx, &c)
		}
	})
	stale := claim.DeepCopy()
	current, err := getClaim(ctx, env.Client, claim)
	if err != nil {
		t.Fatal(err)
	}
	current.Finalizers = append(current.Finalizers, other)
	if err := env.Client.Update(ctx, current); err != nil {
		t.Fatal(err)
	}

	r := &Reconciler{Client: env.Client}
	if err := r.removeFinalizer(ctx, r.newClaimScope(stale)); !apierrors.IsConflict(err) {
		t.Fatalf("removeFinalizer with a stale copy: %v, want a conflict", err)
	}
	got, err := getClaim(ctx, env.Client, claim)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Finalizers, []string{hfv1.MachineClaimFinalizer, other}) {
		t.Fatalf("finalizers after the stale removal: %v", got.Finalizers)
	}
	if err := r.removeFinalizer(ctx, r.newClaimScope(got)); err != nil {
		t.Fatalf("removeFinalizer with the current copy: %v", err)
	}
	if got, err = getClaim(ctx, env.Client, claim); err != nil || !slices.Equal(got.Finalizers, []string{other}) {
		t.Fatalf("finalizers after the removal: %v (%v)", got.Finalizers, err)
	}
}
