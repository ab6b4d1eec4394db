package httpsserver

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/time/rate"

	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
)

// dialFrom connects to addr from the loopback address src (Linux routes
// all of 127/8 to lo).
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial from %s: %v", src, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// refusedAtOnce reports whether the server closed c without a byte: a
// read ends with EOF or a reset, not with the deadline.
func refusedAtOnce(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	timedOut := errors.As(err, &ne) && ne.Timeout()
	return err != nil && !timedOut
}

// TestLimitListener: connections beyond the per-address cap are closed
// at once while other addresses still get in; beyond the global cap every
// address is refused; closing a connection frees its place, in both
// counts. Each refusal is counted by reason.
func TestLimitListener(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server := "test-" + t.Name()
	ln := LimitListener(raw, Limits{MaxConns: 5, MaxConnsPerAddress: 3}, server, logr.Discard()).(*limitListener)
	defer ln.Close()
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	addr := ln.Addr().String()
	serverSide := func() net.Conn {
		t.Helper()
		select {
		case c := <-accepted:
			return c
		case <-time.After(5 * time.Second):
			t.Fatal("the listener did not hand out an admitted connection")
			return nil
		}
	}
	perAddr := connectionsRefused.WithLabelValues(server, ReasonMaxConnsPerAddress)
	global := connectionsRefused.WithLabelValues(server, ReasonMaxConns)

	var fromA []net.Conn
	for range 3 {
		dialFrom(t, "127.0.0.2", addr)
		fromA = append(fromA, serverSide())
	}
	// A fourth from the same address is refused; another address is not.
	if c := dialFrom(t, "127.0.0.2", addr); !refusedAtOnce(c) {
		t.Fatal("a fourth connection from 127.0.0.2 was not closed at once")
	}
	if got := testutil.ToFloat64(perAddr); got != 1 {
		t.Fatalf("per-address refusals %v, want 1", got)
	}
	dialFrom(t, "127.0.0.3", addr)
	serverSide()
	dialFrom(t, "127.0.0.4", addr)
	serverSide()
	// Five held: the global cap refuses a new address too.
	if c := dialFrom(t, "127.0.0.5", addr); !refusedAtOnce(c) {
		t.Fatal("a sixth connection was not closed at once")
	}
	if got := testutil.ToFloat64(global); got != 1 {
		t.Fatalf("global refusals %v, want 1", got)
	}
	if total, a := ln.held("127.0.0.2"); total != 5 || a != 3 {
		t.Fatalf("held %d in all, %d from 127.0.0.2; want 5 and 3", total, a)
	}
	if got := testutil.ToFloat64(connectionsOpen.WithLabelValues(server)); got != 5 {
		t.Fatalf("open connections gauge %v, want 5", got)
	}

	// Closing one of 127.0.0.2's (twice: counted once) lets 127.0.0.2
	// in again.
	_ = fromA[0].Close()
	_ = fromA[0].Close()
	if total, a := ln.held("127.0.0.2"); total != 4 || a != 2 {
		t.Fatalf("after a close: held %d in all, %d from 127.0.0.2; want 4 and 2", total, a)
	}
	dialFrom(t, "127.0.0.2", addr)
	serverSide()
	for _, c := range fromA[1:] {
		_ = c.Close()
	}
	if total, a := ln.held("127.0.0.2"); total != 3 || a != 1 {
		t.Fatalf("after closing: held %d in all, %d from 127.0.0.2; want 3 and 1", total, a)
	}
	if got := testutil.ToFloat64(perAddr) + testutil.ToFloat64(global); got != 2 {
		t.Fatalf("refusals %v, want still 2", got)
	}
}

// TestLimitListenerSocketBuffer: an admitted connection's kernel buffers
// are capped as Limits.SocketBuffer says (Linux reports twice the value
// set), so that a client that stops reading cannot make the kernel hold
// megabytes for it; without the cap autotuning stays on.
func TestLimitListenerSocketBuffer(t *testing.T) {
	for _, tc := range []struct {
		set  int
		want func(got int) bool
	}{
		{32 << 10, func(got int) bool { return got == 64<<10 }},
		{0, func(got int) bool { return got != 64<<10 }},
	} {
		raw, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln := LimitListener(raw, Limits{SocketBuffer: tc.set}, "test-"+t.Name(), logr.Discard())
		go func() {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err == nil {
				defer c.Close()
				time.Sleep(time.Second)
			}
		}()
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		raw2, err := c.(*limitedConn).Conn.(*net.TCPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var snd, rcv int
		var serr error
		if err := raw2.Control(func(fd uintptr) {
			snd, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF)
			if serr == nil {
				rcv, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF)
			}
		}); err != nil || serr != nil {
			t.Fatal(err, serr)
		}
		if !tc.want(snd) || !tc.want(rcv) {
			t.Errorf("SocketBuffer %d: SO_SNDBUF %d, SO_RCVBUF %d", tc.set, snd, rcv)
		}
		_ = c.Close()
		_ = ln.Close()
	}
}

func TestLimitsOr(t *testing.T) {
	d := Limits{MaxConns: 100, MaxConnsPerAddress: 10, Reserved: 20, ReservedPerAddress: 2}
	for _, c := range []struct{ in, want Limits }{
		{Limits{}, d},
		{Limits{MaxConns: 7, Reserved: 3}, Limits{MaxConns: 7, MaxConnsPerAddress: 10, Reserved: 3, ReservedPerAddress: 2}},
		{Limits{MaxConns: -1, MaxConnsPerAddress: -1, Reserved: -1, ReservedPerAddress: -1}, Limits{}},
	} {
		if got := c.in.Or(d); got != c.want {
			t.Errorf("%+v.Or(%+v) = %+v, want %+v", c.in, d, got, c.want)
		}
	}
	for _, c := range []struct {
		l    Limits
		want string
	}{
		{d, ""},
		{Limits{Reserved: 3}, "sets no cap"},
		{Limits{MaxConns: 3, Reserved: 3}, "must be smaller"},
	} {
		if err := c.l.Check("agent-server"); (err == nil) != (c.want == "") || err != nil && !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v.Check: %v, want %q", c.l, err, c.want)
		}
	}
}

// startServer runs Serve with handler and limits and returns its address
// and a TLS config that trusts it.
func startServer(t *testing.T, handler http.Handler, limits Limits, configure func(*http.Server)) (string, *tls.Config) {
	t.Helper()
	return startGated(t, handler, limits, nil, configure)
}

// startGated is startServer with a request classifier (Options.Classify).
func startGated(t *testing.T, handler http.Handler, limits Limits, classify func(method, path string) RequestClass, configure func(*http.Server)) (string, *tls.Config) {
	t.Helper()
	c, err := selfsigned.New("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, _, err := c.WriteDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	if configure != nil {
		configure(srv)
	}
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, Options{Name: "test server", Server: "test-" + t.Name(), Limits: limits, Addr: "127.0.0.1:0",
			CertFile: certFile, KeyFile: keyFile, ShutdownTimeout: time.Second, Logger: logr.Discard(), Classify: classify}, srv, func(a net.Addr) { addrs <- a })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	select {
	case a := <-addrs:
		return a.String(), &tls.Config{RootCAs: c.Pool(), MinVersion: tls.VersionTLS12, ServerName: "127.0.0.1"}
	case err := <-done:
		t.Fatalf("Serve: %v", err)
	}
	return "", nil
}

// http2Preface is what an HTTP/2 client sends first, with an empty
// SETTINGS frame.
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + "\x00\x00\x00\x04\x00\x00\x00\x00\x00"

// TestServeIsHTTP1Only: a client offering only h2 in ALPN fails its
// handshake, one offering h2 and http/1.1 gets http/1.1, and one that
// speaks HTTP/2 anyway (prior knowledge, after the
// handshake) gets no HTTP/2 server: 505 and a closed connection, never a
// SETTINGS frame.
func TestServeIsHTTP1Only(t *testing.T) {
	addr, tlsConfig := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "hello") }), Limits{}, nil)
	for _, protos := range [][]string{{"h2"}, {"h2", "http/1.1"}} {
		cfg := tlsConfig.Clone()
		cfg.NextProtos = protos
		conn, err := tls.Dial("tcp", addr, cfg)
		if len(protos) == 1 {
			// Offered nothing the server speaks: the handshake fails
			// (no_application_protocol).
			if err == nil {
				_ = conn.Close()
				t.Errorf("ALPN %v: the handshake succeeded (%q)", protos, conn.ConnectionState().NegotiatedProtocol)
			}
			continue
		}
		if err != nil {
			t.Fatalf("ALPN %v: %v", protos, err)
		}
		if p := conn.ConnectionState().NegotiatedProtocol; p == "h2" {
			t.Errorf("ALPN %v: negotiated h2", protos)
		}
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(conn, http2Preface); err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(conn)
		if !strings.HasPrefix(string(got), "HTTP/1.1 505") {
			t.Errorf("ALPN %v, HTTP/2 preface: the server answered %q, want HTTP/1.1 505 and a close", protos, got)
		}
		_ = conn.Close()
	}
	// An HTTP/2-capable client gets its answer over HTTP/1.1.
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig, ForceAttemptHTTP2: true}}
	resp, err := client.Get("https://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.ProtoMajor != 1 {
		t.Errorf("answered over %s", resp.Proto)
	}
}

// TestServeCapsConnections: Serve applies the caps before the TLS
// handshake: a connection beyond the per-address cap fails its handshake,
// while another address is still served.
func TestServeCapsConnections(t *testing.T) {
	addr, tlsConfig := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "hello") }),
		Limits{MaxConns: 10, MaxConnsPerAddress: 2}, nil)
	for range 2 {
		dialFrom(t, "127.0.0.2", addr)
	}
	c := tls.Client(dialFrom(t, "127.0.0.2", addr), tlsConfig)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := c.Handshake(); err == nil {
		t.Fatal("a third connection from 127.0.0.2 completed its TLS handshake")
	}
	ok := tls.Client(dialFrom(t, "127.0.0.3", addr), tlsConfig)
	_ = ok.SetDeadline(time.Now().Add(5 * time.Second))
	if err := ok.Handshake(); err != nil {
		t.Fatalf("another address: %v", err)
	}
}

// TestStallWriter: a download whose client stops reading is cut once it
// made no progress for the stall time, long before the server's
// WriteTimeout; a client that keeps reading gets every byte, however long
// the whole takes.
func TestStallWriter(t *testing.T) {
	// More than loopback's socket buffers hold (a few MiB each side), so
	// that a client that stops reading stops the writer.
	const size = 32 << 20
	chunk := make([]byte, 32<<10)
	addr, tlsConfig := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		stall, err := time.ParseDuration(r.URL.Query().Get("stall"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		sw := NewStallWriter(w, stall)
		for sent := 0; sent < size; sent += len(chunk) {
			if _, err := sw.Write(chunk); err != nil {
				return
			}
		}
	}), Limits{}, func(srv *http.Server) { srv.WriteTimeout = 10 * time.Minute })

	// Stalled: reads nothing for 3 s (six stall periods), then reads on.
	conn, err := tls.Dial("tcp", addr, tlsConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Minute))
	if _, err := io.WriteString(conn, "GET /?stall=500ms HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	got, _ := io.Copy(io.Discard, conn)
	if got >= size {
		t.Fatalf("a client that stopped reading still got all %d bytes", got)
	}

	// Moving, if slowly: every byte arrives. (The stall time must cover
	// the time the client takes to drain what the kernel buffers for the
	// connection, several MiB on loopback: the kernel wakes a blocked
	// writer only once much of its send buffer is free.)
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: tlsConfig}}
	resp, err := client.Get("https://" + addr + "/?stall=5s")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for {
		k, err := resp.Body.Read(buf)
		n += int64(k)
		if err != nil {
			break
		}
		if n < 4<<20 {
			time.Sleep(20 * time.Millisecond) // slow at first, moving all along
		}
	}
	if n != size {
		t.Fatalf("a reading client got %d of %d bytes", n, size)
	}
}

// TestLimiterOr: a limiter given is kept; none gives 10 a second in bursts
// of 20.
func TestLimiterOr(t *testing.T) {
	own := rate.NewLimiter(rate.Inf, 1)
	if LimiterOr(own) != own {
		t.Error("a limiter given was replaced")
	}
	l := LimiterOr(nil)
	if l.Limit() != 10 || l.Burst() != 20 {
		t.Errorf("the default limiter: %v a second, bursts of %d; want 10 and 20", l.Limit(), l.Burst())
	}
}
