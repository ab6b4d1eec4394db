// Package identitytest is an in-memory SPIRE Server API for the tests of
// the operator's identity path (internal/identity, the controllers): join
// tokens, entries and agents, with hooks to attest a token's agent and to
// make the server fail. The real server is exercised by test/spiretest
// and the SPIFFE end-to-end scenarios (test/e2e); this one lets envtest
// tests check what the operator asks for, and in what order, in
// milliseconds. Import it from tests only.
package identitytest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/spire"
)

// Server is the fake SPIRE server of one trust domain.
type Server struct {
	TD     spiffeid.TrustDomain
	bundle *x509bundle.Bundle
	// ca and caKey sign the X509-SVIDs the server hands out.
	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey

	mu sync.Mutex
	// clock is the clock of token expiries; time.Now when nil.
	clock  func() time.Time
	tokens map[string]spiffeid.ID // unused token -> agent alias
	expiry map[string]time.Time   // unused token -> when it expires
	// agentAlias is the alias of each attested agent's join token: the
	// parent of the entries whose SVIDs it gets.
	agentAlias map[spiffeid.ID]spiffeid.ID
	created    map[string]int         // token -> CreateJoinToken calls
	entries    map[string]spire.Entry // id -> entry
	aliases    map[spiffeid.ID]int    // alias entries by spiffe id
	agents     map[spiffeid.ID]bool
	banned     map[spiffeid.ID]bool
	reads      int
	closed     bool
	fail       error
}

// NewServer returns an empty server of trust domain td with a fresh CA in
// its bundle.
func NewServer(t testing.TB, td string) *Server {
	t.Helper()
	d := spiffeid.RequireTrustDomainFromString(td)
	// A CA certificate as SPIRE's (URI SAN the trust domain's id), so
	// that the SVIDs it signs verify with go-spiffe as the broker's do.
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{Organization: []string{"SPIRE"}, CommonName: "identitytest " + td},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		URIs: []*url.URL{d.ID().URL()},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &Server{TD: d, bundle: x509bundle.FromX509Authorities(d, []*x509.Certificate{ca}), ca: ca, caKey: key,
		tokens: map[string]spiffeid.ID{}, expiry: map[string]time.Time{}, agentAlias: map[spiffeid.ID]spiffeid.ID{},
		created: map[string]int{}, entries: map[string]spire.Entry{},
		aliases: map[spiffeid.ID]int{}, agents: map[spiffeid.ID]bool{}, banned: map[spiffeid.ID]bool{}}
}

// Dialer dials s for its trust domain and fails for any other.
func Dialer(servers ...*Server) identity.Dialer {
	return func(_ context.Context, c spire.Config) (identity.ServerAPI, error) {
		for _, s := range servers {
			if s.TD == c.TrustDomain {
				return s, nil
			}
		}
		return nil, fmt.Errorf("identitytest: no server for trust domain %s", c.TrustDomain)
	}
}

// Fail makes every call fail with err (nil: succeed again).
func (s *Server) Fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = err
}

// X509Bundle implements identity.ServerAPI.
func (s *Server) X509Bundle(context.Context) (*x509bundle.Bundle, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	if s.fail != nil {
		return nil, s.fail
	}
	return s.bundle, nil
}

// CreateJoinToken implements identity.ServerAPI; an existing token is
// success, as the real client makes it.
func (s *Server) CreateJoinToken(_ context.Context, token string, ttl time.Duration, agentID spiffeid.ID) (time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return time.Time{}, s.fail
	}
	if _, ok := s.tokens[token]; !ok {
		s.aliases[agentID]++
	}
	s.tokens[token] = agentID
	s.created[token]++
	s.expiry[token] = s.now().Add(ttl)
	return s.expiry[token], nil
}

// EnsureEntry implements identity.ServerAPI.
func (s *Server) EnsureEntry(_ context.Context, e spire.Entry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	s.entries[e.ID] = e
	return nil
}

// DeleteEntries implements identity.ServerAPI.
func (s *Server) DeleteEntries(_ context.Context, ids ...string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	for _, id := range ids {
		delete(s.entries, id)
	}
	return nil
}

// DeleteEntriesBySPIFFEID implements identity.ServerAPI.
func (s *Server) DeleteEntriesBySPIFFEID(_ context.Context, id spiffeid.ID) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return 0, s.fail
	}
	n := s.aliases[id]
	delete(s.aliases, id)
	// Entries made with EnsureEntry under that SPIFFE ID too (a TPM
	// claim's alias), as the real server deletes every one.
	for k, e := range s.entries {
		if e.SPIFFEID == id {
			delete(s.entries, k)
			n++
		}
	}
	return n, nil
}

// ListEntries implements identity.ServerAPI: the entries made with
// EnsureEntry.
func (s *Server) ListEntries(context.Context) ([]spire.Entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return nil, s.fail
	}
	out := make([]spire.Entry, 0, len(s.entries))
	for _, e := range s.entries {
		out = append(out, e)
	}
	return out, nil
}

// ListAgents implements identity.ServerAPI: the join-token agents.
func (s *Server) ListAgents(context.Context) ([]spire.Agent, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return nil, s.fail
	}
	out := make([]spire.Agent, 0, len(s.agents))
	for id := range s.agents {
		out = append(out, spire.Agent{ID: id, AttestationType: "join_token", Banned: s.banned[id]})
	}
	return out, nil
}

// Agent implements identity.ServerAPI.
func (s *Server) Agent(_ context.Context, id spiffeid.ID) (spire.Agent, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return spire.Agent{}, false, s.fail
	}
	return spire.Agent{ID: id, AttestationType: "join_token", Banned: s.banned[id]}, s.agents[id], nil
}

// BanAgent implements identity.ServerAPI: an agent it has is marked
// banned; one it does not have is success, as the real client makes it.
func (s *Server) BanAgent(_ context.Context, id spiffeid.ID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	if s.agents[id] {
		s.banned[id] = true
	}
	return nil
}

// DeleteAgent implements identity.ServerAPI.
func (s *Server) DeleteAgent(_ context.Context, id spiffeid.ID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	delete(s.agents, id)
	delete(s.banned, id)
	delete(s.agentAlias, id)
	return nil
}

// Close implements identity.ServerAPI.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

// Attest spends token as spire-agent does when it attests with it, and
// reports whether it could: a token never created, already used or
// expired (by the server's clock, SetClock) attests nothing, as the real
// server refuses it.
func (s *Server) Attest(token string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	alias, ok := s.tokens[token]
	if !ok || s.now().After(s.expiry[token]) {
		return false
	}
	agent := spire.JoinTokenAgentID(s.TD, token)
	s.agents[agent] = true
	s.agentAlias[agent] = alias
	delete(s.tokens, token)
	delete(s.expiry, token)
	return true
}

// ErrNoSVID is X509SVID's answer when the server would hand the caller
// no SVID of that id.
var ErrNoSVID = errors.New("identitytest: no X509-SVID for this agent and id")

// X509SVID is the X509-SVID of id that the agent which attested with
// token gets through its Workload API, valid for ttl: only an agent that
// attested (Attest), is not banned or deleted, and whose token's alias is
// the parent of a registration entry of id gets one, as SPIRE hands an
// agent the SVIDs of the entries parented by it.
func (s *Server) X509SVID(token string, id spiffeid.ID, ttl time.Duration) (tls.Certificate, error) {
	s.mu.Lock()
	agent := spire.JoinTokenAgentID(s.TD, token)
	attested, banned := s.agents[agent], s.banned[agent]
	alias := s.agentAlias[agent]
	found := false
	for _, e := range s.entries {
		found = found || e.SPIFFEID == id && e.ParentID == alias
	}
	s.mu.Unlock()
	if !attested || banned || !found {
		return tls.Certificate{}, fmt.Errorf("%w: agent %s (attested %v, banned %v), entry of %s under it %v", ErrNoSVID, agent, attested, banned, id, found)
	}
	now := time.Now()
	return s.SignX509SVID(id, now.Add(-time.Minute), now.Add(ttl))
}

// SelfSigned is a certificate anyone can make: self-signed, with id as
// its URI SAN, shaped like an X509-SVID but signed by no SPIRE server.
func SelfSigned(id spiffeid.ID) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate key: %w", err)
	}
	now := time.Now()
	// No CA: sign signs with the certificate's own key.
	return (&Server{caKey: key}).sign(id, key, now.Add(-time.Hour), now.Add(time.Hour))
}

// SignX509SVID is an X509-SVID of id signed by the server's CA, valid
// from notBefore to notAfter, whoever asks: the SVID some other workload
// of the trust domain holds (a registration entry not of the caller's
// agent), or one that expired. X509SVID is what an agent gets.
func (s *Server) SignX509SVID(id spiffeid.ID, notBefore, notAfter time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate SVID key: %w", err)
	}
	return s.sign(id, key, notBefore, notAfter)
}

// sign makes the certificate of id for key, signed by s.ca with s.caKey,
// or self-signed when s has no CA.
func (s *Server) sign(id spiffeid.ID, key *ecdsa.PrivateKey, notBefore, notAfter time.Time) (tls.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("SVID serial: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{Organization: []string{"SPIRE"}},
		NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		URIs:        []*url.URL{id.URL()},
	}
	parent := s.ca
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, s.caKey)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("sign SVID: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("parse SVID: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// State is what the server holds.
type State struct {
	// Tokens are the unused tokens with their agent alias.
	Tokens map[string]spiffeid.ID
	// Created counts CreateJoinToken calls per token.
	Created map[string]int
	// Entries are the registration entries by id.
	Entries map[string]spire.Entry
	// Aliases counts the alias entries per agent alias.
	Aliases map[spiffeid.ID]int
	// Agents are the attested agents, Banned those of them banned.
	Agents []spiffeid.ID
	Banned []spiffeid.ID
	// BundleReads counts X509Bundle calls; Closed is true once closed.
	BundleReads int
	Closed      bool
}

// State returns a copy of what the server holds.
func (s *Server) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := State{Tokens: map[string]spiffeid.ID{}, Created: map[string]int{}, Entries: map[string]spire.Entry{}, Aliases: map[spiffeid.ID]int{},
		BundleReads: s.reads, Closed: s.closed}
	for k, v := range s.tokens {
		st.Tokens[k] = v
	}
	for k, v := range s.created {
		st.Created[k] = v
	}
	for k, v := range s.entries {
		st.Entries[k] = v
	}
	for k, v := range s.aliases {
		st.Aliases[k] = v
	}
	for id := range s.agents {
		st.Agents = append(st.Agents, id)
	}
	for id := range s.banned {
		st.Banned = append(st.Banned, id)
	}
	return st
}

// SetClock sets the clock token expiries are computed from (nil:
// time.Now).
func (s *Server) SetClock(now func() time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clock = now
}

// now is the server's time; s.mu is held.
func (s *Server) now() time.Time {
	if s.clock != nil {
		return s.clock()
	}
	return time.Now()
}
