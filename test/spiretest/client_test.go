//go:build spire

package spiretest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	agentv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/agent/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hyperfleet/hyperfleet/internal/spire"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
	"github.com/hyperfleet/hyperfleet/test/spiretest"
)

// The tests run in parallel, each with a server of its own: most of their
// time is spent waiting for agents to attest and sync, not computing.

// The claim whose VM the client tests provision.
const (
	claimNamespace = "ci"
	claimName      = "runner-1"
	claimUID       = "0b0c6a3e-6b8a-4a51-9d55-0e4f3b2a1c00"
)

// TestClientAdminSocket runs internal/spire's client, as an admin on the
// server's unix socket, through a VM's life: see exerciseClient.
func TestClientAdminSocket(t *testing.T) {
	t.Parallel()
	server := spiretest.StartServer(t, trustDomain)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := spire.Dial(ctx, spire.Config{TrustDomain: td(), AdminSocket: server.SocketPath})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	exerciseClient(ctx, t, server, c)
}

// TestClientMTLS runs the same as an admin that reaches the server's TCP
// port with its own X509-SVID, listed in the server's admin_ids; a caller
// with an SVID that is not listed is refused with ErrNotAdmin, which names
// its id and the fix, but may read the bundle (GetBundle needs no admin).
func TestClientMTLS(t *testing.T) {
	t.Parallel()
	const operatorPath, otherPath = "/hyperfleet/operator", "/hyperfleet/not-admin"
	server := spiretest.StartServer(t, trustDomain, spiretest.WithAdminIDs("spiffe://"+trustDomain+operatorPath))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	operator := spiretest.StartWorkloadAgent(ctx, t, server, "/hyperfleet/operator-node", operatorPath)
	other := spiretest.StartWorkloadAgent(ctx, t, server, "/hyperfleet/other-node", otherPath)
	for _, a := range []*spiretest.Agent{operator, other} {
		waitSVID(ctx, t, a)
	}

	dial := func(a *spiretest.Agent) *spire.Client {
		t.Helper()
		c, err := spire.Dial(ctx, spire.Config{TrustDomain: td(), MTLS: &spire.MTLSConfig{
			Address: server.Address, WorkloadAPISocket: a.SocketPath}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}

	notAdmin := dial(other)
	if _, err := notAdmin.X509Bundle(ctx); err != nil {
		t.Fatalf("X509Bundle as a caller that is not an admin: %v", err)
	}
	node := mustID(spire.NodeID(td(), claimNamespace, claimName, claimUID))
	_, err := notAdmin.CreateJoinToken(ctx, "t1", time.Minute, node)
	if !errors.Is(err, spire.ErrNotAdmin) || errclass.Classify(err) != errclass.ClassConfiguration ||
		!strings.Contains(err.Error(), "admin_ids") || !strings.Contains(err.Error(), otherPath) {
		t.Fatalf("CreateJoinToken as a caller that is not an admin: %v, want ErrNotAdmin naming admin_ids and the caller's id", err)
	}
	if _, err := notAdmin.ListAgents(ctx); !errors.Is(err, spire.ErrNotAdmin) {
		t.Fatalf("ListAgents as a caller that is not an admin: %v, want ErrNotAdmin", err)
	}

	// A server whose certificate is not the one the client expects is a
	// configuration error, not an outage.
	wrongServer, err := spire.Dial(ctx, spire.Config{TrustDomain: td(), MTLS: &spire.MTLSConfig{
		Address: server.Address, WorkloadAPISocket: operator.SocketPath, ServerID: spiffeid.RequireFromString("spiffe://" + trustDomain + "/not-the-server")}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = wrongServer.Close() }()
	if _, err := wrongServer.X509Bundle(ctx); !errors.Is(err, spire.ErrHandshake) || errclass.Classify(err) != errclass.ClassConfiguration {
		t.Fatalf("X509Bundle from a server with another id: %v, want ErrHandshake", err)
	}

	exerciseClient(ctx, t, server, dial(operator))
}

func td() spiffeid.TrustDomain { return spiffeid.RequireTrustDomainFromString(trustDomain) }

// exerciseClient provisions and removes one VM's identity with c: the join
// token (with its alias), the agent attesting with it, the workload entry
// and the X509-SVID the agent hands out for it, the answers to repeated
// calls, and the cleanup, which must leave no agent and no entry behind.
// It also pins the server's answers that the client's idempotence rests
// on, so that a SPIRE upgrade that changes them fails here.
func exerciseClient(ctx context.Context, t *testing.T, server *spiretest.Server, c *spire.Client) {
	t.Helper()
	agentsBefore, entriesBefore := snapshot(ctx, t, c)
	bundle, err := c.X509Bundle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := spire.BundlePEM(bundle); got != string(server.Bundle) {
		t.Fatalf("BundlePEM(X509Bundle) = %q, want the server's bundle %q", got, server.Bundle)
	}

	key := []byte(strings.Repeat("k", spire.MinJoinTokenKeyLen))
	token := spire.DeriveJoinToken(key, claimUID, 1)
	nodeID := mustID(spire.NodeID(td(), claimNamespace, claimName, claimUID))
	vmID := mustID(spire.VMID(td(), claimNamespace, claimName, claimUID))
	agentID := spire.JoinTokenAgentID(td(), token)

	before := time.Now()
	expiresAt, err := c.CreateJoinToken(ctx, token, 10*time.Minute, nodeID)
	if err != nil {
		t.Fatal(err)
	}
	if lo, hi := before.Add(10*time.Minute-time.Second), time.Now().Add(10*time.Minute); expiresAt.Before(lo) || expiresAt.After(hi) {
		t.Fatalf("token expires at %s, want between %s and %s", expiresAt, lo, hi)
	}
	// A token that exists is refused with Internal and the datastore's
	// words, not AlreadyExists; the client takes exactly that for success.
	_, err = server.Agents.CreateJoinToken(ctx, &agentv1.CreateJoinTokenRequest{Ttl: 600, Token: token, AgentId: server.ID(nodeID.Path())})
	if st, _ := status.FromError(err); st.Code() != codes.Internal || !strings.Contains(st.Message(), "UNIQUE constraint failed: join_tokens.token") {
		t.Fatalf("creating an existing token directly: %v, want Internal with UNIQUE constraint failed", err)
	}
	again, err := c.CreateJoinToken(ctx, token, 10*time.Minute, nodeID)
	if err != nil {
		t.Fatalf("creating an existing token: %v", err)
	}
	if again.Before(expiresAt) {
		t.Fatalf("creating an existing token returned expiry %s, before the token's %s", again, expiresAt)
	}
	aliases, err := c.ListEntriesBySPIFFEID(ctx, nodeID)
	if err != nil {
		t.Fatal(err)
	}
	if len(aliases) != 1 || aliases[0].ParentID != agentID {
		t.Fatalf("alias entries of %s: %+v, want one with parent %s", nodeID, aliases, agentID)
	}

	entry := spire.Entry{
		ID:        spire.EntryIDFor(claimUID),
		SPIFFEID:  vmID,
		ParentID:  nodeID,
		Selectors: []spire.Selector{{Type: "unix", Value: fmt.Sprintf("uid:%d", os.Getuid())}},
	}
	for i := range 2 {
		if err := c.EnsureEntry(ctx, entry); err != nil {
			t.Fatalf("EnsureEntry, call %d: %v", i+1, err)
		}
	}
	similar := entry
	similar.ID = spire.EntryIDFor("other-uid")
	if err := c.EnsureEntry(ctx, similar); err != nil {
		t.Fatalf("EnsureEntry of an entry similar to an existing one: %v", err)
	}
	conflict := entry
	conflict.SPIFFEID = nodeID
	if err := c.EnsureEntry(ctx, conflict); !errors.Is(err, spire.ErrEntryConflict) {
		t.Fatalf("EnsureEntry with an existing id and another SPIFFE ID: %v, want ErrEntryConflict", err)
	}

	agent := spiretest.StartAgent(t, server, token)
	svid := waitSVID(ctx, t, agent)
	if svid.ID != vmID {
		t.Fatalf("the agent hands out %s, want %s", svid.ID, vmID)
	}
	a, found, err := c.Agent(ctx, agentID)
	if err != nil || !found {
		t.Fatalf("Agent(%s) = %v, %v", agentID, found, err)
	}
	if a.ID != agentID || a.AttestationType != "join_token" || a.Banned || a.X509SVIDExpiresAt.Before(time.Now()) {
		t.Fatalf("Agent(%s) = %+v", agentID, a)
	}

	// A used token is gone from the server, so creating it again re-arms
	// it, and a second agent attests with it under the same id: why the
	// caller never creates a token again once it recorded that it did.
	if _, err := c.CreateJoinToken(ctx, token, time.Minute, nodeID); err != nil {
		t.Fatalf("creating a used token again: %v", err)
	}
	if aliases, err := c.ListEntriesBySPIFFEID(ctx, nodeID); err != nil || len(aliases) != 1 {
		t.Fatalf("alias entries after re-creating the token: %+v, %v; want one", aliases, err)
	}
	rearmed := spiretest.StartAgent(t, server, token)
	if svid := waitSVID(ctx, t, rearmed); svid.ID != vmID {
		t.Fatalf("the agent of the re-created token hands out %s, want %s", svid.ID, vmID)
	}

	checkCleanup(ctx, t, c, entry.ID, similar.ID, nodeID, agentID)
	if agents, entries := snapshot(ctx, t, c); !slices.Equal(agents, agentsBefore) || !slices.Equal(entries, entriesBefore) {
		t.Fatalf("after the cleanup the server has agents %q and entries %q; before the VM, %q and %q", agents, entries, agentsBefore, entriesBefore)
	}
	for _, a := range []*spiretest.Agent{agent, rearmed} {
		select {
		case <-a.Exited():
		case <-time.After(time.Minute):
			t.Fatalf("a minute after DeleteAgent an agent of %s still runs", agentID)
		}
	}
}

// checkCleanup deletes a VM's entries and agent, twice (the second time
// finds nothing, which is success), and checks that the server has no
// agent and no entry left.
func checkCleanup(ctx context.Context, t *testing.T, c *spire.Client, entryID, similarID string, nodeID, agentID spiffeid.ID) {
	t.Helper()
	for i := range 2 {
		if err := c.DeleteEntries(ctx, entryID, similarID); err != nil {
			t.Fatalf("DeleteEntries, call %d: %v", i+1, err)
		}
		n, err := c.DeleteEntriesBySPIFFEID(ctx, nodeID)
		if err != nil || n != 1-i {
			t.Fatalf("DeleteEntriesBySPIFFEID(%s), call %d = %d, %v; want %d", nodeID, i+1, n, err, 1-i)
		}
		if err := c.DeleteAgent(ctx, agentID); err != nil {
			t.Fatalf("DeleteAgent, call %d: %v", i+1, err)
		}
	}
	if _, found, err := c.Agent(ctx, agentID); err != nil || found {
		t.Fatalf("Agent(%s) after DeleteAgent: found %v, %v", agentID, found, err)
	}
	for _, parent := range []spiffeid.ID{nodeID, agentID} {
		if entries, err := c.ListEntriesByParent(ctx, parent); err != nil || len(entries) != 0 {
			t.Fatalf("entries with parent %s after the cleanup: %+v, %v", parent, entries, err)
		}
	}
}

// snapshot returns the ids of the server's agents and entries, sorted: a
// leak check compares them before and after.
func snapshot(ctx context.Context, t *testing.T, c *spire.Client) (agentIDs, entryIDs []string) {
	t.Helper()
	agents, err := c.ListAgents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range agents {
		agentIDs = append(agentIDs, a.ID.String())
	}
	entries, err := c.ListEntries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		entryIDs = append(entryIDs, e.ID)
	}
	slices.Sort(agentIDs)
	slices.Sort(entryIDs)
	return agentIDs, entryIDs
}

func waitSVID(ctx context.Context, t *testing.T, a *spiretest.Agent) *x509svid.SVID {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	svid, err := a.WaitX509SVID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return svid
}

func mustID(id spiffeid.ID, err error) spiffeid.ID {
	if err != nil {
		panic(err)
	}
	return id
}

// TestClientRefusals: what the server refuses comes back as a
// configuration error naming the setting or the sentinel to branch on.
func TestClientRefusals(t *testing.T) {
	t.Parallel()
	server := spiretest.StartServer(t, trustDomain)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := spire.Dial(ctx, spire.Config{TrustDomain: td(), AdminSocket: server.SocketPath})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	// An agent id in SPIRE's reserved namespace is the server's refusal.
	_, err = c.CreateJoinToken(ctx, "t1", time.Minute, spire.JoinTokenAgentID(td(), "other"))
	if !errors.Is(err, spire.ErrInvalidArgument) || errclass.Classify(err) != errclass.ClassConfiguration {
		t.Fatalf("CreateJoinToken with a reserved agent id: %v (class %s), want ErrInvalidArgument, Configuration", err, errclass.Classify(err))
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("the refusal does not carry the server's answer: %v", err)
	}
	e := spire.Entry{ID: "not-ours", SPIFFEID: mustID(spire.VMID(td(), "ns", "c", "u")), ParentID: mustID(spire.NodeID(td(), "ns", "c", "u")),
		Selectors: []spire.Selector{{Type: "unix", Value: "uid:1"}}}
	if err := c.EnsureEntry(ctx, e); !errors.Is(err, spire.ErrInvalidArgument) {
		t.Fatalf("EnsureEntry with an id without %q: %v, want ErrInvalidArgument", spire.EntryIDPrefix, err)
	}
}
