// Package spire is the operator's client of the SPIRE Server API: it creates
// the join token a VM's spire-agent attests with, the registration entries
// that give the VM's workloads their identity, and removes both, and the
// agent, when the VM goes. It also holds the scheme of the SPIFFE IDs
// HyperFleet gives VMs and their agents (ids.go).
//
// The client speaks domain types only (Entry, Agent, spiffeid.ID); the
// Server API's protobuf types stay inside. Every call is idempotent in the
// way a reconciler needs: creating what exists and deleting what is gone
// are success. Errors wrap the sentinels in errors.go, which carry their
// errclass class.
package spire

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffegrpc/grpccredentials"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	agentv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/agent/v1"
	bundlev1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/bundle/v1"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Config says which SPIRE server to reach and how the operator proves it
// may administer it: exactly one of AdminSocket or MTLS.
type Config struct {
	// TrustDomain is the server's trust domain; required.
	TrustDomain spiffeid.TrustDomain
	// AdminSocket is the absolute path of spire-server's admin unix socket
	// (its socket_path): every caller that may connect to it is an admin,
	// so it suits an operator that runs beside the server.
	AdminSocket string
	// MTLS reaches the server's TCP port instead, with the operator's own
	// X509-SVID; the server must list that SVID's id in admin_ids (or an
	// admin=true entry must match it).
	MTLS *MTLSConfig
}

// MTLSConfig is how the operator reaches a remote SPIRE server.
type MTLSConfig struct {
	// Address is the host:port of the server API (bind_address:bind_port).
	Address string
	// ServerID is the id the server's certificate must carry; zero means
	// spiffe://<trust domain>/spire/server, the id every SPIRE server has.
	ServerID spiffeid.ID
	// WorkloadAPISocket is the absolute path of the unix socket of the
	// spire-agent that gives the operator its X509-SVID.
	WorkloadAPISocket string
}

// Client calls the SPIRE Server API. Its methods are safe for concurrent
// use.
type Client struct {
	td      spiffeid.TrustDomain
	conn    *grpc.ClientConn
	source  *workloadapi.X509Source // nil with an admin socket
	agents  agentv1.AgentClient
	entries entryv1.EntryClient
	bundles bundlev1.BundleClient
	// notAdminHint is the fix for ErrNotAdmin in this client's mode.
	notAdminHint string

	mu      sync.Mutex
	dialErr error // the admin socket's last connect error, see wrap
}

// Dial validates cfg and returns a client. The gRPC connection is made on
// the first call, so a server that is not up yet is an error of that call
// (ErrUnavailable), not of Dial. With MTLS, Dial waits (until ctx ends) for
// the operator's first X509-SVID from its agent, since no call can succeed
// without it.
func Dial(ctx context.Context, cfg Config) (*Client, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Client{td: cfg.TrustDomain}
	var opts []grpc.DialOption
	target := "passthrough:///spire-server"
	if cfg.MTLS == nil {
		c.notAdminHint = fmt.Sprintf("the operator must be allowed to connect to the admin socket %s: check its owner and mode, and that the operator's pod mounts it", cfg.AdminSocket)
		opts = append(opts,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(c.unixDialer(cfg.AdminSocket)))
	} else {
		m := cfg.MTLS
		serverID := m.ServerID
		if serverID.IsZero() {
			serverID = DefaultServerID(cfg.TrustDomain)
		}
		source, err := workloadapi.NewX509Source(ctx,
			workloadapi.WithClientOptions(workloadapi.WithAddr("unix://"+m.WorkloadAPISocket)))
		if err != nil {
			return nil, fmt.Errorf("getting the operator's X509-SVID from the Workload API at %s (Config.MTLS.WorkloadAPISocket): %w: %w", m.WorkloadAPISocket, ErrUnavailable, err)
		}
		svid, err := source.GetX509SVID()
		if err != nil {
			_ = source.Close()
			return nil, fmt.Errorf("getting the operator's X509-SVID from the Workload API at %s: %w: %w", m.WorkloadAPISocket, ErrUnavailable, err)
		}
		c.source = source
		c.notAdminHint = fmt.Sprintf("add the operator's SPIFFE ID %s to admin_ids in the server's configuration, or register it with an admin entry", svid.ID)
		opts = append(opts, grpc.WithTransportCredentials(
			grpccredentials.MTLSClientCredentials(source, source, tlsconfig.AuthorizeID(serverID))))
		target = "dns:///" + m.Address
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		if c.source != nil {
			_ = c.source.Close()
		}
		return nil, fmt.Errorf("creating a SPIRE Server API client: %w: %w", ErrInvalidConfig, err)
	}
	c.conn = conn
	c.agents = agentv1.NewAgentClient(conn)
	c.entries = entryv1.NewEntryClient(conn)
	c.bundles = bundlev1.NewBundleClient(conn)
	return c, nil
}

// DefaultServerID is spiffe://<td>/spire/server, the id of every SPIRE
// server's own X509-SVID.
func DefaultServerID(td spiffeid.TrustDomain) spiffeid.ID {
	id, err := spiffeid.FromSegments(td, "spire", "server")
	if err != nil {
		panic(fmt.Sprintf("spire: the server id of %q: %v", td, err)) // constant segments: cannot fail
	}
	return id
}

func (cfg Config) validate() error {
	var errs []error
	if cfg.TrustDomain.IsZero() {
		errs = append(errs, errors.New("Config.TrustDomain is required"))
	}
	switch {
	case cfg.AdminSocket == "" && cfg.MTLS == nil:
		errs = append(errs, errors.New("set one of Config.AdminSocket (the server's admin unix socket) or Config.MTLS (its address, with the operator's SVID)"))
	case cfg.AdminSocket != "" && cfg.MTLS != nil:
		errs = append(errs, errors.New("set only one of Config.AdminSocket and Config.MTLS"))
	case cfg.AdminSocket != "":
		if !filepath.IsAbs(cfg.AdminSocket) {
			errs = append(errs, fmt.Errorf("Config.AdminSocket %q is not an absolute path", cfg.AdminSocket))
		}
	default:
		errs = append(errs, cfg.MTLS.validate(cfg.TrustDomain)...)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

func (m *MTLSConfig) validate(td spiffeid.TrustDomain) []error {
	var errs []error
	if host, port, err := net.SplitHostPort(m.Address); err != nil || host == "" || port == "" {
		errs = append(errs, fmt.Errorf("Config.MTLS.Address %q is not host:port", m.Address))
	}
	if !m.ServerID.IsZero() && !td.IsZero() && !m.ServerID.MemberOf(td) {
		errs = append(errs, fmt.Errorf("Config.MTLS.ServerID %s is not in the trust domain %s", m.ServerID, td))
	}
	if !filepath.IsAbs(m.WorkloadAPISocket) {
		errs = append(errs, fmt.Errorf("Config.MTLS.WorkloadAPISocket %q is not an absolute path", m.WorkloadAPISocket))
	}
	return errs
}

// unixDialer connects to the admin socket and remembers the outcome: gRPC
// turns every dial error into Unavailable, and wrap needs to tell a socket
// the operator may not open (a configuration error) from one that is not
// there yet (the server starting).
func (c *Client) unixDialer(path string) func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", path)
		c.mu.Lock()
		c.dialErr = err
		c.mu.Unlock()
		return conn, err
	}
}

func (c *Client) lastDialErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dialErr
}

// Close closes the connection and, with MTLS, stops watching the
// operator's SVID.
func (c *Client) Close() error {
	err := c.conn.Close()
	if c.source != nil {
		err = errors.Join(err, c.source.Close())
	}
	return err
}

// TrustDomain is the server's trust domain.
func (c *Client) TrustDomain() spiffeid.TrustDomain { return c.td }

// X509Bundle returns the trust domain's X.509 authorities as the server has
// them now (GetBundle), for VMs to verify the server and each other by.
func (c *Client) X509Bundle(ctx context.Context) (*x509bundle.Bundle, error) {
	b, err := c.bundles.GetBundle(ctx, &bundlev1.GetBundleRequest{})
	if err != nil {
		return nil, c.wrap("getting the trust domain's bundle", err)
	}
	if b.GetTrustDomain() != c.td.Name() {
		return nil, fmt.Errorf("the SPIRE server's bundle is for the trust domain %q, not %q (Config.TrustDomain)", b.GetTrustDomain(), c.td.Name())
	}
	var certs []*x509.Certificate
	for _, a := range b.GetX509Authorities() {
		cert, err := x509.ParseCertificate(a.GetAsn1())
		if err != nil {
			return nil, fmt.Errorf("parsing an X.509 authority of the bundle of %s: %w", c.td, err)
		}
		certs = append(certs, cert)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("the bundle of %s has no X.509 authority", c.td)
	}
	return x509bundle.FromX509Authorities(c.td, certs), nil
}

// BundlePEM renders the bundle's X.509 authorities as PEM, the form
// spire-agent's trust_bundle_path takes.
func BundlePEM(b *x509bundle.Bundle) string {
	var sb strings.Builder
	for _, cert := range b.X509Authorities() {
		_ = pem.Encode(&sb, &pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
	}
	return sb.String()
}
