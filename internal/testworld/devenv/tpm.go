package devenv

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hyperfleet/hyperfleet/internal/testworld/spireworld"
	"github.com/hyperfleet/hyperfleet/internal/tpmdevid"
)

// The Secrets of SystemNamespace that hold the world's TPM trust
// (Options.TPM), named as the SPIRE cluster sample names them
// (config/samples/hyperfleet_v1alpha1_hypervisorcluster_token.yaml,
// spec.spire.tpm), so that the world runs the sample as written.
const (
	// TPMEKCASecret holds, at TPMEKCAKey, the PEM CAs of the TPMs'
	// endorsement keys: the Proxmox simulator's swtpm local CA.
	TPMEKCASecret = "tpm-ek-ca"
	TPMEKCAKey    = "ca.pem"
	// TPMDevIDCASecret is the DevID CA (tls.crt, tls.key).
	TPMDevIDCASecret = "tpm-devid-ca"
)

// makeTPMTrust makes the world's TPM trust before spire-server starts,
// since its tpm_devid attestor reads both bundles at start: a new DevID CA,
// and the Proxmox simulator's swtpm local CA as the EK CA (created now if
// no VM has made it yet: the VMs' TPMs are manufactured with it later). It
// writes both for spire-server under <Dir>/tpm and keeps them as the
// Secrets the cluster's spec.spire.tpm names.
func (w *World) makeTPMTrust() (*spireworld.TPMDevIDServer, error) {
	ek, err := w.Proxmox.TPMEndorsementCA()
	if err != nil {
		return nil, fmt.Errorf("devenv: the TPMs' EK CA: %w", err)
	}
	ca, err := tpmdevid.NewCA("HyperFleet dev DevID CA", 30*24*time.Hour, time.Now())
	if err != nil {
		return nil, fmt.Errorf("devenv: %w", err)
	}
	certPEM, keyPEM, err := ca.PEM()
	if err != nil {
		return nil, fmt.Errorf("devenv: %w", err)
	}
	dir := filepath.Join(w.opts.Dir, "tpm")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("devenv: %w", err)
	}
	srv := &spireworld.TPMDevIDServer{DevIDCAPath: filepath.Join(dir, "devid-ca.pem"), EndorsementCAPath: filepath.Join(dir, "ek-ca.pem")}
	for path, data := range map[string][]byte{srv.DevIDCAPath: certPEM, srv.EndorsementCAPath: ek} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, fmt.Errorf("devenv: %w", err)
		}
	}
	w.TPMDevIDCA = ca
	w.tpmSecrets = []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Namespace: SystemNamespace, Name: TPMEKCASecret}, Data: map[string][]byte{TPMEKCAKey: ek}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: SystemNamespace, Name: TPMDevIDCASecret}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}},
	}
	return srv, nil
}
