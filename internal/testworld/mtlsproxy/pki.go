package mtlsproxy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"
)

// CA is a throw-away certificate authority for one test.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA certificate in PEM, the trust anchor to hand out.
	PEM []byte
}

// KeyPair is a certificate and its private key, both PEM, as a
// kubernetes.io/tls Secret holds them.
type KeyPair struct {
	CertPEM []byte
	KeyPEM  []byte
	// Serial is the certificate's serial number in upper-case hex, as
	// nginx's $ssl_client_serial shows it.
	Serial string
	// Fingerprint is the SHA-256 of the certificate's DER.
	Fingerprint [sha256.Size]byte
}

// NewCA makes a CA named name, valid from an hour ago for a day.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("mtlsproxy: create CA %s: %v", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("mtlsproxy: parse CA %s: %v", name, err)
	}
	return &CA{cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// CertOptions describe a certificate the CA issues.
type CertOptions struct {
	// CommonName is the subject's common name.
	CommonName string
	// Usage is the extended key usage; none means client authentication.
	Usage []x509.ExtKeyUsage
	// IPs are the addresses a server certificate is for.
	IPs []net.IP
	// NotBefore and NotAfter default to an hour ago and a day from now.
	NotBefore, NotAfter time.Time
}

// Issue makes a certificate signed by the CA.
func (ca *CA) Issue(t testing.TB, o CertOptions) KeyPair {
	t.Helper()
	if len(o.Usage) == 0 {
		o.Usage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	if o.NotBefore.IsZero() {
		o.NotBefore = time.Now().Add(-time.Hour)
	}
	if o.NotAfter.IsZero() {
		o.NotAfter = time.Now().Add(24 * time.Hour)
	}
	key := newKey(t)
	sn := serial(t)
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: o.CommonName},
		NotBefore:    o.NotBefore,
		NotAfter:     o.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  o.Usage,
		IPAddresses:  o.IPs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatalf("mtlsproxy: issue %s: %v", o.CommonName, err)
	}
	rawKey, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("mtlsproxy: marshal the key of %s: %v", o.CommonName, err)
	}
	return KeyPair{
		CertPEM:     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:      pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: rawKey}),
		Serial:      serialHex(sn),
		Fingerprint: sha256.Sum256(der),
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("mtlsproxy: generate a key: %v", err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatalf("mtlsproxy: serial number: %v", err)
	}
	// Start at 2^62 so nginx prints every serial with the same width.
	return n.Add(n, new(big.Int).Lsh(big.NewInt(1), 62))
}

// serialHex prints a serial as nginx's $ssl_client_serial does (OpenSSL:
// upper-case hex, an even number of digits).
func serialHex(n *big.Int) string {
	s := n.Text(16)
	if len(s)%2 == 1 {
		s = "0" + s
	}
	return strings.ToUpper(s)
}
