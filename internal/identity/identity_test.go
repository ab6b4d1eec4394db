package identity

import (
	"context"
	"crypto/x509"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
	"github.com/hyperfleet/hyperfleet/internal/spire"
)

// fakeServer is an in-memory SPIRE Server API: tokens, entries and agents.
// The real one is exercised by test/spiretest and the end-to-end tests;
// this one checks what the issuer asks for, and in what order.
type fakeServer struct {
	td     spiffeid.TrustDomain
	bundle *x509bundle.Bundle

	mu      sync.Mutex
	tokens  map[string]spiffeid.ID // token -> agent alias
	entries map[string]spire.Entry // id -> entry
	aliases map[spiffeid.ID]int    // alias entries by spiffe id
	agents  map[spiffeid.ID]bool
	bundles int
	closed  bool
	fail    error
}

func newFakeServer(t *testing.T, td string) *fakeServer {
	t.Helper()
	c, err := selfsigned.New("spire.invalid")
	if err != nil {
		t.Fatal(err)
	}
	d := spiffeid.RequireTrustDomainFromString(td)
	return &fakeServer{td: d, bundle: x509bundle.FromX509Authorities(d, []*x509.Certificate{c.Leaf}),
		tokens: map[string]spiffeid.ID{}, entries: map[string]spire.Entry{}, aliases: map[spiffeid.ID]int{}, agents: map[spiffeid.ID]bool{}}
}

func (f *fakeServer) X509Bundle(context.Context) (*x509bundle.Bundle, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bundles++
	return f.bundle, f.fail
}

func (f *fakeServer) CreateJoinToken(_ context.Context, token string, ttl time.Duration, agentID spiffeid.ID) (time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return time.Time{}, f.fail
	}
	if _, ok := f.tokens[token]; !ok {
		f.aliases[agentID]++
	}
	f.tokens[token] = agentID
	return time.Unix(1_700_000_000, 0).Add(ttl), nil
}

func (f *fakeServer) EnsureEntry(_ context.Context, e spire.Entry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.entries[e.ID] = e
	return nil
}

func (f *fakeServer) DeleteEntries(_ context.Context, ids ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		delete(f.entries, id)
	}
	return nil
}

func (f *fakeServer) DeleteEntriesBySPIFFEID(_ context.Context, id spiffeid.ID) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.aliases[id]
	delete(f.aliases, id)
	return n, nil
}

func (f *fakeServer) Agent(_ context.Context, id spiffeid.ID) (spire.Agent, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return spire.Agent{ID: id}, f.agents[id], nil
}

func (f *fakeServer) DeleteAgent(_ context.Context, id spiffeid.ID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.agents, id)
	return nil
}

func (f *fakeServer) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}

// attest marks token's agent attested, as spire-agent does with it.
func (f *fakeServer) attest(token string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.tokens[token]; ok {
		f.agents[spire.JoinTokenAgentID(f.td, token)] = true
		delete(f.tokens, token)
	}
}

func cfg(td, socket string) hfv1.SPIREConfig {
	return hfv1.SPIREConfig{TrustDomain: td, ServerAddress: "spire.example.org:8081", ServerAPI: hfv1.SPIREServerAPI{AdminSocket: socket}}
}

// registry returns a registry whose dials give the fake servers by trust
// domain, counting dials.
func registry(servers ...*fakeServer) (*Registry, *int) {
	dials := 0
	r := NewRegistry()
	r.Dial = func(_ context.Context, c spire.Config) (ServerAPI, error) {
		dials++
		for _, s := range servers {
			if s.td == c.TrustDomain {
				return s, nil
			}
		}
		return nil, errors.New("no such server")
	}
	return r, &dials
}

func TestRegistryConnectsOncePerConfiguration(t *testing.T) {
	ctx := context.Background()
	a, b := newFakeServer(t, "a.example"), newFakeServer(t, "b.example")
	now := time.Unix(1_700_000_000, 0)
	r, dials := registry(a, b)
	r.Now = func() time.Time { return now }

	s1, err := r.Connect(ctx, "c1", cfg("a.example", "/run/spire/a.sock"))
	if err != nil {
		t.Fatal(err)
	}
	// The same configuration again: the same connection, the bundle not
	// read again within a minute.
	s2, err := r.Connect(ctx, "c1", cfg("a.example", "/run/spire/a.sock"))
	if err != nil || s2 != s1 || *dials != 1 || a.bundles != 1 {
		t.Fatalf("second Connect: %v, same %v, dials %d, bundle reads %d", err, s2 == s1, *dials, a.bundles)
	}
	now = now.Add(2 * time.Minute)
	if _, err := r.Connect(ctx, "c1", cfg("a.example", "/run/spire/a.sock")); err != nil || a.bundles != 2 {
		t.Fatalf("after a minute the bundle is read again: %v, reads %d", err, a.bundles)
	}
	// Another server API setting reconnects and closes the old one.
	s3, err := r.Connect(ctx, "c1", cfg("a.example", "/run/spire/other.sock"))
	if err != nil || s3 == s1 || *dials != 2 || !a.closed {
		t.Fatalf("changed socket: %v, new %v, dials %d, old closed %v", err, s3 != s1, *dials, a.closed)
	}
	// A second trust domain; both bundles verify.
	if _, err := r.Connect(ctx, "c2", cfg("b.example", "/run/spire/b.sock")); err != nil {
		t.Fatal(err)
	}
	set := r.Bundles()
	for _, td := range []spiffeid.TrustDomain{a.td, b.td} {
		if _, ok := set.Get(td); !ok {
			t.Errorf("Bundles lacks %s", td)
		}
	}
	if s, ok := r.ByTrustDomain(b.td); !ok || s.Cluster != "c2" {
		t.Errorf("ByTrustDomain(%s) = %v, %v", b.td, s, ok)
	}
	r.Remove("c2")
	if _, ok := r.Server("c2"); ok || !b.closed {
		t.Error("Remove kept the server or did not close it")
	}
}

func TestRegistryRefusesAWrongTrustDomain(t *testing.T) {
	// The socket leads to a server of another trust domain than
	// spec.spire says: its bundle must not verify this cluster's VMs.
	other := newFakeServer(t, "other.example")
	r := NewRegistry()
	r.Dial = func(context.Context, spire.Config) (ServerAPI, error) { return other, nil }
	_, err := r.Connect(context.Background(), "c1", cfg("a.example", "/run/spire/a.sock"))
	if err == nil || !strings.Contains(err.Error(), "fix spec.spire.trustDomain") {
		t.Fatalf("Connect = %v, want a trust domain mismatch naming the field", err)
	}
	if _, ok := r.Server("c1"); ok {
		t.Error("a server whose bundle did not verify is offered")
	}
}

func claim(uid string) *hfv1.MachineClaim {
	return &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "runner-1", UID: types.UID("0b7c" + uid)}}
}

func TestIssueAttestRelease(t *testing.T) {
	ctx := context.Background()
	fs := newFakeServer(t, "example.org")
	r, _ := registry(fs)
	srv, err := r.Connect(ctx, "c1", cfg("example.org", "/run/spire/api.sock"))
	if err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 32)
	iss := &Issuer{Key: key, AgentUID: 0}
	c := claim("-1")
	if _, err := iss.Issue(ctx, srv, c, time.Minute); err == nil {
		t.Fatal("Issue without a recorded identity succeeded")
	}
	plan, err := Plan(srv, c)
	if err != nil {
		t.Fatal(err)
	}
	if plan.SPIFFEID != "spiffe://example.org/vm/ci/runner-1/0b7c-1" || plan.EntryID != "hyperfleet.0b7c-1" ||
		plan.NodeID != "spiffe://example.org/hyperfleet/node/ci/runner-1/0b7c-1" {
		t.Fatalf("Plan = %+v", plan)
	}
	c.Status.Identity = plan
	exp, err := iss.Issue(ctx, srv, c, 15*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Unix(1_700_000_000, 0).Add(15 * time.Minute); !exp.Equal(want) {
		t.Errorf("expiry %s, want %s", exp, want)
	}
	// Repeating the pass (a restart before the status write) issues the
	// same token: one alias, one entry.
	if _, err := iss.Issue(ctx, srv, c, 15*time.Minute); err != nil {
		t.Fatal(err)
	}
	token, _ := iss.Token(c)
	if len(fs.tokens) != 1 || fs.tokens[token].String() != plan.NodeID || fs.aliases[fs.tokens[token]] != 1 {
		t.Fatalf("tokens %v aliases %v", fs.tokens, fs.aliases)
	}
	e := fs.entries[plan.EntryID]
	if e.SPIFFEID.String() != plan.SPIFFEID || e.ParentID.String() != plan.NodeID || len(e.Selectors) != 1 || e.Selectors[0].String() != "unix:uid:0" {
		t.Fatalf("entry %+v", e)
	}
	// Another claim gets another token.
	if other, _ := iss.Token(claim("-2")); other == token {
		t.Error("two claims derive the same join token")
	}

	if ok, err := iss.Attested(ctx, srv, c); err != nil || ok {
		t.Fatalf("Attested before the agent attested: %v, %v", ok, err)
	}
	fs.attest(token)
	if ok, err := iss.Attested(ctx, srv, c); err != nil || !ok {
		t.Fatalf("Attested after the agent attested: %v, %v", ok, err)
	}

	if err := iss.Release(ctx, srv, c); err != nil {
		t.Fatal(err)
	}
	if len(fs.entries) != 0 || len(fs.aliases) != 0 || len(fs.agents) != 0 {
		t.Errorf("left after Release: entries %v aliases %v agents %v", fs.entries, fs.aliases, fs.agents)
	}
	if err := iss.Release(ctx, srv, c); err != nil {
		t.Errorf("a second Release: %v", err)
	}
}

func TestIssuerRefusesAnEditedIdentity(t *testing.T) {
	// status.identity is only as trustworthy as who can write the claim's
	// status: an identity naming another claim's entry is never acted on.
	ctx := context.Background()
	fs := newFakeServer(t, "example.org")
	r, _ := registry(fs)
	srv, err := r.Connect(ctx, "c1", cfg("example.org", "/run/spire/api.sock"))
	if err != nil {
		t.Fatal(err)
	}
	iss := &Issuer{Key: make([]byte, 32)}
	victim, c := claim("-victim"), claim("-1")
	plan, _ := Plan(srv, victim)
	c.Status.Identity = plan
	for name, f := range map[string]func() error{
		"Issue":   func() error { _, err := iss.Issue(ctx, srv, c, time.Minute); return err },
		"Release": func() error { return iss.Release(ctx, srv, c) },
	} {
		if err := f(); err == nil || !strings.Contains(err.Error(), "is not this claim's identity") {
			t.Errorf("%s with another claim's identity: %v", name, err)
		}
	}
	if len(fs.tokens) != 0 || len(fs.entries) != 0 {
		t.Errorf("created for an edited identity: tokens %v entries %v", fs.tokens, fs.entries)
	}
	if _, err := (&Issuer{}).Token(c); err == nil {
		t.Error("an issuer without a key derived a token")
	}
}
