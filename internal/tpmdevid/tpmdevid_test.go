//go:build !windows

package tpmdevid

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/hyperfleet/hyperfleet/internal/testworld/swtpm"
)

// newLocalCA makes a swtpm local CA in the test's directory.
func newLocalCA(t testing.TB) *swtpm.LocalCA { return swtpm.NewLocalCAForTest(t) }

// startTPM manufactures a TPM with ca and runs it until the test ends.
func startTPM(t testing.TB, ca *swtpm.LocalCA) *swtpm.TPM { return swtpm.StartForTest(t, ca) }

// ekPool is the local CA's bundle as a pool of trust anchors.
func ekPool(t testing.TB, ca *swtpm.LocalCA) *x509.CertPool {
	t.Helper()
	bundle, err := ca.BundlePEM()
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		t.Fatal("the local CA's bundle holds no certificate")
	}
	return pool
}

func enroll(t testing.TB, tpm *swtpm.TPM) (*Guest, *Enrollment) {
	t.Helper()
	g, e, err := Enroll(tpm.Socket)
	if err != nil {
		t.Fatal(err)
	}
	return g, e
}

func randomSecret(t testing.TB) []byte {
	t.Helper()
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	return secret
}

// TestRoundTrip provisions a DevID end to end: the guest enrolls, the
// operator verifies, challenges, gets its secret back and certifies the
// DevID key.
func TestRoundTrip(t *testing.T) {
	localCA := newLocalCA(t)
	tpm := startTPM(t, localCA)
	g, e := enroll(t, tpm)
	now := time.Now()

	v, err := Verify(e, ekPool(t, localCA), now)
	if err != nil {
		t.Fatal(err)
	}
	ekSum := sha256.Sum256(e.EKCertificate)
	if v.EKFingerprint != hex.EncodeToString(ekSum[:]) {
		t.Errorf("EKFingerprint %s, want the SHA-256 of the EK certificate, %x", v.EKFingerprint, ekSum)
	}
	pub, priv := g.DevIDBlobs()
	if !bytes.Equal(pub, e.DevIDPublic) || len(priv) == 0 {
		t.Errorf("DevIDBlobs: public %x (enrollment's %x), %d private bytes", pub, e.DevIDPublic, len(priv))
	}
	devIDPub, err := tpm2.DecodePublic(pub)
	if err != nil {
		t.Fatal(err)
	}
	devIDKey, err := devIDPub.Key()
	if err != nil {
		t.Fatal(err)
	}
	if k, ok := v.DevIDKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !k.Equal(devIDKey) {
		t.Errorf("DevIDKey %v is not the DevID public's key", v.DevIDKey)
	}

	secret := randomSecret(t)
	ch, err := v.Challenge(secret)
	if err != nil {
		t.Fatal(err)
	}
	got, err := g.Activate(ch)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, secret) {
		t.Fatalf("Activate returned %x, want the secret %x", got, secret)
	}

	devIDCA, err := NewCA("HyperFleet DevID CA", 24*time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	der, err := devIDCA.IssueDevID(v.DevIDKey, "hyperfleet.uid-1", now, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	if cert.Subject.CommonName != "hyperfleet.uid-1" {
		t.Errorf("subject CN %q", cert.Subject.CommonName)
	}
	if k, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !k.Equal(v.DevIDKey) {
		t.Error("the DevID certificate certifies another key")
	}
	roots := x509.NewCertPool()
	roots.AddCert(devIDCA.Certificate())
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}, CurrentTime: now.Add(time.Minute)}); err != nil {
		t.Fatalf("the DevID certificate does not chain to the DevID CA: %v", err)
	}
}

// TestUntrustedEK checks that an EK certified by another CA, or outside
// its certificate's validity, is refused.
func TestUntrustedEK(t *testing.T) {
	localCA := newLocalCA(t)
	_, e := enroll(t, startTPM(t, localCA))

	otherCA := newLocalCA(t)
	startTPM(t, otherCA) // the other CA exists after its first TPM
	if _, err := Verify(e, ekPool(t, otherCA), time.Now()); !errors.Is(err, ErrUntrustedEK) {
		t.Errorf("Verify with another local CA: %v, want ErrUntrustedEK", err)
	}
	// swtpm_localca's certificates run until 9999 (RFC 5280's "no
	// well-defined expiration"), so only a time before they were made
	// is outside their validity.
	if _, err := Verify(e, ekPool(t, localCA), time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)); !errors.Is(err, ErrUntrustedEK) {
		t.Errorf("Verify in 2000, before the EK certificate: %v, want ErrUntrustedEK", err)
	}
	if _, err := Verify(e, x509.NewCertPool(), time.Now()); !errors.Is(err, ErrUntrustedEK) {
		t.Errorf("Verify with no EK CA: %v, want ErrUntrustedEK", err)
	}
}

// TestChallengeBoundToTPM checks that TPM B cannot answer a challenge made
// for TPM A, even with its own AK and EK loaded.
func TestChallengeBoundToTPM(t *testing.T) {
	localCA := newLocalCA(t)
	gA, eA := enroll(t, startTPM(t, localCA))
	gB, _ := enroll(t, startTPM(t, localCA))
	vA, err := Verify(eA, ekPool(t, localCA), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	secret := randomSecret(t)
	ch, err := vA.Challenge(secret)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := gB.Activate(ch); err == nil || bytes.Equal(got, secret) {
		t.Fatalf("TPM B answered TPM A's challenge: %x, %v", got, err)
	} else {
		t.Logf("TPM B: %v", err)
	}
	// A itself still can: the refusal above is B's, not a broken challenge.
	if got, err := gA.Activate(ch); err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("TPM A's answer: %x, %v", got, err)
	}
}

// TestVerifyRefusesTamperedEnrollments changes one part of a good
// enrollment at a time.
func TestVerifyRefusesTamperedEnrollments(t *testing.T) {
	localCA := newLocalCA(t)
	_, eA := enroll(t, startTPM(t, localCA))
	_, eB := enroll(t, startTPM(t, localCA))
	pool := ekPool(t, localCA)
	if _, err := Verify(eA, pool, time.Now()); err != nil {
		t.Fatalf("the untampered enrollment: %v", err)
	}
	flipLast := func(b []byte) []byte { b = clone(b); b[len(b)-1] ^= 1; return b }

	for _, tc := range []struct {
		name   string
		change func(e *Enrollment)
		want   error
	}{
		{"another TPM's DevID public", func(e *Enrollment) { e.DevIDPublic = clone(eB.DevIDPublic) }, ErrCertifyInvalid},
		{"another TPM's certification", func(e *Enrollment) { e.CertifyInfo, e.CertifySignature = eB.CertifyInfo, eB.CertifySignature }, ErrCertifyInvalid},
		{"tampered signature", func(e *Enrollment) { e.CertifySignature = flipLast(e.CertifySignature) }, ErrCertifyInvalid},
		{"tampered certify info", func(e *Enrollment) { e.CertifyInfo = flipLast(e.CertifyInfo) }, ErrCertifyInvalid},
		{"no signature", func(e *Enrollment) { e.CertifySignature = nil }, ErrCertifyInvalid},
		{"the DevID as AK (not restricted)", func(e *Enrollment) { e.AKPublic = clone(e.DevIDPublic) }, ErrBadAK},
		{"the AK as DevID (restricted)", func(e *Enrollment) { e.DevIDPublic = clone(e.AKPublic) }, ErrBadDevID},
		{"trailing bytes after the AK", func(e *Enrollment) { e.AKPublic = append(clone(e.AKPublic), 0) }, ErrBadAK},
		{"another TPM's EK certificate", func(e *Enrollment) { e.EKCertificate = clone(eB.EKCertificate) }, nil},
		{"tampered EK certificate", func(e *Enrollment) { e.EKCertificate = flipLast(e.EKCertificate) }, ErrUntrustedEK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := *eA
			tc.change(&e)
			_, err := Verify(&e, pool, time.Now())
			if tc.want == nil {
				// Verify cannot tell: the EK is tied to the AK only by
				// the challenge, which is then encrypted to B's EK, and
				// A's TPM cannot answer it (TestChallengeBoundToTPM).
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Verify: %v, want %v", err, tc.want)
			}
		})
	}
}

// TestSwappedEKCannotBeAnswered follows the one substitution Verify cannot
// see, another TPM's EK certificate, to its challenge: the TPM that made
// the AK does not hold that EK and cannot answer.
func TestSwappedEKCannotBeAnswered(t *testing.T) {
	localCA := newLocalCA(t)
	gA, eA := enroll(t, startTPM(t, localCA))
	_, eB := enroll(t, startTPM(t, localCA))
	e := *eA
	e.EKCertificate = eB.EKCertificate
	v, err := Verify(&e, ekPool(t, localCA), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	secret := randomSecret(t)
	ch, err := v.Challenge(secret)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := gA.Activate(ch); err == nil || bytes.Equal(got, secret) {
		t.Fatalf("TPM A answered a challenge for TPM B's EK: %x, %v", got, err)
	}
}
