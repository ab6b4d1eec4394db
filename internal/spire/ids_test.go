package spire_test

import (
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"pgregory.net/rapid"

	"github.com/hyperfleet/hyperfleet/internal/spire"
)

var td = spiffeid.RequireTrustDomainFromString("example.org")

// Generators of what Kubernetes allows: a namespace is a DNS label, a claim
// name a DNS subdomain, and a uid (a UUID in practice) any SPIFFE path
// segment.
var (
	dnsLabel     = rapid.StringMatching(`[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?`)
	dnsSubdomain = rapid.Custom(func(t *rapid.T) string {
		return strings.Join(rapid.SliceOfN(dnsLabel, 1, 5).Draw(t, "labels"), ".")
	}).Filter(func(s string) bool { return len(s) <= 253 })
	claimUID = rapid.StringMatching(`[a-zA-Z0-9._-]{1,64}`).Filter(func(s string) bool { return s != "." && s != ".." })
)

// TestVMIDRoundTrip: ParseVMID gives back what VMID was built from, for
// every name Kubernetes allows.
func TestVMIDRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ns, claim, uid := dnsLabel.Draw(t, "namespace"), dnsSubdomain.Draw(t, "claim"), claimUID.Draw(t, "uid")
		id, err := spire.VMID(td, ns, claim, uid)
		if err != nil {
			t.Fatalf("VMID: %v", err)
		}
		if want := "spiffe://example.org/vm/" + ns + "/" + claim + "/" + uid; id.String() != want {
			t.Fatalf("VMID = %s, want %s", id, want)
		}
		gotNS, gotClaim, gotUID, err := spire.ParseVMID(td, id)
		if err != nil || gotNS != ns || gotClaim != claim || gotUID != uid {
			t.Fatalf("ParseVMID(%s) = %q, %q, %q, %v", id, gotNS, gotClaim, gotUID, err)
		}
		node, err := spire.NodeID(td, ns, claim, uid)
		if err != nil {
			t.Fatalf("NodeID: %v", err)
		}
		if want := "spiffe://example.org/hyperfleet/node/" + ns + "/" + claim + "/" + uid; node.String() != want {
			t.Fatalf("NodeID = %s, want %s", node, want)
		}
		if _, _, _, err := spire.ParseVMID(td, node); err == nil {
			t.Fatalf("ParseVMID accepts the node id %s", node)
		}
	})
}

// TestParseVMIDRefuses: an id of another trust domain, or of any other
// shape, is no VM's id.
func TestParseVMIDRefuses(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ns, claim, uid := dnsLabel.Draw(t, "namespace"), dnsSubdomain.Draw(t, "claim"), claimUID.Draw(t, "uid")
		segments := []string{"vm", ns, claim, uid}
		switch rapid.IntRange(0, 4).Draw(t, "mutation") {
		case 0: // another trust domain
			other := spiffeid.RequireTrustDomainFromString(dnsSubdomain.Filter(func(s string) bool { return s != td.Name() }).Draw(t, "td"))
			id := spiffeid.RequireFromSegments(other, segments...)
			if _, _, _, err := spire.ParseVMID(td, id); err == nil {
				t.Fatalf("ParseVMID accepts %s of another trust domain", id)
			}
			return
		case 1: // a segment more
			segments = append(segments, claimUID.Draw(t, "extra"))
		case 2: // a segment less
			segments = segments[:len(segments)-1]
		case 3: // another first segment
			segments[0] = claimUID.Filter(func(s string) bool { return s != "vm" }).Draw(t, "prefix")
		case 4: // a namespace Kubernetes does not allow
			segments[1] = strings.ToUpper(ns) + "_"
		}
		id := spiffeid.RequireFromSegments(td, segments...)
		if gotNS, gotClaim, gotUID, err := spire.ParseVMID(td, id); err == nil {
			t.Fatalf("ParseVMID(%s) = %q, %q, %q, want an error", id, gotNS, gotClaim, gotUID)
		}
	})
}

// TestVMIDRefusesNames: names Kubernetes does not allow make no id.
func TestVMIDRefusesNames(t *testing.T) {
	for _, tc := range []struct{ ns, claim, uid string }{
		{"", "c", "u"},
		{"Ns", "c", "u"},
		{"a.b", "c", "u"}, // a namespace is a label, not a subdomain
		{"ns", "", "u"},
		{"ns", "C", "u"},
		{"ns", strings.Repeat("a", 254), "u"},
		{"ns", "c", ""},
		{"ns", "c", ".."},
		{"ns", "c", "a/b"},
		{"ns", "c", "a b"},
	} {
		if id, err := spire.VMID(td, tc.ns, tc.claim, tc.uid); err == nil {
			t.Errorf("VMID(%q, %q, %q) = %s, want an error", tc.ns, tc.claim, tc.uid, id)
		}
		if id, err := spire.NodeID(td, tc.ns, tc.claim, tc.uid); err == nil {
			t.Errorf("NodeID(%q, %q, %q) = %s, want an error", tc.ns, tc.claim, tc.uid, id)
		}
	}
}

func TestEntryIDFor(t *testing.T) {
	if got, want := spire.EntryIDFor("0b0c6a3e-6b8a-4a51-9d55-0e4f3b2a1c00"), "hyperfleet.0b0c6a3e-6b8a-4a51-9d55-0e4f3b2a1c00"; got != want {
		t.Fatalf("EntryIDFor = %q, want %q", got, want)
	}
	if !strings.HasPrefix(spire.EntryIDFor("x"), spire.EntryIDPrefix) {
		t.Fatalf("EntryIDFor does not start with EntryIDPrefix")
	}
}
