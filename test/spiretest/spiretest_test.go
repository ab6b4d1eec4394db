//go:build spire

package spiretest_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	agentv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/agent/v1"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc/codes"

	"github.com/hyperfleet/hyperfleet/test/spiretest"
)

const (
	trustDomain = "example.org"
	// nodePath is the alias a VM's join token gives its agent; the VM's
	// workload entries name it as their parent.
	nodePath     = "/hyperfleet/node/test-vm"
	workloadPath = "/vm/ns/claim/uid"
)

// TestJoinTokenAgentWorkloadSVID runs the path a VM's identity takes: a
// join token for the VM's agent and a registration entry for its workload
// through the Server API, the agent attesting with the token, and the
// workload (this test process, selected by its uid) getting its X509-SVID
// from the agent's Workload API. Then a second agent with the same token
// gets nothing (tokens are single use), and deleting the first agent from
// the server takes its workload's identity away.
func TestJoinTokenAgentWorkloadSVID(t *testing.T) {
	t.Parallel()
	server := spiretest.StartServer(t, trustDomain)
	td := spiffeid.RequireTrustDomainFromString(trustDomain)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	token, err := server.CreateJoinToken(ctx, nodePath, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	entry := &types.Entry{
		Id:        "hyperfleet.test-vm.workload",
		SpiffeId:  server.ID(workloadPath),
		ParentId:  server.ID(nodePath),
		Selectors: []*types.Selector{{Type: "unix", Value: fmt.Sprintf("uid:%d", os.Getuid())}},
	}
	if err := server.CreateEntries(ctx, entry); err != nil {
		t.Fatal(err)
	}
	// Creating it again is answered ALREADY_EXISTS, which CreateEntries
	// counts as created.
	resp, err := server.Entries.BatchCreateEntry(ctx, &entryv1.BatchCreateEntryRequest{Entries: []*types.Entry{entry}})
	if err != nil {
		t.Fatal(err)
	}
	if got := codes.Code(resp.GetResults()[0].GetStatus().GetCode()); got != codes.AlreadyExists {
		t.Fatalf("creating the entry again: got %s, want %s", got, codes.AlreadyExists)
	}
	if err := server.CreateEntries(ctx, entry); err != nil {
		t.Fatalf("creating an existing entry: %v", err)
	}

	agent := spiretest.StartAgent(t, server, token)
	waitCtx, waitCancel := context.WithTimeout(ctx, 2*time.Minute)
	svid, err := agent.WaitX509SVID(waitCtx)
	waitCancel()
	if err != nil {
		t.Fatal(err)
	}
	if want := "spiffe://" + trustDomain + workloadPath; svid.ID.String() != want {
		t.Fatalf("X509-SVID for %s, want %s", svid.ID, want)
	}
	bundle, err := x509bundle.Parse(td, server.Bundle)
	if err != nil {
		t.Fatalf("parsing the server's bundle: %v", err)
	}
	if _, _, err := x509svid.Verify(svid.Certificates, bundle); err != nil {
		t.Fatalf("the X509-SVID does not chain to the server's bundle: %v", err)
	}
	agentID := server.JoinTokenAgentID(token)
	if _, err := server.Agents.GetAgent(ctx, &agentv1.GetAgentRequest{Id: agentID}); err != nil {
		t.Fatalf("the attested agent %s: %v", agentID, err)
	}

	// The token is spent: an agent presenting it again is refused (it retries
	// every 5 seconds, for a minute) and does not serve the Workload API.
	reused := spiretest.StartAgent(t, server, token)
	reuseCtx, reuseCancel := context.WithTimeout(ctx, 10*time.Second)
	svid2, err := reused.WaitX509SVID(reuseCtx)
	reuseCancel()
	if err == nil {
		t.Fatalf("an agent with a used join token got an X509-SVID for %s", svid2.ID)
	}
	if log := reused.Log(); !strings.Contains(log, "join token does not exist or has already been used") {
		t.Fatalf("the agent with the used token was not refused for it (WaitX509SVID: %v); its log:\n%s", err, log)
	}
	reused.Stop()

	// Deleting the agent from the server takes its identity away: at its
	// next sync (every 5 seconds) the server refuses it, and an agent
	// attested with a join token cannot attest again, so it removes its SVID
	// and exits, and its workload gets nothing more.
	if _, err := server.Agents.DeleteAgent(ctx, &agentv1.DeleteAgentRequest{Id: agentID}); err != nil {
		t.Fatalf("deleting agent %s: %v", agentID, err)
	}
	select {
	case <-agent.Exited():
		t.Logf("after DeleteAgent: %v", agent.ExitErr())
	case <-time.After(time.Minute):
		t.Fatalf("a minute after DeleteAgent the agent still runs")
	}
	fetchCtx, fetchCancel := context.WithTimeout(ctx, 5*time.Second)
	defer fetchCancel()
	if svid, err := agent.FetchX509SVID(fetchCtx); err == nil {
		t.Fatalf("after DeleteAgent the Workload API still serves %s", svid.ID)
	}
}
