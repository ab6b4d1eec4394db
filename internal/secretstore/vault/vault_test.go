package vault_test

import (
	"context"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/secretstore"
	"github.com/hyperfleet/hyperfleet/internal/secretstore/vault"
	vaultsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/vault"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
)

const operatorToken = "s.operator"

var (
	vmID = spiffeid.RequireFromString("spiffe://example.org/vm/ci/runner-a/uid-a")
	cred = secretstore.Credential{Method: agentconfig.BootstrapJITConfig, JITConfig: "eyJqaXQiOnRydWV9"}
)

// newFake serves the fake over TLS, configured as docs/secrets-store.md
// describes, and returns a Store that trusts it through its CA bundle.
func newFake(t *testing.T, mutate func(*vault.Config)) (*vaultsim.Server, *vault.Store) {
	t.Helper()
	fake := vaultsim.New()
	fake.EnableKV("secret")
	accessor := fake.EnableJWT("jwt", vaultsim.JWTConfig{PublicKeys: nil})
	fake.SetPolicy("hyperfleet-operator", vaultsim.OperatorPolicy("secret", "hyperfleet", "jwt", "hyperfleet-secret-store", "hyperfleet-vm")...)
	fake.SetPolicy("hyperfleet-vm", vaultsim.VMPolicy("secret", "hyperfleet", accessor)...)
	fake.AddToken(operatorToken, "hyperfleet-operator")
	srv := httptest.NewTLSServer(fake.Handler())
	t.Cleanup(srv.Close)
	cfg := vault.Config{
		Address:    srv.URL,
		CABundle:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}),
		KVMount:    "secret",
		PathPrefix: "hyperfleet",
		AuthMount:  "jwt",
		Audience:   "hyperfleet-secret-store",
		VMPolicy:   "hyperfleet-vm",
		Token:      operatorToken,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	store, err := vault.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return fake, store
}

func TestPutWritesCredentialAndRole(t *testing.T) {
	fake, store := newFake(t, nil)
	ctx := context.Background()
	if err := store.Put(ctx, vmID, cred); err != nil {
		t.Fatal(err)
	}
	data, version, ok := fake.Secret("secret", "hyperfleet/example.org/vm/ci/runner-a/uid-a")
	if !ok || version != 1 || data["method"] != "jit-config" || data["jitConfig"] != cred.JITConfig || len(data) != 2 {
		t.Fatalf("stored %v version %d (%v)", data, version, ok)
	}
	role := fake.Role("jwt", "uid-a")
	if role == nil || role.BoundSubject != vmID.String() || role.UserClaim != "sub" ||
		len(role.BoundAudiences) != 1 || role.BoundAudiences[0] != "hyperfleet-secret-store" ||
		len(role.TokenPolicies) != 1 || role.TokenPolicies[0] != "hyperfleet-vm" || role.TokenTTL != 5*time.Minute ||
		!role.TokenNoDefaultPolicy || role.TokenNumUses != 2 {
		t.Fatalf("role %+v", role)
	}

	// Create only: a second Put, as after a restart, changes nothing.
	other := secretstore.Credential{Method: agentconfig.BootstrapJITConfig, JITConfig: "c2Vjb25k"}
	err := store.Put(ctx, vmID, other)
	if !errors.Is(err, secretstore.ErrExists) || errclass.Classify(err) != errclass.ClassPermanent || errclass.ReasonOf(err) != "CredentialExists" {
		t.Fatalf("second Put: %v (class %s), want ErrExists, Permanent", err, errclass.Classify(err))
	}
	if !strings.Contains(err.Error(), "check-and-set parameter did not match the current version") {
		t.Fatalf("second Put: %v does not carry Vault's message", err)
	}
	if data, version, _ := fake.Secret("secret", "hyperfleet/example.org/vm/ci/runner-a/uid-a"); data["jitConfig"] != cred.JITConfig || version != 1 {
		t.Fatalf("after the second Put: %v version %d", data, version)
	}
}

func TestDeleteIsIdempotent(t *testing.T) {
	fake, store := newFake(t, nil)
	ctx := context.Background()
	if err := store.Put(ctx, vmID, cred); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := store.Delete(ctx, vmID); err != nil {
			t.Fatalf("Delete %d: %v", i+1, err)
		}
	}
	if _, _, ok := fake.Secret("secret", "hyperfleet/example.org/vm/ci/runner-a/uid-a"); ok {
		t.Fatal("credential still stored after Delete")
	}
	if fake.Role("jwt", "uid-a") != nil {
		t.Fatal("role still there after Delete")
	}
	// After Delete the id can be given a credential again.
	if err := store.Put(ctx, vmID, cred); err != nil {
		t.Fatalf("Put after Delete: %v", err)
	}
}

func TestDenied(t *testing.T) {
	_, store := newFake(t, func(c *vault.Config) { c.Token = "s.revoked" })
	for name, err := range map[string]error{
		"Put":    store.Put(context.Background(), vmID, cred),
		"Delete": store.Delete(context.Background(), vmID),
	} {
		if !errors.Is(err, secretstore.ErrDenied) || errclass.Classify(err) != errclass.ClassConfiguration {
			t.Errorf("%s with an unknown token: %v (class %s), want ErrDenied, Configuration", name, err, errclass.Classify(err))
		}
	}
	// A prefix the operator's policy does not cover.
	_, store = newFake(t, func(c *vault.Config) { c.PathPrefix = "elsewhere" })
	if err := store.Put(context.Background(), vmID, cred); !errors.Is(err, secretstore.ErrDenied) {
		t.Errorf("Put outside the policy: %v, want ErrDenied", err)
	}
}

func TestTokenFunc(t *testing.T) {
	calls := 0
	_, store := newFake(t, func(c *vault.Config) {
		c.Token = "s.stale"
		c.TokenFunc = func(context.Context) (string, error) { calls++; return operatorToken, nil }
	})
	if err := store.Put(context.Background(), vmID, cred); err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Fatalf("TokenFunc called %d times, want 1", calls)
	}
	_, store = newFake(t, func(c *vault.Config) {
		c.TokenFunc = func(context.Context) (string, error) {
			return "", errors.New("secret hyperfleet/vault-token not found")
		}
	})
	if err := store.Put(context.Background(), vmID, cred); err == nil || !strings.Contains(err.Error(), "vault-token not found") {
		t.Fatalf("Put with a failing TokenFunc: %v", err)
	}
}

func TestUnavailableIsTransient(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"errors":["Vault is sealed"]}`))
	}))
	t.Cleanup(srv.Close)
	store, err := vault.New(vault.Config{Address: srv.URL, KVMount: "secret", PathPrefix: "hyperfleet", AuthMount: "jwt",
		Audience: "a", VMPolicy: "hyperfleet-vm", Token: operatorToken})
	if err != nil {
		t.Fatal(err)
	}
	err = store.Put(context.Background(), vmID, cred)
	if errclass.Classify(err) != errclass.ClassTransient || !strings.Contains(err.Error(), "Vault is sealed") {
		t.Fatalf("Put to a sealed server: %v (class %s), want Transient", err, errclass.Classify(err))
	}
}

func TestRejectsBadInput(t *testing.T) {
	_, store := newFake(t, nil)
	err := store.Put(context.Background(), spiffeid.RequireFromString("spiffe://example.org/spire/agent/x"), cred)
	if !errors.Is(err, secretstore.ErrInvalidID) {
		t.Fatalf("Put for a non-VM ID: %v, want ErrInvalidID", err)
	}
	err = store.Put(context.Background(), vmID, secretstore.Credential{Method: agentconfig.BootstrapRunnerToken, RegistrationToken: "t"})
	if errclass.Classify(err) != errclass.ClassPermanent || !strings.Contains(err.Error(), "registrationURL") {
		t.Fatalf("Put of a runner-token credential without URL: %v", err)
	}
	_, err = vault.New(vault.Config{Address: "https://v", KVMount: "secret", PathPrefix: "../up", AuthMount: "jwt", Audience: "a", VMPolicy: "p"})
	if err == nil || !strings.Contains(err.Error(), "path prefix") || !strings.Contains(err.Error(), "no operator token") ||
		errclass.Classify(err) != errclass.ClassConfiguration {
		t.Fatalf("New with a bad prefix and no token: %v", err)
	}
}
