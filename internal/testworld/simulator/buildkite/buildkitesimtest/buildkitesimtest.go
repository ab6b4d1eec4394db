// Package buildkitesimtest runs the Buildkite simulator for tests of other
// packages (the in-VM agent, the operator's worlds): over HTTPS on loopback
// with its own CA, serving the real agent built by hack/buildkite-agent as
// its release tarball.
package buildkitesimtest

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
	"github.com/hyperfleet/hyperfleet/internal/testworld/repodir"
	buildkitesim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite"
)

// AgentBuildScript builds the agent binary the tests run.
const AgentBuildScript = "hack/buildkite-agent/build.sh"

var (
	agentOnce sync.Once
	agentPath string
	agentErr  string
)

// AgentBinary returns the test-world buildkite-agent: $BUILDKITE_AGENT
// when set (the Makefile's test targets set it), else what
// hack/buildkite-agent/build.sh prints (building it the first time, a few
// minutes). A binary that cannot be found or built fails the test; it never
// skips.
func AgentBinary(t testing.TB) string {
	t.Helper()
	agentOnce.Do(func() {
		path := os.Getenv("BUILDKITE_AGENT")
		if path == "" {
			root := repodir.Root()
			var stdout, stderr bytes.Buffer
			cmd := exec.Command("bash", filepath.Join(root, filepath.FromSlash(AgentBuildScript)))
			cmd.Stdout, cmd.Stderr = &stdout, io.MultiWriter(&stderr, os.Stderr)
			if err := cmd.Run(); err != nil {
				agentErr = "building buildkite-agent with " + AgentBuildScript + ": " + err.Error() + "\n" + stderr.String()
				return
			}
			path = strings.TrimSpace(stdout.String())
		}
		if info, err := os.Stat(path); err != nil || info.IsDir() || info.Mode()&0o111 == 0 {
			agentErr = "buildkite-agent is not an executable at " + path + " (BUILDKITE_AGENT=" + os.Getenv("BUILDKITE_AGENT") + "; run " + AgentBuildScript + ", or make buildkite-agent, and set BUILDKITE_AGENT to the path it prints)"
			return
		}
		agentPath = path
	})
	if agentErr != "" {
		t.Fatal(agentErr)
	}
	return agentPath
}

// Server is a simulator served over HTTPS on loopback.
type Server struct {
	*httptest.Server
	Sim *buildkitesim.Simulator
	// CAPEM is the server's certificate, which clients trust.
	CAPEM []byte
}

// Start serves a simulator of cfg over HTTPS until the test ends. An
// empty cfg.AgentBinary serves AgentBinary's build as the release
// tarball; the pings and job status checks default to every second, so
// that agents do not make tests wait.
func Start(t testing.TB, cfg buildkitesim.Config) *Server {
	t.Helper()
	if cfg.AgentBinary == "" {
		cfg.AgentBinary = AgentBinary(t)
	}
	if cfg.PingInterval == 0 {
		cfg.PingInterval = 1
	}
	if cfg.JobStatusInterval == 0 {
		cfg.JobStatusInterval = 1
	}
	sim := buildkitesim.New(cfg)
	t.Cleanup(sim.Close)
	// A CA of its own, not httptest's certificate, which every httptest
	// server shares: a process that trusts this simulator (through
	// SSL_CERT_FILE, which Go reads once) must not trust other tests'
	// servers with it.
	c, err := selfsigned.NewWith(selfsigned.Options{CommonName: "buildkite-sim", Organization: []string{"HyperFleet Buildkite simulator"}, Hosts: []string{"127.0.0.1", "localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	cert, caPEM := c.TLS, c.CAPEM
	srv := httptest.NewUnstartedServer(sim)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	srv.Client().Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return &Server{Server: srv, Sim: sim, CAPEM: caPEM}
}
