package machineclaim

import (
	"bytes"
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testobjects"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
)

func reservationSigner(t *testing.T, keyByte byte) *ownership.Signer {
	t.Helper()
	s, err := ownership.NewSigner("test", bytes.Repeat([]byte{keyByte}, ownership.MinKeyLength))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// reservationWorld is a template in namespace "team" on cluster "pve-a"
// (VM ids 1000-1999, nodes pve1 and pve2, admitting namespaces labelled
// tenant=yes) as a fake API server holds them.
func reservationWorld(t *testing.T, nsLabels map[string]string) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := hfv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	cluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: "pve-a"}}
	cluster.Spec.Nodes = []string{"pve1", "pve2"}
	cluster.Spec.Proxmox = &hfv1.ProxmoxClusterSettings{VMIDRange: &hfv1.VMIDRange{Start: 1000, End: 1999}}
	cluster.Spec.AllowedNamespaces = &metav1.LabelSelector{MatchLabels: map[string]string{"tenant": "yes"}}
	other := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: "pve-b"}}
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Name: "tmpl", Namespace: "team"}}
	tmpl.Spec.HypervisorClusterRef.Name = "pve-a"
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team", Labels: nsLabels}}
	return fake.NewClientBuilder().WithScheme(scheme).WithObjects(cluster, other, tmpl, ns).Build()
}

// TestRestoreReservation: a reservation stands in for status.vmRef only
// while a claim has not recorded a VM and is still being provisioned, and
// only when its signature verifies for the claim and placement could have
// chosen the VM it names; every forgery is refused with an event.
func TestRestoreReservation(t *testing.T) {
	signer := reservationSigner(t, 1)
	sign := func(uid, cluster, node string, vmid int) string {
		return signer.SignReservation(ownership.Reservation{ClaimUID: uid, Cluster: cluster, Node: node, VMID: vmid})
	}
	good := "pve-a/pve1/1100/" + sign("uid-1", "pve-a", "pve1", 1100)
	want := &hfv1.VMReference{HypervisorCluster: "pve-a", Node: "pve1", VMID: 1100}
	recorded := &hfv1.VMReference{HypervisorCluster: "pve-a", Node: "pve2", VMID: 1007}
	admitted := map[string]string{"tenant": "yes"}
	for _, tc := range []struct {
		name       string
		phase      hfv1.MachineClaimPhase
		annotation string
		vmRef      *hfv1.VMReference
		nsLabels   map[string]string
		want       *hfv1.VMReference
		refused    string // part of the refusal event, "" for none
	}{
		{name: "new claim", annotation: good, nsLabels: admitted, want: want},
		{name: "pending", phase: hfv1.MachineClaimPending, annotation: good, nsLabels: admitted, want: want},
		{name: "provisioning", phase: hfv1.MachineClaimProvisioning, annotation: good, nsLabels: admitted, want: want},
		{name: "status already names a VM", phase: hfv1.MachineClaimProvisioning, annotation: good, vmRef: recorded, nsLabels: admitted, want: recorded},
		{name: "VM destroyed at the end", phase: hfv1.MachineClaimTerminating, annotation: good, nsLabels: admitted},
		{name: "finished", phase: hfv1.MachineClaimFinished, annotation: good, nsLabels: admitted},
		{name: "failed", phase: hfv1.MachineClaimFailed, annotation: good, nsLabels: admitted},
		{name: "no reservation", phase: hfv1.MachineClaimPending, nsLabels: admitted},
		{name: "unreadable", phase: hfv1.MachineClaimPending, annotation: "garbage", nsLabels: admitted, refused: "is not"},
		{name: "unsigned (the old format)", annotation: "pve-a/pve1/1100", nsLabels: admitted, refused: "is not"},
		{name: "forged signature", annotation: "pve-a/pve1/1100/v1.AAAA", nsLabels: admitted, refused: "signature"},
		{name: "copied from another claim", annotation: "pve-a/pve1/1100/" + sign("uid-2", "pve-a", "pve1", 1100), nsLabels: admitted, refused: "signature"},
		{name: "VM id edited", annotation: "pve-a/pve1/1101/" + sign("uid-1", "pve-a", "pve1", 1100), nsLabels: admitted, refused: "signature"},
		{name: "signed by another install", annotation: "pve-a/pve1/1100/" + reservationSigner(t, 2).SignReservation(ownership.Reservation{ClaimUID: "uid-1", Cluster: "pve-a", Node: "pve1", VMID: 1100}), nsLabels: admitted, refused: "signature"},
		{name: "namespace not admitted", annotation: good, nsLabels: map[string]string{"tenant": "no"}, refused: "does not admit namespace team"},
		{name: "not the template's cluster", annotation: "pve-b/pve1/1100/" + sign("uid-1", "pve-b", "pve1", 1100), nsLabels: admitted, refused: "template tmpl uses pve-a"},
		{name: "VM id outside the range", annotation: "pve-a/pve1/4242/" + sign("uid-1", "pve-a", "pve1", 4242), nsLabels: admitted, refused: "outside HypervisorCluster pve-a's vmidRange 1000-1999"},
		{name: "node not allowed", annotation: "pve-a/pve9/1100/" + sign("uid-1", "pve-a", "pve9", 1100), nsLabels: admitted, refused: "node pve9 is not in"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			events := record.NewFakeRecorder(10)
			r := &Reconciler{Client: reservationWorld(t, tc.nsLabels), Signer: signer, Recorder: events}
			claim := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "team", UID: types.UID("uid-1")}}
			claim.Spec.TemplateRef.Name = "tmpl"
			claim.Status.Phase, claim.Status.VMRef, claim.Status.End = tc.phase, tc.vmRef, testobjects.EndOf(tc.phase)
			if tc.annotation != "" {
				claim.Annotations = map[string]string{hfv1.VMReservationAnnotation: tc.annotation}
			}
			if err := r.restoreReservedVM(context.Background(), &claimScope{claim: claim}); err != nil {
				t.Fatal(err)
			}
			switch got := claim.Status.VMRef; {
			case tc.want == nil && got != nil:
				t.Fatalf("restored %+v, want no VM", *got)
			case tc.want != nil && (got == nil || *got != *tc.want):
				t.Fatalf("got %+v, want %+v", got, *tc.want)
			}
			select {
			case e := <-events.Events:
				if tc.refused == "" || !strings.Contains(e, string(hfv1.ReservationRejectedReason)) || !strings.Contains(e, tc.refused) {
					t.Fatalf("event %q, want a %s event containing %q", e, hfv1.ReservationRejectedReason, tc.refused)
				}
			default:
				if tc.refused != "" {
					t.Fatalf("no event, want a %s event containing %q", hfv1.ReservationRejectedReason, tc.refused)
				}
			}
		})
	}
}

// TestRestoreReservationWithoutSigner: an operator without a key trusts no
// reservation at all.
func TestRestoreReservationWithoutSigner(t *testing.T) {
	good := "pve-a/pve1/1100/" + reservationSigner(t, 1).SignReservation(ownership.Reservation{ClaimUID: "uid-1", Cluster: "pve-a", Node: "pve1", VMID: 1100})
	r := &Reconciler{Client: reservationWorld(t, map[string]string{"tenant": "yes"}), Recorder: record.NewFakeRecorder(10)}
	claim := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "team", UID: "uid-1", Annotations: map[string]string{hfv1.VMReservationAnnotation: good}}}
	claim.Spec.TemplateRef.Name = "tmpl"
	if err := r.restoreReservedVM(context.Background(), &claimScope{claim: claim}); err != nil || claim.Status.VMRef != nil {
		t.Fatalf("restored %+v (err %v) without a signer", claim.Status.VMRef, err)
	}
}

// TestClaimRechecksTenancy: a claim is placed only while its cluster still
// allows its template in its namespace, even when the template's own
// validation (Ready) predates a narrower allow-list.
func TestClaimRechecksTenancy(t *testing.T) {
	ns := map[string]string{"tenant": "yes"}
	for _, tc := range []struct {
		name   string
		bridge string
		want   string
	}{
		{name: "allowed bridge", bridge: "vmbr0"},
		{name: "bridge not allowed since the template was validated", bridge: "vmbr9", want: string(hfv1.NotAllowedByClusterReason)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := reservationWorld(t, ns)
			ctx := context.Background()
			cluster := &hfv1.HypervisorCluster{}
			if err := c.Get(ctx, client.ObjectKey{Name: "pve-a"}, cluster); err != nil {
				t.Fatal(err)
			}
			cluster.Spec.DefaultBridge = "vmbr0"
			cluster.Spec.Tenancy = []hfv1.TenancyRule{{
				NamespaceSelector: metav1.LabelSelector{MatchLabels: ns},
				Templates:         []hfv1.AllowedTemplate{{ID: ptr.To[int32](9000)}},
				Bridges:           []string{"vmbr0"},
			}}
			if err := c.Update(ctx, cluster); err != nil {
				t.Fatal(err)
			}
			tmpl := &hfv1.HypervisorMachineTemplate{}
			if err := c.Get(ctx, client.ObjectKey{Namespace: "team", Name: "tmpl"}, tmpl); err != nil {
				t.Fatal(err)
			}
			tmpl.Spec.Source.Proxmox.TemplateID = ptr.To[int32](9000)
			tmpl.Spec.Network.Bridge = tc.bridge
			tmpl.Status.Conditions = []metav1.Condition{{Type: string(hfv1.ReadyCondition), Status: metav1.ConditionTrue, Reason: string(hfv1.ReadyReason), LastTransitionTime: metav1.Now()}}
			tmpl.Status.ObservedGeneration = tmpl.Generation
			if err := c.Update(ctx, tmpl); err != nil {
				t.Fatal(err)
			}
			r := &Reconciler{Client: c, Recorder: record.NewFakeRecorder(10)}
			claim := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "team", UID: "uid-1"}}
			claim.Spec.TemplateRef.Name = "tmpl"
			s := r.newClaimScope(claim)
			res, err := r.loadDependencies(ctx, s)
			setConditions(claim, &s.facts)
			next := !res.Stopped()
			cond := hfv1.FindCondition(claim.Status.Conditions, hfv1.MachineClaimProvisionedCondition)
			switch {
			case err != nil:
				t.Fatal(err)
			case tc.want == "" && !next:
				t.Fatalf("the claim waits: %+v", cond)
			case tc.want != "" && (next || cond == nil || cond.Reason != tc.want || !strings.Contains(cond.Message, "spec.tenancy")):
				t.Fatalf("goes on %v, condition %+v; want %s naming spec.tenancy", next, cond, tc.want)
			}
		})
	}
}
