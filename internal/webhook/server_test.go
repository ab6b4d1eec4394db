package webhook

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/httpsserver"
	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github"
)

// writeCert writes a certificate for 127.0.0.1 to dir/tls.crt and
// dir/tls.key and returns a pool that trusts it.
func writeCert(t *testing.T, dir string) (certFile, keyFile string, roots *x509.CertPool) {
	t.Helper()
	c, err := selfsigned.NewWith(selfsigned.Options{CommonName: "hyperfleet-webhook", Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	if certFile, keyFile, _, err = c.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, c.Pool()
}

func TestServer(t *testing.T) {
	certFile, keyFile, pool := writeCert(t, t.TempDir())
	rec := newFakeRecorder()
	r, err := NewReceiver(Options{Format: github.WebhookFormat, Parser: github.WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: testSecret}}, Router: routeTo("team", "gpu"), Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(ServerOptions{Addr: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, Receivers: []*Receiver{r}})
	if err != nil {
		t.Fatal(err)
	}
	if srv.NeedLeaderElection() {
		t.Fatal("the webhook server must run on every replica")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Start: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("the server did not stop")
		}
	}()
	<-srv.Ready()
	if srv.Addr() == nil {
		t.Fatal("not listening")
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	url := "https://" + srv.Addr().String()

	body := jobBody(77, "queued")
	req, _ := http.NewRequest(http.MethodPost, url+github.WebhookFormat.Path, bytes.NewReader(body))
	req.Header = delivery("srv-1", "workflow_job", body).Header
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("status %d: %s", resp.StatusCode, msg)
	}
	if got := rec.wait(t); got.ev.Job.ID != "77" {
		t.Fatalf("recorded %+v", got)
	}

	resp, err = c.Get(url + "/elsewhere")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("other path: %d", resp.StatusCode)
	}

	// Plain HTTP is not served.
	plain := &http.Client{Timeout: 5 * time.Second}
	if resp, err := plain.Get("http://" + srv.Addr().String() + github.WebhookFormat.Path); err == nil {
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Fatalf("plain HTTP answered %d", resp.StatusCode)
		}
	}
}

func TestServerBadCert(t *testing.T) {
	r, err := NewReceiver(Options{Format: github.WebhookFormat, Parser: github.WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: testSecret}}, Router: routeTo("a", "b"), Recorder: newFakeRecorder()})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	srv, err := NewServer(ServerOptions{Addr: "127.0.0.1:0", CertFile: filepath.Join(dir, "none.crt"), KeyFile: filepath.Join(dir, "none.key"), Receivers: []*Receiver{r}})
	if err != nil {
		t.Fatal(err)
	}
	// Without a certificate it waits for one (internal/httpsserver),
	// saying so in its readiness check, until the manager stops.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := srv.Check(nil)
		if err != nil && strings.Contains(err.Error(), "waiting for its TLS certificate") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("readiness %v, want one saying it waits for its certificate", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if srv.Addr() != nil {
		t.Fatalf("listening on %s without a certificate", srv.Addr())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Start: %v", err)
	}
	if _, err := NewServer(ServerOptions{Addr: ":0"}); err == nil {
		t.Fatal("NewServer accepted missing options")
	}
}

func TestReadSecretFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "secret")
	if err := os.WriteFile(p, []byte("hunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := ReadSecretFile(p)
	if err != nil || string(b) != "hunter2" {
		t.Fatalf("ReadSecretFile = %q, %v", b, err)
	}
	if err := os.WriteFile(p, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadSecretFile(p); err == nil {
		t.Fatal("an empty secret was accepted")
	}
	if _, err := ReadSecretFile(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing file was accepted")
	}
}

// startTestServer runs a Server with limits on 127.0.0.1 and returns its
// address and a TLS config that trusts it.
func startTestServer(t *testing.T, limits httpsserver.Limits) (string, *tls.Config) {
	t.Helper()
	certFile, keyFile, pool := writeCert(t, t.TempDir())
	r, err := NewReceiver(Options{Format: github.WebhookFormat, Parser: github.WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: testSecret}}, Router: routeTo("team", "gpu"), Recorder: newFakeRecorder()})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(ServerOptions{Addr: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, Receivers: []*Receiver{r}, Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	})
	<-srv.Ready()
	if srv.Addr() == nil {
		t.Fatal("not listening")
	}
	return srv.Addr().String(), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

// TestBadSignatureClosesConnection: a delivery whose signature does not
// verify gets 401 and its connection is closed at once; before, it stayed
// open, idle, until the server's 120 s idle timeout.
func TestBadSignatureClosesConnection(t *testing.T) {
	addr, tlsConfig := startTestServer(t, httpsserver.Limits{})
	conn, err := tls.Dial("tcp", addr, tlsConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Bounds the wait for the close; not a timed assertion.
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	body := jobBody(5, "queued")
	req := delivery("forged-1", "workflow_job", body)
	req.Header.Set("X-Hub-Signature-256", github.SignWebhook([]byte("not-the-secret"), body))
	req.URL, _ = url.Parse("https://" + addr + github.WebhookFormat.Path)
	req.Host = addr
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
		t.Fatalf("forged delivery: %d, Connection: close %v; want 401 and close", resp.StatusCode, resp.Close)
	}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("the connection stayed open after the 401: %v", err)
	}
}

// TestServerConnectionCaps: the receiver applies its caps: a connection
// beyond the per-address cap fails its TLS handshake while other
// addresses are served, and the default caps are DefaultLimits.
func TestServerConnectionCaps(t *testing.T) {
	if d := (httpsserver.Limits{}).Or(DefaultLimits); d.MaxConnsPerAddress*4 != DefaultMaxInFlight || d.MaxConns <= d.MaxConnsPerAddress {
		t.Fatalf("default caps %+v: one address should get a quarter of the %d in-flight slots, all addresses more", d, DefaultMaxInFlight)
	}
	addr, tlsConfig := startTestServer(t, httpsserver.Limits{MaxConns: 8, MaxConnsPerAddress: 2})
	dial := func(src string) (*tls.Conn, error) {
		d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c, err := tls.DialWithDialer(d, "tcp", addr, tlsConfig)
		if err == nil {
			t.Cleanup(func() { _ = c.Close() })
		}
		return c, err
	}
	for i := range 2 {
		if _, err := dial("127.0.0.2"); err != nil {
			t.Fatalf("connection %d from 127.0.0.2: %v", i, err)
		}
	}
	if _, err := dial("127.0.0.2"); err == nil {
		t.Fatal("a third connection from 127.0.0.2 completed its handshake")
	}
	c, err := dial("127.0.0.1")
	if err != nil {
		t.Fatalf("another address: %v", err)
	}
	// The other address is served: a signed delivery is accepted.
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: tlsConfig,
		DialTLSContext:  func(context.Context, string, string) (net.Conn, error) { return c, nil },
	}}
	body := jobBody(6, "queued")
	req, _ := http.NewRequest(http.MethodPost, "https://"+addr+github.WebhookFormat.Path, bytes.NewReader(body))
	req.Header = delivery("capped-1", "workflow_job", body).Header
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("signed delivery from another address: %d", resp.StatusCode)
	}
}
