package ipam

import (
	"encoding/binary"
	"math"
	"math/bits"
	"net/netip"
)

// Family is an IP address family. A pool holds addresses of one family only.
type Family int

const (
	// IPv4 is the family of 32-bit addresses.
	IPv4 Family = 4
	// IPv6 is the family of 128-bit addresses.
	IPv6 Family = 6
)

// String names the family as users write it in messages.
func (f Family) String() string {
	switch f {
	case IPv4:
		return "IPv4"
	case IPv6:
		return "IPv6"
	default:
		return "no family"
	}
}

func familyOf(a netip.Addr) Family {
	if a.Is4() {
		return IPv4
	}
	return IPv6
}

// canon strips what makes two spellings of one on-wire address compare
// unequal: a zone, and the IPv4-mapped IPv6 form. Every address entering the
// allocator goes through it, so "::ffff:10.0.0.5" can never be handed out
// next to "10.0.0.5".
func canon(a netip.Addr) netip.Addr {
	return a.WithZone("").Unmap()
}

// u128 is an address as an unsigned 128-bit integer (IPv4 in the low 32
// bits). Sizes and offsets of an IPv6 /64 do not fit in 64 bits, and big.Int
// would allocate on every operation of the hot path.
type u128 struct{ hi, lo uint64 }

var maxU128 = u128{hi: math.MaxUint64, lo: math.MaxUint64}

func toU128(a netip.Addr) u128 {
	if a.Is4() {
		b := a.As4()
		return u128{lo: uint64(binary.BigEndian.Uint32(b[:]))}
	}
	b := a.As16()
	return u128{hi: binary.BigEndian.Uint64(b[:8]), lo: binary.BigEndian.Uint64(b[8:])}
}

func (u u128) addr(f Family) netip.Addr {
	if f == IPv4 {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(u.lo))
		return netip.AddrFrom4(b)
	}
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], u.hi)
	binary.BigEndian.PutUint64(b[8:], u.lo)
	return netip.AddrFrom16(b)
}

func (u u128) cmp(v u128) int {
	switch {
	case u.hi < v.hi:
		return -1
	case u.hi > v.hi:
		return 1
	case u.lo < v.lo:
		return -1
	case u.lo > v.lo:
		return 1
	default:
		return 0
	}
}

// add wraps around on overflow; callers that can overflow use addSat.
func (u u128) add(v u128) u128 {
	lo, carry := bits.Add64(u.lo, v.lo, 0)
	hi, _ := bits.Add64(u.hi, v.hi, carry)
	return u128{hi: hi, lo: lo}
}

// addSat saturates at 2^128-1: a sum of range sizes only feeds counts, and a
// count that stops growing is better than one that wraps to zero.
func (u u128) addSat(v u128) u128 {
	lo, carry := bits.Add64(u.lo, v.lo, 0)
	hi, carry := bits.Add64(u.hi, v.hi, carry)
	if carry != 0 {
		return maxU128
	}
	return u128{hi: hi, lo: lo}
}

// sub wraps around; callers only subtract a smaller value.
func (u u128) sub(v u128) u128 {
	lo, borrow := bits.Sub64(u.lo, v.lo, 0)
	hi, _ := bits.Sub64(u.hi, v.hi, borrow)
	return u128{hi: hi, lo: lo}
}

func (u u128) inc() u128 { return u.add(u128{lo: 1}) }
func (u u128) dec() u128 { return u.sub(u128{lo: 1}) }

// int64Sat caps at math.MaxInt64, the bound of the IPPool status counters.
func (u u128) int64Sat() int64 {
	if u.hi != 0 || u.lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(u.lo)
}

// rangeSize is last-first+1, saturating for the one range that holds 2^128
// addresses (::/0).
func rangeSize(first, last u128) u128 {
	d := last.sub(first)
	if d == maxU128 {
		return maxU128
	}
	return d.inc()
}
