package provider_test

import (
	"testing"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestTemplateRef: a record's template reads back from its reference as
// recorded, the rest of the record kept, and distinct templates give
// distinct references (a number never reads as a name); a string no
// record gives is refused rather than read as some other template.
func TestTemplateRef(t *testing.T) {
	rest := provider.SourceRecord{Storage: "local-lvm", Format: "raw", Pool: "ci"}
	seen := map[string]provider.SourceRecord{}
	for _, tc := range []struct {
		number int
		name   string
		ref    string
	}{
		{0, "", ""},
		{9000, "", "9000"},
		{0, "9000", "0/9000"},
		{0, "debian-12-ci", "0/debian-12-ci"},
		{7, "debian", "7/debian"},
		{7, "a/b", "7/a/b"},
	} {
		rec := rest
		rec.Number, rec.Name = tc.number, tc.name
		ref := rec.TemplateRef()
		if ref != tc.ref {
			t.Errorf("%+v: reference %q, want %q", rec, ref, tc.ref)
		}
		if other, dup := seen[ref]; dup {
			t.Errorf("%+v and %+v share reference %q", rec, other, ref)
		}
		seen[ref] = rec
		back, err := rest.WithTemplateRef(ref)
		if err != nil || back != rec {
			t.Errorf("%q reads back as %+v, %v; want %+v", ref, back, err, rec)
		}
	}
	for _, bad := range []string{"09000", "+9000", "9000/", "x", "x/y", "0", " 9000", "9000 "} {
		if got, err := rest.WithTemplateRef(bad); err == nil || got != rest {
			t.Errorf("%q reads as %+v, %v; want an error and the record unchanged", bad, got, err)
		}
	}
}
