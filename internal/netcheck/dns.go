package netcheck

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/miekg/dns"
)

// ErrMismatch is the error of a lookup whose answer is not what the VM
// has: the server answered, with other records or none.
var ErrMismatch = errors.New("DNS answer does not match")

// Forward checks that the A and AAAA records of name at server are
// exactly want (no address missing, none extra). The query asks for
// recursion: the servers checked are the resolvers the VMs are given.
func Forward(ctx context.Context, server netip.AddrPort, name string, want []netip.Addr) error {
	name = dns.Fqdn(name)
	var got []netip.Addr
	for _, qtype := range []uint16{dns.TypeA, dns.TypeAAAA} {
		rrs, err := query(ctx, server, name, qtype)
		if err != nil {
			return err
		}
		for _, rr := range rrs {
			var a netip.Addr
			switch v := rr.(type) {
			case *dns.A:
				a, _ = netip.AddrFromSlice(v.A)
			case *dns.AAAA:
				a, _ = netip.AddrFromSlice(v.AAAA)
			default:
				continue
			}
			if a = a.Unmap(); !slices.Contains(got, a) {
				got = append(got, a)
			}
		}
	}
	want = slices.Clone(want)
	slices.SortFunc(got, netip.Addr.Compare)
	slices.SortFunc(want, netip.Addr.Compare)
	if !slices.Equal(got, want) {
		return fmt.Errorf("%w: %s at %s has %s, want %s", ErrMismatch, name, server, list(got), list(want))
	}
	return nil
}

// Reverse checks that the PTR records of addr at server name name.
func Reverse(ctx context.Context, server netip.AddrPort, addr netip.Addr, name string) error {
	rev, err := dns.ReverseAddr(addr.String())
	if err != nil {
		return fmt.Errorf("reverse name of %s: %w", addr, err)
	}
	rrs, err := query(ctx, server, rev, dns.TypePTR)
	if err != nil {
		return err
	}
	var got []string
	for _, rr := range rrs {
		if p, ok := rr.(*dns.PTR); ok {
			if strings.EqualFold(p.Ptr, dns.Fqdn(name)) {
				return nil
			}
			got = append(got, p.Ptr)
		}
	}
	if len(got) == 0 {
		got = []string{"no PTR record"}
	}
	return fmt.Errorf("%w: %s (%s) at %s has %s, want %s", ErrMismatch, rev, addr, server, strings.Join(got, ", "), dns.Fqdn(name))
}

// query asks server for name's records of qtype over UDP, again over TCP
// when the answer is truncated, and returns the answer section. A name
// that does not exist has no records; any other failure is an error.
func query(ctx context.Context, server netip.AddrPort, name string, qtype uint16) ([]dns.RR, error) {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.RecursionDesired = true
	var r *dns.Msg
	var err error
	for _, network := range []string{"udp", "tcp"} {
		c := &dns.Client{Net: network}
		r, _, err = c.ExchangeContext(ctx, m, server.String())
		if err != nil {
			return nil, fmt.Errorf("no answer from DNS server %s to %s %s over %s: %w", server, name, dns.TypeToString[qtype], network, err)
		}
		if !r.Truncated {
			break
		}
	}
	switch r.Rcode {
	case dns.RcodeSuccess, dns.RcodeNameError:
		return r.Answer, nil
	}
	return nil, fmt.Errorf("DNS server %s answered %s %s with %s", server, name, dns.TypeToString[qtype], dns.RcodeToString[r.Rcode])
}

func list(addrs []netip.Addr) string {
	if len(addrs) == 0 {
		return "no address"
	}
	parts := make([]string, len(addrs))
	for i, a := range addrs {
		parts[i] = a.String()
	}
	return strings.Join(parts, ", ")
}
