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
	"slices"
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
	// A verifier's clock may be a little behind.
	tmpl, err := template(commonName, now.Add(-time.Minute), now.Add(validity))
	if err != nil {
		return nil, err
	}
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	tmpl.BasicConstraintsValid = true
	tmpl.IsCA = true
	tmpl.MaxPathLenZero = true // it signs DevIDs only, no other CA
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

// ErrCANotDedicated: the DevID CA's certificate is not one of a CA kept for
// DevIDs alone (ParseCA says which constraint it lacks).
var ErrCANotDedicated = errors.New("tpmdevid: the DevID CA is not constrained to sign DevID certificates alone")

// ParseCA reads a CA that PEM wrote: a CA certificate and the private key
// of its public key. The certificate must be one of a CA made for DevIDs
// (checkDedicated): spire-server's tpm_devid trusts whatever it signs as
// a node, and so does everything else that trusts it.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := parsePEM(certPEM, "CERTIFICATE", "certificate", x509.ParseCertificate)
	if err != nil {
		return nil, err
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("tpmdevid: the DevID CA's certificate is not a CA's")
	}
	if err := checkDedicated(cert); err != nil {
		return nil, err
	}
	key, err := parsePEM(keyPEM, "PRIVATE KEY", "key (PKCS #8)", x509.ParsePKCS8PrivateKey)
	if err != nil {
		return nil, err
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

// parsePEM parses the first PEM block of data with parse; the block must
// be of type typ. what names the part of the DevID CA in the errors.
func parsePEM[T any](data []byte, typ, what string, parse func([]byte) (T, error)) (T, error) {
	var zero T
	b, _ := pem.Decode(data)
	if b == nil || b.Type != typ {
		return zero, fmt.Errorf("tpmdevid: the DevID CA's %s is not a PEM %s", what, typ)
	}
	v, err := parse(b.Bytes)
	if err != nil {
		return zero, fmt.Errorf("tpmdevid: the DevID CA's %s: %w", what, err)
	}
	return v, nil
}

// checkDedicated refuses a CA certificate that is not path-constrained to
// sign end-entity certificates only (basicConstraints pathLenConstraint
// 0), or whose extended key usages leave out client authentication (a
// DevID's use: a verifier that nests usages would refuse every DevID it
// signs). A CA that may sign other CAs is a root or an intermediate of a
// wider PKI (any CA used to be accepted), which other services trust for
// other things; the DevIDs it signed for VMs would be trusted there too,
// and the operator would hold the key of a CA that can mint CAs.
// `hyperfleet tpm-devid-ca` makes a CA that passes (NewCA).
func checkDedicated(cert *x509.Certificate) error {
	if !cert.BasicConstraintsValid || cert.MaxPathLen != 0 || !cert.MaxPathLenZero {
		return fmt.Errorf("%w: its certificate (%q) has no basicConstraints pathLenConstraint of 0, so it may sign other CAs, and is likely trusted for more than DevIDs: give the DevID CA a CA of its own, such as `hyperfleet tpm-devid-ca` makes", ErrCANotDedicated, cert.Subject.CommonName)
	}
	if len(cert.ExtKeyUsage) > 0 && !slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageClientAuth) && !slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageAny) {
		return fmt.Errorf("%w: its certificate (%q) limits its extended key usages to %v, without client authentication, the DevID certificates' usage", ErrCANotDedicated, cert.Subject.CommonName, cert.ExtKeyUsage)
	}
	return nil
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
// Verified enrollment whose challenge was answered, for client
// authentication only. commonName becomes
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
	tmpl, err := template(commonName, notBefore, notAfter)
	if err != nil {
		return nil, err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	// A DevID authenticates its TPM's node to spire-server, a client's
	// use: without an extended key usage a certificate is good for any,
	// and a VM's root, which can sign with the DevID key in its TPM, could
	// serve TLS with it to whatever trusts the DevID CA. spire-server's
	// tpm_devid accepts any usage.
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key, ca.signer)
	if err != nil {
		return nil, fmt.Errorf("tpmdevid: signing the DevID certificate for %q: %w", commonName, err)
	}
	return der, nil
}

// template is a certificate for commonName valid from notBefore to
// notAfter, with a positive random 128-bit serial number; the caller adds
// the usages.
func template(commonName string, notBefore, notAfter time.Time) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("tpmdevid: a random serial number: %w", err)
	}
	return &x509.Certificate{
		SerialNumber: serial.Add(serial, big.NewInt(1)),
		Subject:      pkix.Name{CommonName: commonName},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
	}, nil
}
