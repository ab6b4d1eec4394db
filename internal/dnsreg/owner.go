package dnsreg

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Owner is who a name's records belong to: a claim of one install.
type Owner struct {
	// Claim is the MachineClaim's UID.
	Claim string
	// Install is the operator id of the HyperFleet install.
	Install string
}

const (
	ownerPrefix  = "hyperfleet-claim="
	installField = " install="
	maxIDLen     = 63
)

func (o Owner) String() string { return "claim " + o.Claim + " of install " + o.Install }

// Validate checks that o can be written as a TXT marker: both ids
// non-empty, at most 63 characters of letters, digits, '-', '_' and '.'.
func (o Owner) Validate() error {
	if err := checkID("owner claim", o.Claim); err != nil {
		return err
	}
	return checkID("owner install", o.Install)
}

func checkID(what, id string) error {
	if id == "" || len(id) > maxIDLen {
		return fmt.Errorf("%w: %s %q must be 1 to %d characters", ErrInvalid, what, id, maxIDLen)
	}
	for _, c := range id {
		if !isLabelChar(c) && c != '.' {
			return fmt.Errorf("%w: %s %q may hold only letters, digits, '-', '_' and '.'", ErrInvalid, what, id)
		}
	}
	return nil
}

// OwnerTXT is the TXT string that marks a name as o's:
// "hyperfleet-claim=<claim> install=<install>". o must be valid.
func OwnerTXT(o Owner) string {
	return ownerPrefix + o.Claim + installField + o.Install
}

// ParseOwnerTXT reads a TXT string written by OwnerTXT; false when s is
// anything else (a TXT record someone else wrote). It accepts exactly what
// OwnerTXT writes for a valid Owner, so a marker that parses is one
// HyperFleet could have written and formats back to the same string.
func ParseOwnerTXT(s string) (Owner, bool) {
	rest, ok := strings.CutPrefix(s, ownerPrefix)
	if !ok {
		return Owner{}, false
	}
	claim, install, ok := strings.Cut(rest, installField)
	if !ok {
		return Owner{}, false
	}
	o := Owner{Claim: claim, Install: install}
	if o.Validate() != nil {
		return Owner{}, false
	}
	return o, true
}

// Matches reports whether the marker owner m is selected by o: the same
// install, and the same claim unless o.Claim is empty.
func (o Owner) Matches(m Owner) bool {
	return m.Install == o.Install && (o.Claim == "" || m.Claim == o.Claim)
}

const addrsPrefix = "addrs="

// AddrsTXT is the second string of the TXT marker at a forward name: the
// addresses HyperFleet wrote there, such as
// "addrs=192.0.2.10,2001:db8::10" (sorted, each once). With it, Remove
// and a sweep delete exactly those address records, whatever else someone
// added to the name, and never leave one behind.
func AddrsTXT(addrs []netip.Addr) string {
	sorted := slices.Clone(addrs)
	slices.SortFunc(sorted, netip.Addr.Compare)
	sorted = slices.Compact(sorted)
	parts := make([]string, len(sorted))
	for i, a := range sorted {
		parts[i] = a.String()
	}
	return addrsPrefix + strings.Join(parts, ",")
}

// ParseAddrsTXT reads a string written by AddrsTXT; false for anything
// else. Only what AddrsTXT writes parses: addresses in their canonical
// form, without zones or IPv4-mapped forms, sorted, each once.
func ParseAddrsTXT(s string) ([]netip.Addr, bool) {
	rest, ok := strings.CutPrefix(s, addrsPrefix)
	if !ok || rest == "" {
		return nil, false
	}
	var addrs []netip.Addr
	for p := range strings.SplitSeq(rest, ",") {
		a, err := netip.ParseAddr(p)
		if err != nil || a.String() != p || a.Zone() != "" || a.Is4In6() {
			return nil, false
		}
		if n := len(addrs); n > 0 && addrs[n-1].Compare(a) >= 0 {
			return nil, false
		}
		addrs = append(addrs, a)
	}
	return addrs, true
}
