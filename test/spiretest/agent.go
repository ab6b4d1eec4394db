package spiretest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
)

// Agent is a running spire-agent, the SPIRE side of one simulated VM.
type Agent struct {
	// Dir holds the configuration, the data (the agent's SVID, keys and
	// cached bundle) and the log.
	Dir string
	// SocketPath is the Workload API's unix socket. The agent creates it
	// only once it has attested to the server.
	SocketPath string

	proc *process
}

// agentConfig is spire-agent's configuration: the server's loopback
// address and trust domain, the bundle to trust it by, the disk key
// manager in the data directory, and the unix workload attestor, which
// selects workloads by their process's uid, gid and path.
const agentConfig = `agent {
	data_dir = %q
	server_address = %q
	server_port = %d
	socket_path = %q
	trust_bundle_path = %q
	trust_domain = %q
	log_level = "DEBUG"
}

plugins {
	NodeAttestor "join_token" {
		plugin_data {}
	}
	KeyManager "disk" {
		plugin_data {
			directory = %q
		}
	}
	WorkloadAttestor "unix" {
		plugin_data {}
	}
}
`

// StartAgent starts a spire-agent that attests to server with joinToken and
// returns at once, without waiting for the attestation: a token that was
// used already or has expired leaves an agent that retries (every 5
// seconds, for a minute) and never serves the Workload API, and a test may
// want to see exactly that (WaitX509SVID with a deadline). t.Cleanup stops
// the agent.
func StartAgent(t testing.TB, server *Server, joinToken string) *Agent {
	t.Helper()
	bin := filepath.Join(SpireDir(t), "spire-agent")
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	a := &Agent{Dir: dir, SocketPath: filepath.Join(socketDir(t), "agent.sock")}
	conf := filepath.Join(dir, "agent.conf")
	writeFile(t, conf, fmt.Appendf(nil, agentConfig,
		data, server.addr.IP.String(), server.addr.Port, a.SocketPath, server.BundlePath, server.TrustDomain, data))
	a.proc = startProcess(t, "spire-agent", filepath.Join(dir, "agent.log"), bin,
		"run", "-config", conf, "-joinToken", joinToken)
	return a
}

// Addr is the Workload API's address as go-spiffe's workloadapi.WithAddr
// takes it.
func (a *Agent) Addr() string { return "unix://" + a.SocketPath }

// FetchX509SVID asks the agent's Workload API once for this process's
// X509-SVID: an error when the agent does not serve the API (yet), or
// issued this process no identity.
func (a *Agent) FetchX509SVID(ctx context.Context) (*x509svid.SVID, error) {
	return workloadapi.FetchX509SVID(ctx, workloadapi.WithAddr(a.Addr()))
}

// WaitX509SVID asks the agent's Workload API for this process's X509-SVID
// until it gets one, ctx ends or the agent exits; the error then carries
// the last answer. An agent attests, then syncs its registration entries
// every 5 seconds, so an SVID can take several seconds to appear.
func (a *Agent) WaitX509SVID(ctx context.Context) (*x509svid.SVID, error) {
	for {
		attempt, cancel := context.WithTimeout(ctx, 5*time.Second)
		svid, err := a.FetchX509SVID(attempt)
		cancel()
		if err == nil {
			return svid, nil
		}
		if exit := a.proc.exitErr(); exit != nil {
			return nil, fmt.Errorf("%w (last Workload API answer: %w)", exit, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no X509-SVID from %s: %w (last answer: %w)", a.SocketPath, ctx.Err(), err)
		case <-a.proc.done:
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Stop stops the agent (t.Cleanup does it too).
func (a *Agent) Stop() { a.proc.stop() }

// Exited is closed when the agent process has exited; ExitErr then says
// how.
func (a *Agent) Exited() <-chan struct{} { return a.proc.done }

// ExitErr is nil while the agent runs, else how it ended.
func (a *Agent) ExitErr() error { return a.proc.exitErr() }

// Log returns the agent's log so far.
func (a *Agent) Log() string { return a.proc.log() }

// StartWorkloadAgent gives this test process the SPIFFE ID workloadPath
// (a path in the server's trust domain): it creates a join token for an
// agent with the alias nodePath, registers workloadPath for this process's
// uid under that alias and starts the agent; WaitX509SVID waits for the
// SVID (start several agents first, then wait: each takes seconds). A test
// uses it for a caller with an identity of its own, e.g. an operator that
// reaches the Server API over mTLS.
func StartWorkloadAgent(ctx context.Context, t testing.TB, server *Server, nodePath, workloadPath string) *Agent {
	t.Helper()
	token, err := server.CreateJoinToken(ctx, nodePath, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	err = server.CreateEntries(ctx, &types.Entry{
		SpiffeId:  server.ID(workloadPath),
		ParentId:  server.ID(nodePath),
		Selectors: []*types.Selector{{Type: "unix", Value: fmt.Sprintf("uid:%d", os.Getuid())}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return StartAgent(t, server, token)
}

// FetchJWTSVID asks the agent's Workload API once for this process's
// JWT-SVID for audience, as a VM's agent does before it logs in to a
// secret store.
func (a *Agent) FetchJWTSVID(ctx context.Context, audience string) (*jwtsvid.SVID, error) {
	return workloadapi.FetchJWTSVID(ctx, jwtsvid.Params{Audience: audience}, workloadapi.WithAddr(a.Addr()))
}
