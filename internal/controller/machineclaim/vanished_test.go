package machineclaim

import (
	"bytes"
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// vanishedRecorder records what the claim controller hands over.
type vanishedRecorder struct{ got []string }

func (v *vanishedRecorder) Vanished(_ context.Context, cluster string, owner provider.Owner, p provider.Progress) {
	v.got = append(v.got, cluster+" "+owner.UID+" "+string(p.ID)+" "+p.Node)
}

// TestVanishedClaimHandsOverItsVM: a claim's last state, as its DELETED
// event carries it, hands its VM to the sweeper only when the API server
// removed the claim while it carried the finalizer and was never marked
// deleted (kubernetes/kubernetes#77988), and only a VM the claim's status
// records or its reservation names with a signature that verifies for the
// claim's UID; the hand-over waits for a reconcile of the name.
func TestVanishedClaimHandsOverItsVM(t *testing.T) {
	signer, err := ownership.NewSigner("test", bytes.Repeat([]byte{1}, ownership.MinKeyLength))
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	claim := func(uid string, edit func(c *hfv1.MachineClaim)) *hfv1.MachineClaim {
		c := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "c-" + uid, UID: types.UID(uid),
			Finalizers: []string{hfv1.MachineClaimFinalizer}}}
		edit(c)
		return c
	}
	reserved := func(c *hfv1.MachineClaim) {
		Annotate(c, signer, "pve-a", provider.Progress{ID: "proxmox://1201", Node: "pve1"})
	}
	copied := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{UID: "another"}}
	reserved(copied)
	for _, tc := range []struct {
		name  string
		claim *hfv1.MachineClaim
		noted bool
		want  string
	}{
		{"reservation signed for it", claim("u1", reserved), true, "pve-a u1 proxmox://1201 pve1"},
		{"VM in its status", claim("u2", func(c *hfv1.MachineClaim) {
			c.Status.VMRef = hfv1.NewVMReference("pve-b", "proxmox://1300", "pve2")
		}), true, "pve-b u2 proxmox://1300 pve2"},
		{"deleted normally: marked deleted, finalizer removed last", claim("u3", func(c *hfv1.MachineClaim) {
			reserved(c)
			c.DeletionTimestamp = &now
		}), false, ""},
		{"finalizer removed by hand", claim("u4", func(c *hfv1.MachineClaim) {
			reserved(c)
			c.Finalizers = nil
		}), false, ""},
		{"deleted before the finalizer's write", claim("u5", func(c *hfv1.MachineClaim) { c.Finalizers = nil }), false, ""},
		{"reservation copied from another claim", claim("u6", func(c *hfv1.MachineClaim) {
			c.Annotations = copied.Annotations
		}), true, ""},
		{"reservation unreadable", claim("u7", func(c *hfv1.MachineClaim) {
			c.Annotations = map[string]string{hfv1.VMReservationAnnotation: "pve-a/pve1"}
		}), true, ""},
		{"no VM recorded", claim("u8", func(*hfv1.MachineClaim) {}), true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &vanishedRecorder{}
			r := &Reconciler{Signer: signer, Vanished: VanishedClaims{VMs: rec}}
			if noted := r.Vanished.note(tc.claim); noted != tc.noted {
				t.Fatalf("noted %v, want %v", noted, tc.noted)
			}
			if len(rec.got) != 0 {
				t.Fatalf("handed over %v before a reconcile of the name", rec.got)
			}
			r.Vanished.handOver(context.Background(), client.ObjectKeyFromObject(tc.claim), r.Signer, &r.memory)
			r.Vanished.handOver(context.Background(), client.ObjectKeyFromObject(tc.claim), r.Signer, &r.memory)
			want := []string{}
			if tc.want != "" {
				want = append(want, tc.want)
			}
			if len(rec.got) != len(want) || (len(want) == 1 && rec.got[0] != want[0]) {
				t.Fatalf("handed over %q, want %q (once)", rec.got, want)
			}
		})
	}
}

// TestVanishedClaimsHandlerQueuesTheName: the DELETED event of a vanished
// claim queues a reconcile of its name (the hand-over waits for it); a
// tombstone, whose state may be stale, queues nothing and notes nothing.
func TestVanishedClaimsHandlerQueuesTheName(t *testing.T) {
	signer, err := ownership.NewSigner("test", bytes.Repeat([]byte{1}, ownership.MinKeyLength))
	if err != nil {
		t.Fatal(err)
	}
	c := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "v", UID: "u1", Finalizers: []string{hfv1.MachineClaimFinalizer}}}
	Annotate(c, signer, "pve-a", provider.Progress{ID: "proxmox://1201", Node: "pve1"})
	for _, tombstone := range []bool{true, false} {
		rec := &vanishedRecorder{}
		r := &Reconciler{Signer: signer, Vanished: VanishedClaims{VMs: rec}}
		q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
		r.Vanished.handler().Delete(context.Background(), event.DeleteEvent{Object: c, DeleteStateUnknown: tombstone}, q)
		want := 1
		if tombstone {
			want = 0
		}
		if q.Len() != want {
			t.Errorf("tombstone %v: %d requests queued, want %d", tombstone, q.Len(), want)
		}
		r.Vanished.handOver(context.Background(), client.ObjectKeyFromObject(c), r.Signer, &r.memory)
		if len(rec.got) != want {
			t.Errorf("tombstone %v: handed over %v", tombstone, rec.got)
		}
		q.ShutDown()
	}
}
