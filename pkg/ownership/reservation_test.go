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
	r := Reservation{ClaimUID: "uid-1", Cluster: "pve-a", Node: "pve1", VM: "proxmox://1100"}
	sig := s.SignReservation(r)
	if !s.VerifyReservation(r, sig) {
		t.Fatal("a fresh signature does not verify")
	}
	for name, changed := range map[string]Reservation{
		"claim":   {ClaimUID: "uid-2", Cluster: "pve-a", Node: "pve1", VM: "proxmox://1100"},
		"cluster": {ClaimUID: "uid-1", Cluster: "pve-b", Node: "pve1", VM: "proxmox://1100"},
		"node":    {ClaimUID: "uid-1", Cluster: "pve-a", Node: "pve2", VM: "proxmox://1100"},
		"vm":      {ClaimUID: "uid-1", Cluster: "pve-a", Node: "pve1", VM: "proxmox://1101"},
		"shifted": {ClaimUID: "uid-1p", Cluster: "ve-a", Node: "pve1", VM: "proxmox://1100"},
	} {
		if s.VerifyReservation(changed, sig) {
			t.Errorf("signature verifies for another %s: %+v", name, changed)
		}
	}
	if other.VerifyReservation(r, sig) || s.VerifyReservation(r, other.SignReservation(r)) {
		t.Error("a signature of one install verifies with another install's key")
	}
	rotated, err := NewKeyRing("op", []Key{{ID: 1, Secret: []byte(strings.Repeat("\x01", MinKeyLength))}, {ID: 2, Secret: []byte(strings.Repeat("\x07", MinKeyLength))}})
	if err != nil {
		t.Fatal(err)
	}
	if !rotated.VerifyReservation(r, sig) || !strings.HasPrefix(rotated.SignReservation(r), "r2.2.") {
		t.Error("after a rotation, a reservation signed with the older key must verify and new ones use the newest")
	}
	if s.VerifyReservation(r, "") || s.VerifyReservation(r, strings.TrimPrefix(sig, "r2.")) || s.VerifyReservation(r, strings.Replace(sig, "r2.1.", "r2.9.", 1)) {
		t.Error("an empty or unversioned signature verifies")
	}
	block := s.Block(Record{Namespace: "ns", Name: "c", UID: "uid-1", VMID: 1100, CreatedAt: time.Unix(0, 0)})
	for _, line := range strings.Split(block, "\n") {
		if v, ok := strings.CutPrefix(line, "signature: "); ok {
			if s.VerifyReservation(r, "r2.1."+v[strings.LastIndex(v, ":")+1:]) {
				t.Fatal("the VM's ownership-block signature verifies as a reservation")
			}
		}
	}
}

// TestLegacyReservation: a reservation an earlier version signed ("r1",
// over the decimal Proxmox VM id) still verifies as a legacy one, never as
// a current one, and a current signature never verifies as a legacy one:
// the two forms cannot stand in for each other.
func TestLegacyReservation(t *testing.T) {
	s := testSigner(t, "op", 1)
	legacy := Reservation{ClaimUID: "uid-1", Cluster: "pve-a", Node: "pve1", VM: "1100"}
	// What the earlier version wrote: the same MAC under the r1 prefix.
	sig := "r1." + strings.TrimPrefix(s.SignReservation(legacy), "r2.")
	if !s.VerifyLegacyReservation(legacy, sig) {
		t.Fatal("a legacy reservation does not verify")
	}
	if s.VerifyReservation(legacy, sig) {
		t.Error("a legacy signature verifies as a current one")
	}
	current := Reservation{ClaimUID: "uid-1", Cluster: "pve-a", Node: "pve1", VM: "proxmox://1100"}
	if s.VerifyLegacyReservation(current, s.SignReservation(current)) {
		t.Error("a current signature verifies as a legacy one")
	}
	if s.VerifyLegacyReservation(Reservation{ClaimUID: "uid-1", Cluster: "pve-a", Node: "pve1", VM: "1101"}, sig) {
		t.Error("a legacy signature verifies for another VM id")
	}
}
