package ipam

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseRange(t *testing.T) {
	tests := []struct {
		in          string
		first, last string
		prefix      string // "" for a first-last range
		str         string // Range.String(), when it differs from in
	}{
		{in: "10.0.0.0/24", first: "10.0.0.0", last: "10.0.0.255", prefix: "10.0.0.0/24"},
		{in: "10.0.0.5/32", first: "10.0.0.5", last: "10.0.0.5", prefix: "10.0.0.5/32"},
		{in: "10.0.0.4/31", first: "10.0.0.4", last: "10.0.0.5", prefix: "10.0.0.4/31"},
		{in: "10.0.0.0/8", first: "10.0.0.0", last: "10.255.255.255", prefix: "10.0.0.0/8"},
		{in: "0.0.0.0/0", first: "0.0.0.0", last: "255.255.255.255", prefix: "0.0.0.0/0"},
		{in: "10.0.0.10-10.0.0.50", first: "10.0.0.10", last: "10.0.0.50"},
		{in: "10.0.0.7-10.0.0.7", first: "10.0.0.7", last: "10.0.0.7", str: "10.0.0.7/32"},
		{in: "10.0.0.255-10.0.1.0", first: "10.0.0.255", last: "10.0.1.0"},
		{in: "2001:db8::/64", first: "2001:db8::", last: "2001:db8::ffff:ffff:ffff:ffff", prefix: "2001:db8::/64"},
		{in: "2001:db8::1/128", first: "2001:db8::1", last: "2001:db8::1", prefix: "2001:db8::1/128"},
		{in: "2001:db8::/127", first: "2001:db8::", last: "2001:db8::1", prefix: "2001:db8::/127"},
		{in: "2620:0:860:2::10-2620:0:860:2::50", first: "2620:0:860:2::10", last: "2620:0:860:2::50"},
		{in: "2001:db8::ff-2001:db8::1:0", first: "2001:db8::ff", last: "2001:db8::1:0"},
		{in: "::/0", first: "::", last: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", prefix: "::/0"},
		// Non-canonical IPv6 spellings are accepted and printed canonically.
		{in: "2001:DB8:0:0::1/128", first: "2001:db8::1", last: "2001:db8::1", prefix: "2001:db8::1/128", str: "2001:db8::1/128"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			r, err := ParseRange(tt.in)
			if err != nil {
				t.Fatalf("ParseRange(%q): %v", tt.in, err)
			}
			if r.First != netip.MustParseAddr(tt.first) || r.Last != netip.MustParseAddr(tt.last) {
				t.Errorf("ParseRange(%q) = %s..%s, want %s..%s", tt.in, r.First, r.Last, tt.first, tt.last)
			}
			var wantPrefix netip.Prefix
			if tt.prefix != "" {
				wantPrefix = netip.MustParsePrefix(tt.prefix)
			}
			if r.Prefix != wantPrefix {
				t.Errorf("ParseRange(%q).Prefix = %v, want %v", tt.in, r.Prefix, wantPrefix)
			}
			want := tt.str
			if want == "" {
				want = tt.in
			}
			if got := r.String(); got != want {
				t.Errorf("ParseRange(%q).String() = %q, want %q", tt.in, got, want)
			}
		})
	}
}

func TestParseRangeErrors(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", "empty entry; write a CIDR (10.0.0.0/24), a range (10.0.0.10-10.0.0.50) or a single address (10.0.0.5/32)"},
		{"10.0.0.9-10.0.0.1", "range 10.0.0.9-10.0.0.1 ends before it starts; write the lower address first"},
		{"2001:db8::9-2001:db8::1", "range 2001:db8::9-2001:db8::1 ends before it starts; write the lower address first"},
		{"2001:db8::1:0-2001:db8::ffff", "range 2001:db8::1:0-2001:db8::ffff ends before it starts; write the lower address first"},
		{"10.0.0.1-2001:db8::1", "range 10.0.0.1-2001:db8::1 mixes IPv4 and IPv6; both ends of a range must be of one family"},
		{"10.0.0.1-10.0.0.2-10.0.0.3", `"10.0.0.1-10.0.0.2-10.0.0.3" has more than one "-"; write a range as first-last, such as 10.0.0.10-10.0.0.50`},
		{"10.0.0.x-10.0.0.5", `range 10.0.0.x-10.0.0.5: start "10.0.0.x" is not an IP address`},
		{"10.0.0.1-", `range 10.0.0.1-: end "" is not an IP address`},
		{"-10.0.0.1", `range -10.0.0.1: start "" is not an IP address`},
		{"10.0.0.1 - 10.0.0.5", `range 10.0.0.1 - 10.0.0.5: start "10.0.0.1 " is not an IP address`},
		{"10.0.0.0/24-10.0.1.0/24", `range 10.0.0.0/24-10.0.1.0/24: start "10.0.0.0/24" has a prefix length; write the address alone, such as 10.0.0.1`},
		{"fe80::1%eth0-fe80::9", "range fe80::1%eth0-fe80::9: start fe80::1%eth0 has an IPv6 zone; zones are not allowed"},
		{"10.0.0.1-::ffff:10.0.0.9", "range 10.0.0.1-::ffff:10.0.0.9: end ::ffff:10.0.0.9 is an IPv4-mapped IPv6 address; write it as the IPv4 address 10.0.0.9"},
		{"10.0.0.5", "10.0.0.5 has no prefix length; write a single address as 10.0.0.5/32"},
		{"2001:db8::5", "2001:db8::5 has no prefix length; write a single address as 2001:db8::5/128"},
		{"ten", `"ten" is not a CIDR (10.0.0.0/24), a range (10.0.0.10-10.0.0.50) or a single address (10.0.0.5/32)`},
		{"10.0.0/24", `"10.0.0/24" is not a CIDR (10.0.0.0/24), a range (10.0.0.10-10.0.0.50) or a single address (10.0.0.5/32)`},
		{"010.0.0.0/24", `"010.0.0.0/24" is not a CIDR (10.0.0.0/24), a range (10.0.0.10-10.0.0.50) or a single address (10.0.0.5/32)`},
		{"10.0.0.0/33", `10.0.0.0/33: prefix length "33" is not a number from 0 to 32`},
		{"2001:db8::/129", `2001:db8::/129: prefix length "129" is not a number from 0 to 128`},
		{"10.0.0.0/024", `10.0.0.0/024: prefix length "024" is not a number from 0 to 32`},
		{"10.0.0.0/+8", `10.0.0.0/+8: prefix length "+8" is not a number from 0 to 32`},
		{"10.0.0.0/", `10.0.0.0/: prefix length "" is not a number from 0 to 32`},
		{"10.0.0.0/24/", `10.0.0.0/24/: prefix length "24/" is not a number from 0 to 32`},
		{"10.0.0.5/24", "10.0.0.5/24 has bits set after the prefix length; write 10.0.0.0/24 for the whole network or 10.0.0.5/32 for one address"},
		{"2001:db8::1/64", "2001:db8::1/64 has bits set after the prefix length; write 2001:db8::/64 for the whole network or 2001:db8::1/128 for one address"},
		{"fe80::1%eth0/128", "fe80::1%eth0 has an IPv6 zone; zones are not allowed"},
		{"::ffff:10.0.0.0/120", "::ffff:10.0.0.0 is an IPv4-mapped IPv6 address; write it as the IPv4 address 10.0.0.0"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			r, err := ParseRange(tt.in)
			if err == nil {
				t.Fatalf("ParseRange(%q) = %v, want error %q", tt.in, r, tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("ParseRange(%q) error\n got: %s\nwant: %s", tt.in, err, tt.want)
			}
		})
	}
}

func TestRangeContainsAndOverlaps(t *testing.T) {
	r := mustRange(t, "10.0.0.10-10.0.0.20")
	for _, tt := range []struct {
		addr string
		want bool
	}{
		{"10.0.0.9", false}, {"10.0.0.10", true}, {"10.0.0.15", true}, {"10.0.0.20", true},
		{"10.0.0.21", false}, {"::ffff:10.0.0.15", false}, {"2001:db8::", false},
	} {
		if got := r.Contains(netip.MustParseAddr(tt.addr)); got != tt.want {
			t.Errorf("%v.Contains(%s) = %v, want %v", r, tt.addr, got, tt.want)
		}
	}
	if r.Contains(netip.Addr{}) {
		t.Errorf("%v contains the zero Addr", r)
	}
	for _, tt := range []struct {
		other string
		want  bool
	}{
		{"10.0.0.0/29", false}, {"10.0.0.8/29", true}, {"10.0.0.20/32", true}, {"10.0.0.21-10.0.0.30", false},
		{"10.0.0.0/16", true}, {"::/0", false},
	} {
		o := mustRange(t, tt.other)
		if got := r.Overlaps(o); got != tt.want {
			t.Errorf("%v.Overlaps(%v) = %v, want %v", r, o, got, tt.want)
		}
		if got := o.Overlaps(r); got != tt.want {
			t.Errorf("%v.Overlaps(%v) = %v, want %v", o, r, got, tt.want)
		}
	}
}

func TestParseAllocatedAddress(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"10.0.0.5/24", "10.0.0.5"},
		{"10.0.0.5", "10.0.0.5"},
		{"2001:db8::5/64", "2001:db8::5"},
		{"::ffff:10.0.0.5", "10.0.0.5"},
		{"::ffff:10.0.0.5/120", "10.0.0.5"},
	} {
		got, err := ParseAllocatedAddress(tt.in)
		if err != nil || got != netip.MustParseAddr(tt.want) {
			t.Errorf("ParseAllocatedAddress(%q) = %v, %v; want %s", tt.in, got, err, tt.want)
		}
	}
	for _, in := range []string{"", "10.0.0.5/33", "x", "10.0.0.5/"} {
		if got, err := ParseAllocatedAddress(in); err == nil {
			t.Errorf("ParseAllocatedAddress(%q) = %v, want an error", in, got)
		} else if !strings.HasPrefix(err.Error(), "allocated address ") {
			t.Errorf("ParseAllocatedAddress(%q) error %q does not name the value", in, err)
		}
	}
}

func TestLastOf(t *testing.T) {
	for _, tt := range []struct{ prefix, want string }{
		{"10.0.0.0/24", "10.0.0.255"},
		{"10.0.0.0/32", "10.0.0.0"},
		{"0.0.0.0/0", "255.255.255.255"},
		{"2001:db8::/64", "2001:db8::ffff:ffff:ffff:ffff"},
		{"2001:db8::/63", "2001:db8:0:1:ffff:ffff:ffff:ffff"},
		{"2001:db8::/65", "2001:db8::7fff:ffff:ffff:ffff"},
		{"::/0", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
		{"2001:db8::1/128", "2001:db8::1"},
	} {
		if got := lastOf(netip.MustParsePrefix(tt.prefix)); got != netip.MustParseAddr(tt.want) {
			t.Errorf("lastOf(%s) = %s, want %s", tt.prefix, got, tt.want)
		}
	}
}

// FuzzParseRange checks that the entry parser never panics and that what it
// accepts is a well-formed range that prints back to itself.
func FuzzParseRange(f *testing.F) {
	for _, s := range []string{
		"10.0.0.0/24", "10.0.0.10-10.0.0.50", "10.0.0.5/32", "2001:db8::/64", "2001:db8::1/128",
		"2620:0:860:2::10-2620:0:860:2::50", "10.0.0.9-10.0.0.1", "10.0.0.5/24", "fe80::1%eth0/128",
		"::ffff:10.0.0.1/128", "10.0.0.1-2001:db8::1", "-", "/", "10.0.0.0/024", "::/0", "0.0.0.0/0",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRange(s)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("ParseRange(%q): empty error message", s)
			}
			return
		}
		if !r.First.IsValid() || !r.Last.IsValid() {
			t.Fatalf("ParseRange(%q) = %#v: invalid bound", s, r)
		}
		if r.First.Is4() != r.Last.Is4() || r.First.Is4In6() || r.Last.Is4In6() || r.First.Zone() != "" || r.Last.Zone() != "" {
			t.Fatalf("ParseRange(%q) = %v: mixed family, mapped address or zone", s, r)
		}
		if r.Last.Less(r.First) {
			t.Fatalf("ParseRange(%q) = %v: ends before it starts", s, r)
		}
		if r.Prefix.IsValid() && (r.Prefix.Masked() != r.Prefix || r.Prefix.Addr() != r.First || lastOf(r.Prefix) != r.Last) {
			t.Fatalf("ParseRange(%q) = %v: prefix and bounds disagree", s, r)
		}
		if !r.Contains(r.First) || !r.Contains(r.Last) {
			t.Fatalf("ParseRange(%q) = %v: does not contain its bounds", s, r)
		}
		back, err := ParseRange(r.String())
		if err != nil {
			t.Fatalf("ParseRange(%q).String() = %q does not parse: %v", s, r.String(), err)
		}
		if back.First != r.First || back.Last != r.Last {
			t.Fatalf("ParseRange(%q) = %v, but its String %q parses to %v", s, r, r.String(), back)
		}
	})
}

func mustRange(t testing.TB, s string) Range {
	t.Helper()
	r, err := ParseRange(s)
	if err != nil {
		t.Fatalf("ParseRange(%q): %v", s, err)
	}
	return r
}
