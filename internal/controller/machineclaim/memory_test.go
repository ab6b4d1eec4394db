package machineclaim

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/cachelag"
)

// memoryWorld is a claim reconciler on a fake API client whose cache is
// "behind" every claim (its last write is far ahead), so that Reconcile
// stops at the stale-cache check and touches nothing but its memory.
func memoryWorld(t *testing.T, claims ...*hfv1.MachineClaim) (*Reconciler, client.Client) {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := hfv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	b := fake.NewClientBuilder().WithScheme(scheme)
	for _, c := range claims {
		b = b.WithObjects(c)
	}
	c := b.Build()
	return &Reconciler{Client: c, Runners: NewRunnerObservations()}, c
}

// aheadOfCache makes r believe it wrote claim uid after anything the
// fake client holds.
func aheadOfCache(r *Reconciler, uid types.UID) {
	r.lag.Wrote(&metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{UID: uid, ResourceVersion: "1099511627776"}})
}

// TestStaleCacheWaits: a reconcile that finds the cache older than the
// controller's last write of the claim waits for it (the requeue backs off
// as internal/cachelag says) and touches nothing.
func TestStaleCacheWaits(t *testing.T) {
	claim := unitClaim("lagging", 0)
	r, c := memoryWorld(t, &claim)
	aheadOfCache(r, claim.UID)
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&claim)}
	for i := range 10 {
		res, err := r.Reconcile(context.Background(), req)
		if err != nil {
			t.Fatalf("reconcile %d: %v", i, err)
		}
		if res.RequeueAfter != cachelag.Wait(i) {
			t.Fatalf("stale read %d: requeue after %s, want %s", i+1, res.RequeueAfter, cachelag.Wait(i))
		}
	}
	var got hfv1.MachineClaim
	if err := c.Get(context.Background(), req.NamespacedName, &got); err != nil || len(got.Finalizers) != 0 || got.Status.Phase != "" {
		t.Fatalf("a stale reconcile wrote the claim: finalizers %v, phase %q (%v)", got.Finalizers, got.Status.Phase, err)
	}
}

// TestGoneClaimsAreForgotten: the per-claim memory (backoff attempts, last
// write, stale waits, runner observation) of a claim is dropped when a
// reconcile finds its name gone, or taken by another claim, even though
// the controller never saw the claim end.
func TestGoneClaimsAreForgotten(t *testing.T) {
	gone := unitClaim("gone", 0)
	kept := unitClaim("kept", 0)
	r, c := memoryWorld(t, &gone, &kept)
	remember := func(cl *hfv1.MachineClaim) {
		r.newClaimScope(cl).backoff()
		aheadOfCache(r, cl.UID)
		r.Runners.Set(cl.UID, RunnerObservation{Present: true})
		if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(cl)}); err != nil {
			t.Fatal(err)
		}
	}
	remember(&gone)
	remember(&kept)
	if !r.memory.remembers(gone.UID) || !r.memory.remembers(kept.UID) || !r.lag.Remembers(gone.UID) || !r.lag.Remembers(kept.UID) {
		t.Fatalf("before: memory remembers gone %v kept %v, lag remembers gone %v kept %v; want all true",
			r.memory.remembers(gone.UID), r.memory.remembers(kept.UID), r.lag.Remembers(gone.UID), r.lag.Remembers(kept.UID))
	}

	// Deleted behind the controller's back (a forced removal of its
	// finalizer, or while the controller was busy elsewhere).
	if err := c.Delete(context.Background(), &gone); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&gone)}); err != nil {
		t.Fatal(err)
	}
	check := func(uid types.UID, want bool) {
		t.Helper()
		a := r.memory.remembers(uid)
		l := r.lag.Remembers(uid)
		_, o := r.Runners.Get(uid)
		if a != want || l != want || o != want {
			t.Errorf("claim %s: memory %v lag %v runner %v, want all %v", uid, a, l, o, want)
		}
	}
	check(gone.UID, false)
	check(kept.UID, true)

	// The name taken by a new claim before the controller saw the old one
	// go.
	if err := c.Delete(context.Background(), &kept); err != nil {
		t.Fatal(err)
	}
	again := unitClaim("kept", 0)
	again.UID, again.ResourceVersion = "uid-kept-2", ""
	if err := c.Create(context.Background(), &again); err != nil {
		t.Fatal(err)
	}
	aheadOfCache(r, again.UID)
	if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&again)}); err != nil {
		t.Fatal(err)
	}
	check(kept.UID, false)
	if n := r.lag.Names(); n != 1 {
		t.Errorf("the lag tracker holds %d names, want 1 (the new claim's)", n)
	}
}
