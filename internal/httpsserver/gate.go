package httpsserver

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// RequestClass is what a request line asks a server for, as its
// Options.Classify says.
type RequestClass int

const (
	// RequestUnknown is nothing the server serves (or nothing it serves
	// now: a feature no object configures). As a connection's first
	// request it is answered 404 and the connection closed at its request
	// line, before any header is read.
	RequestUnknown RequestClass = iota
	// RequestGeneral is served on any connection but one in the reserve
	// (Limits.Reserved): the agent server's downloads.
	RequestGeneral
	// RequestReserved is served on any connection, in the reserve too:
	// the agent server's credential broker, TPM enrollment and hints,
	// short requests whose proof is checked before anything else.
	RequestReserved
)

// maxRequestLine bounds the request line the gate reads before it
// decides; a longer one is refused. The agent server's whole head is at
// most 8 KiB.
const maxRequestLine = 8 << 10

// gateAnswerTimeout bounds the write of the gate's own answer (a few
// hundred bytes) to a client that does not read.
const gateAnswerTimeout = 5 * time.Second

// gateConnKey is the request context key of the connection's gateConn.
type gateConnKey struct{}

// serveGated serves srv on ln (which LimitListener made) doing the TLS
// handshake itself, so that it can read each connection's first request
// line before net/http reads any header (gateConn): unknown clients are
// dropped after the request line, and connections in the reserve carry
// only reserved requests. net/http sees connections that are not
// *tls.Conn, so the handler's request gets its TLS state (client
// certificates, for the credential broker) from the connection in its
// context instead, and a request on a connection in the reserve gets
// Connection: close.
func serveGated(srv *http.Server, ln net.Listener, classify func(method, path string) RequestClass) error {
	gated := &gateListener{Listener: tls.NewListener(ln, srv.TLSConfig), classify: classify}
	connContext := srv.ConnContext
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if connContext != nil {
			ctx = connContext(ctx, c)
		}
		return context.WithValue(ctx, gateConnKey{}, c)
	}
	next := srv.Handler
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if gc, ok := r.Context().Value(gateConnKey{}).(*gateConn); ok {
			st := gc.ConnectionState()
			r.TLS = &st
			if gc.reserved {
				w.Header().Set("Connection", "close")
			}
		}
		next.ServeHTTP(w, r)
	})
	return srv.Serve(gated)
}

// gateListener hands out its TLS connections as gateConns.
type gateListener struct {
	net.Listener
	classify func(method, path string) RequestClass
}

func (l *gateListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := c.(*tls.Conn) // tls.NewListener's
	reserved := false
	if lc, ok := tc.NetConn().(*limitedConn); ok {
		reserved = lc.reserved
	}
	return &gateConn{Conn: tc, classify: l.classify, reserved: reserved}, nil
}

// gateConn reads its connection's first request line before handing any
// byte to net/http and answers it itself, closing the connection, when
// the server does not serve it there: RequestUnknown anywhere (404), and
// anything but RequestReserved on a connection in the reserve (503 with
// Retry-After). The rest of the connection passes through untouched.
// net/http's deadlines (ReadHeaderTimeout) bound the handshake and the
// request line, which arrive within its first read.
type gateConn struct {
	*tls.Conn
	classify func(method, path string) RequestClass
	reserved bool

	decided bool
	// pending is what was read past the decision, for net/http.
	pending []byte
}

// Read implements net.Conn.
func (c *gateConn) Read(p []byte) (int, error) {
	if !c.decided {
		if err := c.decide(); err != nil {
			return 0, err
		}
	}
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// decide reads up to the end of the first request line and lets it in,
// or answers it and returns io.EOF, on which net/http closes the
// connection without a word of its own.
func (c *gateConn) decide() error {
	var buf []byte
	chunk := make([]byte, 1<<10)
	for bytes.IndexByte(buf, '\n') < 0 {
		if len(buf) >= maxRequestLine {
			return c.answer(http.StatusRequestURITooLong, "the request line is too long\n", "")
		}
		n, err := c.Conn.Read(chunk[:min(len(chunk), maxRequestLine-len(buf))])
		buf = append(buf, chunk[:n]...)
		if err != nil && bytes.IndexByte(buf, '\n') < 0 {
			return err
		}
	}
	c.decided, c.pending = true, buf
	method, path, ok := requestLine(buf[:bytes.IndexByte(buf, '\n')])
	switch {
	case ok && method == "PRI" && path == "*":
		// An HTTP/2 preface: net/http answers it (505, http1Only).
		return nil
	case !ok:
		return c.answer(http.StatusBadRequest, "malformed request line\n", "")
	}
	switch c.classify(method, path) {
	case RequestUnknown:
		return c.answer(http.StatusNotFound, "not found\n", "")
	case RequestGeneral:
		if c.reserved {
			// The connection came in over the reserve; this request
			// would hold it like the general ones do.
			return c.answer(http.StatusServiceUnavailable, "busy: retry shortly\n", "2")
		}
	}
	return nil
}

// requestLine reads "METHOD target HTTP/1.x" as net/http would, the path
// decoded.
func requestLine(line []byte) (method, path string, ok bool) {
	parts := strings.Split(strings.TrimSuffix(strings.TrimSuffix(string(line), "\n"), "\r"), " ")
	if len(parts) != 3 || parts[0] == "" || !strings.HasPrefix(parts[2], "HTTP/") {
		return "", "", false
	}
	if parts[0] == "PRI" && parts[1] == "*" {
		return parts[0], parts[1], true
	}
	u, err := url.ParseRequestURI(parts[1])
	if err != nil {
		return "", "", false
	}
	return parts[0], u.Path, true
}

// answer writes a complete answer of its own and says the connection is
// done (io.EOF).
func (c *gateConn) answer(code int, body, retryAfter string) error {
	c.pending = nil
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\nContent-Length: %d\r\n", code, http.StatusText(code), len(body))
	if retryAfter != "" {
		fmt.Fprintf(&b, "Retry-After: %s\r\n", retryAfter)
	}
	b.WriteString("\r\n" + body)
	_ = c.SetWriteDeadline(time.Now().Add(gateAnswerTimeout))
	_, _ = io.WriteString(c.Conn, b.String())
	return io.EOF
}
