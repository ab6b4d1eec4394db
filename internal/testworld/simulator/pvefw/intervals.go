package pvefw

import (
	"net/netip"
	"sort"
)

// span is an inclusive address range of one IP version.
type span struct{ lo, hi netip.Addr }

func lastAddr(p netip.Prefix) netip.Addr {
	p = p.Masked()
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// entryRange is one IPSet entry resolved: a network and whether it excludes.
type entryRange struct {
	p       netip.Prefix
	nomatch bool
}

// effective is what a hash:net set with nomatch entries matches: an address
// is in the set when the most specific entry holding it is not nomatch.
// The result is sorted, disjoint and merged.
func effective(entries []entryRange) []span {
	var points []netip.Addr
	for _, e := range entries {
		points = append(points, e.p.Masked().Addr())
		if n := lastAddr(e.p).Next(); n.IsValid() {
			points = append(points, n)
		}
	}
	sort.Slice(points, func(i, j int) bool { return points[i].Less(points[j]) })
	var out []span
	for i, pt := range points {
		if i > 0 && pt == points[i-1] {
			continue
		}
		best := -1
		for j, e := range entries {
			if e.p.Contains(pt) && (best < 0 || e.p.Bits() >= entries[best].p.Bits()) {
				best = j
			}
		}
		if best < 0 || entries[best].nomatch {
			continue
		}
		// The segment runs to the next boundary: the most specific entry
		// changes only at a boundary.
		hi := lastAddr(entries[best].p)
		for _, q := range points[i+1:] {
			if q != pt {
				hi = q.Prev()
				break
			}
		}
		if n := len(out); n > 0 && out[n-1].hi.Next() == pt {
			out[n-1].hi = hi
			continue
		}
		out = append(out, span{pt, hi})
	}
	return out
}

// merge unions ranges (of one version) into sorted, disjoint spans.
func merge(in []span) []span {
	sort.Slice(in, func(i, j int) bool { return in[i].lo.Less(in[j].lo) })
	var out []span
	for _, s := range in {
		if n := len(out); n > 0 {
			last := &out[n-1]
			if !last.hi.Next().IsValid() || !last.hi.Next().Less(s.lo) {
				if last.hi.Less(s.hi) {
					last.hi = s.hi
				}
				continue
			}
		}
		out = append(out, s)
	}
	return out
}

func (s span) String() string {
	if s.lo == s.hi {
		return s.lo.String()
	}
	return s.lo.String() + "-" + s.hi.String()
}
