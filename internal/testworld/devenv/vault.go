package devenv

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	vaultsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/vault"
)

// The world's secrets store (Options.SecretStore), configured as
// docs/secrets-store.md has a platform team configure Vault or OpenBao.
const (
	// VaultKVMount, VaultPathPrefix and VaultAuthMount are the store's KV
	// version 2 mount, the credentials' path prefix and the JWT auth mount.
	VaultKVMount    = "secret"
	VaultPathPrefix = "hyperfleet"
	VaultAuthMount  = "jwt"
	// vaultAudience and vaultVMPolicy are the VMs' JWT-SVID audience and
	// login policy.
	vaultAudience = "hyperfleet-secret-store"
	vaultVMPolicy = "hyperfleet-vm"
	// vaultSecret is the Secret of SystemNamespace with the operator's
	// token and the store's CA bundle.
	vaultSecret = "secret-store"
	// vaultOperatorToken is the operator's own token in the store.
	vaultOperatorToken = "s.hyperfleet-operator-dev"
)

// startVault runs the fake Vault (internal/testworld/simulator/vault) on loopback
// HTTPS: KV version 2, JWT auth whose jwks_url serves the world's
// spire-server's JWT keys (read again on every fetch, so a rotation is
// followed), the VMs' templated policy and the operator's token.
func (w *World) startVault(ctx context.Context) error {
	keys := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		jwks, err := w.SPIRE.JWKS(r.Context())
		if err != nil {
			http.Error(rw, err.Error(), http.StatusBadGateway)
			return
		}
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write(jwks)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("devenv: listen: %w", err)
	}
	keysSrv := &http.Server{Handler: keys, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slogDiscard()}
	w.servers = append(w.servers, keysSrv)
	go func() { _ = keysSrv.Serve(ln) }()
	if _, err := w.SPIRE.JWKS(ctx); err != nil {
		return fmt.Errorf("devenv: secret store keys: %w", err)
	}

	fake := vaultsim.New()
	fake.EnableKV(VaultKVMount)
	accessor := fake.EnableJWT(VaultAuthMount, vaultsim.JWTConfig{JWKSURL: "http://" + ln.Addr().String() + "/keys"})
	fake.SetPolicy("hyperfleet-operator", vaultsim.OperatorPolicy(VaultKVMount, VaultPathPrefix, VaultAuthMount, vaultAudience, vaultVMPolicy)...)
	fake.SetPolicy(vaultVMPolicy, vaultsim.VMPolicy(VaultKVMount, VaultPathPrefix, accessor)...)
	fake.AddToken(vaultOperatorToken, "hyperfleet-operator")
	cert, caPEM, err := githubsim.SelfSignedCertificate("127.0.0.1", "localhost")
	if err != nil {
		return fmt.Errorf("devenv: %w", err)
	}
	if w.VaultURL, err = w.serveTLS(fake.Handler(), cert); err != nil {
		return err
	}
	w.Vault, w.vaultCA = fake, caPEM
	return nil
}

// vaultObjects are the Secret with the operator's store token and CA, and
// spec.spire.secretStore for the cluster.
func (w *World) vaultObjects() (*corev1.Secret, *hfv1.SecretStoreConfig) {
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: SystemNamespace, Name: vaultSecret},
		StringData: map[string]string{"token": vaultOperatorToken, "ca.crt": string(w.vaultCA)},
	}
	return secret, &hfv1.SecretStoreConfig{
		Address:     w.VaultURL,
		CABundleRef: &hfv1.SecretKeySelector{Namespace: SystemNamespace, Name: vaultSecret, Key: "ca.crt"},
		TokenRef:    hfv1.SecretKeySelector{Namespace: SystemNamespace, Name: vaultSecret, Key: "token"},
		KVMount:     VaultKVMount, PathPrefix: VaultPathPrefix, AuthMount: VaultAuthMount, Audience: vaultAudience, VMPolicy: vaultVMPolicy,
	}
}
