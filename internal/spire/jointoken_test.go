package spire_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/google/uuid"
	"pgregory.net/rapid"

	"github.com/hyperfleet/hyperfleet/internal/spire"
)

var key = []byte(strings.Repeat("k", spire.MinJoinTokenKeyLen))

// uuidV8 is the shape of a derived token: a lower-case RFC 9562 UUID,
// version 8, variant 10.
var uuidV8 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// TestDeriveJoinToken pins the derivation: a change would give running
// claims other tokens than the ones their VMs were created with.
func TestDeriveJoinToken(t *testing.T) {
	got := spire.DeriveJoinToken(key, "0b0c6a3e-6b8a-4a51-9d55-0e4f3b2a1c00", 1)
	if want := "a84d5b05-bad6-8f01-9bd0-3896ec210b59"; got != want {
		t.Fatalf("DeriveJoinToken = %q, want %q", got, want)
	}
}

// TestDeriveJoinTokenProperties: the token is a UUID of version 8, the
// same for the same inputs, and another for another key, claim or attempt.
func TestDeriveJoinTokenProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		k := rapid.SliceOfN(rapid.Byte(), spire.MinJoinTokenKeyLen, 64).Draw(t, "key")
		uid := rapid.String().Draw(t, "uid")
		attempt := rapid.IntRange(0, 1000).Draw(t, "attempt")
		tok := spire.DeriveJoinToken(k, uid, attempt)
		if !uuidV8.MatchString(tok) {
			t.Fatalf("token %q is no lower-case version 8 UUID", tok)
		}
		if u, err := uuid.Parse(tok); err != nil || u.Version() != 8 {
			t.Fatalf("token %q: %v, version %d", tok, err, u.Version())
		}
		if again := spire.DeriveJoinToken(k, uid, attempt); again != tok {
			t.Fatalf("DeriveJoinToken is not deterministic: %q, then %q", tok, again)
		}
		if other := spire.DeriveJoinToken(k, uid, attempt+1); other == tok {
			t.Fatalf("attempts %d and %d have the same token %q", attempt, attempt+1, tok)
		}
		if other := spire.DeriveJoinToken(k, uid+"x", attempt); other == tok {
			t.Fatalf("uids %q and %q have the same token %q", uid, uid+"x", tok)
		}
		k2 := append([]byte{k[0] ^ 1}, k[1:]...)
		if other := spire.DeriveJoinToken(k2, uid, attempt); other == tok {
			t.Fatalf("two keys give the same token %q", tok)
		}
	})
}

// TestDeriveJoinTokenSeparatesFields: the separator keeps the claim's uid
// and the attempt apart, so ("a1", 1) and ("a", 11) differ.
func TestDeriveJoinTokenSeparatesFields(t *testing.T) {
	if spire.DeriveJoinToken(key, "a1", 1) == spire.DeriveJoinToken(key, "a", 11) {
		t.Fatal("the uid and the attempt run together")
	}
}

func TestDeriveJoinTokenShortKeyPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("a key shorter than MinJoinTokenKeyLen was accepted")
		}
	}()
	spire.DeriveJoinToken(key[:spire.MinJoinTokenKeyLen-1], "u", 1)
}

func TestJoinTokenAgentID(t *testing.T) {
	if got, want := spire.JoinTokenAgentID(td, "abc").String(), "spiffe://example.org/spire/agent/join_token/abc"; got != want {
		t.Fatalf("JoinTokenAgentID = %s, want %s", got, want)
	}
	if id := spire.JoinTokenAgentID(td, "a/b"); !id.IsZero() {
		t.Fatalf("JoinTokenAgentID of a token with a slash = %s, want the zero id", id)
	}
}
