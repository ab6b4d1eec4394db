// Package githubsimtest runs the GitHub simulator for tests of other
// packages: over HTTPS on loopback with its own CA, with the runner package
// unpacked and its scripts run as real processes.
package githubsimtest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/procgroup"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite"
	"github.com/hyperfleet/hyperfleet/pkg/workload/generic"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github"
	"github.com/hyperfleet/hyperfleet/pkg/workload/gitlab"
)

// Workloads are the CI platform back-ends of an operator under test, by
// workload type, as the operator binary registers them: GitHub Actions
// (pkg/workload/github), GitLab CI (pkg/workload/gitlab), Buildkite (pkg/workload/buildkite) and generic (pkg/workload/generic). Tests of the operator's neutral packages (the
// controllers, routing) reach GitHub through them, as the operator does,
// rather than by importing the platform's package; to reach a simulator,
// build them over Server.Transport and point the templates' apiBaseURL at
// Server.URL+"/api/v3".
func Workloads() map[hfv1.WorkloadType]workload.Factory {
	return map[hfv1.WorkloadType]workload.Factory{hfv1.WorkloadGitHubActions: github.NewBackend, hfv1.WorkloadGeneric: generic.NewBackend,
		hfv1.WorkloadBuildkite: buildkite.NewBackend, hfv1.WorkloadGitLabCI: gitlab.NewBackend}
}

// Backends builds Workloads over transport (nil: the default transport),
// registering no metrics.
func Backends(t testing.TB, transport http.RoundTripper) *workload.Backends {
	t.Helper()
	b, err := workload.NewBackends(Workloads(), workload.Dependencies{Transport: transport})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Server is a simulator behind an HTTPS test server.
type Server struct {
	Sim *githubsim.Simulator
	// URL is the simulator's root (https://127.0.0.1:port); the REST API is
	// there and under URL+"/api/v3".
	URL string
	// CAPEM is the CA certificate clients must trust.
	CAPEM []byte
	// Transport trusts CAPEM.
	Transport *http.Transport
}

// Start runs a simulator for cfg until the test ends.
func Start(t testing.TB, cfg githubsim.Config, opts ...githubsim.Option) *Server {
	t.Helper()
	cert, caPEM, err := githubsim.SelfSignedCertificate("127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	sim, err := githubsim.New(cfg, append([]githubsim.Option{githubsim.WithCACertificate(caPEM)}, opts...)...)
	if err != nil {
		t.Fatalf("GitHub simulator: %v", err)
	}
	srv := httptest.NewUnstartedServer(sim)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	sim.SetServerURL(srv.URL)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, MaxIdleConnsPerHost: 64}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		srv.Close()
		_ = sim.Close()
	})
	return &Server{Sim: sim, URL: srv.URL, CAPEM: caPEM, Transport: tr}
}

// Client is an HTTP client that trusts the simulator.
func (s *Server) Client() *http.Client {
	return &http.Client{Transport: s.Transport, Timeout: 30 * time.Second}
}

// InstallRunner downloads the runner package for linux/x64 and unpacks it
// into a new directory, which it returns.
func (s *Server) InstallRunner(t testing.TB) string {
	t.Helper()
	for _, tool := range []string{"sh", "curl", "base64", "sed"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is required by the simulator's runner scripts (make test-deps installs curl): %v", tool, err)
		}
	}
	resp, err := s.Client().Get(s.URL + "/_sim/runner/actions-runner-linux-x64.tar.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("runner package: HTTP %d", resp.StatusCode)
	}
	gz, err := gzip.NewReader(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return dir
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(h.Name)), data, os.FileMode(h.Mode)&0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// Process is a runner script running in its own process group.
type Process struct {
	cmd    *exec.Cmd
	leader *procgroup.Leader // the script leads its group
	out    *buffer
	done   chan struct{}
}

type buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// StartScript runs `sh <args>` in dir (such as "run.sh", "--jitconfig",
// enc); it is killed when the test ends.
func StartScript(t testing.TB, dir string, args ...string) *Process {
	t.Helper()
	cmd := exec.Command("sh", args...)
	cmd.Dir = dir
	// Short long-polls so a finished test does not wait for one.
	cmd.Env = append(os.Environ(), "HF_SIM_POLL_WAIT=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := &Process{cmd: cmd, out: &buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.leader = procgroup.New(cmd)
	go func() {
		// What the script left running (a curl) ends with it.
		_ = p.leader.Wait(procgroup.KillGroup)
		close(p.done)
	}()
	t.Cleanup(p.Kill)
	return p
}

// Kill ends the script and its children.
func (p *Process) Kill() {
	_ = p.leader.Signal(syscall.SIGKILL)
	<-p.done
}

// Wait waits up to d for the script to exit and returns its exit code;
// the test fails (with the output) when it does not.
func (p *Process) Wait(t testing.TB, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		p.Kill()
		t.Fatalf("runner script did not exit within %s; output:\n%s", d, p.out.String())
	}
	return p.cmd.ProcessState.ExitCode()
}

// Output is what the script printed so far.
func (p *Process) Output() string { return p.out.String() }

// WebhookFormat is GitHub's webhook format (pkg/workload/github), for
// tests of the neutral packages that deliver webhooks as GitHub does.
var WebhookFormat = github.WebhookFormat

// SignWebhook signs body as GitHub signs a delivery with secret
// (X-Hub-Signature-256).
func SignWebhook(secret []byte, body []byte) string { return github.SignWebhook(secret, body) }
