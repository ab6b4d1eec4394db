//go:build !windows

package agent

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github/githubvm"
)

// spireSource is w's source for vmA as NewCredentialSource builds it for a
// config with spiffe.secretStore (the attestation itself is exercised with
// a real spire-agent by the end-to-end tests).
func spireSource(t *testing.T, w *storeWorld, sub string) *VaultSource {
	src := w.source(t, vmA, sub)
	src.SPIRE = &BrokerSource{Method: githubvm.MethodJIT}
	return src
}

// TestVaultSourceWaitsForTheOperator: the VM attests before the operator,
// which writes only once it saw the attestation, has stored anything: the
// source waits for the role and the credential.
func TestVaultSourceWaitsForTheOperator(t *testing.T) {
	w := newStoreWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	src := spireSource(t, w, vmA.String())
	go func() {
		time.Sleep(1500 * time.Millisecond)
		_ = w.operator.Put(ctx, vmA, agentconfig.StoredCredential{Method: githubvm.MethodJIT, JITConfig: "eyJqaXQiOjF9"})
	}()
	got, err := src.await(ctx, src.FetchJWTSVID)
	if err != nil {
		t.Fatal(err)
	}
	if got.JITConfig != "eyJqaXQiOjF9" {
		t.Fatalf("credential %v", got)
	}
	if _, _, ok := w.fake.Secret("secret", src.Store.Path); ok {
		t.Fatal("the credential is still stored after the read")
	}
	if n := w.fake.Requests("PUT", "auth/jwt/login"); n < 2 {
		t.Errorf("%d logins; the source did not have to wait (the test proves nothing)", n)
	}
}

func TestVaultSourceExitCodes(t *testing.T) {
	w := newStoreWorld(t)
	ctx := context.Background()
	if err := w.operator.Put(ctx, vmA, agentconfig.StoredCredential{Method: githubvm.MethodJIT, JITConfig: "eyJqaXQiOjF9"}); err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		src     func() *VaultSource
		timeout time.Duration
		code    int
		want    string
	}{
		"another VM's JWT-SVID": {src: func() *VaultSource { return spireSource(t, w, vmB.String()) }, timeout: 10 * time.Second, code: ExitBrokerRefused, want: "invalid subject"},
		"no JWT-SVID": {src: func() *VaultSource {
			s := spireSource(t, w, vmA.String())
			s.FetchJWTSVID = func(context.Context, string) (string, error) { return "", errors.New("no identity issued") }
			return s
		}, timeout: 10 * time.Second, code: ExitAttestation, want: "no identity issued"},
		"another method": {src: func() *VaultSource {
			s := spireSource(t, w, vmA.String())
			s.SPIRE.Method = githubvm.MethodRegistrationToken
			return s
		}, timeout: 10 * time.Second, code: ExitBrokerRefused, want: "bootstrapMethod is runner-token"},
		"never written": {src: func() *VaultSource {
			s := spireSource(t, w, vmB.String())
			s.Store.Role, s.Store.Path = "uid-b", "hyperfleet/example.org/vm/ci/runner-b/uid-b"
			return s
		}, timeout: 2 * time.Second, code: ExitBrokerUnavailable, want: "before the deadline"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			src := tc.src()
			cctx, cancel := context.WithTimeout(ctx, tc.timeout)
			defer cancel()
			_, err := src.await(cctx, src.FetchJWTSVID)
			if exitCode(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("await = %v (exit %d); want exit %d and %q", err, exitCode(err), tc.code, tc.want)
			}
		})
	}
}

func TestParseJWTSVID(t *testing.T) {
	const a, b = "spiffe://example.org/vm/ci/a/1", "spiffe://example.org/vm/ci/b/2"
	out := []byte("token(" + a + "):\n\teyJh.eyJz.c2ln\ntoken(" + b + "):\n\teyJi.eyJ0.c2lo\nbundle(spiffe://example.org):\n\t{\"keys\":[]}\n")
	for _, tc := range []struct{ id, want, err string }{
		{a, "eyJh.eyJz.c2ln", ""},
		{b, "eyJi.eyJ0.c2lo", ""},
		{"", "eyJh.eyJz.c2ln", ""},
		{"spiffe://example.org/vm/ci/c/3", "", "not spiffe://example.org/vm/ci/c/3"},
	} {
		got, err := parseJWTSVID(out, tc.id)
		if got != tc.want || (tc.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("parseJWTSVID(%q) = %q, %v; want %q, %q", tc.id, got, err, tc.want, tc.err)
		}
		if err != nil && strings.Contains(err.Error(), "eyJ") {
			t.Errorf("the error quotes a token: %v", err)
		}
	}
	if _, err := parseJWTSVID([]byte("bundle(spiffe://example.org):\n\t{}\n"), a); err == nil {
		t.Error("output without a token parsed")
	}
}

func TestNewCredentialSourcePicksTheStore(t *testing.T) {
	cfg := &agentconfig.Config{WorkloadMethod: agentconfig.WorkloadBroker, BootstrapMethod: githubvm.MethodJIT,
		SPIFFE: &agentconfig.SPIFFE{BrokerURL: "https://broker.example.com/broker/v1/credential"}}
	if src, err := NewCredentialSource(cfg); err != nil {
		t.Fatal(err)
	} else if _, ok := src.(*BrokerSource); !ok {
		t.Fatalf("with spiffe.brokerURL: %T, want *BrokerSource", src)
	}
	cfg.SPIFFE = &agentconfig.SPIFFE{SecretStore: &agentconfig.SecretStore{Address: "https://vault.example.com:8200", Audience: "a"}}
	src, err := NewCredentialSource(cfg)
	if err != nil {
		t.Fatal(err)
	}
	vs, ok := src.(*VaultSource)
	if !ok || vs.SPIRE == nil || vs.SPIRE.SPIFFE != cfg.SPIFFE || vs.Store.Address != "https://vault.example.com:8200" {
		t.Fatalf("with spiffe.secretStore: %T %+v, want a *VaultSource that attests first", src, src)
	}
}
