package patch_test

import (
	"context"
	"os"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/patch"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

var env *testenv.Environment

func TestMain(m *testing.M) { os.Exit(testenv.Run(m, &env)) }

// newClaim creates a MachineClaim to patch.
func newClaim(t *testing.T, name string) *hfv1.MachineClaim {
	t.Helper()
	c := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
	c.Spec.TemplateRef.Name = "tmpl"
	if err := env.Client.Create(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cur := &hfv1.MachineClaim{}
		if env.Client.Get(context.Background(), client.ObjectKeyFromObject(c), cur) == nil {
			cur.Finalizers = nil
			_ = env.Client.Update(context.Background(), cur)
			_ = env.Client.Delete(context.Background(), cur)
		}
	})
	return c
}

func get(t *testing.T, c *hfv1.MachineClaim) *hfv1.MachineClaim {
	t.Helper()
	cur := &hfv1.MachineClaim{}
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(c), cur); err != nil {
		t.Fatal(err)
	}
	return cur
}

func cond(typ, reason string) metav1.Condition {
	return metav1.Condition{Type: typ, Status: metav1.ConditionTrue, Reason: reason, Message: reason, LastTransitionTime: metav1.Now()}
}

// TestPatchWritesOnlyChanges: nothing changed, nothing written; metadata
// and status each land, and the caller's in-memory status survives the
// metadata patch.
func TestPatchWritesOnlyChanges(t *testing.T) {
	ctx := context.Background()
	c := newClaim(t, "only-changes")
	h := patch.NewHelper(env.Client, c)
	rv := c.ResourceVersion
	if err := h.Patch(ctx, c); err != nil || c.ResourceVersion != rv {
		t.Fatalf("unchanged object: err %v, resourceVersion %s -> %s (a write)", err, rv, c.ResourceVersion)
	}

	controllerutil.AddFinalizer(c, hfv1.MachineClaimFinalizer)
	c.Status.TemplateHash = "abc"
	meta.SetStatusCondition(&c.Status.Conditions, cond(string(hfv1.MachineClaimProvisionedCondition), string(hfv1.QueuedReason)))
	if err := h.PatchMetadata(ctx, c); err != nil {
		t.Fatal(err)
	}
	if c.Status.TemplateHash != "abc" || len(c.Status.Conditions) != 1 {
		t.Fatalf("the metadata patch overwrote the in-memory status: %+v", c.Status)
	}
	if got := get(t, c); !controllerutil.ContainsFinalizer(got, hfv1.MachineClaimFinalizer) || got.Status.TemplateHash != "" {
		t.Fatalf("after the metadata patch: finalizers %v, status %+v", got.Finalizers, got.Status)
	}
	if err := h.Patch(ctx, c); err != nil {
		t.Fatal(err)
	}
	got := get(t, c)
	if got.Status.TemplateHash != "abc" || meta.FindStatusCondition(got.Status.Conditions, string(hfv1.MachineClaimProvisionedCondition)) == nil {
		t.Fatalf("status not written: %+v", got.Status)
	}
	rv = got.ResourceVersion
	if err := h.Patch(ctx, c); err != nil || get(t, c).ResourceVersion != rv {
		t.Fatalf("a second Patch without changes wrote again (err %v)", err)
	}
	// A field removed in memory is removed on the server.
	c.Status.TemplateHash = ""
	if err := h.Patch(ctx, c); err != nil || get(t, c).Status.TemplateHash != "" {
		t.Fatalf("removal not written (err %v): %+v", err, get(t, c).Status)
	}
}

// TestOptimisticLock: a metadata patch from a stale copy fails with a
// conflict instead of overwriting the finalizer list.
func TestOptimisticLock(t *testing.T) {
	ctx := context.Background()
	c := newClaim(t, "lock")
	stale := c.DeepCopy()
	h := patch.NewHelper(env.Client, stale, patch.WithOptimisticLock())

	fresh := get(t, c)
	controllerutil.AddFinalizer(fresh, "example.com/someone-else")
	if err := env.Client.Update(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	controllerutil.AddFinalizer(stale, hfv1.MachineClaimFinalizer)
	err := h.PatchMetadata(ctx, stale)
	if !apierrors.IsConflict(err) {
		t.Fatalf("stale metadata patch: %v, want a conflict", err)
	}
	if got := get(t, c); !controllerutil.ContainsFinalizer(got, "example.com/someone-else") {
		t.Fatalf("the other finalizer was dropped: %v", got.Finalizers)
	}

	// Without the lock the same write replaces the list: why claims lock.
	unlocked := c.DeepCopy()
	hu := patch.NewHelper(env.Client, unlocked)
	controllerutil.AddFinalizer(unlocked, hfv1.MachineClaimFinalizer)
	if err := hu.PatchMetadata(ctx, unlocked); err != nil {
		t.Fatal(err)
	}
	if got := get(t, c); controllerutil.ContainsFinalizer(got, "example.com/someone-else") {
		t.Fatalf("an unlocked merge patch kept the other finalizer (%v): the lock test above proves nothing", got.Finalizers)
	}
}

// TestStatusLock: a locked status patch from a stale copy (a claim's VM
// reservation written from a cache that missed a newer one) fails with a
// conflict and leaves the newer status; the same patch unlocked overwrites
// it, which is why the reservation's write is locked.
func TestStatusLock(t *testing.T) {
	ctx := context.Background()
	c := newClaim(t, "status-lock")
	stale := c.DeepCopy()
	h := patch.NewHelper(env.Client, stale)

	fresh := get(t, c)
	fresh.Status.VMRef = hfv1.NewVMReference("pve", "proxmox://1000", "pve1")
	if err := env.Client.Status().Update(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	stale.Status.VMRef = hfv1.NewVMReference("pve", "proxmox://2000", "pve1")
	if err := h.PatchStatusLocked(ctx, stale); !apierrors.IsConflict(err) {
		t.Fatalf("stale locked status patch: %v, want a conflict", err)
	}
	if got := get(t, c); got.Status.VMRef == nil || got.Status.VMRef.ProviderID != "proxmox://1000" {
		t.Fatalf("the newer VM reference was overwritten: %+v", got.Status.VMRef)
	}

	unlocked := c.DeepCopy()
	hu := patch.NewHelper(env.Client, unlocked)
	unlocked.Status.VMRef = hfv1.NewVMReference("pve", "proxmox://2000", "pve1")
	if err := hu.PatchStatus(ctx, unlocked); err != nil {
		t.Fatal(err)
	}
	if got := get(t, c); got.Status.VMRef.ProviderID != "proxmox://2000" {
		t.Fatalf("an unlocked status patch kept %+v: the lock test above proves nothing", got.Status.VMRef)
	}
}

// TestOwnedConditions: two writers read the same version and each changes
// the condition it owns; both changes survive, and neither writer's stale
// copy of the other's condition is written back.
func TestOwnedConditions(t *testing.T) {
	ctx := context.Background()
	c := newClaim(t, "owned")
	seed := get(t, c)
	meta.SetStatusCondition(&seed.Status.Conditions, cond(string(hfv1.MachineClaimBootstrappedCondition), "Old"))
	meta.SetStatusCondition(&seed.Status.Conditions, cond(string(hfv1.MachineClaimStuckCondition), "Old"))
	if err := env.Client.Status().Update(ctx, seed); err != nil {
		t.Fatal(err)
	}

	a, b := get(t, c), get(t, c)
	ha := patch.NewHelper(env.Client, a, patch.WithOwnedConditions(string(hfv1.MachineClaimBootstrappedCondition)))
	hb := patch.NewHelper(env.Client, b, patch.WithOwnedConditions(string(hfv1.MachineClaimStuckCondition)))
	meta.SetStatusCondition(&a.Status.Conditions, cond(string(hfv1.MachineClaimBootstrappedCondition), "FromA"))
	a.Status.TemplateHash = "from-a"
	meta.SetStatusCondition(&b.Status.Conditions, cond(string(hfv1.MachineClaimStuckCondition), "FromB"))
	meta.RemoveStatusCondition(&b.Status.Conditions, string(hfv1.MachineClaimBootstrappedCondition)) // not B's: ignored
	if err := ha.Patch(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := hb.Patch(ctx, b); err != nil {
		t.Fatalf("second writer: %v", err)
	}
	got := get(t, c)
	boot := meta.FindStatusCondition(got.Status.Conditions, string(hfv1.MachineClaimBootstrappedCondition))
	stuck := meta.FindStatusCondition(got.Status.Conditions, string(hfv1.MachineClaimStuckCondition))
	if boot == nil || boot.Reason != "FromA" || stuck == nil || stuck.Reason != "FromB" || got.Status.TemplateHash != "from-a" {
		t.Fatalf("conditions %+v, templateHash %q; want Bootstrapped FromA, Stuck FromB, from-a", got.Status.Conditions, got.Status.TemplateHash)
	}

	// The same race without owned conditions loses A's change: the case
	// the option exists for.
	a2, b2 := get(t, c), get(t, c)
	ha2, hb2 := patch.NewHelper(env.Client, a2), patch.NewHelper(env.Client, b2)
	meta.SetStatusCondition(&a2.Status.Conditions, cond(string(hfv1.MachineClaimBootstrappedCondition), "FromA2"))
	meta.SetStatusCondition(&b2.Status.Conditions, cond(string(hfv1.MachineClaimStuckCondition), "FromB2"))
	if err := ha2.Patch(ctx, a2); err != nil {
		t.Fatal(err)
	}
	if err := hb2.Patch(ctx, b2); err != nil {
		t.Fatal(err)
	}
	if boot := meta.FindStatusCondition(get(t, c).Status.Conditions, string(hfv1.MachineClaimBootstrappedCondition)); boot.Reason == "FromA2" {
		t.Fatal("without owned conditions the first writer's change survived; the owned-conditions assertion above proves nothing")
	}
}

// TestPatchGone: writing an object that was deleted meanwhile is not an
// error (the reconcile of a gone object ends quietly).
func TestPatchGone(t *testing.T) {
	ctx := context.Background()
	c := newClaim(t, "gone")
	h := patch.NewHelper(env.Client, c, patch.WithOwnedConditions(string(hfv1.MachineClaimStuckCondition)))
	if err := env.Client.Delete(ctx, get(t, c)); err != nil {
		t.Fatal(err)
	}
	c.Labels = map[string]string{"a": "b"}
	meta.SetStatusCondition(&c.Status.Conditions, cond(string(hfv1.MachineClaimStuckCondition), "X"))
	if h.Gone() {
		t.Fatal("Gone before any write")
	}
	if err := h.Patch(ctx, c); err != nil {
		t.Fatalf("patching a deleted object: %v", err)
	}
	if !h.Gone() {
		t.Fatal("a write that found the object deleted does not report it Gone")
	}
}

// TestStatusMovesOldSpellings: a claim whose status an earlier operator
// wrote with the ...Id keys (vmId, runnerId, jobId, spiffeId, nodeId,
// entryId, keyId) is read into the Go fields, and the next status write,
// whatever it changes, stores the ...ID keys only with the same values: the
// claim keeps its VM, runner and job. A value cleared in memory is cleared
// on the server, not read back from the old key.
func TestStatusMovesOldSpellings(t *testing.T) {
	ctx := context.Background()
	c := newClaim(t, "old-spellings")
	stored := &unstructured.Unstructured{}
	stored.SetGroupVersionKind(hfv1.GroupVersion.WithKind("MachineClaim"))
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(c), stored); err != nil {
		t.Fatal(err)
	}
	stored.Object["status"] = map[string]any{
		"vmRef":     map[string]any{"hypervisorCluster": "pve", "providerID": "proxmox://1234", "vmId": int64(1234)},
		"bootstrap": map[string]any{"runnerName": "r", "runnerId": int64(7), "jobId": int64(42), "spiffeId": "spiffe://td/vm/a"},
		"identity": map[string]any{"spiffeId": "spiffe://td/vm/a", "nodeId": "spiffe://td/hyperfleet/node/a",
			"entryId": "hyperfleet.u", "keyId": int64(2)},
	}
	if err := env.Client.Status().Update(ctx, stored); err != nil {
		t.Fatalf("writing the status as an earlier operator did: %v", err)
	}
	c = get(t, c)
	st := c.Status
	if st.VMRef.VMID != 1234 || st.Bootstrap.RunnerID != 7 || st.Bootstrap.JobID != 42 || st.Identity.EntryID != "hyperfleet.u" ||
		st.Identity.KeyID == nil || *st.Identity.KeyID != 2 {
		t.Fatalf("the old keys read as vmRef %+v, bootstrap %+v, identity %+v", st.VMRef, st.Bootstrap, st.Identity)
	}

	// A pass that changes nothing else still moves the keys.
	h := patch.NewHelper(env.Client, c)
	if err := h.PatchStatus(ctx, c); err != nil {
		t.Fatal(err)
	}
	raw := func() map[string]any {
		u := stored.DeepCopy()
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(c), u); err != nil {
			t.Fatal(err)
		}
		s, _ := u.Object["status"].(map[string]any)
		return s
	}
	want := map[string]map[string]any{
		"vmRef":     {"vmID": int64(1234)},
		"bootstrap": {"runnerID": int64(7), "jobID": int64(42), "spiffeID": "spiffe://td/vm/a"},
		"identity":  {"spiffeID": "spiffe://td/vm/a", "nodeID": "spiffe://td/hyperfleet/node/a", "entryID": "hyperfleet.u", "keyID": int64(2)},
	}
	got := raw()
	for obj, keys := range want {
		m, _ := got[obj].(map[string]any)
		for k, v := range keys {
			if m[k] != v {
				t.Errorf("status.%s.%s = %v, want %v (status %v)", obj, k, m[k], v, got)
			}
			old := strings.TrimSuffix(k, "ID") + "Id"
			if _, ok := m[old]; ok {
				t.Errorf("status.%s still holds %s: %v", obj, old, m)
			}
		}
	}
	rv := get(t, c).ResourceVersion
	if err := h.PatchStatus(ctx, c); err != nil || get(t, c).ResourceVersion != rv {
		t.Fatalf("a second status write without changes wrote again (err %v)", err)
	}

	// Read with the old key again, the job cleared in memory: cleared.
	stored.Object["status"] = map[string]any{"bootstrap": map[string]any{"runnerName": "r", "jobId": int64(42)}}
	u := stored.DeepCopy()
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(c), u); err != nil {
		t.Fatal(err)
	}
	u.Object["status"] = stored.Object["status"]
	if err := env.Client.Status().Update(ctx, u); err != nil {
		t.Fatal(err)
	}
	c = get(t, c)
	h = patch.NewHelper(env.Client, c)
	c.Status.Bootstrap.JobID = 0
	if err := h.PatchStatus(ctx, c); err != nil {
		t.Fatal(err)
	}
	if b, _ := raw()["bootstrap"].(map[string]any); b["jobId"] != nil || b["jobID"] != nil || get(t, c).Status.Bootstrap.JobID != 0 {
		t.Errorf("a job cleared in memory is stored as %v", b)
	}
}
