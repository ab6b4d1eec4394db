package pvefw

import (
	"net/netip"
	"strings"
	"testing"
)

func TestEffectiveNomatch(t *testing.T) {
	p := netip.MustParsePrefix
	cases := []struct {
		entries []entryRange
		want    string
	}{
		{[]entryRange{{p: p("10.0.0.0/24")}}, "10.0.0.0-10.0.0.255"},
		{[]entryRange{{p: p("10.0.0.0/24")}, {p: p("10.0.0.5/32"), nomatch: true}}, "10.0.0.0-10.0.0.4 10.0.0.6-10.0.0.255"},
		// The most specific entry decides: a match inside a nomatch network.
		{[]entryRange{{p: p("10.0.0.0/8")}, {p: p("10.1.0.0/16"), nomatch: true}, {p: p("10.1.2.0/24")}},
			"10.0.0.0-10.0.255.255 10.1.2.0-10.1.2.255 10.2.0.0-10.255.255.255"},
		{[]entryRange{{p: p("fe80::1/128")}, {p: p("fe80::/10"), nomatch: true}}, "fe80::1"},
		{[]entryRange{{p: p("255.255.255.0/24")}}, "255.255.255.0-255.255.255.255"},
		{nil, ""},
	}
	for _, tc := range cases {
		var got []string
		for _, s := range effective(tc.entries) {
			got = append(got, s.String())
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("%v: got %q, want %q", tc.entries, strings.Join(got, " "), tc.want)
		}
	}
}

func TestLinkLocal(t *testing.T) {
	a, err := LinkLocal("BC:24:11:2A:3B:4C")
	if err != nil || a.String() != "fe80::be24:11ff:fe2a:3b4c" {
		t.Fatalf("got %v, %v", a, err)
	}
}
