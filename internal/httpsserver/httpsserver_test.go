package httpsserver

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
)

func TestServe(t *testing.T) {
	c, err := selfsigned.New("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, _, err := c.WriteDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Name: "test server", Addr: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, ShutdownTimeout: 5 * time.Second, Logger: logr.Discard()}
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("hello")) }),
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
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}

	o.CertFile = filepath.Join(t.TempDir(), "none.crt")
	if err := Serve(context.Background(), o, &http.Server{ReadHeaderTimeout: time.Second}, nil); err == nil || !strings.HasPrefix(err.Error(), "test server: loading the TLS certificate") {
		t.Fatalf("missing certificate: %v", err)
	}
}
