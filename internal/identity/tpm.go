package identity

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
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

// UsesTPM reports whether claim's recorded identity attests with its TPM.
func UsesTPM(claim *hfv1.MachineClaim) bool {
	return claim.Status.Identity != nil && claim.Status.Identity.TPM != nil
}

// EnrollmentProof is the claim's TPM enrollment proof:
// <namespace>/<name>/<uid>/<key id>/<mac>, the mac an HMAC-SHA256, with
// the enrollment key of the ownership key <key id> (the claim's), over
// "hyperfleet tpm enrollment proof v2" and the namespace, name and UID,
// each after a NUL (base64url, no padding). The proof names the claim and
// the key, and its mac covers everything it names, so the enrollment
// endpoint checks it before it reads anything (VerifyEnrollmentProof): a
// forged or edited header cannot choose which claim is read.
func (i *Issuer) EnrollmentProof(claim *hfv1.MachineClaim) (string, error) {
	key, id, err := i.key(claim, purposeEnrollment)
	if err != nil {
		return "", err
	}
	ref := EnrollmentRef{Namespace: claim.Namespace, Name: claim.Name, UID: string(claim.UID), KeyID: id}
	return ref.Namespace + "/" + ref.Name + "/" + ref.UID + "/" + strconv.Itoa(id) + "/" + enrollmentMAC(key, ref), nil
}

// EnrollmentRef is what an enrollment proof names: the claim, and the
// ownership key its mac is derived from.
type EnrollmentRef struct {
	Namespace, Name, UID string
	KeyID                int
}

func enrollmentMAC(key []byte, ref EnrollmentRef) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("hyperfleet tpm enrollment proof v2\x00" + ref.Namespace + "\x00" + ref.Name + "\x00" + ref.UID))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// VerifyEnrollmentProof checks proof on its own, before anything is read
// for it: its form, its key id (one the ring holds), and its mac over the
// claim it names, compared in constant time. It returns the claim and key
// the proof names, which the caller then reads and compares (the UID, the
// recorded key id). Nothing about the claim is known here, so an error
// says only which of those failed: ErrWrongProof for a malformed proof or
// a mac that does not verify, ErrKeyUnavailable for a key the ring does
// not hold.
func (i *Issuer) VerifyEnrollmentProof(proof string) (EnrollmentRef, error) {
	parts := strings.Split(proof, "/")
	if len(parts) != 5 || slices.Contains(parts, "") {
		return EnrollmentRef{}, ErrWrongProof
	}
	id, err := strconv.Atoi(parts[3])
	if err != nil || id < 0 || strconv.Itoa(id) != parts[3] {
		return EnrollmentRef{}, ErrWrongProof
	}
	ref := EnrollmentRef{Namespace: parts[0], Name: parts[1], UID: parts[2], KeyID: id}
	key, err := i.keyByID(id, purposeEnrollment)
	if err != nil {
		return EnrollmentRef{}, err
	}
	if subtle.ConstantTimeCompare([]byte(enrollmentMAC(key, ref)), []byte(parts[4])) != 1 {
		return EnrollmentRef{}, ErrWrongProof
	}
	return ref, nil
}

// ActivationSecret is the secret the credential activation challenge of
// claim's enrollment e carries: an HMAC-SHA256, with the activation key of
// the claim's ownership key, over the claim's UID and every field of e,
// each length-prefixed. Derived, not stored, so the operator keeps no
// state between the challenge and the answer, and any replica checks the
// answer; a different enrollment gets a different secret.
func (i *Issuer) ActivationSecret(claim *hfv1.MachineClaim, e *tpmdevid.Enrollment) ([]byte, error) {
	key, _, err := i.key(claim, purposeActivation)
	if err != nil {
		return nil, err
	}
	mac := hmac.New(sha256.New, key)
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
