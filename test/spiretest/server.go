package spiretest

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	agentv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/agent/v1"
	bundlev1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/bundle/v1"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
)

// StartTimeout bounds how long StartServer waits for the server's admin API
// to answer: generous, for a CI machine's two loaded cores.
var StartTimeout = 2 * time.Minute

// Server is a running spire-server.
type Server struct {
	// TrustDomain is the server's trust domain, e.g. example.org.
	TrustDomain string
	// Dir holds the configuration, the data (datastore, keys) and the log.
	Dir string
	// SocketPath is the admin API's unix socket: every caller on it is an
	// administrator of the Server API.
	SocketPath string
	// Address is the loopback host:port agents attest and sync to.
	Address string
	// Bundle is the trust domain's X.509 authorities (PEM) when the server
	// started; agents get it as their bootstrap bundle.
	Bundle []byte
	// BundlePath is a file holding Bundle.
	BundlePath string

	// Conn reaches the Server API over SocketPath; Agents, Entries and
	// Bundles are its clients.
	Conn    *grpc.ClientConn
	Agents  agentv1.AgentClient
	Entries entryv1.EntryClient
	Bundles bundlev1.BundleClient

	addr *net.TCPAddr
	proc *process
}

// serverConfig is spire-server's configuration: one trust domain, the
// sqlite datastore and disk key manager in the data directory, the
// join_token node attestor, the admin API on a unix socket and the agent
// API on a loopback port (where callers in admin_ids, if any, administer it
// too).
const serverConfig = `server {
	bind_address = %q
	bind_port = %d
	socket_path = %q
	trust_domain = %q
	data_dir = %q
	log_level = "INFO"
	default_x509_svid_ttl = "1h"
	default_jwt_svid_ttl = "5m"
%s}

plugins {
	DataStore "sql" {
		plugin_data {
			database_type = "sqlite3"
			connection_string = %q
		}
	}
	KeyManager "disk" {
		plugin_data {
			keys_path = %q
		}
	}
	NodeAttestor "join_token" {
		plugin_data {}
	}
}
`

// ServerOption changes the server StartServer configures.
type ServerOption func(*serverOptions)

type serverOptions struct {
	adminIDs []string
}

// WithAdminIDs lists SPIFFE IDs in the server's admin_ids: a caller that
// presents an X509-SVID with one of them on the server's TCP port is an
// administrator, as a caller on the admin socket is.
func WithAdminIDs(ids ...string) ServerOption {
	return func(o *serverOptions) { o.adminIDs = append(o.adminIDs, ids...) }
}

// configLines renders the options as lines of the server block.
func (o serverOptions) configLines() string {
	if len(o.adminIDs) == 0 {
		return ""
	}
	quoted := make([]string, len(o.adminIDs))
	for i, id := range o.adminIDs {
		quoted[i] = strconv.Quote(id)
	}
	return "\tadmin_ids = [" + strings.Join(quoted, ", ") + "]\n"
}

// StartServer starts a spire-server for trustDomain on a free loopback
// port and waits until its admin API answers; t.Cleanup stops it. A server
// that does not start fails the test, with its log.
func StartServer(t testing.TB, trustDomain string, opts ...ServerOption) *Server {
	t.Helper()
	var o serverOptions
	for _, opt := range opts {
		opt(&o)
	}
	bin := filepath.Join(SpireDir(t), "spire-server")
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	addr := freeLoopbackAddress(t)
	s := &Server{
		TrustDomain: trustDomain,
		Dir:         dir,
		SocketPath:  filepath.Join(socketDir(t), "server.sock"),
		Address:     addr.String(),
		addr:        addr,
		BundlePath:  filepath.Join(dir, "bundle.pem"),
	}
	conf := filepath.Join(dir, "server.conf")
	writeFile(t, conf, fmt.Appendf(nil, serverConfig,
		addr.IP.String(), addr.Port, s.SocketPath, trustDomain, data, o.configLines(),
		filepath.Join(data, "datastore.sqlite3"), filepath.Join(data, "keys.json")))

	s.proc = startProcess(t, "spire-server", filepath.Join(dir, "server.log"), bin, "run", "-config", conf)
	conn, err := grpc.NewClient("unix://"+s.SocketPath, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("creating a Server API client for %s: %v", s.SocketPath, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	s.Conn = conn
	s.Agents = agentv1.NewAgentClient(conn)
	s.Entries = entryv1.NewEntryClient(conn)
	s.Bundles = bundlev1.NewBundleClient(conn)

	bundle, err := s.waitForBundle(StartTimeout)
	if err != nil {
		t.Fatalf("spire-server did not start: %v\nspire-server log:\n%s", err, s.proc.log())
	}
	s.Bundle = bundle
	writeFile(t, s.BundlePath, bundle)
	return s
}

// waitForBundle asks the admin API for the trust domain's bundle until it
// answers, the process exits or timeout passes, and returns the bundle's
// X.509 authorities as PEM.
func (s *Server) waitForBundle(timeout time.Duration) ([]byte, error) {
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		b, err := s.Bundles.GetBundle(ctx, &bundlev1.GetBundleRequest{})
		cancel()
		if err == nil {
			return bundlePEM(b)
		}
		if exit := s.proc.exitErr(); exit != nil {
			return nil, exit
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no answer from the admin API at %s within %s: %w", s.SocketPath, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func bundlePEM(b *types.Bundle) ([]byte, error) {
	if len(b.GetX509Authorities()) == 0 {
		return nil, fmt.Errorf("the bundle of %s has no X.509 authority", b.GetTrustDomain())
	}
	var out []byte
	for _, a := range b.GetX509Authorities() {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.GetAsn1()})...)
	}
	return out, nil
}

// JWKS returns the trust domain's JWT authorities, the keys JWT-SVIDs are
// signed with, as a JSON Web Key Set: what SPIRE's OIDC discovery provider
// serves at /keys and a secret store's jwks_url points to.
func (s *Server) JWKS(ctx context.Context) ([]byte, error) {
	b, err := s.Bundles.GetBundle(ctx, &bundlev1.GetBundleRequest{})
	if err != nil {
		return nil, fmt.Errorf("getting the bundle of %s: %w", s.TrustDomain, err)
	}
	var set jose.JSONWebKeySet
	for _, a := range b.GetJwtAuthorities() {
		key, err := x509.ParsePKIXPublicKey(a.GetPublicKey())
		if err != nil {
			return nil, fmt.Errorf("JWT authority %s: %w", a.GetKeyId(), err)
		}
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: key, KeyID: a.GetKeyId(), Use: "sig"})
	}
	if len(set.Keys) == 0 {
		return nil, fmt.Errorf("the bundle of %s has no JWT authority", s.TrustDomain)
	}
	return json.Marshal(set)
}

// ID returns the SPIFFE ID path in the server's trust domain as the Server
// API's type.
func (s *Server) ID(path string) *types.SPIFFEID {
	return &types.SPIFFEID{TrustDomain: s.TrustDomain, Path: path}
}

// JoinTokenAgentID is the SPIFFE ID the server gives an agent attested with
// token (the join_token attestor's own, spiffe://<trust domain>/spire/agent/join_token/<token>);
// the agent_id given to CreateJoinToken is an alias for it.
func (s *Server) JoinTokenAgentID(token string) *types.SPIFFEID {
	return s.ID("/spire/agent/join_token/" + token)
}

// CreateJoinToken creates a single-use join token valid for ttl for the
// agent whose alias is agentPath (a SPIFFE ID path in the trust domain;
// registration entries name it as their parent).
func (s *Server) CreateJoinToken(ctx context.Context, agentPath string, ttl time.Duration) (string, error) {
	tok, err := s.Agents.CreateJoinToken(ctx, &agentv1.CreateJoinTokenRequest{
		Ttl:     int32(ttl / time.Second),
		AgentId: s.ID(agentPath),
	})
	if err != nil {
		return "", fmt.Errorf("creating a join token for %s: %w", agentPath, err)
	}
	return tok.GetValue(), nil
}

// CreateEntries creates registration entries in one BatchCreateEntry call.
// An entry that already exists counts as created, so that a caller may
// repeat the call; any other failed entry is an error naming it.
func (s *Server) CreateEntries(ctx context.Context, entries ...*types.Entry) error {
	resp, err := s.Entries.BatchCreateEntry(ctx, &entryv1.BatchCreateEntryRequest{Entries: entries})
	if err != nil {
		return fmt.Errorf("creating %d registration entries: %w", len(entries), err)
	}
	for i, r := range resp.GetResults() {
		switch c := codes.Code(r.GetStatus().GetCode()); c {
		case codes.OK, codes.AlreadyExists:
		default:
			return fmt.Errorf("creating registration entry %q: %s: %s", entries[i].GetId(), c, r.GetStatus().GetMessage())
		}
	}
	return nil
}

// Stop stops the server (t.Cleanup does it too).
func (s *Server) Stop() {
	_ = s.Conn.Close()
	s.proc.stop()
}

// Exited is closed when the server process has exited.
func (s *Server) Exited() <-chan struct{} { return s.proc.done }

// Log returns the server's log so far.
func (s *Server) Log() string { return s.proc.log() }
