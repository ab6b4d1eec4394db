package main

import (
	"flag"
	"fmt"
	"io"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/hyperfleet/hyperfleet/internal/tpmdevid"
)

// printDevIDCA makes a new DevID CA (tpmdevid.NewCA: ECDSA P-256,
// self-signed) and writes it to out as the Secret that a HypervisorCluster's
// spec.spire.tpm.devIDCASecretRef names (type kubernetes.io/tls), headed
// by how to give its certificate to spire-server's tpm_devid devid_ca_path
// (docs/identity.md, "TPM").
// Nothing is written anywhere else: the key exists only in what this prints.
func printDevIDCA(out io.Writer, args []string, now time.Time) error {
	fs := flag.NewFlagSet("tpm-devid-ca", flag.ContinueOnError)
	name := fs.String("name", "tpm-devid-ca", "the Secret's name")
	namespace := fs.String("namespace", "hyperfleet-system", "the Secret's namespace")
	cn := fs.String("common-name", "HyperFleet DevID CA", "the CA certificate's subject common name (spire-server's tpm_devid:issuer:cn selector)")
	validity := fs.Duration("validity", 365*24*time.Hour, "how long the CA certificate is valid; rotate it before (docs/identity.md, \"TPM\")")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *validity < 24*time.Hour {
		return fmt.Errorf("-validity %s: a CA must outlive the DevID certificates it signs (up to 168h); give at least 24h", *validity)
	}
	ca, err := tpmdevid.NewCA(*cn, *validity, now)
	if err != nil {
		return err
	}
	cert, key, err := ca.PEM()
	if err != nil {
		return err
	}
	secret := corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: *name, Namespace: *namespace},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: cert, corev1.TLSPrivateKeyKey: key},
	}
	doc, err := yaml.Marshal(secret)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "# The DevID CA for spec.spire.tpm.devIDCASecretRef: kubectl apply -f this file.\n"+
		"# spire-server's NodeAttestor \"tpm_devid\" devid_ca_path takes its tls.crt:\n"+
		"#   kubectl -n %s get secret %s -o jsonpath='{.data.tls\\.crt}' | base64 -d > devid-ca.pem\n%s", *namespace, *name, doc)
	return err
}
