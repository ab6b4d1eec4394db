// Package dnsregtest is the contract every dnsreg.Registrar meets, run by
// each back-end's tests against the real service it writes to (as
// pkg/provider/providertest is for hypervisors): a DNS server for rfc2136,
// the API server's DNSEndpoint objects for externaldns.
package dnsregtest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
)

// Harness is one DNS service with a Registrar for it. The service holds
// the forward zone Zone, the reverse zones of 192.0.2.0/24 and
// 2001:db8::/32, and lets the Registrar's credentials update and read all
// three.
type Harness struct {
	// Zone is the forward zone, fully qualified.
	Zone string
	// New returns a Registrar for the service's zones with default TTL
	// 300 s.
	New func(t *testing.T) dnsreg.Registrar
	// Lookup asks the service itself (no cache in between) for name's
	// records of type t.
	Lookup func(t *testing.T, name string, qtype uint16) []dns.RR
	// Add writes a record, given in zone-file syntax, as another tool
	// would: no HyperFleet marker, no prerequisite.
	Add func(t *testing.T, rr string)
	// Markers says that the back-end keeps its ownership marker in DNS,
	// as TXT records next to the names it writes (dnsreg.OwnerTXT and
	// AddrsTXT; rfc2136). A back-end that keeps the owner elsewhere
	// (externaldns: its objects' labels) must write no TXT at all, which
	// the contract checks instead.
	Markers bool
	// Version returns a token that changes whenever the service's records
	// change; nil means the SOA serials of the three zones (Lookup). A
	// Register that changes nothing must leave it as it was.
	Version func(t *testing.T) string
}

const install = "op-1"

// Run runs the contract: every subtest uses its own names, so they share
// one server.
func Run(t *testing.T, h Harness) {
	ctx := context.Background()
	name := func(label string) string { return label + "." + h.Zone }
	owner := func(claim string) dnsreg.Owner { return dnsreg.Owner{Claim: claim, Install: install} }
	v4 := netip.MustParseAddr("192.0.2.10")
	v6 := netip.MustParseAddr("2001:db8::10")

	t.Run("RegisterPublishesAddressesPTRAndMarker", func(t *testing.T) {
		r := h.New(t)
		rec := dnsreg.Record{Name: name("vm-a"), Addrs: []netip.Addr{v4, v6}, TTL: 60 * time.Second, Owner: owner("claim-a")}
		mustRegister(t, r, rec)
		wantAddrs(t, h, rec.Name, 60, v4, v6)
		wantPTR(t, h, v4, rec.Name, 60)
		wantPTR(t, h, v6, rec.Name, 60)
		wantMarkers(t, h, rec, v4)
		// Idempotent, and a Register that changes nothing changes
		// nothing in the service (secondaries transfer nothing).
		before := version(t, h)
		mustRegister(t, r, rec)
		wantAddrs(t, h, rec.Name, 60, v4, v6)
		if after := version(t, h); before != after {
			t.Fatalf("a repeated Register changed the service from %s to %s", before, after)
		}
		// A new TTL is a change.
		rec.TTL = 90 * time.Second
		mustRegister(t, r, rec)
		wantAddrs(t, h, rec.Name, 90, v4, v6)
		wantPTR(t, h, v4, rec.Name, 90)
	})

	t.Run("ListFindsRecordsByOwnerAndForSweep", func(t *testing.T) {
		r := h.New(t)
		a := dnsreg.Record{Name: name("vm-list-a"), Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.21"), netip.MustParseAddr("2001:db8::21")}, Owner: owner("claim-list-a")}
		b := dnsreg.Record{Name: name("vm-list-b"), Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.22")}, Owner: owner("claim-list-b")}
		other := dnsreg.Record{Name: name("vm-list-c"), Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.23")}, Owner: dnsreg.Owner{Claim: "claim-list-c", Install: "op-2"}}
		for _, rec := range []dnsreg.Record{a, b, other} {
			mustRegister(t, r, rec)
		}
		got, err := r.List(ctx, owner("claim-list-a"))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].Name != dns.Fqdn(a.Name) || !slices.Equal(got[0].Addrs, a.Addrs) || got[0].Owner != a.Owner || got[0].TTL != dnsreg.DefaultTTL {
			t.Fatalf("List(claim-list-a) = %+v, want %+v with TTL %s", got, a, dnsreg.DefaultTTL)
		}
		all, err := r.List(ctx, dnsreg.Owner{Install: install})
		if err != nil {
			t.Fatal(err)
		}
		claims := map[string]bool{}
		for _, rec := range all {
			if rec.Owner.Install != install {
				t.Errorf("List(install %s) returned %+v of another install", install, rec)
			}
			claims[rec.Owner.Claim] = true
		}
		if !claims["claim-list-a"] || !claims["claim-list-b"] || claims["claim-list-c"] {
			t.Fatalf("List(install %s) = %+v, want claim-list-a and -b and not -c", install, all)
		}
		// A sweep removes what List returned for a gone claim.
		for _, rec := range all {
			if rec.Owner.Claim == "claim-list-b" {
				if err := r.Remove(ctx, rec); err != nil {
					t.Fatal(err)
				}
			}
		}
		wantAddrs(t, h, b.Name, 0)
		wantPTR(t, h, b.Addrs[0], "", 0)
		wantAddrs(t, h, other.Name, 300, other.Addrs...)
	})

	t.Run("ReRegisterReplacesAddressesAndTheirPTRs", func(t *testing.T) {
		r := h.New(t)
		old := netip.MustParseAddr("192.0.2.31")
		now := netip.MustParseAddr("192.0.2.32")
		rec := dnsreg.Record{Name: name("vm-move"), Addrs: []netip.Addr{old}, Owner: owner("claim-move")}
		mustRegister(t, r, rec)
		rec.Addrs = []netip.Addr{now}
		mustRegister(t, r, rec)
		wantAddrs(t, h, rec.Name, 300, now)
		wantPTR(t, h, now, rec.Name, 300)
		wantPTR(t, h, old, "", 0)
	})

	t.Run("RemoveDeletesEverythingRegistered", func(t *testing.T) {
		r := h.New(t)
		rec := dnsreg.Record{Name: name("vm-rm"), Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.41"), netip.MustParseAddr("2001:db8::41")}, Owner: owner("claim-rm")}
		mustRegister(t, r, rec)
		if err := r.Remove(ctx, rec); err != nil {
			t.Fatal(err)
		}
		wantAddrs(t, h, rec.Name, 0)
		wantPTR(t, h, rec.Addrs[0], "", 0)
		wantPTR(t, h, rec.Addrs[1], "", 0)
		if txt := h.Lookup(t, dns.Fqdn(rec.Name), dns.TypeTXT); len(txt) != 0 {
			t.Fatalf("TXT left at %s: %v", rec.Name, txt)
		}
		if err := r.Remove(ctx, rec); err != nil {
			t.Fatalf("second Remove: %v", err)
		}
		if got, err := r.List(ctx, owner("claim-rm")); err != nil || len(got) != 0 {
			t.Fatalf("List after Remove = %v, %v; want none", got, err)
		}
	})

	t.Run("RemoveLeavesOtherRecordsAtTheName", func(t *testing.T) {
		r := h.New(t)
		rec := dnsreg.Record{Name: name("vm-shared"), Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.51")}, Owner: owner("claim-shared")}
		mustRegister(t, r, rec)
		h.Add(t, dns.Fqdn(rec.Name)+" 300 IN A 192.0.2.99")
		h.Add(t, dns.Fqdn(rec.Name)+` 300 IN TXT "v=spf1 -all"`)
		if err := r.Remove(ctx, rec); err != nil {
			t.Fatal(err)
		}
		wantAddrs(t, h, rec.Name, 300, netip.MustParseAddr("192.0.2.99"))
		txt := h.Lookup(t, dns.Fqdn(rec.Name), dns.TypeTXT)
		if len(txt) != 1 || txt[0].(*dns.TXT).Txt[0] != "v=spf1 -all" {
			t.Fatalf("TXT at %s = %v, want only the foreign one", rec.Name, txt)
		}
		wantPTR(t, h, rec.Addrs[0], "", 0)
	})

	t.Run("ReRegisterKeepsATXTAddedToTheName", func(t *testing.T) {
		r := h.New(t)
		rec := dnsreg.Record{Name: name("vm-spf"), Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.55")}, Owner: owner("claim-spf")}
		mustRegister(t, r, rec)
		h.Add(t, dns.Fqdn(rec.Name)+` 300 IN TXT "v=spf1 -all"`)
		rec.Addrs = []netip.Addr{netip.MustParseAddr("192.0.2.56")}
		rec.TTL = 120 * time.Second
		mustRegister(t, r, rec)
		wantAddrs(t, h, rec.Name, 120, rec.Addrs...)
		var got []string
		for _, rr := range h.Lookup(t, dns.Fqdn(rec.Name), dns.TypeTXT) {
			got = append(got, rr.(*dns.TXT).Txt[0])
		}
		slices.Sort(got)
		want := []string{"v=spf1 -all"}
		if markerCount(h) == 1 {
			want = []string{dnsreg.OwnerTXT(rec.Owner), "v=spf1 -all"}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("TXT at %s = %q, want %q", rec.Name, got, want)
		}
		if err := r.Remove(ctx, rec); err != nil {
			t.Fatal(err)
		}
		wantAddrs(t, h, rec.Name, 0)
	})

	t.Run("ReRegisterKeepsAnAddressAddedToTheName", func(t *testing.T) {
		r := h.New(t)
		rec := dnsreg.Record{Name: name("vm-extra"), Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.57")}, Owner: owner("claim-extra")}
		mustRegister(t, r, rec)
		extra := netip.MustParseAddr("192.0.2.98")
		h.Add(t, dns.Fqdn(rec.Name)+" 300 IN A "+extra.String())
		rec.Addrs = []netip.Addr{netip.MustParseAddr("192.0.2.58")}
		mustRegister(t, r, rec)
		wantAddrs(t, h, rec.Name, 300, rec.Addrs[0], extra)
		wantPTR(t, h, netip.MustParseAddr("192.0.2.57"), "", 0)
		// Remove without addresses removes what the marker lists.
		if err := r.Remove(ctx, dnsreg.Record{Name: rec.Name, Owner: rec.Owner}); err != nil {
			t.Fatal(err)
		}
		wantAddrs(t, h, rec.Name, 300, extra)
		wantPTR(t, h, rec.Addrs[0], "", 0)
		if txt := h.Lookup(t, dns.Fqdn(rec.Name), dns.TypeTXT); len(txt) != 0 {
			t.Fatalf("TXT left at %s: %v", rec.Name, txt)
		}
	})

	t.Run("ConcurrentClaimsOfOneNameHaveOneWinner", func(t *testing.T) {
		r := h.New(t)
		n := name("vm-race")
		const claims = 4
		errs := make(chan error, claims)
		for i := range claims {
			go func() {
				errs <- r.Register(ctx, dnsreg.Record{Name: n, Addrs: []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(80 + i)})}, Owner: owner("claim-race-" + string(rune('a'+i)))})
			}()
		}
		won := 0
		for range claims {
			switch err := <-errs; {
			case err == nil:
				won++
			case !errors.Is(err, dnsreg.ErrNameTaken):
				t.Errorf("a losing Register: %v, want ErrNameTaken", err)
			}
		}
		if won != 1 {
			t.Fatalf("%d of %d concurrent claims of %s won, want 1", won, claims, n)
		}
		txt := h.Lookup(t, dns.Fqdn(n), dns.TypeTXT)
		a := h.Lookup(t, dns.Fqdn(n), dns.TypeA)
		if len(txt) != markerCount(h) || len(a) != 1 {
			t.Fatalf("%s after the race: TXT %v, A %v; want one claim's records", n, txt, a)
		}
	})

	t.Run("AnotherOwnersNameIsNeitherTakenNorRemoved", func(t *testing.T) {
		r := h.New(t)
		theirs := dnsreg.Record{Name: name("vm-theirs"), Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.61")}, Owner: owner("claim-theirs")}
		mustRegister(t, r, theirs)
		mine := dnsreg.Record{Name: theirs.Name, Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.62")}, Owner: owner("claim-mine")}
		if err := r.Register(ctx, mine); !errors.Is(err, dnsreg.ErrNameTaken) {
			t.Fatalf("Register of another claim's name: %v, want ErrNameTaken", err)
		}
		if err := r.Remove(ctx, mine); err != nil {
			t.Fatalf("Remove of another claim's name: %v", err)
		}
		mine.Addrs = theirs.Addrs
		if err := r.Remove(ctx, mine); err != nil {
			t.Fatalf("Remove of another claim's name and address: %v", err)
		}
		wantAddrs(t, h, theirs.Name, 300, theirs.Addrs...)
		wantPTR(t, h, theirs.Addrs[0], theirs.Name, 300)
	})

	t.Run("HandMadeNameIsNotTaken", func(t *testing.T) {
		r := h.New(t)
		n := name("vm-manual")
		h.Add(t, dns.Fqdn(n)+" 300 IN A 192.0.2.71")
		h.Add(t, "72.2.0.192.in-addr.arpa. 300 IN PTR printer."+h.Zone)
		err := r.Register(ctx, dnsreg.Record{Name: n, Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.72")}, Owner: owner("claim-manual")})
		if !errors.Is(err, dnsreg.ErrNameTaken) || !strings.Contains(err.Error(), dns.Fqdn(n)) {
			t.Fatalf("Register over a hand-made name: %v, want ErrNameTaken naming %s", err, n)
		}
		wantAddrs(t, h, n, 300, netip.MustParseAddr("192.0.2.71"))
		// A hand-made reverse name is not taken either.
		other := name("vm-manual-rev")
		err = r.Register(ctx, dnsreg.Record{Name: other, Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.72")}, Owner: owner("claim-manual-rev")})
		if !errors.Is(err, dnsreg.ErrNameTaken) || !strings.Contains(err.Error(), "72.2.0.192.in-addr.arpa.") {
			t.Fatalf("Register over a hand-made PTR: %v, want ErrNameTaken naming the reverse name", err)
		}
		wantPTR(t, h, netip.MustParseAddr("192.0.2.72"), "printer."+h.Zone, 300)
	})

	t.Run("InvalidRecordsAreRefusedBeforeAnyUpdate", func(t *testing.T) {
		r := h.New(t)
		for _, c := range []struct {
			rec  dnsreg.Record
			want error
		}{
			{dnsreg.Record{Name: "vm.elsewhere.test", Addrs: []netip.Addr{v4}, Owner: owner("c")}, dnsreg.ErrOutOfZone},
			{dnsreg.Record{Name: h.Zone, Addrs: []netip.Addr{v4}, Owner: owner("c")}, dnsreg.ErrOutOfZone},
			{dnsreg.Record{Name: name("vm-ttl"), Addrs: []netip.Addr{v4}, TTL: time.Second, Owner: owner("c")}, dnsreg.ErrInvalid},
			{dnsreg.Record{Name: name("vm-ttl"), Addrs: []netip.Addr{v4}, TTL: 48 * time.Hour, Owner: owner("c")}, dnsreg.ErrInvalid},
			{dnsreg.Record{Name: name("vm-noaddr"), Owner: owner("c")}, dnsreg.ErrInvalid},
			{dnsreg.Record{Name: name("vm-noowner"), Addrs: []netip.Addr{v4}}, dnsreg.ErrInvalid},
		} {
			if err := r.Register(ctx, c.rec); !errors.Is(err, c.want) {
				t.Errorf("Register(%+v) = %v, want %v", c.rec, err, c.want)
			}
		}
	})
}

// wantMarkers checks the TXT records at rec's name and at addr's reverse
// name: HyperFleet's markers only when the back-end keeps them in DNS
// (Harness.Markers), else none at all.
func wantMarkers(t *testing.T, h Harness, rec dnsreg.Record, addr netip.Addr) {
	t.Helper()
	txt := h.Lookup(t, dns.Fqdn(rec.Name), dns.TypeTXT)
	rev, _ := dns.ReverseAddr(addr.String())
	revTXT := h.Lookup(t, rev, dns.TypeTXT)
	if !h.Markers {
		if len(txt) != 0 || len(revTXT) != 0 {
			t.Fatalf("TXT at %s = %v and at %s = %v, want none: the back-end keeps no marker in DNS", rec.Name, txt, rev, revTXT)
		}
		return
	}
	if want := []string{dnsreg.OwnerTXT(rec.Owner), dnsreg.AddrsTXT(rec.Addrs)}; len(txt) != 1 || !slices.Equal(txt[0].(*dns.TXT).Txt, want) {
		t.Fatalf("TXT at %s = %v, want the marker %q only", rec.Name, txt, want)
	}
	if len(revTXT) != 1 || !slices.Equal(revTXT[0].(*dns.TXT).Txt, []string{dnsreg.OwnerTXT(rec.Owner)}) {
		t.Fatalf("TXT at %s = %v, want the owner marker only", rev, revTXT)
	}
}

// markerCount is how many TXT records HyperFleet keeps at a registered
// name: its marker, or none.
func markerCount(h Harness) int {
	if h.Markers {
		return 1
	}
	return 0
}

// version is h.Version, else the SOA serials of the forward and the two
// reverse zones.
func version(t *testing.T, h Harness) string {
	t.Helper()
	if h.Version != nil {
		return h.Version(t)
	}
	var out []string
	for _, z := range []string{h.Zone, "2.0.192.in-addr.arpa.", "8.b.d.0.1.0.0.2.ip6.arpa."} {
		soa := h.Lookup(t, z, dns.TypeSOA)
		if len(soa) != 1 {
			t.Fatalf("SOA of %s: %v", z, soa)
		}
		out = append(out, fmt.Sprint(soa[0].(*dns.SOA).Serial))
	}
	return "SOA serials " + strings.Join(out, ", ")
}

func mustRegister(t *testing.T, r dnsreg.Registrar, rec dnsreg.Record) {
	t.Helper()
	if err := r.Register(context.Background(), rec); err != nil {
		t.Fatalf("Register(%s): %v", rec.Name, err)
	}
}

// wantAddrs checks name's A and AAAA records are exactly addrs, with ttl.
func wantAddrs(t *testing.T, h Harness, name string, ttl uint32, addrs ...netip.Addr) {
	t.Helper()
	var got []netip.Addr
	for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
		for _, rr := range h.Lookup(t, dns.Fqdn(name), qt) {
			if rr.Header().Ttl != ttl {
				t.Errorf("%s: TTL %d, want %d", rr, rr.Header().Ttl, ttl)
			}
			switch rr := rr.(type) {
			case *dns.A:
				a, _ := netip.AddrFromSlice(rr.A)
				got = append(got, a.Unmap())
			case *dns.AAAA:
				a, _ := netip.AddrFromSlice(rr.AAAA)
				got = append(got, a)
			}
		}
	}
	slices.SortFunc(got, netip.Addr.Compare)
	want := slices.Clone(addrs)
	slices.SortFunc(want, netip.Addr.Compare)
	if !slices.Equal(got, want) {
		t.Fatalf("addresses of %s = %v, want %v", name, got, want)
	}
}

// wantPTR checks addr's reverse name points to target only, with ttl; no
// PTR when target is empty.
func wantPTR(t *testing.T, h Harness, addr netip.Addr, target string, ttl uint32) {
	t.Helper()
	rev, err := dns.ReverseAddr(addr.String())
	if err != nil {
		t.Fatal(err)
	}
	rrs := h.Lookup(t, rev, dns.TypePTR)
	if target == "" {
		if len(rrs) != 0 {
			t.Fatalf("PTR left at %s: %v", rev, rrs)
		}
		return
	}
	if len(rrs) != 1 || !strings.EqualFold(rrs[0].(*dns.PTR).Ptr, dns.Fqdn(target)) || rrs[0].Header().Ttl != ttl {
		t.Fatalf("PTR at %s = %v, want %s with TTL %d", rev, rrs, target, ttl)
	}
}
