package controller

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestReservationRoundTrip: what setReservation writes, parseReservation
// reads back; malformed values are rejected with what is wrong.
func TestReservationRoundTrip(t *testing.T) {
	claim := &hfv1.MachineClaim{}
	setReservation(claim, "pve-a", provider.Progress{VMID: 1234, Node: "pve1"})
	ref, err := parseReservation(claim.Annotations[hfv1.VMReservationAnnotation])
	if err != nil {
		t.Fatal(err)
	}
	if want := (hfv1.VMReference{HypervisorCluster: "pve-a", Node: "pve1", VMID: 1234}); *ref != want {
		t.Fatalf("got %+v, want %+v", *ref, want)
	}
	for _, bad := range []string{"", "pve-a/pve1", "pve-a/pve1/x", "pve-a/pve1/0", "pve-a/pve1/-3", "/pve1/100", "pve-a//100", "a/b/c/100", "pve-a/pve1/99999999999"} {
		if _, err := parseReservation(bad); err == nil {
			t.Errorf("parseReservation(%q) accepted a malformed value", bad)
		}
	}
}

// TestRestoreReservation: the reservation stands in for status.vmRef only
// while a claim has not recorded a VM and is still being provisioned.
func TestRestoreReservation(t *testing.T) {
	recorded := &hfv1.VMReference{HypervisorCluster: "pve-a", Node: "pve2", VMID: 7}
	for _, tc := range []struct {
		name       string
		phase      hfv1.MachineClaimPhase
		annotation string
		vmRef      *hfv1.VMReference
		want       *hfv1.VMReference
	}{
		{name: "new claim", phase: "", annotation: "pve-a/pve1/100", want: &hfv1.VMReference{HypervisorCluster: "pve-a", Node: "pve1", VMID: 100}},
		{name: "pending", phase: hfv1.MachineClaimPending, annotation: "pve-a/pve1/100", want: &hfv1.VMReference{HypervisorCluster: "pve-a", Node: "pve1", VMID: 100}},
		{name: "provisioning", phase: hfv1.MachineClaimProvisioning, annotation: "pve-a/pve1/100", want: &hfv1.VMReference{HypervisorCluster: "pve-a", Node: "pve1", VMID: 100}},
		{name: "status already names a VM", phase: hfv1.MachineClaimProvisioning, annotation: "pve-a/pve1/100", vmRef: recorded, want: recorded},
		{name: "VM destroyed at the end", phase: hfv1.MachineClaimTerminating, annotation: "pve-a/pve1/100"},
		{name: "finished", phase: hfv1.MachineClaimFinished, annotation: "pve-a/pve1/100"},
		{name: "failed", phase: hfv1.MachineClaimFailed, annotation: "pve-a/pve1/100"},
		{name: "no reservation", phase: hfv1.MachineClaimPending},
		{name: "unreadable reservation", phase: hfv1.MachineClaimPending, annotation: "garbage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claim := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns"}}
			claim.Status.Phase, claim.Status.VMRef = tc.phase, tc.vmRef
			if tc.annotation != "" {
				claim.Annotations = map[string]string{hfv1.VMReservationAnnotation: tc.annotation}
			}
			restoreReservation(context.Background(), claim)
			switch got := claim.Status.VMRef; {
			case tc.want == nil && got != nil:
				t.Fatalf("restored %+v, want no VM", *got)
			case tc.want != nil && (got == nil || *got != *tc.want):
				t.Fatalf("got %+v, want %+v", got, *tc.want)
			}
		})
	}
}
