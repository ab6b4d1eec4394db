package tpmdevid

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"testing"
	"time"
)

// TestCAPEMRoundTrip writes a CA as PEM, reads it back and checks that the
// copy issues certificates the original's certificate verifies.
func TestCAPEMRoundTrip(t *testing.T) {
	now := time.Now()
	ca, err := NewCA("HyperFleet DevID CA", time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	if c := ca.Certificate(); !c.IsCA || c.Subject.CommonName != "HyperFleet DevID CA" {
		t.Fatalf("CA certificate: IsCA %v, CN %q", c.IsCA, c.Subject.CommonName)
	}
	certPEM, keyPEM, err := ca.PEM()
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := ParseCA(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := parsed.IssueDevID(key.Public(), "hyperfleet.x", now, now.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	if err := cert.CheckSignatureFrom(ca.Certificate()); err != nil {
		t.Fatalf("a certificate from the parsed CA: %v", err)
	}
	other, err := x509.ParseCertificate(must(parsed.IssueDevID(key.Public(), "hyperfleet.x", now, now.Add(time.Minute))))
	if err != nil {
		t.Fatal(err)
	}
	if other.SerialNumber.Cmp(cert.SerialNumber) == 0 {
		t.Error("two DevID certificates share a serial number")
	}
}

// TestCARefuses checks the CA's refusals: a key that is not the
// certificate's, a validity beyond the CA's, no common name.
func TestCARefuses(t *testing.T) {
	now := time.Now()
	a, err := NewCA("a", time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewCA("b", time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	aCert, _, err := a.PEM()
	if err != nil {
		t.Fatal(err)
	}
	_, bKey, err := b.PEM()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseCA(aCert, bKey); err == nil {
		t.Error("ParseCA accepted another CA's key")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.IssueDevID(key.Public(), "x", now, now.Add(2*time.Hour)); err == nil {
		t.Error("IssueDevID signed a certificate outliving its CA")
	}
	if _, err := a.IssueDevID(key.Public(), "", now, now.Add(time.Minute)); err == nil {
		t.Error("IssueDevID signed a certificate without a common name")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
