package ownership

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func samplePlacement() Placement {
	return Placement{
		ClaimUID: "uid-1", Cluster: "pve-a", Template: "9000", LinkedClone: true, Storage: "local-lvm", Format: "raw",
		ResourcePool: "ci", Bridge: "vmbr0", VLAN: 100, NICModel: "virtio", CPUCores: 2, MemoryBytes: 2 << 30, DiskBytes: 40 << 30,
		VendorSnippet: "local:snippets/kit.yaml", UserSnippet: "local:snippets/team-a.yaml", DriveStorage: "local-lvm", DNSDomain: "ci.example.com",
	}
}

// eachFieldChanged calls f with p changed in one field at a time, named:
// walking the struct covers a field added later too. A nil LegacyTemplate
// gets one, a set one loses it.
func eachFieldChanged(t *testing.T, p Placement, f func(field string, changed Placement)) {
	t.Helper()
	v := reflect.ValueOf(p)
	for i := range v.NumField() {
		changed := p
		fv := reflect.ValueOf(&changed).Elem().Field(i)
		switch fv.Kind() {
		case reflect.String:
			fv.SetString(fv.String() + "x")
		case reflect.Int, reflect.Int64:
			fv.SetInt(fv.Int() + 1)
		case reflect.Bool:
			fv.SetBool(!fv.Bool())
		case reflect.Pointer:
			if fv.IsNil() {
				fv.Set(reflect.New(fv.Type().Elem()))
			} else {
				fv.SetZero()
			}
		default:
			t.Fatalf("field %s of kind %s is not covered", v.Type().Field(i).Name, fv.Kind())
		}
		f(v.Type().Field(i).Name, changed)
	}
}

// TestPlacementSignature: a placement record verifies only for exactly the
// values it was signed with, for the claim and cluster it was signed for,
// by the same install: changing any one field (a tenant moving its VM to
// another bridge, VLAN, template, storage, pool, size, snippet, drive
// storage or DNS domain, or adding an earlier version's template fields),
// copying the record to another claim or signing it with another install's
// key breaks it; a reservation's signature cannot stand in for it, nor a
// record of the version before snippets and the domain were signed (p1).
func TestPlacementSignature(t *testing.T) {
	s, other := testSigner(t, "op", 1), testSigner(t, "op", 2)
	p := samplePlacement()
	sig := s.SignPlacement(p)
	if !strings.HasPrefix(sig, "p3.1.") || !s.VerifyPlacement(p, sig) {
		t.Fatalf("a fresh signature %q does not verify", sig)
	}
	eachFieldChanged(t, p, func(field string, changed Placement) {
		if s.VerifyPlacement(changed, sig) {
			t.Errorf("the signature verifies with %s changed: %+v", field, changed)
		}
	})
	shifted := p
	shifted.Bridge, shifted.NICModel = "vmbr", "0virtio"
	if s.VerifyPlacement(shifted, sig) {
		t.Error("moving characters between fields keeps the signature")
	}
	// A record with an isolation policy signs it; shedding it (or adding
	// one to a record without) fails the MAC.
	isolated := p
	isolated.Isolation = `{"policy":"web"}`
	isig := s.SignPlacement(isolated)
	if !s.VerifyPlacement(isolated, isig) || s.VerifyPlacement(p, isig) || s.VerifyPlacement(isolated, sig) {
		t.Error("the isolation policy is not covered by the placement signature")
	}
	if other.VerifyPlacement(p, sig) || s.VerifyPlacement(p, other.SignPlacement(p)) {
		t.Error("a signature of one install verifies with another install's key")
	}
	rotated, err := NewKeyRing("op", []Key{{ID: 1, Secret: []byte(strings.Repeat("\x01", MinKeyLength))}, {ID: 2, Secret: []byte(strings.Repeat("\x07", MinKeyLength))}})
	if err != nil {
		t.Fatal(err)
	}
	if !rotated.VerifyPlacement(p, sig) || !strings.HasPrefix(rotated.SignPlacement(p), "p3.2.") {
		t.Error("after a rotation, a record signed with the older key must verify and new ones use the newest")
	}
	for _, bad := range []string{"", strings.TrimPrefix(sig, "p3."), strings.Replace(sig, "p3.1.", "p3.9.", 1), strings.Replace(sig, "p3.", "r2.", 1),
		strings.Replace(sig, "p3.", "p2.", 1), strings.Replace(sig, "p3.", "p1.", 1)} {
		if s.VerifyPlacement(p, bad) {
			t.Errorf("signature %q verifies", bad)
		}
	}
	// Purpose separation: a reservation and a placement record over the
	// same leading values never share a MAC.
	r := Reservation{ClaimUID: p.ClaimUID, Cluster: p.Cluster}
	if s.VerifyPlacement(p, strings.Replace(s.SignReservation(r), "r2.", "p3.", 1)) ||
		s.VerifyReservation(r, strings.Replace(sig, "p3.", "r2.", 1)) {
		t.Error("a reservation's MAC stands in for a placement record's, or the other way round")
	}
	// A record of the version before (p1: the same MAC over the values
	// without the snippets, drive storage and DNS domain) left those to
	// the template's current values: it must not verify, whatever it says.
	legacy := p
	legacy.VendorSnippet, legacy.UserSnippet, legacy.DriveStorage, legacy.DNSDomain = "", "", "", ""
	old := legacy.fields(legacy.Template)
	p1 := s.signRecord(placementPurpose, LegacyPlacementVersion, old[:len(old)-4])
	for _, v := range []string{"p1.", "p2.", "p3."} {
		if relabelled := strings.Replace(p1, "p1.", v, 1); !strings.HasPrefix(p1, LegacyPlacementVersion+".1.") || s.VerifyPlacement(legacy, relabelled) {
			t.Errorf("a p1 placement record verifies as %s", v)
		}
	}
}

// legacySignature is what the operator before the opaque template
// reference signed samplePlacement as, with testSigner(t, "op", 1): the
// template as templateId 9000, no templateName (signature p2).
const legacySignature = "p2.1.IdY1SiyUgXqSNxCbc6T1PAueqGmjaHHSxm0_aa_ZH1w"

// TestLegacyPlacementSignature: a record signed by the operator before
// the opaque template reference, read from its JSON, still verifies (a
// claim placed before an upgrade keeps building its VM), and only as
// written: any field changed, the template moved into Template (or named
// there too), or the signature relabelled as this version's fails it; a
// new record never verifies with a legacy form of its template.
func TestLegacyPlacementSignature(t *testing.T) {
	s := testSigner(t, "op", 1)
	var p Placement
	const written = `{"cluster":"pve-a","templateId":9000,"linkedClone":true,"storage":"local-lvm","format":"raw","resourcePool":"ci",` +
		`"bridge":"vmbr0","vlan":100,"nicModel":"virtio","cpuCores":2,"memoryBytes":2147483648,"diskBytes":42949672960,` +
		`"vendorSnippet":"local:snippets/kit.yaml","userSnippet":"local:snippets/team-a.yaml","driveStorage":"local-lvm","dnsDomain":"ci.example.com"}`
	if err := json.Unmarshal([]byte(written), &p); err != nil {
		t.Fatal(err)
	}
	p.ClaimUID = "uid-1"
	if p.LegacyTemplate == nil || *p.LegacyTemplate != (LegacyTemplate{Number: 9000}) || p.Template != "" {
		t.Fatalf("the earlier record's template reads as %+v, Template %q", p.LegacyTemplate, p.Template)
	}
	if !s.VerifyPlacement(p, legacySignature) {
		t.Fatal("a record signed by the earlier operator does not verify")
	}
	eachFieldChanged(t, p, func(field string, changed Placement) {
		if s.VerifyPlacement(changed, legacySignature) {
			t.Errorf("the earlier signature verifies with %s changed: %+v", field, changed)
		}
	})
	renamed := p
	renamed.LegacyTemplate = &LegacyTemplate{Name: "9000"}
	moved := p
	moved.LegacyTemplate, moved.Template = nil, "9000"
	for name, changed := range map[string]Placement{"the number as a name": renamed, "the template as Template": moved} {
		if s.VerifyPlacement(changed, legacySignature) {
			t.Errorf("the earlier signature verifies with %s: %+v", name, changed)
		}
	}
	if s.VerifyPlacement(p, strings.Replace(legacySignature, "p2.", "p3.", 1)) {
		t.Error("the earlier signature verifies relabelled as this version's")
	}
	// This version's record, its template given the earlier form instead.
	fresh := samplePlacement()
	sig := s.SignPlacement(fresh)
	fresh.Template, fresh.LegacyTemplate = "", &LegacyTemplate{Number: 9000}
	if s.VerifyPlacement(fresh, sig) || s.VerifyPlacement(fresh, strings.Replace(sig, "p3.", "p2.", 1)) {
		t.Error("a p3 signature verifies over the earlier form of the template")
	}
	// A new record writes none of the earlier fields.
	raw, err := json.Marshal(samplePlacement())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), "templateId") || strings.Contains(string(raw), "templateName") || !strings.Contains(string(raw), `"template":"9000"`) {
		t.Errorf("a new record is written as %s", raw)
	}
}
