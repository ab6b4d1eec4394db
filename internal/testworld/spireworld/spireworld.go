// Package spireworld runs the real spire-server for HyperFleet's local
// world (`make dev DEV_FLAGS=--spiffe`, internal/testworld/devenv) and its tests
// (test/spiretest wraps it for *testing.T): one trust domain, the
// join_token node attestor, the admin API on a unix socket and the agent
// API on a loopback port. Like the simulators it is test world: the
// operator binary never links it.
//
// The binaries are built from the github.com/spiffe/spire module by
// hack/spire/build.sh into a cache directory outside the repository
// (docs/testing.md); Dir finds them.
package spireworld

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-jose/go-jose/v4"
	bundlev1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/bundle/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hyperfleet/hyperfleet/internal/testworld/repodir"
)

// BuildScript builds the binaries and prints their directory; a path from
// the repository's root.
const BuildScript = "hack/spire/build.sh"

// StartTimeout bounds how long a server may take to answer on its admin
// socket.
const StartTimeout = 2 * time.Minute

var (
	dirOnce sync.Once
	dir     string
	dirErr  error
)

// Dir returns the directory holding spire-server and spire-agent:
// $SPIRE_DIR when set, else what hack/spire/build.sh prints (it builds them
// on first use, which takes about 4 minutes on 2 cores, printing its
// progress to standard error).
func Dir() (string, error) {
	dirOnce.Do(func() { dir, dirErr = findDir() })
	return dir, dirErr
}

func findDir() (string, error) {
	d := os.Getenv("SPIRE_DIR")
	if d == "" {
		script := filepath.Join(repoRoot(), filepath.FromSlash(BuildScript))
		var stdout, stderr bytes.Buffer
		cmd := exec.Command("bash", script)
		cmd.Stdout = &stdout
		cmd.Stderr = io.MultiWriter(&stderr, os.Stderr)
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("building spire-server and spire-agent with %s: %w\n%s", BuildScript, err, stderr.String())
		}
		d = strings.TrimSpace(stdout.String())
	}
	for _, bin := range []string{"spire-server", "spire-agent"} {
		info, err := os.Stat(filepath.Join(d, bin))
		if err != nil || info.IsDir() || info.Mode()&0o111 == 0 {
			return "", fmt.Errorf("%s is not an executable in %s (SPIRE_DIR=%q; run %s, or make spire, and set SPIRE_DIR to the directory it prints)",
				bin, d, os.Getenv("SPIRE_DIR"), BuildScript)
		}
	}
	return d, nil
}

// repoRoot is the repository's top directory.
func repoRoot() string { return repodir.Root() }

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
	// started; BundlePath is a file holding it.
	Bundle     []byte
	BundlePath string

	sockDir string
	proc    *Process
}

// ServerOptions configure StartServer.
type ServerOptions struct {
	// TrustDomain is the trust domain (required).
	TrustDomain string
	// Dir holds the server's files (required).
	Dir string
	// AdminIDs are SPIFFE IDs allowed to call the Server API over mTLS
	// (the server's admin_ids).
	AdminIDs []string
	// DefaultX509SVIDTTL is the SVIDs' lifetime (default 1h).
	DefaultX509SVIDTTL time.Duration
	// TPMDevID, when set, adds SPIRE's tpm_devid node attestor next to
	// join_token.
	TPMDevID *TPMDevIDServer
}

// TPMDevIDServer configures spire-server's tpm_devid node attestor
// (pkg/server/plugin/nodeattestor/tpmdevid in SPIRE's module), which
// takes only these two bundles.
type TPMDevIDServer struct {
	// DevIDCAPath is a PEM bundle of the CAs that sign DevID
	// certificates (devid_ca_path).
	DevIDCAPath string
	// EndorsementCAPath is a PEM bundle of the TPM manufacturers' CAs
	// (endorsement_ca_path). Every certificate in it is a trust anchor
	// and the agent sends no intermediates, so an EK certificate's
	// issuing CA must be in it, not only its root.
	EndorsementCAPath string
}

// plugin is the server's tpm_devid plugin block.
func (o *TPMDevIDServer) plugin() string {
	if o == nil {
		return ""
	}
	return fmt.Sprintf(`	NodeAttestor "tpm_devid" {
		plugin_data {
			devid_ca_path = %q
			endorsement_ca_path = %q
		}
	}
`, o.DevIDCAPath, o.EndorsementCAPath)
}

// serverConfig is spire-server's configuration: the sqlite datastore and
// disk key manager in the data directory, the join_token node attestor,
// the admin API on a unix socket and the agent API on a loopback port.
const serverConfig = `server {
	bind_address = %q
	bind_port = %d
	socket_path = %q
	trust_domain = %q
	data_dir = %q
	log_level = "INFO"
	default_x509_svid_ttl = %q
	default_jwt_svid_ttl = "5m"
	admin_ids = [%s]
}

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
%s}
`

// StartServer starts a spire-server on a free loopback port and waits
// until its admin API answers with the trust bundle. Stop it with Stop.
func StartServer(ctx context.Context, o ServerOptions) (*Server, error) {
	binDir, err := Dir()
	if err != nil {
		return nil, err
	}
	addr, err := FreeLoopbackAddress()
	if err != nil {
		return nil, err
	}
	// A socket's path is limited to 107 bytes: sockets live in a short
	// directory of their own.
	sockDir, err := os.MkdirTemp("", "spire")
	if err != nil {
		return nil, fmt.Errorf("spireworld: socket directory: %w", err)
	}
	s := &Server{
		TrustDomain: o.TrustDomain, Dir: o.Dir, SocketPath: filepath.Join(sockDir, "server.sock"),
		Address: addr.String(), BundlePath: filepath.Join(o.Dir, "bundle.pem"), sockDir: sockDir,
	}
	ttl := o.DefaultX509SVIDTTL
	if ttl == 0 {
		ttl = time.Hour
	}
	quoted := make([]string, len(o.AdminIDs))
	for i, id := range o.AdminIDs {
		quoted[i] = fmt.Sprintf("%q", id)
	}
	data := filepath.Join(o.Dir, "data")
	conf := filepath.Join(o.Dir, "server.conf")
	if err := WriteFile(conf, fmt.Appendf(nil, serverConfig, addr.IP.String(), addr.Port, s.SocketPath, o.TrustDomain, data,
		ttl.String(), strings.Join(quoted, ", "), filepath.Join(data, "datastore.sqlite3"), filepath.Join(data, "keys.json"), o.TPMDevID.plugin())); err != nil {
		_ = os.RemoveAll(sockDir)
		return nil, err
	}
	s.proc, err = StartProcess("spire-server", filepath.Join(o.Dir, "server.log"), filepath.Join(binDir, "spire-server"), "run", "-config", conf)
	if err != nil {
		_ = os.RemoveAll(sockDir)
		return nil, err
	}
	bundle, err := s.waitForBundle(ctx, StartTimeout)
	if err != nil {
		s.Stop()
		return nil, fmt.Errorf("spire-server did not start: %w\nspire-server log:\n%s", err, s.proc.Log())
	}
	s.Bundle = bundle
	if err := WriteFile(s.BundlePath, bundle); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// waitForBundle asks the admin API for the trust domain's bundle until it
// answers, the process exits or timeout passes.
func (s *Server) waitForBundle(ctx context.Context, timeout time.Duration) ([]byte, error) {
	conn, err := grpc.NewClient("unix://"+s.SocketPath, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("a Server API client for %s: %w", s.SocketPath, err)
	}
	defer func() { _ = conn.Close() }()
	bundles := bundlev1.NewBundleClient(conn)
	deadline := time.Now().Add(timeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		b, err := bundles.GetBundle(cctx, &bundlev1.GetBundleRequest{})
		cancel()
		if err == nil {
			return bundlePEM(b)
		}
		if exit := s.proc.ExitErr(); exit != nil {
			return nil, exit
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
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

// Stop stops the server and removes its socket directory.
func (s *Server) Stop() {
	s.proc.Stop()
	_ = os.RemoveAll(s.sockDir)
}

// Process is the server's process.
func (s *Server) Process() *Process { return s.proc }

// Log returns the server's log so far.
func (s *Server) Log() string { return s.proc.Log() }

// Process is a SPIRE binary running with its output in a log file.
type Process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	// err is what Wait returned; read it only after done is closed.
	err      error
	stopOnce sync.Once
}

// StartProcess runs bin with args, its standard output and error going to
// logPath.
func StartProcess(name, logPath, bin string, args ...string) (*Process, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("creating the %s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// Its own process group, so that a terminal's Ctrl-C reaches the
	// parent, which stops the process itself.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// Stop ends the process: SIGTERM, then SIGKILL after 10 seconds. It waits
// for the process to exit and may be called more than once.
func (p *Process) Stop() {
	p.stopOnce.Do(func() {
		select {
		case <-p.done:
			return
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// ExitErr returns nil while the process runs, else how it ended.
func (p *Process) ExitErr() error {
	select {
	case <-p.done:
		if p.err == nil {
			return fmt.Errorf("%s exited with status 0", p.name)
		}
		return fmt.Errorf("%s exited: %w", p.name, p.err)
	default:
		return nil
	}
}

// maxLogDump bounds what Log returns: the log's end, where a failure is.
const maxLogDump = 64 << 10

// Log returns the process's log so far, its last 64 KiB when longer.
func (p *Process) Log() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", p.logPath, err)
	}
	if len(b) > maxLogDump {
		return fmt.Sprintf("(first %d bytes left out)\n%s", len(b)-maxLogDump, b[len(b)-maxLogDump:])
	}
	return string(b)
}

// FreeLoopbackAddress returns a 127.0.0.1 address whose port was free a
// moment ago.
func FreeLoopbackAddress() (*net.TCPAddr, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("finding a free loopback port: %w", err)
	}
	addr := l.Addr().(*net.TCPAddr)
	if err := l.Close(); err != nil {
		return nil, fmt.Errorf("finding a free loopback port: %w", err)
	}
	return addr, nil
}

// WriteFile writes a configuration or bundle file (0600), creating its
// directory.
func WriteFile(path string, content []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("spireworld: %w", err)
	}
	if err := os.WriteFile(path, content, 0o600); err != nil {
		return fmt.Errorf("spireworld: %w", err)
	}
	return nil
}

// JWKS returns the trust domain's JWT authorities, the keys JWT-SVIDs are
// signed with, as a JSON Web Key Set: what SPIRE's OIDC discovery provider
// serves at /keys, and a secrets store's jwks_url points to.
func (s *Server) JWKS(ctx context.Context) ([]byte, error) {
	conn, err := grpc.NewClient("unix://"+s.SocketPath, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("a Server API client for %s: %w", s.SocketPath, err)
	}
	defer func() { _ = conn.Close() }()
	b, err := bundlev1.NewBundleClient(conn).GetBundle(ctx, &bundlev1.GetBundleRequest{})
	if err != nil {
		return nil, fmt.Errorf("the bundle of %s: %w", s.TrustDomain, err)
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
