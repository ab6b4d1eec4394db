package ownership

import (
	"strings"
	"testing"
	"time"
)

// TestReservationSignature: a reservation verifies only for exactly the
// claim, cluster, node and VM id it was signed for, by the same install,
// and the ownership-block signature over the same VM cannot stand in for
// it (the two MACs are separated by purpose).
func TestReservationSignature(t *testing.T) {
	s, other := testSigner(t, "op", 1), testSigner(t, "op", 2)
	r := Reservation{ClaimUID: "uid-1", Cluster: "pve-a", Node: "pve1", VMID: 1100}
	sig := s.SignReservation(r)
	if !s.VerifyReservation(r, sig) {
		t.Fatal("a fresh signature does not verify")
	}
	for name, changed := range map[string]Reservation{
		"claim":   {ClaimUID: "uid-2", Cluster: "pve-a", Node: "pve1", VMID: 1100},
		"cluster": {ClaimUID: "uid-1", Cluster: "pve-b", Node: "pve1", VMID: 1100},
		"node":    {ClaimUID: "uid-1", Cluster: "pve-a", Node: "pve2", VMID: 1100},
		"vmid":    {ClaimUID: "uid-1", Cluster: "pve-a", Node: "pve1", VMID: 1101},
		"shifted": {ClaimUID: "uid-1p", Cluster: "ve-a", Node: "pve1", VMID: 1100},
	} {
		if s.VerifyReservation(changed, sig) {
			t.Errorf("signature verifies for another %s: %+v", name, changed)
		}
	}
	if other.VerifyReservation(r, sig) || s.VerifyReservation(r, other.SignReservation(r)) {
		t.Error("a signature of one install verifies with another install's key")
	}
	if s.VerifyReservation(r, "") || s.VerifyReservation(r, strings.TrimPrefix(sig, "v1.")) {
		t.Error("an empty or unversioned signature verifies")
	}
	block := s.Block(Record{Namespace: "ns", Name: "c", UID: "uid-1", VMID: 1100, CreatedAt: time.Unix(0, 0)})
	for _, line := range strings.Split(block, "\n") {
		if v, ok := strings.CutPrefix(line, "signature: "); ok {
			if s.VerifyReservation(r, strings.Replace(v, ":", ".", 1)) {
				t.Fatal("the VM's ownership-block signature verifies as a reservation")
			}
		}
	}
}
