package controller

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
)

// TestCreateClaimsInParallel: a pass that creates several claims sends
// them together, not one round trip after the other (the churn benchmark
// measured the pool's passes at up to 2 s while replacing claims one by
// one), counts only those that were created, and names every failure.
func TestCreateClaimsInParallel(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := hfv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	pool := &hfv1.RunnerPool{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "runners", UID: "pool-uid"},
		Spec: hfv1.RunnerPoolSpec{TemplateRef: hfv1.ObjectName{Name: "debian"}}}
	const n = 5
	var (
		mu       sync.Mutex
		inFlight int
		most     int
		calls    int
	)
	// Every create waits until all n are in flight (or a second passed):
	// one after the other, the pass would take n seconds.
	all := make(chan struct{})
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pool).
		WithInterceptorFuncs(interceptor.Funcs{
			Create: func(ctx context.Context, cl client.WithWatch, o client.Object, opts ...client.CreateOption) error {
				mu.Lock()
				calls++
				inFlight++
				most = max(most, inFlight)
				nth := calls
				if inFlight == n {
					close(all)
				}
				mu.Unlock()
				select {
				case <-all:
				case <-time.After(time.Second):
				}
				mu.Lock()
				inFlight--
				mu.Unlock()
				if nth == 3 {
					return errors.New("admission webhook refused it")
				}
				// The fake client does not generate names.
				o.SetName(o.GetGenerateName() + strings.Repeat("x", nth))
				return cl.Create(ctx, o, opts...)
			},
		}).Build()
	r := &RunnerPoolReconciler{Client: c, Clock: clocktesting.NewFakeClock(unitEpoch)}
	v := &poolScope{pool: pool, now: unitEpoch, removed: map[scaling.Reason]int{}}

	start := time.Now()
	err := r.createClaims(context.Background(), v, n, false)
	if took := time.Since(start); most != n {
		t.Errorf("at most %d creates were in flight at once (the pass took %s), want all %d", most, took, n)
	}
	if err == nil || !strings.Contains(err.Error(), "admission webhook refused it") || !strings.Contains(err.Error(), "RunnerPool runners") {
		t.Errorf("error %v, want the refused create named", err)
	}
	if v.created != n-1 {
		t.Errorf("created %d, want %d (the refused one does not count)", v.created, n-1)
	}
	var list hfv1.MachineClaimList
	if err := c.List(context.Background(), &list, client.InNamespace("team")); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != n-1 {
		t.Fatalf("%d claims exist, want %d", len(list.Items), n-1)
	}
	for _, claim := range list.Items {
		if !metav1.IsControlledBy(&claim, pool) || claim.Spec.RunnerPoolRef == nil || claim.Spec.RunnerPoolRef.Name != "runners" ||
			claim.Labels[hfv1.RunnerPoolLabel] != "runners" || claim.Spec.TemplateRef.Name != "debian" {
			t.Errorf("claim %s: %+v", claim.Name, claim)
		}
	}
	// The pool waits for the created claims in its cache, not the refused one.
	key := types.NamespacedName{Namespace: "team", Name: "runners"}
	if r.expect.Satisfied(key, r.expect.Mark(), nil, unitEpoch) {
		t.Error("the pool's expectations do not wait for the claims it created")
	}
	if !r.expect.Satisfied(key, r.expect.Mark(), list.Items, unitEpoch) {
		t.Error("the pool's expectations wait for more than the claims it created")
	}
	if err := r.createClaims(context.Background(), v, 0, false); err != nil {
		t.Errorf("creating no claims: %v", err)
	}
}
