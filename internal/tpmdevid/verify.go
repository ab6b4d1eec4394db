package tpmdevid

import (
	"bytes"
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/asn1"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/legacy/tpm2/credactivation"
)

// Verify's errors, for errors.Is; the wrapping error says what was wrong.
var (
	// ErrUntrustedEK: the EK certificate is missing, malformed, not an
	// RSA EK's, or does not chain to the EK CAs.
	ErrUntrustedEK = errors.New("tpmdevid: untrusted endorsement key certificate")
	// ErrBadAK: the AK public is malformed or not a restricted RSA
	// signing key bound to its TPM.
	ErrBadAK = errors.New("tpmdevid: unacceptable attestation key")
	// ErrBadDevID: the DevID public is malformed or its key is not a
	// DevID's (fixedTPM|fixedParent|sensitiveDataOrigin|userWithAuth|sign,
	// unrestricted).
	ErrBadDevID = errors.New("tpmdevid: unacceptable DevID key")
	// ErrCertifyInvalid: the certification is malformed, not signed by
	// the AK, or names another key than the DevID public.
	ErrCertifyInvalid = errors.New("tpmdevid: invalid certification of the DevID key")
)

// Verified is an Enrollment whose keys and certification have been
// checked: what the operator challenges and, after a right answer,
// certifies.
type Verified struct {
	// EKCertificate is the TPM's RSA EK certificate, chained to the EK
	// CAs; EKFingerprint is the SHA-256 of its DER, hex.
	EKCertificate *x509.Certificate
	EKFingerprint string
	// DevIDKey is the DevID's public key (*rsa.PublicKey), the key a
	// DevID certificate certifies; DevIDFingerprint is the SHA-256 of
	// its PKIX DER, hex.
	DevIDKey         crypto.PublicKey
	DevIDFingerprint string
	// AKName is the AK's TPM name (nameAlg and digest of its public
	// area), the name a challenge is made for.
	AKName []byte
	// DevIDName is the DevID key's TPM name, which the AK certified.
	DevIDName []byte

	akName tpm2.Name
}

// Verify checks an enrollment: the EK certificate chains to ekCAs at now
// (every certificate in the pool is a trust anchor, as in spire-server's
// endorsement_ca_path), the AK is a restricted signing key that cannot
// leave its TPM, the DevID key has a DevID's attributes, and the AK signed
// a TPM2_Certify naming exactly the DevID public. It does not prove that
// the AK and the EK are in one TPM: that is what the Challenge is for.
// Verify never panics on arbitrary bytes.
func Verify(e *Enrollment, ekCAs *x509.CertPool, now time.Time) (*Verified, error) {
	if e == nil {
		return nil, fmt.Errorf("%w: no enrollment", ErrUntrustedEK)
	}
	ekCert, err := verifyEKCertificate(e.EKCertificate, ekCAs, now)
	if err != nil {
		return nil, err
	}
	ak, akKey, err := decodeAK(e.AKPublic)
	if err != nil {
		return nil, err
	}
	devID, devIDKey, err := decodeDevID(e.DevIDPublic)
	if err != nil {
		return nil, err
	}
	if err := verifyCertification(akKey, ak, e.CertifyInfo, e.CertifySignature, devID); err != nil {
		return nil, err
	}
	akName, err := ak.Name()
	if err != nil {
		return nil, fmt.Errorf("%w: its name: %w", ErrBadAK, err)
	}
	devIDName, err := devID.Name()
	if err != nil {
		return nil, fmt.Errorf("%w: its name: %w", ErrBadDevID, err)
	}
	pkix, err := x509.MarshalPKIXPublicKey(devIDKey)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadDevID, err)
	}
	ekSum := sha256.Sum256(ekCert.Raw)
	devIDSum := sha256.Sum256(pkix)
	v := &Verified{
		EKCertificate:    ekCert,
		EKFingerprint:    hex.EncodeToString(ekSum[:]),
		DevIDKey:         devIDKey,
		DevIDFingerprint: hex.EncodeToString(devIDSum[:]),
		akName:           akName,
	}
	v.AKName = nameBytes(akName)
	v.DevIDName = nameBytes(devIDName)
	return v, nil
}

// nameBytes is a TPM name's wire form without its TPM2B size: the name
// algorithm, big-endian, then the digest.
func nameBytes(n tpm2.Name) []byte {
	// tpm2.Public.Name always sets Digest.
	return append(binary.BigEndian.AppendUint16(nil, uint16(n.Digest.Alg)), n.Digest.Value...)
}

// sanOID is subjectAltName. An EK certificate marks it critical and holds
// only a directoryName (the TPM's manufacturer, model and version), which
// crypto/x509 does not process and so lists among the unhandled critical
// extensions, failing Verify; spire-server's tpm_devid ignores it there,
// and so does verifyEKCertificate.
var sanOID = asn1.ObjectIdentifier{2, 5, 29, 17}

// verifyEKCertificate parses the EK certificate and verifies its chain.
func verifyEKCertificate(der []byte, ekCAs *x509.CertPool, now time.Time) (*x509.Certificate, error) {
	if len(der) == 0 {
		return nil, fmt.Errorf("%w: no EK certificate", ErrUntrustedEK)
	}
	if ekCAs == nil {
		return nil, fmt.Errorf("%w: no EK CAs to verify it with", ErrUntrustedEK)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUntrustedEK, err)
	}
	if _, ok := cert.PublicKey.(*rsa.PublicKey); !ok {
		// Credential activation here, and in spire-agent, uses the
		// RSA EK.
		return nil, fmt.Errorf("%w: its key is a %T, not an RSA key", ErrUntrustedEK, cert.PublicKey)
	}
	var unhandled []asn1.ObjectIdentifier
	for _, oid := range cert.UnhandledCriticalExtensions {
		if !oid.Equal(sanOID) {
			unhandled = append(unhandled, oid)
		}
	}
	cert.UnhandledCriticalExtensions = unhandled
	// An EK certificate's extended key usage is tcg-kp-EKCertificate,
	// which crypto/x509 does not know: any usage is accepted.
	if _, err := cert.Verify(x509.VerifyOptions{
		Roots:       ekCAs,
		CurrentTime: now,
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUntrustedEK, err)
	}
	return cert, nil
}

// decodePublic decodes a TPMT_PUBLIC that must be in canonical form with
// nothing after it: TPM names hash the encoding, and go-tpm computes them
// from its re-encoding, so bytes that re-encode differently would give the
// key a name other than the one its TPM knows it by.
func decodePublic(raw []byte) (tpm2.Public, error) {
	if len(raw) == 0 {
		return tpm2.Public{}, errors.New("empty")
	}
	pub, err := tpm2.DecodePublic(raw)
	if err != nil {
		return tpm2.Public{}, err
	}
	again, err := pub.Encode()
	if err != nil {
		return tpm2.Public{}, err
	}
	if !bytes.Equal(again, raw) {
		return tpm2.Public{}, errors.New("not a canonical TPMT_PUBLIC (trailing or non-canonical bytes)")
	}
	if pub.NameAlg != tpm2.AlgSHA256 {
		return tpm2.Public{}, fmt.Errorf("name algorithm %#04x, want SHA-256", uint16(pub.NameAlg))
	}
	return pub, nil
}

// akRequired are the attributes an AK must have: a restricted signing key
// (it signs only structures the TPM produced, such as TPMS_ATTEST, so a
// certification cannot be forged with it) that cannot leave its TPM.
const akRequired = tpm2.FlagSign | tpm2.FlagRestricted | tpm2.FlagFixedTPM | tpm2.FlagFixedParent

// decodeAK decodes and checks the AK public.
func decodeAK(raw []byte) (tpm2.Public, *rsa.PublicKey, error) {
	pub, err := decodePublic(raw)
	if err != nil {
		return pub, nil, fmt.Errorf("%w: %w", ErrBadAK, err)
	}
	if pub.Attributes&akRequired != akRequired || pub.Attributes&tpm2.FlagDecrypt != 0 {
		return pub, nil, fmt.Errorf("%w: attributes %#08x, want restricted signing, fixedTPM and fixedParent, no decrypt", ErrBadAK, uint32(pub.Attributes))
	}
	key, err := rsaSigningKey(pub)
	if err != nil {
		return pub, nil, fmt.Errorf("%w: %w", ErrBadAK, err)
	}
	return pub, key, nil
}

// decodeDevID decodes and checks the DevID public.
func decodeDevID(raw []byte) (tpm2.Public, *rsa.PublicKey, error) {
	pub, err := decodePublic(raw)
	if err != nil {
		return pub, nil, fmt.Errorf("%w: %w", ErrBadDevID, err)
	}
	if pub.Attributes&devIDAttributes != devIDAttributes || pub.Attributes&(tpm2.FlagRestricted|tpm2.FlagDecrypt) != 0 {
		return pub, nil, fmt.Errorf("%w: attributes %#08x, want fixedTPM|fixedParent|sensitiveDataOrigin|userWithAuth|sign, not restricted, no decrypt", ErrBadDevID, uint32(pub.Attributes))
	}
	key, err := rsaSigningKey(pub)
	if err != nil {
		return pub, nil, fmt.Errorf("%w: %w", ErrBadDevID, err)
	}
	return pub, key, nil
}

// rsaSigningKey returns an RSA key's public key when its scheme is
// RSASSA with SHA-256: what the AK's certification is checked with, and
// what spire-server checks the DevID's signature of its nonce with.
func rsaSigningKey(pub tpm2.Public) (*rsa.PublicKey, error) {
	if pub.Type != tpm2.AlgRSA || pub.RSAParameters == nil {
		return nil, fmt.Errorf("key type %#04x, want RSA", uint16(pub.Type))
	}
	if s := pub.RSAParameters.Sign; s == nil || s.Alg != tpm2.AlgRSASSA || s.Hash != tpm2.AlgSHA256 {
		return nil, errors.New("signing scheme is not RSASSA with SHA-256")
	}
	if bits := pub.RSAParameters.KeyBits; bits < 2048 {
		return nil, fmt.Errorf("%d-bit RSA key, want at least 2048", bits)
	}
	key, err := pub.Key()
	if err != nil {
		return nil, err
	}
	rsaKey, ok := key.(*rsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("key is a %T", key)
	}
	if rsaKey.N.BitLen() != int(pub.RSAParameters.KeyBits) {
		return nil, fmt.Errorf("modulus of %d bits in a %d-bit key", rsaKey.N.BitLen(), pub.RSAParameters.KeyBits)
	}
	return rsaKey, nil
}

// verifyCertification checks that akKey signed info, a TPMS_ATTEST of
// TPM2_Certify (the TPM's magic value, which a restricted key signs only
// over TPM-made structures), naming devID.
func verifyCertification(akKey *rsa.PublicKey, ak tpm2.Public, info, rawSig []byte, devID tpm2.Public) error {
	if len(info) == 0 || len(rawSig) == 0 {
		return fmt.Errorf("%w: no certification or no signature", ErrCertifyInvalid)
	}
	sig, err := tpm2.DecodeSignature(bytes.NewBuffer(rawSig))
	if err != nil {
		return fmt.Errorf("%w: signature: %w", ErrCertifyInvalid, err)
	}
	if sig.Alg != tpm2.AlgRSASSA || sig.RSA == nil || sig.RSA.HashAlg != ak.RSAParameters.Sign.Hash {
		return fmt.Errorf("%w: signature is not the AK's RSASSA with SHA-256", ErrCertifyInvalid)
	}
	digest := sha256.Sum256(info)
	if err := rsa.VerifyPKCS1v15(akKey, crypto.SHA256, digest[:], sig.RSA.Signature); err != nil {
		return fmt.Errorf("%w: not signed by the AK: %w", ErrCertifyInvalid, err)
	}
	attest, err := tpm2.DecodeAttestationData(info)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrCertifyInvalid, err)
	}
	if attest.Type != tpm2.TagAttestCertify || attest.AttestedCertifyInfo == nil {
		return fmt.Errorf("%w: attestation of type %#04x, want a certification", ErrCertifyInvalid, uint16(attest.Type))
	}
	want, err := devID.Name()
	if err != nil {
		return fmt.Errorf("%w: the DevID key's name: %w", ErrCertifyInvalid, err)
	}
	got := attest.AttestedCertifyInfo.Name
	if got.Digest == nil || want.Digest == nil || got.Digest.Alg != want.Digest.Alg || !bytes.Equal(got.Digest.Value, want.Digest.Value) {
		return fmt.Errorf("%w: the AK certified another key than the DevID public", ErrCertifyInvalid)
	}
	return nil
}

// maxSecret is the longest secret a challenge carries: TPM2B_DIGEST's
// limit for the AK's SHA-256 name algorithm.
const maxSecret = sha256.Size

// Challenge makes a credential activation challenge: secret encrypted for
// the TPM holding the EK of v's certificate and, loaded in it, the key
// named by v's AK name. Only that TPM's TPM2_ActivateCredential recovers
// secret, which proves the AK (and so the DevID it certified) is in the
// TPM the EK certificate names. The caller chooses the secret (1 to 32
// random bytes) and compares it with the answer.
func (v *Verified) Challenge(secret []byte) (Challenge, error) {
	if len(secret) == 0 || len(secret) > maxSecret {
		return Challenge{}, fmt.Errorf("tpmdevid: a challenge's secret has %d bytes, want 1 to %d", len(secret), maxSecret)
	}
	ekKey, ok := v.EKCertificate.PublicKey.(*rsa.PublicKey)
	if !ok {
		return Challenge{}, fmt.Errorf("tpmdevid: the EK certificate's key is a %T, not an RSA key", v.EKCertificate.PublicKey)
	}
	if v.akName.Digest == nil {
		return Challenge{}, errors.New("tpmdevid: no AK name (Verified not made by Verify)")
	}
	// The EK's symmetric scheme (AES-128) sizes the credential's key.
	cred, encSecret, err := credactivation.Generate(v.akName.Digest, ekKey, int(rsaSymmetric.KeyBits/8), secret)
	if err != nil {
		return Challenge{}, fmt.Errorf("tpmdevid: making the credential: %w", err)
	}
	// Generate returns TPM2B structures; the wire carries their contents,
	// as go-tpm's ActivateCredential adds the size again (and as SPIRE's
	// server sends them).
	return Challenge{Credential: cred[2:], Secret: encSecret[2:]}, nil
}
