// Package simcmd is what the simulator commands (cmd/github-sim,
// cmd/gitlab-sim, cmd/buildkite-sim, cmd/proxmox-sim) share: the flags
// they all take and how they exit on an error (flags.go), a listener that
// speaks HTTPS with a certificate from a throw-away CA, and serving until
// the process is told to stop. Each command keeps its own flags and
// simulator; only the plumbing around them is here, so that a fix to how
// they listen or shut down reaches all four.
package simcmd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
)

// shutdownGrace is how long requests in flight get once a stop signal
// arrives.
const shutdownGrace = 5 * time.Second

// Listener is where a simulator serves.
type Listener struct {
	net.Listener
	// URL is the base URL clients use: scheme and the bound address (a
	// ":0" port resolved).
	URL string
	// Certificate is the serving certificate and its CA; nil over plain
	// HTTP.
	Certificate *selfsigned.Certificate
	// TLS is the server's TLS configuration; nil over plain HTTP.
	TLS *tls.Config
}

// Listen listens on addr. Unless insecure, the listener speaks TLS with a
// fresh certificate for its own host, localhost and the loopback
// addresses, named by o's CommonName and Organization, signed by a CA made
// for this process; the CA's PEM is written to caOut when it is not empty.
func Listen(addr string, insecure bool, caOut string, o selfsigned.Options) (*Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	if insecure {
		return &Listener{Listener: ln, URL: "http://" + ln.Addr().String()}, nil
	}
	host, _, _ := net.SplitHostPort(ln.Addr().String())
	o.Hosts = append([]string{host, "localhost", "127.0.0.1", "::1"}, o.Hosts...)
	c, err := selfsigned.NewWith(o)
	if err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("generate TLS certificate: %w", err)
	}
	if caOut != "" {
		if err := os.WriteFile(caOut, c.CAPEM, 0o644); err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("write CA certificate: %w", err)
		}
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{c.TLS}, MinVersion: tls.VersionTLS12}
	return &Listener{Listener: tls.NewListener(ln, cfg), URL: "https://" + ln.Addr().String(), Certificate: c, TLS: cfg}, nil
}

// Serve serves srv on ln until the process gets SIGINT or SIGTERM, then
// shuts srv down, giving requests in flight a few seconds. An error other
// than the server's closing is returned.
func Serve(srv *http.Server, ln net.Listener) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve: %w", err)
		}
		return nil
	case <-ctx.Done():
		shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		if err := srv.Shutdown(shutdownCtx); err != nil {
			return fmt.Errorf("shutdown: %w", err)
		}
		return nil
	}
}
