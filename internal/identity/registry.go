// Package identity gives the VMs of HypervisorClusters with spec.spire
// their SPIFFE identities: it keeps one SPIRE Server API connection per
// cluster with the server's trust bundle, and issues, checks and releases
// the join token and registration entries of each MachineClaim
// (docs/identity.md). The MachineClaim controller decides when; this
// package knows how.
package identity

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/spire"
)

// bundleRefresh is how often a connected server's trust bundle is read
// again. SPIRE rotates its CA well ahead of expiry (half its ttl) and
// publishes the next key in the bundle before it signs with it, so a
// minute-old bundle verifies every SVID in circulation.
const bundleRefresh = time.Minute

// Dialer connects to a SPIRE server; spire.Dial outside tests.
type Dialer func(ctx context.Context, cfg spire.Config) (ServerAPI, error)

// ServerAPI is the part of the SPIRE Server API the operator uses
// (*spire.Client).
type ServerAPI interface {
	X509Bundle(ctx context.Context) (*x509bundle.Bundle, error)
	CreateJoinToken(ctx context.Context, token string, ttl time.Duration, agentID spiffeid.ID) (time.Time, error)
	EnsureEntry(ctx context.Context, e spire.Entry) error
	DeleteEntries(ctx context.Context, ids ...string) error
	DeleteEntriesBySPIFFEID(ctx context.Context, id spiffeid.ID) (int, error)
	Agent(ctx context.Context, id spiffeid.ID) (spire.Agent, bool, error)
	DeleteAgent(ctx context.Context, id spiffeid.ID) error
	Close() error
}

// Registry holds the SPIRE server of each HypervisorCluster that has
// spec.spire. Every replica has one: the leader's cluster controller keeps
// it current, and every replica's credential broker connects on demand to
// verify the SVIDs presented to it.
type Registry struct {
	// Dial connects to a server; spire.Dial when nil.
	Dial Dialer
	// Now is the clock; time.Now when nil.
	Now func() time.Time

	mu      sync.Mutex
	servers map[string]*Server
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{servers: map[string]*Server{}} }

// Server is one cluster's connected SPIRE server.
type Server struct {
	// Cluster is the HypervisorCluster's name.
	Cluster string
	// Config is the spec.spire it was connected with.
	Config hfv1.SPIREConfig
	// TrustDomain is Config.TrustDomain, parsed.
	TrustDomain spiffeid.TrustDomain
	// API is the Server API connection.
	API ServerAPI

	configKey string
	mu        sync.Mutex
	bundle    *x509bundle.Bundle
	bundlePEM string
	readAt    time.Time
}

// Bundle is the server's X.509 trust bundle as last read.
func (s *Server) Bundle() (*x509bundle.Bundle, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bundle, s.bundlePEM
}

// Connect returns the cluster's server for cfg, dialling it when the
// cluster has none or had another configuration, and reads its trust
// bundle when it is older than a minute. The error says what to fix in
// spec.spire.
func (r *Registry) Connect(ctx context.Context, cluster string, cfg hfv1.SPIREConfig) (*Server, error) {
	key := configKey(cfg)
	r.mu.Lock()
	if r.servers == nil {
		r.servers = map[string]*Server{}
	}
	s := r.servers[cluster]
	if s != nil && s.configKey != key {
		_ = s.API.Close()
		delete(r.servers, cluster)
		s = nil
	}
	if s == nil {
		td, err := spiffeid.TrustDomainFromString(cfg.TrustDomain)
		if err != nil {
			r.mu.Unlock()
			return nil, fmt.Errorf("spec.spire.trustDomain %q: %w", cfg.TrustDomain, err)
		}
		sc, err := apiConfig(td, cfg.ServerAPI)
		if err != nil {
			r.mu.Unlock()
			return nil, err
		}
		dial := r.Dial
		if dial == nil {
			dial = func(ctx context.Context, c spire.Config) (ServerAPI, error) { return spire.Dial(ctx, c) }
		}
		api, err := dial(ctx, sc)
		if err != nil {
			r.mu.Unlock()
			return nil, fmt.Errorf("connect to the SPIRE Server API (spec.spire.serverAPI): %w", err)
		}
		s = &Server{Cluster: cluster, Config: *cfg.DeepCopy(), TrustDomain: td, API: api, configKey: key}
		r.servers[cluster] = s
	}
	r.mu.Unlock()
	return s, s.refreshBundle(ctx, r.now(), false)
}

// Refresh reads the server's bundle again now.
func (r *Registry) Refresh(ctx context.Context, s *Server) error {
	return s.refreshBundle(ctx, r.now(), true)
}

func (s *Server) refreshBundle(ctx context.Context, now time.Time, force bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !force && s.bundle != nil && now.Sub(s.readAt) < bundleRefresh {
		return nil
	}
	b, err := s.API.X509Bundle(ctx)
	if err != nil {
		return fmt.Errorf("read the trust bundle of SPIRE server %s (spec.spire.serverAPI): %w", s.TrustDomain, err)
	}
	if b.TrustDomain() != s.TrustDomain {
		return fmt.Errorf("the SPIRE server's bundle is for trust domain %s, not spec.spire.trustDomain %s: fix spec.spire.trustDomain", b.TrustDomain(), s.TrustDomain)
	}
	if len(b.X509Authorities()) == 0 {
		return fmt.Errorf("the SPIRE server of trust domain %s has no X.509 authorities in its bundle", s.TrustDomain)
	}
	s.bundle, s.bundlePEM, s.readAt = b, spire.BundlePEM(b), now
	return nil
}

// Server is the cluster's connected server with a trust bundle, if any.
func (r *Registry) Server(cluster string) (*Server, bool) {
	r.mu.Lock()
	s := r.servers[cluster]
	r.mu.Unlock()
	if s == nil {
		return nil, false
	}
	if b, _ := s.Bundle(); b == nil {
		return nil, false
	}
	return s, true
}

// Remove closes and forgets the cluster's server.
func (r *Registry) Remove(cluster string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.servers[cluster]; s != nil {
		_ = s.API.Close()
		delete(r.servers, cluster)
	}
}

// Close closes every connection.
func (r *Registry) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, s := range r.servers {
		_ = s.API.Close()
		delete(r.servers, name)
	}
}

func (r *Registry) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// apiConfig turns spec.spire.serverAPI into the client's configuration.
func apiConfig(td spiffeid.TrustDomain, api hfv1.SPIREServerAPI) (spire.Config, error) {
	cfg := spire.Config{TrustDomain: td, AdminSocket: api.AdminSocket}
	if api.Address == "" {
		return cfg, nil
	}
	serverID, err := spiffeid.FromPath(td, "/spire/server")
	if err != nil {
		return spire.Config{}, fmt.Errorf("spec.spire.trustDomain: %w", err)
	}
	if api.ServerID != "" {
		if serverID, err = spiffeid.FromString(api.ServerID); err != nil {
			return spire.Config{}, fmt.Errorf("spec.spire.serverAPI.serverID %q: %w", api.ServerID, err)
		}
	}
	cfg.MTLS = &spire.MTLSConfig{Address: api.Address, ServerID: serverID, WorkloadAPISocket: api.WorkloadAPISocket}
	return cfg, nil
}

// configKey identifies what a connection depends on: a change to the
// server API settings or the trust domain reconnects, other fields do not.
func configKey(cfg hfv1.SPIREConfig) string {
	b, _ := json.Marshal(struct {
		TD  string
		API hfv1.SPIREServerAPI
	}{cfg.TrustDomain, cfg.ServerAPI})
	sum := sha256.Sum256(b)
	return fmt.Sprintf("%x", sum[:8])
}

// ByTrustDomain is a connected server of trust domain td, whichever
// cluster it was connected for: every server of one trust domain holds
// the same entries (it is one SPIRE deployment), so a claim's identity can
// be released through any of them, even after its template moved to
// another cluster.
func (r *Registry) ByTrustDomain(td spiffeid.TrustDomain) (*Server, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.servers {
		if s.TrustDomain == td {
			if b, _ := s.Bundle(); b != nil {
				return s, true
			}
		}
	}
	return nil, false
}

// Bundles is the X.509 trust bundle of every connected trust domain, for
// verifying the SVIDs VMs present to the credential broker.
func (r *Registry) Bundles() *x509bundle.Set {
	r.mu.Lock()
	defer r.mu.Unlock()
	set := x509bundle.NewSet()
	for _, s := range r.servers {
		if b, _ := s.Bundle(); b != nil {
			set.Add(b)
		}
	}
	return set
}
