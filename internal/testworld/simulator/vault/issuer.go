package vault

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Issuer mints JWT-SVIDs as a SPIRE server does (ES256, a key ID, claims
// sub, aud, exp and iat, no iss) and serves its public keys as a JWKS, as
// SPIRE's OIDC discovery provider does at /keys.
type Issuer struct {
	mu   sync.Mutex
	keys []*ecdsa.PrivateKey
	kids []string
	// Now is the issuing clock; time.Now when nil.
	Now func() time.Time
}

// NewIssuer returns an issuer with one signing key.
func NewIssuer() *Issuer {
	i := &Issuer{}
	i.Rotate()
	return i
}

// Rotate adds a new signing key and signs with it from now on; the old
// keys stay in the JWKS, as SPIRE keeps the previous key published.
func (i *Issuer) Rotate() {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	i.keys = append(i.keys, key)
	i.kids = append(i.kids, randomID("", 32))
}

// Mint returns a JWT-SVID for sub and aud valid for ttl (negative: already
// expired).
func (i *Issuer) Mint(sub string, aud []string, ttl time.Duration) string {
	i.mu.Lock()
	key, kid := i.keys[len(i.keys)-1], i.kids[len(i.kids)-1]
	i.mu.Unlock()
	return MintWith(key, kid, sub, aud, i.now(), ttl)
}

func (i *Issuer) now() time.Time {
	if i.Now != nil {
		return i.Now()
	}
	return time.Now()
}

// MintWith signs a JWT-SVID with key (ES256) under key ID kid, issued at
// now.
func MintWith(key *ecdsa.PrivateKey, kid, sub string, aud []string, now time.Time, ttl time.Duration) string {
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", kid))
	if err != nil {
		panic(err)
	}
	raw, err := jwt.Signed(signer).Claims(jwt.Claims{
		Subject:  sub,
		Audience: jwt.Audience(aud),
		IssuedAt: jwt.NewNumericDate(now),
		Expiry:   jwt.NewNumericDate(now.Add(ttl)),
	}).Serialize()
	if err != nil {
		panic(fmt.Sprintf("signing a JWT-SVID: %v", err))
	}
	return raw
}

// JWKS is the issuer's public keys as a JSON Web Key Set.
func (i *Issuer) JWKS() jose.JSONWebKeySet {
	i.mu.Lock()
	defer i.mu.Unlock()
	var set jose.JSONWebKeySet
	for n, k := range i.keys {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.Public(), KeyID: i.kids[n], Algorithm: string(jose.ES256), Use: "sig"})
	}
	return set
}

// ServeHTTP serves the JWKS.
func (i *Issuer) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(i.JWKS())
}
