package tpmdevid

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
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

// TestDevIDIsForClientAuthOnly: a DevID certificate is good for client
// authentication (what spire-server's tpm_devid needs) and nothing else: a
// VM's root, which can sign with the DevID key in its TPM, cannot present
// it as a TLS server certificate to whatever trusts the DevID CA. Before,
// it carried no extended key usage, which is any.
func TestDevIDIsForClientAuthOnly(t *testing.T) {
	now := time.Now()
	ca, err := NewCA("HyperFleet DevID CA", time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(must(ca.IssueDevID(key.Public(), "hyperfleet.x", now, now.Add(time.Minute))))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Certificate())
	for _, c := range []struct {
		usage x509.ExtKeyUsage
		ok    bool
	}{
		{x509.ExtKeyUsageClientAuth, true},
		{x509.ExtKeyUsageAny, true}, // spire-server's tpm_devid
		{x509.ExtKeyUsageServerAuth, false},
		{x509.ExtKeyUsageCodeSigning, false},
	} {
		_, err := cert.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{c.usage}})
		if (err == nil) != c.ok {
			t.Errorf("a DevID verified for usage %v: %v, want ok %v", c.usage, err, c.ok)
		}
	}
}

// TestParseCARefusesAWiderCA: a CA that may sign other CAs (a root or an
// intermediate of a wider PKI, such as a cluster's own CA named as the
// DevID CA by mistake) or whose usages leave out client authentication is
// refused as the DevID CA, with the constraint it lacks and the fix; the
// CA `hyperfleet tpm-devid-ca` makes is accepted. Before, any CA was.
func TestParseCARefusesAWiderCA(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		name   string
		tmpl   func(*x509.Certificate)
		reason string
	}{
		{"a root without a path length", func(c *x509.Certificate) { c.MaxPathLen, c.MaxPathLenZero = -1, false }, "pathLenConstraint of 0"},
		{"a CA that may sign one more CA", func(c *x509.Certificate) { c.MaxPathLen, c.MaxPathLenZero = 1, false }, "pathLenConstraint of 0"},
		{"a CA for servers only", func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth} }, "without client authentication"},
		{"a dedicated CA", func(*x509.Certificate) {}, ""},
		{"a dedicated CA for clients", func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth} }, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			tmpl := &x509.Certificate{
				SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "Cluster Root CA"},
				NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour),
				KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true, MaxPathLenZero: true,
			}
			c.tmpl(tmpl)
			der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
			if err != nil {
				t.Fatal(err)
			}
			keyDER, err := x509.MarshalPKCS8PrivateKey(key)
			if err != nil {
				t.Fatal(err)
			}
			_, err = ParseCA(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
			switch {
			case c.reason == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.reason != "" && (!errors.Is(err, ErrCANotDedicated) || !strings.Contains(err.Error(), c.reason) || !strings.Contains(err.Error(), "hyperfleet tpm-devid-ca") && c.reason == "pathLenConstraint of 0"):
				t.Fatalf("ParseCA: %v, want %v saying %q", err, ErrCANotDedicated, c.reason)
			}
		})
	}
}
