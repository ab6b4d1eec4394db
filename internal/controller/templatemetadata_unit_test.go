package controller

import (
	"strings"
	"testing"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// TestInvalidClaimMetadata: spec.metadata that the API server would refuse
// on every claim a pool creates is reported with its field.
func TestInvalidClaimMetadata(t *testing.T) {
	cases := []struct {
		name string
		md   *hfv1.ObjectMetadata
		want string // "" = valid
	}{
		{"unset", nil, ""},
		{"valid", &hfv1.ObjectMetadata{Labels: map[string]string{"team": "a", "example.com/cc": "42"}, Annotations: map[string]string{"example.com/note": "any text: at all"}}, ""},
		{"label value with a space", &hfv1.ObjectMetadata{Labels: map[string]string{"team": "payments team"}}, "spec.metadata.labels: Invalid value: \"payments team\""},
		{"label key too long", &hfv1.ObjectMetadata{Labels: map[string]string{strings.Repeat("k", 64): "v"}}, "spec.metadata.labels: Invalid value"},
		{"annotation key with a space", &hfv1.ObjectMetadata{Annotations: map[string]string{"bad key": "v"}}, "spec.metadata.annotations: Invalid value: \"bad key\""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := invalidClaimMetadata(tc.md)
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("invalidClaimMetadata = %q, want %q", got, tc.want)
			}
		})
	}
}
