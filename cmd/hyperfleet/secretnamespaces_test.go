package main

import (
	"slices"
	"testing"
)

// TestParseSecretNamespaces: --secret-namespaces always holds --namespace,
// without repeats or blanks; * means every namespace (nil).
func TestParseSecretNamespaces(t *testing.T) {
	for _, c := range []struct {
		flag string
		want []string
	}{
		{"", []string{"hyperfleet-system"}},
		{"ci", []string{"ci", "hyperfleet-system"}},
		{" team-b , ci,,hyperfleet-system,ci ", []string{"ci", "hyperfleet-system", "team-b"}},
		{"*", nil},
		{"ci,*", nil},
	} {
		if got := parseSecretNamespaces(c.flag, "hyperfleet-system"); !slices.Equal(got, c.want) || (c.want == nil) != (got == nil) {
			t.Errorf("--secret-namespaces=%q: %q, want %q", c.flag, got, c.want)
		}
	}
}
