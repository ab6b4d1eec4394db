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
	if r.zone, err = checkZone(cfg.Zone); err != nil {
		return nil, err
	}
	for _, z := range cfg.ReverseZones {
		fz, err := checkZone(z)
		if err != nil {
			return nil, err
		}
		if !dns.IsSubDomain("in-addr.arpa.", fz) && !dns.IsSubDomain("ip6.arpa.", fz) {
			return nil, fmt.Errorf("%w: reverse zone %s is under neither in-addr.arpa nor ip6.arpa", dnsreg.ErrInvalid, z)
		}
		r.reverse = append(r.reverse, fz)
	}
	return r, nil
}

func checkZone(z string) (string, error) {
	if err := dnsreg.CheckName(z); err != nil {
		return "", fmt.Errorf("zone: %w", err)
	}
	return dnsreg.Fqdn(z), nil
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
	if err := dnsreg.CheckName(rec.Name); err != nil {
		return c, fmt.Errorf("record name: %w", err)
	}
	if !dns.IsSubDomain(r.zone, c.name) || c.name == r.zone {
		return c, fmt.Errorf("%w: %s is not a name below zone %s", dnsreg.ErrOutOfZone, c.name, r.zone)
	}
	ttl, err := dnsreg.CheckTTL(rec.TTL, r.ttl)
	if err != nil {
		return c, err
	}
	c.ttl = ttl
	for _, a := range rec.Addrs {
		if !a.IsValid() {
			return c, fmt.Errorf("%w: record %s has an invalid address", dnsreg.ErrInvalid, c.name)
		}
		a = a.Unmap().WithZone("")
		if !slices.Contains(c.addrs, a) {
			c.addrs = append(c.addrs, a)
		}
	}
	if needAddrs && len(c.addrs) == 0 {
		return c, fmt.Errorf("%w: record %s has no address", dnsreg.ErrInvalid, c.name)
	}
	slices.SortFunc(c.addrs, netip.Addr.Compare)
	return c, nil
}

func hdr(name string, t uint16, ttl uint32) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: ttl}
}

func (c checked) txtRR(name string) dns.RR {
	return &dns.TXT{Hdr: hdr(name, dns.TypeTXT, c.ttl), Txt: []string{c.txt}}
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
	fwd, err := r.inspect(ctx, r.zone, c, c.name, []uint16{dns.TypeA, dns.TypeAAAA}, addrRRs)
	if err != nil {
		return err
	}
	if !fwd.same {
		if err := r.claimName(ctx, r.zone, c, c.name, []uint16{dns.TypeA, dns.TypeAAAA}, addrRRs); err != nil {
			return err
		}
	}
	for _, a := range c.addrs {
		zone, rev, ok := r.reverseZone(a)
		if !ok {
			continue
		}
		ptr := []dns.RR{ptrRR(rev, c.name, c.ttl)}
		back, err := r.inspect(ctx, zone, c, rev, []uint16{dns.TypePTR}, ptr)
		if err != nil {
			return err
		}
		if back.same {
			continue
		}
		if err := r.claimName(ctx, zone, c, rev, []uint16{dns.TypePTR}, ptr); err != nil {
			return err
		}
	}
	for _, rr := range fwd.current {
		if a, ok := rrAddr(rr); ok && fwd.owned && !slices.Contains(c.addrs, a) {
			if err := r.releaseReverse(ctx, c, a); err != nil {
				return err
			}
		}
	}
	return nil
}

// state is what a name holds of the types Register writes there.
type state struct {
	// owned: the name carries c's marker.
	owned bool
	// same: it carries only c's marker and exactly the wanted records,
	// all with the wanted TTL.
	same bool
	// current are its records of those types.
	current []dns.RR
}

// inspect reads name's marker and its records of types, and compares them
// with want. It only reads: the update that follows is what is guarded.
func (r *Registrar) inspect(ctx context.Context, zone string, c checked, name string, types []uint16, want []dns.RR) (state, error) {
	var st state
	txts, err := r.query(ctx, zone, name, dns.TypeTXT)
	if err != nil {
		return st, err
	}
	st.owned = hasMarker(txts, c.txt)
	if !st.owned {
		return st, nil
	}
	for _, t := range types {
		rrs, err := r.query(ctx, zone, name, t)
		if err != nil {
			return st, err
		}
		st.current = append(st.current, rrs...)
	}
	st.same = sameRRs(txts, []dns.RR{c.txtRR(name)}) && sameRRs(st.current, want)
	return st, nil
}

// sameRRs reports whether a and b hold the same records with the same
// TTLs, in any order.
func sameRRs(a, b []dns.RR) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !slices.ContainsFunc(b, func(y dns.RR) bool { return dns.IsDuplicate(x, y) && x.Header().Ttl == y.Header().Ttl }) {
			return false
		}
	}
	return true
}

func hasMarker(txts []dns.RR, marker string) bool {
	return slices.ContainsFunc(txts, func(rr dns.RR) bool {
		t, ok := rr.(*dns.TXT)
		return ok && len(t.Txt) == 1 && t.Txt[0] == marker
	})
}

// claimName makes name (in zone) hold c's owner marker and exactly data in
// place of its RRsets of types. It first tries the update that only an
// unused name accepts (prerequisite "name is not in use", RFC 2136 2.4.5):
// a new name is written whole or not at all. When the name is in use, it
// reads the name's TXT RRset; if c's marker is in it the name is ours, and
// the update that replaces its address (or PTR) RRsets carries that TXT
// RRset, exactly as read, as its prerequisite ("RRset exists, value
// dependent", 2.4.2), so that the server refuses it if the name changed
// hands in between. A TXT someone else added next to the marker stays. A
// name without c's marker holds someone else's records and is left alone.
// The loop covers a name removed or created between the attempts.
func (r *Registrar) claimName(ctx context.Context, zone string, c checked, name string, types []uint16, data []dns.RR) error {
	for range 3 {
		m := r.update(zone)
		m.NameNotUsed([]dns.RR{anyRR(name, dns.TypeANY)})
		m.Insert([]dns.RR{c.txtRR(name)})
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
		if !hasMarker(txts, c.txt) {
			// Someone else's name, or ours removed since the first
			// attempt: look again.
			continue
		}
		m = r.update(zone)
		m.Used(txts)
		var rm []dns.RR
		for _, t := range types {
			rm = append(rm, anyRR(name, t))
		}
		m.RemoveRRset(rm)
		// Deleting and re-adding the marker updates its TTL.
		m.Remove([]dns.RR{c.txtRR(name)})
		m.Insert([]dns.RR{c.txtRR(name)})
		m.Insert(data)
		rcode, err = r.exchange(ctx, m, zone, name)
		if err != nil {
			return err
		}
		switch rcode {
		case dns.RcodeSuccess:
			return nil
		case dns.RcodeNXRrset:
			// The TXT RRset changed since it was read: look again.
			continue
		default:
			return r.rcodeError(rcode, nil, zone, name)
		}
	}
	return fmt.Errorf("zone %s: %s: %w (it exists without HyperFleet's TXT marker for %s)", zone, name, dnsreg.ErrNameTaken, c.owner)
}

// Remove implements dnsreg.Registrar. The reverse names go first, so that a
// failure leaves the forward marker, which List finds, in place.
func (r *Registrar) Remove(ctx context.Context, rec dnsreg.Record) error {
	c, err := r.check(rec, false)
	if err != nil {
		return err
	}
	for _, a := range c.addrs {
		if err := r.releaseReverse(ctx, c, a); err != nil {
			return err
		}
	}
	var rrs []dns.RR
	for _, a := range c.addrs {
		rrs = append(rrs, addrRR(c.name, a, 0))
	}
	return r.release(ctx, r.zone, c, c.name, rrs)
}

func (r *Registrar) releaseReverse(ctx context.Context, c checked, a netip.Addr) error {
	zone, rev, ok := r.reverseZone(a)
	if !ok {
		return nil
	}
	return r.release(ctx, zone, c, rev, []dns.RR{ptrRR(rev, c.name, 0)})
}

// release deletes c's marker and the records data from name, only while
// the marker is there. It reads the name's TXT RRset, and when c's marker
// is in it, sends an update whose prerequisite is that RRset exactly as
// read (RFC 2136 2.4.2, value dependent) and which deletes individual
// records (class NONE, 2.5.4), never whole RRsets: an address or TXT
// someone else added to the name stays, and if the name changed hands
// between the read and the update, the server refuses the update
// (NXRRSET) and the name is read again. A name without c's marker holds
// nothing of c's (the marker and the records are always written and
// deleted together), so there is nothing to remove.
func (r *Registrar) release(ctx context.Context, zone string, c checked, name string, data []dns.RR) error {
	for range 3 {
		txts, err := r.query(ctx, zone, name, dns.TypeTXT)
		if err != nil {
			return err
		}
		if !hasMarker(txts, c.txt) {
			return nil
		}
		m := r.update(zone)
		m.Used(txts)
		m.Remove(append([]dns.RR{c.txtRR(name)}, data...))
		rcode, err := r.exchange(ctx, m, zone, name)
		if err != nil {
			return err
		}
		switch rcode {
		case dns.RcodeSuccess:
			return nil
		case dns.RcodeNXRrset:
			continue
		default:
			return r.rcodeError(rcode, nil, zone, name)
		}
	}
	return fmt.Errorf("zone %s: %s: %w (its TXT records kept changing while HyperFleet removed its own)", zone, name, dnsreg.ErrNameTaken)
}

func rrAddr(rr dns.RR) (netip.Addr, bool) {
	switch rr := rr.(type) {
	case *dns.A:
		a, ok := netip.AddrFromSlice(rr.A)
		return a.Unmap(), ok
	case *dns.AAAA:
		return netip.AddrFromSlice(rr.AAAA)
	}
	return netip.Addr{}, false
}

// update starts a signed UPDATE message for zone.
func (r *Registrar) update(zone string) *dns.Msg {
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
