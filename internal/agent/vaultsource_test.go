//go:build !windows

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	bao "github.com/openbao/openbao/api/v2"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/secretstore"
	"github.com/hyperfleet/hyperfleet/internal/secretstore/vault"
	vaultsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/vault"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github/githubvm"
)

const (
	storeAudience = "hyperfleet-secret-store"
	operatorToken = "s.operator"
)

// storeWorld is a fake Vault configured as docs/secrets-store.md
// describes (JWT auth with a jwks_url, the operator's and the VMs'
// policies), the issuer standing in for SPIRE, and the operator's Store.
type storeWorld struct {
	fake     *vaultsim.Server
	issuer   *vaultsim.Issuer
	srv      *httptest.Server
	operator *vault.Store
	// recorded are the requests the fake received, in order.
	mu       sync.Mutex
	recorded []recordedRequest
}

type recordedRequest struct {
	Method, Path, Token, ContentType, VaultRequest string
	Body                                           map[string]any
}

func newStoreWorld(t *testing.T) *storeWorld {
	t.Helper()
	w := &storeWorld{fake: vaultsim.New(), issuer: vaultsim.NewIssuer()}
	keys := httptest.NewServer(w.issuer)
	t.Cleanup(keys.Close)
	w.fake.EnableKV("secret")
	accessor := w.fake.EnableJWT("jwt", vaultsim.JWTConfig{JWKSURL: keys.URL + "/keys"})
	w.fake.SetPolicy("hyperfleet-operator", vaultsim.OperatorPolicy("secret", "hyperfleet", "jwt", "hyperfleet-secret-store", "hyperfleet-vm")...)
	w.fake.SetPolicy("hyperfleet-vm", vaultsim.VMPolicy("secret", "hyperfleet", accessor)...)
	w.fake.AddToken(operatorToken, "hyperfleet-operator")
	handler := w.fake.Handler()
	w.srv = httptest.NewTLSServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec := recordedRequest{Method: r.Method, Path: r.URL.Path, Token: r.Header.Get("X-Vault-Token"), ContentType: r.Header.Get("Content-Type"), VaultRequest: r.Header.Get("X-Vault-Request")}
		_ = json.Unmarshal(body, &rec.Body)
		w.mu.Lock()
		w.recorded = append(w.recorded, rec)
		w.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		handler.ServeHTTP(rw, r)
	}))
	t.Cleanup(w.srv.Close)
	op, err := vault.New(vault.Config{
		Address: w.srv.URL, CABundle: w.caBundle(), KVMount: "secret", PathPrefix: "hyperfleet",
		AuthMount: "jwt", Audience: storeAudience, VMPolicy: "hyperfleet-vm", Token: operatorToken,
	})
	if err != nil {
		t.Fatal(err)
	}
	w.operator = op
	return w
}

func (w *storeWorld) caBundle() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: w.srv.Certificate().Raw})
}

func (w *storeWorld) requests() []recordedRequest {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.recorded)
}

// source is the VaultSource the operator would configure for id, its
// JWT-SVIDs minted for svidSub (id itself unless a test says otherwise).
func (w *storeWorld) source(t *testing.T, id spiffeid.ID, svidSub string) *VaultSource {
	t.Helper()
	p, err := secretstore.Path("hyperfleet", id)
	if err != nil {
		t.Fatal(err)
	}
	role, err := vault.RoleName(id)
	if err != nil {
		t.Fatal(err)
	}
	return &VaultSource{
		Store: agentconfig.SecretStore{
			Address: w.srv.URL, CABundle: string(w.caBundle()), AuthMount: "jwt", Role: role,
			Audience: storeAudience, KVMount: "secret", Path: p,
		},
		FetchJWTSVID: func(_ context.Context, audience string) (string, error) {
			return w.issuer.Mint(svidSub, []string{audience}, 5*time.Minute), nil
		},
	}
}

var (
	vmA = spiffeid.RequireFromString("spiffe://example.org/vm/ci/runner-a/uid-a")
	vmB = spiffeid.RequireFromString("spiffe://example.org/vm/ci/runner-b/uid-b")
)

// TestVaultSourceEndToEnd: the operator stores a VM's credential, the VM
// reads it once with its JWT-SVID, and a second read finds nothing.
func TestVaultSourceEndToEnd(t *testing.T) {
	w := newStoreWorld(t)
	ctx := context.Background()
	want := agentconfig.StoredCredential{Method: githubvm.MethodRegistrationToken, RegistrationToken: "AABBCCDD", RegistrationURL: "https://github.com/octo-org"}
	if err := w.operator.Put(ctx, vmA, want); err != nil {
		t.Fatal(err)
	}
	src := w.source(t, vmA, vmA.String())
	got, err := src.Credential(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got.Method != want.Method || got.RegistrationToken != want.RegistrationToken || got.RegistrationURL != want.RegistrationURL {
		t.Fatalf("credential %+v, want %+v", got, want)
	}
	if _, _, ok := w.fake.Secret("secret", src.Store.Path); ok {
		t.Fatal("the credential is still stored after the read")
	}
	_, err = src.Credential(ctx)
	if !errors.Is(err, ErrCredentialGone) {
		t.Fatalf("second read: %v, want ErrCredentialGone", err)
	}
	// The operator's Delete at the end of the claim is still fine.
	if err := w.operator.Delete(ctx, vmA); err != nil {
		t.Fatal(err)
	}
}

func TestVaultSourceRefusals(t *testing.T) {
	w := newStoreWorld(t)
	ctx := context.Background()
	for _, id := range []spiffeid.ID{vmA, vmB} {
		if err := w.operator.Put(ctx, id, agentconfig.StoredCredential{Method: githubvm.MethodJIT, JITConfig: "jit-" + id.String()}); err != nil {
			t.Fatal(err)
		}
	}

	// VM A's SVID presented for VM B's role.
	src := w.source(t, vmB, vmA.String())
	_, err := src.Credential(ctx)
	if !errors.Is(err, ErrStoreLoginRefused) || !strings.Contains(err.Error(), "invalid subject (sub) claim") {
		t.Fatalf("login with another VM's SVID: %v", err)
	}

	// The wrong audience.
	src = w.source(t, vmA, vmA.String())
	src.Store.Audience = "someone-else"
	_, err = src.Credential(ctx)
	if !errors.Is(err, ErrStoreLoginRefused) || !strings.Contains(err.Error(), "invalid audience (aud) claim") {
		t.Fatalf("login with the wrong audience: %v", err)
	}

	// VM A logged in properly, but pointed at VM B's path.
	src = w.source(t, vmA, vmA.String())
	src.Store.Path = w.source(t, vmB, vmB.String()).Store.Path
	_, err = src.Credential(ctx)
	if !errors.Is(err, ErrStoreDenied) || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("read of another VM's path: %v", err)
	}
	if _, _, ok := w.fake.Secret("secret", src.Store.Path); !ok {
		t.Fatal("VM B's credential is gone")
	}

	// The Workload API gives no JWT-SVID.
	src = w.source(t, vmA, vmA.String())
	src.FetchJWTSVID = func(context.Context, string) (string, error) { return "", errors.New("no identity issued") }
	if _, err := src.Credential(ctx); err == nil || !strings.Contains(err.Error(), "no identity issued") {
		t.Fatalf("without a JWT-SVID: %v", err)
	}

	// A CA bundle the server's certificate does not chain to.
	src = w.source(t, vmA, vmA.String())
	src.Store.CABundle = strings.Repeat("x", 10)
	if _, err := src.Credential(ctx); err == nil || !strings.Contains(err.Error(), "caBundle") {
		t.Fatalf("with a CA bundle that holds no certificate: %v", err)
	}
}

// TestVaultSourceSpeaksLikeTheOfficialClient: the agent's three requests
// are the ones OpenBao's (and Vault's) API client sends for the same
// operations: method, path, token header, content type, the
// X-Vault-Request header and body.
func TestVaultSourceSpeaksLikeTheOfficialClient(t *testing.T) {
	ctx := context.Background()
	run := func(t *testing.T, viaAgent bool) []recordedRequest {
		w := newStoreWorld(t)
		if err := w.operator.Put(ctx, vmA, agentconfig.StoredCredential{Method: githubvm.MethodJIT, JITConfig: "jit"}); err != nil {
			t.Fatal(err)
		}
		before := len(w.requests())
		src := w.source(t, vmA, vmA.String())
		if viaAgent {
			if _, err := src.Credential(ctx); err != nil {
				t.Fatal(err)
			}
		} else {
			officialClientRead(t, w, src)
		}
		reqs := w.requests()[before:]
		for i := range reqs {
			// Tokens and JWTs differ per run; their presence is compared.
			if reqs[i].Token != "" {
				reqs[i].Token = "<token>"
			}
			if reqs[i].Body["jwt"] != nil {
				reqs[i].Body["jwt"] = "<jwt>"
			}
		}
		return reqs
	}
	agent, official := run(t, true), run(t, false)
	a, _ := json.Marshal(agent)
	o, _ := json.Marshal(official)
	if !bytes.Equal(a, o) {
		t.Fatalf("the agent's requests differ from the official client's:\nagent:    %s\nofficial: %s", a, o)
	}
	if len(agent) != 3 {
		t.Fatalf("%d requests, want login, read and delete: %s", len(agent), a)
	}
}

// officialClientRead does what VaultSource does, with OpenBao's client.
func officialClientRead(t *testing.T, w *storeWorld, src *VaultSource) {
	t.Helper()
	cfg := bao.DefaultConfig()
	cfg.Address = w.srv.URL
	cfg.MaxRetries = 0
	if err := cfg.ConfigureTLS(&bao.TLSConfig{CACertBytes: w.caBundle()}); err != nil {
		t.Fatal(err)
	}
	c, err := bao.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.ClearToken()
	jwt, err := src.FetchJWTSVID(context.Background(), src.Store.Audience)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Logical().Write("auth/"+src.Store.AuthMount+"/login", map[string]any{"role": src.Store.Role, "jwt": jwt})
	if err != nil {
		t.Fatal(err)
	}
	c.SetToken(s.Auth.ClientToken)
	if _, err := c.KVv2(src.Store.KVMount).Get(context.Background(), src.Store.Path); err != nil {
		t.Fatal(err)
	}
	if err := c.KVv2(src.Store.KVMount).DeleteMetadata(context.Background(), src.Store.Path); err != nil {
		t.Fatal(err)
	}
}
