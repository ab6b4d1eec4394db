// Package mtlsproxy runs a real nginx in front of an HTTPS server (the
// Proxmox simulator) as a TLS-terminating proxy that requires and verifies
// client certificates (ssl_verify_client on), the way sites put Proxmox's
// API behind mutual TLS. It also makes the test's CAs and certificates.
//
// nginx comes from Debian's package, which hack/test-deps.sh installs; a
// test that needs it fails, never skips, when it is missing.
package mtlsproxy

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Options say what the proxy forwards to and whom it admits.
type Options struct {
	// Upstream is the base URL requests are forwarded to, such as
	// https://127.0.0.1:8006. Its certificate is not checked: the proxy
	// and the upstream share the loopback interface.
	Upstream string
	// ClientCA is the PEM CA that client certificates must chain to.
	ClientCA []byte
}

// Proxy is a running nginx.
type Proxy struct {
	// URL is the proxy's base URL, https://127.0.0.1:<port>.
	URL string
	// ServerCA is the PEM CA of the proxy's own certificate, and
	// ServerFingerprint that certificate's SHA-256, for the client's trust.
	ServerCA          []byte
	ServerFingerprint [sha256.Size]byte

	dir string
}

// Request is one request as the proxy's access log records it.
type Request struct {
	// Verify is nginx's $ssl_client_verify: SUCCESS, FAILED:<why> or NONE.
	Verify string
	// Serial is the client certificate's serial ($ssl_client_serial,
	// upper-case hex), "-" when none was presented.
	Serial string
	// Status is the HTTP status the proxy answered with.
	Status string
	// Line is the request line.
	Line string
}

// Binary returns the nginx executable, failing t with where to get it.
func Binary(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath("nginx"); err == nil {
		return p
	}
	// Debian installs it in /usr/sbin, which a user's PATH may lack.
	const debian = "/usr/sbin/nginx"
	if _, err := os.Stat(debian); err == nil {
		return debian
	}
	t.Fatalf("nginx is not installed (not on PATH, nor %s): run `make test-deps` (hack/test-deps.sh installs Debian's nginx package)", debian)
	return ""
}

// Start runs nginx in front of o.Upstream, with a server certificate for
// 127.0.0.1 from a CA of its own, and stops it when t ends. It waits until
// nginx accepts connections.
func Start(t testing.TB, o Options) *Proxy {
	t.Helper()
	bin := Binary(t)
	dir := t.TempDir()
	serverCA := NewCA(t, "mtlsproxy server CA")
	server := serverCA.Issue(t, CertOptions{CommonName: "127.0.0.1", Usage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	files := map[string][]byte{"server.crt": server.CertPEM, "server.key": server.KeyPEM, "client-ca.pem": o.ClientCA}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	port := freePort(t)
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(config(dir, port, o.Upstream)), 0o600); err != nil {
		t.Fatal(err)
	}
	errLog := filepath.Join(dir, "error.log")
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "-c", conf, "-p", dir, "-e", errLog)
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("mtlsproxy: start %s: %v", bin, err)
	}
	// exited is closed when nginx has exited, with waitErr set.
	var waitErr error
	exited := make(chan struct{})
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(5 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
		})
	}
	t.Cleanup(stop)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	deadline := time.Now().Add(15 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = conn.Close()
			break
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(errLog)
			t.Fatalf("mtlsproxy: nginx exited before it listened (%v): %s\n%s", waitErr, stderr.String(), log)
		default:
		}
		if time.Now().After(deadline) {
			stop()
			log, _ := os.ReadFile(errLog)
			t.Fatalf("mtlsproxy: nginx does not listen on %s after 15s: %s\n%s", addr, stderr.String(), log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &Proxy{URL: "https://" + addr, ServerCA: serverCA.PEM, ServerFingerprint: server.Fingerprint, dir: dir}
}

// config is the nginx.conf of a proxy in dir listening on port: one
// process in the foreground (no privilege drop, so it works as root and as
// a user), every file under dir, client certificates required and
// verified, requests streamed to upstream.
func config(dir string, port int, upstream string) string {
	p := func(name string) string { return filepath.Join(dir, name) }
	return fmt.Sprintf(`daemon off;
master_process off;
pid %[1]s;
error_log %[2]s info;
events {
    worker_connections 128;
}
http {
    log_format mtls '$ssl_client_verify $ssl_client_serial $status "$request"';
    access_log %[3]s mtls;
    client_body_temp_path %[4]s;
    proxy_temp_path %[5]s;
    fastcgi_temp_path %[6]s;
    uwsgi_temp_path %[7]s;
    scgi_temp_path %[8]s;
    client_max_body_size 64m;
    server {
        listen 127.0.0.1:%[9]d ssl;
        ssl_certificate %[10]s;
        ssl_certificate_key %[11]s;
        ssl_client_certificate %[12]s;
        ssl_verify_client on;
        ssl_session_tickets off;
        location / {
            proxy_pass %[13]s;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_ssl_verify off;
        }
    }
}
`, p("nginx.pid"), p("error.log"), p("access.log"), p("client_body"), p("proxy"), p("fastcgi"), p("uwsgi"), p("scgi"),
		port, p("server.crt"), p("server.key"), p("client-ca.pem"), strings.TrimRight(upstream, "/"))
}

// Requests returns the requests the proxy has logged so far, oldest first.
// nginx writes each line when the request ends.
func (p *Proxy) Requests(t testing.TB) []Request {
	t.Helper()
	f, err := os.Open(filepath.Join(p.dir, "access.log"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var out []Request
	s := bufio.NewScanner(f)
	for s.Scan() {
		verify, rest, _ := strings.Cut(s.Text(), " ")
		serial, rest, _ := strings.Cut(rest, " ")
		status, line, _ := strings.Cut(rest, " ")
		out = append(out, Request{Verify: verify, Serial: serial, Status: status, Line: strings.Trim(line, `"`)})
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}
