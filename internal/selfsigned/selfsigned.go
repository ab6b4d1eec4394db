// Package selfsigned makes throw-away certificates: a certificate authority
// and a serving certificate it signs, or one self-signed serving
// certificate. The simulators and the tests use it for their TLS, and so
// does the product: internal/vmspec's render check makes its placeholder
// SPIRE trust bundle with it.
package selfsigned

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Options describe the serving certificate.
type Options struct {
	// CommonName and Organization name the serving certificate; the CA is
	// CommonName + " CA". CommonName defaults to "hyperfleet-test".
	CommonName   string
	Organization []string
	// Hosts are the DNS names and IP addresses the certificate serves.
	Hosts []string
	// NoCA makes one self-signed serving certificate (like the pve-ssl.pem
	// of a new Proxmox node) instead of a CA and a certificate it signs.
	NoCA bool
}

// Certificate is a serving certificate and the authority that signed it.
type Certificate struct {
	// TLS is the serving certificate with its chain, for tls.Config.
	TLS tls.Certificate
	// Leaf is the parsed serving certificate.
	Leaf *x509.Certificate
	// CAPEM is the trust anchor in PEM: the CA certificate, or with NoCA
	// the serving certificate itself.
	CAPEM []byte
}

// New makes a certificate for hosts (DNS names or IPs) signed by a fresh CA.
// A separate CA rather than one self-signed leaf, because OpenSSL-based curl
// only accepts a trust anchor that is a CA certificate.
func New(hosts ...string) (*Certificate, error) {
	return NewWith(Options{Hosts: hosts})
}

// NewWith makes a certificate as o describes.
func NewWith(o Options) (*Certificate, error) {
	if o.CommonName == "" {
		o.CommonName = "hyperfleet-test"
	}
	now := time.Now()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serialNumber(),
		Subject:      pkix.Name{CommonName: o.CommonName, Organization: o.Organization},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range o.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	issuer, issuerKey := tmpl, key
	var chain [][]byte
	if !o.NoCA {
		caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("generate CA key: %w", err)
		}
		caTmpl := &x509.Certificate{
			SerialNumber:          serialNumber(),
			Subject:               pkix.Name{CommonName: o.CommonName + " CA", Organization: o.Organization},
			NotBefore:             now.Add(-time.Hour),
			NotAfter:              now.Add(2 * 365 * 24 * time.Hour),
			KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
			BasicConstraintsValid: true,
			IsCA:                  true,
			MaxPathLenZero:        true,
		}
		caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
		if err != nil {
			return nil, fmt.Errorf("create CA certificate: %w", err)
		}
		if issuer, err = x509.ParseCertificate(caDER); err != nil {
			return nil, fmt.Errorf("parse CA certificate: %w", err)
		}
		issuerKey = caKey
		chain = append(chain, caDER)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, &key.PublicKey, issuerKey)
	if err != nil {
		return nil, fmt.Errorf("create certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse certificate: %w", err)
	}
	anchor := der
	if len(chain) > 0 {
		anchor = chain[0]
	}
	return &Certificate{
		TLS:   tls.Certificate{Certificate: append([][]byte{der}, chain...), PrivateKey: key, Leaf: leaf},
		Leaf:  leaf,
		CAPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: anchor}),
	}, nil
}

// Fingerprint is the SHA-256 of the serving certificate.
func (c *Certificate) Fingerprint() [sha256.Size]byte {
	return sha256.Sum256(c.Leaf.Raw)
}

// Pool is a certificate pool that trusts c.
func (c *Certificate) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.CAPEM)
	return pool
}

// ChainPEM is the serving certificate and its chain in PEM.
func (c *Certificate) ChainPEM() []byte {
	var out []byte
	for _, der := range c.TLS.Certificate {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	return out
}

// WriteFiles writes the chain and the key (PKCS #8) in PEM to certFile
// and keyFile.
func (c *Certificate) WriteFiles(certFile, keyFile string) error {
	key, err := x509.MarshalPKCS8PrivateKey(c.TLS.PrivateKey)
	if err != nil {
		return fmt.Errorf("marshal key: %w", err)
	}
	if err := os.WriteFile(certFile, c.ChainPEM(), 0o600); err != nil {
		return err
	}
	return os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}), 0o600)
}

// WriteDir writes the chain, the key and the trust anchor to dir/tls.crt,
// dir/tls.key and dir/ca.crt, the keys of a kubernetes.io/tls Secret.
func (c *Certificate) WriteDir(dir string) (certFile, keyFile, caFile string, err error) {
	certFile, keyFile, caFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt")
	if err := c.WriteFiles(certFile, keyFile); err != nil {
		return "", "", "", err
	}
	if err := os.WriteFile(caFile, c.CAPEM, 0o600); err != nil {
		return "", "", "", err
	}
	return certFile, keyFile, caFile, nil
}

func serialNumber() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}
