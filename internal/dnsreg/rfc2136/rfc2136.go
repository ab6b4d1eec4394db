// Package rfc2136 is the dnsreg back-end for DNS servers that take dynamic
// UPDATE (RFC 2136) signed with TSIG (RFC 8945): BIND, Knot DNS, PowerDNS,
// Windows DNS and most others. See package dnsreg for the ownership marker
// and how records are found again.
//
// Every change is one UPDATE message per zone, which the server applies
// atomically or not at all, guarded by prerequisites (RFC 2136 section 2.4)
// so that the server itself refuses a change when the name is not in the
// state HyperFleet last saw; there is no window between a check and a write
// in which another writer's record could be overwritten or deleted.
package rfc2136

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
)

// Transports.
const (
	TCP = "tcp"
	UDP = "udp"
)

// DefaultTimeout bounds one exchange with the server when Config.Timeout
// is zero.
const DefaultTimeout = 5 * time.Second

// Option and credential names read by Factory.
const (
	OptionServer    = "server"
	OptionTransport = "transport"
	OptionTimeout   = "timeout"
	CredentialKey   = "tsigKey"
)

// Config is one server and the zones it holds.
type Config struct {
	// Server is the primary's address, host:port.
	Server string
	// Transport is TCP (the default) or UDP. Updates go over TCP by
	// default: an update message with several addresses and a TSIG can
	// outgrow a UDP answer, and TCP is not open to spoofed replies. Zone
	// transfers (List) always use TCP.
	Transport string
	// Timeout bounds one exchange; zero means DefaultTimeout.
	Timeout time.Duration
	// Key signs every message.
	Key TSIGKey
	// Zone is the forward zone; ReverseZones the in-addr.arpa and
	// ip6.arpa zones PTRs go to.
	Zone         string
	ReverseZones []string
	// TTL is the default TTL; zero means dnsreg.DefaultTTL.
	TTL time.Duration
}

// Registrar is the rfc2136 dnsreg.Registrar.
type Registrar struct {
	server    string
	transport string
	timeout   time.Duration
	key       TSIGKey
	zone      string
	reverse   []string
	ttl       time.Duration
}

var _ dnsreg.Registrar = (*Registrar)(nil)

// Factory builds a Registrar from the provider-neutral configuration: the
// options server (host:port, required), transport (tcp or udp) and timeout
// (a Go duration), and the credential tsigKey (see ParseTSIGKey).
func Factory(cfg dnsreg.Config) (dnsreg.Registrar, error) {
	c := Config{
		Server:       cfg.Options[OptionServer],
		Transport:    cfg.Options[OptionTransport],
		Zone:         cfg.Zone,
		ReverseZones: cfg.ReverseZones,
		TTL:          cfg.TTL,
	}
	if t := cfg.Options[OptionTimeout]; t != "" {
		d, err := time.ParseDuration(t)
		if err != nil {
			return nil, fmt.Errorf("%w: option %s: %w", dnsreg.ErrInvalid, OptionTimeout, err)
		}
		c.Timeout = d
	}
	secret, ok := cfg.Credentials[CredentialKey]
	if !ok {
		return nil, fmt.Errorf("%w: credential %s (the TSIG key) is missing", dnsreg.ErrInvalid, CredentialKey)
	}
	k, err := ParseTSIGKey(string(secret))
	if err != nil {
		return nil, fmt.Errorf("credential %s: %w", CredentialKey, err)
	}
	c.Key = k
	return New(c)
}

// New checks cfg and returns its Registrar.
func New(cfg Config) (*Registrar, error) {
	r := &Registrar{server: cfg.Server, transport: cfg.Transport, timeout: cfg.Timeout, ttl: cfg.TTL}
	if _, _, err := net.SplitHostPort(cfg.Server); err != nil {
		return nil, fmt.Errorf("%w: server %q is not host:port: %w", dnsreg.ErrInvalid, cfg.Server, err)
	}
	switch cfg.Transport {
	case "":
		r.transport = TCP
	case TCP, UDP:
	default:
		return nil, fmt.Errorf("%w: transport %q is neither tcp nor udp", dnsreg.ErrInvalid, cfg.Transport)
	}
	if r.timeout == 0 {
		r.timeout = DefaultTimeout
	}
	if r.timeout < 0 || r.timeout > time.Minute {
		return nil, fmt.Errorf("%w: timeout %s is not between 0 and 1m", dnsreg.ErrInvalid, cfg.Timeout)
	}
	if r.ttl == 0 {
		r.ttl = dnsreg.DefaultTTL
	}
	if _, err := dnsreg.CheckTTL(r.ttl, 0); err != nil {
		return nil, err
	}
	k, err := cfg.Key.normalize()
	if err != nil {
		return nil, err
	}
	r.key = k
	if r.zone, r.reverse, err = dnsreg.CheckZones(cfg.Zone, cfg.ReverseZones); err != nil {
		return nil, err
	}
	return r, nil
}

// reverseZone returns the configured reverse zone that holds addr's
// reverse name, the longest if several do; false when none does.
func (r *Registrar) reverseZone(addr netip.Addr) (zone, name string, ok bool) {
	name, err := dns.ReverseAddr(addr.String())
	if err != nil {
		return "", "", false
	}
	for _, z := range r.reverse {
		if dns.IsSubDomain(z, name) && len(z) > len(zone) {
			zone = z
		}
	}
	return zone, name, zone != ""
}

// checked is a Record validated and normalized.
type checked struct {
	name  string
	addrs []netip.Addr
	ttl   uint32
	owner dnsreg.Owner
	txt   string
}

func (r *Registrar) check(rec dnsreg.Record, needAddrs bool) (checked, error) {
	c := checked{name: dnsreg.Fqdn(rec.Name), owner: rec.Owner}
	if err := rec.Owner.Validate(); err != nil {
		return c, err
	}
	c.txt = dnsreg.OwnerTXT(rec.Owner)
	var err error
	if c.name, c.ttl, c.addrs, err = dnsreg.CheckRecord(rec, r.zone, r.ttl, needAddrs); err != nil {
		return c, err
	}
	if len(dnsreg.AddrsTXT(c.addrs)) > 255 {
		// One TXT string holds at most 255 bytes.
		return c, fmt.Errorf("%w: record %s has too many addresses to list in its marker (%d)", dnsreg.ErrInvalid, c.name, len(c.addrs))
	}
	return c, nil
}

func hdr(name string, t uint16, ttl uint32) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: ttl}
}

// forwardMarker is the marker at c's name: its owner and the addresses
// written there.
func (c checked) forwardMarker() dns.RR {
	return &dns.TXT{Hdr: hdr(c.name, dns.TypeTXT, c.ttl), Txt: []string{c.txt, dnsreg.AddrsTXT(c.addrs)}}
}

// reverseMarker is the marker at a reverse name: its owner only, as the
// name is the address and the PTR points to c's name.
func (c checked) reverseMarker(rev string) dns.RR {
	return &dns.TXT{Hdr: hdr(rev, dns.TypeTXT, c.ttl), Txt: []string{c.txt}}
}

func addrRR(name string, a netip.Addr, ttl uint32) dns.RR {
	if a.Is4() {
		return &dns.A{Hdr: hdr(name, dns.TypeA, ttl), A: a.AsSlice()}
	}
	return &dns.AAAA{Hdr: hdr(name, dns.TypeAAAA, ttl), AAAA: a.AsSlice()}
}

func ptrRR(rev, target string, ttl uint32) dns.RR {
	return &dns.PTR{Hdr: hdr(rev, dns.TypePTR, ttl), Ptr: target}
}

// anyRR is the RR (name, type) with no data, as RRset prerequisites and
// RRset deletions name it.
func anyRR(name string, t uint16) dns.RR {
	return &dns.ANY{Hdr: dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET}}
}

// Register implements dnsreg.Registrar.
func (r *Registrar) Register(ctx context.Context, rec dnsreg.Record) error {
	c, err := r.check(rec, true)
	if err != nil {
		return err
	}
	var addrRRs []dns.RR
	for _, a := range c.addrs {
		addrRRs = append(addrRRs, addrRR(c.name, a, c.ttl))
	}
	// What the name holds now: no update is sent when it already is as
	// asked (a repeated Register costs queries only), and the PTRs of
	// addresses it no longer has are removed afterwards.
	fwd, err := r.inspect(ctx, r.zone, c, c.name, c.forwardMarker(), []uint16{dns.TypeA, dns.TypeAAAA}, addrRRs, false)
	if err != nil {
		return err
	}
	if !fwd.same {
		// An owned name's old addresses are those its marker lists:
		// they are deleted one by one, so an address someone else
		// added to the name stays.
		drop := func(m *dns.Msg, old *dns.TXT) {
			var stale []dns.RR
			for _, a := range markerAddrs(old) {
				stale = append(stale, addrRR(c.name, a, 0))
			}
			if len(stale) > 0 {
				m.Remove(stale)
			}
		}
		if err := r.claimName(ctx, r.zone, c, c.name, c.forwardMarker(), addrRRs, drop); err != nil {
			return err
		}
	}
	for _, a := range c.addrs {
		zone, rev, ok := r.reverseZone(a)
		if !ok {
			continue
		}
		ptr := []dns.RR{ptrRR(rev, c.name, c.ttl)}
		back, err := r.inspect(ctx, zone, c, rev, c.reverseMarker(rev), []uint16{dns.TypePTR}, ptr, true)
		if err != nil {
			return err
		}
		if back.same {
			continue
		}
		// An owned reverse name is the address of this claim's VM: its
		// PTRs are replaced as a whole.
		drop := func(m *dns.Msg, _ *dns.TXT) { m.RemoveRRset([]dns.RR{anyRR(rev, dns.TypePTR)}) }
		if err := r.claimName(ctx, zone, c, rev, c.reverseMarker(rev), ptr, drop); err != nil {
			return err
		}
	}
	for _, a := range markerAddrs(fwd.marker) {
		if !slices.Contains(c.addrs, a) {
			if err := r.releaseReverse(ctx, c, a); err != nil {
				return err
			}
		}
	}
	return nil
}

// state is what a name holds of the types Register writes there.
type state struct {
	// marker is c's marker at the name as found; nil when there is none.
	marker *dns.TXT
	// same: the name holds exactly the wanted marker and the wanted
	// records, with the wanted TTLs.
	same bool
}

// inspect reads name's marker and its records of types, and compares them
// with the wanted marker and records: exactly those when exact, else at
// least those (other addresses may share a forward name). It only reads:
// the update that follows is what is guarded.
func (r *Registrar) inspect(ctx context.Context, zone string, c checked, name string, marker dns.RR, types []uint16, want []dns.RR, exact bool) (state, error) {
	var st state
	txts, err := r.query(ctx, zone, name, dns.TypeTXT)
	if err != nil {
		return st, err
	}
	st.marker = findMarker(txts, c.txt)
	if st.marker == nil {
		return st, nil
	}
	var current []dns.RR
	for _, t := range types {
		rrs, err := r.query(ctx, zone, name, t)
		if err != nil {
			return st, err
		}
		current = append(current, rrs...)
	}
	st.same = sameRR(st.marker, marker) && holds(current, want) && (!exact || len(current) == len(want))
	return st, nil
}

// sameRR reports whether a and b are the same record with the same TTL.
func sameRR(a, b dns.RR) bool {
	return dns.IsDuplicate(a, b) && a.Header().Ttl == b.Header().Ttl
}

// holds reports whether every record of want is in rrs, with its TTL.
func holds(rrs, want []dns.RR) bool {
	for _, w := range want {
		if !slices.ContainsFunc(rrs, func(rr dns.RR) bool { return sameRR(rr, w) }) {
			return false
		}
	}
	return true
}

// findMarker returns the TXT record among txts that marks its name as
// owner's (owner is OwnerTXT's string); nil when there is none.
func findMarker(txts []dns.RR, owner string) *dns.TXT {
	for _, rr := range txts {
		if t, ok := rr.(*dns.TXT); ok && len(t.Txt) >= 1 && t.Txt[0] == owner {
			return t
		}
	}
	return nil
}

// markerAddrs are the addresses a forward marker lists; none for nil, a
// reverse marker or a list that does not parse.
func markerAddrs(m *dns.TXT) []netip.Addr {
	if m == nil || len(m.Txt) != 2 {
		return nil
	}
	addrs, _ := dnsreg.ParseAddrsTXT(m.Txt[1])
	return addrs
}

// claimName makes name (in zone) hold marker and data. It first tries the
// update that only an unused name accepts (prerequisite "name is not in
// use", RFC 2136 2.4.5): a new name is written whole or not at all. When
// the name is in use, it reads the name's TXT RRset; if c's marker is in
// it the name is c's, and the update that replaces the old marker with the
// new one, deletes what drop adds for the old marker (the records written
// last time) and adds data carries that TXT RRset, exactly as read, as its
// prerequisite ("RRset exists, value dependent", 2.4.2): the server
// refuses it if the name changed hands in between. A name without c's
// marker holds someone else's records and is left alone. The loop covers a
// name removed or created between the attempts.
func (r *Registrar) claimName(ctx context.Context, zone string, c checked, name string, marker dns.RR, data []dns.RR, drop func(m *dns.Msg, old *dns.TXT)) error {
	for range 3 {
		m := newUpdate(zone)
		m.NameNotUsed([]dns.RR{anyRR(name, dns.TypeANY)})
		m.Insert([]dns.RR{dns.Copy(marker)})
		m.Insert(data)
		rcode, err := r.exchange(ctx, m, zone, name)
		if err != nil {
			return err
		}
		if rcode == dns.RcodeSuccess {
			return nil
		}
		if rcode != dns.RcodeYXDomain {
			return r.rcodeError(rcode, nil, zone, name)
		}

		txts, err := r.query(ctx, zone, name, dns.TypeTXT)
		if err != nil {
			return err
		}
		old := findMarker(txts, c.txt)
		if old == nil {
			// Someone else's name, or ours removed since the first
			// attempt: look again.
			continue
		}
		m = newUpdate(zone)
		drop(m, old)
		// Used and Remove rewrite the headers of the records they are
		// given, hence the copies.
		m.Remove([]dns.RR{dns.Copy(old)})
		m.Used(copyRRs(txts))
		m.Insert([]dns.RR{dns.Copy(marker)})
		m.Insert(data)
		if changed, err := r.exchangeGuarded(ctx, m, zone, name); err != nil || !changed {
			return err
		}
	}
	return fmt.Errorf("zone %s: %s: %w (it exists without HyperFleet's TXT marker for %s)", zone, name, dnsreg.ErrNameTaken, c.owner)
}

func copyRRs(rrs []dns.RR) []dns.RR {
	out := make([]dns.RR, len(rrs))
	for i, rr := range rrs {
		out[i] = dns.Copy(rr)
	}
	return out
}

// Remove implements dnsreg.Registrar. The addresses removed are those
// the name's marker lists (what Register wrote), with rec.Addrs for their
// PTRs too. The reverse names go first, so that a failure leaves the
// forward marker, which List finds, in place.
func (r *Registrar) Remove(ctx context.Context, rec dnsreg.Record) error {
	c, err := r.check(rec, false)
	if err != nil {
		return err
	}
	txts, err := r.query(ctx, r.zone, c.name, dns.TypeTXT)
	if err != nil {
		return err
	}
	addrs := slices.Clone(c.addrs)
	for _, a := range markerAddrs(findMarker(txts, c.txt)) {
		if !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	for _, a := range addrs {
		if err := r.releaseReverse(ctx, c, a); err != nil {
			return err
		}
	}
	return r.release(ctx, r.zone, c, c.name, func(old *dns.TXT) []dns.RR {
		var rrs []dns.RR
		for _, a := range markerAddrs(old) {
			rrs = append(rrs, addrRR(c.name, a, 0))
		}
		return rrs
	})
}

func (r *Registrar) releaseReverse(ctx context.Context, c checked, a netip.Addr) error {
	zone, rev, ok := r.reverseZone(a)
	if !ok {
		return nil
	}
	return r.release(ctx, zone, c, rev, func(*dns.TXT) []dns.RR { return []dns.RR{ptrRR(rev, c.name, 0)} })
}

// release deletes c's marker from name and the records data names for it,
// only while the marker is there. It reads the name's TXT RRset, and when
// c's marker is in it, sends an update whose prerequisite is that RRset
// exactly as read (RFC 2136 2.4.2, value dependent) and which deletes
// individual records (class NONE, 2.5.4), never whole RRsets: an address
// or TXT someone else added to the name stays, and if the name changed
// hands between the read and the update, the server refuses the update
// (NXRRSET) and the name is read again. A name without c's marker holds
// nothing of c's (the marker and the records are always written and
// deleted together), so there is nothing to remove.
func (r *Registrar) release(ctx context.Context, zone string, c checked, name string, data func(old *dns.TXT) []dns.RR) error {
	for range 3 {
		txts, err := r.query(ctx, zone, name, dns.TypeTXT)
		if err != nil {
			return err
		}
		old := findMarker(txts, c.txt)
		if old == nil {
			return nil
		}
		m := newUpdate(zone)
		m.Remove(append([]dns.RR{dns.Copy(old)}, data(old)...))
		m.Used(copyRRs(txts))
		if changed, err := r.exchangeGuarded(ctx, m, zone, name); err != nil || !changed {
			return err
		}
	}
	return fmt.Errorf("zone %s: %s: %w (its TXT records kept changing while HyperFleet removed its own)", zone, name, dnsreg.ErrNameTaken)
}

// newUpdate starts an UPDATE message for zone; exchange signs it.
// exchangeGuarded sends an update whose prerequisite is the name's TXT
// RRset exactly as read (claimName, release). changed is true when the
// server refused it because that RRset changed since (NXRRSET): the caller
// reads it again and retries. Any other refusal is an error.
func (r *Registrar) exchangeGuarded(ctx context.Context, m *dns.Msg, zone, name string) (changed bool, err error) {
	rcode, err := r.exchange(ctx, m, zone, name)
	if err != nil {
		return false, err
	}
	switch rcode {
	case dns.RcodeSuccess:
		return false, nil
	case dns.RcodeNXRrset:
		return true, nil
	default:
		return false, r.rcodeError(rcode, nil, zone, name)
	}
}

func newUpdate(zone string) *dns.Msg {
	m := new(dns.Msg)
	m.SetUpdate(zone)
	return m
}

func (r *Registrar) client(network string) *dns.Client {
	return &dns.Client{
		Net:        network,
		Timeout:    r.timeout,
		TsigSecret: map[string]string{r.key.Name: r.key.Secret},
	}
}

// exchange signs and sends m and returns the answer's RCODE; err is set
// when there was no usable answer, or the server refused the signature or
// the zone (see rcodeError).
func (r *Registrar) exchange(ctx context.Context, m *dns.Msg, zone, name string) (int, error) {
	m.SetTsig(r.key.Name, r.key.Algorithm, 300, time.Now().Unix())
	resp, _, err := r.client(r.transport).ExchangeContext(ctx, m, r.server)
	if resp != nil && resp.Rcode != dns.RcodeSuccess {
		// An error answer to a bad signature is itself unsigned, so its
		// verification fails too; the RCODE is what explains it.
		switch resp.Rcode {
		case dns.RcodeYXDomain, dns.RcodeNXRrset, dns.RcodeYXRrset, dns.RcodeNameError:
			// A failed prerequisite: a signed answer to act on.
			if err != nil {
				return 0, r.transportError(err, zone, name)
			}
			return resp.Rcode, nil
		}
		return resp.Rcode, r.rcodeError(resp.Rcode, resp, zone, name)
	}
	if err != nil {
		return 0, r.transportError(err, zone, name)
	}
	return resp.Rcode, nil
}

func (r *Registrar) transportError(err error, zone, name string) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("zone %s: %s: no answer from DNS server %s over %s within %s: %w", zone, name, r.server, r.transport, r.timeout, err)
	}
	if errors.Is(err, dns.ErrSig) || errors.Is(err, dns.ErrTime) || errors.Is(err, dns.ErrSecret) {
		return fmt.Errorf("zone %s: %s: the answer of DNS server %s is not signed with key %s (%w): %w", zone, name, r.server, r.key.Name, err, dnsreg.ErrRefused)
	}
	return fmt.Errorf("zone %s: %s: DNS server %s: %w", zone, name, r.server, err)
}

// rcodeError explains an error RCODE: which setting on either side to
// check. resp, when set, is the answer, whose TSIG error says which part
// of the key the server rejected.
func (r *Registrar) rcodeError(rcode int, resp *dns.Msg, zone, name string) error {
	tsigErr := 0
	if resp != nil {
		if t := resp.IsTsig(); t != nil {
			tsigErr = int(t.Error)
		}
	}
	at := fmt.Sprintf("zone %s: %s: DNS server %s answered %s", zone, name, r.server, rcodeName(rcode))
	switch {
	case tsigErr == dns.RcodeBadSig:
		return fmt.Errorf("%s (BADSIG): the secret of TSIG key %s does not match the server's: %w", at, r.key.Name, dnsreg.ErrRefused)
	case tsigErr == dns.RcodeBadKey:
		// Knot also answers BADKEY for a key it knows when no acl of the
		// zone names it.
		return fmt.Errorf("%s (BADKEY): the server does not accept TSIG key %s with algorithm %s; check the key name and algorithm, and that the zone's policy names the key (BIND: allow-update; Knot: an acl with the key and action update): %w",
			at, r.key.Name, strings.TrimSuffix(r.key.Algorithm, "."), dnsreg.ErrRefused)
	case tsigErr == dns.RcodeBadTime:
		return fmt.Errorf("%s (BADTIME): this host's clock and the server's differ by more than 5 minutes: %w", at, dnsreg.ErrRefused)
	case rcode == dns.RcodeNotAuth:
		return fmt.Errorf("%s: the server is not authoritative for zone %s, or rejected the TSIG key %s (check the zone name, that the server is its primary, and the key name, algorithm and secret): %w",
			at, zone, r.key.Name, dnsreg.ErrRefused)
	case rcode == dns.RcodeRefused:
		return fmt.Errorf("%s: the zone's update policy does not let key %s change it (BIND: allow-update or update-policy naming the key; Knot: an acl with action update for the key, on the zone): %w",
			at, r.key.Name, dnsreg.ErrRefused)
	case rcode == dns.RcodeNotZone:
		return fmt.Errorf("%s: the name is not in zone %s: %w", at, zone, dnsreg.ErrOutOfZone)
	case rcode == dns.RcodeServerFailure:
		return errclass.Errorf(errclass.ClassTransient, "DNSServerFailure", "%s: the server failed to apply the change; it is retried", at)
	case rcode == dns.RcodeNotImplemented:
		return fmt.Errorf("%s: the server does not implement dynamic update (RFC 2136): %w", at, dnsreg.ErrRefused)
	}
	return errclass.Errorf(errclass.ClassTransient, "DNSUpdateFailed", "%s", at)
}

func rcodeName(rcode int) string {
	if s, ok := dns.RcodeToString[rcode]; ok {
		return s
	}
	return fmt.Sprintf("RCODE %d", rcode)
}
