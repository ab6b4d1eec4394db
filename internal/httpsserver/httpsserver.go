// Package httpsserver runs an http.Server over TLS for a controller-runtime
// runnable: the certificate is reloaded when its files change, the server
// stops gracefully when the context ends. The webhook receiver and the
// agent server use it.
package httpsserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
)

// Options say where and how to serve.
type Options struct {
	// Name prefixes errors and log lines ("webhook server").
	Name string
	// Addr is the listen address; CertFile and KeyFile the serving
	// certificate (chain) and key in PEM, reloaded when they change.
	Addr, CertFile, KeyFile string
	// ShutdownTimeout bounds the wait for in-flight requests once the
	// context ends.
	ShutdownTimeout time.Duration
	Logger          logr.Logger
}

// Serve serves srv over TLS on o.Addr until ctx ends, then shuts it down,
// waiting up to o.ShutdownTimeout for in-flight requests. srv brings the
// handler, timeouts and limits; Serve sets its TLS minimum version (1.2)
// and certificate, keeping the rest of srv.TLSConfig, and sends its error
// lines (client-side problems: handshake errors, resets) to the logger at
// debug level unless srv.ErrorLog is set. listening, if not nil, is called
// with the listener's address before the server accepts connections. It
// returns nil when ctx ends, or why it could not serve.
func Serve(ctx context.Context, o Options, srv *http.Server, listening func(net.Addr)) error {
	logger := o.Logger
	watcher, err := certwatcher.New(o.CertFile, o.KeyFile)
	if err != nil {
		return fmt.Errorf("%s: loading the TLS certificate %s and key %s: %w", o.Name, o.CertFile, o.KeyFile, err)
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go func() {
		if err := watcher.Start(watchCtx); err != nil {
			logger.Error(err, o.Name+": watching the TLS certificate failed; the current one stays in use")
		}
	}()

	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return fmt.Errorf("%s: listening on %s: %w", o.Name, o.Addr, err)
	}
	if srv.TLSConfig == nil {
		srv.TLSConfig = &tls.Config{}
	}
	srv.TLSConfig.MinVersion = tls.VersionTLS12
	srv.TLSConfig.GetCertificate = watcher.GetCertificate
	if srv.ErrorLog == nil {
		srv.ErrorLog = log.New(logWriter{log: logger, prefix: o.Name + ": "}, "", 0)
	}
	if listening != nil {
		listening(ln.Addr())
	}

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.ServeTLS(ln, "", "") }()
	select {
	case <-ctx.Done():
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.ShutdownTimeout)
		defer cancel()
		if err := srv.Shutdown(shutdownCtx); err != nil {
			logger.Error(err, o.Name+": shutting down")
			_ = srv.Close()
		}
		return nil
	case err := <-serveErr:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("%s: %w", o.Name, err)
	}
}

// logWriter sends net/http's own error lines to the logger at debug level.
type logWriter struct {
	log    logr.Logger
	prefix string
}

func (w logWriter) Write(p []byte) (int, error) {
	w.log.V(1).Info(w.prefix + strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
