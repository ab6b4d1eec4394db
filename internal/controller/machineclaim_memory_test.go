package controller

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// memoryWorld is a claim reconciler on a fake API client whose cache is
// "behind" every claim (its last write is far ahead), so that Reconcile
// stops at the stale-cache check and touches nothing but its memory.
func memoryWorld(t *testing.T, claims ...*hfv1.MachineClaim) (*MachineClaimReconciler, client.Client) {
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
	return &MachineClaimReconciler{Client: c, Runners: NewRunnerObservations()}, c
}

// aheadOfCache makes r believe it wrote claim uid after anything the
// fake client holds.
func aheadOfCache(r *MachineClaimReconciler, uid types.UID) { r.written.Store(uid, uint64(1)<<40) }

func mapLen(m interface{ Range(func(k, v any) bool) }) int {
	n := 0
	m.Range(func(any, any) bool { n++; return true })
	return n
}

// TestStaleCacheBacksOff: while the cache shows a claim older than the
// controller's last write, the requeue doubles from 50 ms to 5 s; once the
// cache caught up, the next lag starts at 50 ms again.
func TestStaleCacheBacksOff(t *testing.T) {
	claim := unitClaim("lagging", 0)
	r, _ := memoryWorld(t, &claim)
	aheadOfCache(r, claim.UID)
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&claim)}
	want := []time.Duration{50, 100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000}
	for i, w := range want {
		res, err := r.Reconcile(context.Background(), req)
		if err != nil {
			t.Fatalf("reconcile %d: %v", i, err)
		}
		if res.RequeueAfter != w*time.Millisecond {
			t.Fatalf("stale read %d: requeue after %s, want %s", i+1, res.RequeueAfter, w*time.Millisecond)
		}
	}
	// The cache caught up (here: the controller's record says so).
	r.written.Store(claim.UID, uint64(0))
	if _, stale := r.waitForCache(context.Background(), &claim); stale {
		t.Fatal("a fresh cache is called stale")
	}
	aheadOfCache(r, claim.UID)
	if res, _ := r.waitForCache(context.Background(), &claim); res.RequeueAfter != staleCacheFirstWait {
		t.Errorf("first wait of a new lag: %s, want %s", res.RequeueAfter, staleCacheFirstWait)
	}
	if got := staleCacheWait(1 << 20); got != staleCacheMaxWait {
		t.Errorf("staleCacheWait after very many waits: %s, want %s", got, staleCacheMaxWait)
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
		r.backoff(cl)
		aheadOfCache(r, cl.UID)
		r.Runners.Set(cl.UID, RunnerObservation{Present: true})
		if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(cl)}); err != nil {
			t.Fatal(err)
		}
	}
	remember(&gone)
	remember(&kept)
	for name, m := range map[string]interface{ Range(func(k, v any) bool) }{"attempts": &r.attempts, "written": &r.written, "staleWaits": &r.staleWaits} {
		if n := mapLen(m); n != 2 {
			t.Fatalf("%s holds %d entries before, want 2", name, n)
		}
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
		_, a := r.attempts.Load(uid)
		_, w := r.written.Load(uid)
		_, s := r.staleWaits.Load(uid)
		_, o := r.Runners.Get(uid)
		if a != want || w != want || s != want || o != want {
			t.Errorf("claim %s: attempts %v written %v staleWaits %v runner %v, want all %v", uid, a, w, s, o, want)
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
	if n := mapLen(&r.uids); n != 1 {
		t.Errorf("uids holds %d names, want 1 (the new claim's)", n)
	}
}
