package secretstore

import (
	"errors"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"pgregory.net/rapid"

	"github.com/hyperfleet/hyperfleet/pkg/errclass"
)

func TestPath(t *testing.T) {
	for _, tc := range []struct {
		prefix, id, want, wantErr string
	}{
		{prefix: "hyperfleet", id: "spiffe://hyperfleet.io/vm/ci/runner-abc/0b7f3c2e-1d2a-4f5b-9c8d-7e6f5a4b3c2d",
			want: "hyperfleet/hyperfleet.io/vm/ci/runner-abc/0b7f3c2e-1d2a-4f5b-9c8d-7e6f5a4b3c2d"},
		{prefix: "ci/hyperfleet", id: "spiffe://example.org/vm/ns/a.b/u", want: "ci/hyperfleet/example.org/vm/ns/a.b/u"},
		{prefix: "hyperfleet", id: "spiffe://example.org/spire/agent/x", wantErr: "not a HyperFleet VM's SPIFFE ID"},
		{prefix: "hyperfleet", id: "spiffe://example.org/vm/ns/claim", wantErr: "not a HyperFleet VM's SPIFFE ID"},
		{prefix: "hyperfleet", id: "spiffe://example.org/vm/ns/claim/uid/extra", wantErr: "not a HyperFleet VM's SPIFFE ID"},
		{prefix: "hyperfleet", id: "spiffe://example.org/vm/NS/claim/uid", wantErr: "namespace \"NS\""},
		{prefix: "hyperfleet", id: "spiffe://example.org/vm/ns/-claim/uid", wantErr: "claim \"-claim\""},
		{prefix: "hyperfleet", id: "spiffe://example.org/vm/ns/claim/u_id", wantErr: "uid \"u_id\""},
		{prefix: "../x", id: "spiffe://example.org/vm/ns/claim/uid", wantErr: "must not contain a '.' or '..' segment"},
		{prefix: "/abs", id: "spiffe://example.org/vm/ns/claim/uid", wantErr: "must be a relative path"},
		{prefix: "", id: "spiffe://example.org/vm/ns/claim/uid", wantErr: "must be a relative path"},
	} {
		got, err := Path(tc.prefix, spiffeid.RequireFromString(tc.id))
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Path(%q, %s) = %q, %v; want an error containing %q", tc.prefix, tc.id, got, err, tc.wantErr)
			}
		case err != nil || got != tc.want:
			t.Errorf("Path(%q, %s) = %q, %v; want %q", tc.prefix, tc.id, got, err, tc.want)
		}
	}
}

func TestInvalidIDIsPermanent(t *testing.T) {
	_, err := Path("p", spiffeid.RequireFromString("spiffe://example.org/other"))
	if !errors.Is(err, ErrInvalidID) || errclass.Classify(err) != errclass.ClassPermanent {
		t.Fatalf("got %v (class %s), want ErrInvalidID, Permanent", err, errclass.Classify(err))
	}
}

// TestPathProperties: every valid VM ID maps to a path under the prefix
// that maps back to the same ID, and no path leaves the prefix.
func TestPathProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		prefix := rapid.StringMatching(`[A-Za-z0-9_-][A-Za-z0-9_.-]{0,10}(/[A-Za-z0-9_-][A-Za-z0-9_.-]{0,10}){0,2}`).Draw(t, "prefix")
		td := rapid.StringMatching(`[a-z0-9][a-z0-9.-]{0,20}[a-z0-9]`).Draw(t, "trustDomain")
		vm := VM{
			TrustDomain: spiffeid.RequireTrustDomainFromString(td),
			Namespace:   rapid.StringMatching(`[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?`).Draw(t, "namespace"),
			Claim:       rapid.StringMatching(`[a-z0-9]([-a-z0-9.]{0,60}[a-z0-9])?`).Draw(t, "claim"),
			UID:         rapid.StringMatching(`[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?`).Draw(t, "uid"),
		}
		id := vm.ID()
		p, err := Path(prefix, id)
		if err != nil {
			t.Fatalf("Path(%q, %s): %v", prefix, id, err)
		}
		if !strings.HasPrefix(p, prefix+"/") {
			t.Fatalf("Path(%q, %s) = %q, not under the prefix", prefix, id, p)
		}
		for seg := range strings.SplitSeq(p, "/") {
			if seg == "" || seg == "." || seg == ".." {
				t.Fatalf("Path(%q, %s) = %q has segment %q", prefix, id, p, seg)
			}
		}
		back, err := IDFromPath(prefix, p)
		if err != nil || back != id {
			t.Fatalf("IDFromPath(%q, %q) = %s, %v; want %s", prefix, p, back, err, id)
		}
	})
}
