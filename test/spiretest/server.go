package spiretest

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	agentv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/agent/v1"
	bundlev1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/bundle/v1"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hyperfleet/hyperfleet/internal/testworld/spireworld"
)

// Server is a running spire-server (internal/testworld/spireworld) with Server API
// clients on its admin socket.
type Server struct {
	*spireworld.Server

	// Conn reaches the Server API over SocketPath; Agents, Entries and
	// Bundles are its clients.
	Conn    *grpc.ClientConn
	Agents  agentv1.AgentClient
	Entries entryv1.EntryClient
	Bundles bundlev1.BundleClient
}

// ServerOption changes the server StartServer configures.
type ServerOption func(*spireworld.ServerOptions)

// WithAdminIDs lists SPIFFE IDs in the server's admin_ids: a caller that
// presents an X509-SVID with one of them on the server's TCP port is an
// administrator, as a caller on the admin socket is.
func WithAdminIDs(ids ...string) ServerOption {
	return func(o *spireworld.ServerOptions) { o.AdminIDs = append(o.AdminIDs, ids...) }
}

// WithTPMDevIDAttestor adds SPIRE's tpm_devid node attestor, trusting DevID
// certificates signed by the CAs in the PEM file devIDCAPath and EK
// certificates signed by those in endorsementCAPath.
func WithTPMDevIDAttestor(devIDCAPath, endorsementCAPath string) ServerOption {
	return func(o *spireworld.ServerOptions) {
		o.TPMDevID = &spireworld.TPMDevIDServer{DevIDCAPath: devIDCAPath, EndorsementCAPath: endorsementCAPath}
	}
}

// StartServer starts a spire-server for trustDomain on a free loopback
// port and waits until its admin API answers; t.Cleanup stops it. A server
// that does not start fails the test, with its log.
func StartServer(t testing.TB, trustDomain string, opts ...ServerOption) *Server {
	t.Helper()
	SpireDir(t) // a missing binary fails here, with the reason
	o := spireworld.ServerOptions{TrustDomain: trustDomain, Dir: t.TempDir()}
	for _, opt := range opts {
		opt(&o)
	}
	ws, err := spireworld.StartServer(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopAndDump(t, "spire-server", filepath.Join(o.Dir, "server.log"), ws.Process()); ws.Stop() })
	conn, err := grpc.NewClient("unix://"+ws.SocketPath, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("creating a Server API client for %s: %v", ws.SocketPath, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &Server{Server: ws, Conn: conn, Agents: agentv1.NewAgentClient(conn), Entries: entryv1.NewEntryClient(conn), Bundles: bundlev1.NewBundleClient(conn)}
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
	s.Server.Stop()
}

// Exited is closed when the server process has exited.
func (s *Server) Exited() <-chan struct{} { return s.Process().Done() }
