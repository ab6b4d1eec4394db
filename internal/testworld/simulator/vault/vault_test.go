package vault_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	bao "github.com/openbao/openbao/api/v2"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/vault"
)

const (
	operatorToken = "s.operator"
	audience      = "hyperfleet-secret-store"
	vmID          = "spiffe://example.org/vm/ci/runner-a/uid-a"
	vmPath        = "hyperfleet/example.org/vm/ci/runner-a/uid-a"
	otherPath     = "hyperfleet/example.org/vm/ci/runner-b/uid-b"
)

// world is the fake configured as docs/secrets-store.md describes, with
// the VM role for vmID that the operator's Put creates.
type world struct {
	fake     *vault.Server
	issuer   *vault.Issuer
	addr     string
	accessor string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	issuer := vault.NewIssuer()
	keys := httptest.NewServer(issuer)
	t.Cleanup(keys.Close)
	fake := vault.New()
	srv := httptest.NewServer(fake.Handler())
	t.Cleanup(srv.Close)
	fake.EnableKV("secret")
	accessor := fake.EnableJWT("jwt", vault.JWTConfig{JWKSURL: keys.URL + "/keys"})
	fake.SetPolicy("hyperfleet-operator", vault.OperatorPolicy("secret", "hyperfleet", "jwt", audience, "hyperfleet-vm")...)
	fake.SetPolicy("hyperfleet-vm", vault.VMPolicy("secret", "hyperfleet", accessor)...)
	fake.AddToken(operatorToken, "hyperfleet-operator")
	for _, r := range []struct{ name, sub string }{{"uid-a", vmID}, {"uid-b", "spiffe://example.org/vm/ci/runner-b/uid-b"}} {
		fake.SetRole("jwt", r.name, vault.Role{
			UserClaim: "sub", BoundSubject: r.sub, BoundAudiences: []string{audience},
			TokenPolicies: []string{"hyperfleet-vm"}, TokenTTL: 5 * time.Minute,
		})
	}
	return &world{fake: fake, issuer: issuer, addr: srv.URL, accessor: accessor}
}

// client is the official API client, as the operator and a real VM's
// tooling use it.
func (w *world) client(t *testing.T, token string) *bao.Client {
	t.Helper()
	cfg := bao.DefaultConfig()
	cfg.Address = w.addr
	cfg.MaxRetries = 0
	c, err := bao.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.SetToken(token)
	return c
}

func (w *world) login(t *testing.T, role, jwt string) (*bao.Secret, error) {
	t.Helper()
	return w.client(t, "").Logical().WriteWithContext(context.Background(), "auth/jwt/login", map[string]any{"role": role, "jwt": jwt})
}

// wantVaultError checks err is the client's ResponseError with status and
// exactly Vault's error messages.
func wantVaultError(t *testing.T, err error, status int, msgs ...string) {
	t.Helper()
	var re *bao.ResponseError
	if !errors.As(err, &re) {
		t.Fatalf("got %v, want a Vault error %d %q", err, status, msgs)
	}
	if re.StatusCode != status || !slices.Equal(re.Errors, msgs) {
		t.Fatalf("got %d %q, want %d %q", re.StatusCode, re.Errors, status, msgs)
	}
}

func TestLogin(t *testing.T) {
	w := newWorld(t)
	s, err := w.login(t, "uid-a", w.issuer.Mint(vmID, []string{audience}, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	a := s.Auth
	if a == nil || len(a.ClientToken) < 10 || a.Accessor == "" || !a.Renewable || a.LeaseDuration != 300 || a.EntityID == "" {
		t.Fatalf("auth block %+v", a)
	}
	if !slices.Equal(a.Policies, []string{"default", "hyperfleet-vm"}) || !slices.Equal(a.TokenPolicies, a.Policies) {
		t.Fatalf("policies %q, token_policies %q", a.Policies, a.TokenPolicies)
	}
	if a.Metadata["role"] != "uid-a" {
		t.Fatalf("metadata %v, want role uid-a", a.Metadata)
	}
	// The same subject logs in as the same entity.
	s2, err := w.login(t, "uid-a", w.issuer.Mint(vmID, []string{"other", audience}, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if s2.Auth.EntityID != a.EntityID || s2.Auth.ClientToken == a.ClientToken {
		t.Fatalf("second login: entity %s token %s; first: entity %s token %s", s2.Auth.EntityID, s2.Auth.ClientToken, a.EntityID, a.ClientToken)
	}
}

func TestLoginRefused(t *testing.T) {
	w := newWorld(t)
	otherKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	kid := w.issuer.JWKS().Keys[0].KeyID
	for _, tc := range []struct {
		name, role, jwt, want string
	}{
		{"wrong sub", "uid-a", w.issuer.Mint("spiffe://example.org/vm/ci/runner-b/uid-b", []string{audience}, time.Minute),
			"error validating token: invalid subject (sub) claim"},
		{"wrong aud", "uid-a", w.issuer.Mint(vmID, []string{"other"}, time.Minute),
			"error validating token: invalid audience (aud) claim: audience claim does not match any expected audience"},
		// Beyond the 60 second clock skew leeway.
		{"expired", "uid-a", w.issuer.Mint(vmID, []string{audience}, -2*time.Minute),
			"error validating token: invalid expiration time (exp) claim: token is expired"},
		{"bad signature", "uid-a", vault.MintWith(otherKey, kid, vmID, []string{audience}, time.Now(), time.Minute),
			"error validating token: error verifying token signature: failed to verify id token signature"},
		{"unknown role", "nope", w.issuer.Mint(vmID, []string{audience}, time.Minute), `role "nope" could not be found`},
		{"no role", "", w.issuer.Mint(vmID, []string{audience}, time.Minute), "missing role"},
		{"no jwt", "uid-a", "", "missing token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := w.login(t, tc.role, tc.jwt)
			wantVaultError(t, err, http.StatusBadRequest, tc.want)
		})
	}
	// Within the leeway an expired JWT still logs in.
	if _, err := w.login(t, "uid-a", w.issuer.Mint(vmID, []string{audience}, -30*time.Second)); err != nil {
		t.Fatalf("a JWT expired 30 seconds ago (leeway 60): %v", err)
	}
}

func TestLoginTimesAgainstClock(t *testing.T) {
	w := newWorld(t)
	now := time.Now()
	w.issuer.Now = func() time.Time { return now.Add(10 * time.Minute) }
	_, err := w.login(t, "uid-a", w.issuer.Mint(vmID, []string{audience}, time.Hour))
	wantVaultError(t, err, http.StatusBadRequest, "error validating token: invalid not before (nbf) claim: token not yet valid")
}

// TestJWKSRotation: keys are cached by key ID and fetched again for a key
// ID not seen, so a SPIRE key rotation needs no reconfiguration.
func TestJWKSRotation(t *testing.T) {
	w := newWorld(t)
	for range 2 {
		if _, err := w.login(t, "uid-a", w.issuer.Mint(vmID, []string{audience}, time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	if n := w.fake.JWKSFetches("jwt"); n != 1 {
		t.Fatalf("%d JWKS fetches for two logins with one key, want 1", n)
	}
	w.issuer.Rotate()
	if _, err := w.login(t, "uid-a", w.issuer.Mint(vmID, []string{audience}, time.Minute)); err != nil {
		t.Fatalf("login after a key rotation: %v", err)
	}
	if n := w.fake.JWKSFetches("jwt"); n != 2 {
		t.Fatalf("%d JWKS fetches after a rotation, want 2", n)
	}
}

func TestStaticKeys(t *testing.T) {
	w := newWorld(t)
	issuer := vault.NewIssuer()
	w.fake.EnableJWT("static", vault.JWTConfig{PublicKeys: []crypto.PublicKey{issuer.JWKS().Keys[0].Key}})
	w.fake.SetRole("static", "uid-a", vault.Role{UserClaim: "sub", BoundSubject: vmID, BoundAudiences: []string{audience}})
	c := w.client(t, "")
	if _, err := c.Logical().Write("auth/static/login", map[string]any{"role": "uid-a", "jwt": issuer.Mint(vmID, []string{audience}, time.Minute)}); err != nil {
		t.Fatal(err)
	}
	// A key the mount was not given, as after a SPIRE key rotation.
	issuer.Rotate()
	_, err := c.Logical().Write("auth/static/login", map[string]any{"role": "uid-a", "jwt": issuer.Mint(vmID, []string{audience}, time.Minute)})
	wantVaultError(t, err, http.StatusBadRequest, "error validating token: error verifying token signature: no known key successfully validated the token signature")
}

func TestKVCheckAndSet(t *testing.T) {
	w := newWorld(t)
	kv := w.client(t, operatorToken).KVv2("secret")
	ctx := context.Background()
	s, err := kv.Put(ctx, vmPath, map[string]any{"method": "jit-config", "jitConfig": "one"}, bao.WithCheckAndSet(0))
	if err != nil {
		t.Fatal(err)
	}
	if s.VersionMetadata.Version != 1 || s.VersionMetadata.CreatedTime.IsZero() {
		t.Fatalf("version metadata %+v", s.VersionMetadata)
	}
	_, err = kv.Put(ctx, vmPath, map[string]any{"method": "jit-config", "jitConfig": "two"}, bao.WithCheckAndSet(0))
	wantVaultError(t, err, http.StatusBadRequest, "check-and-set parameter did not match the current version")
	if data, v, _ := w.fake.Secret("secret", vmPath); data["jitConfig"] != "one" || v != 1 {
		t.Fatalf("after the refused write: %v version %d", data, v)
	}
	// cas 1 (the current version) is allowed.
	if _, err := kv.Put(ctx, vmPath, map[string]any{"method": "jit-config", "jitConfig": "two"}, bao.WithCheckAndSet(1)); err != nil {
		t.Fatal(err)
	}
	if _, v, _ := w.fake.Secret("secret", vmPath); v != 2 {
		t.Fatalf("version %d after a cas 1 write, want 2", v)
	}
}

func TestReadOnceAndPermissions(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	op := w.client(t, operatorToken).KVv2("secret")
	for _, p := range []string{vmPath, otherPath} {
		if _, err := op.Put(ctx, p, map[string]any{"method": "jit-config", "jitConfig": p}, bao.WithCheckAndSet(0)); err != nil {
			t.Fatal(err)
		}
	}
	// The operator writes but does not read.
	_, err := op.Get(ctx, vmPath)
	wantVaultError(t, err, http.StatusForbidden, "1 error occurred:\n\t* permission denied\n\n")

	s, err := w.login(t, "uid-a", w.issuer.Mint(vmID, []string{audience}, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	vm := w.client(t, s.Auth.ClientToken).KVv2("secret")
	got, err := vm.Get(ctx, vmPath)
	if err != nil {
		t.Fatal(err)
	}
	if got.Data["jitConfig"] != vmPath || got.VersionMetadata.Version != 1 {
		t.Fatalf("read %v version %d", got.Data, got.VersionMetadata.Version)
	}
	// Another claim's credential: neither read nor delete.
	_, err = vm.Get(ctx, otherPath)
	wantVaultError(t, err, http.StatusForbidden, "1 error occurred:\n\t* permission denied\n\n")
	err = vm.DeleteMetadata(ctx, otherPath)
	wantVaultError(t, err, http.StatusForbidden, "1 error occurred:\n\t* permission denied\n\n")
	// Nor write its own.
	_, err = vm.Put(ctx, vmPath, map[string]any{"x": "y"})
	wantVaultError(t, err, http.StatusForbidden, "1 error occurred:\n\t* permission denied\n\n")

	if err := vm.DeleteMetadata(ctx, vmPath); err != nil {
		t.Fatal(err)
	}
	if _, err := vm.Get(ctx, vmPath); !errors.Is(err, bao.ErrSecretNotFound) {
		t.Fatalf("second read: %v, want ErrSecretNotFound", err)
	}
	if _, _, ok := w.fake.Secret("secret", otherPath); !ok {
		t.Fatal("the other claim's credential is gone")
	}
	// Without a token, or with an unknown one.
	for _, tok := range []string{"", "s.unknown"} {
		_, err := w.client(t, tok).KVv2("secret").Get(ctx, otherPath)
		wantVaultError(t, err, http.StatusForbidden, "1 error occurred:\n\t* permission denied\n\n")
	}
}

// TestTokenExpiry: a login token stops working at the end of its lease.
func TestTokenExpiry(t *testing.T) {
	w := newWorld(t)
	s, err := w.login(t, "uid-a", w.issuer.Mint(vmID, []string{audience}, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	w.fake.SetClock(func() time.Time { return time.Now().Add(6 * time.Minute) })
	_, err = w.client(t, s.Auth.ClientToken).KVv2("secret").Get(context.Background(), vmPath)
	wantVaultError(t, err, http.StatusForbidden, "1 error occurred:\n\t* permission denied\n\n")
}

func TestRoleWrite(t *testing.T) {
	w := newWorld(t)
	w.fake.SetPolicy("admin", vault.Rule{Path: "*", Capabilities: []string{"create", "read", "update", "delete", "list"}})
	w.fake.AddToken("s.admin", "admin")
	admin := w.client(t, "s.admin").Logical()
	_, err := admin.Write("auth/jwt/role/uid-c", map[string]any{"role_type": "jwt", "user_claim": "sub"})
	wantVaultError(t, err, http.StatusBadRequest, "must have at least one bound constraint when creating/updating a role")
	_, err = admin.Write("auth/jwt/role/uid-c", map[string]any{"role_type": "oidc", "user_claim": "sub", "bound_subject": "x"})
	wantVaultError(t, err, http.StatusBadRequest, "invalid 'role_type': oidc")

	// The operator's policy pins every parameter but the subject and TTL.
	op := w.client(t, operatorToken).Logical()
	valid := func() map[string]any {
		return map[string]any{
			"role_type": "jwt", "user_claim": "sub", "bound_subject": "spiffe://example.org/vm/ci/c/uid-c",
			"bound_audiences": audience, "token_policies": "hyperfleet-vm", "token_no_default_policy": "true",
			"token_num_uses": "2", "token_ttl": "120",
		}
	}
	for name, change := range map[string]func(map[string]any){
		"another policy":         func(m map[string]any) { m["token_policies"] = "hyperfleet-vm,root" },
		"a list of policies":     func(m map[string]any) { m["token_policies"] = []string{"hyperfleet-vm"} },
		"another audience":       func(m map[string]any) { m["bound_audiences"] = "vault" },
		"another claim":          func(m map[string]any) { m["user_claim"] = "aud" },
		"no subject binding":     func(m map[string]any) { m["bound_subject"] = "*" },
		"more uses":              func(m map[string]any) { m["token_num_uses"] = "0" },
		"a parameter not listed": func(m map[string]any) { m["bound_cidrs"] = "0.0.0.0/0" },
	} {
		body := valid()
		change(body)
		_, err := op.Write("auth/jwt/role/uid-c", body)
		if err == nil {
			t.Fatalf("the operator wrote a role with %s", name)
		}
		wantVaultError(t, err, http.StatusForbidden, "1 error occurred:\n\t* permission denied\n\n")
	}
	if _, err := op.Write("auth/jwt/role/uid-c", valid()); err != nil {
		t.Fatal(err)
	}
	r := w.fake.Role("jwt", "uid-c")
	if r == nil || r.TokenTTL != 2*time.Minute || r.BoundSubject != "spiffe://example.org/vm/ci/c/uid-c" || !slices.Equal(r.BoundAudiences, []string{audience}) ||
		!slices.Equal(r.TokenPolicies, []string{"hyperfleet-vm"}) || !r.TokenNoDefaultPolicy || r.TokenNumUses != 2 {
		t.Fatalf("role %+v", r)
	}
	if _, err := op.Delete("auth/jwt/role/uid-c"); err != nil {
		t.Fatal(err)
	}
	if w.fake.Role("jwt", "uid-c") != nil {
		t.Fatal("role still there after delete")
	}
	// A VM token may not write roles.
	s, err := w.login(t, "uid-a", w.issuer.Mint(vmID, []string{audience}, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.client(t, s.Auth.ClientToken).Logical().Write("auth/jwt/role/uid-a", map[string]any{"bound_subject": "x"})
	wantVaultError(t, err, http.StatusForbidden, "1 error occurred:\n\t* permission denied\n\n")
}

// TestAliasNameTemplateCannotMatch shows why the VM policy templates on the
// role and not on the alias name: the alias name is the whole SPIFFE ID,
// and a request path holding "spiffe://" is redirected by the server's
// path cleaning before any policy sees it.
func TestAliasNameTemplateCannotMatch(t *testing.T) {
	w := newWorld(t)
	w.fake.SetPolicy("by-name", vault.Rule{Path: "secret/data/hyperfleet/{{identity.entity.aliases." + w.accessor + ".name}}", Capabilities: []string{"read"}})
	w.fake.SetRole("jwt", "by-name", vault.Role{UserClaim: "sub", BoundSubject: vmID, BoundAudiences: []string{audience}, TokenPolicies: []string{"by-name"}})
	s, err := w.login(t, "by-name", w.issuer.Mint(vmID, []string{audience}, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodGet, w.addr+"/v1/secret/data/hyperfleet/"+vmID, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Vault-Token", s.Auth.ClientToken)
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusTemporaryRedirect {
		t.Fatalf("GET of a path with spiffe:// in it: %s, want a redirect to the cleaned path", resp.Status)
	}
}

// TestTokenNumUses: a token with a use count spends one per request,
// denied ones too, and is gone after the last.
func TestTokenNumUses(t *testing.T) {
	w := newWorld(t)
	w.fake.SetRole("jwt", "uid-a", vault.Role{
		UserClaim: "sub", BoundSubject: vmID, BoundAudiences: []string{audience},
		TokenPolicies: []string{"hyperfleet-vm"}, TokenNoDefaultPolicy: true, TokenNumUses: 2,
	})
	if _, err := w.client(t, operatorToken).KVv2("secret").Put(context.Background(), vmPath, map[string]any{"a": "b"}); err != nil {
		t.Fatal(err)
	}
	s, err := w.login(t, "uid-a", w.issuer.Mint(vmID, []string{audience}, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.Auth.Policies, []string{"hyperfleet-vm"}) {
		t.Fatalf("policies %q, want only the role's", s.Auth.Policies)
	}
	kv := w.client(t, s.Auth.ClientToken).KVv2("secret")
	_, err = kv.Get(context.Background(), otherPath)
	wantVaultError(t, err, http.StatusForbidden, "1 error occurred:\n\t* permission denied\n\n")
	if _, err := kv.Get(context.Background(), vmPath); err != nil {
		t.Fatalf("second use: %v", err)
	}
	_, err = kv.Get(context.Background(), vmPath)
	wantVaultError(t, err, http.StatusForbidden, "1 error occurred:\n\t* permission denied\n\n")
}
