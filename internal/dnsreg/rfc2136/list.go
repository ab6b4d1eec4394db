package rfc2136

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
)

// query asks the server for name's (in zone) records of type t, signed;
// none when the name or type does not exist.
func (r *Registrar) query(ctx context.Context, zone, name string, t uint16) ([]dns.RR, error) {
	m := new(dns.Msg)
	m.SetQuestion(name, t)
	m.RecursionDesired = false
	m.SetTsig(r.key.Name, r.key.Algorithm, 300, time.Now().Unix())
	resp, _, err := r.client(r.transport).ExchangeContext(ctx, m, r.server)
	if resp != nil && resp.Rcode != dns.RcodeSuccess && resp.Rcode != dns.RcodeNameError {
		return nil, r.rcodeError(resp.Rcode, resp, zone, name)
	}
	if err != nil {
		return nil, r.transportError(err, zone, name)
	}
	var rrs []dns.RR
	for _, rr := range resp.Answer {
		if rr.Header().Rrtype == t && strings.EqualFold(rr.Header().Name, name) {
			rrs = append(rrs, rr)
		}
	}
	return rrs, nil
}

// List implements dnsreg.Registrar. It transfers (AXFR, RFC 5936) the
// forward zone and every reverse zone, signed with the key, so the server
// must allow the key to transfer them as well as to update them.
func (r *Registrar) List(ctx context.Context, owner dnsreg.Owner) ([]dnsreg.Record, error) {
	if err := checkSelector(owner); err != nil {
		return nil, err
	}
	found := map[string]*dnsreg.Record{}
	get := func(name string, o dnsreg.Owner) *dnsreg.Record {
		rec := found[name+" "+dnsreg.OwnerTXT(o)]
		if rec == nil {
			rec = &dnsreg.Record{Name: name, Owner: o}
			found[name+" "+dnsreg.OwnerTXT(o)] = rec
		}
		return rec
	}
	for _, zone := range append([]string{r.zone}, r.reverse...) {
		rrs, err := r.transfer(ctx, zone)
		if err != nil {
			return nil, err
		}
		byName := map[string][]dns.RR{}
		for _, rr := range rrs {
			n := strings.ToLower(rr.Header().Name)
			byName[n] = append(byName[n], rr)
		}
		for name, rrs := range byName {
			for _, m := range markers(rrs) {
				if !owner.Matches(m.owner) {
					continue
				}
				if zone == r.zone {
					// The addresses are those the marker lists:
					// what HyperFleet wrote, not what else the
					// name holds.
					rec := get(name, m.owner)
					rec.TTL = time.Duration(m.txt.Hdr.Ttl) * time.Second
					rec.Addrs = append(rec.Addrs, markerAddrs(m.txt)...)
					continue
				}
				addr, ok := ParseReverseName(name)
				if !ok {
					continue
				}
				for _, rr := range rrs {
					if p, ok := rr.(*dns.PTR); ok {
						rec := get(strings.ToLower(p.Ptr), m.owner)
						if rec.TTL == 0 {
							rec.TTL = time.Duration(m.txt.Hdr.Ttl) * time.Second
						}
						rec.Addrs = append(rec.Addrs, addr)
					}
				}
			}
		}
	}
	out := make([]dnsreg.Record, 0, len(found))
	for _, k := range slices.Sorted(maps.Keys(found)) {
		rec := *found[k]
		slices.SortFunc(rec.Addrs, netip.Addr.Compare)
		rec.Addrs = slices.Compact(rec.Addrs)
		out = append(out, rec)
	}
	return out, nil
}

func checkSelector(o dnsreg.Owner) error {
	if o.Claim == "" {
		o.Claim = "any"
	}
	return o.Validate()
}

type marker struct {
	owner dnsreg.Owner
	txt   *dns.TXT
}

// markers are the HyperFleet owner markers among rrs.
func markers(rrs []dns.RR) []marker {
	var ms []marker
	for _, rr := range rrs {
		t, ok := rr.(*dns.TXT)
		if !ok || len(t.Txt) == 0 || len(t.Txt) > 2 {
			continue
		}
		if o, ok := dnsreg.ParseOwnerTXT(t.Txt[0]); ok {
			ms = append(ms, marker{owner: o, txt: t})
		}
	}
	return ms
}

// transfer returns the records of zone by AXFR over TCP, signed.
func (r *Registrar) transfer(ctx context.Context, zone string) ([]dns.RR, error) {
	m := new(dns.Msg)
	m.SetAxfr(zone)
	m.SetTsig(r.key.Name, r.key.Algorithm, 300, time.Now().Unix())
	tr := &dns.Transfer{
		DialTimeout:  r.timeout,
		ReadTimeout:  r.timeout,
		WriteTimeout: r.timeout,
		TsigSecret:   map[string]string{r.key.Name: r.key.Secret},
	}
	ch, err := tr.In(m, r.server)
	if err != nil {
		return nil, r.transportError(err, zone, "zone transfer")
	}
	var rrs []dns.RR
	for {
		select {
		case <-ctx.Done():
			// Drain in the background: In's goroutine ends at its timeouts.
			go func() {
				for range ch {
				}
			}()
			return nil, fmt.Errorf("zone %s: zone transfer from %s: %w", zone, r.server, ctx.Err())
		case env, ok := <-ch:
			if !ok {
				return rrs, nil
			}
			if env.Error != nil {
				return nil, r.transferError(env.Error, zone)
			}
			rrs = append(rrs, env.RR...)
		}
	}
}

func (r *Registrar) transferError(err error, zone string) error {
	if strings.Contains(err.Error(), "bad xfr rcode") || errors.Is(err, dns.ErrAuth) || errors.Is(err, dns.ErrSig) {
		// miekg/dns reports the RCODE only in its text, and drops an
		// unsigned refusal (the answer to a key the server does not
		// accept) as bad authentication.
		return fmt.Errorf("zone %s: DNS server %s refused the zone transfer (%w); HyperFleet reads its records back by AXFR, so key %s must be allowed to transfer the zone (BIND: allow-transfer { key %s; }; Knot: an acl with action transfer): %w",
			zone, r.server, err, r.key.Name, strings.TrimSuffix(r.key.Name, "."), dnsreg.ErrRefused)
	}
	return r.transportError(err, zone, "zone transfer")
}

// ParseReverseName returns the address whose reverse name (in-addr.arpa or
// ip6.arpa, as dns.ReverseAddr writes it) name is; false for any other
// name, including a partial one (a network's name rather than an
// address's).
func ParseReverseName(name string) (netip.Addr, bool) {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if rest, ok := strings.CutSuffix(name, ".in-addr.arpa"); ok {
		labels := strings.Split(rest, ".")
		if len(labels) != 4 {
			return netip.Addr{}, false
		}
		slices.Reverse(labels)
		a, err := netip.ParseAddr(strings.Join(labels, "."))
		if err != nil || !a.Is4() {
			return netip.Addr{}, false
		}
		return a, true
	}
	if rest, ok := strings.CutSuffix(name, ".ip6.arpa"); ok {
		labels := strings.Split(rest, ".")
		if len(labels) != 32 {
			return netip.Addr{}, false
		}
		var b [16]byte
		for i, l := range labels {
			if len(l) != 1 {
				return netip.Addr{}, false
			}
			v := strings.IndexByte("0123456789abcdef", l[0])
			if v < 0 {
				return netip.Addr{}, false
			}
			// labels[0] is the lowest nibble of the last byte.
			pos := 31 - i
			if pos%2 == 0 {
				b[pos/2] |= byte(v) << 4
			} else {
				b[pos/2] |= byte(v)
			}
		}
		a := netip.AddrFrom16(b)
		if a.Is4In6() {
			// dns.ReverseAddr writes a mapped address's name under
			// in-addr.arpa; this name is no address's.
			return netip.Addr{}, false
		}
		return a, true
	}
	return netip.Addr{}, false
}
