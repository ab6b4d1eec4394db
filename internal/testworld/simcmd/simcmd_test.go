package simcmd

import (
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
)

// TestServeOverTLSUntilSignalled: a client that trusts the CA written to
// caOut reaches the handler at the listener's URL, and SIGTERM ends Serve
// without an error.
func TestServeOverTLSUntilSignalled(t *testing.T) {
	caOut := filepath.Join(t.TempDir(), "ca.pem")
	ln, err := Listen("127.0.0.1:0", false, caOut, selfsigned.Options{CommonName: "test-sim"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ln.URL, "https://127.0.0.1:") || strings.HasSuffix(ln.URL, ":0") {
		t.Fatalf("URL %q: want https with the bound port", ln.URL)
	}
	caPEM, err := os.ReadFile(caOut)
	if err != nil || string(caPEM) != string(ln.Certificate.CAPEM) {
		t.Fatalf("caOut holds %q (%v); want the CA's PEM", caPEM, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "sim") }),
		TLSConfig: ln.TLS, ReadHeaderTimeout: time.Second}
	done := make(chan error, 1)
	go func() { done <- Serve(srv, ln) }()

	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ln.Certificate.Pool(), MinVersion: tls.VersionTLS12}}}
	resp, err := c.Get(ln.URL + "/")
	if err != nil {
		t.Fatalf("GET over TLS with the CA trusted: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if string(body) != "sim" {
		t.Fatalf("body %q, want the handler's", body)
	}
	// Serve is serving, so its signal handler is installed: SIGTERM
	// reaches it, not the test process's default action.
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve after SIGTERM: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after SIGTERM")
	}
}

// TestListenInsecureIsPlainHTTP: with insecure, no certificate and an
// http URL.
func TestListenInsecureIsPlainHTTP(t *testing.T) {
	ln, err := Listen("127.0.0.1:0", true, "", selfsigned.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	if ln.Certificate != nil || ln.TLS != nil || !strings.HasPrefix(ln.URL, "http://") {
		t.Fatalf("insecure listener: URL %q, certificate %v; want plain HTTP", ln.URL, ln.Certificate != nil)
	}
}
