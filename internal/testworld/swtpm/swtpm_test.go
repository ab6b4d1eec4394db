package swtpm

import (
	"crypto/rsa"
	"crypto/x509"
	"encoding/asn1"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
)

// ekCertRSAIndex is the NV index of the RSA EK's certificate (TCG TPM v2.0
// Provisioning Guidance, section 7.8).
const ekCertRSAIndex = tpmutil.Handle(0x01c00002)

// sanOID is subjectAltName: an EK certificate marks it critical and puts
// the TPM's manufacturer, model and version in a directoryName, which
// crypto/x509 leaves among the unhandled critical extensions.
var sanOID = asn1.ObjectIdentifier{2, 5, 29, 17}

// TestManufacturedEKCertificate manufactures a TPM in each of the state
// backends, starts it, reads the RSA EK certificate over the socket with
// go-tpm and verifies it against the local CA's bundle.
func TestManufacturedEKCertificate(t *testing.T) {
	ca := NewLocalCAForTest(t)
	for _, backend := range []string{"dir", "file"} {
		t.Run(backend, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "state")
			if backend == "file" {
				state = FileScheme + filepath.Join(t.TempDir(), "tpmstate0.raw")
			}
			if err := ca.Manufacture(state); err != nil {
				t.Fatal(err)
			}
			tpm := startForTest(t, state)

			rwc, err := tpm2.OpenTPM(tpm.Socket)
			if err != nil {
				t.Fatalf("opening %s: %v", tpm.Socket, err)
			}
			raw, err := tpm2.NVRead(rwc, ekCertRSAIndex)
			if err != nil {
				t.Fatalf("reading NV index %#x: %v", ekCertRSAIndex, err)
			}
			// The index may hold padding after the DER certificate.
			var der asn1.RawValue
			if _, err := asn1.Unmarshal(raw, &der); err != nil {
				t.Fatalf("NV index %#x holds no DER: %v", ekCertRSAIndex, err)
			}
			ekCert, err := x509.ParseCertificate(der.FullBytes)
			if err != nil {
				t.Fatalf("parsing the EK certificate: %v", err)
			}
			if _, ok := ekCert.PublicKey.(*rsa.PublicKey); !ok {
				t.Fatalf("the EK certificate's key is a %T, want an RSA key", ekCert.PublicKey)
			}

			bundle, err := ca.BundlePEM()
			if err != nil {
				t.Fatal(err)
			}
			roots := x509.NewCertPool()
			var names []string
			for rest := bundle; ; {
				var block *pem.Block
				block, rest = pem.Decode(rest)
				if block == nil {
					break
				}
				c, err := x509.ParseCertificate(block.Bytes)
				if err != nil {
					t.Fatalf("bundle: %v", err)
				}
				names = append(names, c.Subject.CommonName)
				roots.AddCert(c)
			}
			if len(names) != 2 {
				t.Fatalf("the bundle holds %q, want the root and the issuing CA", names)
			}
			var unhandled []asn1.ObjectIdentifier
			for _, oid := range ekCert.UnhandledCriticalExtensions {
				if !oid.Equal(sanOID) {
					unhandled = append(unhandled, oid)
				}
			}
			ekCert.UnhandledCriticalExtensions = unhandled
			if _, err := ekCert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
				t.Fatalf("the EK certificate (issuer %q) does not verify against the local CA %q: %v", ekCert.Issuer.CommonName, names, err)
			}

			// Another local CA's bundle must not verify it.
			other, err := NewLocalCA(filepath.Join(t.TempDir(), "other"))
			if err != nil {
				t.Fatal(err)
			}
			if err := other.Manufacture(filepath.Join(t.TempDir(), "other-state")); err != nil {
				t.Fatal(err)
			}
			otherBundle, err := other.BundlePEM()
			if err != nil {
				t.Fatal(err)
			}
			otherRoots := x509.NewCertPool()
			otherRoots.AppendCertsFromPEM(otherBundle)
			if _, err := ekCert.Verify(x509.VerifyOptions{Roots: otherRoots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err == nil {
				t.Fatal("the EK certificate verifies against another local CA")
			}
		})
	}
}

// TestStartFailsWithoutState checks that a TPM that cannot start is an
// error carrying swtpm's reason, not a hang.
func TestStartFailsWithoutState(t *testing.T) {
	runDir := shortDir(t)
	missing := FileScheme + "/nonexistent/dir/tpmstate0.raw"
	tpm, err := Start(missing, runDir)
	if err == nil {
		_ = tpm.Stop()
		t.Fatal("swtpm started on a state file in a missing directory")
	}
	t.Log(err)
}

func startForTest(t *testing.T, state string) *TPM {
	t.Helper()
	tpm, err := Start(state, shortDir(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tpm.Stop(); err != nil {
			t.Error(err)
		}
	})
	return tpm
}

func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "tpm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// TestInitMakesTheBundle checks that a fresh local CA has its bundle after
// Init, before any TPM of its own, and that a TPM manufactured afterwards
// is signed by that same CA (Init must not leave a CA that a later
// Manufacture replaces).
func TestInitMakesTheBundle(t *testing.T) {
	ca := NewLocalCAForTest(t)
	if _, err := ca.BundlePEM(); err == nil {
		t.Fatal("a new local CA has a bundle before Init")
	}
	if err := ca.Init(); err != nil {
		t.Fatal(err)
	}
	before, err := ca.BundlePEM()
	if err != nil {
		t.Fatalf("no bundle after Init: %v", err)
	}
	if err := ca.Init(); err != nil {
		t.Fatal(err)
	}
	if err := ca.Manufacture(filepath.Join(t.TempDir(), "state")); err != nil {
		t.Fatal(err)
	}
	after, err := ca.BundlePEM()
	if err != nil {
		t.Fatal(err)
	}
	if string(before) != string(after) {
		t.Fatal("the bundle changed when a TPM was manufactured after Init")
	}
}
