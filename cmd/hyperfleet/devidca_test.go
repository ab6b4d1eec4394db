package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/hyperfleet/hyperfleet/internal/tpmdevid"
)

// TestPrintDevIDCA: what hyperfleet tpm-devid-ca prints is a TLS Secret
// whose key and certificate the operator loads as its DevID CA and which
// signs a DevID certificate that verifies against that certificate.
func TestPrintDevIDCA(t *testing.T) {
	var out bytes.Buffer
	now := time.Now()
	if err := printDevIDCA(&out, []string{"-name", "devid", "-namespace", "platform"}, now); err != nil {
		t.Fatal(err)
	}
	var s corev1.Secret
	if err := yaml.Unmarshal(out.Bytes(), &s); err != nil {
		t.Fatalf("not a Secret: %v\n%s", err, out.Bytes())
	}
	if s.Name != "devid" || s.Namespace != "platform" || s.Type != corev1.SecretTypeTLS {
		t.Errorf("Secret %s/%s of type %s", s.Namespace, s.Name, s.Type)
	}
	ca, err := tpmdevid.ParseCA(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		t.Fatalf("the operator cannot load the printed CA: %v", err)
	}
	if !strings.Contains(out.String(), "devid_ca_path") {
		t.Error("no word on spire-server's devid_ca_path")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := ca.IssueDevID(&key.PublicKey, "hyperfleet.uid-1", now, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(s.Data[corev1.TLSCertKey])
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Errorf("a DevID certificate of the printed CA does not verify against its tls.crt: %v", err)
	}
	if err := printDevIDCA(&out, []string{"-validity", "1h"}, now); err == nil {
		t.Error("a CA valid for an hour was made")
	}
}
