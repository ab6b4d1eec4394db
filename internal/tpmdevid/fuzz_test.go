//go:build !windows

package tpmdevid

import (
	"crypto/x509"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"
)

// realEnrollment enrolls a swtpm once and stops it. Each fuzzing worker
// runs a fuzz test's setup, and a worker the fuzzing engine ends runs no
// cleanup, so swtpm does not outlive the setup.
func realEnrollment(f *testing.F) (*Enrollment, *x509.CertPool) {
	localCA := newLocalCA(f)
	tpm := startTPM(f, localCA)
	_, e := enroll(f, tpm)
	if err := tpm.Stop(); err != nil {
		f.Fatal(err)
	}
	return e, ekPool(f, localCA)
}

// checkAccepted checks what Verify promises of an enrollment it accepted,
// independently of how it checked: the AK is restricted, the DevID key is
// not, the TPMS_ATTEST names the DevID public, and a challenge can be
// made. (The fuzzing workers each enroll their own swtpm, and Verify does
// not tie the EK to the AK, so a worker may rightly accept the
// coordinator's seed: comparing with one seed would be wrong.)
func checkAccepted(t *testing.T, v *Verified, in *Enrollment) {
	t.Helper()
	ak, err := tpm2.DecodePublic(in.AKPublic)
	if err != nil || ak.Attributes&tpm2.FlagRestricted == 0 {
		t.Fatalf("accepted an AK that is not restricted: %v", err)
	}
	devID, err := tpm2.DecodePublic(in.DevIDPublic)
	if err != nil || devID.Attributes&tpm2.FlagRestricted != 0 {
		t.Fatalf("accepted a restricted DevID key: %v", err)
	}
	attest, err := tpm2.DecodeAttestationData(in.CertifyInfo)
	if err != nil || attest.AttestedCertifyInfo == nil {
		t.Fatalf("accepted a certification that is not one: %v", err)
	}
	if ok, err := attest.AttestedCertifyInfo.Name.MatchesPublic(devID); err != nil || !ok {
		t.Fatalf("accepted a certification of another key: %v", err)
	}
	if _, err := v.Challenge([]byte("0123456789abcdef")); err != nil {
		t.Fatalf("Challenge of a verified enrollment: %v", err)
	}
}

// FuzzVerify feeds Verify arbitrary enrollments, the operator's parsing of
// what a guest sends: the JSON request body, then every TPM structure in
// it. Verify must return an error or an enrollment checkAccepted agrees
// with, and never panic; the seed is a real enrollment from swtpm.
func FuzzVerify(f *testing.F) {
	e, pool := realEnrollment(f)
	now := time.Now()
	seed, err := json.Marshal(e)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte(`{"ekCertificate":"","akPublic":"AAE=","devidPublic":"AAEACw==","certifyInfo":"/1RDRw==","certifySignature":"ABQACw=="}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var in Enrollment
		if err := json.Unmarshal(body, &in); err != nil {
			return
		}
		v, err := Verify(&in, pool, now)
		if err != nil {
			return
		}
		checkAccepted(t, v, &in)
	})
}

// FuzzVerifyTPMStructures keeps the real, trusted EK certificate and
// fuzzes the TPM structures Verify decodes (the AK and DevID publics, the
// TPMS_ATTEST and the TPMT_SIGNATURE), which mutations of the JSON body
// rarely reach past the certificate.
func FuzzVerifyTPMStructures(f *testing.F) {
	e, pool := realEnrollment(f)
	now := time.Now()
	f.Add(e.AKPublic, e.DevIDPublic, e.CertifyInfo, e.CertifySignature)
	f.Add(e.DevIDPublic, e.AKPublic, e.CertifyInfo, e.CertifySignature)
	f.Fuzz(func(t *testing.T, ak, devID, info, sig []byte) {
		in := Enrollment{EKCertificate: e.EKCertificate, AKPublic: ak, DevIDPublic: devID, CertifyInfo: info, CertifySignature: sig}
		v, err := Verify(&in, pool, now)
		if err != nil {
			return
		}
		checkAccepted(t, v, &in)
	})
}
