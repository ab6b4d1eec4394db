package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Range is an inclusive span of addresses of one family, parsed from one
// address entry of an IPPool.
type Range struct {
	// First is the lowest address of the range.
	First netip.Addr
	// Last is the highest address of the range, equal to First for a single
	// address.
	Last netip.Addr
	// Prefix is the entry's CIDR when it was written as one (10.0.0.0/24,
	// 10.0.0.5/32), and the zero Prefix for a first-last range. Allocation
	// skips the network and broadcast addresses of IPv4 CIDRs, so the form
	// the user chose matters.
	Prefix netip.Prefix
}

// Family is the range's address family.
func (r Range) Family() Family { return familyOf(r.First) }

// Contains reports whether a lies in the range.
func (r Range) Contains(a netip.Addr) bool {
	return a.IsValid() && a.Is4() == r.First.Is4() && r.First.Compare(a) <= 0 && a.Compare(r.Last) <= 0
}

// Overlaps reports whether the two ranges share an address.
func (r Range) Overlaps(o Range) bool {
	return r.First.Is4() == o.First.Is4() && r.First.Compare(o.Last) <= 0 && o.First.Compare(r.Last) <= 0
}

// String writes the range in the entry syntax ParseRange reads back.
func (r Range) String() string {
	switch {
	case r.Prefix.IsValid():
		return r.Prefix.String()
	case r.First == r.Last:
		return netip.PrefixFrom(r.First, r.First.BitLen()).String()
	default:
		return r.First.String() + "-" + r.Last.String()
	}
}

// exampleForms is appended to errors about unreadable entries so the user
// sees the three accepted spellings without opening the docs.
const exampleForms = "a CIDR (10.0.0.0/24), a range (10.0.0.10-10.0.0.50) or a single address (10.0.0.5/32)"

// ParseRange parses one address entry: a CIDR (every address in it), a
// first-last range of one family (both ends included, first <= last), or a
// single address written as /32 or /128. It reads the forms the IPPool
// CRD's CEL rules admit and adds what CEL cannot check or lets through by
// accident: range order (CEL cannot compare IPv6 addresses), and host bits
// after a CIDR's prefix length (10.0.0.5/24: one address or the /24?).
// Zones and IPv4-mapped IPv6 addresses are refused, as Kubernetes' CEL ip()
// refuses them.
func ParseRange(s string) (Range, error) {
	if s == "" {
		return Range{}, errors.New("empty entry; write " + exampleForms)
	}
	// No IP address spelling contains '-', so the dash alone tells a range
	// from a CIDR.
	if start, end, ok := strings.Cut(s, "-"); ok {
		return parseDashRange(s, start, end)
	}
	return parseCIDR(s)
}

func parseDashRange(s, start, end string) (Range, error) {
	if strings.Contains(end, "-") {
		return Range{}, fmt.Errorf("%q has more than one \"-\"; write a range as first-last, such as 10.0.0.10-10.0.0.50", s)
	}
	first, err := parseHostAddr(start)
	if err != nil {
		return Range{}, fmt.Errorf("range %s: start %w", s, err)
	}
	last, err := parseHostAddr(end)
	if err != nil {
		return Range{}, fmt.Errorf("range %s: end %w", s, err)
	}
	if first.Is4() != last.Is4() {
		return Range{}, fmt.Errorf("range %s mixes IPv4 and IPv6; both ends of a range must be of one family", s)
	}
	// CEL can compare IPv4 ranges only by string tricks and IPv6 not at all,
	// so the order check lives here.
	if last.Less(first) {
		return Range{}, fmt.Errorf("range %s ends before it starts; write the lower address first", s)
	}
	return Range{First: first, Last: last}, nil
}

func parseCIDR(s string) (Range, error) {
	addrPart, bitsPart, ok := strings.Cut(s, "/")
	if !ok {
		if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
			return Range{}, fmt.Errorf("%s has no prefix length; write a single address as %s/%d", s, s, a.BitLen())
		}
		return Range{}, fmt.Errorf("%q is not %s", s, exampleForms)
	}
	a, err := netip.ParseAddr(addrPart)
	if err != nil {
		return Range{}, fmt.Errorf("%q is not %s", s, exampleForms)
	}
	if err := checkPlainAddr(a); err != nil {
		return Range{}, err
	}
	n, err := parsePrefixLen(bitsPart, a.BitLen())
	if err != nil {
		return Range{}, fmt.Errorf("%s: %w", s, err)
	}
	p := netip.PrefixFrom(a, n)
	if m := p.Masked(); m.Addr() != a {
		// net.ParseCIDR would silently mask "10.0.0.5/24" to the whole /24;
		// the user more likely meant one address, so ask instead of guessing.
		return Range{}, fmt.Errorf("%s has bits set after the prefix length; write %s for the whole network or %s/%d for one address", s, m, a, a.BitLen())
	}
	return Range{First: p.Addr(), Last: lastOf(p), Prefix: p}, nil
}

// parsePrefixLen accepts only plain decimal digits without a leading zero,
// like netip.ParsePrefix, so "/024" and "/+24" are refused.
func parsePrefixLen(s string, maxBits int) (int, error) {
	bad := fmt.Errorf("prefix length %q is not a number from 0 to %d", s, maxBits)
	if s == "" || len(s) > 3 || (len(s) > 1 && s[0] == '0') {
		return 0, bad
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, bad
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n > maxBits {
		return 0, bad
	}
	return n, nil
}

// parseHostAddr reads a bare address (a range end, a gateway, a
// nameserver).
func parseHostAddr(s string) (netip.Addr, error) {
	if strings.Contains(s, "/") {
		return netip.Addr{}, fmt.Errorf("%q has a prefix length; write the address alone, such as 10.0.0.1", s)
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%q is not an IP address", s)
	}
	if err := checkPlainAddr(a); err != nil {
		return netip.Addr{}, err
	}
	return a, nil
}

func checkPlainAddr(a netip.Addr) error {
	if a.Zone() != "" {
		return fmt.Errorf("%s has an IPv6 zone; zones are not allowed", a)
	}
	if a.Is4In6() {
		return fmt.Errorf("%s is an IPv4-mapped IPv6 address; write it as the IPv4 address %s", a, a.Unmap())
	}
	return nil
}

// ParseAllocatedAddress reads the address of an IPAllocation as recorded in
// a MachineClaim's status ("10.0.0.5/24", or a bare address). The prefix
// length is the interface's and is dropped.
func ParseAllocatedAddress(s string) (netip.Addr, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("allocated address %q: %w", s, err)
		}
		return canon(p.Addr()), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("allocated address %q: %w", s, err)
	}
	return canon(a), nil
}

func lastOf(p netip.Prefix) netip.Addr {
	p = p.Masked()
	hostBits := uint(p.Addr().BitLen() - p.Bits())
	u := toU128(p.Addr())
	// Set the host bits: ones in the low hostBits positions of 128.
	var mask u128
	switch {
	case hostBits >= 128:
		mask = maxU128
	case hostBits >= 64:
		mask = u128{hi: 1<<(hostBits-64) - 1, lo: ^uint64(0)}
	default:
		mask = u128{lo: 1<<hostBits - 1}
	}
	return u128{hi: u.hi | mask.hi, lo: u.lo | mask.lo}.addr(familyOf(p.Addr()))
}

// specialBlock is a block no VM may be given an address from.
type specialBlock struct {
	prefix netip.Prefix
	what   string
}

var specialBlocks = []specialBlock{
	{netip.MustParsePrefix("0.0.0.0/8"), "\"this network\" addresses"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback addresses"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast addresses"},
	{netip.MustParsePrefix("255.255.255.255/32"), "the limited broadcast address"},
	{netip.MustParsePrefix("::/128"), "the unspecified address"},
	{netip.MustParsePrefix("::1/128"), "the loopback address"},
	{netip.MustParsePrefix("::ffff:0:0/96"), "IPv4-mapped addresses"},
	{netip.MustParsePrefix("ff00::/8"), "multicast addresses"},
}

// special returns the first special block r overlaps.
func special(r Range) (specialBlock, bool) {
	for _, b := range specialBlocks {
		br := Range{First: b.prefix.Addr(), Last: lastOf(b.prefix)}
		if br.Overlaps(r) {
			return b, true
		}
	}
	return specialBlock{}, false
}

// mergeRanges sorts ranges and joins overlapping and adjacent ones. The
// result carries no Prefix: it describes address space, not entries.
func mergeRanges(rs []Range) []Range {
	out := make([]Range, 0, len(rs))
	for _, r := range rs {
		out = append(out, Range{First: r.First, Last: r.Last})
	}
	slices.SortFunc(out, func(a, b Range) int { return a.First.Compare(b.First) })
	merged := out[:0]
	for _, r := range out {
		if n := len(merged); n > 0 {
			prev := &merged[n-1]
			// Next() of the highest address is the zero Addr, which never
			// equals a valid First, so no overflow case is needed.
			if r.First.Compare(prev.Last) <= 0 || prev.Last.Next() == r.First {
				if r.Last.Compare(prev.Last) > 0 {
					prev.Last = r.Last
				}
				continue
			}
		}
		merged = append(merged, r)
	}
	return merged
}

// subtractRange removes cut from the sorted, disjoint ranges rs.
func subtractRange(rs []Range, cut Range) []Range {
	out := make([]Range, 0, len(rs)+1)
	for _, r := range rs {
		if !r.Overlaps(cut) {
			out = append(out, r)
			continue
		}
		if r.First.Less(cut.First) {
			out = append(out, Range{First: r.First, Last: cut.First.Prev()})
		}
		if cut.Last.Less(r.Last) {
			out = append(out, Range{First: cut.Last.Next(), Last: r.Last})
		}
	}
	return out
}
