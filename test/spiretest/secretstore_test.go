//go:build spire

package spiretest_test

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"

	"github.com/hyperfleet/hyperfleet/internal/agent"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/secretstore"
	"github.com/hyperfleet/hyperfleet/internal/secretstore/vault"
	vaultsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/vault"
	"github.com/hyperfleet/hyperfleet/test/spiretest"
)

// TestSecretStoreWithRealJWTSVID runs the secret store path with a real
// SPIRE: the operator stores a VM's credential and login role, the VM's
// spire-agent issues this process a JWT-SVID, and the agent's VaultSource
// logs in with it to the fake Vault, which checks it against the JWT keys
// of the real server's bundle, served as a jwks_url the way SPIRE's OIDC
// discovery provider serves them. The credential is read once; a second
// read finds nothing, and a JWT-SVID for another audience is refused.
func TestSecretStoreWithRealJWTSVID(t *testing.T) {
	const (
		audience = "hyperfleet-secret-store"
		vmPath   = "/vm/ci/runner-vault/4f1c2d3e-5a6b-4c7d-8e9f-0a1b2c3d4e5f"
	)
	server := spiretest.StartServer(t, trustDomain)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	token, err := server.CreateJoinToken(ctx, nodePath, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := server.CreateEntries(ctx, &types.Entry{
		Id:        "hyperfleet.test-vm.vault",
		SpiffeId:  server.ID(vmPath),
		ParentId:  server.ID(nodePath),
		Selectors: []*types.Selector{{Type: "unix", Value: fmt.Sprintf("uid:%d", os.Getuid())}},
	}); err != nil {
		t.Fatal(err)
	}
	spireAgent := spiretest.StartAgent(t, server, token)
	waitCtx, waitCancel := context.WithTimeout(ctx, 2*time.Minute)
	_, err = spireAgent.WaitX509SVID(waitCtx)
	waitCancel()
	if err != nil {
		t.Fatal(err)
	}

	jwks, err := server.JWKS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	keys := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(jwks)
	}))
	t.Cleanup(keys.Close)

	fake := vaultsim.New()
	fake.EnableKV("secret")
	accessor := fake.EnableJWT("jwt", vaultsim.JWTConfig{JWKSURL: keys.URL + "/keys"})
	fake.SetPolicy("hyperfleet-operator", vaultsim.OperatorPolicy("secret", "hyperfleet", "jwt", "hyperfleet-secret-store", "hyperfleet-vm")...)
	fake.SetPolicy("hyperfleet-vm", vaultsim.VMPolicy("secret", "hyperfleet", accessor)...)
	fake.AddToken("s.operator", "hyperfleet-operator")
	srv := httptest.NewTLSServer(fake.Handler())
	t.Cleanup(srv.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})

	operator, err := vault.New(vault.Config{
		Address: srv.URL, CABundle: ca, KVMount: "secret", PathPrefix: "hyperfleet",
		AuthMount: "jwt", Audience: audience, VMPolicy: "hyperfleet-vm", Token: "s.operator",
	})
	if err != nil {
		t.Fatal(err)
	}
	id := spiffeid.RequireFromString("spiffe://" + trustDomain + vmPath)
	want := agentconfig.StoredCredential{Method: agentconfig.BootstrapJITConfig, JITConfig: "eyJyZWFsIjoic3BpcmUifQ=="}
	if err := operator.Put(ctx, id, want); err != nil {
		t.Fatal(err)
	}
	p, err := secretstore.Path("hyperfleet", id)
	if err != nil {
		t.Fatal(err)
	}
	role, err := vault.RoleName(id)
	if err != nil {
		t.Fatal(err)
	}

	var alg string
	src := &agent.VaultSource{
		Store: agentconfig.SecretStore{
			Address: srv.URL, CABundle: string(ca), AuthMount: "jwt", Role: role,
			Audience: audience, KVMount: "secret", Path: p,
		},
		FetchJWTSVID: func(ctx context.Context, aud string) (string, error) {
			svid, err := spireAgent.FetchJWTSVID(ctx, aud)
			if err != nil {
				return "", err
			}
			if svid.ID != id {
				return "", fmt.Errorf("JWT-SVID for %s, want %s", svid.ID, id)
			}
			raw := svid.Marshal()
			if jws, err := jose.ParseSigned(raw, []jose.SignatureAlgorithm{jose.ES256, jose.RS256, jose.ES384, jose.PS256}); err == nil {
				alg = jws.Signatures[0].Header.Algorithm
			}
			return raw, nil
		},
	}
	got, err := src.Credential(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got.Method != want.Method || got.JITConfig != want.JITConfig {
		t.Fatalf("credential %v, want %v", got, want)
	}
	t.Logf("the real JWT-SVID (%s) logged in; JWKS fetched %d time(s)", alg, fake.JWKSFetches("jwt"))
	if _, err := src.Credential(ctx); !errors.Is(err, agent.ErrCredentialGone) {
		t.Fatalf("second read: %v, want ErrCredentialGone", err)
	}

	// A real JWT-SVID minted for another audience.
	if err := operator.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := operator.Put(ctx, id, want); err != nil {
		t.Fatal(err)
	}
	src.Store.Audience = "someone-else"
	_, err = src.Credential(ctx)
	if !errors.Is(err, agent.ErrStoreLoginRefused) || !strings.Contains(err.Error(), "invalid audience (aud) claim") {
		t.Fatalf("login with a JWT-SVID for another audience: %v", err)
	}
}
