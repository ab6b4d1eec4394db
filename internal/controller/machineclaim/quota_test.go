package machineclaim

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/quota"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

func quotaScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := hfv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return scheme
}

// TestPlacedUse: a claim's VM counts what its verified placement record
// says (with its extra disks and devices); a record edited by the tenant
// counts what the template says now, never less.
func TestPlacedUse(t *testing.T) {
	signer := testPlacementSigner(t, 7)
	tmpl := &hfv1.HypervisorMachineTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "big"},
		Spec:       hfv1.HypervisorMachineTemplateSpec{Resources: hfv1.MachineResources{CPU: 8, Memory: resource.MustParse("16Gi"), Disk: ptr.To(resource.MustParse("80Gi"))}},
	}
	r := &Reconciler{Signer: signer, Client: fake.NewClientBuilder().WithScheme(quotaScheme(t)).WithObjects(tmpl).Build()}
	claim := placedClaim("q1")
	claim.Spec.TemplateRef.Name = "big"
	spec := authorizedSpec()
	spec.Hardware = &provider.Hardware{Devices: []string{"gpu"}, ExtraDisks: []provider.Disk{{Bytes: 10 << 30, Storage: "local-lvm"}}}
	RecordPlacement(claim, signer, "pve-a", spec, authorizedDomain)
	got := r.placedUse(context.Background(), claim)
	if got[quota.CPU] != 2 || got[quota.Memory] != 2<<30 || got[quota.Disk] != 50<<30 || got[quota.Devices] != 1 || got[quota.Machines] != 1 {
		t.Fatalf("placed use = %v, want the record's 2 cores, 2Gi, 40Gi+10Gi, 1 device", got)
	}
	// The tenant shrinks its record: it no longer verifies, and the
	// template's current sizes count.
	other := placedClaim("q1")
	other.Spec.TemplateRef.Name = "big"
	small := authorizedSpec()
	small.CPUCores, small.MemoryBytes = 1, 1<<20
	RecordPlacement(other, testPlacementSigner(t, 9), "pve-a", small, authorizedDomain)
	claim.Status.PlacementRecord = other.Status.PlacementRecord
	got = r.placedUse(context.Background(), claim)
	if got[quota.CPU] != 8 || got[quota.Memory] != 16<<30 || got[quota.Disk] != 80<<30 {
		t.Fatalf("use with a forged record = %v, want the template's 8 cores, 16Gi, 80Gi", got)
	}
}

// TestQuotaWakesWaiters: a claim refused for quota waits; the cache
// showing a VM of its namespace on the cluster destroyed wakes it, and it
// is admitted.
func TestQuotaWakesWaiters(t *testing.T) {
	ctx := context.Background()
	placed := placedClaim("a")
	placed.Name = "a"
	waiting := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "b", UID: "uid-b"}}
	kube := fake.NewClientBuilder().WithScheme(quotaScheme(t)).WithObjects(placed, waiting).WithStatusSubresource(placed).Build()
	r := &Reconciler{Client: kube, Signer: testPlacementSigner(t, 7)}
	one := []quota.Rule{{Field: "spec.tenancy[0].limits", Limits: &hfv1.TenantLimits{Machines: ptr.To[int32](1)}}}
	ex, err := r.ledger().Admit(ctx, "pve-a", client.ObjectKeyFromObject(waiting), waiting.UID, one, quota.Use{quota.Machines: 1})
	if err != nil || ex == nil || ex.Field != "spec.tenancy[0].limits.machines" || ex.Usage != 1 {
		t.Fatalf("b admitted with a's VM on the cluster: %v %v", ex, err)
	}
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	destroyed := placed.DeepCopy()
	destroyed.Status.VMRef = nil
	if err := kube.Status().Update(ctx, destroyed); err != nil {
		t.Fatal(err)
	}
	r.quotaHandler().Update(ctx, event.UpdateEvent{ObjectOld: placed, ObjectNew: destroyed}, q)
	if q.Len() != 1 {
		t.Fatalf("%d claims woken, want b", q.Len())
	}
	if req, _ := q.Get(); req.NamespacedName != (k8stypes.NamespacedName{Namespace: "team-a", Name: "b"}) {
		t.Fatalf("woke %v, want team-a/b", req)
	}
	if ex, err := r.ledger().Admit(ctx, "pve-a", client.ObjectKeyFromObject(waiting), waiting.UID, one, quota.Use{quota.Machines: 1}); ex != nil || err != nil {
		t.Fatalf("b refused after a's VM was destroyed: %v %v", ex, err)
	}
}
