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
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/spire"
)

// bundleRefresh is how often a connected server's trust bundle is read
// again. SPIRE rotates its CA well ahead of expiry (half its ttl) and
// publishes the next key in the bundle before it signs with it, so a
// minute-old bundle verifies every SVID in circulation.
const bundleRefresh = time.Minute

// DefaultForcedRefreshInterval is the shortest time between two bundle
// reads of one server that the credential broker may force
// (Registry.ForcedRefreshInterval).
const DefaultForcedRefreshInterval = 30 * time.Second

// bundleReadTimeout bounds one read of a trust bundle. The read is shared
// by every caller that waits for it, so it does not end with the context
// of the caller that started it.
const bundleReadTimeout = 10 * time.Second

// ErrBundleFresh is Refresh's answer when the bundle was read (or a read
// was started) less than Registry.ForcedRefreshInterval ago: reading it
// again would give nothing a verification could use.
var ErrBundleFresh = errors.New("a read of the trust bundle began moments ago; not reading it again yet")

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
	BanAgent(ctx context.Context, id spiffeid.ID) error
	DeleteAgent(ctx context.Context, id spiffeid.ID) error
	// ListEntries and ListAgents list everything, for the orphan sweep
	// (internal/sweeper, spire.go).
	ListEntries(ctx context.Context) ([]spire.Entry, error)
	ListAgents(ctx context.Context) ([]spire.Agent, error)
	Close() error
}

// Registry holds the SPIRE server of each HypervisorCluster that has
// spec.spire. Every replica has one: the leader's cluster controller keeps
// it current, and every replica's credential broker connects on demand to
// verify the SVIDs presented to it.
//
// No lock is held across a call to a SPIRE server: a slow or unreachable
// server (or a flood of requests that make the broker read a bundle) never
// holds up what issuance reads from the registry. Reads of one server's
// bundle are shared by everyone who needs one at the same time, and the
// reads the broker forces for certificates that do not verify are rate
// limited (Refresh), since the broker's callers are not authenticated yet.
type Registry struct {
	// Dial connects to a server; spire.Dial when nil.
	Dial Dialer
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// ForcedRefreshInterval is the shortest time between two bundle reads
	// of one server that Refresh and Lookup start (zero:
	// DefaultForcedRefreshInterval). The reads once a minute for the
	// controllers (Connect) are not limited by it.
	ForcedRefreshInterval time.Duration

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
	// mu guards the fields below; it is never held during a SPIRE call.
	mu        sync.Mutex
	bundle    *x509bundle.Bundle
	bundlePEM string
	// readAt is when the bundle in hand was read, attemptAt when the last
	// read began (whatever came of it).
	readAt, attemptAt time.Time
	// reading is the read in flight, nil when none.
	reading *bundleRead
}

// bundleRead is one read of a server's bundle, shared by every caller
// that waits for it.
type bundleRead struct {
	done chan struct{}
	err  error // set before done is closed
}

// Why a bundle is read, for the metrics.
const (
	// triggerPeriodic: the bundle is older than bundleRefresh, or there is
	// none yet.
	triggerPeriodic = "periodic"
	// triggerForced: an SVID did not verify against the bundle in hand.
	triggerForced = "forced"
)

// Bundle is the server's X.509 trust bundle as last read.
func (s *Server) Bundle() (*x509bundle.Bundle, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bundle, s.bundlePEM
}

// Connect returns the cluster's server for cfg, dialling it when the
// cluster has none or had another configuration, and reads its trust
// bundle when it is older than a minute (a read already under way is
// waited for, not repeated). The error says what to fix in spec.spire.
func (r *Registry) Connect(ctx context.Context, cluster string, cfg hfv1.SPIREConfig) (*Server, error) {
	s, err := r.server(ctx, cluster, cfg)
	if err != nil {
		return nil, err
	}
	return s, s.refresh(ctx, r.now(), triggerPeriodic, 0)
}

// Lookup returns the cluster's server for cfg for the credential broker:
// dialled when the cluster has none (a replica whose controllers are idle
// has none yet), with a bundle. Unlike Connect it reads the bundle only
// when there is none, and at most once per ForcedRefreshInterval: the
// broker asks on behalf of callers it has not authenticated yet.
func (r *Registry) Lookup(ctx context.Context, cluster string, cfg hfv1.SPIREConfig) (*Server, error) {
	s, err := r.server(ctx, cluster, cfg)
	if err != nil {
		return nil, err
	}
	if b, _ := s.Bundle(); b != nil {
		return s, nil
	}
	if err := s.refresh(ctx, r.now(), triggerForced, r.forcedInterval()); err != nil {
		return nil, err
	}
	return s, nil
}

// Refresh reads the server's bundle again for an SVID that did not verify
// against the one in hand (a CA rotated since the last read), unless a
// read began less than ForcedRefreshInterval ago: then it returns
// ErrBundleFresh at once. So whatever certificates anyone presents, the
// broker reads each server's bundle at most once per interval on their
// account. A read under way is waited for, not repeated.
func (r *Registry) Refresh(ctx context.Context, s *Server) error {
	return s.refresh(ctx, r.now(), triggerForced, r.forcedInterval())
}

func (r *Registry) forcedInterval() time.Duration {
	if r.ForcedRefreshInterval > 0 {
		return r.ForcedRefreshInterval
	}
	return DefaultForcedRefreshInterval
}

// server returns the cluster's server for cfg, dialling a new one (outside
// the registry's lock: with mTLS a dial waits for the operator's own SVID)
// when the cluster has none or had another configuration.
func (r *Registry) server(ctx context.Context, cluster string, cfg hfv1.SPIREConfig) (*Server, error) {
	key := configKey(cfg)
	r.mu.Lock()
	s := r.servers[cluster]
	r.mu.Unlock()
	if s != nil && s.configKey == key {
		return s, nil
	}
	td, err := spiffeid.TrustDomainFromString(cfg.TrustDomain)
	if err != nil {
		return nil, fmt.Errorf("spec.spire.trustDomain %q: %w", cfg.TrustDomain, err)
	}
	sc, err := apiConfig(td, cfg.ServerAPI)
	if err != nil {
		return nil, err
	}
	dial := r.Dial
	if dial == nil {
		dial = func(ctx context.Context, c spire.Config) (ServerAPI, error) { return spire.Dial(ctx, c) }
	}
	api, err := dial(ctx, sc)
	if err != nil {
		return nil, fmt.Errorf("connect to the SPIRE Server API (spec.spire.serverAPI): %w", err)
	}
	fresh := &Server{Cluster: cluster, Config: *cfg.DeepCopy(), TrustDomain: td, API: api, configKey: key}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.servers == nil {
		r.servers = map[string]*Server{}
	}
	switch cur := r.servers[cluster]; {
	case cur != nil && cur.configKey == key:
		// Another caller connected it meanwhile: one connection is kept.
		_ = api.Close()
		return cur, nil
	case cur != nil:
		_ = cur.API.Close()
	}
	r.servers[cluster] = fresh
	return fresh, nil
}

// refresh reads the bundle for trigger: a periodic read only when the
// bundle is older than bundleRefresh (or missing), a forced one only when
// no read began within minForced. Callers that need a read while one is
// under way wait for it; each waits at most until its ctx ends.
func (s *Server) refresh(ctx context.Context, now time.Time, trigger string, minForced time.Duration) error {
	s.mu.Lock()
	switch {
	case trigger == triggerPeriodic && s.bundle != nil && now.Sub(s.readAt) < bundleRefresh:
		s.mu.Unlock()
		return nil
	case trigger == triggerForced && s.reading == nil && !s.attemptAt.IsZero() && now.Sub(s.attemptAt) < minForced:
		s.mu.Unlock()
		metrics.SPIREBundleReads.WithLabelValues(trigger, "suppressed").Inc()
		return ErrBundleFresh
	}
	rd := s.reading
	if rd == nil {
		rd = &bundleRead{done: make(chan struct{})}
		s.reading, s.attemptAt = rd, now
		// Detached from ctx: the read is everyone's who waits for it.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bundleReadTimeout)
		go func() {
			defer cancel()
			s.read(rctx, rd, now, trigger)
		}()
	}
	s.mu.Unlock()
	select {
	case <-rd.done:
		return rd.err
	case <-ctx.Done():
		return fmt.Errorf("wait for the trust bundle of SPIRE server %s: %w", s.TrustDomain, ctx.Err())
	}
}

// read makes one bundle read and ends rd with its outcome.
func (s *Server) read(ctx context.Context, rd *bundleRead, now time.Time, trigger string) {
	b, pem, err := s.fetch(ctx)
	result := "read"
	if err != nil {
		result = "failed"
	}
	metrics.SPIREBundleReads.WithLabelValues(trigger, result).Inc()
	s.mu.Lock()
	if err == nil {
		s.bundle, s.bundlePEM, s.readAt = b, pem, now
	}
	s.reading = nil
	s.mu.Unlock()
	rd.err = err
	close(rd.done)
}

// fetch calls the server for its bundle and checks it.
func (s *Server) fetch(ctx context.Context) (*x509bundle.Bundle, string, error) {
	b, err := s.API.X509Bundle(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("read the trust bundle of SPIRE server %s (spec.spire.serverAPI): %w", s.TrustDomain, err)
	}
	if b.TrustDomain() != s.TrustDomain {
		return nil, "", fmt.Errorf("the SPIRE server's bundle is for trust domain %s, not spec.spire.trustDomain %s: fix spec.spire.trustDomain", b.TrustDomain(), s.TrustDomain)
	}
	if len(b.X509Authorities()) == 0 {
		return nil, "", fmt.Errorf("the SPIRE server of trust domain %s has no X.509 authorities in its bundle", s.TrustDomain)
	}
	return b, spire.BundlePEM(b), nil
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

// Servers are the connected servers, by cluster name.
func (r *Registry) Servers() map[string]*Server {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]*Server, len(r.servers))
	for name, s := range r.servers {
		out[name] = s
	}
	return out
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
