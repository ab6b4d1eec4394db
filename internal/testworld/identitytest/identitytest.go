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
	"crypto/x509"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
	"github.com/hyperfleet/hyperfleet/internal/spire"
)

// Server is the fake SPIRE server of one trust domain.
type Server struct {
	TD     spiffeid.TrustDomain
	bundle *x509bundle.Bundle

	mu sync.Mutex
	// clock is the clock of token expiries; time.Now when nil.
	clock   func() time.Time
	tokens  map[string]spiffeid.ID // unused token -> agent alias
	created map[string]int         // token -> CreateJoinToken calls
	entries map[string]spire.Entry // id -> entry
	aliases map[spiffeid.ID]int    // alias entries by spiffe id
	agents  map[spiffeid.ID]bool
	banned  map[spiffeid.ID]bool
	reads   int
	closed  bool
	fail    error
}

// NewServer returns an empty server of trust domain td with a fresh CA in
// its bundle.
func NewServer(t testing.TB, td string) *Server {
	t.Helper()
	c, err := selfsigned.New("spire.invalid")
	if err != nil {
		t.Fatal(err)
	}
	d := spiffeid.RequireTrustDomainFromString(td)
	return &Server{TD: d, bundle: x509bundle.FromX509Authorities(d, []*x509.Certificate{c.Leaf}),
		tokens: map[string]spiffeid.ID{}, created: map[string]int{}, entries: map[string]spire.Entry{},
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
	return s.now().Add(ttl), nil
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
	return n, nil
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
// reports whether the token existed.
func (s *Server) Attest(token string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.tokens[token]; !ok {
		return false
	}
	s.agents[spire.JoinTokenAgentID(s.TD, token)] = true
	delete(s.tokens, token)
	return true
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
