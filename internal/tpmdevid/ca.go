package tpmdevid

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// CA is the DevID CA: spire-server's tpm_devid trusts the certificates in
// its devid_ca_path, and the operator signs each VM's DevID certificate
// with it once the VM's TPM has answered its challenge. The operator keeps
// it in a Secret (certificate and PKCS #8 key as PEM); rotating it means a
// new CA in the bundle next to the old one until every DevID is reissued.
type CA struct {
	cert   *x509.Certificate
	signer crypto.Signer
}

// NewCA makes a self-signed ECDSA P-256 CA valid from now for validity.
func NewCA(commonName string, validity time.Duration, now time.Time) (*CA, error) {
	if commonName == "" || validity <= 0 {
		return nil, errors.New("tpmdevid: a DevID CA needs a common name and a positive validity")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("tpmdevid: generating the DevID CA's key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-time.Minute), // a verifier's clock may be a little behind
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true, // it signs DevIDs only, no other CA
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("tpmdevid: self-signing the DevID CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("tpmdevid: parsing the DevID CA: %w", err)
	}
	return &CA{cert: cert, signer: key}, nil
}

// ParseCA reads a CA that PEM wrote: a CA certificate and the private key
// of its public key.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	certBlock, _ := pem.Decode(certPEM)
	if certBlock == nil || certBlock.Type != "CERTIFICATE" {
		return nil, errors.New("tpmdevid: the DevID CA's certificate is not a PEM CERTIFICATE")
	}
	cert, err := x509.ParseCertificate(certBlock.Bytes)
	if err != nil {
		return nil, fmt.Errorf("tpmdevid: the DevID CA's certificate: %w", err)
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("tpmdevid: the DevID CA's certificate is not a CA's")
	}
	keyBlock, _ := pem.Decode(keyPEM)
	if keyBlock == nil || keyBlock.Type != "PRIVATE KEY" {
		return nil, errors.New("tpmdevid: the DevID CA's key is not a PEM PRIVATE KEY (PKCS #8)")
	}
	key, err := x509.ParsePKCS8PrivateKey(keyBlock.Bytes)
	if err != nil {
		return nil, fmt.Errorf("tpmdevid: the DevID CA's key: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("tpmdevid: the DevID CA's key is a %T, not a signing key", key)
	}
	type equaler interface{ Equal(crypto.PublicKey) bool }
	if pub, ok := signer.Public().(equaler); !ok || !pub.Equal(cert.PublicKey) {
		return nil, errors.New("tpmdevid: the DevID CA's key does not match its certificate")
	}
	return &CA{cert: cert, signer: signer}, nil
}

// PEM returns the certificate and the PKCS #8 private key as PEM, what
// ParseCA reads; the certificate alone is spire-server's devid_ca_path.
func (ca *CA) PEM() (certPEM, keyPEM []byte, err error) {
	der, err := x509.MarshalPKCS8PrivateKey(ca.signer)
	if err != nil {
		return nil, nil, fmt.Errorf("tpmdevid: encoding the DevID CA's key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// Certificate returns the CA's certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// IssueDevID signs a DevID certificate (DER) for key, the DevID key of a
// Verified enrollment whose challenge was answered. commonName becomes
// the subject CN, which spire-server's tpm_devid turns into the selector
// tpm_devid:subject:cn:<commonName>; it must name one VM. The serial is
// random. The validity must lie within the CA's, which a verifier does
// not check but a certificate outliving its issuer would be useless for.
func (ca *CA) IssueDevID(key crypto.PublicKey, commonName string, notBefore, notAfter time.Time) ([]byte, error) {
	switch key.(type) {
	case *rsa.PublicKey, *ecdsa.PublicKey:
	default:
		return nil, fmt.Errorf("tpmdevid: a DevID key is RSA or ECDSA, not %T", key)
	}
	if commonName == "" {
		return nil, errors.New("tpmdevid: a DevID certificate needs a common name")
	}
	if !notAfter.After(notBefore) {
		return nil, fmt.Errorf("tpmdevid: DevID validity %s to %s is empty", notBefore, notAfter)
	}
	if notBefore.Before(ca.cert.NotBefore) || notAfter.After(ca.cert.NotAfter) {
		return nil, fmt.Errorf("tpmdevid: DevID validity %s to %s is not within the CA's, %s to %s",
			notBefore, notAfter, ca.cert.NotBefore, ca.cert.NotAfter)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: commonName},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key, ca.signer)
	if err != nil {
		return nil, fmt.Errorf("tpmdevid: signing the DevID certificate for %q: %w", commonName, err)
	}
	return der, nil
}

// randomSerial is a positive 128-bit serial number.
func randomSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("tpmdevid: a random serial number: %w", err)
	}
	return serial.Add(serial, big.NewInt(1)), nil
}
