package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
)

// Spec is the part of an IPPool's spec this package reads. The controller
// copies the API fields into it, which keeps this package free of
// Kubernetes imports.
type Spec struct {
	Addresses         []string
	ExcludedAddresses []string
	Prefix            int32
	Gateways          []string
	Nameservers       []string
	SearchDomains     []string
}

// Pool is a validated IPPool spec and the address space it hands out.
type Pool struct {
	// Family is the family of every address in the pool.
	Family Family
	// Network is the subnet of the pool: spec.prefix around the first
	// address entry. Every entry and every gateway lies inside it.
	Network netip.Prefix
	// Entries are spec.addresses, parsed, in spec order.
	Entries []Range
	// Excluded are spec.excludedAddresses, parsed, in spec order.
	Excluded []Range
	// Gateways are spec.gateways, parsed, in spec order.
	Gateways []netip.Addr
	// Nameservers are spec.nameservers, parsed, in spec order.
	Nameservers []netip.Addr
	// SearchDomains are spec.searchDomains as given.
	SearchDomains []string
	// Allocatable is what the allocator hands out, sorted, disjoint and
	// non-adjacent: the entries minus the exclusions, the gateways, the
	// network and broadcast addresses of IPv4 CIDR entries and of the
	// network (prefix < 31), and the subnet-router anycast address of IPv6
	// CIDR entries and of the network (prefix < 127, RFC 4291 2.6.1: every
	// router on the link answers it).
	Allocatable []Range
	// Warnings are legal but probably unintended settings, worth an event.
	Warnings []string
}

// Prefix is the prefix length configured on a VM's interface.
func (p *Pool) Prefix() int { return p.Network.Bits() }

// Gateway is the first gateway, or the zero Addr when the pool has none.
func (p *Pool) Gateway() netip.Addr {
	if len(p.Gateways) == 0 {
		return netip.Addr{}
	}
	return p.Gateways[0]
}

// WithPrefix is the address as a VM's interface carries it and as
// status.network.ipAllocations[].address records it, such as 10.0.0.5/24.
func (p *Pool) WithPrefix(a netip.Addr) netip.Prefix {
	return netip.PrefixFrom(a, p.Network.Bits())
}

// Contains reports whether the pool hands out a (whether or not it is
// allocated now).
func (p *Pool) Contains(a netip.Addr) bool {
	a = canon(a)
	i, found := slices.BinarySearchFunc(p.Allocatable, a, func(r Range, a netip.Addr) int {
		if r.Last.Less(a) {
			return -1
		}
		if a.Less(r.First) {
			return 1
		}
		return 0
	})
	return found && p.Allocatable[i].Contains(a)
}

// ErrInvalidSpec is matched (errors.Is) by every error ParsePool returns.
// An invalid spec never becomes valid by retrying: the user has to edit it.
var ErrInvalidSpec = errors.New("invalid IPPool spec")

// FieldError is one problem with one field of a spec.
type FieldError struct {
	// Field is the path of the field, such as spec.addresses[2].
	Field string
	// Err says what is wrong and what to write instead.
	Err error
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }

// SpecError lists every problem ParsePool found, so a user fixes them all
// in one edit instead of one per reconcile.
type SpecError struct {
	Errors []*FieldError
}

// Error writes one line per field error.
func (e *SpecError) Error() string {
	lines := make([]string, len(e.Errors))
	for i, fe := range e.Errors {
		lines[i] = fe.Error()
	}
	return strings.Join(lines, "\n")
}

// Is makes errors.Is(err, ErrInvalidSpec) true.
func (e *SpecError) Is(target error) bool { return target == ErrInvalidSpec }

// Unwrap exposes the field errors to errors.As.
func (e *SpecError) Unwrap() []error {
	errs := make([]error, len(e.Errors))
	for i, fe := range e.Errors {
		errs[i] = fe
	}
	return errs
}

// Field ranks order errors as the fields appear in the spec.
const (
	rankAddresses = iota
	rankExcluded
	rankPrefix
	rankGateways
	rankNameservers
	rankSearchDomains
)

var fieldNames = [...]string{
	rankAddresses:     "spec.addresses",
	rankExcluded:      "spec.excludedAddresses",
	rankPrefix:        "spec.prefix",
	rankGateways:      "spec.gateways",
	rankNameservers:   "spec.nameservers",
	rankSearchDomains: "spec.searchDomains",
}

type rankedError struct {
	rank, index int
	err         *FieldError
}

type collector struct{ errs []rankedError }

// add records an error on field rank at index (-1: the field as a whole).
func (c *collector) add(rank, index int, err error) {
	name := fieldNames[rank]
	if index >= 0 {
		name = fmt.Sprintf("%s[%d]", name, index)
	}
	c.errs = append(c.errs, rankedError{rank: rank, index: index, err: &FieldError{Field: name, Err: err}})
}

func (c *collector) err() error {
	if len(c.errs) == 0 {
		return nil
	}
	// Checks run in passes (parse, then overlap, then subnet), so sort to
	// list problems in the order of the spec.
	slices.SortStableFunc(c.errs, func(a, b rankedError) int {
		if a.rank != b.rank {
			return a.rank - b.rank
		}
		return a.index - b.index
	})
	se := &SpecError{Errors: make([]*FieldError, len(c.errs))}
	for i, re := range c.errs {
		se.Errors[i] = re.err
	}
	return se
}

// searchDomainRE is the CRD's pattern for spec.searchDomains.
var searchDomainRE = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]*[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// ParsePool validates an IPPool spec and computes the address space it
// hands out. On failure the error is a *SpecError listing every problem,
// each naming its field and index; it matches ErrInvalidSpec.
//
// Beyond the CRD's own validation it enforces: ranges written low to high,
// no host bits after a CIDR's prefix length, no overlap between address
// entries, one family, one subnet (every entry and gateway inside
// spec.prefix around the first entry: a VM's interface is configured with
// that prefix and must reach its gateway on-link), no special-purpose
// addresses (loopback, multicast, unspecified), gateways that are host
// addresses, and no duplicates.
func ParsePool(spec Spec) (*Pool, error) {
	var c collector
	p := &Pool{}

	// Entries. The first readable entry sets the family and the subnet.
	first := -1
	var entryIdx []int
	if len(spec.Addresses) == 0 {
		c.add(rankAddresses, -1, errors.New("at least one address entry is required"))
	}
	for i, s := range spec.Addresses {
		r, err := ParseRange(s)
		if err != nil {
			c.add(rankAddresses, i, err)
			continue
		}
		if first < 0 {
			first = i
			p.Family = r.Family()
		} else if r.Family() != p.Family {
			c.add(rankAddresses, i, fmt.Errorf("%s is %s but spec.addresses[%d] is %s; a pool has one family: create one pool per family", s, r.Family(), first, p.Family))
			continue
		}
		if b, bad := special(r); bad {
			c.add(rankAddresses, i, fmt.Errorf("%s includes %s (%s), which a VM cannot use", s, b.what, b.prefix))
			continue
		}
		p.Entries = append(p.Entries, r)
		entryIdx = append(entryIdx, i)
	}

	// Overlapping entries would make one address count twice and make it
	// unclear which entry an exclusion was meant for. Sweep in address
	// order, comparing with the entry reaching furthest so far.
	byFirst := make([]int, len(p.Entries))
	for k := range byFirst {
		byFirst[k] = k
	}
	slices.SortFunc(byFirst, func(a, b int) int { return p.Entries[a].First.Compare(p.Entries[b].First) })
	reach := -1
	for _, k := range byFirst {
		if reach >= 0 && p.Entries[k].First.Compare(p.Entries[reach].Last) <= 0 {
			earlier, later := min(entryIdx[k], entryIdx[reach]), max(entryIdx[k], entryIdx[reach])
			c.add(rankAddresses, later, fmt.Errorf("%s overlaps spec.addresses[%d] (%s); list each address once", spec.Addresses[later], earlier, spec.Addresses[earlier]))
		}
		if reach < 0 || p.Entries[reach].Last.Less(p.Entries[k].Last) {
			reach = k
		}
	}

	// Prefix and subnet.
	subnetKnown := false
	switch {
	case spec.Prefix < 1 || spec.Prefix > 128:
		c.add(rankPrefix, -1, fmt.Errorf("%d is not a prefix length; use 1 to 32 for IPv4 or 1 to 128 for IPv6", spec.Prefix))
	case first >= 0 && p.Family == IPv4 && spec.Prefix > 32:
		c.add(rankPrefix, -1, fmt.Errorf("%d is longer than an IPv4 address; use 1 to 32", spec.Prefix))
	case len(p.Entries) > 0:
		subnetKnown = true
		p.Network = netip.PrefixFrom(p.Entries[0].First, int(spec.Prefix)).Masked()
		for k, r := range p.Entries {
			if !p.Network.Contains(r.First) || !p.Network.Contains(r.Last) {
				c.add(rankAddresses, entryIdx[k], fmt.Errorf("%s does not fit in the pool's network %s (spec.prefix %d around spec.addresses[%d]); a pool is one subnet: widen spec.prefix or create one pool per subnet", spec.Addresses[entryIdx[k]], p.Network, spec.Prefix, entryIdx[0]))
			}
		}
	}

	// Exclusions may overlap each other and may cover gateways: they only
	// take addresses away, so the union is what counts.
	for i, s := range spec.ExcludedAddresses {
		r, err := ParseRange(s)
		if err != nil {
			c.add(rankExcluded, i, err)
			continue
		}
		if first >= 0 && r.Family() != p.Family {
			c.add(rankExcluded, i, fmt.Errorf("%s is %s but the pool is %s; exclude addresses of the pool's family", s, r.Family(), p.Family))
			continue
		}
		p.Excluded = append(p.Excluded, r)
		if !slices.ContainsFunc(p.Entries, r.Overlaps) && len(p.Entries) > 0 {
			p.Warnings = append(p.Warnings, fmt.Sprintf("spec.excludedAddresses[%d]: %s excludes nothing: no entry of spec.addresses contains it", i, s))
		}
	}

	var broadcast, network netip.Addr
	if subnetKnown {
		network = p.Network.Addr()
		broadcast = lastOf(p.Network)
	}
	p.Gateways = eachOnce(&c, rankGateways, spec.Gateways, "gateway", func(s string) (netip.Addr, error) {
		a, err := parseHostAddr(s)
		switch {
		case err != nil:
			return a, err
		case first >= 0 && familyOf(a) != p.Family:
			return a, fmt.Errorf("%s is %s but the pool is %s; use a gateway of the pool's family", s, familyOf(a), p.Family)
		case subnetKnown && !p.Network.Contains(a):
			return a, fmt.Errorf("%s is outside the pool's network %s; a VM reaches its gateway on-link: use a gateway inside %s or widen spec.prefix", s, p.Network, p.Network)
		case subnetKnown && p.Family == IPv4 && p.Network.Bits() < 31 && (a == network || a == broadcast):
			return a, fmt.Errorf("%s is the network or broadcast address of %s, not a host; use a router's address", s, p.Network)
		}
		if b, bad := special(Range{First: a, Last: a}); bad {
			return a, fmt.Errorf("%s is reserved (%s, %s); use a router's address", s, b.what, b.prefix)
		}
		return a, nil
	})

	// Nameservers may be of either family: a resolver can be reached
	// through the gateway whatever the pool's family.
	p.Nameservers = eachOnce(&c, rankNameservers, spec.Nameservers, "nameserver", func(s string) (netip.Addr, error) {
		a, err := parseHostAddr(s)
		if err == nil && (a.IsUnspecified() || a.IsMulticast()) {
			err = fmt.Errorf("%s cannot be a resolver; use the address of a DNS server", s)
		}
		return a, err
	})

	p.SearchDomains = eachOnce(&c, rankSearchDomains, spec.SearchDomains, "search domain", func(s string) (string, error) {
		if len(s) > 253 || !searchDomainRE.MatchString(s) || slices.ContainsFunc(strings.Split(s, "."), func(l string) bool { return len(l) > 63 }) {
			return s, fmt.Errorf("%q is not a DNS domain; use lower-case labels of letters, digits and '-' joined by dots, such as ci.example.com", s)
		}
		return s, nil
	})

	if err := c.err(); err != nil {
		return nil, err
	}
	p.Allocatable = allocatable(p)
	if len(p.Allocatable) == 0 {
		p.Warnings = append(p.Warnings, "spec.addresses: no address is left to hand out once exclusions, gateways and network, broadcast and anycast addresses are removed; every allocation will fail")
	}
	return p, nil
}

// eachOnce checks every entry of list, the field rank, and returns the
// usable ones: check parses an entry or says why it cannot be used, and an
// entry equal to one already taken is refused (what names the entries in
// the fix). A repeat of a usable entry is usable itself, so it is only
// ever refused as a repeat.
func eachOnce[T comparable](c *collector, rank int, list []string, what string, check func(s string) (T, error)) []T {
	var out []T
	for i, s := range list {
		v, err := check(s)
		switch {
		case err != nil:
			c.add(rank, i, err)
		case slices.Contains(out, v):
			c.add(rank, i, fmt.Errorf("%s is listed twice; list each %s once", s, what))
		default:
			out = append(out, v)
		}
	}
	return out
}

// allocatable computes Pool.Allocatable from a validated pool.
func allocatable(p *Pool) []Range {
	rs := mergeRanges(p.Entries)
	cut := func(a netip.Addr) { rs = subtractRange(rs, Range{First: a, Last: a}) }
	reserved := func(pfx netip.Prefix) {
		switch {
		case pfx.Addr().Is4() && pfx.Bits() < 31:
			// RFC 3021 /31s and /32s have neither network nor broadcast.
			cut(pfx.Masked().Addr())
			cut(lastOf(pfx))
		case pfx.Addr().Is6() && pfx.Bits() < 127:
			// RFC 6164 /127s have no subnet-router anycast address.
			cut(pfx.Masked().Addr())
		}
	}
	for _, e := range p.Entries {
		if e.Prefix.IsValid() {
			reserved(e.Prefix)
		}
	}
	reserved(p.Network)
	for _, x := range p.Excluded {
		rs = subtractRange(rs, x)
	}
	for _, g := range p.Gateways {
		cut(g)
	}
	return rs
}
