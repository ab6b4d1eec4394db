package rfc2136

import (
	"context"
	"fmt"

	"github.com/miekg/dns"

	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
)

var _ dnsreg.Checker = (*Registrar)(nil)

// Check implements dnsreg.Checker: it asks the server for the SOA record
// of the forward zone and of every reverse zone, each query signed with
// the key. A server that answers with the SOA is authoritative for the
// zone and verified the signature (a bad key or secret is answered with a
// TSIG error, which query turns into ErrRefused). Whether the key may
// update the zone is not asked, as only an update would tell: the first
// registration does, and the claim's condition reports it.
func (r *Registrar) Check(ctx context.Context) error {
	for _, zone := range append([]string{r.zone}, r.reverse...) {
		rrs, err := r.query(ctx, zone, zone, dns.TypeSOA)
		if err != nil {
			return err
		}
		if len(rrs) == 0 {
			return fmt.Errorf("%w: DNS server %s has no SOA record for zone %s: it is not the zone's primary, or the zone name is wrong", dnsreg.ErrRefused, r.server, zone)
		}
	}
	return nil
}
