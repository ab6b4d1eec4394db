package spiretest

import (
	"context"
	"fmt"
	"net"
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
	server_port = %s
	socket_path = %q
	trust_bundle_path = %q
	trust_domain = %q
	log_level = "DEBUG"
}

plugins {
%s	KeyManager "disk" {
		plugin_data {
			directory = %q
		}
	}
	WorkloadAttestor "unix" {
		plugin_data {}
	}
}
`

// joinTokenAttestor is the agent's join_token node attestor; the token is
// given on the command line.
const joinTokenAttestor = `	NodeAttestor "join_token" {
		plugin_data {}
	}
`

// AgentOption changes the agent StartAgent configures.
type AgentOption func(*agentOptions)

type agentOptions struct {
	tpmDevID *TPMDevIDAgent
}

// TPMDevIDAgent configures spire-agent's tpm_devid node attestor
// (pkg/agent/plugin/nodeattestor/tpmdevid in SPIRE's module): the DevID
// certificate (PEM) and the DevID key's TPM blobs, loaded under SPIRE's
// SRK in the TPM at DevicePath, which the blobs must come from.
type TPMDevIDAgent struct {
	// DevicePath is a TPM device or a swtpm socket (tpm_device_path).
	DevicePath string
	// CertPath, PubPath and PrivPath are devid_cert_path,
	// devid_pub_path and devid_priv_path.
	CertPath, PubPath, PrivPath string
}

// AttestWithTPMDevID makes the agent attest with tpm_devid instead of a join
// token (StartAgent's joinToken is then ignored).
func AttestWithTPMDevID(c TPMDevIDAgent) AgentOption {
	return func(o *agentOptions) { o.tpmDevID = &c }
}

// StartAgent starts a spire-agent that attests to server with joinToken
// (or as an option says) and returns at once, without waiting for the attestation: a token that was
// used already or has expired leaves an agent that retries (every 5
// seconds, for a minute) and never serves the Workload API, and a test may
// want to see exactly that (WaitX509SVID with a deadline). t.Cleanup stops
// the agent.
func StartAgent(t testing.TB, server *Server, joinToken string, opts ...AgentOption) *Agent {
	t.Helper()
	var o agentOptions
	for _, opt := range opts {
		opt(&o)
	}
	attestor, args := joinTokenAttestor, []string{"-joinToken", joinToken}
	if c := o.tpmDevID; c != nil {
		attestor, args = fmt.Sprintf(`	NodeAttestor "tpm_devid" {
		plugin_data {
			tpm_device_path = %q
			devid_cert_path = %q
			devid_pub_path = %q
			devid_priv_path = %q
		}
	}
`, c.DevicePath, c.CertPath, c.PubPath, c.PrivPath), nil
	}
	bin := filepath.Join(SpireDir(t), "spire-agent")
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	a := &Agent{Dir: dir, SocketPath: filepath.Join(socketDir(t), "agent.sock")}
	conf := filepath.Join(dir, "agent.conf")
	host, port, err := net.SplitHostPort(server.Address)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, conf, fmt.Appendf(nil, agentConfig,
		data, host, port, a.SocketPath, server.BundlePath, server.TrustDomain, attestor, data))
	a.proc = startProcess(t, "spire-agent", filepath.Join(dir, "agent.log"), bin,
		append([]string{"run", "-config", conf}, args...)...)
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
		if exit := a.proc.ExitErr(); exit != nil {
			return nil, fmt.Errorf("%w (last Workload API answer: %w)", exit, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no X509-SVID from %s: %w (last answer: %w)", a.SocketPath, ctx.Err(), err)
		case <-a.proc.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Stop stops the agent (t.Cleanup does it too).
func (a *Agent) Stop() { a.proc.Stop() }

// Exited is closed when the agent process has exited; ExitErr then says
// how.
func (a *Agent) Exited() <-chan struct{} { return a.proc.Done() }

// ExitErr is nil while the agent runs, else how it ended.
func (a *Agent) ExitErr() error { return a.proc.ExitErr() }

// Log returns the agent's log so far.
func (a *Agent) Log() string { return a.proc.Log() }

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
