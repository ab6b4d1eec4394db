package spire_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	agentv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/agent/v1"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/hyperfleet/hyperfleet/internal/spire"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
)

// fakeServer answers the Server API's agent and entry RPCs on a unix
// socket with what a test sets: the refusals the real server gives only in
// conditions a test cannot make (an outage, a caller that is not an admin).
// test/spiretest runs the client against the real server.
type fakeServer struct {
	agentv1.UnimplementedAgentServer
	entryv1.UnimplementedEntryServer
	// err answers every RPC when set.
	err error
	// createToken answers CreateJoinToken when err is nil.
	createToken error
	// entryStatus is each BatchCreateEntry or BatchDeleteEntry result's.
	entryStatus codes.Code
	entryMsg    string
	created     []*types.Entry
}

func (f *fakeServer) CreateJoinToken(_ context.Context, req *agentv1.CreateJoinTokenRequest) (*types.JoinToken, error) {
	if f.err != nil {
		return nil, f.err
	}
	if f.createToken != nil {
		return nil, f.createToken
	}
	return &types.JoinToken{Value: req.GetToken(), ExpiresAt: 1000}, nil
}

func (f *fakeServer) GetAgent(context.Context, *agentv1.GetAgentRequest) (*types.Agent, error) {
	return nil, f.err
}

func (f *fakeServer) DeleteAgent(context.Context, *agentv1.DeleteAgentRequest) (*emptypb.Empty, error) {
	return nil, f.err
}

func (f *fakeServer) BatchCreateEntry(_ context.Context, req *entryv1.BatchCreateEntryRequest) (*entryv1.BatchCreateEntryResponse, error) {
	if f.err != nil {
		return nil, f.err
	}
	f.created = append(f.created, req.GetEntries()...)
	resp := &entryv1.BatchCreateEntryResponse{}
	for _, e := range req.GetEntries() {
		r := &entryv1.BatchCreateEntryResponse_Result{Status: &types.Status{Code: int32(f.entryStatus), Message: f.entryMsg}}
		if f.entryStatus == codes.OK || f.entryStatus == codes.AlreadyExists {
			r.Entry = e
		}
		resp.Results = append(resp.Results, r)
	}
	return resp, nil
}

func (f *fakeServer) BatchDeleteEntry(_ context.Context, req *entryv1.BatchDeleteEntryRequest) (*entryv1.BatchDeleteEntryResponse, error) {
	if f.err != nil {
		return nil, f.err
	}
	resp := &entryv1.BatchDeleteEntryResponse{}
	for _, id := range req.GetIds() {
		resp.Results = append(resp.Results, &entryv1.BatchDeleteEntryResponse_Result{Id: id, Status: &types.Status{Code: int32(f.entryStatus), Message: f.entryMsg}})
	}
	return resp, nil
}

// startFake serves f on a new unix socket and returns a client of it.
func startFake(t *testing.T, f *fakeServer) *spire.Client {
	t.Helper()
	dir, err := os.MkdirTemp("", "spire")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "api.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	agentv1.RegisterAgentServer(s, f)
	entryv1.RegisterEntryServer(s, f)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	c, err := spire.Dial(context.Background(), spire.Config{TrustDomain: td, AdminSocket: sock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func testEntry(t *testing.T) spire.Entry {
	t.Helper()
	vm, err := spire.VMID(td, "ns", "claim", "uid")
	if err != nil {
		t.Fatal(err)
	}
	node, err := spire.NodeID(td, "ns", "claim", "uid")
	if err != nil {
		t.Fatal(err)
	}
	return spire.Entry{ID: spire.EntryIDFor("uid"), SPIFFEID: vm, ParentID: node, Selectors: []spire.Selector{{Type: "unix", Value: "uid:1000"}}}
}

// TestErrorClasses: the server's refusals become the sentinels, with their
// class, and keep the server's answer (status.Code sees through them).
func TestErrorClasses(t *testing.T) {
	for _, tc := range []struct {
		code     codes.Code
		sentinel error
		class    errclass.Class
	}{
		{codes.PermissionDenied, spire.ErrNotAdmin, errclass.ClassConfiguration},
		{codes.Unauthenticated, spire.ErrNotAdmin, errclass.ClassConfiguration},
		{codes.InvalidArgument, spire.ErrInvalidArgument, errclass.ClassConfiguration},
		{codes.Unavailable, spire.ErrUnavailable, errclass.ClassTransient},
		{codes.DeadlineExceeded, spire.ErrUnavailable, errclass.ClassTransient},
		{codes.Internal, nil, errclass.ClassTransient},
	} {
		f := &fakeServer{err: status.Error(tc.code, "refused")}
		c := startFake(t, f)
		ctx := context.Background()
		e := testEntry(t)
		_, createErr := c.CreateJoinToken(ctx, "tok", time.Minute, e.ParentID)
		_, _, agentErr := c.Agent(ctx, e.ParentID)
		for name, err := range map[string]error{
			"CreateJoinToken": createErr,
			"EnsureEntry":     c.EnsureEntry(ctx, e),
			"DeleteEntries":   c.DeleteEntries(ctx, e.ID),
			"Agent":           agentErr,
			"DeleteAgent":     c.DeleteAgent(ctx, e.ParentID),
		} {
			if err == nil {
				t.Errorf("%s answered %s: no error", name, tc.code)
				continue
			}
			if tc.sentinel != nil && !errors.Is(err, tc.sentinel) {
				t.Errorf("%s answered %s: %v, want %v", name, tc.code, err, tc.sentinel)
			}
			if got := errclass.Classify(err); got != tc.class {
				t.Errorf("%s answered %s: class %s, want %s", name, tc.code, got, tc.class)
			}
			if got := status.Code(err); got != tc.code {
				t.Errorf("%s answered %s: status.Code = %s", name, tc.code, got)
			}
		}
	}
}

// TestNotAdminNamesTheFix: an admin socket refusal says what to change.
func TestNotAdminNamesTheFix(t *testing.T) {
	c := startFake(t, &fakeServer{err: status.Error(codes.PermissionDenied, "authorization denied")})
	err := c.EnsureEntry(context.Background(), testEntry(t))
	if msg := err.Error(); !strings.Contains(msg, "not an admin of the SPIRE server") || !strings.Contains(msg, "admin socket") {
		t.Fatalf("EnsureEntry: %v, want the refusal and its fix", err)
	}
}

// TestNotFoundIsSuccess: deleting what is gone, and asking for an agent
// that is not there, are answers, not errors.
func TestNotFoundIsSuccess(t *testing.T) {
	f := &fakeServer{err: status.Error(codes.NotFound, "agent not found")}
	c := startFake(t, f)
	ctx := context.Background()
	e := testEntry(t)
	if err := c.DeleteAgent(ctx, e.ParentID); err != nil {
		t.Errorf("DeleteAgent of a missing agent: %v", err)
	}
	if _, found, err := c.Agent(ctx, e.ParentID); found || err != nil {
		t.Errorf("Agent of a missing agent: found %v, %v", found, err)
	}
	f.err = nil
	f.entryStatus = codes.NotFound
	if err := c.DeleteEntries(ctx, "hyperfleet.a", "hyperfleet.b"); err != nil {
		t.Errorf("DeleteEntries of missing entries: %v", err)
	}
}

// TestBatchResults: a batch call's per-entry status decides, not the
// call's.
func TestBatchResults(t *testing.T) {
	f := &fakeServer{}
	c := startFake(t, f)
	ctx := context.Background()
	e := testEntry(t)
	for _, tc := range []struct {
		code codes.Code
		ok   bool
	}{{codes.OK, true}, {codes.AlreadyExists, true}, {codes.InvalidArgument, false}, {codes.Internal, false}} {
		f.entryStatus, f.entryMsg = tc.code, "per entry"
		if err := c.EnsureEntry(ctx, e); (err == nil) != tc.ok {
			t.Errorf("EnsureEntry with result %s: %v", tc.code, err)
		}
		if tc.code == codes.AlreadyExists {
			continue
		}
		if err := c.DeleteEntries(ctx, e.ID); (err == nil) != tc.ok {
			t.Errorf("DeleteEntries with result %s: %v", tc.code, err)
		}
	}
	got := f.created[0]
	if got.GetId() != e.ID || got.GetSpiffeId().GetPath() != e.SPIFFEID.Path() || got.GetParentId().GetPath() != e.ParentID.Path() ||
		len(got.GetSelectors()) != 1 || got.GetSelectors()[0].GetType() != "unix" || got.GetSelectors()[0].GetValue() != "uid:1000" {
		t.Errorf("the server got %v for %+v", got, e)
	}
}

// TestEnsureEntryRefusesForeignIDs: entries without EntryIDPrefix belong to
// others (spire-controller-manager); the client does not create them.
func TestEnsureEntryRefusesForeignIDs(t *testing.T) {
	f := &fakeServer{}
	c := startFake(t, f)
	e := testEntry(t)
	for _, id := range []string{"", "uid", "Hyperfleet.uid", "spire-controller-manager.uid"} {
		e.ID = id
		if err := c.EnsureEntry(context.Background(), e); !errors.Is(err, spire.ErrInvalidArgument) {
			t.Errorf("EnsureEntry with id %q: %v, want ErrInvalidArgument", id, err)
		}
	}
	e = testEntry(t)
	e.Selectors = nil
	if err := c.EnsureEntry(context.Background(), e); !errors.Is(err, spire.ErrInvalidArgument) {
		t.Errorf("EnsureEntry without selectors: %v, want ErrInvalidArgument", err)
	}
	if len(f.created) != 0 {
		t.Errorf("the server got %d entries", len(f.created))
	}
}

// TestCreateJoinTokenDuplicate: the server's answer to a token that exists
// (verified against the real server in test/spiretest) is success, and the
// client makes sure of the alias entry; any other Internal answer is not.
func TestCreateJoinTokenDuplicate(t *testing.T) {
	f := &fakeServer{createToken: status.Error(codes.Internal, "failed to create token: datastore-sql: UNIQUE constraint failed: join_tokens.token")}
	c := startFake(t, f)
	e := testEntry(t)
	before := time.Now()
	exp, err := c.CreateJoinToken(context.Background(), "tok", time.Minute, e.ParentID)
	if err != nil {
		t.Fatalf("CreateJoinToken of an existing token: %v", err)
	}
	if exp.Before(before.Add(time.Minute - time.Second)) {
		t.Errorf("CreateJoinToken of an existing token expires at %s, before now+ttl", exp)
	}
	if len(f.created) != 1 {
		t.Fatalf("the alias entry was not ensured: %d entries created", len(f.created))
	}
	alias, agent := f.created[0], spire.JoinTokenAgentID(td, "tok")
	if alias.GetSpiffeId().GetPath() != e.ParentID.Path() || alias.GetParentId().GetPath() != agent.Path() ||
		alias.GetSelectors()[0].GetType() != "spiffe_id" || alias.GetSelectors()[0].GetValue() != agent.String() {
		t.Errorf("alias entry %v", alias)
	}

	for _, msg := range []string{"failed to create token: datastore-sql: database is locked", "failed to create join token registration entry: UNIQUE constraint failed"} {
		f.createToken = status.Error(codes.Internal, msg)
		if _, err := c.CreateJoinToken(context.Background(), "tok", time.Minute, e.ParentID); err == nil {
			t.Errorf("CreateJoinToken answered %q: no error", msg)
		}
	}
}

// TestCreateJoinTokenRefuses: what the server would refuse is refused
// before asking it.
func TestCreateJoinTokenRefuses(t *testing.T) {
	c := startFake(t, &fakeServer{})
	node := testEntry(t).ParentID
	other := spiffeid.RequireFromString("spiffe://other.org/hyperfleet/node/a/b/c")
	for name, call := range map[string]func() error{
		"no ttl": func() error { _, err := c.CreateJoinToken(context.Background(), "tok", 0, node); return err },
		"sub-second ttl": func() error {
			_, err := c.CreateJoinToken(context.Background(), "tok", time.Millisecond, node)
			return err
		},
		"token with /": func() error { _, err := c.CreateJoinToken(context.Background(), "a/b", time.Minute, node); return err },
		"other td":     func() error { _, err := c.CreateJoinToken(context.Background(), "tok", time.Minute, other); return err },
		"zero agent id": func() error {
			_, err := c.CreateJoinToken(context.Background(), "tok", time.Minute, spiffeid.ID{})
			return err
		},
	} {
		if err := call(); !errors.Is(err, spire.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
}

// TestDialValidates: a Config the client cannot work with is refused, naming
// the setting.
func TestDialValidates(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		cfg        spire.Config
	}{
		{"no trust domain", "Config.TrustDomain", spire.Config{AdminSocket: "/run/spire.sock"}},
		{"neither", "Config.AdminSocket", spire.Config{TrustDomain: td}},
		{"both", "only one", spire.Config{TrustDomain: td, AdminSocket: "/run/spire.sock", MTLS: &spire.MTLSConfig{}}},
		{"relative socket", "Config.AdminSocket", spire.Config{TrustDomain: td, AdminSocket: "spire.sock"}},
		{"no address", "Config.MTLS.Address", spire.Config{TrustDomain: td, MTLS: &spire.MTLSConfig{WorkloadAPISocket: "/run/agent.sock"}}},
		{"no workload socket", "Config.MTLS.WorkloadAPISocket", spire.Config{TrustDomain: td, MTLS: &spire.MTLSConfig{Address: "spire:8081"}}},
		{"server id of another td", "Config.MTLS.ServerID", spire.Config{TrustDomain: td, MTLS: &spire.MTLSConfig{
			Address: "spire:8081", WorkloadAPISocket: "/run/agent.sock", ServerID: spiffeid.RequireFromString("spiffe://other.org/spire/server")}}},
	} {
		c, err := spire.Dial(context.Background(), tc.cfg)
		if err == nil {
			_ = c.Close()
			t.Errorf("%s: Dial accepted %+v", tc.name, tc.cfg)
			continue
		}
		if !errors.Is(err, spire.ErrInvalidConfig) || errclass.Classify(err) != errclass.ClassConfiguration || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalidConfig naming %s", tc.name, err, tc.want)
		}
	}
}

// TestDialMTLSWaitsForSVID: without the operator's SVID no call can
// succeed, so Dial fails (transiently) when its agent does not answer.
func TestDialMTLSWaitsForSVID(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := spire.Dial(ctx, spire.Config{TrustDomain: td, MTLS: &spire.MTLSConfig{
		Address: "127.0.0.1:1", WorkloadAPISocket: filepath.Join(t.TempDir(), "missing.sock")}})
	if !errors.Is(err, spire.ErrUnavailable) || errclass.Classify(err) != errclass.ClassTransient {
		t.Fatalf("Dial without a Workload API: %v, want ErrUnavailable", err)
	}
}
