package ipam

import "math/bits"

// bitmapMaxSize is the largest segment kept as a bitmap: 2^20 addresses
// (an IPv4 /12) cost 128 KiB plus a 2 KiB summary. Larger segments, which
// in practice means IPv6, keep the sorted runs of allocated addresses
// instead, so a /64 costs nothing until addresses are taken from it.
const bitmapMaxSize = 1 << 20

// segment is one range of Pool.Allocatable with its allocation state.
// Offsets are relative to first.
type segment struct {
	first, last u128
	size        u128
	used        u128
	bits        *bitmap // segments of at most bitmapMaxSize addresses
	runs        runSet  // larger segments
}

func newSegment(r Range) segment {
	s := segment{first: toU128(r.First), last: toU128(r.Last)}
	s.size = rangeSize(s.first, s.last)
	if s.size.hi == 0 && s.size.lo <= bitmapMaxSize {
		s.bits = newBitmap(s.size.lo)
	}
	return s
}

func (s *segment) full() bool { return s.used == s.size }

// lowestFree is the lowest address of the segment nobody holds.
func (s *segment) lowestFree() (u128, bool) {
	if s.full() {
		return u128{}, false
	}
	if s.bits != nil {
		off, ok := s.bits.firstClear()
		return s.first.add(u128{lo: off}), ok
	}
	return s.runs.lowestFree(s.first, s.last)
}

// set marks x held. The allocator's owner map guarantees x was free.
func (s *segment) set(x u128) {
	if s.bits != nil {
		s.bits.set(x.sub(s.first).lo)
	} else {
		s.runs.add(x)
	}
	s.used = s.used.inc()
}

// clear marks x free. The allocator's owner map guarantees x was held.
func (s *segment) clear(x u128) {
	if s.bits != nil {
		s.bits.clear(x.sub(s.first).lo)
	} else {
		s.runs.remove(x)
	}
	s.used = s.used.dec()
}

// bitmap is a two-level bitmap: words holds one bit per address (1 =
// held), and bit i of summary says words[i] is all ones. Finding the lowest
// free address scans the summary, 64 words per summary word, so a /16
// needs at most 16 summary reads and a 2^20 segment 256.
type bitmap struct {
	words   []uint64
	summary []uint64
}

func newBitmap(n uint64) *bitmap {
	nw := (n + 63) / 64
	b := &bitmap{words: make([]uint64, nw), summary: make([]uint64, (nw+63)/64)}
	// Bits past n and summary bits past the last word start set, so the
	// scans never report them as free and no bounds check is needed there.
	if r := n % 64; r != 0 {
		b.words[nw-1] = ^uint64(0) << r
	}
	if r := nw % 64; r != 0 {
		b.summary[len(b.summary)-1] = ^uint64(0) << r
	}
	return b
}

func (b *bitmap) firstClear() (uint64, bool) {
	for i, s := range b.summary {
		if s == ^uint64(0) {
			continue
		}
		w := uint64(i)*64 + uint64(bits.TrailingZeros64(^s))
		return w*64 + uint64(bits.TrailingZeros64(^b.words[w])), true
	}
	return 0, false
}

func (b *bitmap) set(i uint64) {
	w := i / 64
	b.words[w] |= 1 << (i % 64)
	if b.words[w] == ^uint64(0) {
		b.summary[w/64] |= 1 << (w % 64)
	}
}

func (b *bitmap) clear(i uint64) {
	w := i / 64
	b.words[w] &^= 1 << (i % 64)
	b.summary[w/64] &^= 1 << (w % 64)
}

// run is an inclusive span of held addresses.
type run struct{ first, last u128 }

// runSet holds the held addresses of a large segment as sorted, disjoint,
// non-adjacent runs. Lowest-first allocation keeps the runs few (a release
// opens a hole the next allocation fills), so the slice stays short and its
// memmove on insert is cheap; there are never more runs than held
// addresses, which are bounded by the number of MachineClaims.
type runSet struct{ runs []run }

// after returns the number of runs starting at or below x: runs[i-1] is the
// run that may contain x, runs[i] the first run above x.
func (rs *runSet) after(x u128) int {
	lo, hi := 0, len(rs.runs)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if rs.runs[m].first.cmp(x) <= 0 {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

func (rs *runSet) lowestFree(first, last u128) (u128, bool) {
	if len(rs.runs) == 0 || rs.runs[0].first != first {
		return first, true
	}
	if rs.runs[0].last == last {
		return u128{}, false
	}
	return rs.runs[0].last.inc(), true
}

func (rs *runSet) add(x u128) {
	i := rs.after(x)
	joinLeft := i > 0 && rs.runs[i-1].last.inc() == x
	joinRight := i < len(rs.runs) && x.inc() == rs.runs[i].first
	switch {
	case joinLeft && joinRight:
		rs.runs[i-1].last = rs.runs[i].last
		rs.runs = append(rs.runs[:i], rs.runs[i+1:]...)
	case joinLeft:
		rs.runs[i-1].last = x
	case joinRight:
		rs.runs[i].first = x
	default:
		rs.runs = append(rs.runs, run{})
		copy(rs.runs[i+1:], rs.runs[i:])
		rs.runs[i] = run{first: x, last: x}
	}
}

func (rs *runSet) remove(x u128) {
	i := rs.after(x) - 1
	r := rs.runs[i]
	switch {
	case r.first == x && r.last == x:
		rs.runs = append(rs.runs[:i], rs.runs[i+1:]...)
	case r.first == x:
		rs.runs[i].first = x.inc()
	case r.last == x:
		rs.runs[i].last = x.dec()
	default:
		rs.runs = append(rs.runs, run{})
		copy(rs.runs[i+2:], rs.runs[i+1:])
		rs.runs[i] = run{first: r.first, last: x.dec()}
		rs.runs[i+1] = run{first: x.inc(), last: r.last}
	}
}
