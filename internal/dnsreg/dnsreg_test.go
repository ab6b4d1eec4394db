package dnsreg_test

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
)

func TestOwnerTXTRoundTrip(t *testing.T) {
	o := dnsreg.Owner{Claim: "6f1c9a52-0d3e-4b8e-9f5e-2a7d1c3b4e5f", Install: "hf-prod.eu"}
	txt := dnsreg.OwnerTXT(o)
	if want := "hyperfleet-claim=6f1c9a52-0d3e-4b8e-9f5e-2a7d1c3b4e5f install=hf-prod.eu"; txt != want {
		t.Fatalf("OwnerTXT = %q, want %q", txt, want)
	}
	got, ok := dnsreg.ParseOwnerTXT(txt)
	if !ok || got != o {
		t.Fatalf("ParseOwnerTXT(%q) = %+v, %v", txt, got, ok)
	}
	for _, s := range []string{
		"", "v=spf1 -all", "hyperfleet-claim=", "hyperfleet-claim=a", "hyperfleet-claim=a install=",
		"hyperfleet-claim= install=b", "hyperfleet-claim=a install=b c", "hyperfleet-claim=a b install=c",
		"Hyperfleet-claim=a install=b", "hyperfleet-claim=a  install=b", "hyperfleet-claim=a install=b\n",
	} {
		if o, ok := dnsreg.ParseOwnerTXT(s); ok {
			t.Errorf("ParseOwnerTXT(%q) = %+v, want no marker", s, o)
		}
	}
}

func TestOwnerMatches(t *testing.T) {
	m := dnsreg.Owner{Claim: "c1", Install: "i1"}
	for _, c := range []struct {
		sel  dnsreg.Owner
		want bool
	}{
		{dnsreg.Owner{Claim: "c1", Install: "i1"}, true},
		{dnsreg.Owner{Install: "i1"}, true},
		{dnsreg.Owner{Claim: "c2", Install: "i1"}, false},
		{dnsreg.Owner{Install: "i2"}, false},
	} {
		if got := c.sel.Matches(m); got != c.want {
			t.Errorf("%+v.Matches(%+v) = %v, want %v", c.sel, m, got, c.want)
		}
	}
}

func FuzzParseOwnerTXT(f *testing.F) {
	for _, s := range []string{"hyperfleet-claim=a install=b", "hyperfleet-claim=a install=b install=c", "v=spf1", "hyperfleet-claim=\x00 install=b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		o, ok := dnsreg.ParseOwnerTXT(s)
		if !ok {
			return
		}
		// A marker that parses is one HyperFleet writes, byte for byte.
		if err := o.Validate(); err != nil {
			t.Fatalf("ParseOwnerTXT(%q) = %+v, which is invalid: %v", s, o, err)
		}
		if back := dnsreg.OwnerTXT(o); back != s {
			t.Fatalf("ParseOwnerTXT(%q) formats back as %q", s, back)
		}
	})
}

func TestCheckTTL(t *testing.T) {
	for _, c := range []struct {
		ttl  time.Duration
		want uint32
		ok   bool
	}{
		{0, 300, true},
		{dnsreg.MinTTL, 5, true},
		{dnsreg.MaxTTL, 86400, true},
		{time.Minute, 60, true},
		{time.Second, 0, false},
		{dnsreg.MaxTTL + time.Second, 0, false},
		{90500 * time.Millisecond, 0, false},
		{-time.Minute, 0, false},
	} {
		got, err := dnsreg.CheckTTL(c.ttl, dnsreg.DefaultTTL)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("CheckTTL(%s) = %d, %v; want %d, ok %v", c.ttl, got, err, c.want, c.ok)
		}
		if err != nil && !errors.Is(err, dnsreg.ErrInvalid) {
			t.Errorf("CheckTTL(%s): %v is not ErrInvalid", c.ttl, err)
		}
	}
}

type nopRegistrar struct{ dnsreg.Registrar }

func TestRegistry(t *testing.T) {
	const typ hfv1.DNSProviderType = "test-registry"
	var got dnsreg.Config
	dnsreg.Register(typ, func(cfg dnsreg.Config) (dnsreg.Registrar, error) {
		got = cfg
		if cfg.Zone == "" {
			return nil, errors.New("no zone")
		}
		return nopRegistrar{}, nil
	})
	defer func() {
		if recover() == nil {
			t.Error("registering a type twice did not panic")
		}
	}()
	factories := dnsreg.Registered()
	if _, err := dnsreg.New(factories, typ, dnsreg.Config{Zone: "z.test"}); err != nil || got.Zone != "z.test" {
		t.Fatalf("New: %v (config %+v)", err, got)
	}
	if _, err := dnsreg.New(factories, typ, dnsreg.Config{}); err == nil || err.Error() != "dns provider test-registry: no zone" {
		t.Fatalf("New with a failing factory: %v", err)
	}
	_, err := dnsreg.New(factories, "route53", dnsreg.Config{})
	if errclass.Classify(err) != errclass.ClassConfiguration {
		t.Fatalf("New of an unregistered type: %v, want a Configuration error", err)
	}
	dnsreg.Register(typ, func(dnsreg.Config) (dnsreg.Registrar, error) { return nil, nil })
}

func TestAddrsTXT(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("2001:db8::10"), netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.10")}
	s := dnsreg.AddrsTXT(addrs)
	if want := "addrs=192.0.2.10,2001:db8::10"; s != want {
		t.Fatalf("AddrsTXT = %q, want %q", s, want)
	}
	got, ok := dnsreg.ParseAddrsTXT(s)
	if !ok || !slices.Equal(got, []netip.Addr{addrs[1], addrs[0]}) {
		t.Fatalf("ParseAddrsTXT(%q) = %v, %v", s, got, ok)
	}
	for _, s := range []string{
		"", "addrs=", "addrs=192.0.2.10,", "addrs=2001:db8::10,192.0.2.10", "addrs=192.0.2.10,192.0.2.10",
		"addrs=2001:DB8::10", "addrs=2001:db8:0::10", "addrs=::ffff:192.0.2.1", "addrs=fe80::1%eth0", "addrs=192.0.2.010", "Addrs=192.0.2.1",
	} {
		if got, ok := dnsreg.ParseAddrsTXT(s); ok {
			t.Errorf("ParseAddrsTXT(%q) = %v, want none", s, got)
		}
	}
}

func FuzzParseAddrsTXT(f *testing.F) {
	for _, s := range []string{"addrs=192.0.2.10,2001:db8::10", "addrs=::", "addrs=1.2.3.4,1.2.3.4", "addrs=::ffff:1.2.3.4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		addrs, ok := dnsreg.ParseAddrsTXT(s)
		if !ok {
			return
		}
		if back := dnsreg.AddrsTXT(addrs); back != s {
			t.Fatalf("ParseAddrsTXT(%q) = %v, which formats as %q", s, addrs, back)
		}
	})
}

// TestCheckZones: zones come back fully qualified and lower-cased; a
// reverse zone outside in-addr.arpa and ip6.arpa, or a zone that is no
// domain name, is refused.
func TestCheckZones(t *testing.T) {
	fwd, rev, err := dnsreg.CheckZones("CI.example.com", []string{"2.0.192.in-addr.arpa", "8.b.d.0.1.0.0.2.ip6.arpa.", "in-addr.arpa"})
	if err != nil || fwd != "ci.example.com." || len(rev) != 3 || rev[0] != "2.0.192.in-addr.arpa." || rev[1] != "8.b.d.0.1.0.0.2.ip6.arpa." {
		t.Fatalf("CheckZones = %q, %q, %v", fwd, rev, err)
	}
	for _, bad := range [][]string{{"example.com", "example.org"}, {"example.com", "notin-addr.arpa"}, {"bad zone", ""}, {"example.com", "a..in-addr.arpa"}} {
		if _, _, err := dnsreg.CheckZones(bad[0], bad[1:]); err == nil {
			t.Errorf("CheckZones(%q) accepted", bad)
		}
	}
}
