package identity

import (
	"errors"
	"fmt"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// KeyRing is where an Issuer's keys come from: the install's ownership
// key ring (pkg/ownership Signer), whose keys have ids. A claim's secrets
// are derived with the key its status.identity.keyID names, recorded when
// its identity was planned (Issuer.Plan), so that a key rotation, which
// makes the ring sign with a new key, changes nothing for a VM in flight:
// its join token (created on the SPIRE server before the rotation), its
// broker proof and its enrollment proof (in the VM already) are derived
// the same afterwards (docs/identity.md, "Rotating the ownership key").
type KeyRing interface {
	// SigningKeyID is the id of the key new identities are planned with.
	SigningKeyID() int
	// DerivedKeyByID is the key for purpose derived from the ring's key
	// id; an error (ownership.ErrNoSuchKey) when the ring does not hold
	// it.
	DerivedKeyByID(id int, purpose string) ([]byte, error)
}

// The purposes of the keys an Issuer derives, each a key of its own so
// that one secret says nothing about another.
const (
	purposeJoinToken  = "spire join token"
	purposeBroker     = "broker proof"
	purposeEnrollment = "tpm enrollment proof"
	purposeActivation = "tpm activation secret"
)

// ErrKeyUnavailable: a claim's secrets were derived from an ownership key
// the ring no longer holds, so they can be neither derived again nor
// checked. It is not a misuse: the key was removed while the claim was in
// flight.
var ErrKeyUnavailable = errors.New("the ownership key the claim's identity was derived from is not in the key ring")

// errNoKeyRing is a configuration mistake of the operator's wiring.
var errNoKeyRing = errors.New("the identity issuer has no key ring to derive keys from")

// KeyIDOf is the ownership key id claim's identity is derived from: the
// one recorded in its status, or, for an identity planned before key ids
// were recorded (or none yet), the ring's signing key.
func (i *Issuer) KeyIDOf(claim *hfv1.MachineClaim) (int, error) {
	if st := claim.Status.Identity; st != nil && st.KeyID != nil {
		return int(*st.KeyID), nil
	}
	if i.Keys == nil {
		return 0, errNoKeyRing
	}
	return i.Keys.SigningKeyID(), nil
}

// key is the key for purpose of claim's identity.
func (i *Issuer) key(claim *hfv1.MachineClaim, purpose string) ([]byte, int, error) {
	id, err := i.KeyIDOf(claim)
	if err != nil {
		return nil, 0, err
	}
	k, err := i.keyByID(id, purpose)
	return k, id, err
}

// keyByID is the key for purpose derived from the ring's key id.
func (i *Issuer) keyByID(id int, purpose string) ([]byte, error) {
	if i.Keys == nil {
		return nil, errNoKeyRing
	}
	k, err := i.Keys.DerivedKeyByID(id, purpose)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKeyUnavailable, err)
	}
	return k, nil
}
