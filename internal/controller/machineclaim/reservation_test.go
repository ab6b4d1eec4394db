package machineclaim

import (
	"bytes"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestReservationRoundTrip: what Annotate writes, Parse
// reads back with a signature that verifies for the claim; malformed
// values are rejected with what is wrong.
func TestReservationRoundTrip(t *testing.T) {
	signer, err := ownership.NewSigner("test", bytes.Repeat([]byte{1}, ownership.MinKeyLength))
	if err != nil {
		t.Fatal(err)
	}
	claim := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{UID: "uid-1"}}
	Annotate(claim, signer, "pve-a", provider.Progress{ID: "proxmox://1234", Node: "pve1"})
	got, err := Parse(claim.Annotations[hfv1.VMReservationAnnotation])
	if err != nil {
		t.Fatal(err)
	}
	if want := (hfv1.VMReference{HypervisorCluster: "pve-a", ProviderID: "proxmox://1234", VMID: 1234, Node: "pve1"}); *got.Ref != want || got.Legacy {
		t.Fatalf("got %+v (legacy %v), want %+v", *got.Ref, got.Legacy, want)
	}
	if !signer.VerifyReservation(ownership.Reservation{ClaimUID: "uid-1", Cluster: "pve-a", Node: "pve1", VM: "proxmox://1234"}, got.Sig) {
		t.Fatal("the written signature does not verify")
	}
	legacy, err := Parse("pve-a/pve1/1100/r1.1.AAAA")
	if want := (hfv1.VMReference{HypervisorCluster: "pve-a", VMID: 1100, Node: "pve1"}); err != nil || *legacy.Ref != want || !legacy.Legacy || legacy.Sig != "r1.1.AAAA" {
		t.Fatalf("legacy value: %+v, %v", legacy, err)
	}
	for _, bad := range []string{"", "pve-a/pve1", "pve-a/pve1/100", "pve-a/pve1/s", "/pve1/s/proxmox://1", "pve-a/pve1//proxmox://1", "pve-a/pve1/s/",
		"pve-a//100/r1.1.A", "pve-a/pve1/99/r1.1.A", "pve-a/pve1/-3/r1.1.A", "pve-a/pve1/100/r1.1.A/x"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted a malformed value", bad)
		}
	}
}
