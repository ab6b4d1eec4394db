package provider_test

import (
	"reflect"
	"testing"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestTemplateRef: a record's template reads back from its reference as
// recorded, the rest of the record kept, and distinct templates give
// distinct references (a number never reads as a name, tags never as a
// number or a name); a string no record gives is refused rather than read
// as some other template.
func TestTemplateRef(t *testing.T) {
	rest := provider.SourceRecord{Storage: "local-lvm", Format: "raw", Pool: "ci"}
	seen := map[string]provider.SourceRecord{}
	for _, tc := range []struct {
		number int
		name   string
		tags   []string
		ref    string
	}{
		{0, "", nil, ""},
		{9000, "", nil, "9000"},
		{0, "9000", nil, "0/9000"},
		{0, "debian-12-ci", nil, "0/debian-12-ci"},
		{7, "debian", nil, "7/debian"},
		{7, "a/b", nil, "7/a/b"},
		{0, "tags:ci", nil, "0/tags:ci"},
		{0, "", []string{"ci"}, "tags:ci"},
		{0, "", []string{"9000"}, "tags:9000"},
		{0, "", []string{"ci", "debian12"}, "tags:ci,debian12"},
		{0, "", []string{"_x", "a+b", "a-b", "a.b"}, "tags:_x,a+b,a-b,a.b"},
	} {
		rec := rest
		rec.Number, rec.Name, rec.Tags = tc.number, tc.name, tc.tags
		ref := rec.TemplateRef()
		if ref != tc.ref {
			t.Errorf("%+v: reference %q, want %q", rec, ref, tc.ref)
		}
		if other, dup := seen[ref]; dup {
			t.Errorf("%+v and %+v share reference %q", rec, other, ref)
		}
		seen[ref] = rec
		back, err := rest.WithTemplateRef(ref)
		if err != nil || !reflect.DeepEqual(back, rec) {
			t.Errorf("%q reads back as %+v, %v; want %+v", ref, back, err, rec)
		}
	}
	for _, bad := range []string{"09000", "+9000", "9000/", "x", "x/y", "0", " 9000", "9000 ",
		"tags:", "tags:,", "tags:ci,", "tags:,ci", "tags:CI", "tags:debian12,ci", "tags:ci,ci", "tags:ci;x", "tags:-ci",
		"tags:c i", "tags:ci:x", "TAGS:ci", "tags"} {
		if got, err := rest.WithTemplateRef(bad); err == nil || !reflect.DeepEqual(got, rest) {
			t.Errorf("%q reads as %+v, %v; want an error and the record unchanged", bad, got, err)
		}
	}
}
