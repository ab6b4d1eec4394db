package tpmdevid

import (
	"encoding/asn1"
	"errors"
	"fmt"
	"io"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
)

// Guest is the guest side of one enrollment: the AK and DevID key the
// TPM at DevicePath created, as wrapped blobs (TPM2_Create's outPublic
// contents and outPrivate contents) that only that TPM can load again.
type Guest struct {
	// DevicePath is /dev/tpmrm0 or a swtpm socket path.
	DevicePath string

	akPublic, akPrivate       []byte
	devIDPublic, devIDPrivate []byte
}

// Enroll creates an AK and a DevID key in the TPM at devicePath (a device
// such as /dev/tpmrm0, or a swtpm unix socket: go-tpm opens either by
// path), both under SPIRE's high-range SRK, has the AK certify the DevID
// (TPM2_Certify) and reads the RSA EK certificate: the Enrollment the
// operator verifies. The TPM keeps nothing: the Guest holds the blobs.
func Enroll(devicePath string) (*Guest, *Enrollment, error) {
	rw, err := openTPM(devicePath)
	if err != nil {
		return nil, nil, err
	}
	defer closeTPM(rw)

	ekCert, err := readEKCertificate(rw)
	if err != nil {
		return nil, nil, err
	}
	srk, err := createSRK(rw)
	if err != nil {
		return nil, nil, err
	}
	defer flush(rw, srk)

	g := &Guest{DevicePath: devicePath}
	g.akPrivate, g.akPublic, _, _, _, err = tpm2.CreateKey(rw, srk, tpm2.PCRSelection{}, "", "", akTemplateRSA())
	if err != nil {
		return nil, nil, fmt.Errorf("tpmdevid: creating the AK: %w", err)
	}
	g.devIDPrivate, g.devIDPublic, _, _, _, err = tpm2.CreateKey(rw, srk, tpm2.PCRSelection{}, "", "", devIDTemplateRSA())
	if err != nil {
		return nil, nil, fmt.Errorf("tpmdevid: creating the DevID key: %w", err)
	}

	ak, _, err := tpm2.Load(rw, srk, "", g.akPublic, g.akPrivate)
	if err != nil {
		return nil, nil, fmt.Errorf("tpmdevid: loading the AK: %w", err)
	}
	defer flush(rw, ak)
	devID, _, err := tpm2.Load(rw, srk, "", g.devIDPublic, g.devIDPrivate)
	if err != nil {
		return nil, nil, fmt.Errorf("tpmdevid: loading the DevID key: %w", err)
	}
	defer flush(rw, devID)

	info, sig, err := certify(rw, devID, ak)
	if err != nil {
		return nil, nil, err
	}
	return g, &Enrollment{
		EKCertificate:    ekCert,
		AKPublic:         clone(g.akPublic),
		DevIDPublic:      clone(g.devIDPublic),
		CertifyInfo:      info,
		CertifySignature: sig,
	}, nil
}

// certifyAttempts bounds TPM2_Certify's retries: a TPM may answer
// TPM_RC_RETRY (SPIRE's agent retries too, citing go-tpm issue 59).
const certifyAttempts = 10

// certify has the AK sign a TPMS_ATTEST naming the DevID key.
func certify(rw io.ReadWriter, devID, ak tpmutil.Handle) (info, sig []byte, err error) {
	for range certifyAttempts {
		info, sig, err = tpm2.Certify(rw, "", "", devID, ak, nil)
		if w := (tpm2.Warning{}); !errors.As(err, &w) || w.Code != tpm2.RCRetry {
			break
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("tpmdevid: TPM2_Certify of the DevID key by the AK: %w", err)
	}
	return info, sig, nil
}

// Activate answers the operator's challenge: TPM2_ActivateCredential with
// the AK and the EK recovers the secret only in the TPM holding both. The
// EK, regenerated from the default template, is usable only in a policy
// session satisfying PolicySecret(endorsement), as SPIRE's agent does it.
func (g *Guest) Activate(ch Challenge) ([]byte, error) {
	rw, err := openTPM(g.DevicePath)
	if err != nil {
		return nil, err
	}
	defer closeTPM(rw)

	srk, err := createSRK(rw)
	if err != nil {
		return nil, err
	}
	defer flush(rw, srk)
	ak, _, err := tpm2.Load(rw, srk, "", g.akPublic, g.akPrivate)
	if err != nil {
		return nil, fmt.Errorf("tpmdevid: loading the AK (in another TPM?): %w", err)
	}
	defer flush(rw, ak)
	ek, _, _, _, _, _, err := tpm2.CreatePrimaryEx(rw, tpm2.HandleEndorsement, tpm2.PCRSelection{}, "", "", ekTemplateRSA())
	if err != nil {
		return nil, fmt.Errorf("tpmdevid: regenerating the EK: %w", err)
	}
	defer flush(rw, ek)

	session, err := ekPolicySession(rw)
	if err != nil {
		return nil, err
	}
	secret, err := tpm2.ActivateCredentialUsingAuth(rw, []tpm2.AuthCommand{
		{Session: tpm2.HandlePasswordSession, Auth: nil},
		{Session: session},
	}, ak, ek, ch.Credential, ch.Secret)
	if err != nil {
		// A successful command ends the session; a failed one leaves it.
		flush(rw, session)
		return nil, fmt.Errorf("tpmdevid: TPM2_ActivateCredential: %w", err)
	}
	return secret, nil
}

// ekPolicySession starts an unsalted, unbound policy session and satisfies
// PolicySecret(endorsement hierarchy, empty password) in it: the EK's
// policy.
func ekPolicySession(rw io.ReadWriter) (tpmutil.Handle, error) {
	session, _, err := tpm2.StartAuthSession(rw, tpm2.HandleNull, tpm2.HandleNull,
		make([]byte, 16), nil, tpm2.SessionPolicy, tpm2.AlgNull, tpm2.AlgSHA256)
	if err != nil {
		return 0, fmt.Errorf("tpmdevid: starting the EK's policy session: %w", err)
	}
	_, _, err = tpm2.PolicySecret(rw, tpm2.HandleEndorsement,
		tpm2.AuthCommand{Session: tpm2.HandlePasswordSession}, session, nil, nil, nil, 0)
	if err != nil {
		flush(rw, session)
		return 0, fmt.Errorf("tpmdevid: PolicySecret(endorsement) for the EK: %w", err)
	}
	return session, nil
}

// DevIDBlobs returns the DevID key's public and private blobs, the bytes
// spire-agent's tpm_devid reads from devid_pub_path and devid_priv_path
// and passes to TPM2_Load under its SRK.
func (g *Guest) DevIDBlobs() (pub, priv []byte) {
	return clone(g.devIDPublic), clone(g.devIDPrivate)
}

// createSRK makes the TPM regenerate SPIRE's high-range SRK.
func createSRK(rw io.ReadWriter) (tpmutil.Handle, error) {
	srk, _, _, _, _, _, err := tpm2.CreatePrimaryEx(rw, tpm2.HandleOwner, tpm2.PCRSelection{}, "", "", srkTemplateHighRSA())
	if err != nil {
		return 0, fmt.Errorf("tpmdevid: creating the SRK: %w", err)
	}
	return srk, nil
}

// flush unloads a transient object or session; a failure leaves the
// object until the resource manager (or the next TPM reset) drops it,
// which does not change any result.
func flush(rw io.ReadWriter, h tpmutil.Handle) { _ = tpm2.FlushContext(rw, h) }

// readEKCertificate reads the RSA EK certificate, dropping the padding
// some TPMs keep after the DER in the NV index.
func readEKCertificate(rw io.ReadWriter) ([]byte, error) {
	raw, err := tpm2.NVRead(rw, ekCertIndexRSA)
	if err != nil {
		return nil, fmt.Errorf("tpmdevid: reading the EK certificate at NV index %#x: %w", ekCertIndexRSA, err)
	}
	var der asn1.RawValue
	if _, err := asn1.Unmarshal(raw, &der); err != nil {
		return nil, fmt.Errorf("tpmdevid: NV index %#x holds no DER certificate: %w", ekCertIndexRSA, err)
	}
	return der.FullBytes, nil
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }
