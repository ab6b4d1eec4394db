package identity

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/spire"
	"github.com/hyperfleet/hyperfleet/internal/tpmdevid"
)

// TPM attestation (docs/identity.md, "TPM"). Nothing the VM's seed holds
// attests it: the enrollment proof, derived like the broker proof, reaches
// the running VM alone through the hypervisor's guest channel, and it only
// lets the VM's own TPM enroll. The DevID certificate the enrollment ends
// with is useless without that TPM, whose storage key encrypts the DevID's
// private part.

var errNoEnrollmentKey = fmt.Errorf("the identity issuer has no key (of at least %d bytes) to derive TPM enrollment proofs from", spire.MinJoinTokenKeyLen)

// UsesTPM reports whether claim's recorded identity attests with its TPM.
func UsesTPM(claim *hfv1.MachineClaim) bool {
	return claim.Status.Identity != nil && claim.Status.Identity.TPM != nil
}

// EnrollmentProof is the claim's TPM enrollment proof:
// <namespace>/<name>/<uid>/<mac>, the mac an HMAC-SHA256 with
// EnrollmentKey over "hyperfleet tpm enrollment proof", a NUL and the
// claim's UID (base64url, no padding). The claim it names is read from the
// header before any byte of the request's body.
func (i *Issuer) EnrollmentProof(claim *hfv1.MachineClaim) (string, error) {
	mac, err := i.enrollmentMAC(string(claim.UID))
	if err != nil {
		return "", err
	}
	return claim.Namespace + "/" + claim.Name + "/" + string(claim.UID) + "/" + mac, nil
}

func (i *Issuer) enrollmentMAC(uid string) (string, error) {
	if len(i.EnrollmentKey) < spire.MinJoinTokenKeyLen {
		return "", errNoEnrollmentKey
	}
	mac := hmac.New(sha256.New, i.EnrollmentKey)
	mac.Write([]byte("hyperfleet tpm enrollment proof\x00" + uid))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil)), nil
}

// ParseEnrollmentProof reads the claim a proof names; it checks nothing.
func ParseEnrollmentProof(proof string) (namespace, name, uid string, ok bool) {
	parts := strings.Split(proof, "/")
	if len(parts) != 4 || parts[0] == "" || parts[1] == "" || parts[2] == "" || parts[3] == "" {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}

// VerifyEnrollmentProof reports whether proof is claim's enrollment proof,
// compared in constant time. Without a key nothing verifies.
func (i *Issuer) VerifyEnrollmentProof(claim *hfv1.MachineClaim, proof string) bool {
	want, err := i.EnrollmentProof(claim)
	if err != nil {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(want), []byte(proof)) == 1
}

// ActivationSecret is the secret the credential activation challenge of
// claim's enrollment e carries: an HMAC-SHA256 with ActivationKey over the
// claim's UID and every field of e, each length-prefixed. Derived, not
// stored, so the operator keeps no state between the challenge and the
// answer, and any replica checks the answer; a different enrollment gets a
// different secret.
func (i *Issuer) ActivationSecret(claim *hfv1.MachineClaim, e *tpmdevid.Enrollment) ([]byte, error) {
	if len(i.ActivationKey) < spire.MinJoinTokenKeyLen {
		return nil, errors.New("the identity issuer has no key to derive TPM activation secrets from")
	}
	mac := hmac.New(sha256.New, i.ActivationKey)
	mac.Write([]byte("hyperfleet tpm activation\x00"))
	for _, f := range [][]byte{[]byte(claim.UID), e.EKCertificate, e.AKPublic, e.DevIDPublic, e.CertifyInfo, e.CertifySignature} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		mac.Write(n[:])
		mac.Write(f)
	}
	return mac.Sum(nil), nil
}

// IssueTPM creates the entries of a claim whose VM attests with its TPM:
// the agent's alias, a node entry (parent the server) that selects the
// DevID certificate's common name, and the VM's registration entry under
// it. Both are idempotent. scriptUser is as for Issue.
func (i *Issuer) IssueTPM(ctx context.Context, s *Server, claim *hfv1.MachineClaim, scriptUser string) error {
	st, vm, node, err := recorded(s, claim)
	if err != nil {
		return err
	}
	uid := string(claim.UID)
	alias := spire.Entry{
		ID:        spire.AliasEntryIDFor(uid),
		SPIFFEID:  node,
		ParentID:  spire.DefaultServerID(s.TrustDomain),
		Selectors: []spire.Selector{spire.DevIDSelector(uid)},
		Hint:      i.hint(),
	}
	if err := s.API.EnsureEntry(ctx, alias); err != nil {
		return fmt.Errorf("create the agent alias entry of %s: %w", vm, err)
	}
	entry := i.vmEntry(st, vm, node, scriptUser)
	if d := s.Config.SVIDTTL; d != nil {
		entry.X509SVIDTTL = d.Duration
	}
	if err := s.API.EnsureEntry(ctx, entry); err != nil {
		return fmt.Errorf("create the registration entry of %s: %w", vm, err)
	}
	return nil
}

// tpmAgent is the agent that attests with the claim's last DevID
// certificate; ok is false before one was issued.
func tpmAgent(td spiffeid.TrustDomain, st *hfv1.IdentityStatus) (spiffeid.ID, bool) {
	if st == nil || st.TPM == nil || st.TPM.DevIDFingerprint == "" {
		return spiffeid.ID{}, false
	}
	return spire.DevIDAgentID(td, st.TPM.DevIDFingerprint), true
}
