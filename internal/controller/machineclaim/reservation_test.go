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
	Annotate(claim, signer, "pve-a", provider.Progress{VMID: 1234, Node: "pve1"})
	ref, sig, err := Parse(claim.Annotations[hfv1.VMReservationAnnotation])
	if err != nil {
		t.Fatal(err)
	}
	if want := (hfv1.VMReference{HypervisorCluster: "pve-a", Node: "pve1", VMID: 1234}); *ref != want {
		t.Fatalf("got %+v, want %+v", *ref, want)
	}
	if !signer.VerifyReservation(ownership.Reservation{ClaimUID: "uid-1", Cluster: "pve-a", Node: "pve1", VMID: 1234}, sig) {
		t.Fatal("the written signature does not verify")
	}
	for _, bad := range []string{"", "pve-a/pve1", "pve-a/pve1/100", "pve-a/pve1/x/s", "pve-a/pve1/0/s", "pve-a/pve1/-3/s", "/pve1/100/s", "pve-a//100/s", "pve-a/pve1/100/", "a/b/c/100/s", "pve-a/pve1/99999999999/s"} {
		if _, _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted a malformed value", bad)
		}
	}
}
