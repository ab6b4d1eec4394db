//go:build spire

package spiretest_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/spire"
	"github.com/hyperfleet/hyperfleet/test/spiretest"
)

// TestClientBanAgent: what the operator does to an agent that attested
// with a stolen join token (identity.Issuer.Evict), against the real
// server: BanAgent marks it banned (listed as such, for the record), the
// agent is refused at its next sync and exits, and its workload entries'
// deletion leaves its Workload API nothing to hand out; banning twice, or
// an agent the server does not have, is success.
func TestClientBanAgent(t *testing.T) {
	t.Parallel()
	server := spiretest.StartServer(t, trustDomain)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := spire.Dial(ctx, spire.Config{TrustDomain: td(), AdminSocket: server.SocketPath})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()

	uid := "7f1d3c2b-0a9e-4b8c-8d7e-6f5a4b3c2d1e"
	token := spire.DeriveJoinToken([]byte(strings.Repeat("b", spire.MinJoinTokenKeyLen)), uid, 1)
	nodeID := mustID(spire.NodeID(td(), claimNamespace, "stolen", uid))
	vmID := mustID(spire.VMID(td(), claimNamespace, "stolen", uid))
	agentID := spire.JoinTokenAgentID(td(), token)
	if _, err := c.CreateJoinToken(ctx, token, 10*time.Minute, nodeID); err != nil {
		t.Fatal(err)
	}
	entry := spire.Entry{ID: spire.EntryIDFor(uid), SPIFFEID: vmID, ParentID: nodeID,
		Selectors: []spire.Selector{{Type: "unix", Value: fmt.Sprintf("uid:%d", os.Getuid())}}}
	if err := c.EnsureEntry(ctx, entry); err != nil {
		t.Fatal(err)
	}
	thief := spiretest.StartAgent(t, server, token)
	if svid := waitSVID(ctx, t, thief); svid.ID != vmID {
		t.Fatalf("the agent hands out %s, want %s", svid.ID, vmID)
	}

	for i := range 2 {
		if err := c.BanAgent(ctx, agentID); err != nil {
			t.Fatalf("BanAgent, call %d: %v", i+1, err)
		}
	}
	a, found, err := c.Agent(ctx, agentID)
	if err != nil || !found || !a.Banned {
		t.Fatalf("Agent(%s) after BanAgent = %+v, found %v, %v; want it listed as banned", agentID, a, found, err)
	}
	if err := c.DeleteEntries(ctx, entry.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DeleteEntriesBySPIFFEID(ctx, nodeID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-thief.Exited():
	case <-time.After(2 * time.Minute):
		t.Fatalf("two minutes after BanAgent the banned agent still runs; its log:\n%s", thief.Log())
	}
	if _, err := thief.FetchX509SVID(ctx); err == nil {
		t.Error("the banned agent's Workload API still hands out an SVID")
	}
	unknown := spire.JoinTokenAgentID(td(), spire.DeriveJoinToken([]byte(strings.Repeat("c", spire.MinJoinTokenKeyLen)), uid, 1))
	if err := c.BanAgent(ctx, unknown); err != nil {
		t.Errorf("BanAgent of an agent the server does not have: %v", err)
	}
	if err := c.DeleteAgent(ctx, agentID); err != nil {
		t.Fatal(err)
	}
	if _, found, err := c.Agent(ctx, agentID); err != nil || found {
		t.Errorf("Agent(%s) after DeleteAgent: found %v, %v", agentID, found, err)
	}
}
