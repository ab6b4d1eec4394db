package ipam

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestParsePool(t *testing.T) {
	tests := []struct {
		name        string
		spec        Spec
		network     string
		allocatable []string // ranges as first-last
		warnings    []string
	}{
		{
			name:        "CIDR with gateway inside",
			spec:        Spec{Addresses: []string{"10.0.0.0/24"}, Prefix: 24, Gateways: []string{"10.0.0.1"}},
			network:     "10.0.0.0/24",
			allocatable: []string{"10.0.0.2-10.0.0.254"},
		},
		{
			name: "seed 002 example",
			spec: Spec{
				Addresses:         []string{"192.168.1.10-192.168.1.50", "192.168.1.100/32"},
				ExcludedAddresses: []string{"192.168.1.20-192.168.1.25"},
				Prefix:            24,
				Gateways:          []string{"192.168.1.1"},
				Nameservers:       []string{"8.8.8.8", "2001:4860:4860::8888"},
				SearchDomains:     []string{"ci.example.com"},
			},
			network:     "192.168.1.0/24",
			allocatable: []string{"192.168.1.10-192.168.1.19", "192.168.1.26-192.168.1.50", "192.168.1.100-192.168.1.100"},
		},
		{
			name:        "each IPv4 CIDR entry loses its own network and broadcast",
			spec:        Spec{Addresses: []string{"10.0.0.128/25", "10.0.0.0/25"}, Prefix: 24},
			network:     "10.0.0.0/24",
			allocatable: []string{"10.0.0.1-10.0.0.126", "10.0.0.129-10.0.0.254"},
		},
		{
			name:        "CIDR entry inside a wider subnet",
			spec:        Spec{Addresses: []string{"10.0.1.0/24"}, Prefix: 16, Gateways: []string{"10.0.0.1"}},
			network:     "10.0.0.0/16",
			allocatable: []string{"10.0.1.1-10.0.1.254"},
		},
		{
			name:        "range entry loses the subnet's network and broadcast",
			spec:        Spec{Addresses: []string{"10.0.0.0-10.0.0.255"}, Prefix: 24},
			network:     "10.0.0.0/24",
			allocatable: []string{"10.0.0.1-10.0.0.254"},
		},
		{
			name:        "adjacent ranges merge",
			spec:        Spec{Addresses: []string{"10.0.0.20-10.0.0.29", "10.0.0.10-10.0.0.19"}, Prefix: 24},
			network:     "10.0.0.0/24",
			allocatable: []string{"10.0.0.10-10.0.0.29"},
		},
		{
			name:        "IPv4 /31 keeps both addresses",
			spec:        Spec{Addresses: []string{"10.0.0.4/31"}, Prefix: 31},
			network:     "10.0.0.4/31",
			allocatable: []string{"10.0.0.4-10.0.0.5"},
		},
		{
			name:        "overlapping exclusions and one that excludes nothing",
			spec:        Spec{Addresses: []string{"10.0.0.0/24"}, ExcludedAddresses: []string{"10.0.0.0/26", "10.0.0.60-10.0.0.70", "10.0.1.0/24"}, Prefix: 23},
			network:     "10.0.0.0/23",
			allocatable: []string{"10.0.0.71-10.0.0.254"},
			warnings:    []string{"spec.excludedAddresses[2]: 10.0.1.0/24 excludes nothing: no entry of spec.addresses contains it"},
		},
		{
			name:        "nothing left to hand out",
			spec:        Spec{Addresses: []string{"10.0.0.1/32"}, Prefix: 24, Gateways: []string{"10.0.0.1"}},
			network:     "10.0.0.0/24",
			allocatable: nil,
			warnings:    []string{"spec.addresses: no address is left to hand out once exclusions, gateways and network, broadcast and anycast addresses are removed; every allocation will fail"},
		},
		{
			name:        "IPv6 /64 loses its subnet-router anycast address and the gateway",
			spec:        Spec{Addresses: []string{"2001:db8::/64"}, Prefix: 64, Gateways: []string{"2001:db8::1"}},
			network:     "2001:db8::/64",
			allocatable: []string{"2001:db8::2-2001:db8::ffff:ffff:ffff:ffff"},
		},
		{
			name:        "IPv6 range keeps the top, loses the anycast address",
			spec:        Spec{Addresses: []string{"2001:db8::-2001:db8::10", "2001:db8::ffff:ffff:ffff:fff0-2001:db8::ffff:ffff:ffff:ffff"}, Prefix: 64},
			network:     "2001:db8::/64",
			allocatable: []string{"2001:db8::1-2001:db8::10", "2001:db8::ffff:ffff:ffff:fff0-2001:db8::ffff:ffff:ffff:ffff"},
		},
		{
			name:        "IPv6 /127 keeps both addresses",
			spec:        Spec{Addresses: []string{"2001:db8::/127"}, Prefix: 127},
			network:     "2001:db8::/127",
			allocatable: []string{"2001:db8::-2001:db8::1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ParsePool(tt.spec)
			if err != nil {
				t.Fatalf("ParsePool: %v", err)
			}
			if p.Network != netip.MustParsePrefix(tt.network) || p.Prefix() != int(tt.spec.Prefix) {
				t.Errorf("Network = %v, Prefix() = %d, want %s", p.Network, p.Prefix(), tt.network)
			}
			var got []string
			for _, r := range p.Allocatable {
				got = append(got, r.First.String()+"-"+r.Last.String())
				if r.Prefix.IsValid() {
					t.Errorf("allocatable range %v carries a prefix", r)
				}
			}
			if !slices.Equal(got, tt.allocatable) {
				t.Errorf("Allocatable = %q, want %q", got, tt.allocatable)
			}
			if !slices.Equal(p.Warnings, tt.warnings) {
				t.Errorf("Warnings = %q, want %q", p.Warnings, tt.warnings)
			}
			if len(p.Entries) != len(tt.spec.Addresses) || len(p.Excluded) != len(tt.spec.ExcludedAddresses) ||
				len(p.Gateways) != len(tt.spec.Gateways) || len(p.Nameservers) != len(tt.spec.Nameservers) ||
				!slices.Equal(p.SearchDomains, tt.spec.SearchDomains) {
				t.Errorf("parsed fields do not match the spec: %+v", p)
			}
		})
	}
}

func TestPoolHelpers(t *testing.T) {
	p := mustPool(t, Spec{Addresses: []string{"10.0.0.0/24"}, Prefix: 24, Gateways: []string{"10.0.0.1", "10.0.0.254"}})
	if p.Family != IPv4 || p.Family.String() != "IPv4" {
		t.Errorf("Family = %v", p.Family)
	}
	if got := p.Gateway(); got != netip.MustParseAddr("10.0.0.1") {
		t.Errorf("Gateway() = %v", got)
	}
	if got := p.WithPrefix(netip.MustParseAddr("10.0.0.5")).String(); got != "10.0.0.5/24" {
		t.Errorf("WithPrefix = %s, want 10.0.0.5/24", got)
	}
	for addr, want := range map[string]bool{
		"10.0.0.0": false, "10.0.0.1": false, "10.0.0.2": true, "10.0.0.253": true, "10.0.0.254": false,
		"10.0.0.255": false, "10.0.1.2": false, "::ffff:10.0.0.2": true, "2001:db8::2": false,
	} {
		if got := p.Contains(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Contains(%s) = %v, want %v", addr, got, want)
		}
	}
	if got := mustPool(t, Spec{Addresses: []string{"10.0.0.0/24"}, Prefix: 24}).Gateway(); got.IsValid() {
		t.Errorf("Gateway() without gateways = %v, want the zero Addr", got)
	}
}

func TestParsePoolErrors(t *testing.T) {
	v4 := func(mod func(*Spec)) Spec {
		s := Spec{Addresses: []string{"10.0.0.0/24"}, Prefix: 24, Gateways: []string{"10.0.0.1"}}
		mod(&s)
		return s
	}
	tests := []struct {
		name string
		spec Spec
		want string
	}{
		{"no addresses", v4(func(s *Spec) { s.Addresses = nil; s.Gateways = nil }),
			"spec.addresses: at least one address entry is required"},
		{"reversed range", v4(func(s *Spec) { s.Addresses = []string{"10.0.0.16/28", "10.0.0.32/28", "10.0.0.9-10.0.0.1"} }),
			"spec.addresses[2]: range 10.0.0.9-10.0.0.1 ends before it starts; write the lower address first"},
		{"reversed IPv6 range", Spec{Addresses: []string{"2001:db8::a-2001:db8::2"}, Prefix: 64},
			"spec.addresses[0]: range 2001:db8::a-2001:db8::2 ends before it starts; write the lower address first"},
		{"bare address", v4(func(s *Spec) { s.Addresses = []string{"10.0.0.5"} }),
			"spec.addresses[0]: 10.0.0.5 has no prefix length; write a single address as 10.0.0.5/32"},
		{"host bits", v4(func(s *Spec) { s.Addresses = []string{"10.0.0.5/24"} }),
			"spec.addresses[0]: 10.0.0.5/24 has bits set after the prefix length; write 10.0.0.0/24 for the whole network or 10.0.0.5/32 for one address"},
		{"two families", v4(func(s *Spec) { s.Addresses = []string{"10.0.0.0/24", "2001:db8::/64"} }),
			"spec.addresses[1]: 2001:db8::/64 is IPv6 but spec.addresses[0] is IPv4; a pool has one family: create one pool per family"},
		{"family set by the first readable entry", v4(func(s *Spec) { s.Addresses = []string{"2001:db8::/64", "10.0.0.0/24"}; s.Prefix = 64; s.Gateways = nil }),
			"spec.addresses[1]: 10.0.0.0/24 is IPv4 but spec.addresses[0] is IPv6; a pool has one family: create one pool per family"},
		{"overlap", v4(func(s *Spec) { s.Addresses = []string{"10.0.0.0/24", "10.0.0.128/25"} }),
			"spec.addresses[1]: 10.0.0.128/25 overlaps spec.addresses[0] (10.0.0.0/24); list each address once"},
		{"overlap found at the later index", v4(func(s *Spec) { s.Addresses = []string{"10.0.0.100-10.0.0.200", "10.0.0.0/25"} }),
			"spec.addresses[1]: 10.0.0.0/25 overlaps spec.addresses[0] (10.0.0.100-10.0.0.200); list each address once"},
		{"same entry twice", v4(func(s *Spec) { s.Addresses = []string{"10.0.0.9/32", "10.0.0.10/32", "10.0.0.9/32"} }),
			"spec.addresses[2]: 10.0.0.9/32 overlaps spec.addresses[0] (10.0.0.9/32); list each address once"},
		{"overlap with an entry ending further than the next", v4(func(s *Spec) {
			s.Addresses = []string{"10.0.0.10-10.0.0.100", "10.0.0.20-10.0.0.30", "10.0.0.50-10.0.0.60"}
		}), "spec.addresses[1]: 10.0.0.20-10.0.0.30 overlaps spec.addresses[0] (10.0.0.10-10.0.0.100); list each address once\n" +
			"spec.addresses[2]: 10.0.0.50-10.0.0.60 overlaps spec.addresses[0] (10.0.0.10-10.0.0.100); list each address once"},
		{"loopback", v4(func(s *Spec) { s.Addresses = []string{"127.0.0.0/24"}; s.Gateways = nil }),
			"spec.addresses[0]: 127.0.0.0/24 includes loopback addresses (127.0.0.0/8), which a VM cannot use"},
		{"multicast", v4(func(s *Spec) { s.Addresses = []string{"224.0.0.10-224.0.0.20"}; s.Gateways = nil }),
			"spec.addresses[0]: 224.0.0.10-224.0.0.20 includes multicast addresses (224.0.0.0/4), which a VM cannot use"},
		{"IPv6 loopback", Spec{Addresses: []string{"::1/128"}, Prefix: 64},
			"spec.addresses[0]: ::1/128 includes the loopback address (::1/128), which a VM cannot use"},
		{"prefix zero", v4(func(s *Spec) { s.Prefix = 0 }),
			"spec.prefix: 0 is not a prefix length; use 1 to 32 for IPv4 or 1 to 128 for IPv6"},
		{"IPv4 prefix too long", v4(func(s *Spec) { s.Prefix = 33 }),
			"spec.prefix: 33 is longer than an IPv4 address; use 1 to 32"},
		{"two subnets", v4(func(s *Spec) { s.Addresses = []string{"10.0.0.0/24", "10.0.1.0/24"} }),
			"spec.addresses[1]: 10.0.1.0/24 does not fit in the pool's network 10.0.0.0/24 (spec.prefix 24 around spec.addresses[0]); a pool is one subnet: widen spec.prefix or create one pool per subnet"},
		{"entry wider than the prefix", v4(func(s *Spec) { s.Addresses = []string{"10.0.0.0/16"} }),
			"spec.addresses[0]: 10.0.0.0/16 does not fit in the pool's network 10.0.0.0/24 (spec.prefix 24 around spec.addresses[0]); a pool is one subnet: widen spec.prefix or create one pool per subnet"},
		{"bad exclusion", v4(func(s *Spec) { s.ExcludedAddresses = []string{"10.0.0.5/32", "10.0.0.20-10.0.0.10"} }),
			"spec.excludedAddresses[1]: range 10.0.0.20-10.0.0.10 ends before it starts; write the lower address first"},
		{"exclusion of the other family", v4(func(s *Spec) { s.ExcludedAddresses = []string{"2001:db8::1/128"} }),
			"spec.excludedAddresses[0]: 2001:db8::1/128 is IPv6 but the pool is IPv4; exclude addresses of the pool's family"},
		{"gateway off the subnet", v4(func(s *Spec) { s.Gateways = []string{"10.0.1.1"} }),
			"spec.gateways[0]: 10.0.1.1 is outside the pool's network 10.0.0.0/24; a VM reaches its gateway on-link: use a gateway inside 10.0.0.0/24 or widen spec.prefix"},
		{"gateway is the network address", v4(func(s *Spec) { s.Gateways = []string{"10.0.0.0"} }),
			"spec.gateways[0]: 10.0.0.0 is the network or broadcast address of 10.0.0.0/24, not a host; use a router's address"},
		{"gateway is the broadcast address", v4(func(s *Spec) { s.Gateways = []string{"10.0.0.255"} }),
			"spec.gateways[0]: 10.0.0.255 is the network or broadcast address of 10.0.0.0/24, not a host; use a router's address"},
		{"gateway with a prefix length", v4(func(s *Spec) { s.Gateways = []string{"10.0.0.1/24"} }),
			`spec.gateways[0]: "10.0.0.1/24" has a prefix length; write the address alone, such as 10.0.0.1`},
		{"gateway not an address", v4(func(s *Spec) { s.Gateways = []string{"router"} }),
			`spec.gateways[0]: "router" is not an IP address`},
		{"gateway of the other family", v4(func(s *Spec) { s.Gateways = []string{"2001:db8::1"} }),
			"spec.gateways[0]: 2001:db8::1 is IPv6 but the pool is IPv4; use a gateway of the pool's family"},
		{"gateway twice", v4(func(s *Spec) { s.Gateways = []string{"10.0.0.1", "10.0.0.1"} }),
			"spec.gateways[1]: 10.0.0.1 is listed twice; list each gateway once"},
		{"gateway reserved", v4(func(s *Spec) { s.Prefix = 1; s.Gateways = []string{"127.0.0.1"} }),
			"spec.gateways[0]: 127.0.0.1 is reserved (loopback addresses, 127.0.0.0/8); use a router's address"},
		{"gateway with a zone", Spec{Addresses: []string{"fe80::/64"}, Prefix: 64, Gateways: []string{"fe80::1%eth0"}},
			"spec.gateways[0]: fe80::1%eth0 has an IPv6 zone; zones are not allowed"},
		{"unspecified nameserver", v4(func(s *Spec) { s.Nameservers = []string{"0.0.0.0"} }),
			"spec.nameservers[0]: 0.0.0.0 cannot be a resolver; use the address of a DNS server"},
		{"nameserver not an address", v4(func(s *Spec) { s.Nameservers = []string{"8.8.8.8", "dns.google"} }),
			`spec.nameservers[1]: "dns.google" is not an IP address`},
		{"nameserver twice", v4(func(s *Spec) { s.Nameservers = []string{"8.8.8.8", "8.8.8.8"} }),
			"spec.nameservers[1]: 8.8.8.8 is listed twice; list each nameserver once"},
		{"upper-case search domain", v4(func(s *Spec) { s.SearchDomains = []string{"Example.com"} }),
			`spec.searchDomains[0]: "Example.com" is not a DNS domain; use lower-case labels of letters, digits and '-' joined by dots, such as ci.example.com`},
		{"search domain label too long", v4(func(s *Spec) { s.SearchDomains = []string{strings.Repeat("a", 64) + ".com"} }),
			`spec.searchDomains[0]: "` + strings.Repeat("a", 64) + `.com" is not a DNS domain; use lower-case labels of letters, digits and '-' joined by dots, such as ci.example.com`},
		{"search domain twice", v4(func(s *Spec) { s.SearchDomains = []string{"example.com", "example.com"} }),
			"spec.searchDomains[1]: example.com is listed twice; list each search domain once"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ParsePool(tt.spec)
			if err == nil {
				t.Fatalf("ParsePool = %+v, want error %q", p, tt.want)
			}
			if p != nil {
				t.Errorf("ParsePool returned a pool with an error")
			}
			if err.Error() != tt.want {
				t.Errorf("error\n got: %s\nwant: %s", err, tt.want)
			}
			if !errors.Is(err, ErrInvalidSpec) {
				t.Errorf("error does not match ErrInvalidSpec")
			}
		})
	}
}

func TestParsePoolListsEveryProblemInSpecOrder(t *testing.T) {
	_, err := ParsePool(Spec{
		Addresses:         []string{"10.0.0.0/24", "10.0.0.9-10.0.0.1", "2001:db8::/64", "10.0.0.128/25"},
		ExcludedAddresses: []string{"nope"},
		Prefix:            24,
		Gateways:          []string{"10.0.9.1"},
		Nameservers:       []string{"::"},
		SearchDomains:     []string{"-bad"},
	})
	var se *SpecError
	if !errors.As(err, &se) {
		t.Fatalf("error %v is not a *SpecError", err)
	}
	var fields []string
	for _, fe := range se.Errors {
		fields = append(fields, fe.Field)
	}
	want := []string{
		"spec.addresses[1]", "spec.addresses[2]", "spec.addresses[3]", "spec.excludedAddresses[0]",
		"spec.gateways[0]", "spec.nameservers[0]", "spec.searchDomains[0]",
	}
	if !slices.Equal(fields, want) {
		t.Errorf("fields = %q, want %q", fields, want)
	}
	if n := strings.Count(err.Error(), "\n"); n != len(want)-1 {
		t.Errorf("error has %d lines, want %d:\n%s", n+1, len(want), err)
	}
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "spec.addresses[1]" {
		t.Errorf("errors.As(*FieldError) = %v, want the first field error", fe)
	}
}

func mustPool(t testing.TB, s Spec) *Pool {
	t.Helper()
	p, err := ParsePool(s)
	if err != nil {
		t.Fatalf("ParsePool(%+v): %v", s, err)
	}
	return p
}
