package httpsserver

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
)

// TestServe: a request is served over HTTP/1.1 and TLS 1.2 or later, and
// its handler logs through the server's logger (ctrl.LoggerFrom on the
// request's context), not the process-wide one.
func TestServe(t *testing.T) {
	var logged []string
	var mu sync.Mutex
	logger := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, args)
	}, funcr.Options{})
	c, err := selfsigned.New("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, _, err := c.WriteDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Name: "test server", Addr: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, ShutdownTimeout: 5 * time.Second, Logger: logger}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctrl.LoggerFrom(r.Context()).Info("Handled", "path", r.URL.Path)
			_, _ = w.Write([]byte("hello"))
		}),
		ReadHeaderTimeout: time.Second,
		TLSConfig:         &tls.Config{NextProtos: []string{"http/1.1"}},
	}
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, o, srv, func(a net.Addr) { addrs <- a }) }()
	addr := <-addrs
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: c.Pool(), MinVersion: tls.VersionTLS12}}}
	resp, err := client.Get("https://" + addr.String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 1 {
		t.Fatalf("%d over %s", resp.StatusCode, resp.Proto)
	}
	if srv.TLSConfig.MinVersion != tls.VersionTLS12 || srv.TLSConfig.NextProtos[0] != "http/1.1" {
		t.Fatalf("TLS config %+v", srv.TLSConfig)
	}
	mu.Lock()
	got := strings.Join(logged, "\n")
	mu.Unlock()
	if !strings.Contains(got, `"msg"="Handled" "path"="/"`) {
		t.Fatalf("the handler's line is not in the server's log: %q", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

// TestServeWaitsForItsCertificate: a server whose certificate is missing,
// and then not loadable (a key that is not its certificate's), does not
// fail (which would stop the whole manager): it waits, its Status and
// hyperfleet_https_server_ready say why, and once a good certificate
// appears it serves, without a restart.
func TestServeWaitsForItsCertificate(t *testing.T) {
	dir := t.TempDir()
	o := Options{
		Name: "test server", Server: "test-wait", Addr: "127.0.0.1:0", CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"),
		ShutdownTimeout: 5 * time.Second, Status: &Status{}, Logger: logr.Discard(),
	}
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("hello")) }),
		ReadHeaderTimeout: time.Second,
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, o, srv, func(a net.Addr) { addrs <- a }) }()
	waiting := func(says string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := o.Status.Check(nil)
			if err != nil && strings.Contains(err.Error(), says) {
				break
			}
			select {
			case err := <-done:
				t.Fatalf("Serve returned (%v) while its certificate is not loadable: it must wait", err)
			case a := <-addrs:
				t.Fatalf("listening on %s without a loadable certificate", a)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("status %v, want one saying %q", err, says)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if got := testutil.ToFloat64(serverReady.WithLabelValues("test-wait")); got != 0 {
			t.Fatalf("hyperfleet_https_server_ready{server=test-wait} = %v while waiting, want 0", got)
		}
	}
	waiting("waiting for its TLS certificate: test server: loading the TLS certificate " + o.CertFile)

	// A certificate whose key is another's: still waiting.
	a, err := selfsigned.New("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	b, err := selfsigned.New("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	aCert, _, _, err := a.WriteDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	bCert, bKey, _, err := b.WriteDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	copyFile(t, bKey, o.KeyFile)
	copyFile(t, aCert, o.CertFile)
	waiting("private key does not match public key")

	// The right one: it serves.
	copyFile(t, bCert, o.CertFile)
	var addr net.Addr
	select {
	case addr = <-addrs:
	case err := <-done:
		t.Fatalf("Serve: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatalf("not serving 30 s after its certificate appeared (status %v)", o.Status.Check(nil))
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: b.Pool(), MinVersion: tls.VersionTLS12}}}
	resp, err := client.Get("https://" + addr.String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := o.Status.Check(nil); err != nil {
		t.Fatalf("serving, but the status says %v", err)
	}
	if got := testutil.ToFloat64(serverReady.WithLabelValues("test-wait")); got != 1 {
		t.Fatalf("hyperfleet_https_server_ready{server=test-wait} = %v while serving, want 1", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if o.Status.Check(nil) == nil || testutil.ToFloat64(serverReady.WithLabelValues("test-wait")) != 0 {
		t.Fatal("stopped, but reported ready")
	}
}

// TestServeStopsWaitingWithItsContext: a server still waiting for its
// certificate returns nil once the manager stops.
func TestServeStopsWaitingWithItsContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	o := Options{Name: "test server", Server: "test-stop", Addr: "127.0.0.1:0", CertFile: filepath.Join(t.TempDir(), "none.crt"), KeyFile: "none.key", Logger: logr.Discard()}
	if err := Serve(ctx, o, &http.Server{ReadHeaderTimeout: time.Second}, nil); err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	// Written aside and renamed, as the kubelet swaps a Secret volume's
	// files: never half a file.
	tmp := to + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, to); err != nil {
		t.Fatal(err)
	}
}
