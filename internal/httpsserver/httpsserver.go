// Package httpsserver runs an http.Server over TLS for a controller-runtime
// runnable, bounded like an internet-facing endpoint: HTTP/1.1 only,
// connection caps (global and per source address, limits.go), optionally
// a reserve of them for the requests a server says are reserved and each
// connection's first request line checked before any header is read
// (gate.go), refusals logged without flooding the log (refusals.go), the
// certificate reloaded when its files change, a server that waits for a
// missing or unloadable certificate instead of failing (status.go), a
// graceful stop when the context ends.
// The webhook receiver and the agent server use it (docs/security.md,
// "The agent server's bounds" and "Webhook intake").
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
)

// Options say where and how to serve.
type Options struct {
	// Name prefixes errors and log lines ("webhook server").
	Name string
	// Server names the server in metrics (the server label: "agent",
	// "webhook").
	Server string
	// Limits cap the connections held open (a zero cap is none: the
	// servers fill in their defaults with Limits.Or).
	Limits Limits
	// Addr is the listen address; CertFile and KeyFile the serving
	// certificate (chain) and key in PEM, reloaded when they change.
	Addr, CertFile, KeyFile string
	// ShutdownTimeout bounds the wait for in-flight requests once the
	// context ends.
	ShutdownTimeout time.Duration
	// Status, when set, follows whether the server serves (its Check is
	// a readiness check).
	Status *Status
	Logger logr.Logger
	// Classify, when set, says what a request line asks for: Serve then
	// reads each connection's first request line before net/http reads
	// any header, answers RequestUnknown with 404 and a close at once,
	// and lets a connection admitted into the reserve (Limits.Reserved)
	// carry one RequestReserved request only (gate.go). nil: no gate and
	// no reserve (the whole cap is general).
	Classify func(method, path string) RequestClass
}

// Serve serves srv over TLS on o.Addr until ctx ends, then shuts it down,
// waiting up to o.ShutdownTimeout for in-flight requests. srv brings the
// handler, timeouts and header limit; Serve caps its connections
// (o.Limits), serves HTTP/1.1 only, sets its TLS minimum version (1.2)
// and certificate, keeping the rest of srv.TLSConfig, and sends its error
// lines (client-side problems: handshake errors, resets) to the logger at
// debug level unless srv.ErrorLog is set. listening, if not nil, is called
// with the listener's address before the server accepts connections.
//
// A certificate that is missing or cannot be loaded is waited for
// (waitForCertificate): the server does not listen until it loads, and
// o.Status and hyperfleet_https_server_ready{server=o.Server} say so. It
// returns nil when ctx ends, or why it could not serve (such as an address
// in use).
func Serve(ctx context.Context, o Options, srv *http.Server, listening func(net.Addr)) error {
	logger := o.Logger
	ready := serverReady.WithLabelValues(o.Server)
	ready.Set(0)
	defer func() {
		ready.Set(0)
		o.Status.set(false, "stopped")
	}()
	watcher := waitForCertificate(ctx, o)
	if watcher == nil {
		return nil
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
	http1Only(srv)
	if srv.ErrorLog == nil {
		srv.ErrorLog = log.New(logWriter{log: logger, prefix: o.Name + ": "}, "", 0)
	}
	if srv.BaseContext == nil {
		// Handlers log through the request context's logger (the broker,
		// TPM enrollment: ctrl.LoggerFrom): without the server's logger there
		// it falls back to the process-wide one, which only the
		// binary sets, and an embedding (the controller tests' operators)
		// would lose every refusal's log line. Not ctx itself: a request
		// in flight when the server stops is drained, not cancelled.
		base := logr.NewContext(context.Background(), logger)
		srv.BaseContext = func(net.Listener) context.Context { return base }
	}
	if listening != nil {
		listening(ln.Addr())
	}

	limits := o.Limits
	if o.Classify == nil {
		limits.Reserved = 0
	}
	ln = LimitListener(ln, limits, o.Server, logger)
	serveErr := make(chan error, 1)
	if o.Classify != nil {
		go func() { serveErr <- serveGated(srv, ln, o.Classify) }()
	} else {
		go func() { serveErr <- srv.ServeTLS(ln, "", "") }()
	}
	ready.Set(1)
	o.Status.set(true, "")
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

// http1Only turns HTTP/2 off. Neither server needs it (GitHub delivers
// over HTTP/1.1; a VM makes a handful of requests in its life), and HTTP/2
// lets one connection carry many concurrent requests whose uploads the
// server buffers (up to 1 MiB per stream) before a handler, its token
// check or its in-flight bound ever sees them: a connection cap would no
// longer bound what a client holds. A client offering only h2 in ALPN
// fails its handshake; one that sends the HTTP/2 preface anyway gets 505
// and a closed connection (net/http hands the preface's "PRI *
// HTTP/2.0" to the handler as a request).
func http1Only(srv *http.Server) {
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.TLSConfig.NextProtos = []string{"http/1.1"}
	// A non-nil empty map is the older switch for the same thing.
	srv.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
	next := srv.Handler
	if next == nil {
		next = http.DefaultServeMux
	}
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 1 {
			DropConnection(w)
			http.Error(w, "HTTP/2 is not served here: use HTTP/1.1", http.StatusHTTPVersionNotSupported)
			return
		}
		next.ServeHTTP(w, r)
	})
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
