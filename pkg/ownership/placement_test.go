package ownership

import (
	"reflect"
	"strings"
	"testing"
)

func samplePlacement() Placement {
	return Placement{
		ClaimUID: "uid-1", Cluster: "pve-a", TemplateID: 9000, LinkedClone: true, Storage: "local-lvm", Format: "raw",
		ResourcePool: "ci", Bridge: "vmbr0", VLAN: 100, NICModel: "virtio", CPUCores: 2, MemoryBytes: 2 << 30, DiskBytes: 40 << 30,
		VendorSnippet: "local:snippets/kit.yaml", UserSnippet: "local:snippets/team-a.yaml", DriveStorage: "local-lvm", DNSDomain: "ci.example.com",
	}
}

// TestPlacementSignature: a placement record verifies only for exactly the
// values it was signed with, for the claim and cluster it was signed for,
// by the same install: changing any one field (a tenant moving its VM to
// another bridge, VLAN, template, storage, pool, size, snippet, drive
// storage or DNS domain), copying the record to another claim or signing
// it with another install's key breaks it; a reservation's signature
// cannot stand in for it, nor a record of the version before snippets and
// the domain were signed (p1).
func TestPlacementSignature(t *testing.T) {
	s, other := testSigner(t, "op", 1), testSigner(t, "op", 2)
	p := samplePlacement()
	sig := s.SignPlacement(p)
	if !strings.HasPrefix(sig, "p2.1.") || !s.VerifyPlacement(p, sig) {
		t.Fatalf("a fresh signature %q does not verify", sig)
	}
	// Every field, changed on its own, must break the signature: walk the
	// struct so that a field added later is covered too.
	v := reflect.ValueOf(p)
	for i := range v.NumField() {
		changed := p
		f := reflect.ValueOf(&changed).Elem().Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString(f.String() + "x")
		case reflect.Int, reflect.Int64:
			f.SetInt(f.Int() + 1)
		case reflect.Bool:
			f.SetBool(!f.Bool())
		default:
			t.Fatalf("field %s of kind %s is not covered", v.Type().Field(i).Name, f.Kind())
		}
		if s.VerifyPlacement(changed, sig) {
			t.Errorf("the signature verifies with %s changed: %+v", v.Type().Field(i).Name, changed)
		}
	}
	shifted := p
	shifted.Bridge, shifted.NICModel = "vmbr", "0virtio"
	if s.VerifyPlacement(shifted, sig) {
		t.Error("moving characters between fields keeps the signature")
	}
	if other.VerifyPlacement(p, sig) || s.VerifyPlacement(p, other.SignPlacement(p)) {
		t.Error("a signature of one install verifies with another install's key")
	}
	rotated, err := NewKeyRing("op", []Key{{ID: 1, Secret: []byte(strings.Repeat("\x01", MinKeyLength))}, {ID: 2, Secret: []byte(strings.Repeat("\x07", MinKeyLength))}})
	if err != nil {
		t.Fatal(err)
	}
	if !rotated.VerifyPlacement(p, sig) || !strings.HasPrefix(rotated.SignPlacement(p), "p2.2.") {
		t.Error("after a rotation, a record signed with the older key must verify and new ones use the newest")
	}
	for _, bad := range []string{"", strings.TrimPrefix(sig, "p2."), strings.Replace(sig, "p2.1.", "p2.9.", 1), strings.Replace(sig, "p2.", "r2.", 1), strings.Replace(sig, "p2.", "p1.", 1)} {
		if s.VerifyPlacement(p, bad) {
			t.Errorf("signature %q verifies", bad)
		}
	}
	// Purpose separation: a reservation and a placement record over the
	// same leading values never share a MAC.
	r := Reservation{ClaimUID: p.ClaimUID, Cluster: p.Cluster}
	if s.VerifyPlacement(p, strings.Replace(s.SignReservation(r), "r2.", "p2.", 1)) ||
		s.VerifyReservation(r, strings.Replace(sig, "p2.", "r2.", 1)) {
		t.Error("a reservation's MAC stands in for a placement record's, or the other way round")
	}
	// A record of the version before (p1: the same MAC over the values
	// without the snippets, drive storage and DNS domain) left those to
	// the template's current values: it must not verify, whatever it says.
	legacy := p
	legacy.VendorSnippet, legacy.UserSnippet, legacy.DriveStorage, legacy.DNSDomain = "", "", "", ""
	old := legacy.fields()
	p1 := s.signRecord(placementPurpose, LegacyPlacementVersion, old[:len(old)-4])
	if !strings.HasPrefix(p1, LegacyPlacementVersion+".1.") || s.VerifyPlacement(legacy, p1) || s.VerifyPlacement(legacy, strings.Replace(p1, "p1.", "p2.", 1)) {
		t.Error("a p1 placement record verifies")
	}
}
