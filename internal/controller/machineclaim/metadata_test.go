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
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testobjects"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox"
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

// reservationRegistry connects HypervisorCluster pve-a as reservationWorld
// describes it (VM ids 1000-1999, nodes pve1 and pve2) to a Proxmox
// provider: CheckRef needs no API call, so none is ever made.
func reservationRegistry(t *testing.T, signer *ownership.Signer) *hypervisors.Registry {
	t.Helper()
	reg := hypervisors.NewRegistry()
	cfg := provider.ClusterConfig{Name: "pve-a", Endpoint: "https://pve-a.invalid:8006", TokenID: "hf@pve!t", TokenSecret: "s",
		Nodes: []string{"pve1", "pve2"}, VMIDStart: 1000, VMIDEnd: 1999}
	if _, err := reg.Connect("pve-a", cfg, func() (provider.Provider, error) { return proxmox.Factory.New(cfg, provider.Deps{Signer: signer}) }); err != nil {
		t.Fatal(err)
	}
	return reg
}

// TestRestoreReservation: a reservation stands in for status.vmRef only
// while a claim has not recorded a VM and is still being provisioned, and
// only when its signature verifies for the claim and placement could have
// chosen the VM it names; every forgery is refused with an event. A
// reservation written before provider IDs (legacy) still restores its VM.
func TestRestoreReservation(t *testing.T) {
	signer := reservationSigner(t, 1)
	sign := func(uid, cluster, node, vm string) string {
		return cluster + "/" + node + "/" + signer.SignReservation(ownership.Reservation{ClaimUID: uid, Cluster: cluster, Node: node, VM: vm}) + "/" + vm
	}
	// What a version before provider IDs wrote: r1 over the decimal id.
	legacy := "pve-a/pve1/1100/r1." + strings.TrimPrefix(signer.SignReservation(ownership.Reservation{ClaimUID: "uid-1", Cluster: "pve-a", Node: "pve1", VM: "1100"}), "r2.")
	good := sign("uid-1", "pve-a", "pve1", "proxmox://1100")
	want := hfv1.NewVMReference("pve-a", "proxmox://1100", "pve1")
	recorded := hfv1.NewVMReference("pve-a", "proxmox://1007", "pve2")
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
		{name: "written before provider IDs", phase: hfv1.MachineClaimProvisioning, annotation: legacy, nsLabels: admitted, want: want},
		{name: "status already names a VM", phase: hfv1.MachineClaimProvisioning, annotation: good, vmRef: recorded, nsLabels: admitted, want: recorded},
		{name: "VM destroyed at the end", phase: hfv1.MachineClaimTerminating, annotation: good, nsLabels: admitted},
		{name: "finished", phase: hfv1.MachineClaimFinished, annotation: good, nsLabels: admitted},
		{name: "failed", phase: hfv1.MachineClaimFailed, annotation: good, nsLabels: admitted},
		{name: "no reservation", phase: hfv1.MachineClaimPending, nsLabels: admitted},
		{name: "unreadable", phase: hfv1.MachineClaimPending, annotation: "garbage", nsLabels: admitted, refused: "is not"},
		{name: "unsigned (the oldest format)", annotation: "pve-a/pve1/1100", nsLabels: admitted, refused: "is not"},
		{name: "forged signature", annotation: "pve-a/pve1/r2.1.AAAA/proxmox://1100", nsLabels: admitted, refused: "signature"},
		{name: "forged legacy signature", annotation: "pve-a/pve1/1100/r1.1.AAAA", nsLabels: admitted, refused: "signature"},
		{name: "current signature in the legacy form", annotation: "pve-a/pve1/1100/" + signer.SignReservation(ownership.Reservation{ClaimUID: "uid-1", Cluster: "pve-a", Node: "pve1", VM: "1100"}), nsLabels: admitted, refused: "signature"},
		{name: "copied from another claim", annotation: sign("uid-2", "pve-a", "pve1", "proxmox://1100"), nsLabels: admitted, refused: "signature"},
		{name: "VM id edited", annotation: strings.Replace(good, "proxmox://1100", "proxmox://1101", 1), nsLabels: admitted, refused: "signature"},
		{name: "signed by another install", annotation: "pve-a/pve1/" + reservationSigner(t, 2).SignReservation(ownership.Reservation{ClaimUID: "uid-1", Cluster: "pve-a", Node: "pve1", VM: "proxmox://1100"}) + "/proxmox://1100", nsLabels: admitted, refused: "signature"},
		{name: "namespace not admitted", annotation: good, nsLabels: map[string]string{"tenant": "no"}, refused: "does not admit namespace team"},
		{name: "not the template's cluster", annotation: sign("uid-1", "pve-b", "pve1", "proxmox://1100"), nsLabels: admitted, refused: "template tmpl uses pve-a"},
		{name: "VM id outside the range", annotation: sign("uid-1", "pve-a", "pve1", "proxmox://4242"), nsLabels: admitted, refused: "outside the cluster's vmidRange 1000-1999"},
		{name: "node not allowed", annotation: sign("uid-1", "pve-a", "pve9", "proxmox://1100"), nsLabels: admitted, refused: "node pve9 is not in"},
		{name: "another hypervisor's ID", annotation: sign("uid-1", "pve-a", "pve1", "other://1100"), nsLabels: admitted, refused: "is not a Proxmox VM id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			events := record.NewFakeRecorder(10)
			r := &Reconciler{Client: reservationWorld(t, tc.nsLabels), Registry: reservationRegistry(t, signer), Signer: signer, Recorder: events}
			claim := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "team", UID: types.UID("uid-1")}}
			claim.Spec.TemplateRef.Name = "tmpl"
			claim.Status.Phase, claim.Status.VMRef, claim.Status.End = tc.phase, tc.vmRef, testobjects.EndOf(tc.phase)
			if tc.annotation != "" {
				claim.Annotations = map[string]string{hfv1.VMReservationAnnotation: tc.annotation}
			}
			if err := r.reservations().restore(context.Background(), &claimScope{claim: claim, claimEnv: r.env()}); err != nil {
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

// TestRestoreReservationClusterNotConnected: a reservation whose cluster
// is not connected cannot be checked against the cluster's ids; the claim
// retries (an error) rather than placing a second VM, and nothing is
// refused.
func TestRestoreReservationClusterNotConnected(t *testing.T) {
	signer := reservationSigner(t, 1)
	good := "pve-a/pve1/" + signer.SignReservation(ownership.Reservation{ClaimUID: "uid-1", Cluster: "pve-a", Node: "pve1", VM: "proxmox://1100"}) + "/proxmox://1100"
	events := record.NewFakeRecorder(10)
	r := &Reconciler{Client: reservationWorld(t, map[string]string{"tenant": "yes"}), Registry: hypervisors.NewRegistry(), Signer: signer, Recorder: events}
	claim := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "team", UID: "uid-1", Annotations: map[string]string{hfv1.VMReservationAnnotation: good}}}
	claim.Spec.TemplateRef.Name = "tmpl"
	err := r.reservations().restore(context.Background(), &claimScope{claim: claim, claimEnv: r.env()})
	if err == nil || !strings.Contains(err.Error(), "not connected") || claim.Status.VMRef != nil || len(events.Events) != 0 {
		t.Fatalf("err %v, restored %+v, %d events; want a retry, nothing restored, no event", err, claim.Status.VMRef, len(events.Events))
	}
}

// TestRestoreReservationWithoutSigner: an operator without a key trusts no
// reservation at all.
func TestRestoreReservationWithoutSigner(t *testing.T) {
	signer := reservationSigner(t, 1)
	good := "pve-a/pve1/" + signer.SignReservation(ownership.Reservation{ClaimUID: "uid-1", Cluster: "pve-a", Node: "pve1", VM: "proxmox://1100"}) + "/proxmox://1100"
	r := &Reconciler{Client: reservationWorld(t, map[string]string{"tenant": "yes"}), Registry: reservationRegistry(t, signer), Recorder: record.NewFakeRecorder(10)}
	claim := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "team", UID: "uid-1", Annotations: map[string]string{hfv1.VMReservationAnnotation: good}}}
	claim.Spec.TemplateRef.Name = "tmpl"
	if err := r.reservations().restore(context.Background(), &claimScope{claim: claim, claimEnv: r.env()}); err != nil || claim.Status.VMRef != nil {
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
